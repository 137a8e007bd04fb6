"""Forked children and their parent's storage clients: owns which clients a child inherited, and keeps them alive.

An HDFS client's native half has threads: libhdfs's JVM (its GC, its IPC connections), hdfs-native's tokio
runtime. A forked child (a ``multiprocessing.Pool`` or DataLoader worker, a raw ``os.fork``) has only the
thread that forked, so closing or destroying such a client in the child waits for threads that do not exist:
the child hangs forever, at the fork hook that drops it, in its destructor at exit, or in the first call it
makes. The rule (issue 42): **a forked child never touches, drops or waits for its parent's client**.

* :func:`track` records every client that is not fork-safe (``ArrowStorage.fork_safe`` false) when its
  storage is made; in a forked child, :func:`_after_fork_in_child` moves every tracked one into
  :data:`_inherited` and adds a reference the interpreter never releases (:func:`keep_forever`), so its
  destructor runs neither when the child drops it nor when the child's interpreter ends (which clears every
  module's globals, this list included);
* :func:`opened_here` says whether this process made a storage: a child's call through its parent's
  client is refused with a :class:`~paddle_acp.errors.StorageError` naming the problem instead of hanging
  (``ArrowStorage.fs``);
* other layers hand what they hold of a parent's client (the early connection of
  :mod:`paddle_acp.runtime.early`) to :func:`keep_forever` from their own fork hooks.

The leak is the child's only: a worker's copy of the client's memory, freed when the child exits.
"""

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
    """Keep ``obj`` alive until this process ends, its destructor never run: a reference in
    :data:`_inherited` (dropping the parent's copy in a fork hook does not destroy it) and one more that
    nothing releases (the interpreter's shutdown clears module globals, :data:`_inherited` too)."""
    _inherited.append(obj)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def opened_here(pid: int) -> bool:
    """Whether a storage made by process ``pid`` belongs to this process (not to a parent it was forked from)."""
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
