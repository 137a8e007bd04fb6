"""StartCleanup: owns a writer's restart verdicts and its start's clean-up of what is newer than its base.

:meth:`StartCleanup.discard_newer` withdraws (rank 0) a committed checkpoint newer than the one resumed from only
when the restart proved it bad: read and failing verification (:data:`~.index.CORRUPT`) or of a proven-wrong
identity (:data:`~.index.MISFIT`). One the restart could not read, one of a newer format, one it did not try: kept,
and logged; this incarnation does not write at its position (:meth:`StartCleanup.check_writable`). Every deletion
passes :func:`~paddle_acp.format.commit.fencing.check_deletable` first (the job's own directory, no link, the job
marker naming this job). The restart's verdicts also tell the writer's retention what not to count
(:meth:`StartCleanup.restart_rejected`), and what the clean-up made sure of spares its first saves a look-up
(:meth:`StartCleanup.known_clear`). A collaborator of :class:`~.multirank.GlobalCheckpointer`, which gives it
the range's listing, the removal of this rank's part and the newer-format guard as callables.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Collection, Dict, List, Optional, Sequence, Set, Tuple

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.global_reader import GlobalEntry
from paddle_acp.format.commit.fencing import FencedError, check_deletable
from paddle_acp.format.layout import GLOBAL_NAME, parse_name, position_key

if TYPE_CHECKING:
    from paddle_acp.format.commit.fencing import Fence
    from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

PROVEN_BAD = (index.CORRUPT, index.MISFIT)  # the restart's verdicts that let a checkpoint be withdrawn


class StartCleanup:
    """The restart's verdicts and the start's clean-up of one rank's range (module docstring)."""

    def __init__(self, storage: "Storage", job_id: str, range_name: str, directory: str, rank: int,
                 fence: Optional["Fence"], scan: Callable[[], List[GlobalEntry]], remove_own: Callable[[str], None],
                 deletable: Callable[[GlobalEntry], bool]) -> None:
        """``directory``: the range's; ``scan``: its checkpoints, listed; ``remove_own``: remove this rank's part at
        a position (:func:`check_deletable` already passed); ``deletable``: False for a checkpoint of a newer
        format (the writer's guard, retention's too)."""
        self.storage = storage
        self.job_id = job_id
        self.range_name = range_name
        self.dir = directory
        self.rank = rank
        self.fence = fence  # this rank's writer fence: checked before each withdrawal
        self._scan = scan
        self._remove_own = remove_own
        self._deletable = deletable
        self._listed: Optional[List[GlobalEntry]] = None  # the restart's listing, used once by discard_newer
        # the restart's verdict on each committed checkpoint it passed over, less those a save of this incarnation
        # replaced since (restart_rejected); discard_newer judges by them only with the restart's listing
        self._verdicts: Dict[str, str] = {}
        self._kept: Dict[str, str] = {}  # positions kept though newer than the one resumed from -> why not usable
        # what discard_newer made sure of at start: no part of this rank at a position after ``_cleared_after``
        # (every position when None), except those named in ``_not_cleared`` (see known_clear)
        self._cleared = False
        self._cleared_after: Optional[Tuple[int, int]] = None
        self._not_cleared: Set[str] = set()

    def remember_listing(self, entries: Sequence[index.Entry], uncommitted: Collection[str] = (),
                         rejected: Sequence[index.Rejection] = ()) -> None:
        """Keep the range's checkpoints as the restart listed them (``uncommitted``: found not committed when
        loaded), for :meth:`discard_newer` to use once instead of listing again, and the restart's verdict on each
        committed one it did not load (``rejected``): only one proven bad is ever withdrawn."""
        out = []
        for e in entries:
            pos = parse_name(e.name) if e.layout == index.GLOBAL else None
            if pos is not None:
                out.append(GlobalEntry(e.name, pos[0], pos[1], e.committed and e.name not in uncommitted))
        self._listed = sorted(out, key=lambda g: g.key)
        self._verdicts = {r.entry.name: r.kind for r in rejected}

    def restart_rejected(self, name: str) -> bool:
        """Whether this incarnation's restart passed over committed checkpoint ``name`` (corrupt, unreadable, of a
        newer format, not fitting) and no save of it replaced it since: retention neither counts nor deletes it."""
        return name in self._verdicts

    def replaced(self, name: str) -> None:
        """This incarnation committed position ``name``: what its restart said of an earlier copy no longer holds."""
        self._verdicts.pop(name, None)

    def check_writable(self, name: str) -> None:
        """Refuse (StorageError) to write position ``name`` when it holds a checkpoint the start kept although newer
        than the one resumed from (it could not be read): never replaced, nor is the save skipped without a word."""
        why = self._kept.get(name)
        if why is not None:
            raise StorageError(
                f"checkpoint {name} of {self.storage.uri}/{self.dir} is not written: the position holds a committed "
                f"checkpoint that is kept: {why}. A restart tries it first; fix the storage (or the job marker), or "
                f"move {name} away to let this job save there")

    def _keep_unproven(self, g: GlobalEntry, kind: Optional[str]) -> None:
        """Keep committed ``g``, newer than the checkpoint resumed from but not proven bad, and say so once."""
        why = {index.UNREADABLE: "could not read", index.NEWER_FORMAT: "found of a newer format"}.get(
            kind or "", "did not try")
        if kind != index.NEWER_FORMAT:
            self._kept[g.name] = f"this job's restart {why} it (paddle-acp never deletes a checkpoint it could not read)"
        if self.rank == 0:
            logger.warning("range %s: keeping checkpoint %s although it is newer than the one resumed from: the restart "
                           "%s it (never withdrawn nor deleted unless proven bad); this run does not save at its "
                           "position", self.range_name, g.name, why)

    def discard_newer(self, key: Optional[Tuple[int, int]]) -> None:
        """At start: remove this rank's parts of positions newer than ``key`` (every one when None: they are
        re-trained); rank 0 also withdraws their global manifests. Uses the restart's listing when there is one,
        and then withdraws only a checkpoint the restart proved bad (without it, the caller vouches for that)."""
        listed, self._listed = self._listed, None
        verdicts = None if listed is None else self._verdicts  # (the restart's, when it listed the range)
        not_cleared: Set[str] = set()
        allowed: Optional[bool] = None  # check_deletable's answer, asked before the first deletion
        for g in self._scan() if listed is None else listed:
            if key is not None and g.key <= key:
                continue
            if g.committed and verdicts is not None and verdicts.get(g.name) not in PROVEN_BAD:
                self._keep_unproven(g, verdicts.get(g.name))
                not_cleared.add(g.name)
                continue
            if g.committed and not self._deletable(g):
                not_cleared.add(g.name)
                continue  # of a newer format: neither withdrawn nor is any part of it removed
            try:
                if allowed is None:
                    allowed = self._may_delete()
                if not allowed:
                    not_cleared.add(g.name)
                    if g.committed:
                        self._kept[g.name] = "may not be withdrawn (see the error above)"
                    continue
                if self.rank == 0 and g.committed:
                    if self.fence is not None:
                        self.fence.check(f"withdraw checkpoint {g.name}")
                    logger.warning("range %s: withdrawing checkpoint %s, %s", self.range_name, g.name,
                                   "newer than the one resumed from" if key is not None else "this fresh start trains its "
                                   "position again")
                    self.storage.delete_file(f"{self.dir}/{g.name}/{GLOBAL_NAME}")
                self._remove_own(g.name)
            except FencedError:
                return  # a newer incarnation of this rank started (said once, by the fence): it cleans up
            except (StorageError, CheckpointError) as exc:
                not_cleared.add(g.name)
                logger.warning("could not clean up %s/%s: %s", self.dir, g.name, exc)
        # its first save at a newer position needs no look-up for a part of its own there (known_clear)
        self._cleared, self._cleared_after, self._not_cleared = True, key, not_cleared

    def known_clear(self, name: str) -> bool:
        """Whether this rank knows without a look-up that it has no part at ``name``: :meth:`discard_newer` removed
        its parts newer than its base, and ``name`` is newer still (a zombie's part there never commits)."""
        if not self._cleared or name in self._not_cleared:
            return False
        pos = parse_name(name)
        return pos is not None and (self._cleared_after is None or position_key(*pos) > self._cleared_after)

    def _may_delete(self) -> bool:
        """:func:`check_deletable` of this range's directory; False (logged) when it refuses."""
        try:
            check_deletable(self.storage, self.job_id, self.dir)
            return True
        except CheckpointError as exc:
            logger.error("range %s: nothing newer than the checkpoint resumed from is withdrawn or removed: %s",
                         self.range_name, exc)
            return False
