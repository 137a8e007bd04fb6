"""Save schedule: owns a range's clock since its last checkpoint, its ``auto`` wait budget and its save plan.

:class:`SaveSchedule` gathers the facts the pure save-decision policy decides on (and, with several ranks, asks
rank 0's save plan, :class:`~paddle_acp.runtime.agree.Agreement`); it does no I/O of its own beyond the plan's.
Under ``auto`` a due save that finds the previous checkpoint still being written waits for it as long as all such
waits of the range stay within :data:`~paddle_acp.config.AUTO_WAIT_SHARE` of its time beyond its first
:data:`~paddle_acp.config.AUTO_WAIT_FREE_S`; a save whose wait would pass that is skipped.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Deque, Optional

from paddle_acp.config import AUTO_WAIT_FREE_S, AUTO_WAIT_SHARE
from paddle_acp.runtime.agree import Agreement, Planner
from paddle_acp.runtime.save_decision import Decision, SaveContext, SaveDecisionPolicy

PERSISTS_KEPT = 3  # auto: a persist in flight is expected to take as long as the longest of the last few


class SaveSchedule:
    """The facts one range's save decisions are made on: its clock, its ``auto`` budget, the ranks' save plan."""

    def __init__(self, interval: float, busy_policy: str, agreement: Optional[Agreement],
                 synchronous: bool = False) -> None:
        """``interval``: seconds between checkpoints (0: every epoch); ``agreement``: several ranks' save plan."""
        self.policy = SaveDecisionPolicy(interval, busy_policy, synchronous, agreement is not None)
        self.agreement = agreement
        self.last_save = time.monotonic()
        self.loop_start = self.last_save
        self.waited_s = 0.0  # auto: the range's waits for the previous checkpoint
        self._persists: Deque[float] = collections.deque(maxlen=PERSISTS_KEPT)
        self._persist_since: Optional[float] = None  # when the persist in flight began

    @property
    def interval(self) -> float:
        return self.policy.interval

    @property
    def busy_policy(self) -> str:
        return self.policy.busy_policy

    def set_busy_policy(self, policy: str) -> None:
        """Change the busy policy of this range's later saves (Paddle's API takes every due save), rank 0's save plan's
        too (several ranks: the plan decides which due points they take)."""
        self.policy = dataclasses.replace(self.policy, busy_policy=policy)
        if self.agreement is not None:
            self.agreement.tell(lambda planner, now: setattr(planner, "policy", policy))

    def decide(self, ctx: SaveContext, at: Optional[str]) -> Decision:
        """The policy's decision on ``ctx`` with this range's clock and ``auto`` budget. Several ranks, with ``at``
        (the position): rank 0's save plan is asked first at one of its due points."""
        plan = ctx.plan
        kind = self.policy.plan_point(ctx) if plan is None else None
        if kind is not None and at is not None:
            assert self.agreement is not None  # (plan points are of several ranks)
            plan = self.agreement.point(kind, ctx.busy, at)[1]
        return self.policy.should_save(dataclasses.replace(
            ctx, plan=plan, since_save=time.monotonic() - self.last_save, expected_wait=self.expected_wait(),
            allowance=self.wait_allowance()))

    def start(self, base: Optional[str]) -> None:
        """Several ranks, when the range opens: rank 0 writes a fresh save plan (``base``: the checkpoint resumed)."""
        if self.agreement is not None:
            self.agreement.start(base)

    def restart_clock(self, partial: bool = False) -> None:
        """The loop starts: the interval counts from now (``partial``: its first epoch resumes mid-epoch)."""
        self.last_save = self.loop_start = time.monotonic()
        if self.agreement is not None:
            self.agreement.tell(lambda planner, now: planner.restart_clock(now, partial))

    def wait_allowance(self) -> float:
        """``auto``: the seconds training may still wait for the previous checkpoint now."""
        budget = AUTO_WAIT_FREE_S + AUTO_WAIT_SHARE * (time.monotonic() - self.loop_start)
        return max(0.0, budget - self.waited_s)

    def expected_wait(self) -> float:
        """``auto``: how much longer the persist in flight is expected to take (the longest of the last few; before
        any ended, as long again as it took so far)."""
        since = self._persist_since
        if since is None:
            return 0.0
        so_far = time.monotonic() - since
        return max(0.0, max(self._persists) - so_far) if self._persists else so_far

    def saved(self) -> None:
        """A checkpoint was taken now."""
        self.last_save = time.monotonic()

    @property
    def agreed(self) -> bool:
        """Several ranks: rank 0's save plan decides the due points."""
        return self.agreement is not None

    def close(self) -> None:
        """The range ended: rank 0's save-plan write still in flight is done (:meth:`Agreement.close`)."""
        if self.agreement is not None:
            self.agreement.close()

    def point_done(self) -> None:
        """Several ranks: this rank is done with a due point (taken or skipped)."""
        if self.agreement is not None:
            self.agreement.tell(Planner.point_done)

    def persist_started(self) -> None:
        """A checkpoint's persist began."""
        self._persist_since = time.monotonic()
        if self.agreement is not None:
            self.agreement.tell(Planner.persist_started)

    def persist_ended(self) -> None:
        """A checkpoint's persist ended (rank 0: its global commit was decided), from the saver's or committer's."""
        since, self._persist_since = self._persist_since, None
        if since is not None:
            self._persists.append(time.monotonic() - since)
        if self.agreement is not None:
            self.agreement.tell(Planner.persist_ended)
