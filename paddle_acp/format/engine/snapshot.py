"""Snapshot types: a checkpoint's content, already copied out of Paddle, and its data file's layout.

:func:`copy_into` copies laid-out tensors into the file's image (an :class:`~.arena.Arena`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from paddle_acp.format.engine.stager import HOST, Stager
from paddle_acp.format.manifest import ALIGN, RangeRecord, align

if TYPE_CHECKING:
    from paddle_acp.format.engine.stream import ChunkStream

_ZEROS = bytes(ALIGN)


@dataclasses.dataclass
class TensorData:
    name: str
    dtype: str  # a key of manifest.DTYPES
    array: np.ndarray  # C-contiguous, storage dtype (a piece: its raw bytes, uint8)
    offset: int = -1  # position in tensors.bin, set by layout()
    piece: Optional[Tuple[int, int]] = None  # spread writes: ``array`` is bytes [start, stop) of the tensor
    shape: Optional[Tuple[int, ...]] = None  # the whole tensor's (a piece); None: ``array.shape``

    def cut(self, start: int, stop: int) -> "TensorData":
        """Bytes [start, stop) of this whole tensor (a view: nothing is copied)."""
        if self.piece is not None or not 0 <= start < stop <= self.array.nbytes:
            raise ValueError(f"bytes [{start}, {stop}) of tensor {self.name!r} ({self.array.nbytes} bytes)")
        flat = np.ascontiguousarray(self.array).reshape(-1).view(np.uint8)
        return TensorData(self.name, self.dtype, flat[start:stop], piece=(start, stop),
                          shape=tuple(int(x) for x in self.array.shape))

    def record_shape(self) -> List[int]:
        """The shape its manifest record carries: the whole tensor's."""
        return list(self.shape if self.shape is not None else self.array.shape)


@dataclasses.dataclass
class ProgramSnapshot:
    key: str
    label: str
    tensors: List[TensorData]
    lr_scheduler: Optional[Dict[str, Any]] = None


def layout(programs: Iterable[ProgramSnapshot]) -> int:
    """Assign each tensor its (aligned) offset in the data file; returns the file size."""
    offset = 0
    for p in programs:
        for t in p.tensors:
            t.offset = offset
            offset += align(t.array.nbytes)
    return offset


@dataclasses.dataclass(frozen=True, eq=False)
class Snapshot:
    """Everything one checkpoint holds and how its bytes are laid out, nothing about the save that takes it (that
    travels beside it, ``runtime.saver.SaveTicket``). Frozen: the writer returns what it wrote."""

    range: RangeRecord  # the manifest's training position
    programs: List[ProgramSnapshot]  # the tensors and LR schedulers (their offsets: the layout)
    rng: Optional[Dict[str, Any]]  # the RNG states
    paddle_version: str = ""
    ir: str = ""
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)  # loader state, objects, ... (manifest ``extra``)
    image: Optional[np.ndarray] = None  # the file's bytes, tensors laid out (None: the tensors' arrays, or ``stream``)
    data_size: int = -1  # the data file's size (layout: format/layout.py); -1: laid out when the snapshot is made
    mode: Optional[str] = None  # several ranks: what this part holds, "replicated" or "per-rank" (in its manifest)
    share: Optional[Dict[str, Any]] = None  # spread writes: this part's share record (shares.py), in its manifest
    stream: Optional["ChunkStream"] = None  # over the host-memory budget: the bytes come in chunks (stream.py)

    def __post_init__(self) -> None:
        if self.data_size < 0:  # the tensors' offsets and the file size, decided with the content
            object.__setattr__(self, "data_size", layout(self.programs))

    def buffers(self) -> List[Any]:
        """The data file's bytes as buffers, without ``image``: each tensor at its offset, zeros between (the layout's
        gaps are shorter than ALIGN) and up to ``data_size``."""
        out: List[Any] = []
        end = 0
        for t in (t for p in self.programs for t in p.tensors):
            if t.offset > end:
                out.append(_ZEROS[: t.offset - end])
            if t.array.nbytes:
                out.append(t.array.data.cast("B"))
            end = t.offset + t.array.nbytes
        if self.data_size > end:
            out.append(_ZEROS[: self.data_size - end])
        return out


def copy_into(programs: List[ProgramSnapshot], image: np.ndarray, stager: Stager = HOST) -> None:
    """Copy laid-out tensors into ``image`` (the file's bytes) through ``stager`` and point them at their copies."""
    end = 0
    jobs: List[Tuple[np.ndarray, np.ndarray]] = []
    for p in programs:
        for t in p.tensors:
            if t.offset > end:
                image[end:t.offset] = 0  # padding: keep the file deterministic
            n = t.array.nbytes
            dst = image[t.offset:t.offset + n]
            if n:
                jobs.append((dst, t.array))
            t.array = dst.view(t.array.dtype).reshape(t.array.shape)
            end = t.offset + n
    stager.stage(jobs)
