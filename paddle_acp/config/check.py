"""The variables ``paddle-acp check`` sets on the runs it starts; the runtime's range reads them when it opens."""

from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

from paddle_acp.config.values import ascii_number
from paddle_acp.errors import ConfigError


def check_digests_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``PADDLE_ACP_CHECK_DIGESTS``: the file the runtime appends its per-epoch digests to; None when unset."""
    raw = (os.environ if env is None else env).get("PADDLE_ACP_CHECK_DIGESTS")
    return raw if raw else None


def check_epochs_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """``PADDLE_ACP_CHECK_EPOCHS``: every range ends after this many epochs; None when unset."""
    raw = (os.environ if env is None else env).get("PADDLE_ACP_CHECK_EPOCHS")
    if raw is None or raw.strip() == "":
        return None
    try:
        value = ascii_number(raw.strip(), int)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"PADDLE_ACP_CHECK_EPOCHS={raw!r} must be a positive integer (epochs per range)")
    return value


def check_kill_at_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[Tuple[str, int, Optional[int]]]:
    """``PADDLE_ACP_CHECK_KILL_AT`` = ``EPOCH[:STEP]@RANGE``: where the process SIGKILLs itself once every
    checkpoint taken before that point is committed. (range, epoch, step or None); None when unset."""
    raw = (os.environ if env is None else env).get("PADDLE_ACP_CHECK_KILL_AT")
    if raw is None or raw.strip() == "":
        return None
    where, sep, range_name = raw.strip().partition("@")
    parts = where.split(":")
    if not sep or not range_name or not 1 <= len(parts) <= 2 or not all(p.isdigit() and p.isascii() for p in parts):
        raise ConfigError(f"PADDLE_ACP_CHECK_KILL_AT={raw!r} must be EPOCH[:STEP]@RANGE (set by paddle-acp check)")
    return range_name, int(parts[0]), int(parts[1]) if len(parts) == 2 else None
