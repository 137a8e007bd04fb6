"""The variables of a job of several ranks (world size, rank state, replicated writers, part timeout), for from_env."""

from __future__ import annotations

from typing import Mapping, Optional

from paddle_acp.config.values import MAX_WORLD, env_choice, env_int, env_seconds
from paddle_acp.errors import ConfigError

DEFAULT_PART_TIMEOUT = 300.0
# a week: rank 0's wait for the ranks' parts (and for the ranks' store to open) becomes a deadline and a store
# timeout in whole seconds; far larger values overflow the clocks and the store's timer
MAX_PART_TIMEOUT = 7 * 86400.0
PART_TIMEOUT_WHY = " (a week): it bounds rank 0's wait for the other ranks' parts (default 300)"
RANK_STATE_MODES = ("auto", "replicated", "per-rank")
# PADDLE_ACP_REPLICATED_WRITERS: who writes replicated tensors (format/engine/shares.py): "all" (ranks
# 0..min(W, DEFAULT_SHARE_WRITERS)-1 each write a share), N >= 2 (ranks 0..min(W, N)-1) or "one" (rank 0; "1" too)
DEFAULT_REPLICATED_WRITERS = "all"
# at most: a restore reads every share, so a restart's storage calls per rank stay flat in the world size
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
    return env_choice(env, "PADDLE_ACP_RANK_STATE", "auto", RANK_STATE_MODES, lambda v: v.lower().replace("_", "-"),
                      f"must be one of {', '.join(RANK_STATE_MODES)}")


def writer_cap(value: str, given: Optional[str] = None) -> Optional[int]:
    """The most ranks that write shares of replicated state for PADDLE_ACP_REPLICATED_WRITERS ``value``: None
    for "one"; ConfigError naming ``given`` (the value as set; default ``value``) for a bad value."""
    if value == "one":
        return None
    if value == "all":
        return DEFAULT_SHARE_WRITERS
    if isinstance(value, str) and value.isdigit() and value.isascii() and 2 <= int(value) <= MAX_WORLD:
        return int(value)
    raise ConfigError(f"PADDLE_ACP_REPLICATED_WRITERS={value if given is None else given!r} must be all, one or a "
                      f"whole number of share writers from 1 to {MAX_WORLD} (all: ranks "
                      f"0..{DEFAULT_SHARE_WRITERS - 1} each write a share of the replicated tensors; N: ranks "
                      "0..N-1; one or 1: rank 0 writes them all)")


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
    return env_seconds(env, "PADDLE_ACP_PART_TIMEOUT", DEFAULT_PART_TIMEOUT, MAX_PART_TIMEOUT, PART_TIMEOUT_WHY)
