"""Writer fencing: every start of every rank of a job takes a new generation; an older one stops.

Each rank has its own sequence of generations: records ``{job}/writers/gen-<n>`` for
rank 0 (the layout of earlier versions, which read it: an older copy of the library
running as a zombie is fenced by a newer rank 0) and ``{job}/writers/rank-<k>/gen-<n>``
for rank ``k`` > 0, created with exclusive semantics (local disks: ``O_CREAT | O_EXCL``;
HDFS: a temporary file renamed onto a name that must not exist; S3: check-then-write,
which two writers starting in the same instant can both pass). A record is an empty file (its name
is the generation; the process that took it is in its log line). The newest record of
a rank wins. A rank's writer checks that its generation is still the newest of its rank
right before every step that deletes or makes something visible: removing leftovers, its
earlier part, old checkpoints (one listing of its small records directory), and each commit
(one look-up of the next generation's record, :func:`newer_recorded`; the listing when it is there). When it is not, it deletes and commits nothing more and logs one error
naming both generations (:class:`FencedError` after that, logged by no one else). Where the ranks share a store, a
rank's check before its part's rename takes the store's word (``vouch``: it holds this process's generation and no
newer one of its rank) and looks on storage at most every VOUCHED_FOR seconds: a part is no checkpoint until rank 0,
whose own commit always looks on storage, committed it, and rank 0 never commits a superseded rank's part.

Temporary names carry the generation (``ckpt-N.tmp-g<G>-<id>``, ``rank-k.tmp-g<G>-<id>``):
a writer removes leftovers of its own and older generations only, never the directory a
newer writer is writing. Each part's manifest records its rank's generation, and rank 0
commits a part only when that generation is the newest recorded for that rank, so a part
written by a superseded incarnation never enters a new global checkpoint.

What is guaranteed and what is not: a writer that knows a newer generation exists never
deletes or commits again. The check and the step it guards are two storage calls (no
store here offers a conditional delete or rename on another object): a writer stopped
(GC pause, SIGSTOP, a partitioned node) *between* a passing check and its step still
performs that one step when it resumes. A rename onto an existing directory never replaces
it: local disks and the hdfs-native client refuse it, libhdfs and the hadoop CLI move the
source *into* it (HDFS's rename without options: a stray directory inside, removed with
its checkpoint; tests/unit/storage/test_storage_contract.py), so such a late commit never replaces
a newer checkpoint there, and a late part is rejected by rank 0's generation check; a late delete removes what the
check allowed (its own rank's leftovers, its earlier part, or old checkpoints the newer
writer would also delete). On S3 (no rename, check-then-write) the window is the same
and a late write can replace an object. The window is one call long; every later step
is checked again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from typing import Callable, Optional

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

WRITERS_DIR = "writers"
_GEN_RE = re.compile(r"\Agen-(0|[1-9][0-9]{0,17})\Z", re.ASCII)  # canonical ASCII decimal, in full
JOB_MARKER = "job.json"
VOUCHED_FOR = 30.0  # seconds a quick check takes the job's store's word for this generation before looking on storage


class FencedError(CheckpointError):
    """A newer writer of the same job has started: this one commits nothing more."""


def writers_dir(job_id: str, rank: int = 0) -> str:
    """The directory of rank ``rank``'s generation records (rank 0: the job's, as in earlier versions)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise CheckpointError(f"a writer's rank must be an integer >= 0, not {rank!r}")
    return f"{job_id}/{WRITERS_DIR}" if rank == 0 else f"{job_id}/{WRITERS_DIR}/rank-{rank}"


def newest_generation(storage: Storage, job_id: str, rank: int = 0) -> int:
    """The newest generation recorded for rank ``rank`` of the job; -1 when there is none."""
    best = -1
    path = writers_dir(job_id, rank)
    storage.forget_cached(path)  # other processes' generations must be seen at once
    for e in storage.listdir(path):
        m = _GEN_RE.fullmatch(e.name)
        if m and not e.is_dir and not e.is_link:
            best = max(best, int(m.group(1)))
    return best


