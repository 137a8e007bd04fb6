"""Rank 0's global commit: wait for every rank's part of a position, check each, write ``global.json``.

A part counts when its manifest is valid, names its rank and this incarnation's base, and was written by its rank's
newest generation (:mod:`~paddle_acp.format.commit.fencing`). The wait is bounded (``PADDLE_ACP_PART_TIMEOUT``); a
missing part abandons the checkpoint. With a shared store (:mod:`.arrivals`) the manifests, generations and
absences come from it, and rank 0 lists the position once every rank counted in (before that, at most every
LATER_PARTS_EVERY seconds); what commits is still decided from storage. Mixed into
:class:`~paddle_acp.format.checkpoints.multirank.GlobalCheckpointer`.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.errors import AcpError, CorruptCheckpointError
from paddle_acp.format.commit import absence, arrivals, verdict
from paddle_acp.format.commit.arrivals import Arrivals
from paddle_acp.format.commit.atomic import CommitStrategy, place_file
from paddle_acp.format.commit.committer import PendingCommit as Ticket
from paddle_acp.format.commit.fencing import Fence, newer_recorded, newest_generation
from paddle_acp.format.engine import shares
from paddle_acp.format.global_manifest import GlobalManifest, PartRecord
from paddle_acp.format.layout import (
    GLOBAL_NAME,
    MANIFEST_NAME,
    parse_absent_mark,
    parse_bad_mark,
    parse_name,
    parse_part,
    position_number,
)
from paddle_acp.format.manifest import MAX_MANIFEST_SIZE, Manifest
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")


_UNSEEN = object()
# seconds between looks for ranks already at a later position while parts are missing (not every poll round)
LATER_PARTS_EVERY = 1.0
STORE_POLL = 0.02  # seconds between two looks at the store's count of parts in place (no storage call)


def _token(e: Any) -> Any:
    """What says a listed entry changed: its mtime (None, e.g. an S3 prefix: looked into every round)."""
    return e.mtime


def _unchanged(seen: Dict[Any, Any], key: Any, e: Any) -> bool:
    """Whether ``e`` was read before at this very listing entry (an entry without a time always counts as changed)."""
    return _token(e) is not None and seen.get(key, _UNSEEN) == _token(e)


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
    _generations: Dict[int, int]  # rank -> its newest generation when last listed (newest never decreases)
    _range_listing: Optional[List[Any]] = None  # the range as the last commit's look for later parts listed it
    arrivals: Optional[Arrivals] = None  # the ranks' count of parts in place (None: storage alone tells)
    rank: int
    own_manifests: Dict[str, bytes]  # position -> this rank's part's manifest bytes, as written (the newest few)
    _generation_posted: bool = False  # this rank's generation is in the store (posted with its first arrival)
    staged_globals: Dict[str, Tuple[bytes, str]]  # position -> (its one part's manifest, global.json staged for it)

    def arrival_key(self, name: str) -> str:
        """The key under which every rank counts its part of position ``name`` of this incarnation."""
        return f"{self.base}/{name}"

    def _arrive(self, name: str, note: Optional[bytes] = None, absent: bool = False) -> bool:
        """Count this rank's part or absence (``note``: its manifest or the absence) at ``name`` in the shared
        store, best effort; the first arrival also posts this rank's generation. False where nothing was counted."""
        if self.arrivals is None or self.arrivals.kind == "storage":
            return False
        gen = None if self._generation_posted or self.fence is None else (self.fence.rank, self.fence.generation)
        try:
            arrivals.arrive(self.arrivals, self.arrival_key(name), self.rank, note, gen, absent)
        except AcpError as exc:
            logger.debug("range %s: could not count a part of %s in: %s", self.range_name, name, exc)
            return False
        self._generation_posted = True
        return True

    def announce(self) -> None:
        """At the range's open: post this process's generation to the job's store without waiting."""
        if self.arrivals is not None and self.fence is not None:
            self.arrivals.arrive_soon(arrivals.generation_key(self.fence.rank, self.fence.generation))

    def _own_part(self, name: str) -> Optional[Tuple[bytes, Manifest]]:
        """This rank's part of ``name`` as it wrote it (its manifest's bytes), when it is of this incarnation."""
        raw = self.own_manifests.get(name)
        m = self._part_manifest(raw, self.rank, name) if raw is not None else None
        return None if raw is None or m is None else (raw, m)

    def _from_store(self, name: str, with_absences: bool) -> Tuple[Dict[int, Tuple[bytes, Manifest]], Dict[int, int],
                                                                    Dict[int, absence.Absence]]:
        """Rank 0, once every rank counted in: what the store holds of the other ranks at ``name``
        (:func:`.arrivals.parts_and_generations`); empty where it cannot tell (then storage tells)."""
        pos = parse_name(name)
        if self.arrivals is None or pos is None:
            return {}, {}, {}
        ranks = [k for k in range(self.world_size) if k != self.rank]
        try:
            return arrivals.parts_and_generations(self.arrivals, ranks, position_number(*pos),
                                                  lambda raw, k: self._part_manifest(raw, k, name), with_absences)
        except AcpError as exc:
            logger.debug("range %s: reading the parts of %s from the store: %s; storage alone tells", self.range_name, name, exc)
            return {}, {}, {}

    def _counted(self, name: str) -> Optional[Tuple[int, int]]:
        """(ranks counted in at ``name``, of them without a part); None: unknown (a failed store is not asked again)."""
        if self.arrivals is None:
            return None
        try:
            return arrivals.counted(self.arrivals, self.arrival_key(name))
        except AcpError as exc:
            logger.debug("range %s: counting the parts of %s: %s; storage alone tells", self.range_name, name, exc)
            self.arrivals = None
            return None

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
        m = self._part_manifest(raw, rank, name)
        return None if m is None else (raw, m)

    def _part_manifest(self, raw: bytes, rank: int, name: str) -> Optional[Manifest]:
        """Part ``rank``'s manifest read from ``raw``, when it is valid and of this incarnation."""
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
        return m

    def _superseded(self, name: str, rank: int, m: Manifest, gens: Optional[Dict[int, int]] = None,
                    vouched: Optional[Dict[int, int]] = None) -> bool:
        """Whether the part's writer is not its rank's newest incarnation (FencedError when this rank 0 itself is
        superseded). ``vouched``: rank -> its newest generation per the store."""
        gen = arrivals.part_generation(m)
        if vouched is not None and gen is not None and vouched.get(rank) == gen:
            return False  # the store vouches for this generation
        if self.fence is not None and rank == self.fence.rank and gen is not None and gen <= self.fence.generation:
            # rank 0's own rank, no look-up: its own generation is the newest unless fenced (checked before
            # global.json's rename, _write_global); an older generation's part is superseded by this writer
            newest = self.fence.generation
        else:
            newest = self._newest_generation(rank, {} if gens is None else gens)
        if self.fence is not None and rank == self.fence.rank and newest > self.fence.generation:
            self.fence.check(f"commit checkpoint {name}")  # raises: this writer is superseded
        if gen is not None and gen >= newest:
            return False
        logger.warning("range %s: the part of rank %d of checkpoint %s was written by generation %s of that rank, "
                       "whose newest generation is %d: a superseded process wrote it; it is not committed (waiting "
                       "for the live rank's part)", self.range_name, rank, name, gen, newest)
        return True

    def _newest_generation(self, rank: int, gens: Dict[int, int]) -> int:
        """Rank ``rank``'s newest generation, once per commit (``gens``); remembered across commits and listed
        again only when :func:`~paddle_acp.format.commit.fencing.newer_recorded` says a newer one may exist."""
        if rank in gens:
            return gens[rank]
        known = self._generations.get(rank)
        if known is None or newer_recorded(self.storage, self.job_id, rank, known):
            known = newest_generation(self.storage, self.job_id, rank)
        self._generations[rank] = gens[rank] = known
        return known

    def _later_parts(self, name: str, ranks: List[int]) -> List[int]:
        """Those of ``ranks`` already at a later position (:func:`.arrivals.moved_on`); the range's listing is kept
        for the retention after this commit (no second listing)."""
        found, self._range_listing = arrivals.moved_on(self.storage, self.dir, name, ranks)
        return found

    def _absence(self, name: str, rank: int, gens: Dict[int, int]) -> Optional[absence.Absence]:
        """Rank ``rank``'s absence at ``name`` when it counts: of this incarnation's base and of the
        rank's live generation (a stale one of an earlier incarnation never abandons a new checkpoint)."""
        a = absence.read(self.storage, f"{self.dir}/{name}", rank)
        if a is None:
            return None
        if absence.counts(a, name, self.base, self._newest_generation(rank, gens)):
            return a
        logger.debug("range %s: ignoring rank %d's absence at %s: of an earlier incarnation (generation %d, base %s)",
                     self.range_name, rank, name, a.generation, a.base)
        return None

    def _commit(self, name: str, epoch_no: int, step: Optional[int], mode: str, timeout: float,
                ticket: Optional[Ticket] = None) -> bool:
        """Rank 0: wait for every part of ``name``, then write the global manifest. False: abandoned (a rank said it
        has no part, wrote a later one, sent none in time, or the wait was cancelled)."""
        st = self.storage
        ckdir = f"{self.dir}/{name}"
        self._range_listing = None
        deadline = time.monotonic() + timeout if ticket is None else ticket.deadline
        parts: Dict[int, Tuple[bytes, Manifest]] = {}
        seen: Dict[Any, Any] = {}  # rank -> the listing entry its part (or absence) was last read at
        gens: Dict[int, int] = {}  # rank -> its newest generation (looked up once)
        judged: Dict[int, Tuple[bytes, bool]] = {}  # the generation check, once per part (not per poll)
        # the store's manifests and vouched generations (once every rank counted in); own part: as just written
        stored: Optional[Tuple[Dict[int, Tuple[bytes, Manifest]], Dict[int, int], Dict[int, absence.Absence]]] = None
        own = self._own_part(name)
        self.check_base()  # never commit on a base a rank rejected (the ranks went apart)
        delay = self.poll_interval
        later_at = 0.0  # when to look for ranks at a later position next (monotonic time)
        stalled_at = -1  # the store's count at the last look for ranks gone quiet
        moved_on: List[int] = []  # ranks just seen at a later position: this position is listed once more
        t0 = time.monotonic()
        while True:
            counted = self._counted(name) if stored is None else None  # (before listing: it shows all counted)
            if later_at and time.monotonic() < min(later_at, deadline) and counted is not None and \
                    counted[0] < self.world_size and not counted[1] and not (ticket is not None and ticket.cancel.is_set()):
                # the store says parts are still on their way: no listing before they are (or later_at passes)
                if ticket is not None:
                    ticket.cancel.wait(STORE_POLL)
                else:
                    time.sleep(STORE_POLL)
                continue
            st.forget_cached(ckdir)  # the other ranks' parts must be seen at once
            listing = st.listdir(ckdir)
            dirs = {parse_part(e.name): e for e in listing if e.is_dir}
            # with a store, parts come from it once every rank counted in; while the count moves nothing is read.
            # A count that stood still since the last later round (a rank died before counting in) reads the rest
            later_round = bool(later_at) and time.monotonic() >= later_at
            stalled, stalled_at = (counted[0] == stalled_at, counted[0]) if later_round and counted else (False, stalled_at)
            everyone = counted is not None and (counted[0] >= self.world_size or counted[1] > 0)
            now = self._from_store(name, False) if stalled and not everyone else None
            if counted is not None and everyone:
                stored = self._from_store(name, bool(counted[1]))
                for r, noted_absence in stored[2].items():  # a rank counted in without a part (no file on storage)
                    if absence.counts(noted_absence, name, self.base, self._newest_generation(r, gens)):
                        logger.error("range %s: checkpoint %s abandoned at once: rank %d has no part (%s); it stays "
                                     "invisible and training goes on", self.range_name, name, r, noted_absence.reason)
                        return self._gave_up(ticket, t0)
            held = stored if stored is not None else now
            noted, vouched = (held[0], held[1]) if held is not None else ({}, {})
            read_now = counted is None or held is not None
            for f in listing:
                k = parse_absent_mark(f.name) if not f.is_dir else None
                if k is None or k >= self.world_size or k in parts or _unchanged(seen, ("absent", k), f):
                    continue
                seen[("absent", k)] = _token(f)
                a = self._absence(name, k, gens)
                if a is not None:
                    logger.error("range %s: checkpoint %s abandoned at once: rank %d has no part (%s); it stays "
                                 "invisible and training goes on", self.range_name, name, k, a.reason)
                    return self._gave_up(ticket, t0)
            for k in range(self.world_size):
                e = dirs.get(k)
                if k in parts or e is None or _unchanged(seen, k, e) or not (read_now or k == self.rank):
                    continue
                seen[k] = _token(e)
                got = noted.pop(k, None) or (own if k == self.rank else None) or self._read_part(name, k)
                if got is None:
                    continue
                if judged.get(k, (None,))[0] != got[0]:
                    judged[k] = (got[0], self._superseded(name, k, got[1], gens, vouched))
                if not judged[k][1]:
                    parts[k] = got
            missing = [k for k in range(self.world_size) if k not in parts]
            if not missing:
                break
            # a rank seen at a later position may have written its part here before moving on: given up only
            # when the next listing still misses it (at once could abandon a complete checkpoint)
            gave_up = [k for k in moved_on if k in missing]
            moved_on = []
            if not gave_up and time.monotonic() >= later_at:
                if later_at:  # parts missing for a while: a rank may have rejected the base at its restore and
                    self.check_base()  # sends no part; stop now, not when PADDLE_ACP_PART_TIMEOUT ends (300 s)
                moved_on = self._later_parts(name, missing)
                later_at = time.monotonic() + LATER_PARTS_EVERY
                if moved_on:
                    continue
            cancelled = ticket is not None and ticket.cancel.is_set()
            if ticket is not None:
                deadline = ticket.deadline
            if gave_up or cancelled or time.monotonic() >= deadline:
                if not cancelled:  # a rank that rejected the base sends no part: say that, not a timeout
                    self.check_base()
                why = (f"rank(s) {gave_up} already wrote a later checkpoint" if gave_up else
                       f"cancelled: {ticket.cancel_reason}" if cancelled and ticket is not None else
                       f"no part within {timeout:g} s" + (" (PADDLE_ACP_PART_TIMEOUT)" if timeout == self.part_timeout
                                                          else " (a preemption save waits at most this long)"))
                logger.error(
                    "range %s: checkpoint %s abandoned: missing the part(s) of rank(s) %s (%s); "
                    "it stays invisible and training goes on", self.range_name, name, missing, why,
                )
                return self._gave_up(ticket, t0)
            wait = max(0.0, min(delay, deadline - time.monotonic()))
            if ticket is not None:
                ticket.cancel.wait(wait)
            else:
                time.sleep(wait)
            delay = min(delay * 1.5, 0.5)
        if ticket is not None:
            ticket.waited = time.monotonic() - t0
        staged = self.staged_globals.pop(name, None)  # one rank: global.json written beside its part, from it
        staged_path = staged[1] if staged is not None and staged[0] == parts[0][0] else None
        try:
            body = None if staged_path is not None else self.global_body(name, epoch_no, step, mode, parts)
        except CorruptCheckpointError as exc:
            logger.error("range %s: checkpoint %s abandoned: %s; it stays invisible and training goes on",
                         self.range_name, name, exc)
            return self._gave_up(ticket, t0)
        self.check_base()  # again right before the commit: a rank may have rejected it meanwhile
        # the last listing shows the marks (of an earlier copy) and absences (of an earlier incarnation) to remove
        if self.fence is not None and any(not e.is_dir and (parse_bad_mark(e.name) is not None or
                                                            parse_absent_mark(e.name) is not None) for e in listing):
            self.fence.check(f"commit checkpoint {name}")  # a fenced writer removes no verdict either
        verdict.remove_marks(st, ckdir, listing)
        for e in listing:  # absences of an earlier incarnation (they did not count)
            if not e.is_dir and parse_absent_mark(e.name) is not None:
                st.delete_file(f"{ckdir}/{e.name}")
        self._write_global(name, body, staged_path)
        return True

    def global_body(self, name: str, epoch_no: int, step: Optional[int], mode: str,
                    parts: Dict[int, Tuple[bytes, Manifest]]) -> bytes:
        """``global.json``'s bytes listing ``parts`` (CorruptCheckpointError: spread writes whose shares do not
        cover the state exactly, format/engine/shares.py)."""
        writers, share_writers = shares.commit_writers(shares.part_share(parts[0][1]), {k: parts[k][1] for k in parts},
                                                       f"{self.dir}/{name}")
        records = [PartRecord(k, zlib.crc32(raw) & 0xFFFFFFFF, len(raw), m.data_size, [p.key for p in m.programs])
                   for k, (raw, m) in sorted(parts.items())]
        return GlobalManifest(
            name=name, range_name=self.range_name, epoch_no=epoch_no, step=step,
            world_size=self.world_size, mode=mode, parts=records, created=time.time(),
            generation=self.fence.generation if self.fence is not None else -1, base=self.base, writers=writers,
            share_writers=share_writers,
        ).dumps()

    @staticmethod
    def _gave_up(ticket: Optional[Ticket], t0: float) -> bool:
        if ticket is not None:
            ticket.waited = time.monotonic() - t0
        return False

    def _write_global(self, name: str, body: Optional[bytes], staged: Optional[str] = None) -> None:
        """Write ``global.json`` (``body``) whole or not at all (``staged``: already written under that name), the
        fence checked right before the step that makes it visible; a fenced writer's temporary file is removed."""
        path = f"{self.dir}/{name}/{GLOBAL_NAME}"
        fence = self.fence
        before = None
        if fence is not None:
            def before() -> None:
                fence.check(f"commit checkpoint {name}", quick=True)
        if staged is not None:
            place_file(self.storage, staged, path, before)
        else:
            assert body is not None  # (a body, or a staged file: _commit passes one)
            self.commit_strategy.write_file(self.storage, path, body, before)
