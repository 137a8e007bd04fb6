"""Streamed saves: a state larger than the host-memory budget, saved through a bounded buffer.

The checkpoint's file image goes through the arena's slots chunk by chunk: a copy thread (which training waits for)
copies the next chunk out of the live tensors into a free slot; the writer writes each full slot, checksums it on the
CRC thread meanwhile, and frees it. Training resumes when the last chunk is copied. Nothing here reads a tensor after
:meth:`ChunkStream.join` returned: the writer only sees the slots."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.format.engine.arena import PAGE
from paddle_acp.format.engine.crc import crc_pool
from paddle_acp.format.engine.stager import HOST, Stager
from paddle_acp.format.manifest import VERSION, checksum_function
from paddle_acp.storage.local import sync_to

logger = logging.getLogger("paddle_acp")

MAX_CHUNK = 64 << 20  # larger chunks gain nothing (the write is the bottleneck) and waste the budget's overlap
MIN_SLOTS = 2  # double buffering: one slot is written while the next is copied
_ABORT = -1


def chunk_size(budget: int) -> int:
    """The slot size for a buffer of ``budget`` bytes: at most 64 MiB, at least two slots, whole pages."""
    return max(PAGE, min(MAX_CHUNK, budget // MIN_SLOTS) // PAGE * PAGE)


class StreamAborted(CheckpointError):
    """The streamed snapshot was abandoned (its writer failed, or its copy was interrupted)."""


class ChunkStream:
    """One checkpoint's file image, copied out of the live tensors in bounded chunks: ``tensors`` are laid out and hold
    views of the live tensors; ``buf`` is the page-aligned arena (at least two chunks)."""

    def __init__(self, tensors: Sequence[Any], size: int, buf: np.ndarray, chunk: int, stager: Stager = HOST) -> None:
        if chunk <= 0 or chunk % PAGE or buf.nbytes < MIN_SLOTS * chunk:
            raise ValueError(f"a stream needs at least {MIN_SLOTS} page-aligned chunks (chunk {chunk}, buffer {buf.nbytes})")
        self.size = size
        self.chunk = chunk
        self._stager = stager
        nslots = buf.nbytes // chunk
        self._slots = [buf[i * chunk:(i + 1) * chunk] for i in range(nslots)]
        self._spans: List[Tuple[int, int]] = [(int(t.offset), int(t.offset) + int(t.array.nbytes)) for t in tensors]
        self._src: List[np.ndarray] = [t.array.reshape(-1).view(np.uint8) for t in tensors]
        self.crcs: List[int] = [0] * len(self._spans)
        self._fn = checksum_function(VERSION)
        self._free: "queue.Queue[int]" = queue.Queue()
        for i in range(nslots):
            self._free.put(i)
        self._full: "queue.Queue[Optional[Tuple[int, int, int]]]" = queue.Queue()
        self._aborted: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.nchunks = (size + chunk - 1) // chunk
        self._t0 = 0.0
        self._copied_at: Optional[float] = None

    @property
    def slots(self) -> int:
        return len(self._slots)

    def start(self, t0: Optional[float] = None) -> None:
        """Start copying on a thread of its own; ``t0``: when the save began (``time.perf_counter()``)."""
        self._t0 = time.perf_counter() if t0 is None else t0
        self._thread = threading.Thread(target=self._produce, name="paddle-acp-copy", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait until every byte is copied out of the tensors (or the stream was abandoned); re-raises a copy error."""
        t = self._thread
        if t is None:
            return
        try:
            while t.is_alive():
                t.join(0.5)
        except BaseException:  # Ctrl-C while waiting: nothing may read the tensors after we return
            self.abort("the snapshot copy was interrupted")
            t.join()
            raise
        self._thread = None
        if self._error is not None:
            raise self._error

    def _produce(self) -> None:
        pos = 0
        try:
            while pos < self.size:
                n = min(self.chunk, self.size - pos)
                i = self._free.get()
                if i == _ABORT or self._aborted is not None:
                    return
                self._fill(self._slots[i], pos, n)
                self._full.put((i, pos, n))
                pos += n
            self._copied_at = time.perf_counter()
            self._full.put(None)
        except BaseException as exc:  # re-raised by join() on the training thread
            self._error = exc
            self.abort(f"the snapshot copy failed: {exc}")

    def _overlaps(self, pos: int, end: int) -> Iterator[Tuple[int, int, int, int]]:
        """(index, first byte, and the range [a, b) in [pos, end)) of each tensor with bytes there, in file order."""
        for i, (lo, hi) in enumerate(self._spans):
            if hi <= pos or lo == hi:
                continue
            if lo >= end:
                break
            yield i, lo, max(lo, pos), min(hi, end)

    def _fill(self, slot: np.ndarray, pos: int, n: int) -> None:
        """Copy file bytes [pos, pos + n) into ``slot`` (tensor bytes, zero padding between them)."""
        end = pos + n
        pairs: List[Tuple[np.ndarray, np.ndarray]] = []
        cursor = pos
        for i, lo, a, b in self._overlaps(pos, end):
            if a > cursor:
                slot[cursor - pos:a - pos] = 0
            pairs.append((slot[a - pos:b - pos], self._src[i][a - lo:b - lo]))
            cursor = b
        if cursor < end:
            slot[cursor - pos:n] = 0
        padded = min(len(slot), (n + PAGE - 1) // PAGE * PAGE)
        if padded > n:
            slot[n:padded] = 0  # O_DIRECT writes whole pages; the file is truncated to its size after
        self._stager.stage(pairs)

    def abort(self, why: str) -> None:
        """Abandon the stream: the copy stops at its next chunk, the writer fails."""
        if self._aborted is None:
            self._aborted = why
        self._free.put(_ABORT)
        self._full.put((_ABORT, 0, 0))

    def _crc(self, slot: np.ndarray, pos: int, n: int) -> None:
        for i, _lo, a, b in self._overlaps(pos, pos + n):
            self.crcs[i] = self._fn(slot[a - pos:b - pos].data, self.crcs[i])

    def chunks(self) -> Iterator[Tuple[np.ndarray, int, int]]:
        """Yield ``(slot, file offset, bytes)`` in file order; each slot is checksummed meanwhile and handed back when
        the consumer asks for the next one (or stops)."""
        prev: Optional[int] = None
        fut = None
        try:
            while True:
                item = self._full.get()
                if item is None:
                    return
                i, pos, n = item
                if i == _ABORT or self._aborted is not None:
                    raise StreamAborted(f"checkpoint not written: {self._aborted}")
                slot = self._slots[i]
                fut = crc_pool().submit(self._crc, slot, pos, n)
                prev = i
                yield slot, pos, n
                fut.result()
                fut = None
                self._free.put(i)
                prev = None
        finally:
            if fut is not None:
                fut.exception()  # the checksum must not touch a slot handed back
            if prev is not None:
                self.abort(self._aborted or "the checkpoint's write failed")

    def stall_seconds(self) -> float:
        """From the start of the save to the last chunk copied."""
        end = self._copied_at if self._copied_at is not None else time.perf_counter()
        return end - self._t0

    def checksums(self) -> List[int]:
        return list(self.crcs)


def write_stream(storage: Any, path: str, stream: ChunkStream) -> int:
    """Write ``stream`` to ``path`` durably; returns the bytes written. Local disks: ``O_DIRECT`` where the filesystem
    takes it. Remote stores get a copy of each chunk (a client may upload after its call returned)."""
    os_path = storage.local_path(path)
    if os_path is not None:
        return _write_local(os_path, path, stream)
    return int(storage.write_buffers(path, (bytes(slot.data[:n]) for slot, _pos, n in stream.chunks())))


def _write_local(full: str, path: str, stream: ChunkStream) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    direct = getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(full, flags | direct, 0o644) if direct else os.open(full, flags, 0o644)
    except OSError:
        if not direct:
            raise StorageError(f"opening {path} for write failed") from None
        direct = 0
        try:
            fd = os.open(full, flags, 0o644)
        except OSError as exc:
            raise StorageError(f"opening {path} for write failed: {exc.strerror}") from exc
    total = 0
    try:
        for slot, pos, n in stream.chunks():
            mv = slot.data[:min(len(slot), (n + PAGE - 1) // PAGE * PAGE) if direct else n]
            done = 0
            while done < len(mv):
                try:
                    w = os.pwrite(fd, mv[done:], pos + done)
                except OSError as exc:
                    if direct and done == 0 and pos == 0 and exc.errno == 22:  # EINVAL: no O_DIRECT after all
                        os.close(fd)
                        fd = os.open(full, flags, 0o644)
                        direct = 0
                        mv = slot.data[:n]
                        continue
                    raise StorageError(f"writing {path} failed at byte {pos + done}: {exc.strerror}") from exc
                if w <= 0:
                    raise StorageError(f"writing {path} made no progress at byte {pos + done}")
                done += w
            total += n
        sync_to(fd, total)
    finally:
        os.close(fd)
    return total

