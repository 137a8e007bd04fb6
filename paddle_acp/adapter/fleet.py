"""Paddle's fleet: which state mode a job of several ranks keeps (replicated or per-rank)."""

from __future__ import annotations

import logging
import sys
from typing import Any, Dict, Iterable, Tuple

from paddle_acp.format.global_manifest import MODES

logger = logging.getLogger("paddle_acp")


def fleet_degrees() -> Dict[str, int]:
    """Model-parallel, pipeline and sharding degrees of ``fleet.init``'s strategy ({} without); never imports fleet."""
    mod = sys.modules.get("paddle.distributed.fleet")
    fleet = getattr(mod, "fleet", None) if mod is not None else None
    strategy = getattr(fleet, "_user_defined_strategy", None)
    if strategy is None:
        return {}
    out: Dict[str, int] = {}

    def put(name: str, value: Any) -> None:
        try:
            v = int(value)
        except (TypeError, ValueError):
            return
        out[name] = max(out.get(name, 1), v)

    try:
        hybrid = strategy.hybrid_configs
        for k in ("mp_degree", "pp_degree", "sharding_degree"):
            if k in hybrid:
                put(k, hybrid[k])
        if getattr(strategy, "tensor_parallel", False):
            put("mp_degree", strategy.tensor_parallel_configs.get("tensor_parallel_degree", 1))
        if getattr(strategy, "sharding", False):
            for k in ("sharding_degree", "pp_degree", "mp_degree"):
                put(k, strategy.sharding_configs.get(k, 1))
        if getattr(strategy, "pipeline", False):
            put("pp_degree", 2)  # a pipeline strategy: stages hold different layers
    except Exception as exc:  # an unexpected strategy object: say so, decide from the programs
        logger.debug("cannot read fleet's strategy: %s", exc)
    return out


def decide_mode(setting: str, entries: Iterable[Any]) -> Tuple[str, str]:  # the registry's entries (runtime/)
    """('per-rank' | 'replicated', why) for PADDLE_ACP_RANK_STATE ``setting`` and the registered programs."""
    if setting in MODES:
        return setting, f"PADDLE_ACP_RANK_STATE={setting}"
    for e in entries:
        if e.info.parallel_ops:
            return "per-rank", f"program {e.key} has {', '.join(e.info.parallel_ops[:4])}"
    degrees = {k: v for k, v in fleet_degrees().items() if v > 1}
    if degrees:
        return "per-rank", "fleet strategy " + ", ".join(f"{k}={v}" for k, v in sorted(degrees.items()))
    return "replicated", "no tensor-parallel, pipeline or sharding operators and no such fleet degree"
