"""What is captured without code: the RNG objects a script holds, found in its globals and locals.

:func:`capturable` is the one decision of what is captured (restored in place, the same object goes on drawing):
a NumPy ``Generator`` (with its seed sequence), ``BitGenerator``, ``RandomState`` or ``SeedSequence`` (how many
children it spawned), or a ``random.Random`` other than ``SystemRandom``. :func:`find_captured` finds them in
the module globals and locals of the frame that opens the loop, under stable names; :class:`Site` looks the
names up again at each save (a name rebound inside the loop is saved as it holds then).

Not captured, because every checkpoint saves them already or they have no state: Paddle's generators (the
global RNG state) and Paddle's ``io`` samplers. Other objects are added with ``state=`` or ``paddle_acp.track``.
"""

from __future__ import annotations

import random
import sys
from types import FrameType
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

__all__ = ["MAX_CONTAINER", "MISSING", "WHOLE", "Binding", "Site", "caller_frame", "capturable", "find_captured", "rng_kind"]

MAX_CONTAINER = 1000  # a list, tuple or dict with more items is not looked into (cheap start)


def rng_kind(obj: Any) -> Optional[str]:
    """The kind of RNG object ``obj`` is (a key of ``format.objstate.RNG_KINDS``), or None: not one captured."""
    if isinstance(obj, np.random.Generator):
        return "numpy.Generator"
    if isinstance(obj, np.random.SeedSequence):
        return "numpy.SeedSequence"
    if isinstance(obj, np.random.RandomState):
        return "numpy.RandomState"
    if isinstance(obj, np.random.BitGenerator):
        return "numpy.BitGenerator"
    if isinstance(obj, random.Random) and not isinstance(obj, random.SystemRandom):
        return "random.Random"
    return None


def capturable(obj: Any) -> bool:
    """Whether ``obj`` is captured without code when a script holds it."""
    return rng_kind(obj) is not None


def _label(key: Any) -> str:
    return repr(key) if isinstance(key, (str, int)) else f"<{type(key).__name__}>"


class Binding(NamedTuple):
    """Where a captured object was found: ``scope`` ("module_global" or "local"), the variable, ``key``
    (:data:`WHOLE`, or the key or index of the container's item)."""

    scope: str
    var: str
    key: Any


WHOLE = object()  # Binding.key of an object held by the name itself
MISSING = object()  # Site.resolve: the name, or its item, is gone


def _walk(module_globals: Mapping[str, Any], frame_locals: Optional[Mapping[str, Any]]) -> Iterator[Tuple[str, Binding, Any]]:
    """Every capturable object reachable from the scopes, with its name and binding (repeats included)."""
    scopes = [("module_global", module_globals)]
    if frame_locals is not None and frame_locals is not module_globals:
        scopes.append(("local", frame_locals))
    for prefix, scope in scopes:
        for name, obj in list(scope.items()):
            if not isinstance(name, str) or name.startswith("__"):
                continue
            base = f"{prefix}:{name}"
            if capturable(obj):
                yield base, Binding(prefix, name, WHOLE), obj
            if type(obj) in (list, tuple) and len(obj) <= MAX_CONTAINER:
                for i, item in enumerate(obj):
                    if capturable(item):
                        yield f"{base}[{i}]", Binding(prefix, name, i), item
            elif type(obj) is dict and len(obj) <= MAX_CONTAINER:
                for key, item in list(obj.items()):
                    if capturable(item):
                        yield f"{base}[{_label(key)}]", Binding(prefix, name, key), item


def find_captured(module_globals: Mapping[str, Any], frame_locals: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The capturable objects reachable from the scopes: name -> object, each object once, under its first name.

    Names: ``module_global:<name>`` and ``local:<name>``, with ``[<key>]`` for an item one level inside a plain
    ``dict``, ``list`` or ``tuple`` (of at most :data:`MAX_CONTAINER` items); ``__`` names are skipped.
    """
    return {name: obj for name, (_, obj) in _find(module_globals, frame_locals)[0].items()}


def _find(module_globals: Mapping[str, Any], frame_locals: Optional[Mapping[str, Any]]
          ) -> Tuple[Dict[str, Tuple[Binding, Any]], Dict[str, List[Tuple[str, Binding]]]]:
    found: Dict[str, Tuple[Binding, Any]] = {}
    first: Dict[int, str] = {}  # id() of an object found -> its name
    aliases: Dict[str, List[Tuple[str, Binding]]] = {}
    for name, binding, obj in _walk(module_globals, frame_locals):
        if id(obj) in first:
            aliases.setdefault(first[id(obj)], []).append((name, binding))
        else:
            first[id(obj)] = name
            found[name] = (binding, obj)
    return found, aliases


def _resolve(scope: Optional[Mapping[str, Any]], b: Binding) -> Any:
    if scope is None or b.var not in scope:
        return MISSING
    obj = scope[b.var]
    if b.key is WHOLE:
        return obj
    if type(obj) in (list, tuple):
        return obj[b.key] if isinstance(b.key, int) and 0 <= b.key < len(obj) else MISSING
    if type(obj) is dict:
        return obj.get(b.key, MISSING)
    return MISSING


class Site:
    """The scopes of the frame that opened a loop: what is captured there, looked up again at each save.

    ``found`` (as :func:`find_captured`), ``bindings``, and ``aliases``: the other names that held the same
    object when the loop opened. :meth:`release` drops the frame (it holds its locals alive)."""

    def __init__(self, frame: FrameType) -> None:
        self._globals: Mapping[str, Any] = frame.f_globals
        self._frame: Optional[FrameType] = frame if frame.f_locals is not frame.f_globals else None
        found, self.aliases = _find(self._globals, self._frame.f_locals if self._frame is not None else None)
        self.bindings = {name: b for name, (b, _) in found.items()}
        self.found = {name: obj for name, (_, obj) in found.items()}

    def current(self) -> Dict[str, Any]:
        """What each name (captured or alias) holds now: name -> object, or :data:`MISSING`."""
        scopes: Dict[str, Optional[Mapping[str, Any]]] = {
            "module_global": self._globals, "local": self._frame.f_locals if self._frame is not None else None}
        named = list(self.bindings.items()) + [a for names in self.aliases.values() for a in names]
        return {name: _resolve(scopes[b.scope], b) for name, b in named}

    def release(self) -> None:
        self._frame = None
        self._globals = {}


def caller_frame() -> Optional[FrameType]:
    """The innermost frame outside paddle-acp (the script's frame that opened the loop), or None."""
    f: Optional[FrameType] = sys._getframe(1)
    while f is not None and str(f.f_globals.get("__name__", "")).split(".")[0] in ("paddle_acp", "contextlib"):
        f = f.f_back
    return f
