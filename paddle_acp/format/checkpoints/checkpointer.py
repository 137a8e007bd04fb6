"""Checkpointer: the numbered checkpoints of one range of one job.

It ties the format's parts together for one writer (the training process):
numbering past leftovers and strays (:mod:`~paddle_acp.format.commit.atomic`), the
write (:mod:`~paddle_acp.format.engine.writer`), making space when the storage is
full, retention (:mod:`~paddle_acp.format.commit.retention`), and restore: the newest
checkpoint that verifies (:mod:`~paddle_acp.format.engine.reader`). Paths and names
are in :mod:`~paddle_acp.format.layout`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.commit import atomic
from paddle_acp.format.commit.fencing import Fence
from paddle_acp.format.commit.retention import delete_checkpoint, delete_old, preserve, to_delete
from paddle_acp.format.engine import reader
from paddle_acp.format.engine.reader import Landing, LoadedCheckpoint
from paddle_acp.format.engine.snapshot import Snapshot
from paddle_acp.format.engine.writer import WriteResult, is_out_of_space, write_checkpoint
from paddle_acp.format.layout import JOB_MARKER, final_name, range_dir
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Storage

if TYPE_CHECKING:
    from paddle_acp.format.checkpoints.cache import RangeCache

logger = logging.getLogger("paddle_acp")


class Checkpointer:
    """Numbered, atomically committed checkpoints of one range of one job."""

    def __init__(self, storage: Storage, job_id: str, range_name: str, max_to_keep: int = 3, fence: Optional[Fence] = None,
                 single_writer: bool = False, commit: Optional[atomic.CommitStrategy] = None,
                 cache: Optional["RangeCache"] = None, memory_budget: Optional[int] = None) -> None:
        """``fence``: the writer's fence (None: unfenced); ``cache``: the node-local copies of this range
        (``PADDLE_ACP_LOCAL_CACHE``, remote storage only); ``memory_budget``: ``PADDLE_ACP_HOST_MEMORY`` in
        bytes, a restore larger than it is neither mapped nor held in memory."""
        self.storage = storage
        self.fence = fence  # a fencing.Fence (the writer's generation) or None
        self.job_id = job_id
        self.range_name = range_name
        self.max_to_keep = max_to_keep
        self.dir = range_dir(job_id, range_name)
        # how a checkpoint becomes visible: the storage's capability unless given (atomic.strategy_for)
        self.commit_strategy = commit or atomic.strategy_for(storage)
        # The only writer of this range (the training process): after its first save has
        # listed the range, it knows the committed checkpoints without listing again (a
        # listing costs 1 + one stat per checkpoint on remote stores). Any failure forgets
        # what it knew and the next save lists again.
        self.single_writer = single_writer
        self.memory_budget = memory_budget
        self.landing: Optional[Landing] = None  # where a restore lands (the runtime's snapshot arena), while it loads
        self._known: Optional[List[atomic.DirEntry]] = None
        self.cache = cache
        # checkpoint number -> whether it is of a format this paddle-acp knows (never deleted when not)
        self._known_format: Dict[int, bool] = {}

    # -- writing ---------------------------------------------------------------
    def write_job_marker(self) -> None:
        write_job_marker(self.storage, self.job_id)

    def check_no_links(self) -> None:
        """Refuse a job whose ``range`` directory or range directory is a symbolic link
        (:func:`paddle_acp.format.checkpoints.index.check_no_links`)."""
        index.check_no_links(self.storage, self.job_id, self.range_name)

    def save(self, snap: Snapshot) -> WriteResult:
        """Write and commit one checkpoint; returns what was written (its number, its data's size, ...).

        Stray entries (a file or link named like a checkpoint, a leftover that cannot
        be removed) never stop it: the number goes past them. When the storage is
        full, older checkpoints are deleted one by one (never the newest valid one)
        until the checkpoint fits."""
        st = self.storage
        if self.fence is not None and self.fence.fenced_by is not None:
            self.fence.check("write a checkpoint")  # fenced for good: not even the data is written
        known, self._known = self._known, None  # forgotten until this save ended well
        if known is None:
            self.check_no_links()
            listing = st.listdir(self.dir)
            entries = atomic.scan(st, self.dir, listing)
            # only after the fence check, and never a newer writer's directory being written
            stuck = atomic.remove_leftovers(st, self.dir, entries, self.generation,
                                            self._check_fence("remove leftovers of interrupted saves"))
            others = [e for e in listing if not e.is_dir]  # files and links named ckpt-N keep their names
            try:  # past removed leftovers too: a number is not reused while a zombie writer may hold it
                number = atomic.next_number(entries, others)
            except CheckpointError:  # ... unless a removed stray had an absurd number
                number = atomic.next_number([e for e in entries if e.committed] + stuck, others)
            committed = [e for e in entries if e.committed]
        else:  # the single writer's own record: one past its newest, which is past every stray
            self.check_no_links()
            committed = known
            number = atomic.next_number(known)
        self._space_made = False
        # written while the upload runs; not for a streamed snapshot (over the host-memory budget), whose
        # tensors change once its last chunk is copied: its data exists only as the upload's chunks
        copy = self.cache.begin(snap) if self.cache is not None and snap.stream is None else None
        try:
            while True:
                try:
                    written = self._write_pending(snap, number)
                    break
                except StorageError as exc:
                    if not is_out_of_space(exc) or not self._make_space(number, exc):
                        raise
        except BaseException:
            if copy is not None:
                copy.abort()
            raise
        if copy is not None:  # committed on the remote: now the copy, with the very manifest bytes written
            copy.commit(final_name(number), written.manifest)
        committed = committed + [atomic.DirEntry(final_name(number), number, True)]
        self._known_format[number] = True
        try:
            deleted = self._retain([e.number for e in committed])
        except (StorageError, CheckpointError) as exc:  # the new checkpoint is committed; pruning retries next time
            logger.warning("retention after checkpoint %d failed: %s", number, exc)
            return written
        if self.single_writer and not self._space_made:  # (a deletion to make space: list again)
            self._known = [e for e in committed if e.number not in deleted]
        return written

    @property
    def generation(self) -> Optional[int]:
        """The writer's fencing generation (carried by its temporary names), None without a fence."""
        return None if self.fence is None else self.fence.generation

    def _write_pending(self, snap: Snapshot, number: int) -> WriteResult:
        pending = atomic.Pending(self.storage, self.dir, number, strategy=self.commit_strategy,
                                 generation=self.generation)  # (named only: made inside the try)
        try:
            pending.prepare()  # a Ctrl-C right after its directory is made still removes it (below)
            return self.write(pending, snap, number)
        except BaseException:
            try:
                pending.abort()
            except Exception as exc:  # the leftover is removed by the next save
                logger.debug("could not remove %s: %s", pending.path, exc)
            raise

    def _make_space(self, number: int, cause: BaseException) -> bool:
        """The storage is full: delete the oldest committed checkpoint that is older than
        the newest valid one (verified in full here). False when there is none."""
        committed = self.committed_numbers()
        newest_valid = None
        for n in reversed(committed):
            try:
                # the storage's own copy, never a node-local one: it is the storage that is full
                reader.load(self.storage, self.base(n), n, self.range_name).close()
            except (CorruptCheckpointError, StorageError) as exc:
                logger.debug("checkpoint %d is not usable: %s", n, exc)
                continue
            newest_valid = n
            break
        older = [n for n in committed if newest_valid is not None and n < newest_valid and self._deletable(n)]
        if not older:
            logger.error(
                "checkpoint %d of %s/%s does not fit (%s) and no older checkpoint can be deleted "
                "(the newest valid one, %s, is always kept): free space on the storage",
                number, self.storage.uri, self.dir, cause, newest_valid if newest_valid is not None else "none",
            )
            return False
        if self.fence is not None:
            self.fence.check("delete an old checkpoint to make space")
        from paddle_acp.format.commit.fencing import check_deletable

        check_deletable(self.storage, self.job_id, self.dir)
        victim = older[0]
        self._space_made = True
        logger.warning(
            "storage full while writing checkpoint %d of %s/%s: deleting the oldest checkpoint %d to make space "
            "(the newest valid one, %d, is kept)", number, self.storage.uri, self.dir, victim, newest_valid,
        )
        self._delete(victim)
        return True

    def _delete(self, n: int) -> None:
        delete_checkpoint(self.storage, self.base(n))

    def write(self, pending: atomic.Pending, snap: Snapshot, number: int) -> WriteResult:
        """Write ``snap`` into ``pending`` as checkpoint ``number`` and commit it (the commit checks the fence)."""
        # the commit's fence check is the quick one (one look-up, :func:`fencing.newer_recorded`): it
        # runs at every save, and says the same as a listing
        return write_checkpoint(pending, snap, number, self._check_fence("commit checkpoint %d" % number, quick=True))

    def _check_fence(self, what: str, quick: bool = False) -> Optional[Callable[[], None]]:
        fence = self.fence
        if fence is None:
            return None
        return lambda: fence.check(what, quick)

    def apply_retention(self, keep: Optional[int] = None) -> List[int]:
        """Delete the committed checkpoints the preservation policy (keep the newest ``keep``,
        default ``max_to_keep``) lets go; returns their numbers."""
        if (self.max_to_keep if keep is None else keep) <= 0:
            return []  # no listing
        committed = [e.number for e in atomic.scan(self.storage, self.dir) if e.committed]
        return self._retain(committed, keep)

    def _retain(self, committed: List[int], keep: Optional[int] = None) -> List[int]:
        """Delete what the preservation policy (:func:`~paddle_acp.format.commit.retention.preserve`) lets go of
        the ``committed`` checkpoint numbers."""
        keep = self.max_to_keep if keep is None else keep
        if len(committed) <= keep or keep <= 0:  # nothing to delete even counting every checkpoint: no look inside
            return []
        # a checkpoint of a newer format is neither counted nor deleted: the newest of this format are kept
        newest_first = sorted(committed, reverse=True)
        gone = to_delete(newest_first, preserve(newest_first, keep, known=self._deletable))
        delete_old(self.storage, self.job_id, self.dir, [final_name(n) for n in gone], self.fence)
        return gone

    def _deletable(self, n: int) -> bool:
        """False for a checkpoint of a format this paddle-acp does not know: a newer paddle-acp
        resumes from it, so neither retention nor making space deletes it (logged once)."""
        known = self._known_format.get(n)
        if known is None:
            try:
                why = index.newer_format(self.storage, self.base(n))
            except StorageError as exc:  # not deleted while it cannot be read: the next save looks again
                logger.info("retention keeps checkpoint %d of %s/%s for now: it cannot be read (%s)",
                            n, self.storage.uri, self.dir, exc)
                return False
            known = self._known_format[n] = why is None
            if why is not None:
                logger.warning("keeping checkpoint %d of %s/%s: it is of a newer format (%s); this paddle-acp never "
                               "deletes it", n, self.storage.uri, self.dir, why)
        return known

    # -- reading ---------------------------------------------------------------
    def committed_numbers(self) -> List[int]:
        return sorted(e.number for e in atomic.scan(self.storage, self.dir) if e.committed)

    def base(self, number: int) -> str:
        """The directory of committed checkpoint ``number``."""
        return f"{self.dir}/{final_name(number)}"

    def read_manifest(self, number: int, base: Optional[str] = None, raw: Optional[bytes] = None) -> Manifest:
        """The manifest of checkpoint ``number`` (in ``base``, default ``ckpt-N``); see :func:`reader.read_manifest`."""
        return reader.read_manifest(self.storage, base or self.base(number), number, self.range_name, raw)

    def check_header(self, number: int, base: Optional[str] = None, raw: Optional[bytes] = None) -> Tuple[Manifest, str, str]:
        """Validate the manifest and the data file's size; returns (manifest, dir, data path)."""
        base = base or self.base(number)
        m, data_path = reader.check_header(self.storage, base, number, self.range_name, raw)
        return m, base, data_path

    def load(self, number: int, base: Optional[str] = None, raw: Optional[bytes] = None,
             landing: Optional[Landing] = None) -> LoadedCheckpoint:
        """Read and verify checkpoint ``number`` completely (:func:`reader.load`); raises CorruptCheckpointError.

        With a node-local cache the data comes from the local copy when that copy is this very
        checkpoint (see :meth:`paddle_acp.format.checkpoints.cache.RangeCache.load`). ``landing``
        (else :attr:`landing`): the buffer its bytes are read into, within :attr:`memory_budget`."""
        landing = landing if landing is not None else self.landing
        if self.cache is not None and base is None:
            _m, raw = reader.read_manifest_raw(self.storage, self.base(number), number, self.range_name, raw)
            cached = self.cache.load(final_name(number), number, raw, memory_budget=self.memory_budget, landing=landing)
            if cached is not None:
                cached.path = self.base(number)
                return cached
        return reader.load(self.storage, base or self.base(number), number, self.range_name, raw, self.memory_budget,
                           landing)


def write_job_marker(storage: Storage, job_id: str) -> None:
    """Mark ``job_id``'s directory as a paddle-acp job (written once, by trainer 0)."""
    path = f"{job_id}/{JOB_MARKER}"
    if storage.exists(path):
        return
    storage.makedirs(job_id)
    body = {"format": "paddle-acp/job", "version": 1, "job_id": job_id, "created": time.time()}
    storage.write_bytes(path, json.dumps(body).encode())


def no_usable(search: "index.Search[LoadedCheckpoint]", where: str, job_id: str, who: str = "") -> BaseException:
    """Why a restart that found committed checkpoints but none it can use stops: the first
    misfit's CheckpointError, a StorageError when some could not be read, else
    :func:`paddle_acp.format.checkpoints.index.no_usable_error` naming each checkpoint."""
    misfits = search.of_kind(index.MISFIT)
    if misfits:
        return misfits[0].error
    unreadable = search.of_kind(index.UNREADABLE)
    if unreadable:
        return StorageError(
            f"{who}no checkpoint of {where} could be loaded, and {len(unreadable)} could not be read "
            f"({index.describe(unreadable)}): fix the storage (permissions?) rather than train from scratch, "
            "or remove the unreadable checkpoints"
        )
    return index.no_usable_error(where, job_id, search.rejected, who)
