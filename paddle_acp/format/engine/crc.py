"""Checksums on other cores: the CRC threads shared by the writer and the reader.

The background thread (:func:`crc_pool`, lower CPU priority) for work that overlaps training, and the restore's two
(:func:`restore_crc_pool`, normal priority: at a lower one a busy core starved them and the restore waited). Chunks of
one tensor are checksummed apart, each from 0; :func:`combine` joins them."""

from __future__ import annotations

import functools
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, Optional

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


RESTORE_CRC_THREADS = 2


def restore_crc_pool() -> ThreadPoolExecutor:
    """The restore's CRC worker threads (started on first use, at normal priority): training waits for them."""
    global _restore_pool
    if _restore_pool is None:
        _restore_pool = _start("paddle-acp-crc-restore", None, RESTORE_CRC_THREADS)
    return _restore_pool


def _start(name: str, initializer: Optional[Callable[[], None]], workers: int = 1) -> ThreadPoolExecutor:
    """A pool whose ``workers`` threads are all started now (``initializer``: run in each first)."""
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name, initializer=initializer)
    # Start the workers now with SIGINT/SIGTERM held back: a KeyboardInterrupt inside Thread.start() leaves a
    # worker the pool does not know, which the interpreter waits for forever at exit (delivered right after).
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held) if hasattr(signal, "pthread_sigmask") else None
    try:
        started = threading.Barrier(workers)  # each task holds its worker until all are up: one thread each
        for f in [pool.submit(started.wait) for _ in range(workers)]:
            f.result()
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


# -- joining the checksums of consecutive pieces ------------------------------------------------
_POLYS: Dict[str, int] = {"crc32": 0xEDB88320, "crc32c": 0x82F63B78}  # TENSOR_CHECKSUMS' names: reflected polynomials


def _multmodp(a: int, b: int, poly: int) -> int:
    """a * b modulo the polynomial (reflected bit order, as zlib's ``multmodp``)."""
    m, p = 1 << 31, 0
    while m:
        if a & m:
            p ^= b
            if not a & (m - 1):
                break
        m >>= 1
        b = (b >> 1) ^ poly if b & 1 else b >> 1
    return p


@functools.lru_cache(maxsize=None)
def _x2n_table(poly: int) -> List[int]:
    """x^(2^n) modulo the polynomial, n = 0..31."""
    table, p = [], 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p, poly)
    return table


@functools.lru_cache(maxsize=1024)
def _shift(poly: int, nbytes: int) -> int:
    """x^(8 * nbytes) modulo the polynomial: appending ``nbytes`` zero bytes (zlib's ``x2nmodp(n, 3)``)."""
    table, p, k = _x2n_table(poly), 1 << 31, 3
    while nbytes:
        if nbytes & 1:
            p = _multmodp(table[k & 31], p, poly)
        nbytes >>= 1
        k += 1
    return p


def combine(algorithm: str, crc1: int, crc2: int, len2: int) -> int:
    """The ``algorithm`` checksum of A followed by B, from ``crc1`` (A's), ``crc2`` (B's, from 0) and ``len2``."""
    if crc1 == 0 or len2 == 0:  # a zero CRC stays zero when shifted; an empty B shifts nothing
        return crc2 if len2 else crc1
    poly = _POLYS[algorithm]
    return _multmodp(_shift(poly, len2), crc1, poly) ^ crc2
