"""Finding things under a storage root: the root itself, jobs, their ranges and job markers.

A job is a directory ``URI/<job id>/`` (a valid job id) holding ``job.json`` or ``range/``."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional
from urllib.parse import urlsplit, urlunsplit

from paddle_acp.config import is_valid_job_id, storage_options_from_env
from paddle_acp.errors import AcpError, StorageError
from paddle_acp.format.commit import fencing
from paddle_acp.format.layout import JOB_MARKER, MANIFEST_NAME
from paddle_acp.storage.base import Storage, redact
from paddle_acp.storage.schemes import open_storage
from paddle_acp.tools.render import natural_key

logger = logging.getLogger("paddle_acp")


class ToolError(AcpError):
    """An error the operator can fix: printed by the command line, exit status 2."""


def uri_join(uri: str, rel: str) -> str:
    """``uri`` + '/' + ``rel``, keeping a query string (``s3://b/p?endpoint=..``) at the end."""
    if not rel:
        return uri
    if "://" in uri:
        parts = urlsplit(uri)
        path = parts.path.rstrip("/") + "/" + rel
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))
    return uri.rstrip("/") + "/" + rel


def short_reason(exc: BaseException, path: str) -> str:
    """An error's message without the checkpoint's own path (the table shows it already)."""
    msg = str(exc)
    for prefix in (f"{path}/", f"{path}: "):
        msg = msg.replace(prefix, "")
    return msg


def open_root(uri: str) -> Storage:
    """Open a storage root that must exist."""
    storage = open_storage(uri, storage_options_from_env())  # ConfigError (an AcpError) names the URI
    try:
        exists = storage.exists("")
    except StorageError as exc:
        raise ToolError(f"cannot reach storage root {redact(uri)!r}: {exc}") from exc
    if not exists:
        raise ToolError(f"storage root {redact(uri)!r} does not exist")
    return storage


def _is_job_dir(storage: Storage, name: str) -> bool:
    return storage.exists(f"{name}/{JOB_MARKER}") or storage.exists(f"{name}/range")


def list_jobs(storage: Storage) -> List[str]:
    # a job directory may be a link the operator made (links inside a job are never followed)
    jobs = [e.name for e in storage.listdir("")
            if (e.is_dir or e.is_link) and is_valid_job_id(e.name) and _is_job_dir(storage, e.name)]
    return sorted(jobs, key=natural_key)


def _no_jobs_error(storage: Storage) -> ToolError:
    hint = ""
    if storage.exists(JOB_MARKER) or storage.exists("range"):
        hint = " (it looks like a job directory itself: pass its parent as URI and its name as --job)"
    elif storage.exists(MANIFEST_NAME):
        hint = " (it looks like a checkpoint directory: use `paddle-acp inspect` on it)"
    return ToolError(f"no paddle-acp jobs under {storage.uri!r} (expected URI/JOB_ID/{JOB_MARKER}){hint}")


def select_jobs(storage: Storage, job: Optional[str]) -> List[str]:
    """[job] when it exists, every job without ``job``; ToolError otherwise."""
    if job is not None:
        if not is_valid_job_id(job):
            raise ToolError(f"{job!r} is not a valid job id")
        if not _is_job_dir(storage, job):
            jobs = list_jobs(storage)
            have = f"; jobs there: {', '.join(jobs)}" if jobs else "; there are no jobs there"
            raise ToolError(f"job {job!r} not found under {storage.uri!r}{have}")
        return [job]
    jobs = list_jobs(storage)
    if not jobs:
        raise _no_jobs_error(storage)
    return jobs


def single_job(storage: Storage, job: Optional[str]) -> str:
    jobs = select_jobs(storage, job)
    if len(jobs) > 1:
        raise ToolError(f"{storage.uri!r} holds several jobs ({', '.join(jobs)}): choose one with --job")
    return jobs[0]


def list_ranges(storage: Storage, job: str) -> List[str]:
    """The range directories of a job (symbolic links are not followed: not listed)."""
    if storage.kind(f"{job}/range") == "link":
        logger.warning("ignoring %s/%s/range: a symbolic link (links inside a job are never followed)", storage.uri, job)
        return []
    return sorted((e.name for e in storage.listdir(f"{job}/range") if e.is_dir), key=natural_key)


def read_job_marker(storage: Storage, job: str) -> Dict[str, Any]:
    """The job's marker as :func:`~paddle_acp.format.commit.fencing.read_job_marker` checks it; {} when there is none
    or it is unusable (one warning naming it: the writer's retention deletes nothing while it is)."""
    try:
        return fencing.read_job_marker(storage, job) or {}
    except (AcpError, OSError) as exc:
        logger.warning("ignoring the job marker of job %s: %s (a training run's retention deletes nothing while "
                       "it is unusable: fix or remove it)", job, exc)
        return {}
