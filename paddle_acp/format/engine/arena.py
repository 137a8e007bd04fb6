"""Host memory for checkpoints: page-aligned buffers, the reusable arena, parallel copies.

Buffers are reused from save to save (one arena per range), so after the
first save a snapshot costs a memcpy per tensor and no allocations.
"""

from __future__ import annotations

import mmap
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

PAGE = 4096
HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KB base pages) transparent huge page size

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
_POPULATE_CHUNK = 32 << 20
_COPY_CHUNK = 32 << 20

J = TypeVar("J")
CopyJob = Tuple[np.ndarray, np.ndarray]  # (destination, source) of the same size


def alloc_buffer(size: int) -> np.ndarray:
    """A page-aligned uint8 buffer whose pages are populated by the kernel in bulk.

    Faulting in fresh memory page by page costs ~2 s per GB on this machine
    kind; populating it in the kernel ~0.3 s. It is populated 32 MB at a time
    (``MADV_POPULATE_WRITE``) so that the training thread's own mmap/munmap
    calls, which need the same address-space lock, are never held up for long
    while this runs in the background; older kernels get ``MAP_POPULATE``.

    The buffer asks for transparent huge pages (``MADV_HUGEPAGE``; 2 MB pages
    where the kernel grants them). On this project's VMs (free page reporting
    to the host) a resident 1.2 GB buffer of 4 KB pages kept the kernel
    reporting Paddle's freed step memory to the host, which Paddle then faulted
    back in: training steps ran 2-20% slower for as long as the buffer lived.
    With huge pages nothing was reported and steps ran at their normal speed.
    """
    if size <= 0:
        return np.empty(0, dtype=np.uint8)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    try:
        mm = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
    except (OSError, ValueError, TypeError):
        return np.empty(size, dtype=np.uint8)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)  # see the docstring
    except (OSError, ValueError, AttributeError):  # no transparent huge pages here
        pass
    try:
        for off in range(0, size, _POPULATE_CHUNK):
            mm.madvise(_MADV_POPULATE_WRITE, off, min(_POPULATE_CHUNK, size - off))
    except (OSError, ValueError, AttributeError):
        mm.close()
        try:
            mm = mmap.mmap(-1, size, flags=flags | getattr(mmap, "MAP_POPULATE", 0))
        except (OSError, ValueError, TypeError):
            return np.empty(size, dtype=np.uint8)
    return np.frombuffer(mm, dtype=np.uint8)  # the array keeps the mapping alive


class Arena:
    """One reusable, page-aligned host buffer holding a checkpoint's file image.

    Reused from save to save (so its pages are faulted in once), and aligned
    for ``O_DIRECT`` writes.
    """

    def __init__(self) -> None:
        self.buf: Optional[np.ndarray] = None

    def ensure(self, size: int) -> np.ndarray:
        padded = max(HUGE_PAGE, (size + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE)  # whole huge pages
        if self.buf is None or self.buf.nbytes < padded:
            self.buf = None  # release the old mapping first
            self.buf = alloc_buffer(padded)
        return self.buf

    def release(self) -> None:
        """Unmap the buffer now (views into it must be gone), not whenever the cyclic GC runs."""
        self.buf = None

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.nbytes


def run_parallel(fn: Callable[[J], Any], jobs: Sequence[J], threads: int = 2) -> None:
    """Run ``fn(job)`` for every job on ``threads`` threads (the jobs release the GIL).

    The first exception raised by any job is re-raised here, after all threads stopped.
    """
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
