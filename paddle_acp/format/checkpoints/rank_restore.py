"""One rank's restore of a checkpoint of several ranks (the layout and the protocol: :mod:`.multirank`).

Every rank judges the global manifest and its marks alike (:class:`.global_reader.GlobalReader`), then loads only
the parts it uses (its own; replicated: rank 0's part, or every share, :mod:`~paddle_acp.format.engine.shares`),
each checked against the global record: the same storage calls at any world size. A part only this rank reads and
finds bad is marked and stops the job (:mod:`~paddle_acp.format.commit.verdict`), never a fallback of one rank alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, Optional

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, UnknownFormatError
from paddle_acp.format.checkpoints.global_reader import GlobalReader
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.commit import verdict
from paddle_acp.format.engine import shares
from paddle_acp.format.engine.reader import Landing, LoadedCheckpoint
from paddle_acp.format.global_manifest import GlobalManifest, describe_topology
from paddle_acp.format.layout import rank_part
from paddle_acp.format.manifest import Manifest

if TYPE_CHECKING:
    from paddle_acp.format.checkpoints.cache import RangeCache

logger = logging.getLogger("paddle_acp")


class RankRestore(GlobalReader):
    """This rank's restore of one range's checkpoints of several ranks (module docstring)."""

    rank: int
    world_size: int
    base: Optional[str]  # the global checkpoint this incarnation resumed from
    base_crc: Optional[int]  # the CRC32 of its global.json (the copy resumed from)
    cache: Optional["RangeCache"]  # this rank's node-local copies
    landing: Optional[Landing]  # where this rank's own part lands at a restore (its snapshot arena)
    _parts: PartReader  # reads the ranks' parts

    @property
    def memory_budget(self) -> Optional[int]:
        """The host-memory budget of this rank's restores (``PADDLE_ACP_HOST_MEMORY``)."""
        return self._parts.memory_budget

    def topology_error(self, g: GlobalManifest, running_mode: str, why: str) -> CheckpointError:
        return CheckpointError(
            f"rank {self.rank}: checkpoint {g.name} of range {self.range_name} (job {self.job_id}) was written by a job of "
            f"{g.topology()}, but this job runs with {describe_topology(self.world_size, running_mode)}: {why}. "
            "A per-rank checkpoint restores only at the world size that wrote it. Restart with "
            f"PADDLE_TRAINERS_NUM={g.world_size}, or start a new job (a new PADDLE_JOB_ID) to train from scratch."
        )

    def load(self, name: str, running_mode: Optional[str], listed_only: bool = False) -> LoadedCheckpoint:
        """Verify checkpoint ``name`` and load this rank's share of it (``running_mode``: 'per-rank', 'replicated', or
        None: decided when programs register; ``listed_only``: see :meth:`read_global`). Raises CorruptCheckpointError
        for what every rank reads alike (all fall back), RestartRequiredError when a part only this rank loads is bad
        (the copy is marked), or CheckpointError (topology, moved parts: never a partial restore)."""
        base = f"{self.dir}/{name}"
        g = self.read_global(name, listed_only)  # the global manifest and its marks: every rank reads them alike
        verdict.check_marks(self.storage, base, g)
        own = self.rank if self.rank < g.world_size else None
        if g.mode == "per-rank":
            if g.world_size != self.world_size:
                raise self.topology_error(g, running_mode or "per-rank", "every rank's state is its own")
            src = self.rank
        else:
            if running_mode == "per-rank" and self.world_size > 1:
                raise self.topology_error(g, "per-rank", "a replicated checkpoint holds only rank 0's tensors")
            src = 0
            if g.world_size != self.world_size and g.step is not None:
                raise self.topology_error(g, running_mode or "replicated",
                                          "it was taken in the middle of an epoch, and the ranks' loader positions do not "
                                          "carry over to another world size")
        # only the parts this rank loads (its own: RNG, loader; the one(s) whose tensors it takes)
        loads = set(range(g.share_writers)) if g.writers == shares.WRITERS_ALL else {src}
        raws = {k: self._own_verdict(name, g, k) for k in sorted(loads | ({own} if own is not None else set()))}
        if g.writers == shares.WRITERS_ALL:  # the shares this rank reads are one state
            try:
                self.check_shares(name, g, raws)
            except CorruptCheckpointError as exc:
                if self.world_size > 1:
                    raise verdict.rejected(self.rank, base, g, "the shares", exc, self.storage) from exc
                raise
        own_m = Manifest.loads(raws[own]) if own is not None else Manifest.loads(raws[0])
        if own is None:
            logger.warning("rank %d has no part in checkpoint %s (world size %d): it takes rank 0's RNG state",
                           self.rank, name, g.world_size)
        if g.writers == shares.WRITERS_ALL:  # every share of the replicated tensors, read in parallel
            loaded = self._load_shares(g, base, raws, own)
        else:
            loaded = self._load_part(g, base, raws, src)
        return loaded.of_global(base, g, own_m)

    def _whose(self, rank: int) -> str:
        return "its part" if rank == self.rank else f"rank {rank}'s data"

    def _own_verdict(self, name: str, g: GlobalManifest, rank: int) -> bytes:
        """Part ``rank``'s manifest bytes (:meth:`check_part_record`), judged by this rank alone: with several ranks
        a bad part is marked and stops it (RestartRequiredError), a newer-format one stops it (CheckpointError)."""
        try:
            return self.check_part_record(name, g, rank, data=False)
        except UnknownFormatError as exc:
            if self.world_size > 1:
                raise CheckpointError(
                    f"rank {self.rank}: {self._whose(rank)} of checkpoint {self.dir}/{name} is of a newer format ({exc}), "
                    "while its global manifest is not: the other ranks do not read this part and would resume from it. "
                    "Resume with the paddle-acp that wrote it, or remove the checkpoint to resume from the previous one."
                ) from exc
            raise
        except CorruptCheckpointError as exc:
            if self.world_size > 1:
                raise verdict.rejected(self.rank, f"{self.dir}/{name}", g, self._whose(rank), exc, self.storage) from exc
            raise

    def _load_part(self, g: GlobalManifest, base: str, raws: Dict[int, bytes], src: int) -> LoadedCheckpoint:
        """Rank ``src``'s part, verified (the local copy if it holds these bytes); this rank's lands in ``landing``."""
        own = self.landing if src == self.rank else None
        cached = self.cache.load(g.name, g.number, raws[src], src, self.memory_budget, own) if self.cache is not None else None
        try:
            return cached if cached is not None else self._parts.load(g.number, f"{base}/{rank_part(src)}", raws[src], own)
        except CorruptCheckpointError as exc:
            if self.world_size > 1:  # other ranks may accept it (their own part, another copy): never fall back alone
                raise verdict.rejected(self.rank, base, g, self._whose(src), exc, self.storage) from exc
            raise

    def _load_shares(self, g: GlobalManifest, base: str, raws: Dict[int, bytes], own: Optional[int]) -> LoadedCheckpoint:
        """A spread checkpoint: every share writer's share (ranks < ``g.share_writers``), verified in parallel and
        joined (:mod:`.shares`); a bad share goes through the bad mark like a bad own part."""
        try:
            parts = shares.load_all(lambda k: self._load_part(g, base, raws, k) if k == self.rank
                                    else self._parts.load(g.number, f"{base}/{rank_part(k)}", raws[k]),
                                    list(range(g.share_writers)))
        except shares.ShareFailed as failed:
            exc = failed.error
            if isinstance(exc, CorruptCheckpointError) and self.world_size > 1 and failed.rank != self.rank:
                raise verdict.rejected(self.rank, base, g, f"rank {failed.rank}'s share", exc, self.storage) from exc
            raise exc from None
        return shares.merge(parts, own if own in parts else 0, base)  # RNG and extra: ``own``'s (load_global)

    def resume_from(self, loaded: Optional[LoadedCheckpoint]) -> None:
        """This incarnation resumes from ``loaded`` (None: from scratch): its parts are tagged with
        it, and its marks are checked at the first save and before every commit."""
        self.base = loaded.name if loaded is not None else None
        g = loaded.global_manifest if loaded is not None else None
        self.base_crc = g.crc32 if g is not None and g.name == self.base else None

    def check_base(self) -> None:
        """RestartRequiredError when a rank marked the copy this incarnation resumed from bad (one rank: no other
        rank reads it, and its own restore read the marks)."""
        if self.base is None or self.base_crc is None or self.world_size == 1:
            return
        ckdir = f"{self.dir}/{self.base}"
        ranks = verdict.marks(self.storage, ckdir, self.base_crc)
        if ranks:
            raise verdict.base_condemned(self.rank, ckdir, ranks, self.storage, self.base_crc)

