"""Rank 0's global commit: wait for every rank's part of a position, check each, write ``global.json``.

A part counts when its manifest is valid, names its rank and the checkpoint this
incarnation resumed from, and was written by the newest generation of its rank
(:mod:`~paddle_acp.format.fencing`): a part of a superseded process never enters a
global checkpoint. The wait is bounded (``PADDLE_ACP_PART_TIMEOUT``); a missing part
abandons the checkpoint. Mixed into :class:`~paddle_acp.format.multirank.GlobalCheckpointer`.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format import shares, verdict
from paddle_acp.format.atomic import CommitStrategy
from paddle_acp.format.fencing import Fence, newest_generation
from paddle_acp.format.global_manifest import GlobalManifest, PartRecord
from paddle_acp.format.layout import GLOBAL_NAME, MANIFEST_NAME, parse_name, position_key
from paddle_acp.format.manifest import MAX_MANIFEST_SIZE, Manifest
from paddle_acp.format.snapshot import Snapshot
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")


class PartCommitMixin:
    """Rank 0's side of a checkpoint of several ranks (see the module docstring)."""

    storage: Storage
    job_id: str
    range_name: str
    world_size: int
    dir: str
    base: Optional[str]
    fence: Optional[Fence]
    commit_strategy: CommitStrategy
    poll_interval: float
    part_timeout: float

    def part_dir(self, name: str, rank: int) -> str:
        raise NotImplementedError

    def part_committed(self, name: str, rank: int) -> bool:
        raise NotImplementedError

    def scan(self) -> List[Any]:
        raise NotImplementedError

    def check_base(self) -> None:
        raise NotImplementedError

    def _read_part(self, name: str, rank: int) -> Optional[Tuple[bytes, Manifest]]:
        """The committed part of ``rank`` at ``name`` when it belongs to this incarnation."""
        path = f"{self.part_dir(name, rank)}/{MANIFEST_NAME}"
        try:
            raw = self.storage.read_bytes(path, limit=MAX_MANIFEST_SIZE)
        except FileNotFoundError:
            return None
        try:
            m = Manifest.loads(raw)
        except CorruptCheckpointError as exc:
            if self.commit_strategy.in_place:
                return None  # written in place (S3): possibly still being written
            logger.warning("part of rank %d of checkpoint %s is invalid: %s", rank, name, exc)
            return None
        part = m.extra.get("part") if isinstance(m.extra, dict) else None
        if not isinstance(part, dict) or part.get("rank") != rank or part.get("base") != self.base:
            return None  # a leftover of an earlier incarnation: that rank replaces it
        return raw, m

    def _superseded(self, name: str, rank: int, m: Manifest) -> bool:
        """The part's writer is not the newest incarnation of its rank (one listing of that rank's
        generation records): a part written by a superseded process never enters a global checkpoint.
        FencedError when this rank 0 itself is superseded."""
        part = m.extra.get("part") if isinstance(m.extra, dict) else None
        gen = part.get("generation", -1) if isinstance(part, dict) else None  # -1: written without a fence
        if isinstance(gen, bool) or not isinstance(gen, int):
            gen = None
        newest = newest_generation(self.storage, self.job_id, rank)
        if self.fence is not None and rank == self.fence.rank and newest > self.fence.generation:
            self.fence.check(f"commit checkpoint {name}")  # raises: this writer is superseded
        if gen is not None and gen >= newest:
            return False
        logger.warning("range %s: the part of rank %d of checkpoint %s was written by generation %s of that rank, "
                       "whose newest generation is %d: a superseded process wrote it; it is not committed (waiting "
                       "for the live rank's part)", self.range_name, rank, name, gen, newest)
        return True

    def _later_part_exists(self, name: str, rank: int) -> bool:
        pos = parse_name(name)
        if pos is None:
            return False
        key = position_key(*pos)
        for g in self.scan():
            if g.key > key and self.part_committed(g.name, rank):
                return True
        return False

    def _commit(self, name: str, snap: Snapshot, mode: str, timeout: float) -> bool:
        """Rank 0: wait for every part of ``name``, then write the global manifest."""
        deadline = time.monotonic() + timeout
        parts: Dict[int, Tuple[bytes, Manifest]] = {}
        judged: Dict[int, Tuple[bytes, bool]] = {}  # the generation check, once per part (not per poll)
        delay = self.poll_interval
        while True:
            self.check_base()  # never commit on a base a rank rejected (the ranks went apart), last in the final round
            for k in range(self.world_size):
                if k not in parts:
                    got = self._read_part(name, k)
                    if got is not None:
                        parts[k] = got
            missing = [k for k in range(self.world_size) if k not in parts]
            if not missing:
                for k in range(self.world_size):
                    raw = parts[k][0]
                    if judged.get(k, (None,))[0] != raw:
                        judged[k] = (raw, self._superseded(name, k, parts[k][1]))
                    if judged[k][1]:
                        del parts[k]
                missing = [k for k in range(self.world_size) if k not in parts]
            if not missing:
                break
            gave_up = [k for k in missing if self._later_part_exists(name, k)]
            if gave_up or time.monotonic() >= deadline:
                why = (f"rank(s) {gave_up} already wrote a later checkpoint" if gave_up
                       else f"no part within {timeout:g} s" + (" (PADDLE_ACP_PART_TIMEOUT)" if timeout == self.part_timeout
                                                                else " (a preemption save waits at most this long)"))
                logger.error(
                    "range %s: checkpoint %s abandoned: missing the part(s) of rank(s) %s (%s); "
                    "it stays invisible and training goes on", self.range_name, name, missing, why,
                )
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        try:  # spread writes: the parts' shares must cover the state exactly (format/shares.py)
            writers, share_writers = shares.commit_writers(snap.share, {k: parts[k][1] for k in parts}, f"{self.dir}/{name}")
        except CorruptCheckpointError as exc:
            logger.error("range %s: checkpoint %s abandoned: %s; it stays invisible and training goes on",
                         self.range_name, name, exc)
            return False
        records = []
        for k in range(self.world_size):
            raw, m = parts[k]
            records.append(PartRecord(k, zlib.crc32(raw) & 0xFFFFFFFF, len(raw), m.data_size, [p.key for p in m.programs]))
        g = GlobalManifest(
            name=name, range_name=self.range_name, epoch_no=snap.range.epoch_no, step=snap.range.step,
            world_size=self.world_size, mode=mode, parts=records, created=time.time(),
            generation=self.fence.generation if self.fence is not None else -1, base=self.base, writers=writers,
            share_writers=share_writers,
        )
        if self.fence is not None:  # a fenced writer removes no verdict either
            self.fence.check(f"commit checkpoint {name}")
        verdict.remove_marks(self.storage, f"{self.dir}/{name}")  # verdicts on an earlier copy of this position
        self._write_global(name, g.dumps())
        return True

    def _write_global(self, name: str, body: bytes) -> None:
        path = f"{self.dir}/{name}/{GLOBAL_NAME}"
        fence = self.fence
        before = None
        if fence is not None:
            if not self.commit_strategy.in_place:  # a fenced writer writes not even the temporary file
                fence.check(f"commit checkpoint {name}")

            def before() -> None:
                fence.check(f"commit checkpoint {name}")
        self.commit_strategy.write_file(self.storage, path, body, before)
