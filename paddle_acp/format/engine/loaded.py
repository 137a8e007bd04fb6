"""A verified checkpoint in memory or on a local disk, its tensors handed out once each.

What :func:`paddle_acp.format.engine.reader.load` returns: :class:`FileSource` keeps a verified local file open and
reads tensors out of it on demand; :class:`MemorySource` holds the verified image a restore landed in."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Iterator, List, MutableMapping, Optional, Protocol, Sequence, Tuple

import numpy as np

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.engine.arena import CopyJob
from paddle_acp.format.engine.stager import HOST, FillJob, Stager
from paddle_acp.format.manifest import Manifest, TensorRecord

__all__ = ["FileSource", "Key", "Landing", "Lent", "LoadedCheckpoint", "MemorySource", "ReadItem"]

Key = Tuple[str, str]  # (program key, tensor name)
ReadItem = Tuple[str, TensorRecord, np.ndarray]  # (program key, tensor, the array to fill)
# Where a restore lands (the runtime's snapshot arena): given the data file's size, a buffer of at least that
# many bytes and the call that gives it back (once its tensors are all handed out, or the load failed), or None.
Lent = Tuple[np.ndarray, Callable[[], None]]
Landing = Callable[[int], Optional[Lent]]


def _check_fits(view: np.ndarray, rec: TensorRecord) -> None:
    """Tensor ``rec`` fills ``view`` exactly (a piece read into a whole tensor would leave the rest as it was)."""
    if view.nbytes != rec.nbytes:
        raise CorruptCheckpointError(f"tensor {rec.name!r}: the checkpoint holds {rec.nbytes} bytes of it "
                                     f"({'a piece' if rec.piece is not None else 'the whole tensor'}), "
                                     f"not the {view.nbytes} it is read into")


class MemorySource:
    """Verified tensors held in one in-memory image; ``on_close`` gives that buffer back (called once)."""

    def __init__(self, arrays: Dict[Key, np.ndarray], on_close: Optional[Callable[[], None]] = None):
        self._arrays = arrays
        self._on_close = on_close

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        return self._arrays[(key, rec.name)]

    def read_into(self, items: Sequence[ReadItem], stager: Stager = HOST) -> None:
        pairs: List[CopyJob] = []
        for key, rec, view in items:
            _check_fits(view, rec)
            pairs.append((view, self._arrays[(key, rec.name)]))
        stager.stage(pairs)

    def close(self) -> None:
        self._arrays.clear()
        give_back, self._on_close = self._on_close, None
        if give_back is not None:
            give_back()


def pread_into(fd: int, mv: memoryview, offset: int) -> int:
    """Fill ``mv`` from byte ``offset`` of file ``fd``; returns the bytes read (fewer only at the end of the file)."""
    got = 0
    while got < mv.nbytes:
        n = os.preadv(fd, [mv[got:]], offset + got)
        if n <= 0:
            break
        got += n
    return got


class FileSource:
    """Tensors of a verified local data file, read on demand (``preadv``) through an open descriptor: it keeps that very
    file readable even if it is unlinked (retention, ``gc``) before the program first runs."""

    def __init__(self, fd: int, path: str):
        self._fd = fd
        self._path = path

    def _reader(self, offset: int) -> Callable[[np.ndarray, int], None]:
        """The call that fills a host buffer with this file's bytes from ``offset`` + its ``pos`` on."""
        def read(buf: np.ndarray, pos: int) -> None:
            got = pread_into(self._fd, buf.data, offset + pos)
            if got < buf.nbytes:
                raise CorruptCheckpointError(
                    f"{self._path}: the file shrank after it was verified (byte {offset + pos + got})")
        return read

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        shape, dtype = rec.stored()
        arr = np.empty(shape, dtype)
        if rec.nbytes:
            self.read_into([(key, rec, arr)])
        return arr

    def read_into(self, items: Sequence[ReadItem], stager: Stager = HOST) -> None:
        fills: List[FillJob] = []
        for _key, rec, view in items:
            _check_fits(view, rec)
            fills.append((view.reshape(-1).view(np.uint8), self._reader(rec.offset)))
        stager.fill(fills)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class TensorSource(Protocol):
    """What a LoadedCheckpoint reads its verified tensors from (a source above, or ``shares.SharesSource``)."""

    def read(self, key: str, rec: TensorRecord) -> np.ndarray: ...
    def read_into(self, items: Sequence[ReadItem], stager: Stager = HOST) -> None: ...
    def close(self) -> None: ...


