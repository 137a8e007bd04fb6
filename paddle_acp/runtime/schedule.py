"""Save schedule: owns when a range's checkpoints come due and what a due one does while one is written.

:class:`SaveSchedule` holds the range's save interval (``save_checkpoint_inter``), its clock since
the last checkpoint, the busy policy (``PADDLE_ACP_BUSY_POLICY``) and, with several ranks, rank 0's
save plan (:class:`~paddle_acp.runtime.agree.Agreement`). Its answers are small decisions: whether
the interval passed, whether the ranks' plan takes a due point, and what a due save does while the
previous checkpoint is still being written (:func:`~paddle_acp.runtime.saver.busy_action`). What it
is told (whether the saver is busy, whether the second buffer fits) comes in as arguments: it does
no I/O of its own beyond the plan's.

The default policy, ``auto``, holds the range's wait budget: a due save that finds the previous
checkpoint still being written waits for it as long as all such waits of the range stay within
:data:`~paddle_acp.config.AUTO_WAIT_SHARE` (5 %) of the range's time beyond its first
:data:`~paddle_acp.config.AUTO_WAIT_FREE_S` (2 s); a save whose wait would pass that (the persist
in flight is expected to take longer, or did not end within the allowance) is skipped. Small
checkpoints between short epochs are all taken (waits of milliseconds); large ones that take
longer to write than the training between them are skipped, as under ``skip``, and cost the
training at most that share.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Optional

from paddle_acp.config import AUTO_WAIT_FREE_S, AUTO_WAIT_SHARE
from paddle_acp.runtime.agree import Agreement, agreed_action
from paddle_acp.runtime.saver import AUTO, QUEUE, SKIP, WAIT, busy_action

PERSISTS_KEPT = 3  # auto: a persist in flight is expected to take as long as the longest of the last few


def describe_policy(policy: str, several_ranks: bool) -> str:
    """What a save that comes due while the previous checkpoint is still being written does (the start line)."""
    if several_ranks and policy != WAIT:
        return (f"a checkpoint still being written when the next comes due: rank 0's save plan takes every n-th "
                f"due one (n about persist / time between due points, at most 8; PADDLE_ACP_BUSY_POLICY={policy})")
    what = {
        AUTO: (f"waits for it while the range's waits stay within {AUTO_WAIT_SHARE:.0%} of its time beyond its first "
               f"{AUTO_WAIT_FREE_S:g} s, else it is skipped"),
        SKIP: "it is skipped",
        QUEUE: "it waits in a second host buffer when memory allows, else it is skipped",
        WAIT: "training waits for the previous one",
    }[policy]
    return f"a checkpoint due while the previous one is still being written: {what} (PADDLE_ACP_BUSY_POLICY={policy})"


class SaveSchedule:
    """The due points of one range's checkpoints and the busy-policy decision at each."""

    def __init__(self, interval: float, busy_policy: str, agreement: Optional[Agreement]) -> None:
        """``interval``: seconds between checkpoints (0: every epoch); ``agreement``: several ranks'
        save plan (None for one writer)."""
        self.interval = interval
        self.busy_policy = busy_policy
        self.agreement = agreement
        self.last_save = time.monotonic()
        self.loop_start = self.last_save
        self.waited_s = 0.0  # auto: the range's waits for the previous checkpoint
        self._persists: Deque[float] = collections.deque(maxlen=PERSISTS_KEPT)
        self._persist_since: Optional[float] = None  # when the persist in flight began

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
        self.last_save = self.loop_start = time.monotonic()
        if self.agreement is not None:
            self.agreement.restart_clock()

    def wait_allowance(self) -> float:
        """``auto``: the seconds training may still wait for the previous checkpoint now (the budget less the
        range's waits so far)."""
        budget = AUTO_WAIT_FREE_S + AUTO_WAIT_SHARE * (time.monotonic() - self.loop_start)
        return max(0.0, budget - self.waited_s)

    def expected_wait(self) -> float:
        """``auto``: how much longer the persist in flight is expected to take: the longest of the last few less
        its time so far; before any ended, as long again as it took so far."""
        since = self._persist_since
        if since is None:
            return 0.0
        so_far = time.monotonic() - since
        return max(0.0, max(self._persists) - so_far) if self._persists else so_far

    def persist_took(self, seconds: float) -> None:
        """One writer: the persist in flight ended after ``seconds`` (on the saver's thread)."""
        self._persists.append(seconds)
        self._persist_since = None

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
        overwritten by it), and this rank joined the store's open (Agreement.close)."""
        if self.agreement is not None:
            self.agreement.close()

    def point_done(self) -> None:
        """Several ranks: this rank is done with a due point (taken or skipped)."""
        if self.agreement is not None:
            self.agreement.point_done()

    def persist_started(self) -> None:
        """A checkpoint's persist began (auto; several ranks: rank 0 sizes its plan by the persist time)."""
        self._persist_since = time.monotonic()
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
