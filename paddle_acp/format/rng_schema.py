"""The schema of the RNG state a manifest records (``manifest.rng``, ``extra.epoch_start_rng``).

Paddle's generators (device, seed, offset and, from Paddle 3, the engine state as text), NumPy's and Python's, validated
in full so that anything accepted restores without an exception (:mod:`paddle_acp.adapter.rng`)."""

from __future__ import annotations

import math
from typing import Any, Dict

from paddle_acp.errors import CorruptCheckpointError

__all__ = ["MAX_GENERATORS", "validate"]


def _bad(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"invalid RNG state in manifest: {msg}")


MAX_GENERATORS = 256  # Paddle's generators: the CPU's and one per visible device
_MAX_STATE_TEXT = 1 << 16  # the text of one generator's engine state (the CPU's: 313 numbers, ~6.4 KB)


def _uint(x: Any, bits: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**bits


def _finite(x: Any) -> bool:
    """A number a float holds, finite (an integer past float's range, e.g. 10**400, is not: restore would fail)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def validate(state: Dict[str, Any]) -> None:
    """CorruptCheckpointError unless ``state`` has the shape ``capture`` produces, every value in the range ``restore``
    accepts."""
    if not isinstance(state, dict):
        raise _bad("not an object")
    if set(state) != {"paddle", "numpy", "python"}:
        raise _bad(f"keys {sorted(map(str, state))} are not paddle, numpy, python")
    pd = state.get("paddle")
    if not isinstance(pd, list) or not 1 <= len(pd) <= MAX_GENERATORS:
        raise _bad(f"paddle states missing or more than {MAX_GENERATORS}")
    for i, s in enumerate(pd):
        # (device, seed, offset[, engine state]): Paddle 2.6 has no engine state
        if not (isinstance(s, list) and len(s) in (3, 4)):
            raise _bad(f"paddle state {i} is not a list of 3 or 4 values")
        device, seed, offset = s[:3]
        if not (isinstance(device, int) and not isinstance(device, bool) and -1 <= device < 1 << 16):
            raise _bad(f"paddle state {i}: device {device!r} is out of range")
        if not _uint(seed, 64) or not _uint(offset, 64):
            raise _bad(f"paddle state {i}: seed and offset must be integers in [0, 2**64)")
        if len(s) == 4:
            raw = s[3]
            if not isinstance(raw, str) or len(raw) > _MAX_STATE_TEXT or not raw.isascii():
                raise _bad(f"paddle state {i}: the engine state is not ASCII text of at most {_MAX_STATE_TEXT} characters")
            if device == -1 and raw:  # the CPU's std::mt19937_64, as its operator<< writes it
                words = raw.split(" ")
                if len(words) != 313 or not all(w.isdigit() and len(w) <= 20 and int(w) < 2**64 for w in words) or int(words[-1]) > 312:
                    raise _bad(f"paddle state {i}: the CPU engine state is not an mt19937_64 state (313 numbers)")
    npst = state.get("numpy")
    if not (isinstance(npst, list) and len(npst) == 5 and npst[0] == "MT19937" and isinstance(npst[1], list) and len(npst[1]) == 624):
        raise _bad("numpy state malformed")
    if not all(_uint(x, 32) for x in npst[1]) or not (_uint(npst[2], 32) and npst[2] <= 624):
        raise _bad("numpy state values out of range")
    if npst[3] not in (0, 1) or isinstance(npst[3], bool):
        raise _bad("numpy has_gauss must be 0 or 1")
    if not _finite(npst[4]):
        raise _bad("numpy cached gaussian must be a finite number")
    py = state.get("python")
    if not (isinstance(py, list) and len(py) == 3 and py[0] == 3 and isinstance(py[1], list) and len(py[1]) == 625):
        raise _bad("python state malformed")
    if not all(_uint(x, 32) for x in py[1][:624]) or not (_uint(py[1][624], 32) and py[1][624] <= 624):
        raise _bad("python state values out of range")
    if py[2] is not None and not _finite(py[2]):
        raise _bad("python gauss_next must be null or a finite number")
