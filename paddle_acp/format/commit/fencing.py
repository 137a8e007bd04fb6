"""Writer fencing: every start of every rank of a job takes a new generation; an older one stops.

A rank's generations are empty records ``{job}/writers/gen-<n>`` (rank 0: the layout older copies read, so they
are fenced too) or ``{job}/writers/rank-<k>/gen-<n>``, created exclusively (local disks: ``O_CREAT | O_EXCL``;
HDFS: a rename onto a name that must not exist; S3: check-then-write, which two simultaneous starts can both
pass). The newest record of a rank wins. A writer checks that its generation is still the newest right before
every step that deletes or makes something visible (one listing; before a commit one look-up of the next record,
:func:`newer_recorded`). Once it is not, it deletes and commits nothing more and logs one error
(:class:`FencedError` after that, logged by no one else); the training loop raises it at its next epoch end or
save (:meth:`Fence.stop`), so a superseded process never trains on without checkpoints. With a shared store, a part's check may take the
store's word (``vouch``) for VOUCHED_FOR seconds: a part is no checkpoint until rank 0, whose commit always
looks on storage, commits it, and rank 0 never commits a superseded rank's part.

Temporary names carry the generation (``ckpt-N.tmp-g<G>-<id>``, ``rank-k.tmp-g<G>-<id>``): a writer removes
leftovers of its own and older generations only. Each part's manifest records its generation, and rank 0 commits
a part only when that is its rank's newest, so a superseded incarnation's part never enters a global checkpoint.

Limits: the check and the step it guards are two storage calls (no store offers a conditional delete or rename),
so a writer stopped between a passing check and its step (GC pause, SIGSTOP, partition) still performs that one
step. A rename onto an existing directory never replaces it (local disks and hdfs-native refuse; libhdfs and the
hadoop CLI move the source *into* it, removed with its checkpoint: tests/unit/storage/test_storage_contract.py),
and a late part fails rank 0's generation check; a late delete removes only what the check allowed. On S3 a late
write can replace an object. Every later step is checked again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, StorageError
from paddle_acp.format.untrusted_json import parse_json
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

WRITERS_DIR = "writers"
MAX_GENERATION = 10**18 - 1  # the largest generation a record may name: 18 digits (parts and absences take the same)
_GEN_RE = re.compile(r"\Agen-(0|[1-9][0-9]{0,17})\Z", re.ASCII)  # canonical ASCII decimal, in full, <= MAX_GENERATION
JOB_MARKER = "job.json"
MAX_JOB_MARKER_SIZE = 1 << 16  # bytes of a job marker (paddle-acp writes about 100)
MAX_GAPS = 100  # records a new writer adds at most to close gaps in the generations (_fill_gaps)
VOUCHED_FOR = 30.0  # seconds a quick check may take the store's word before looking on storage


class FencedError(CheckpointError):
    """A newer writer of the same job has started: this one commits nothing more."""


def writers_dir(job_id: str, rank: int = 0) -> str:
    """The directory of rank ``rank``'s generation records (rank 0: the job's own)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise CheckpointError(f"a writer's rank must be an integer >= 0, not {rank!r}")
    return f"{job_id}/{WRITERS_DIR}" if rank == 0 else f"{job_id}/{WRITERS_DIR}/rank-{rank}"


def recorded_generations(storage: Storage, job_id: str, rank: int = 0) -> List[int]:
    """The generations recorded for rank ``rank`` of the job, in order (records of other names are ignored)."""
    path = writers_dir(job_id, rank)
    storage.forget_cached(path)  # other processes' generations must be seen at once
    return sorted(int(m.group(1)) for e in storage.listdir(path)
                  if (m := _GEN_RE.fullmatch(e.name)) and not e.is_dir and not e.is_link)


def newest_generation(storage: Storage, job_id: str, rank: int = 0) -> int:
    """The newest generation recorded for rank ``rank`` of the job; -1 when there is none."""
    return max(recorded_generations(storage, job_id, rank), default=-1)


def _fill_gaps(storage: Storage, wdir: str, gens: List[int], taken: int) -> None:
    """Record ``m + 1`` after each recorded generation ``m`` below ``taken`` whose successor is missing (a record
    planted or copied in out of order): a writer of generation ``m`` looks only for ``gen-<m + 1>`` in its quick check
    (:func:`newer_recorded`), and must see that it is superseded. Best effort, at most MAX_GAPS records."""
    have = set(gens)
    gaps = [m + 1 for m in gens if m + 1 not in have and m + 1 < taken]
    if len(gaps) > MAX_GAPS:
        logger.warning("%s/%s: %d gaps between writer generation records; filling the newest %d only", storage.uri,
                       wdir, len(gaps), MAX_GAPS)
        gaps = gaps[-MAX_GAPS:]
    for g in gaps:
        try:
            create_exclusive(storage, f"{wdir}/gen-{g}", b"")
        except StorageError as exc:
            logger.warning("could not record writer generation %d under %s/%s: %s", g, storage.uri, wdir, exc)


