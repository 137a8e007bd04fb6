"""Forked children and their parent's storage clients: owns which clients a child inherited, and keeps them alive.

An HDFS client's native half has threads (libhdfs's JVM, hdfs-native's tokio runtime); a forked child has only the
thread that forked, so closing, destroying or calling such a client there waits forever for threads it lacks. The rule:
**a forked child never touches, drops or waits for its parent's client**. Each client that is not fork-safe is
:func:`track`-ed; a child keeps each alive forever (:func:`keep_forever`: no destructor runs) and refuses calls through
it (``ArrowStorage.fs``, :func:`opened_here`). The leak: the child's copy of the client's memory, freed at exit."""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any, Dict, List

# this process's clients that are not fork-safe, while alive (by id: pyarrow's filesystems are not hashable)
_live: Dict[int, "weakref.ReferenceType[Any]"] = {}
_inherited: List[Any] = []  # in a forked child: what it inherited of its parent's clients (never released)


def track(client: Any) -> None:
    """Record ``client`` (made by this process): a child forked while it lives inherits it untouched."""
    key = id(client)
    _live[key] = weakref.ref(client, lambda _ref: _live.pop(key, None))


def keep_forever(obj: Any) -> None:
    """Keep ``obj`` alive until this process ends, its destructor never run: a reference in :data:`_inherited`
    and one that nothing releases (the interpreter's shutdown clears module globals too)."""
    _inherited.append(obj)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def opened_here(pid: int) -> bool:
    """Whether a storage made by process ``pid`` belongs to this process (not to a parent)."""
    return pid == os.getpid()


def _after_fork_in_child() -> None:
    # no lock, no logging, no call into a client: only references move
    global _live
    for ref in list(_live.values()):
        client = ref()
        if client is not None:
            keep_forever(client)
    _live = {}  # what this child opens itself (its own children inherit those)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
