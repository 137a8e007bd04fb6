"""The stager: the one seam every copy between a scope's tensors and checkpoint bytes goes through.

Saves and restores hand their ``(destination, source)`` pairs (and a restore's ``preadv`` reads, as :data:`FillJob` s)
to a :class:`Stager` (modelled on torch DCP's ``AsyncStager``). :class:`HostStager` (a memcpy or read on two threads) is
the only one; a device stager would plug in here, the format and storage untouched."""

from __future__ import annotations

from typing import Callable, List, Protocol, Sequence, Tuple

import numpy as np

from paddle_acp.format.engine.arena import CopyJob, chunked, copy_job, run_parallel

__all__ = ["HOST", "FillJob", "HostStager", "Stager"]

_FILL_CHUNK = 32 << 20

# A destination (a tensor's bytes, uint8) and ``read(buf, pos)``, which fills host buffer ``buf`` with the
# source's bytes from ``pos`` (relative to the destination's first byte) on.
FillJob = Tuple[np.ndarray, Callable[[np.ndarray, int], None]]


class Stager(Protocol):
    """Copies each ``(destination, source)`` pair of the same byte size; returns when every copy is done."""

    def stage(self, pairs: Sequence[CopyJob]) -> None: ...

    def fill(self, jobs: Sequence[FillJob]) -> None:
        """Fill each job's destination through its read call; returns when every read is done."""
        ...


class HostStager:
    """Host memory to host memory: each pair split into 32 MB copies run on ``threads`` threads (NumPy releases the GIL
    while it copies)."""

    def __init__(self, threads: int = 2) -> None:
        self.threads = threads

    def stage(self, pairs: Sequence[CopyJob]) -> None:
        jobs: List[CopyJob] = []
        for dst, src in pairs:
            if dst.nbytes:
                chunked(dst, src, jobs)
        run_parallel(copy_job, jobs, self.threads)

    def fill(self, jobs: Sequence[FillJob]) -> None:
        reads: List[Tuple[np.ndarray, Callable[[np.ndarray, int], None], int]] = []
        for dst, read in jobs:
            flat = dst.reshape(-1).view(np.uint8)
            for i in range(0, flat.nbytes, _FILL_CHUNK):
                reads.append((flat[i:i + _FILL_CHUNK], read, i))
        run_parallel(lambda r: r[1](r[0], r[2]), reads, self.threads)


HOST = HostStager()  # what the format's functions use when their caller names no stager
