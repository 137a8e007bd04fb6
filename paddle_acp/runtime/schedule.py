"""Save schedule: owns when a range's checkpoints come due and what a due one does while one is written.

:class:`SaveSchedule` holds the range's save interval (``save_checkpoint_inter``), its clock since
the last checkpoint, the busy policy (``PADDLE_ACP_BUSY_POLICY``) and, with several ranks, rank 0's
save plan (:class:`~paddle_acp.runtime.agree.Agreement`). Its answers are small decisions: whether
the interval passed, whether the ranks' plan takes a due point, and what a due save does while the
previous checkpoint is still being written (:func:`~paddle_acp.runtime.saver.busy_action`). What it
is told (whether the saver is busy, whether the second buffer fits) comes in as arguments: it does
no I/O of its own beyond the plan's.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from paddle_acp.runtime.agree import Agreement, agreed_action
from paddle_acp.runtime.saver import QUEUE, busy_action


class SaveSchedule:
    """The due points of one range's checkpoints and the busy-policy decision at each."""

    def __init__(self, interval: float, busy_policy: str, agreement: Optional[Agreement]) -> None:
        """``interval``: seconds between checkpoints (0: every epoch); ``agreement``: several ranks'
        save plan (None for one writer)."""
        self.interval = interval
        self.busy_policy = busy_policy
        self.agreement = agreement
        self.last_save = time.monotonic()

    def set_busy_policy(self, policy: str) -> None:
        """Change the busy policy of this range's later saves (Paddle's API takes every due save)."""
        self.busy_policy = policy

    def start(self, base: Optional[str]) -> None:
        """Several ranks, when the range opens: rank 0 writes a fresh save plan (before any training
        step); ``base``: the global checkpoint this incarnation resumed from."""
        if self.agreement is not None:
            self.agreement.start(base)

    def restart_clock(self) -> None:
        """The loop starts: the interval counts from now."""
        self.last_save = time.monotonic()
        if self.agreement is not None:
            self.agreement.restart_clock()

    def saved(self) -> None:
        """A checkpoint was taken now."""
        self.last_save = time.monotonic()

    def interval_due(self, busy: bool, at: str) -> bool:
        """Whether ``save_checkpoint_inter`` seconds have passed. Several ranks: whether rank 0's
        save plan takes this epoch end (rank 0's clock alone decides, :mod:`~paddle_acp.runtime.agree`)."""
        if self.interval <= 0:
            return True
        if self.agreement is not None:
            return self.agreed_point("interval", busy, at)
        return time.monotonic() - self.last_save >= self.interval

    @property
    def agreed(self) -> bool:
        """Several ranks: rank 0's save plan decides the due points."""
        return self.agreement is not None

    def close(self) -> None:
        """The range ended: rank 0's save-plan write still in flight is done (a later start's plan is never
        overwritten by it)."""
        if self.agreement is not None:
            self.agreement.finish()

    def point_done(self) -> None:
        """Several ranks: this rank is done with a due point (taken or skipped)."""
        if self.agreement is not None:
            self.agreement.point_done()

    def persist_started(self) -> None:
        """Several ranks: a checkpoint's persist began (rank 0 sizes its plan by the persist time)."""
        if self.agreement is not None:
            self.agreement.persist_started()

    def persist_ended(self) -> None:
        """Several ranks: a checkpoint's persist ended (rank 0: its global commit was decided)."""
        if self.agreement is not None:
            self.agreement.persist_ended()

    def agreed_point(self, kind: str, busy: bool, at: str) -> bool:
        """Several ranks: this rank's next due point of ``kind`` (at ``at``); whether the save plan takes it."""
        assert self.agreement is not None
        return self.agreement.point(kind, busy, at)[1]

    def busy_action(self, durable: bool, agreed: bool, busy: bool, queue_free: Callable[[], bool],
                    queue_fits: Callable[[], bool]) -> str:
        """What a save due now does (:func:`~paddle_acp.runtime.saver.busy_action` with this range's
        policy; ``agreed``: the ranks' save plan took this point, so it is not skipped). ``busy``: the
        previous checkpoint is being written; ``queue_free()``: the saver's queue has room;
        ``queue_fits()``: whether the second buffer fits (both asked only when the queue would be used)."""
        free = busy and self.busy_policy == QUEUE and queue_free()
        fits = free and queue_fits()
        if agreed and not durable:
            return agreed_action(True, busy, self.busy_policy, free, fits)
        return busy_action(self.busy_policy, busy, durable, free, fits)
