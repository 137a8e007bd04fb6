"""Where the reader's bytes come from: a data file's chunks, in order, for its one verification loop.

A mapped local file (``verify``, ``export``), a local file mapped a window at a time (restore) or read with ``preadv``,
a remote file read in order, and :class:`RangedChunks` (a remote restore's parallel ranged reads into its landing
buffer)."""

from __future__ import annotations

import contextlib
import errno
import mmap
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format.engine.arena import alloc_buffer, populate_pages
from paddle_acp.format.engine.crc import drain
from paddle_acp.format.engine.loaded import pread_into
from paddle_acp.storage.base import InputFile

MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14
RANGED_READERS = 4  # connections a remote restore reads on in parallel (unless its storage says: ranged_readers)


def populate(mapping: mmap.mmap, off: int, n: int, data_path: str, base: int = 0) -> None:
    """Wait until bytes [off, off + n) of a mapping (of a file from byte ``base``) are in the page cache."""
    pos = base + off
    while True:
        try:
            mapping.madvise(MADV_POPULATE_READ, off, n)
            return
        except (InterruptedError, BlockingIOError):  # EINTR, EAGAIN: try again
            continue
        except OSError as exc:
            if exc.errno == errno.EFAULT:  # pages past the end: the file shrank under the mapping
                raise CorruptCheckpointError(f"{data_path}: short read at byte {pos}") from None
            raise StorageError(f"reading {data_path} failed at byte {pos}: {exc}") from exc


def map_file(fd: int, size: int) -> Optional[mmap.mmap]:
    """The file mapped read-only for verifying; None where not possible (empty file, no ``MADV_POPULATE_READ``)."""
    if size <= 0 or not hasattr(mmap, "MAP_SHARED"):
        return None
    try:
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    try:
        mapping.madvise(mmap.MADV_SEQUENTIAL)
        mapping.madvise(MADV_POPULATE_READ, 0, min(size, mmap.PAGESIZE))  # EINVAL before Linux 5.14
    except (OSError, ValueError, AttributeError):
        mapping.close()
        return None
    return mapping


class Chunks:
    """A data file's bytes, a chunk at a time, in order: ``get(pos, n, slot)`` returns bytes ``[pos, pos + n)``; with
    ``depth`` set, in ``depth`` rotating buffers (``slot``: the one whose previous checksum is done), else each stays
    valid to the end."""

    depth: Optional[int] = None

    def __init__(self, data_path: str, size: int):
        self._path = data_path
        self.size = size  # the chunk size

    def get(self, pos: int, n: int, slot: int) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what the chunks hold (after the last checksum is done)."""


class MappedChunks(Chunks):
    """A mapped local file: each chunk's pages are populated (no copy) and checksummed in place."""

    def __init__(self, mapping: mmap.mmap, data_path: str, size: int):
        super().__init__(data_path, size)
        self._map = mapping
        self._data = np.frombuffer(mapping, dtype=np.uint8)

    def get(self, pos: int, n: int, slot: int) -> np.ndarray:
        populate(self._map, pos, n, self._path)
        return self._data[pos:pos + n]


class WindowChunks(Chunks):
    """A local file mapped one chunk at a time, ``depth`` windows at most (mapped pages count in the process's memory),
    checksummed in place; a window is unmapped when its slot comes round again or at :meth:`close`."""

    depth: Optional[int] = 3

    def __init__(self, fd: int, data_path: str, size: int):
        super().__init__(data_path, size)
        self._fd = fd
        self._windows: Dict[int, mmap.mmap] = {}

    def get(self, pos: int, n: int, slot: int) -> np.ndarray:
        self._unmap(slot)
        try:
            window = mmap.mmap(self._fd, n, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=pos)
        except (OSError, ValueError) as exc:
            raise StorageError(f"reading {self._path} failed at byte {pos}: {exc}") from exc
        self._windows[slot] = window
        populate(window, 0, n, self._path, pos)
        return np.frombuffer(window, dtype=np.uint8)

    def _unmap(self, slot: int) -> None:
        window = self._windows.pop(slot, None)
        if window is not None:
            with contextlib.suppress(BufferError):  # a view is still alive (a traceback): unmapped with it
                window.close()

    def close(self) -> None:
        for slot in list(self._windows):
            self._unmap(slot)


