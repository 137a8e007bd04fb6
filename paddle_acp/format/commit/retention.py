"""Retention: which committed checkpoints to keep, and the one way to delete one.

A policy looks at the committed checkpoints of a range, oldest first, and says
which of them may go (:meth:`RetentionPolicy.to_remove`); what the caller then
deletes goes through :func:`delete_checkpoint`, which removes the checkpoint's
commit file first (its ``manifest.json``, or the ``global.json`` of a checkpoint
of several ranks), then the directory: a half-deleted checkpoint is never
mistaken for a committed one. The writer's retention
(:meth:`Checkpointer.apply_retention`, :meth:`GlobalCheckpointer.apply_retention`)
and ``paddle-acp gc`` delete this way.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import List, Sequence, TypeVar

from paddle_acp.format.layout import GLOBAL_NAME, MANIFEST_NAME, parse_name
from paddle_acp.storage.base import Storage

T = TypeVar("T")


class RetentionPolicy(abc.ABC):
    """Which of a range's committed checkpoints may be deleted."""

    @property
    def keeps_everything(self) -> bool:
        """True when :meth:`to_remove` never returns anything (callers need not list the range)."""
        return False

    @abc.abstractmethod
    def to_remove(self, committed: Sequence[T]) -> List[T]:
        """The checkpoints of ``committed`` (oldest first) that may be deleted, oldest first."""


@dataclasses.dataclass(frozen=True)
class KeepAll(RetentionPolicy):
    """Keep every checkpoint."""

    @property
    def keeps_everything(self) -> bool:
        return True

    def to_remove(self, committed: Sequence[T]) -> List[T]:
        return []


@dataclasses.dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the newest ``n`` checkpoints (``PADDLE_ACP_MAX_TO_KEEP``); ``n`` <= 0 keeps every one."""

    n: int

    @property
    def keeps_everything(self) -> bool:
        return self.n <= 0

    def to_remove(self, committed: Sequence[T]) -> List[T]:
        if self.n <= 0 or len(committed) <= self.n:
            return []
        return list(committed[:-self.n])


def policy_for(max_to_keep: int) -> RetentionPolicy:
    """The policy of a ``max_to_keep`` setting (<= 0: keep everything)."""
    return KeepAll() if max_to_keep <= 0 else KeepLast(max_to_keep)


def commit_file(name: str) -> str:
    """The file whose presence commits the checkpoint directory ``name`` (its last path element)."""
    return GLOBAL_NAME if parse_name(name.rsplit("/", 1)[-1]) is not None else MANIFEST_NAME


def delete_checkpoint(storage: Storage, path: str, committed: bool = True) -> None:
    """Delete the checkpoint directory ``path`` (``ckpt-N`` or ``ckpt-e<E>[-s<S>]``): when it is
    ``committed``, its commit file first, so that an interrupted deletion leaves an uncommitted
    leftover (never read, removed later) and never a checkpoint that looks whole."""
    if committed:
        storage.delete_file(f"{path}/{commit_file(path)}")
    storage.delete_dir(path)
