"""GlobalCheckpointer: every rank's part and one global commit, for a job of any world size (one process: 1).

Layout (``W`` = ``PADDLE_TRAINERS_NUM``, 1 for a job of one process)::

    {job}/range/{range}/ckpt-e{E}[-s{S}]/rank-{k}/tensors.bin     rank k's part (its data), k < W
    {job}/range/{range}/ckpt-e{E}[-s{S}]/rank-{k}/manifest.json   the part's manifest (written last)
    {job}/range/{range}/ckpt-e{E}[-s{S}]/global.json              written last, by rank 0: the commit

The name is the training position (epoch ``E`` done, or step ``S`` of epoch ``E``), which every rank derives alike.
Each rank writes its part (renamed from ``rank-{k}.tmp-g<G>-<id>``, G its generation; on S3 its manifest commits it).
Rank 0 waits for and checks every part (:mod:`~paddle_acp.format.commit.part_commit`) and writes ``global.json``
listing each with its manifest's CRC32 and the topology. Restore: :mod:`.rank_restore`. The restart's verdicts and
the start's clean-up of what is newer than the checkpoint resumed from: :mod:`.cleanup` (``GlobalCheckpointer.start``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Callable, Collection, Dict, List, Optional, Set, Tuple

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.cleanup import StartCleanup
from paddle_acp.format.checkpoints.global_reader import GlobalEntry
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.checkpoints.rank_restore import RankRestore
from paddle_acp.format.commit import absence, arrivals, atomic
from paddle_acp.format.commit.committer import Committer, PendingCommit
from paddle_acp.format.commit.fencing import Fence, FencedError, check_deletable
from paddle_acp.format.commit.part_commit import PartCommitMixin
from paddle_acp.format.commit.retention import delete_old, preserve, to_delete
from paddle_acp.format.engine.reader import Landing
from paddle_acp.format.engine.snapshot import Snapshot
from paddle_acp.format.engine.writer import is_out_of_space, write_checkpoint
from paddle_acp.format.layout import (
    GLOBAL_NAME,
    MANIFEST_NAME,
    PART_RE,
    PART_TMP_RE,
    parse_absent_mark,
    parse_name,
    position_name,
    position_number,
    rank_part,
    tmp_generation,
)
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Entry, Storage

if TYPE_CHECKING:
    from paddle_acp.format.checkpoints.cache import RangeCache

logger = logging.getLogger("paddle_acp")

PREEMPT_PART_WAIT = 10.0  # seconds rank 0 waits for the parts of a preemption save (the launcher is stopping the job)


@dataclasses.dataclass
class SaveResult:
    name: str
    nbytes: int
    committed: Optional[bool]  # None: not rank 0 (only wrote its part) or not decided yet; False: abandoned
    waited: float = 0.0
    pending: Optional[PendingCommit] = None  # rank 0: its commit (decided on the committer's thread)


class GlobalCheckpointer(RankRestore, PartCommitMixin):
    """Per-rank parts and rank 0's global commit (:mod:`~paddle_acp.format.commit.part_commit`) for one range of one job."""

    def __init__(self, storage: Storage, job_id: str, range_name: str, rank: int, world_size: int,
                 max_to_keep: int = 3, part_timeout: float = 300.0, fence: Optional[Fence] = None,
                 cache: Optional["RangeCache"] = None, memory_budget: Optional[int] = None) -> None:
        """``cache``: this rank's node-local copies (``PADDLE_ACP_LOCAL_CACHE``); ``memory_budget``: the host-memory
        budget of its restores (``PADDLE_ACP_HOST_MEMORY``)."""
        super().__init__(storage, job_id, range_name)
        self.rank = rank
        self.world_size = world_size
        self.max_to_keep = max_to_keep
        self.part_timeout = part_timeout
        self.base: Optional[str] = None  # the global checkpoint this incarnation resumed from
        self.base_crc: Optional[int] = None  # the CRC32 of its global.json (the copy resumed from)
        self.poll_interval = 0.02
        self._parts = PartReader(storage, job_id, range_name, memory_budget=memory_budget)  # reads the ranks' parts
        self.fence = fence  # this rank's writer fence: checked before each delete and each commit (its part's too)
        self.generation = None if fence is None else fence.generation  # its writer generation (None: unfenced)
        self.commit_strategy = atomic.strategy_for(storage)  # of the parts and of global.json
        self.cache = cache
        self.landing: Optional[Landing] = None  # where this rank's own part lands at a restore (its snapshot arena)
        self._known_format: Dict[str, bool] = {}  # checkpoint name -> of a format this paddle-acp knows (_deletable)
        # the restart's verdicts and the start's clean-up (restart.load_newest, then the runtime's restore)
        self.start = StartCleanup(storage, job_id, range_name, self.dir, rank, fence, self.scan,
                                  lambda name: self._remove_own(name, checked=True), self._deletable)
        self._generations: Dict[int, int] = {}  # rank 0: each rank's newest generation (part_commit)
        self._touched: Set[str] = set()  # positions this incarnation wrote (or declared absent) at
        self.committer = Committer()  # rank 0: the commits, off the saver's thread
        self.own_manifests: Dict[str, bytes] = {}  # position -> this rank's part's manifest bytes, as written
        self.staged_globals: Dict[str, Tuple[bytes, str]] = {}  # one rank: global.json staged beside its part

    def scan(self, listing: Optional[List[Entry]] = None, committed_now: Collection[str] = ()) -> List[GlobalEntry]:
        """The range's checkpoints, oldest first (``listing``: of the range; ``committed_now``: known committed)."""
        out = []
        for e in self.storage.listdir(self.dir) if listing is None else listing:
            pos = parse_name(e.name) if e.is_dir else None
            if pos is None:
                continue
            committed = e.name in committed_now or index.global_committed(self.storage, f"{self.dir}/{e.name}")
            out.append(GlobalEntry(e.name, pos[0], pos[1], committed))
        return sorted(out, key=lambda g: g.key)

    def part_committed(self, name: str, rank: int) -> bool:
        return self.storage.exists(f"{self.part_dir(name, rank)}/{MANIFEST_NAME}")

    def _deletable(self, g: "GlobalEntry | index.Entry") -> bool:
        """False for a committed checkpoint of a newer format: this paddle-acp never deletes or withdraws it."""
        known = self._known_format.get(g.name)
        if known is None:
            try:
                why = index.newer_format(self.storage, f"{self.dir}/{g.name}")
            except StorageError as exc:  # not deleted or withdrawn while it cannot be read: looked at again later
                logger.info("range %s: keeping checkpoint %s for now: it cannot be read (%s)", self.range_name, g.name, exc)
                return False
            if why is not None:
                logger.warning("range %s: keeping checkpoint %s, it is of a newer format (%s)", self.range_name, g.name, why)
            known = self._known_format[g.name] = why is None
        return known

    def _own_part_there(self, name: str) -> bool:
        """Whether this rank has a part at ``name``: its directory where parts are renamed into place (never
        renamed onto), its manifest where they are written in place (the manifest commits them)."""
        if self.commit_strategy.in_place:
            return self.part_committed(name, self.rank)
        return self.storage.exists(self.part_dir(name, self.rank))

    def save(self, snap: Snapshot, mode: str, wait: bool = True, part_wait: Optional[float] = None) -> SaveResult:
        """Write this rank's part; on rank 0 also hand the commit to the committer's thread, and with ``wait`` wait
        for it. ``part_wait``: rank 0's shorter wait for the parts (a preemption save). A rank whose part cannot be
        written says so (:meth:`declare_absent`)."""
        name = position_name(snap.range.epoch_no, snap.range.step)
        if self.storage.has_symlinks and self.storage.kind(f"{self.dir}/{name}") in ("link", "file", "other"):
            raise StorageError(f"cannot write checkpoint {name} of {self.storage.uri}/{self.dir}: a link or a file is "
                               "there (never followed, nor deleted: paddle-acp did not write it); remove it")
        self.start.check_writable(name)  # kept by its start (not proven bad): never replaced, never skipped silently
        if self.fence is not None and self.fence.fenced_by is not None:
            self.fence.check(f"write checkpoint {name}")  # fenced for good
        try:
            nbytes = self._write_part(name, snap, mode)
        except FencedError:
            raise  # a newer process of this rank speaks for it
        except Exception as exc:
            if self.fence is not None:  # a superseded writer (e.g. its temporary part was removed by the live
                try:                    # one's start) says so, once, and declares nothing in the live job's position
                    self.fence.check(f"write checkpoint {name}", quick=True)
                except FencedError:
                    raise
                except Exception as why:  # (the storage failing): the save's own error is what is reported
                    logger.debug("could not check the fence after a failed save: %s", why)
            self.declare_absent(name, f"its part could not be written: {type(exc).__name__}: {exc}")
            raise
        if nbytes is None:
            return SaveResult(name, 0, True)
        self._arrive(name, self.own_manifests.get(name))  # with the store: its manifest travels with its arrival
        if self.rank != 0:
            return SaveResult(name, nbytes, None)
        timeout = self.part_timeout if part_wait is None else min(part_wait, self.part_timeout)
        epoch_no, step = snap.range.epoch_no, snap.range.step
        pending = self.committer.submit(name, timeout, lambda t: self._commit_and_retain(name, epoch_no, step, mode, timeout, t))
        if not wait and self.world_size > 1:  # (one rank: no part to wait for, the commit is the save's last step)
            return SaveResult(name, nbytes, None, pending=pending)
        committed = pending.wait()
        return SaveResult(name, nbytes, committed, pending.waited, pending)

    def _write_part(self, name: str, snap: Snapshot, mode: str) -> Optional[int]:
        """Write this rank's part of position ``name``; its size, or None when the position is committed already."""
        number = position_number(snap.range.epoch_no, snap.range.step)
        ckdir = f"{self.dir}/{name}"
        st = self.storage
        fresh = name not in self._touched and self.fence is not None
        self._touched.add(name)
        if not fresh or (not self.start.known_clear(name) and self._own_part_there(name)):
            # this rank was here before: one listing shows the commit and this rank's parts and leftovers
            st.forget_cached(ckdir)  # rank 0 commits it from another process
            listing = st.listdir(ckdir)
            if any(e.name == GLOBAL_NAME for e in listing):
                logger.info("range %s: checkpoint %s is already committed; not written again", self.range_name, name)
                return None
            self._remove_own(name, listing)
        # else the first save of this incarnation at ``name`` and no part of this rank there (known from the start's
        # clean-up, else one look-up): nothing to remove nor to rename onto (an earlier incarnation's absence does not
        # count, a leftover temporary part is never read, a committed global.json there lists a part that is not).
        gen = self.generation
        part = {"rank": self.rank, "world_size": self.world_size, "mode": mode, "base": self.base,
                "generation": -1 if gen is None else gen}
        if snap.share is not None:  # this part holds its share of the replicated tensors (format/engine/shares.py)
            part["share"] = snap.share
        snap = dataclasses.replace(snap, extra={**snap.extra, "part": part})  # (the caller's snapshot is left as it is)
        # written while the upload runs; not for a streamed snapshot (over the host-memory budget), whose
        # tensors change once its last chunk is copied: its data exists only as the upload's chunks
        copy = self.cache.begin(snap) if self.cache is not None and snap.stream is None else None
        fence = self.fence  # the part's fence check: the store's word, else one look-up (fencing.newer_recorded)
        check = None if fence is None else (lambda: fence.check(f"commit checkpoint {name}", True, lambda: arrivals.vouches(
            self.arrivals, fence.rank, fence.generation)))
        while True:  # (again after space was made on a full storage)
            pending = atomic.Pending(st, ckdir, number, name=rank_part(self.rank), strategy=self.commit_strategy, generation=gen)
            try:
                pending.prepare()  # (inside the try: a Ctrl-C right after its directory is made still removes it)
                written = write_checkpoint(pending, snap, number, check, self._stager(name, snap, mode))
                break
            except BaseException as exc:
                try:
                    pending.abort()
                    self._drop_staged(name)
                except Exception as why:  # removed by this rank's next save or restart
                    logger.debug("could not remove %s: %s", pending.path, why)
                if isinstance(exc, StorageError) and is_out_of_space(exc) and self._make_space(name, exc):
                    continue
                if copy is not None:
                    copy.abort()
                raise
        if copy is not None:  # the part is committed on the remote; restore uses the copy
            copy.commit(name, written.manifest)  # only once the global manifest names these bytes
        for old in list(self.own_manifests)[:-3]:  # (the newest few: a commit reads its own position's)
            del self.own_manifests[old]
        self.own_manifests[name] = written.manifest
        return written.data_size

    def _stager(self, name: str, snap: Snapshot, mode: str) -> Optional[Callable[[bytes, Manifest], None]]:
        """One rank on a storage that renames and overlaps writes (HDFS, where a small file's close waits ~0.4 s):
        its ``global.json`` is written beside its part's files, renamed into place by the commit."""
        if self.world_size != 1 or self.commit_strategy.in_place or not self.storage.overlap_writes:
            return None

        def stage(raw: bytes, m: Manifest) -> None:
            try:
                body = self.global_body(name, snap.range.epoch_no, snap.range.step, mode, {0: (raw, m)})
                self.staged_globals[name] = (raw, atomic.stage_file(self.storage, f"{self.dir}/{name}/{GLOBAL_NAME}", body))
            except Exception as exc:  # (the commit writes it then, and says what fails)
                logger.debug("range %s: global.json of %s not written ahead: %s", self.range_name, name, exc)
        return stage

    def _drop_staged(self, name: str) -> None:
        """Remove the ``global.json`` staged for ``name`` (its part was not written, or its position abandoned)."""
        staged = self.staged_globals.pop(name, None)
        if staged is not None:
            self.storage.delete_file(staged[1])

    def _make_space(self, name: str, cause: BaseException) -> bool:
        """The storage is full while a job of one rank writes ``name``: delete the oldest committed checkpoint older
        than the newest valid one (verified from the storage itself), never one of a newer format. False: none."""
        if self.world_size != 1 or self.rank != 0:
            return False
        committed = [g for g in self.scan() if g.committed]
        newest_valid: Optional[GlobalEntry] = None
        cache, self.cache = self.cache, None  # the storage's own copy, never a node-local one: it is what is full
        try:
            for g in reversed(committed):
                try:
                    self.load(g.name, None).close()
                    newest_valid = g
                    break
                except (CheckpointError, StorageError) as exc:
                    logger.debug("checkpoint %s is not usable: %s", g.name, exc)
        finally:
            self.cache = cache
        older = [g for g in committed if newest_valid is not None and g.key < newest_valid.key and self._deletable(g)]
        kept = newest_valid.name if newest_valid is not None else "none"
        if not older:
            logger.error("checkpoint %s of %s/%s does not fit (%s) and no older checkpoint can be deleted (the newest "
                         "valid one, %s, is always kept): free space on the storage", name, self.storage.uri, self.dir,
                         cause, kept)
            return False
        logger.warning("storage full while writing checkpoint %s of %s/%s: deleting the oldest checkpoint %s to make "
                       "space (the newest valid one, %s, is kept)", name, self.storage.uri, self.dir, older[0].name, kept)
        delete_old(self.storage, self.job_id, self.dir, [older[0].name], self.fence)
        return True

    def declare_absent(self, name: str, reason: str) -> Optional[str]:
        """Say, best effort, that this rank has no part at ``name``, in the job's store when there is one, else on
        storage: rank 0 abandons the position at once. Returns where it was said, or None."""
        gen = self.generation
        self._touched.add(name)  # its next save at ``name`` removes the absence first (_write_part)
        a = absence.Absence(name, self.rank, -1 if gen is None else gen, self.base, reason)
        if self._arrive(name, a.dumps(), absent=True):
            return f"the job's store ({self.arrival_key(name)})"
        return absence.declare(self.storage, self.commit_strategy, f"{self.dir}/{name}", a)

    def _commit_and_retain(self, name: str, epoch_no: int, step: Optional[int], mode: str, timeout: float,
                           ticket: PendingCommit) -> bool:
        """On the committer's thread: the commit of position ``name``, then retention when it committed (once the
        commit is told, :meth:`PendingCommit.then`: the persist is timed to the commit; ``wait`` returns after)."""
        committed = self._commit(name, epoch_no, step, mode, timeout, ticket)
        listing, self._range_listing = self._range_listing, None
        if committed:
            self.start.replaced(name)
            ticket.then(lambda: self._retain_after(name, listing))
        elif not ticket.cancel.is_set():  # abandoned: its own part goes now (the others' at the next commit)
            try:
                self._drop_staged(name)
                self._remove_own(name)
            except (StorageError, CheckpointError) as exc:
                logger.debug("could not remove rank 0's part of abandoned checkpoint %s: %s", name, exc)
        return committed

    def _retain_after(self, name: str, listing: Optional[List[Entry]]) -> None:
        """Retention after the commit of ``name``, on the range as that commit listed it, if it did."""
        try:
            self.apply_retention(listing=listing, committed_now=(name,))
        except (StorageError, CheckpointError) as exc:
            logger.warning("retention after checkpoint %s failed: %s", name, exc)

    def _remove_own(self, name: str, listing: Optional[List[Entry]] = None, checked: bool = False) -> None:
        """Remove this rank's earlier part (or leftovers) at position ``name`` (``listing``: of it, when just listed)
        once this rank's fence check and :func:`check_deletable` (unless ``checked``) passed, never a newer
        generation's part being written."""
        gen = self.generation
        to_remove = []
        for e in self.storage.listdir(f"{self.dir}/{name}") if listing is None else listing:
            m = PART_RE.fullmatch(e.name) or PART_TMP_RE.fullmatch(e.name)
            if m and int(m.group(1)) == self.rank:
                to_remove.append((e.name, tmp_generation(m) if m.re is PART_TMP_RE else -1))
            elif not e.is_dir and parse_absent_mark(e.name) == self.rank:
                to_remove.append((e.name, -2))  # its word that it had no part here: it is writing one now
        if to_remove and self.fence is not None:
            self.fence.check(f"remove its earlier part of checkpoint {name}")
        if to_remove and not checked:
            check_deletable(self.storage, self.job_id, self.dir)
        for part, part_gen in to_remove:
            if gen is not None and part_gen > gen:
                continue  # a newer incarnation of this rank is writing it
            if part_gen == -2:
                self.storage.delete_file(f"{self.dir}/{name}/{part}")
            else:
                self.storage.delete_dir(f"{self.dir}/{name}/{part}")

    def apply_retention(self, keep: Optional[int] = None, listing: Optional[List[Entry]] = None,
                        committed_now: Collection[str] = ()) -> List[str]:
        """Rank 0: remove what :func:`~paddle_acp.format.commit.retention.preserve` lets go; returns the names
        removed. ``listing``, ``committed_now``: the range as the commit just made saw it."""
        keep = self.max_to_keep if keep is None else keep
        entries = index.entries(self.storage, self.job_id, self.range_name, True, listing, list(committed_now))
        committed = [e for e in entries if e.committed]
        if not committed:
            return []
        newest = committed[0].key
        # newer formats and what the restart passed over: neither counted nor deleted (the formats looked at only
        # when more than ``keep`` are committed); the newest of the others, what a restart loads, always stays
        usable = [e for e in committed if not self.start.restart_rejected(e.name)]

        def known(e: index.Entry) -> bool:
            return (len(usable) <= keep or self._deletable(e)) and not self.start.restart_rejected(e.name)
        restart = next((e for e in usable if known(e)), None)
        gone = [e.name for e in to_delete(entries, preserve(entries, keep, lambda e: e.committed, known, lambda e: (
            not e.committed and e.layout == index.GLOBAL and e.key < newest), restart))]
        delete_old(self.storage, self.job_id, self.dir, gone, self.fence)
        return gone
