"""The coordination interface (what each verb is for: :mod:`paddle_acp.runtime.coord`), its error and links."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Generic, Hashable, List, Optional, Sequence, TypeVar

from paddle_acp.errors import CheckpointError

logger = logging.getLogger("paddle_acp")

K = TypeVar("K", bound=Hashable)
L = TypeVar("L")
LinkT = TypeVar("LinkT", bound="Link")


class CoordinationError(CheckpointError):
    """This rank lost the job's store (rank 0 gone or unreachable): it stops; nothing committed is touched."""


class Coordinator:
    """One range's coordination on one rank."""

    kind = "storage"
    instant = False  # a posted decision reads back within one round trip (a store: yes; storage: no)

    def post(self, key: str, value: bytes) -> None:
        """Rank 0: post the newest decision under ``key``, replacing the one before."""
        raise NotImplementedError

    def latest(self, key: str, limit: int) -> Optional[bytes]:
        """The newest decision posted under ``key`` (at most ``limit`` bytes), or None when none was."""
        raise NotImplementedError

    def arrive(self, key: str, note: Optional[bytes] = None, rank: int = 0) -> None:
        """Rank ``rank`` reached ``key`` (counted once per call); ``note``: its small record, replacing the one
        before, which rank 0 reads with :meth:`notes`."""

    def arrive_soon(self, key: str) -> None:
        """Count in at ``key`` without waiting (sent once the store is open; a failure is told by a later call)."""

    def arrivals(self, key: str) -> Optional[int]:
        """How many ranks reached ``key``, or None when only storage can tell."""
        return None

    def counts(self, keys: Sequence[str]) -> Optional[List[int]]:
        """How many ranks reached each of ``keys`` (one round trip), or None when only storage can tell."""
        return None

    def notes(self, ranks: Sequence[int], limit: int) -> Optional[List[Optional[bytes]]]:
        """The newest note of each of ``ranks`` (None where none, or over ``limit`` bytes), or None when only
        storage can tell."""
        return None

    def check(self) -> None:
        """CoordinationError once this rank lost the job's store (never blocks)."""

    def close(self) -> None:
        """The range ended: finish this rank's part of its coordination (bounded, never raises)."""


class Link:
    """A process's link to a coordination server: lost at most once, for the first reason, said once."""

    # a loss as logged and as raised: ``{where}`` is the server, ``{why}`` the reason
    LOST_SAID = "the link to {where} is lost: {why}"
    LOST_ERROR = "the link to {where} is lost: {why}"

    def __init__(self, rank: int, where: object) -> None:
        self.rank = rank
        self.where = where
        self.lost: Optional[str] = None  # why the link was lost (every later call raises at once)
        self._lock = threading.Lock()

    def _lose(self, why: str) -> CoordinationError:
        """Mark the link lost for ``why`` (unless it already is; the first loss is logged): the error to raise."""
        with self._lock:
            first = self.lost is None
            if first:
                self.lost = why
        if first:
            logger.error("rank %d: %s. Nothing more is coordinated through it (nothing committed is touched)",
                         self.rank, self.LOST_SAID.format(where=self.where, why=why))
        return CoordinationError(f"rank {self.rank}: " + self.LOST_ERROR.format(where=self.where, why=self.lost or why))

    def check(self) -> None:
        """CoordinationError once the link is lost."""
        if self.lost is not None:
            raise self._lose(self.lost)


class ServerCoordinator(Coordinator, Generic[LinkT]):
    """Coordination through a server (the job's store, etcd) on this process's ``link``, keys under ``prefix``."""

    instant = True

    def __init__(self, link: LinkT, prefix: str) -> None:
        self.link = link
        self.prefix = prefix


class Links(Generic[K, L]):
    """A process's links to one kind of coordination server, one per key (a lost link stays lost)."""

    def __init__(self) -> None:
        self._links: Dict[K, L] = {}
        self._lock = threading.Lock()

    def get(self, key: K, make: Callable[[], L]) -> L:
        """The link under ``key``, made by ``make`` the first time."""
        with self._lock:
            link = self._links.get(key)
            if link is None:
                link = self._links[key] = make()
            return link
