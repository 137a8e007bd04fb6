"""Host memory for checkpoints: page-aligned buffers, the reusable arena, parallel copies.

Reused across saves (one arena per range): after the first save a snapshot is a memcpy per tensor, no allocation."""

from __future__ import annotations

import ctypes
import mmap
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

PAGE = 4096
HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KB base pages) transparent huge page size

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
_POPULATE_CHUNK = 32 << 20
_BACKGROUND_CHUNK = HUGE_PAGE  # a background population's unit: it holds the address-space lock (see Arena)
_COPY_CHUNK = 32 << 20
_ANONYMOUS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)  # 0: the platform has none

J = TypeVar("J")
CopyJob = Tuple[np.ndarray, np.ndarray]  # (destination, source) of the same size


def alloc_buffer(size: int) -> np.ndarray:
    """A page-aligned uint8 buffer whose pages are populated by the kernel in bulk.

    Page-by-page faults cost ~2 s per GB, kernel population ~0.3 s; populated 32 MB at a time (``MADV_POPULATE_WRITE``;
    older kernels: ``MAP_POPULATE``) so the training thread's mmap/munmap, which need the same address-space lock, are
    never held up long. Transparent huge pages: on VMs with free page reporting a resident buffer of 4 KB pages made
    training steps 2-20% slower (Paddle's freed step memory was reported to the host and faulted back in)."""
    if size <= 0:
        return np.empty(0, dtype=np.uint8)
    mm = _anonymous_mapping(size)
    if mm is None:
        return np.empty(size, dtype=np.uint8)
    try:
        for off in range(0, size, _POPULATE_CHUNK):
            mm.madvise(_MADV_POPULATE_WRITE, off, min(_POPULATE_CHUNK, size - off))
    except (OSError, ValueError, AttributeError):
        mm.close()
        try:
            mm = mmap.mmap(-1, size, flags=_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
        except (OSError, ValueError, TypeError):
            return np.empty(size, dtype=np.uint8)
    return np.frombuffer(mm, dtype=np.uint8)  # the array keeps the mapping alive


def _anonymous_mapping(size: int) -> Optional[mmap.mmap]:
    """An anonymous mapping of ``size`` bytes asking for transparent huge pages; None when it cannot be made."""
    try:
        mm = mmap.mmap(-1, size, flags=_ANONYMOUS) if _ANONYMOUS else mmap.mmap(-1, size)
    except (OSError, ValueError, TypeError):
        return None
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError, AttributeError):  # no transparent huge pages here
        pass
    return mm


def _map_unpopulated(size: int) -> Optional[mmap.mmap]:
    """Unpopulated private anonymous mapping (huge pages asked); None where the kernel cannot
    ``MADV_POPULATE_WRITE``."""
    mm = _anonymous_mapping(size) if _ANONYMOUS else None
    if mm is None:
        return None
    try:  # probe: the kernel populates (Linux >= 5.14); else alloc_buffer's MAP_POPULATE path
        mm.madvise(_MADV_POPULATE_WRITE, 0, min(PAGE, size))
    except (OSError, ValueError, AttributeError):
        mm.close()
        return None
    return mm


def populate_pages(arr: np.ndarray) -> None:
    """Populate the pages under ``arr`` (a view into an anonymous mapping) in one call before a read lands in them
    (faulting them in during the read slowed remote restores). Best effort."""
    addr, n = arr.ctypes.data, arr.nbytes
    base = addr // PAGE * PAGE
    if n <= 0 or _libc is None:
        return
    _libc.madvise(ctypes.c_void_p(base), ctypes.c_size_t(addr + n - base), _MADV_POPULATE_WRITE)


def _load_libc() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_libc = _load_libc()


