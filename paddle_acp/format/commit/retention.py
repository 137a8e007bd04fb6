"""Preservation: which checkpoints to keep, one pure function for every caller, and the one way to delete one.

:func:`preserve` looks at a range's checkpoints (or the node-local cache's copies), newest first, and gives
each a reason to keep it or to let it go. Its callers: the writer's retention after each commit
(:meth:`GlobalCheckpointer.apply_retention`, for every world size), ``paddle-acp gc``
(:mod:`paddle_acp.tools.gc`) and the node-local cache (:meth:`RangeCache._retain`). The rules, the never-lose
rules of all three:

* the newest ``keep`` committed checkpoints of a format this paddle-acp reads are kept (``keep`` <= 0: all);
* one of a newer format, or whose format cannot be read now, is never deleted, nor counted (:data:`FOREIGN`);
* the one a restart loads, when the caller knows it (``gc`` verifies), is kept beyond the newest ``keep``
  (:data:`RESTART`); when the caller found none to load, nothing committed goes (:data:`NO_RESTART`);
* what is not of the history a restart follows (``stale``: an uncommitted leftover old enough, a position
  abandoned before the newest commit, a cache copy of another history) goes (:data:`STALE`); any other
  uncommitted directory (a save may be writing it) stays (:data:`PENDING`).

What the caller then deletes goes through :func:`delete_checkpoint`, which removes the checkpoint's commit
file first (its ``manifest.json``, or the ``global.json`` of a checkpoint of several ranks), then the
directory: a half-deleted checkpoint is never mistaken for a committed one.
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
    """The reason for each of ``newest_first`` (a range's checkpoints, the newest first) to stay (:data:`NEWEST`,
    :data:`RESTART`, :data:`NO_RESTART`, :data:`FOREIGN`, :data:`PENDING`, :data:`ALL`) or to go (:data:`GONE`).
    ``committed(i)``: it is committed; ``known(i)``: its format is this paddle-acp's (asked of committed ones
    only: a caller whose ``known`` reads storage need not call this while at most ``keep`` are committed);
    ``stale(i)``: not of the history a restart follows (asked first); ``restart``: the checkpoint a restart
    loads, None when none can be loaded, :data:`UNKNOWN` when not looked for."""
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
    """The writer's retention: delete the checkpoints ``names`` of ``directory`` in that order (:func:`to_delete`'s,
    the oldest first), once this writer's fence holds and the directory is this job's own, reached through no
    link (:func:`~paddle_acp.format.commit.fencing.check_deletable`)."""
    if not names:
        return
    if fence is not None:
        fence.check("delete old checkpoints")
    check_deletable(storage, job_id, directory)
    for name in names:
        delete_checkpoint(storage, f"{directory}/{name}")
        logger.debug("retention: deleted checkpoint %s of %s", name, directory)


def delete_checkpoint(storage: Storage, path: str, committed: bool = True) -> None:
    """Delete the checkpoint directory ``path`` (``ckpt-N`` or ``ckpt-e<E>[-s<S>]``): when it is
    ``committed``, its commit file first, so that an interrupted deletion leaves an uncommitted
    leftover (never read, removed later) and never a checkpoint that looks whole."""
    if committed:
        storage.delete_file(f"{path}/{commit_file(path)}")
    storage.delete_dir(path)
