"""Reading the committed checkpoints of several ranks: the global manifest, each part's record, the marks.

What every rank's restore and the operator tools read alike (nothing written); the layout and the protocol are in
:mod:`.multirank`.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Dict, Optional, Tuple

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.commit import verdict
from paddle_acp.format.engine import reader, shares
from paddle_acp.format.global_manifest import MAX_GLOBAL_SIZE, GlobalManifest
from paddle_acp.format.layout import (
    DATA_NAME,
    GLOBAL_NAME,
    MANIFEST_NAME,
    position_key,
    position_number,
    range_dir,
    rank_part,
)
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Storage


@dataclasses.dataclass(frozen=True)
class GlobalEntry:
    name: str
    epoch_no: int
    step: Optional[int]
    committed: bool

    @property
    def key(self) -> Tuple[int, int]:
        return position_key(self.epoch_no, self.step)


class GlobalReader:
    """Reads the committed checkpoints of several ranks of one range (no rank, no topology, nothing written)."""

    def __init__(self, storage: Storage, job_id: str, range_name: str) -> None:
        self.storage = storage
        self.job_id = job_id
        self.range_name = range_name
        self.dir = range_dir(job_id, range_name)

    def part_dir(self, name: str, rank: int) -> str:
        return f"{self.dir}/{name}/{rank_part(rank)}"

    def read_global(self, name: str, listed_only: bool = False) -> GlobalManifest:
        """The global manifest of ``name``; when it is missing: CorruptCheckpointError, or with
        ``listed_only`` (the checkpoint was listed without a look inside) :class:`index.NotCommitted`."""
        path = f"{self.dir}/{name}/{GLOBAL_NAME}"
        try:
            raw = self.storage.read_bytes(path, limit=MAX_GLOBAL_SIZE)
        except FileNotFoundError:
            if listed_only:
                raise index.NotCommitted(path) from None
            raise CorruptCheckpointError(f"{path} is missing (checkpoint not committed)") from None
        g = GlobalManifest.loads(raw)
        if g.name != name or g.range_name != self.range_name:
            raise CorruptCheckpointError(f"{path}: global manifest belongs to {g.range_name}/{g.name}")
        return g

    def check_global(self, name: str) -> Tuple[GlobalManifest, Dict[int, bytes]]:
        """The global manifest and every part's manifest bytes, each checked (:meth:`check_part_record`), with no
        mark on this copy. O(W) storage calls: the tools' check (a restore reads only its parts)."""
        g = self.read_global(name)
        verdict.check_marks(self.storage, f"{self.dir}/{name}", g)
        raws = {p.rank: self.check_part_record(name, g, p.rank) for p in g.parts}
        self.check_shares(name, g, raws)
        return g, raws

    def check_shares(self, name: str, g: GlobalManifest, raws: Dict[int, bytes]) -> None:
        """A spread checkpoint (:mod:`.shares`): the parts in ``raws`` (every part, or at least the share
        writers' ones a restore reads) are one state, as the global manifest records. CorruptCheckpointError."""
        if g.writers != shares.WRITERS_ALL:
            return
        where = f"{self.dir}/{name}/{GLOBAL_NAME}"
        share = shares.check_cover({k: Manifest.loads(r) for k, r in raws.items()}, where,
                                   complete=len(raws) == g.world_size)
        if share["share_writers"] != g.share_writers:
            raise CorruptCheckpointError(f"{where} records {g.share_writers} share writers, its parts "
                                         f"{share['share_writers']}")

    def check_part_record(self, name: str, g: GlobalManifest, rank: int, data: bool = True) -> bytes:
        """Part ``rank``'s manifest bytes, checked against the global manifest's record (CRC32, size, position,
        range, data size; identity: :func:`verdict.check_part`, CheckpointError), with ``data`` the data file's
        size too. CorruptCheckpointError otherwise (UnknownFormatError: newer format)."""
        p = g.parts[rank]
        pdir = self.part_dir(name, rank)
        path = f"{pdir}/{MANIFEST_NAME}"
        try:
            raw = self.storage.read_bytes(path, limit=p.manifest_size)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{path} is missing") from None
        if len(raw) != p.manifest_size or zlib.crc32(raw) & 0xFFFFFFFF != p.manifest_crc32:
            raise CorruptCheckpointError(f"{path} does not match the checksum the global manifest records")
        m = Manifest.loads(raw)
        if m.number != g.number or m.range.name != self.range_name or m.data_size != p.data_size:
            raise CorruptCheckpointError(f"{path}: part manifest does not match the global manifest")
        if position_number(m.range.epoch_no, m.range.step) != g.number:  # (a restart resumes from the range's)
            raise CorruptCheckpointError(f"{path}: its range's epoch {m.range.epoch_no} and step {m.range.step} are "
                                         f"not the checkpoint's position {name}")
        verdict.check_part(f"{self.dir}/{name}", g, rank, m)
        part = m.extra.get("part") if isinstance(m.extra, dict) else None
        if isinstance(part, dict) and part.get("base") != g.base:  # (the commit refuses such a part: crafted)
            raise CorruptCheckpointError(f"{path}: written by a run resumed from {part.get('base')!r}, but the global "
                                         f"manifest's run resumed from {g.base!r}: parts of two runs")
        if g.writers != shares.WRITERS_ALL and shares.part_share(m) is not None:  # whole tensors only
            raise CorruptCheckpointError(f"{path} holds a share of the replicated tensors, but {GLOBAL_NAME} "
                                         "records one writer of them")
        if data:
            size = reader.file_size(self.storage, f"{pdir}/{DATA_NAME}", DATA_NAME)  # (a link or a directory: refused)
            if size is None:
                raise CorruptCheckpointError(f"{pdir}/{DATA_NAME} is missing")
            if size != p.data_size:
                raise CorruptCheckpointError(f"{pdir}/{DATA_NAME} has {size} bytes, expected {p.data_size}")
        return raw

    def verify(self, name: str, progress: Optional[reader.Progress] = None) -> GlobalManifest:
        """Check checkpoint ``name`` completely: the global manifest, every part's manifest and
        every part's checksums (:func:`reader.verify`, constant memory). CorruptCheckpointError."""
        g, raws = self.check_global(name)
        for rank in sorted(raws):
            reader.verify(self.storage, self.part_dir(name, rank), g.number, self.range_name, raws[rank], progress)
        return g
