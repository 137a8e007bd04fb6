"""Snapshot types: a checkpoint's content, already copied out of Paddle.

A :class:`Snapshot` is what the writer writes: the range's position, each
program's tensors (host arrays, see :mod:`paddle_acp.adapter.tensors` for how
they are taken out of a scope), the RNG and loader states. :func:`copy_into`
copies laid-out tensors into the file's image (an :class:`~paddle_acp.format.arena.Arena`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import numpy as np

from paddle_acp.format.arena import chunked, copy_job, run_parallel
from paddle_acp.format.manifest import RangeRecord

if TYPE_CHECKING:
    from paddle_acp.format.stream import ChunkStream


@dataclasses.dataclass
class TensorData:
    name: str
    dtype: str  # a key of manifest.DTYPES
    array: np.ndarray  # C-contiguous, storage dtype
    offset: int = -1  # position in tensors.bin, set by layout.layout()


@dataclasses.dataclass
class ProgramSnapshot:
    key: str
    label: str
    tensors: List[TensorData]
    lr_scheduler: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class Snapshot:
    """Everything one checkpoint holds, already copied out of Paddle."""

    range: RangeRecord
    programs: List[ProgramSnapshot]
    rng: Optional[Dict[str, Any]]
    paddle_version: str = ""
    ir: str = ""
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    image: Optional[np.ndarray] = None  # the file's bytes, tensors already laid out in it
    data_size: int = -1  # set by layout()
    mode: Optional[str] = None  # several ranks: "replicated" or "per-rank"
    share: Optional[Dict[str, Any]] = None  # several ranks, spread writes: this part's share record (format/shares.py)
    part_wait: Optional[float] = None  # several ranks: rank 0's wait for the parts (None: the configured timeout)
    stall_seconds: float = 0.0  # training-thread time spent taking the snapshot
    waited_seconds: float = 0.0  # of which waiting for the previous save
    buffer: int = 0  # which of the range's snapshot buffers holds ``image`` (0, or 1 when queued)
    durable: bool = False  # the final save of a range or a preemption save: its metrics are written at once
    queued: bool = False  # it waited in the second buffer behind the previous checkpoint
    skipped_before: int = 0  # saves skipped since the previous one was taken
    manifest: Optional[bytes] = None  # set by the writer: the bytes of the manifest it wrote
    stream: Optional["ChunkStream"] = None  # the state is over the host-memory budget: saved in chunks (format/stream.py)


def copy_into(programs: List[ProgramSnapshot], image: np.ndarray, threads: int = 2) -> None:
    """Copy laid-out tensors into ``image`` (the file's bytes) and point them at their copies.

    Large tensors are split into chunks copied by ``threads`` threads (NumPy
    releases the GIL while copying): the copy is the whole training stall.
    """
    end = 0
    jobs: List[Tuple[np.ndarray, np.ndarray]] = []
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
