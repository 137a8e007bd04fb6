"""Checksums on a second core: the CRC thread shared by the writer and the reader."""

from __future__ import annotations

import signal
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Optional

import numpy as np

from paddle_acp.format.manifest import VERSION, checksum_function
from paddle_acp.threads import lower_thread_priority

_pool: Optional[ThreadPoolExecutor] = None


def crc_pool() -> ThreadPoolExecutor:
    """The one CRC worker thread (started on first use, at a lower CPU priority)."""
    global _pool
    if _pool is None:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paddle-acp-crc", initializer=lower_thread_priority)
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
        _pool = pool
    return _pool


def checksum(arr: np.ndarray, version: int = VERSION) -> int:
    """The checksum of a C-contiguous array's bytes, as a manifest of ``version`` records it."""
    return checksum_function(version)(arr.data.cast("B"), 0) if arr.nbytes else 0  # cast() rejects 0 in shape


def drain(futs: Iterable["Future[Any]"]) -> None:
    """Cancel the futures not started yet and wait for the running ones."""
    for f in futs:
        if not f.cancel():
            f.exception()