class Arena:
    """One reusable, page-aligned (``O_DIRECT``) host buffer holding a checkpoint's file image.

    :meth:`start` maps it unpopulated; :meth:`populate_next` populates it a chunk at a time from any number of threads
    (a background one at low priority); :meth:`finish` lets the thread that needs the buffer populate the rest at its
    own priority rather than wait for a background thread a loaded host may starve."""

    def __init__(self) -> None:
        self.buf: Optional[np.ndarray] = None
        self._lock = threading.Lock()
        self._mm: Optional[mmap.mmap] = None  # the mapping being populated
        self._next = 0  # the offset of the first chunk not claimed yet
        self._end = 0  # the end of the mapping being populated (0: none)
        self._busy = 0  # chunks being populated now

    @staticmethod
    def padded(size: int) -> int:
        return max(HUGE_PAGE, (size + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE)  # whole huge pages

    def start(self, size: int) -> bool:
        """Map a buffer for ``size`` bytes unless there is one already; False where the kernel cannot populate it
        (:meth:`ensure` then allocates it whole)."""
        padded = self.padded(size)
        with self._lock:
            if self.buf is not None and self.buf.nbytes >= padded:
                return True
            self._mm, self._next, self._end = None, 0, 0
            self.buf = None  # release the old mapping first
            mm = _map_unpopulated(padded)
            if mm is None:
                return False
            self.buf = np.frombuffer(mm, dtype=np.uint8)  # the array keeps the mapping alive
            self._mm, self._next, self._end = mm, 0, padded
            return True

    def populate_next(self, chunk: int = _BACKGROUND_CHUNK) -> bool:
        """Populate the next unclaimed chunk of the mapping being populated; False when none is left."""
        with self._lock:
            mm, off = self._mm, self._next
            if mm is None or off >= self._end:
                return False
            n = min(chunk, self._end - off)
            self._next = off + n
            self._busy += 1
        try:
            mm.madvise(_MADV_POPULATE_WRITE, off, n)
        except (OSError, ValueError):  # unmapped meanwhile (released), or no memory: the copy faults it in
            return False
        finally:
            with self._lock:
                self._busy -= 1
        return True

    @property
    def populating(self) -> bool:
        """Whether part of the mapping is not populated yet (unclaimed, or being populated now)."""
        with self._lock:
            return self._mm is not None and (self._next < self._end or self._busy > 0)

    @property
    def unclaimed(self) -> int:
        """Bytes of the mapping that no thread has begun to populate yet."""
        with self._lock:
            return self._end - self._next if self._mm is not None else 0

    def finish(self, threads: int = 2) -> None:
        """Populate what no thread claimed yet, on this thread and ``threads - 1`` helpers. A chunk still being
        populated is not waited for (a copy into it faults its pages in, safely)."""
        if self.unclaimed <= 0:
            return
        run_parallel(lambda _: self._drain(), list(range(threads)), threads)

    def _drain(self) -> None:
        while self.populate_next(_POPULATE_CHUNK):
            pass

    def cancel(self) -> None:
        """Stop the population under way (what is left is faulted in by the first copy)."""
        with self._lock:
            self._next = self._end

    def ensure(self, size: int) -> np.ndarray:
        padded = self.padded(size)
        if self.buf is None or self.buf.nbytes < padded:
            self.release()  # first (a population under way ends: its thread lets go of the old mapping)
            self.buf = alloc_buffer(padded)
        return self.buf

    def release(self) -> None:
        """Unmap the buffer now (views into it must be gone), not whenever the cyclic GC runs."""
        with self._lock:
            self._mm, self._next, self._end = None, 0, 0
        self.buf = None

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.nbytes


def run_parallel(fn: Callable[[J], Any], jobs: Sequence[J], threads: int = 2) -> None:
    """Run ``fn(job)`` for every job on ``threads`` threads (the jobs release the GIL); the first exception is re-raised
    here, after all threads stopped."""
    if threads <= 1 or len(jobs) <= 1:
        for j in jobs:
            fn(j)
        return
    errors: List[BaseException] = []

    def work(part: Sequence[J]) -> None:
        try:
            for j in part:
                fn(j)
        except BaseException as exc:  # re-raised on the calling thread
            errors.append(exc)

    parts = [jobs[i::threads] for i in range(threads)]
    workers = [threading.Thread(target=work, args=(part,)) for part in parts[1:]]
    for w in workers:
        w.start()
    work(parts[0])
    for w in workers:
        w.join()
    if errors:
        raise errors[0]


def copy_job(job: CopyJob) -> None:
    dst, src = job
    np.copyto(dst, src, casting="no")


def chunked(dst: np.ndarray, src: np.ndarray, jobs: List[CopyJob]) -> None:
    """Append copy jobs of at most ``_COPY_CHUNK`` bytes that copy ``src`` into ``dst`` (same size)."""
    d = dst.reshape(-1).view(np.uint8)
    s = src.reshape(-1).view(np.uint8)
    for i in range(0, d.nbytes, _COPY_CHUNK):
        jobs.append((d[i:i + _COPY_CHUNK], s[i:i + _COPY_CHUNK]))