class _PendingArrays(MutableMapping[Key, np.ndarray]):
    """``(program key, tensor name) -> array`` over the tensors not yet handed out; reads on access."""

    def __init__(self, loaded: "LoadedCheckpoint"):
        self._loaded = loaded

    def __getitem__(self, k: Key) -> np.ndarray:
        return self._loaded.read(k[0], self._loaded._pending[k])

    def __setitem__(self, k: Key, v: np.ndarray) -> None:
        raise TypeError("the arrays of a loaded checkpoint are read-only")

    def __delitem__(self, k: Key) -> None:
        self._loaded.hand_out(k)  # KeyError when not pending

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._loaded._pending))

    def __len__(self) -> int:
        return len(self._loaded._pending)


class LoadedCheckpoint:
    """A verified checkpoint whose tensors are handed out once each (``arrays``: those not yet handed out, read on
    access); when every tensor has been handed out the data file (or image) is released."""

    def __init__(self, path: str, manifest: Manifest, source: TensorSource):
        self.path = path
        self.manifest = manifest
        self._source = source
        self.name = path.rsplit("/", 1)[-1]  # ckpt-N, or ckpt-eE[-sS] for a global checkpoint
        self.global_manifest: Any = None  # a global_manifest.GlobalManifest for a checkpoint of several ranks
        self.position_key: Optional[Tuple[int, int]] = None
        self.source = "local" if isinstance(source, FileSource) else "remote"  # or "cache": the node-local copy
        self._pending: Dict[Key, TensorRecord] = {
            (p.key, t.name): t for p in manifest.programs for t in p.tensors
        }
        if not self._pending:
            source.close()

    def of_global(self, path: str, global_manifest: Any, own: Manifest) -> "LoadedCheckpoint":
        """This rank's restore of a checkpoint of several ranks at ``path``: its global manifest, and the RNG state and
        extra of this rank's own part's manifest ``own`` (the tensors may come from other parts); itself."""
        self.path = path
        self.name = path.rsplit("/", 1)[-1]
        self.global_manifest = global_manifest
        self.manifest = dataclasses.replace(self.manifest, rng=own.rng, extra=own.extra)
        return self

    def found_as(self, name: str, position_key: Tuple[int, int]) -> "LoadedCheckpoint":
        """Record how the restart's listing names this checkpoint and its restart position; returns itself."""
        self.name = name
        self.position_key = position_key
        return self

    @property
    def arrays(self) -> _PendingArrays:
        return _PendingArrays(self)

    def pending(self, key: str) -> List[TensorRecord]:
        """Program ``key``'s tensors not handed out yet, in manifest order."""
        rec = self.manifest.program(key)
        if rec is None:
            return []
        return [t for t in rec.tensors if (key, t.name) in self._pending]

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        """One verified tensor as a new array (or a view of the verified image)."""
        return self._source.read(key, rec)

    def read_into(self, items: Sequence[ReadItem], stager: Stager = HOST) -> None:
        """Fill each ``(key, record, array)``'s array with the tensor, through ``stager``."""
        self._source.read_into(items, stager)

    def hand_out(self, k: Key) -> None:
        """Tensor ``k`` is handed out: no longer pending (KeyError if it was not)."""
        del self._pending[k]
        if not self._pending:
            self._source.close()

    def close(self) -> None:
        self._pending.clear()
        self._source.close()
