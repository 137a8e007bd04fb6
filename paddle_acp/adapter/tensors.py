"""Snapshot: copy a program's state out of a Paddle scope into host buffers, and back.

Buffers are reused from save to save (one pool per program), so after the
first save a snapshot costs a memcpy per tensor and no allocations.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from paddle_acp.errors import CheckpointError
from paddle_acp.format.manifest import DTYPES

logger = logging.getLogger("paddle_acp")


@dataclasses.dataclass
class TensorData:
    name: str
    dtype: str  # a key of manifest.DTYPES
    array: np.ndarray  # C-contiguous, storage dtype
    offset: int = -1  # position in tensors.bin, set by layout()


@dataclasses.dataclass
class ProgramSnapshot:
    key: str
    label: str
    tensors: List[TensorData]
    lr_scheduler: Optional[Dict[str, Any]] = None


def dtype_name(tensor) -> str:
    name = str(tensor._dtype())
    name = name.split(".")[-1].lower()
    if name not in DTYPES:
        raise CheckpointError(f"tensor dtype {tensor._dtype()} is not supported by paddle-acp")
    return name


def tensor_view(tensor) -> Tuple[str, np.ndarray]:
    """A zero-copy NumPy view over a CPU tensor (a copy for other places).

    The view is valid only until Paddle touches the tensor again: copy it out
    before returning control to the training loop.
    """
    dt = dtype_name(tensor)
    shape = tuple(tensor.shape())
    npdt = DTYPES[dt]
    place = tensor._place()
    numel = int(np.prod(shape)) if shape else 1
    if place.is_cpu_place() and numel > 0:
        nbytes = numel * npdt.itemsize
        raw = (ctypes.c_char * nbytes).from_address(tensor._ptr())
        return dt, np.frombuffer(raw, dtype=npdt).reshape(shape)
    arr = np.array(tensor)
    if dt == "bfloat16":
        arr = arr.view(np.uint16)
    return dt, np.ascontiguousarray(arr.reshape(shape))


PAGE = 4096
HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KB base pages) transparent huge page size


_MADV_POPULATE_WRITE = getattr(__import__("mmap"), "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
_POPULATE_CHUNK = 32 << 20


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
    import mmap

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

    def __init__(self):
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


def layout(programs: List[ProgramSnapshot]) -> int:
    """Assign each tensor its (aligned) offset in the data file; returns the file size."""
    from paddle_acp.format.manifest import align

    offset = 0
    for p in programs:
        for t in p.tensors:
            t.offset = offset
            offset += align(t.array.nbytes)
    return offset


_COPY_CHUNK = 32 << 20


def run_parallel(fn, jobs, threads: int = 2) -> None:
    """Run ``fn(job)`` for every job on ``threads`` threads (the jobs release the GIL).

    The first exception raised by any job is re-raised here, after all threads stopped.
    """
    if threads <= 1 or len(jobs) <= 1:
        for j in jobs:
            fn(j)
        return
    import threading

    errors = []

    def work(part):
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


def copy_job(job) -> None:
    dst, src = job
    np.copyto(dst, src, casting="no")


def chunked(dst: np.ndarray, src: np.ndarray, jobs: list) -> None:
    """Append copy jobs of at most ``_COPY_CHUNK`` bytes that copy ``src`` into ``dst`` (same size)."""
    d = dst.reshape(-1).view(np.uint8)
    s = src.reshape(-1).view(np.uint8)
    for i in range(0, d.nbytes, _COPY_CHUNK):
        jobs.append((d[i:i + _COPY_CHUNK], s[i:i + _COPY_CHUNK]))


def copy_into(programs: List[ProgramSnapshot], image: np.ndarray, threads: int = 2) -> None:
    """Copy laid-out tensors into ``image`` (the file's bytes) and point them at their copies.

    Large tensors are split into chunks copied by ``threads`` threads (NumPy
    releases the GIL while copying): the copy is the whole training stall.
    """
    end = 0
    jobs: list = []
    for p in programs:
        for t in p.tensors:
            if t.offset > end:
                image[end:t.offset] = 0  # padding: keep the file deterministic
            n = t.array.nbytes
            dst = image[t.offset:t.offset + n]
            if n:
                chunked(dst, t.array, jobs)
            t.array = dst.view(t.array.dtype).reshape(t.array.shape)
            end = t.offset + n
    run_parallel(copy_job, jobs, threads)


def find_tensor(scope, name: str):
    var = scope.find_var(name)
    if var is None:
        return None
    try:
        t = var.get_tensor()
    except Exception:  # not a dense tensor (reader, raw, ...)
        return None
    if not t._is_initialized():
        return None
    return t


def tensor_views(scope, names) -> List[TensorData]:
    """Zero-copy views of the named, initialized tensors (valid until Paddle runs again)."""
    out = []
    for name in names:
        t = find_tensor(scope, name)
        if t is None:
            continue
        dt, view = tensor_view(t)
        out.append(TensorData(name, dt, view))
    return out


def inplace_view(tensor, dtype: str, shape) -> Optional[np.ndarray]:
    """A writable view of ``tensor`` when it already holds ``dtype``/``shape`` on the CPU, else None."""
    if not tensor._is_initialized() or not tensor._place().is_cpu_place():
        return None
    try:
        cur_dt, view = tensor_view(tensor)
    except CheckpointError:
        return None
    if cur_dt != dtype or view.shape != tuple(shape) or view.size == 0:
        return None
    return view


def scope_tensor(scope, name: str):
    var = scope.find_var(name)
    if var is None:
        var = scope.var(name)
    return var.get_tensor()


def own_place(tensor, default=None):
    """The concrete place (``tensor.set`` takes no generic ``Place``) ``tensor`` lives on now;
    ``default`` (the CPU if None) for a tensor that holds nothing yet."""
    import paddle

    if not tensor._is_initialized():
        return paddle.CPUPlace() if default is None else default
    p = tensor._place()
    if p.is_gpu_place():
        return paddle.CUDAPlace(p.gpu_device_id())
    if p.is_cuda_pinned_place():
        return paddle.CUDAPinnedPlace()
    if p.is_xpu_place():
        return paddle.XPUPlace(p.xpu_device_id())
    if p.is_custom_place():
        return paddle.CustomPlace(p.custom_device_type(), p.custom_device_id())
    if p.is_ipu_place():
        return paddle.IPUPlace()
    return paddle.CPUPlace()


def set_tensor(tensor, arr: np.ndarray, place, default_place=None) -> None:
    """Replace ``tensor``'s contents with ``arr`` on ``place`` (the executor's); with None, on the
    place the tensor lives on now (``default_place``, else the CPU, for one that holds nothing yet)."""
    if place is None:
        place = own_place(tensor, default_place)
    tensor.set(arr, place)
