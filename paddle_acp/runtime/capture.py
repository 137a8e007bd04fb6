"""What is captured without code: the RNG objects a script holds, found in its globals and locals.

The one decision of what can be captured is :func:`capturable` (and :func:`rng_kind`, which
names the kind); :func:`find_captured` finds the capturable objects reachable from a frame's
module globals and locals, under stable names. ``train_epoch_range`` calls it with the frame
that opens the loop (:func:`caller_frame`), and every checkpoint then holds those objects'
state (:mod:`paddle_acp.runtime.objects`; the serialized form is
:mod:`paddle_acp.format.objstate`).

Captured (restored in place: the same object goes on drawing):

* ``numpy.random.Generator`` (``np.random.default_rng(seed)``): its bit generator's state;
* a bare NumPy ``BitGenerator`` (``np.random.PCG64(seed)``, ...);
* ``numpy.random.RandomState``;
* ``random.Random`` and subclasses, except ``random.SystemRandom`` (it has no state).

Not captured, because every checkpoint saves them already or they have no state: Paddle's
generators (``paddle.Generator(device)`` returns the device's default generator, saved with the
global RNG state); Paddle's ``io`` samplers, which draw from NumPy's global RNG, from
``np.random.RandomState(epoch)`` (``DistributedBatchSampler``) or from a Python iterator passed as
``generator=`` (which cannot be saved). Other objects are added with
``train_epoch_range(state=...)`` or ``paddle_acp.track``.
"""

from __future__ import annotations

import random
import sys
from types import FrameType
from typing import Any, Dict, Mapping, Optional, Set

import numpy as np

__all__ = ["MAX_CONTAINER", "caller_frame", "capturable", "find_captured", "rng_kind"]

MAX_CONTAINER = 1000  # a list, tuple or dict with more items is not looked into (cheap start)


def rng_kind(obj: Any) -> Optional[str]:
    """The kind of RNG object ``obj`` is (a key of ``format.objstate.RNG_KINDS``), or None when it
    is not one paddle-acp can save and restore in place."""
    if isinstance(obj, np.random.Generator):
        return "numpy.Generator"
    if isinstance(obj, np.random.RandomState):
        return "numpy.RandomState"
    if isinstance(obj, np.random.BitGenerator):
        return "numpy.BitGenerator"
    if isinstance(obj, random.Random) and not isinstance(obj, random.SystemRandom):
        return "random.Random"
    return None


def capturable(obj: Any) -> bool:
    """Whether ``obj`` is captured without code when a script holds it: a NumPy ``Generator``,
    ``BitGenerator`` or ``RandomState``, or a ``random.Random`` (not ``SystemRandom``)."""
    return rng_kind(obj) is not None


def _label(key: Any) -> str:
    return repr(key) if isinstance(key, (str, int)) else f"<{type(key).__name__}>"


def find_captured(module_globals: Mapping[str, Any], frame_locals: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The capturable objects reachable from ``module_globals`` and ``frame_locals``: name -> object.

    Names are stable across runs of one script: ``module_global:<name>`` and ``local:<name>``,
    with ``[<key>]`` or ``[<index>]`` appended for an object one level inside a plain ``dict``,
    ``list`` or ``tuple`` (of at most :data:`MAX_CONTAINER` items) held under that name. Globals
    come first, in definition order; an object reachable under several names is listed once,
    under the first. Names that start with ``__`` are skipped. ``frame_locals`` may be
    ``module_globals`` itself (a loop at module level): then only ``module_global:`` names result.
    """
    found: Dict[str, Any] = {}
    seen: Set[int] = set()  # the id()s of the objects found

    def add(name: str, obj: Any) -> None:
        if id(obj) not in seen and capturable(obj):
            seen.add(id(obj))
            found[name] = obj

    scopes = [("module_global", module_globals)]
    if frame_locals is not None and frame_locals is not module_globals:
        scopes.append(("local", frame_locals))
    for prefix, scope in scopes:
        for name, obj in list(scope.items()):
            if not isinstance(name, str) or name.startswith("__"):
                continue
            base = f"{prefix}:{name}"
            add(base, obj)
            if type(obj) in (list, tuple) and len(obj) <= MAX_CONTAINER:
                for i, item in enumerate(obj):
                    add(f"{base}[{i}]", item)
            elif type(obj) is dict and len(obj) <= MAX_CONTAINER:
                for key, item in list(obj.items()):
                    add(f"{base}[{_label(key)}]", item)
    return found


def caller_frame() -> Optional[FrameType]:
    """The innermost frame outside paddle-acp (the script's frame that opened the loop), or None."""
    f: Optional[FrameType] = sys._getframe(1)
    while f is not None and str(f.f_globals.get("__name__", "")).split(".")[0] in ("paddle_acp", "contextlib"):
        f = f.f_back
    return f
