"""RNG state: capture and restore Paddle's global generators, NumPy's and Python's.

Stored as JSON-safe data. Paddle's generator state is its own
``(device, seed, offset, state-bytes)`` tuple; the bytes are ASCII.
"""

from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np

from .errors import CorruptCheckpointError


def capture() -> Dict[str, Any]:
    import paddle

    states = []
    for st in paddle.get_rng_state():
        device, seed, offset, raw = st.__getstate__()
        states.append([int(device), int(seed), int(offset), bytes(raw).decode("ascii")])
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "paddle": states,
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def _bad(msg):
    return CorruptCheckpointError(f"invalid RNG state in manifest: {msg}")


def validate(state: Dict[str, Any]) -> None:
    """Raise CorruptCheckpointError unless ``state`` has the shape ``capture`` produces."""
    if not isinstance(state, dict):
        raise _bad("not an object")
    pd = state.get("paddle")
    if not isinstance(pd, list):
        raise _bad("paddle states missing")
    for s in pd:
        if not (isinstance(s, list) and len(s) == 4 and all(isinstance(x, int) for x in s[:3]) and isinstance(s[3], str)):
            raise _bad("paddle state entry malformed")
        if not s[3].isascii():
            raise _bad("paddle state is not ASCII")
    npst = state.get("numpy")
    if not (isinstance(npst, list) and len(npst) == 5 and npst[0] == "MT19937" and isinstance(npst[1], list) and len(npst[1]) == 624):
        raise _bad("numpy state malformed")
    if not all(isinstance(x, int) and 0 <= x < 2**32 for x in npst[1]) or not isinstance(npst[2], int) or not 0 <= npst[2] <= 624:
        raise _bad("numpy state values out of range")
    py = state.get("python")
    if not (isinstance(py, list) and len(py) == 3 and isinstance(py[1], list) and len(py[1]) == 625):
        raise _bad("python state malformed")
    if not all(isinstance(x, int) and 0 <= x < 2**32 for x in py[1][:624]):
        raise _bad("python state values out of range")


def restore(state: Dict[str, Any]) -> None:
    import paddle
    from paddle.framework import core

    validate(state)
    current = paddle.get_rng_state()
    if len(current) != len(state["paddle"]):
        raise CorruptCheckpointError(
            f"checkpoint holds {len(state['paddle'])} Paddle generator states, this process has {len(current)}"
        )
    gens = []
    for device, seed, offset, raw in state["paddle"]:
        g = core.GeneratorState.__new__(core.GeneratorState)
        g.__setstate__((device, seed, offset, list(raw.encode("ascii"))))
        gens.append(g)
    paddle.set_rng_state(gens)
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))
