"""A pass-through Storage that counts the calls made to it (tests and ci/bench/calls_per_rank.py).

:func:`counting` returns the same backend (same class, same connection, same capabilities) with
every public storage call counted by name: only the outermost one per thread (``exists`` calling
``stat`` counts once), which is what the format layer asks of the storage. Storage views made with
``sub`` share the counter. No mock: the calls reach the real backend.
"""

from __future__ import annotations

import collections
import copy
import threading
from typing import Counter, Dict, Type, TypeVar

from paddle_acp.storage.base import Storage

S = TypeVar("S", bound=Storage)

CALLS = ("makedirs", "open_output", "append_bytes", "open_input", "stat", "listdir", "read_bytes", "write_bytes",
         "write_buffers", "write_image", "kind", "exists", "size", "delete_dir", "delete_file", "rename",
         "create_exclusive")

_depth = threading.local()
_classes: Dict[type, type] = {}


def _counted(name: str):
    def call(self, *args, **kwargs):
        depth = getattr(_depth, "n", 0)
        if depth == 0:
            with self._count_lock:
                self.calls[name] += 1
        _depth.n = depth + 1
        try:
            return getattr(super(self._count_base, self), name)(*args, **kwargs)
        finally:
            _depth.n = depth
    call.__name__ = name
    return call


def _subclass(cls: Type[S]) -> Type[S]:
    sub = _classes.get(cls)
    if sub is None:
        sub = type(f"Counting{cls.__name__}", (cls,), {name: _counted(name) for name in CALLS})
        sub._count_base = sub  # type: ignore[attr-defined]
        _classes[cls] = sub
    return sub


def counting(storage: S) -> S:
    """A copy of ``storage`` whose calls are counted in its ``calls`` (a Counter by call name)."""
    st = copy.copy(storage)
    st.__class__ = _subclass(type(storage))
    st.calls = collections.Counter()  # type: ignore[attr-defined]
    st._count_lock = threading.Lock()  # type: ignore[attr-defined]
    return st


def total(storage: Storage) -> int:
    calls: Counter[str] = storage.calls  # type: ignore[attr-defined]
    return sum(calls.values())


def reset(storage: Storage) -> None:
    storage.calls.clear()  # type: ignore[attr-defined]