def newer_recorded(storage: Storage, job_id: str, rank: int, generation: int) -> bool:
    """Whether a generation after ``generation`` may be recorded for rank ``rank``: one look-up of
    ``gen-<generation + 1>``. Generations are taken in order (:meth:`Fence.take`) and records never deleted, so
    False means ``generation`` is still the newest; True only says "list" (:func:`newest_generation`)."""
    path = f"{writers_dir(job_id, rank)}/gen-{generation + 1}"
    storage.forget_cached(path)  # other processes' generations must be seen at once
    return storage.exists(path)


def create_exclusive(storage: Storage, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True when this call created it
    (see :meth:`Storage.create_exclusive`: O_EXCL on local disks, a rename on HDFS)."""
    return storage.create_exclusive(path, data)


class Fence:
    """This process's generation as the writer of one rank of one job."""

    def __init__(self, storage: Storage, job_id: str, generation: int, rank: int = 0, took_s: float = 0.0):
        """``took_s``: seconds the record took to create, the least any checkpoint write takes on this storage
        (0.0: not measured)."""
        self.storage = storage
        self.job_id = job_id
        self.generation = generation
        self.rank = rank
        self.took_s = took_s
        self.fenced_by: Optional[int] = None
        self._looked_at = time.monotonic()  # when storage last said this generation is the newest (taken: now)
        self._first: Optional[Callable[[], None]] = None  # done before any check passes (:meth:`first`)
        self._first_lock = threading.Lock()

    def first(self, done: Callable[[], None]) -> None:
        """``done`` (e.g. trainer 0's job marker written in the background; raises when it fails) runs at the next
        check, and again at each check after one it raised in: nothing is deleted or committed before it passed."""
        self._first = done

    def _wait_first(self) -> None:
        with self._first_lock:  # (every thread that checks waits for it)
            done = self._first
            if done is not None:
                done()  # raises: kept, and run again at the next check
                self._first = None

    @classmethod
    def take(cls, storage: Storage, job_id: str, rank: int = 0) -> "Fence":
        """Record a new generation of rank ``rank`` (newest + 1; on a race, the next free one)."""
        wdir = writers_dir(job_id, rank)
        gens = recorded_generations(storage, job_id, rank)
        n = max(gens, default=-1) + 1
        if n == 0:  # no record yet: the directory may not exist either (a restart's lists it, one call less)
            storage.makedirs(wdir)
        for _ in range(1000):
            if n > MAX_GENERATION:  # a name newest_generation() ignores: older writers would never be fenced
                raise StorageError(
                    f"cannot record a writer generation for job {job_id}{f' rank {rank}' if rank else ''}: "
                    f"{storage.uri}/{wdir}/gen-{n - 1} is taken and a record may name no generation above "
                    f"{MAX_GENERATION} (a newer writer would be invisible: no older one would be fenced). paddle-acp "
                    f"never counts that high: stop every process of job {job_id}, then remove the records with 18 "
                    f"digits from {storage.uri}/{wdir} (or start the job under a new PADDLE_JOB_ID)"
                )
            t0 = time.monotonic()
            # empty: HDFS completes a file without blocks at once (one with a block waits ~0.4 s for the DataNode)
            if create_exclusive(storage, f"{wdir}/gen-{n}", b""):
                logger.info("job %s: this writer%s is generation %d (process %d on %s)", job_id,
                            f" (rank {rank})" if rank else "", n, os.getpid(), socket.gethostname())
                _fill_gaps(storage, wdir, gens, n)
                return cls(storage, job_id, n, rank, took_s=time.monotonic() - t0)
            n += 1
        raise StorageError(f"could not record a writer generation under {storage.uri}/{wdir}")

    @property
    def who(self) -> str:
        return "this writer" if self.rank == 0 else f"this writer of rank {self.rank}"

    def check(self, what: str, quick: bool = False, vouch: Optional[Callable[[], bool]] = None) -> None:
        """Raise FencedError unless this generation is still the newest of its rank (one listing; ``quick``:
        :func:`newer_recorded` first; ``vouch``: the store's word, taken for VOUCHED_FOR seconds after storage last
        said so). The first failure logs one error; nothing else logs a FencedError."""
        self._wait_first()
        if self.fenced_by is None and quick and vouch is not None and \
                time.monotonic() - self._looked_at < VOUCHED_FOR and vouch():
            return
        if self.fenced_by is None and quick and not newer_recorded(self.storage, self.job_id, self.rank, self.generation):
            self._looked_at = time.monotonic()
            return
        if self.fenced_by is None:
            newest = newest_generation(self.storage, self.job_id, self.rank)
            if newest > self.generation:
                self.fenced_by = newest
                logger.error(
                    "job %s: %s (generation %d) is fenced: a newer writer of the same job%s started "
                    "(generation %d); it deletes and commits nothing more (it was about to %s). Two processes act "
                    "as the writer of job %s%s: stop the older one, or give each job its own PADDLE_JOB_ID.",
                    self.job_id, self.who, self.generation, f" and rank {self.rank}" if self.rank else "", newest,
                    what, self.job_id, f" rank {self.rank}" if self.rank else "",
                )
        if self.fenced_by is not None:
            raise FencedError(
                f"job {self.job_id}: {'' if self.rank == 0 else f'rank {self.rank} '}writer generation {self.generation} "
                f"is fenced by generation {self.fenced_by}: refusing to {what}"
            )

    def stop(self, where: str) -> None:
        """Raise FencedError once a check found this generation superseded: the process stops ``where`` (a point
        where the training loop hands control to paddle-acp) instead of training on without checkpoints."""
        if self.fenced_by is not None:
            raise FencedError(
                f"job {self.job_id}: {self.who} (generation {self.generation}) is fenced: a newer incarnation of the "
                f"job (writer generation {self.fenced_by}) took over its checkpoints, so this process saves nothing "
                f"more (it deleted nothing of the newer one's) and stops {where} instead of training on without "
                f"checkpoints. If both were meant to run, give each job its own PADDLE_JOB_ID"
            )


def check_deletable(storage: Storage, job_id: str, path: str) -> None:
    """Refuse (CheckpointError) to delete under ``path`` unless it lies in this job's own
    directory, reached through no symlink, and the job marker (when there is one) names this job."""
    if not (path == job_id or path.startswith(job_id + "/")):
        raise CheckpointError(f"refusing to delete {path!r}: not inside the directory of job {job_id!r}")
    if storage.has_symlinks:
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            if storage.kind("/".join(parts[:i])) == "link":
                raise CheckpointError(
                    f"refusing to delete under {storage.uri}/{path}: {'/'.join(parts[:i])} is a symlink "
                    "(retention never deletes through a symlink)"
                )
    try:
        doc = read_job_marker(storage, job_id)
    except (CorruptCheckpointError, StorageError) as exc:
        raise CheckpointError(f"refusing to delete under {storage.uri}/{path}: {exc}; nothing is deleted (retention "
                              f"skipped) until {JOB_MARKER} is fixed or removed") from None
    if doc is None:
        return  # written by trainer 0 at start; absent only in layouts older than the marker
    if doc["job_id"] != job_id:
        raise CheckpointError(
            f"refusing to delete under {storage.uri}/{path}: the job marker {job_id}/{JOB_MARKER} names another job "
            f"({doc['job_id']!r})"
        )


def read_job_marker(storage: Storage, job_id: str) -> Optional[Dict[str, Any]]:
    """The job marker ``{job_id}/job.json``, read as untrusted input (at most MAX_JOB_MARKER_SIZE bytes, nesting
    capped, field types checked): its ``job_id`` a string, ``created`` (optional) a time in seconds. None when there
    is none; CorruptCheckpointError naming it when invalid, StorageError when it cannot be read."""
    path = f"{job_id}/{JOB_MARKER}"
    try:
        raw = storage.read_bytes(path, limit=MAX_JOB_MARKER_SIZE)
    except FileNotFoundError:
        return None
    try:
        doc = parse_json(raw, "job marker", MAX_JOB_MARKER_SIZE)
        if not isinstance(doc, dict):
            raise CorruptCheckpointError("invalid job marker: not a JSON object")
        if not isinstance(doc.get("job_id"), str) or not 0 < len(doc["job_id"]) <= 4096:
            raise CorruptCheckpointError("invalid job marker: job_id is missing or not a job id")
        try:
            doc["job_id"].encode("utf-8")
        except UnicodeEncodeError:
            raise CorruptCheckpointError("invalid job marker: job_id is not valid text") from None
        created = doc.get("created")
        if created is not None and (isinstance(created, bool) or not isinstance(created, (int, float))
                                    or not 0 <= created < 1e11):
            raise CorruptCheckpointError("invalid job marker: created is not a time in seconds")
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{storage.uri}/{path}: {exc}") from None
    return doc


def write_job_marker(storage: Storage, job_id: str) -> None:
    """Mark ``job_id``'s directory as a paddle-acp job (written once, by trainer 0): what
    :func:`check_deletable` asks of a directory before anything in it is deleted."""
    path = f"{job_id}/{JOB_MARKER}"
    if storage.exists(path):
        return
    storage.makedirs(job_id)
    body = {"format": "paddle-acp/job", "version": 1, "job_id": job_id, "created": time.time()}
    storage.write_bytes(path, json.dumps(body).encode())
