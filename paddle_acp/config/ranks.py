"""The variables of a job of several ranks: its world size (``PADDLE_TRAINERS_NUM``), whose state each rank
keeps (``PADDLE_ACP_RANK_STATE``), who writes replicated tensors (``PADDLE_ACP_REPLICATED_WRITERS``) and rank 0's
wait for the parts (``PADDLE_ACP_PART_TIMEOUT``). Each parser raises
:class:`~paddle_acp.errors.ConfigError` naming the variable; :func:`paddle_acp.config.from_env` calls them.
"""

from __future__ import annotations

from typing import Mapping, Optional

from paddle_acp.config.values import MAX_WORLD, check_interval, env_int
from paddle_acp.errors import ConfigError

DEFAULT_PART_TIMEOUT = 300.0
RANK_STATE_MODES = ("auto", "replicated", "per-rank")
# PADDLE_ACP_REPLICATED_WRITERS: who writes the tensors of replicated state (format/engine/shares.py):
# "all" (ranks 0..min(W, DEFAULT_SHARE_WRITERS)-1 each write a share), a number N >= 2 (ranks
# 0..min(W, N)-1) or "one" (rank 0 writes every tensor; "1" means the same)
DEFAULT_REPLICATED_WRITERS = "all"
# the share writers "all" means at most: a restore reads every share, so each rank opens this many
# data files at most, whatever the world size (issue 28 item 4: a restart's storage calls per rank
# stay flat in W), while 8 writers already split the write of the state 8 ways
DEFAULT_SHARE_WRITERS = 8


def world_size(env: Mapping[str, str]) -> Optional[int]:
    raw = env.get("PADDLE_TRAINERS_NUM")
    if raw is None or raw.strip() == "":
        return None
    world = env_int(env, "PADDLE_TRAINERS_NUM", 1, minimum=1)
    if world > MAX_WORLD:
        raise ConfigError(
            f"PADDLE_TRAINERS_NUM={raw!r} is above the largest world size a checkpoint records ({MAX_WORLD}): "
            "a job of that many ranks would write checkpoints it cannot read back; run at most "
            f"{MAX_WORLD} ranks per checkpointed job"
        )
    return world


def rank_state(env: Mapping[str, str]) -> str:
    raw = (env.get("PADDLE_ACP_RANK_STATE") or "").strip().lower()
    if not raw:
        return "auto"
    if raw == "per_rank":
        raw = "per-rank"
    if raw not in RANK_STATE_MODES:
        raise ConfigError(f"PADDLE_ACP_RANK_STATE={env.get('PADDLE_ACP_RANK_STATE')!r} must be one of {', '.join(RANK_STATE_MODES)}")
    return raw


def writer_cap(value: str, given: Optional[str] = None) -> Optional[int]:
    """The most ranks that write shares of replicated state for PADDLE_ACP_REPLICATED_WRITERS ``value``
    ("all", "one" or a number): None for "one" (rank 0 writes every tensor); ConfigError naming ``given``
    (the variable's value as set; default ``value``) for a bad value."""
    if value == "one":
        return None
    if value == "all":
        return DEFAULT_SHARE_WRITERS
    if isinstance(value, str) and value.isdigit() and value.isascii() and 2 <= int(value) <= MAX_WORLD:
        return int(value)
    raise ConfigError(f"PADDLE_ACP_REPLICATED_WRITERS={value if given is None else given!r} must be all, one or a "
                      f"whole number of share writers from 1 to {MAX_WORLD} (all: ranks 0..{DEFAULT_SHARE_WRITERS - 1} "
                      "each write a share of the replicated tensors; N: ranks 0..N-1; one or 1: rank 0 writes them all)")


def replicated_writers(env: Mapping[str, str]) -> str:
    given = env.get("PADDLE_ACP_REPLICATED_WRITERS", "")
    raw = given.strip().lower()
    if not raw:
        return DEFAULT_REPLICATED_WRITERS
    if raw.isdigit() and raw.isascii():
        raw = str(int(raw))  # "08" is 8
        if raw == "1":
            raw = "one"
    writer_cap(raw, given)
    return raw


def part_timeout(env: Mapping[str, str]) -> float:
    raw = env.get("PADDLE_ACP_PART_TIMEOUT")
    if raw is None or raw.strip() == "":
        return DEFAULT_PART_TIMEOUT
    return check_interval(raw.strip(), "PADDLE_ACP_PART_TIMEOUT")