def newer_recorded(storage: Storage, job_id: str, rank: int, generation: int) -> bool:
    """Whether a record of a generation after ``generation`` may exist for rank ``rank``: one look-up
    of ``gen-<generation + 1>`` (on HDFS one RPC when absent, where a listing costs three).

    Generations are taken in order (:meth:`Fence.take`: newest + 1, or past a name found taken),
    and records are never deleted, so every generation after a recorded one leaves a record (or a
    foreign entry) at ``generation + 1``: False here means ``generation`` is still the newest of a
    rank whose record ``gen-<generation>`` exists. True only says "look": the caller lists
    (:func:`newest_generation`), which ignores foreign entries (a link or a directory of that name)."""
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
        """``took_s``: seconds the record took to create (an empty file's creation, a rename on HDFS): the
        round trips any checkpoint's write takes on this storage at least, known before any is written (0.0: not
        measured)."""
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
        """``done`` (it waits for work in flight, or does it again, and raises when that fails) runs at this
        writer's next check, and at every check after one it raised in: nothing is deleted or committed before it
        passed once (trainer 0's job marker, written in the background while its job trains; a storage that
        failed it for a while fails the checks of that while, not every later one)."""
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
        n = newest_generation(storage, job_id, rank) + 1
        if n == 0:  # no record yet: the directory may not exist either (a restart's lists it, one call less)
            storage.makedirs(wdir)
        for _ in range(1000):
            t0 = time.monotonic()
            # an empty record (its name is the generation): HDFS completes a file without blocks at once, where
            # one with a block waits ~0.4 s for the DataNode's report (the open of every rank waited for it)
            if create_exclusive(storage, f"{wdir}/gen-{n}", b""):
                logger.info("job %s: this writer%s is generation %d (process %d on %s)", job_id,
                            f" (rank {rank})" if rank else "", n, os.getpid(), socket.gethostname())
                return cls(storage, job_id, n, rank, took_s=time.monotonic() - t0)
            n += 1
        raise StorageError(f"could not record a writer generation under {storage.uri}/{wdir}")

    @property
    def who(self) -> str:
        return "this writer" if self.rank == 0 else f"this writer of rank {self.rank}"

    def check(self, what: str, quick: bool = False, vouch: Optional[Callable[[], bool]] = None) -> None:
        """Raise FencedError unless this generation is still the newest of its rank (one listing;
        ``quick``: one look-up of the next generation's record, listing only when it is there,
        :func:`newer_recorded`; ``vouch``: the job's store's word for it, taken for VOUCHED_FOR seconds after
        storage last said so). The first time it is not, one error is logged; nothing else logs a FencedError."""
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
    marker = f"{job_id}/{JOB_MARKER}"
    try:
        doc = json.loads(storage.read_bytes(marker).decode("utf-8"))
    except FileNotFoundError:
        return  # written by trainer 0 at start; absent only in layouts older than the marker
    except (ValueError, UnicodeDecodeError):
        raise CheckpointError(f"refusing to delete under {storage.uri}/{path}: the job marker {marker} is not valid JSON") from None
    if not isinstance(doc, dict) or doc.get("job_id") != job_id:
        raise CheckpointError(
            f"refusing to delete under {storage.uri}/{path}: the job marker {marker} names another job "
            f"({doc.get('job_id') if isinstance(doc, dict) else None!r})"
        )


def write_job_marker(storage: Storage, job_id: str) -> None:
    """Mark ``job_id``'s directory as a paddle-acp job (written once, by trainer 0): what
    :func:`check_deletable` asks of a directory before anything in it is deleted."""
    path = f"{job_id}/{JOB_MARKER}"
    if storage.exists(path):
        return
    storage.makedirs(job_id)
    body = {"format": "paddle-acp/job", "version": 1, "job_id": job_id, "created": time.time()}
    storage.write_bytes(path, json.dumps(body).encode())
