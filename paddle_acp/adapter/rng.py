"""RNG state: capture and restore Paddle's global generators, NumPy's and Python's, as JSON-safe data.

Paddle's generator state is ``(device, seed, offset, ASCII engine state)``. Paddle 2.6's ``GeneratorState``
pickles only ``(device, seed, offset)`` (``__setstate__`` reseeds the engine), so there the engine state is
stored empty and a restore in another process restarts the CPU engine from its seed (``warn_rng_limit``).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from paddle_acp.errors import CheckpointError
from paddle_acp.format.rng_schema import validate

logger = logging.getLogger("paddle_acp")

_carries: Optional[bool] = None
_warned_missing = False


def carries_cpu_engine() -> bool:
    """Whether this Paddle's ``GeneratorState`` pickles the engine state (3.x: yes; 2.6: no)."""
    global _carries
    if _carries is None:
        from paddle.framework import core

        _carries = len(core.default_cpu_generator().get_state().__getstate__()) >= 4
    return _carries


def _fields(st: Any) -> List[Any]:  # a Paddle GeneratorState -> [device, seed, offset, engine (ASCII)]
    parts = st.__getstate__()
    if len(parts) not in (3, 4):
        import paddle

        raise CheckpointError(
            f"Paddle {paddle.__version__}'s generator state has {len(parts)} fields; paddle-acp knows the "
            "3 of Paddle 2.6 and the 4 of Paddle 3.x, and cannot save the RNG state of this Paddle"
        )
    device, seed, offset = parts[:3]
    engine = bytes(parts[3]).decode("ascii") if len(parts) == 4 else ""  # 3.x: a list of ASCII codes; 2.6: none
    return [int(device), int(seed), int(offset), engine]


def capture() -> Dict[str, Any]:
    import paddle

    states = [_fields(st) for st in paddle.get_rng_state()]
    np_state: Any = np.random.get_state()  # the legacy tuple (numpy types it as a dict too)
    py_state = random.getstate()
    return {
        "paddle": states,
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def _generator(entry: List[Any], carries: bool) -> Any:  # -> a Paddle GeneratorState
    from paddle.framework import core

    g = core.GeneratorState.__new__(core.GeneratorState)
    device, seed, offset = entry[:3]
    raw = entry[3] if len(entry) == 4 else ""
    if carries and raw:
        g.__setstate__((device, seed, offset, list(raw.encode("ascii"))))
    elif carries:
        # a checkpoint of Paddle 2.6 on 3.x (whose __setstate__ takes no 3-tuple): a freshly seeded engine
        _warn_missing_engine()
        g.__setstate__((device, seed, offset, _fresh_engine(seed)))
    else:  # Paddle 2.6: __setstate__ reseeds the engine from ``seed``
        g.__setstate__((device, seed, offset))
    return g


def restore(state: Dict[str, Any]) -> None:
    """Restore NumPy's, Python's and every Paddle generator this process shares with the checkpoint (matched by
    position and device: other devices may be visible now); a warning names those that are not."""
    import paddle

    validate(state)
    saved = state["paddle"]
    current = paddle.get_rng_state()
    here = [int(st.__getstate__()[0]) for st in current]
    gens = list(current)
    carries = carries_cpu_engine()
    restored, kept = [], []
    for i, device in enumerate(here):
        if i < len(saved) and saved[i][0] == device:
            gens[i] = _generator(saved[i], carries)
            restored.append(device)
        else:
            kept.append(device)
    dropped = [s[0] for i, s in enumerate(saved) if i >= len(here) or s[0] != here[i]]
    if kept or dropped:
        _warn_partial(here, [s[0] for s in saved], restored, kept, dropped)
    paddle.set_rng_state(gens)
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


_warned_partial: Set[Tuple[Tuple[int, ...], Tuple[int, ...]]] = set()


def _describe(devices: List[int]) -> str:
    return ", ".join("cpu" if d == -1 else f"device {d}" for d in devices) or "none"


def _warn_partial(here: List[int], saved: List[int], restored: List[int], kept: List[int], dropped: List[int]) -> None:
    key = (tuple(here), tuple(saved))
    if key in _warned_partial:
        return
    _warned_partial.add(key)
    logger.warning(
        "the checkpoint holds Paddle generator states for %s; this process has %s (other devices are visible "
        "than when it was saved). Restored: %s. Not restored here: %s (they keep their current state, so random "
        "ops such as dropout on them draw a different stream than the interrupted run would have). Ignored from "
        "the checkpoint: %s. NumPy's and Python's RNGs and all tensors are restored exactly; run with the same "
        "visible devices for a bit-identical resume.",
        _describe(saved), _describe(here), _describe(restored), _describe(kept), _describe(dropped),
    )


def _fresh_engine(seed: int) -> List[int]:
    """The engine state of a CPU generator freshly seeded with ``seed`` (Paddle 3.x)."""
    from paddle.framework import core

    gen = core.default_cpu_generator()
    saved = gen.get_state()
    try:
        gen.manual_seed(seed)
        return list(gen.get_state().__getstate__()[3])
    finally:
        gen.set_state(saved)


def _warn_missing_engine() -> None:
    global _warned_missing
    if not _warned_missing:
        _warned_missing = True
        logger.warning(
            "the checkpoint was made with a Paddle that cannot save the CPU random generator's engine "
            "state (Paddle 2.6): random ops such as dropout draw a different random stream after this "
            "resume than the interrupted run would have; everything else is restored exactly"
        )
