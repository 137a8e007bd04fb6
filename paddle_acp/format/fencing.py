"""Writer fencing: every start of a job's writer takes a new generation; an older one stops.

Generations are records ``{job}/writers/gen-<n>`` created with exclusive
semantics (local disks: ``O_CREAT | O_EXCL``; HDFS: a temporary file renamed
onto a name that must not exist; S3: check-then-write, which two writers
starting in the same instant can both pass). The newest record wins. A writer
checks, right before it makes a checkpoint visible and before retention deletes
anything, that its generation is still the newest; when it is not, it commits
nothing more and logs an error naming both generations.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from typing import Optional

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

WRITERS_DIR = "writers"
_GEN_RE = re.compile(r"\Agen-(0|[1-9][0-9]{0,17})\Z", re.ASCII)  # canonical ASCII decimal, in full
JOB_MARKER = "job.json"


class FencedError(CheckpointError):
    """A newer writer of the same job has started: this one commits nothing more."""


def writers_dir(job_id: str) -> str:
    return f"{job_id}/{WRITERS_DIR}"


def newest_generation(storage: Storage, job_id: str) -> int:
    """The newest generation recorded for the job; -1 when there is none."""
    best = -1
    storage.forget_cached(writers_dir(job_id))  # other processes' generations must be seen at once
    for e in storage.listdir(writers_dir(job_id)):
        m = _GEN_RE.fullmatch(e.name)
        if m and not e.is_dir and not e.is_link:
            best = max(best, int(m.group(1)))
    return best


def create_exclusive(storage: Storage, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True when this call created it
    (see :meth:`Storage.create_exclusive`: O_EXCL on local disks, a rename on HDFS)."""
    return storage.create_exclusive(path, data)


class Fence:
    """This process's generation as the writer of one job."""

    def __init__(self, storage: Storage, job_id: str, generation: int):
        self.storage = storage
        self.job_id = job_id
        self.generation = generation
        self.fenced_by: Optional[int] = None

    @classmethod
    def take(cls, storage: Storage, job_id: str, rank: int = 0) -> "Fence":
        """Record a new generation (newest + 1; on a race, the next free one)."""
        storage.makedirs(writers_dir(job_id))
        body = json.dumps({"format": "paddle-acp/writer", "version": 1, "job_id": job_id, "pid": os.getpid(),
                           "host": socket.gethostname(), "rank": rank, "started": time.time()}).encode()
        n = newest_generation(storage, job_id) + 1
        for _ in range(1000):
            if create_exclusive(storage, f"{writers_dir(job_id)}/gen-{n}", body):
                logger.info("job %s: this writer is generation %d", job_id, n)
                return cls(storage, job_id, n)
            n += 1
        raise StorageError(f"could not record a writer generation under {storage.uri}/{writers_dir(job_id)}")

    def check(self, what: str) -> None:
        """Raise FencedError (after logging it) unless this generation is still the newest."""
        if self.fenced_by is None:
            newest = newest_generation(self.storage, self.job_id)
            if newest > self.generation:
                self.fenced_by = newest
                logger.error(
                    "job %s: this writer (generation %d) is fenced: a newer writer of the same job started "
                    "(generation %d); it commits nothing more. Two processes act as the writer of job %s: "
                    "stop the older one, or give each job its own PADDLE_JOB_ID.",
                    self.job_id, self.generation, newest, self.job_id,
                )
        if self.fenced_by is not None:
            raise FencedError(
                f"job {self.job_id}: writer generation {self.generation} is fenced by generation {self.fenced_by}: "
                f"refusing to {what}"
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