class Buffered(Chunks):
    """Chunks read into three rotating buffers."""

    depth: Optional[int] = 3

    def __init__(self, data_path: str, size: int):
        super().__init__(data_path, size)
        self._bufs: List[np.ndarray] = []

    def get(self, pos: int, n: int, slot: int) -> np.ndarray:
        while len(self._bufs) <= slot:
            self._bufs.append(alloc_buffer(self.size))
        buf = self._bufs[slot][:n]
        self._fill(buf.data, pos)
        return buf

    def _fill(self, mv: memoryview, pos: int) -> None:
        raise NotImplementedError


class PreadChunks(Buffered):
    """A local file read with ``preadv`` into rotating buffers."""

    def __init__(self, fd: int, data_path: str, size: int):
        super().__init__(data_path, size)
        self._fd = fd

    def _fill(self, mv: memoryview, pos: int) -> None:
        got = pread_into(self._fd, mv, pos)
        if got < mv.nbytes:
            raise CorruptCheckpointError(f"{self._path}: short read at byte {pos + got}")


def fill_from(f: InputFile, mv: memoryview, pos: int, data_path: str) -> None:
    """Fill ``mv`` from a remote file read in order."""
    got = 0
    while got < mv.nbytes:
        r = f.readinto(mv[got:])
        if not r or r <= 0:
            raise CorruptCheckpointError(f"{data_path}: short read at byte {pos + got}")
        got += r


class RemoteChunks(Buffered):
    """A remote file read in order, into rotating buffers (a verification, a spool)."""

    def __init__(self, f: InputFile, data_path: str, size: int):
        super().__init__(data_path, size)
        self._f = f

    def _fill(self, mv: memoryview, pos: int) -> None:
        fill_from(self._f, mv, pos, self._path)

    def check_end(self, end: int) -> None:
        """Nothing may follow byte ``end`` (a remote data file's size is checked as it is read)."""
        _check_end(self._f, self._path, end)


def _check_end(f: InputFile, data_path: str, end: int) -> None:
    if f.read(1):
        raise CorruptCheckpointError(f"{data_path} is larger than the {end} bytes its manifest records")


class RangedChunks(Chunks):
    """A remote file read straight into ``image`` by ranged reads on ``readers`` connections in parallel, handed on in
    order. :meth:`close` cancels reads not started and waits for running ones: nothing writes into ``image`` after."""

    def __init__(self, open_file: Callable[[], InputFile], data_path: str, size: int, image: np.ndarray,
                 readers: int = RANGED_READERS):
        super().__init__(data_path, size)
        self._open = open_file
        self._image = image
        self._local = threading.local()
        self._files: List[InputFile] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(1, readers), thread_name_prefix="paddle-acp-restore-read")
        self._futs: Dict[int, Future[None]] = {}
        total = image.nbytes
        for pos in range(0, total, size):
            self._futs[pos] = self._pool.submit(self._read, pos, min(size, total - pos))

    def _file(self) -> InputFile:
        f: Optional[InputFile] = getattr(self._local, "f", None)
        if f is None:
            f = self._open()
            with self._lock:
                self._files.append(f)
            self._local.f = f
        return f

    def _read(self, pos: int, n: int) -> None:
        f = self._file()
        f.seek(pos)
        dst = self._image[pos:pos + n]
        populate_pages(dst)  # the lent arena's fresh pages, in one call rather than faulted in by the read
        fill_from(f, dst.data, pos, self._path)

    def get(self, pos: int, n: int, slot: int) -> np.ndarray:
        self._futs[pos].result()
        return self._image[pos:pos + n]

    def check_end(self, end: int) -> None:
        f = self._file()
        f.seek(end)
        _check_end(f, self._path, end)

    def close(self) -> None:
        drain(self._futs.values())
        self._pool.shutdown(wait=True)
        for f in self._files:
            try:
                f.close()
            except (OSError, StorageError):
                pass
        self._files = []

    def __enter__(self) -> "RangedChunks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def local_chunks(fd: int, mapping: Optional[mmap.mmap], data_path: str, size: int) -> Chunks:
    return MappedChunks(mapping, data_path, size) if mapping is not None else PreadChunks(fd, data_path, size)
