"""Checksums on a second core: the CRC threads shared by the writer and the reader.

Two threads: the background one (:func:`crc_pool`, at a lower CPU priority) for work that overlaps
training (a save's checksums, ``paddle-acp verify``), and the restore's (:func:`restore_crc_pool`, at
normal priority) for checksums that training waits for: at a lower priority it was the first to touch
each freshly read page and a busy core starved it, so a restore waited for it (issue 44)."""

from __future__ import annotations

import signal
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Optional

import numpy as np

from paddle_acp.format.manifest import VERSION, checksum_function
from paddle_acp.threads import lower_thread_priority

_pool: Optional[ThreadPoolExecutor] = None
_restore_pool: Optional[ThreadPoolExecutor] = None


def crc_pool() -> ThreadPoolExecutor:
    """The background CRC worker thread (started on first use, at a lower CPU priority)."""
    global _pool
    if _pool is None:
        _pool = _start("paddle-acp-crc", lower_thread_priority)
    return _pool


def restore_crc_pool() -> ThreadPoolExecutor:
    """The restore's CRC worker thread (started on first use, at normal priority): training waits for it."""
    global _restore_pool
    if _restore_pool is None:
        _restore_pool = _start("paddle-acp-crc-restore", None)
    return _restore_pool


def _start(name: str, initializer: Optional[Callable[[], None]]) -> ThreadPoolExecutor:
    """A one-thread pool whose worker is started now (``initializer``: run in it first)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=initializer)
    # Start its worker now, with Ctrl-C and SIGTERM held back: a KeyboardInterrupt raised inside
    # the pool's Thread.start() leaves a worker the pool does not know, and the interpreter then
    # waits for it forever at exit. A held-back signal is delivered right after (the worker
    # inherits the mask: signals are the main thread's business anyway).
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held) if hasattr(signal, "pthread_sigmask") else None
    try:
        pool.submit(int).result()
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return pool


def checksum(arr: np.ndarray, version: int = VERSION) -> int:
    """The checksum of a C-contiguous array's bytes, as a manifest of ``version`` records it."""
    return checksum_function(version)(arr.data.cast("B"), 0) if arr.nbytes else 0  # cast() rejects 0 in shape


def drain(futs: Iterable[Future[Any]]) -> None:
    """Cancel the futures not started yet and wait for the running ones."""
    for f in futs:
        if not f.cancel():
            f.exception()
