"""Restoring a remote checkpoint larger than the host-memory budget.

A remote data file is normally read once into memory and verified there, which doubles
the process's memory at restore (the scope's tensors plus the image). When the file is
larger than the budget it is streamed instead through a few small buffers into an
unlinked local file (the spool), every tensor's checksum computed on the way; only a
file whose every checksum matched is handed to the reader, which then copies the
tensors out of it with ``preadv`` (page cache, nothing mapped).
"""

from __future__ import annotations

import logging
import os
import tempfile
from concurrent.futures import Future
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format.arena import alloc_buffer
from paddle_acp.format.crc import crc_pool, drain

logger = logging.getLogger("paddle_acp")

CHUNK = 8 << 20
BUFFERS = 3


def spool_verified(storage: Any, data_path: str, size: int, spans: Sequence[Tuple[int, int]],
                   expected: Sequence[int], names: Sequence[str], checksum: Callable[[Any, int], int],
                   spool_dir: Optional[str] = None) -> int:
    """Copy ``data_path`` (``size`` bytes) into an unlinked local file, checksumming the tensors
    (``spans``: their byte ranges, in file order) on the way; returns the file's descriptor.

    CorruptCheckpointError when a checksum differs or the file is short; StorageError when the
    spool cannot be written (its directory: ``spool_dir``, else the system's temporary one)."""
    try:
        fd, path = tempfile.mkstemp(prefix="paddle-acp-restore-", dir=spool_dir)
        os.unlink(path)  # gone with the descriptor, whatever happens to this process
    except OSError as exc:
        raise StorageError(f"cannot create a local spool file for restoring {data_path} "
                           f"({spool_dir or tempfile.gettempdir()}): {exc.strerror}") from exc
    try:
        _copy(storage, data_path, size, fd, spans, expected, names, checksum)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _copy(storage: Any, data_path: str, size: int, fd: int, spans: Sequence[Tuple[int, int]],
          expected: Sequence[int], names: Sequence[str], checksum: Callable[[Any, int], int]) -> None:
    crcs = [0] * len(spans)

    def crc_chunk(buf: np.ndarray, start: int, n: int, first: int) -> None:
        end = start + n
        i = first
        while i < len(spans) and spans[i][0] < end:
            lo, hi = max(spans[i][0], start), min(spans[i][1], end)
            if hi > lo:
                crcs[i] = checksum(buf[lo - start:hi - start], crcs[i])
            i += 1

    bufs = [alloc_buffer(CHUNK) for _ in range(BUFFERS)]
    futs: List[Optional["Future[None]"]] = [None] * BUFFERS
    pos, first, k = 0, 0, 0
    try:
        with storage.open_input(data_path) as f:
            while pos < size:
                slot = k % BUFFERS
                prev = futs[slot]
                if prev is not None:
                    prev.result()
                n = min(CHUNK, size - pos)
                mv = bufs[slot].data[:n]
                got = 0
                while got < n:
                    r = f.readinto(mv[got:])
                    if not r:
                        raise CorruptCheckpointError(f"{data_path}: short read at byte {pos + got}")
                    got += r
                done = 0
                while done < n:
                    try:
                        done += os.pwrite(fd, mv[done:], pos + done)
                    except OSError as exc:
                        raise StorageError(f"writing the local spool of {data_path} failed: {exc.strerror}") from exc
                while first < len(spans) and spans[first][1] <= pos:
                    first += 1
                futs[slot] = crc_pool().submit(crc_chunk, bufs[slot], pos, n, first)
                pos += n
                k += 1
    except BaseException:
        drain([f for f in futs if f is not None])  # before the buffers go
        raise
    for fut in futs:
        if fut is not None:
            fut.result()
    for crc, want, name in zip(crcs, expected, names):
        if crc != want:
            raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {name!r}")
