"""Preservation: which checkpoints to keep, one pure function for every caller, and the one way to delete one.

:func:`preserve` gives each of a range's checkpoints (or the node-local cache's copies), newest first, a reason to
stay or go, for the writer's retention (:meth:`GlobalCheckpointer.apply_retention`), ``paddle-acp gc``
(:mod:`paddle_acp.tools.gc`) and the cache (:meth:`RangeCache._retain`). The never-lose rules:

* the newest ``keep`` committed checkpoints of a format this paddle-acp reads stay (``keep`` <= 0: all);
* one of a newer format, or whose format cannot be read now, is never deleted, nor counted (:data:`FOREIGN`);
* the one a restart loads, when known, stays beyond ``keep`` (:data:`RESTART`); when none can be loaded,
  nothing committed goes (:data:`NO_RESTART`);
* what is off the restart's history (``stale``: an old leftover, a position abandoned before the newest commit,
  a cache copy of another history) goes (:data:`STALE`); other uncommitted directories stay (:data:`PENDING`).

:func:`delete_checkpoint` removes the commit file first: a half-deleted checkpoint never looks committed.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence, TypeVar

from paddle_acp.format.commit.fencing import Fence, check_deletable
from paddle_acp.format.layout import GLOBAL_NAME, MANIFEST_NAME, parse_name
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

T = TypeVar("T")

# reasons to keep
NEWEST, RESTART, NO_RESTART, FOREIGN, PENDING, ALL = "newest", "restart", "no-restart", "foreign", "pending", "all"
# reasons to delete
OLDER, STALE = "older", "stale"
GONE = (OLDER, STALE)
UNKNOWN: object = object()  # ``restart=UNKNOWN``: the caller did not look for the checkpoint a restart loads


def preserve(newest_first: Sequence[T], keep: int, committed: Callable[[T], bool] = lambda _i: True,
             known: Callable[[T], bool] = lambda _i: True, stale: Callable[[T], bool] = lambda _i: False,
             restart: object = UNKNOWN) -> List[str]:
    """Why each of ``newest_first`` stays (:data:`NEWEST`, :data:`RESTART`, :data:`NO_RESTART`, :data:`FOREIGN`,
    :data:`PENDING`, :data:`ALL`) or goes (:data:`GONE`). ``known(i)``: of a format this paddle-acp reads (asked of
    committed ones; need not read storage while at most ``keep`` are committed); ``stale(i)``: off the restart's
    history (asked first); ``restart``: what a restart loads (None: nothing can be; :data:`UNKNOWN`: not looked for)."""
    out: List[str] = []
    kept = 0
    for i in newest_first:
        if stale(i):
            out.append(STALE)
        elif not committed(i):
            out.append(PENDING)
        elif keep <= 0:
            out.append(ALL)
        elif not known(i):
            out.append(FOREIGN)
        elif restart is None:
            out.append(NO_RESTART)
        elif kept < keep:
            kept += 1
            out.append(NEWEST)
        else:
            out.append(RESTART if i is restart else OLDER)
    return out


def to_delete(newest_first: Sequence[T], reasons: Sequence[str]) -> List[T]:
    """The checkpoints :func:`preserve` lets go, the oldest first (the order they are deleted in)."""
    return [i for i, why in zip(reversed(newest_first), reversed(reasons)) if why in GONE]


def commit_file(name: str) -> str:
    """The file whose presence commits the checkpoint directory ``name`` (its last path element)."""
    return GLOBAL_NAME if parse_name(name.rsplit("/", 1)[-1]) is not None else MANIFEST_NAME


def delete_old(storage: Storage, job_id: str, directory: str, names: Sequence[str], fence: Optional[Fence]) -> None:
    """Delete ``names`` of ``directory`` in that order (oldest first), once the fence holds and
    :func:`~paddle_acp.format.commit.fencing.check_deletable` passes."""
    if not names:
        return
    if fence is not None:
        fence.check("delete old checkpoints")
    check_deletable(storage, job_id, directory)
    for name in names:
        delete_checkpoint(storage, f"{directory}/{name}")
        logger.debug("retention: deleted checkpoint %s of %s", name, directory)


def delete_checkpoint(storage: Storage, path: str, committed: bool = True) -> None:
    """Delete the checkpoint directory ``path``; when ``committed``, its commit file first, so an interrupted
    deletion leaves an uncommitted leftover, never a checkpoint that looks whole."""
    if committed:
        storage.delete_file(f"{path}/{commit_file(path)}")
    storage.delete_dir(path)
