"""When to save: the save-decision policy, one pure object (``should_save(context) -> Decision``).

:class:`SaveDecisionPolicy` holds a range's save settings; :meth:`~SaveDecisionPolicy.should_save` answers, from
the facts of one moment (:class:`SaveContext`), whether a save is due there and what it does. It reads no clock and
does no I/O, so the same facts give the same decision on every rank. With several ranks only rank 0's plan decides
take or skip; waiting for this rank's previous checkpoint, or queueing behind it, never skips a taken point.
Preemption and final saves are durable: they wait for the previous checkpoint and are always taken.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from paddle_acp.config import AUTO_WAIT_FREE_S, AUTO_WAIT_SHARE

# actions: NONE (no save is due here), SAVE (the saver is idle), WAIT (for the previous checkpoint, then save),
# QUEUE (into the second buffer, written after the previous one), SKIP (not taken; the next due one is)
NONE, SAVE, WAIT, QUEUE, SKIP = "none", "save", "wait", "queue", "skip"
AUTO = "auto"  # the default busy policy: WAIT within the range's wait budget, else SKIP
# points of a range where a save may come due
EPOCH_END, STEP, PREEMPT, FINAL = "epoch end", "step", "preempt", "final"
# why a due save is skipped
BUSY, COSTLY, ARENA, PLAN = "busy", "costly", "arena", "plan"
# One writer, ``skip``/``auto``: at most this many due saves in a row are skipped while ARENA_SKIP_BYTES or more
# of the snapshot arena are still to be populated (seconds per GB on some hosts); the next populates the rest.
ARENA_SKIPS = 2
ARENA_SKIP_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class SaveContext:
    """The facts of one moment that a save decision depends on."""

    point: str  # EPOCH_END, STEP (a batch boundary of ``resumable``), PREEMPT or FINAL
    since_save: float = 0.0  # seconds since the last checkpoint was taken (or the loop started)
    busy: bool = False  # this rank's previous checkpoint is still being written
    plan: Optional[bool] = None  # several ranks: whether rank 0's save plan takes this point (None: not asked)
    step: Optional[int] = None  # STEP: batches done in the epoch
    every: Optional[int] = None  # STEP: ``save_every_steps``
    queue_free: bool = False  # no snapshot waits in the second buffer
    queue_fits: bool = False  # host memory allows the second buffer
    expected_wait: float = 0.0  # auto: how much longer the persist in flight is expected to take
    allowance: float = 0.0  # auto: the seconds training may still wait in this range
    arena_left: int = 0  # bytes of the snapshot arena still to be populated
    skips: int = 0  # due saves skipped in a row before this one


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a save at one point does: ``action`` (NONE: nothing is due), ``why`` a SKIP, and under ``auto``
    the longest a WAIT may take (``budget``; a wait that does not end within it skips the save, COSTLY)."""

    action: str
    why: str = ""
    budget: Optional[float] = None

    @property
    def due(self) -> bool:
        return self.action != NONE


NOT_DUE = Decision(NONE)


@dataclasses.dataclass(frozen=True)
class SaveDecisionPolicy:
    """A range's save settings and the one function of them that says when to save."""

    interval: float = 0.0  # seconds between checkpoints (0: every epoch end)
    busy_policy: str = AUTO
    synchronous: bool = False  # PADDLE_ACP_ASYNC=0: every save is written before training goes on
    several_ranks: bool = False

    def durable(self, point: str) -> bool:
        """Whether a save at ``point`` is written before training goes on (waits, never skipped)."""
        return point in (PREEMPT, FINAL) or self.synchronous

    def plan_point(self, c: SaveContext) -> Optional[str]:
        """Several ranks: the sequence of rank 0's save plan this point counts in (``due`` or ``interval``), or
        None (one writer, a durable save, or not a point of the plan)."""
        if not self.several_ranks or self.durable(c.point):
            return None
        if c.point == EPOCH_END:
            return "interval" if self.interval > 0 else "due"
        return "due" if c.point == STEP and _by_steps(c) else None

    def should_save(self, c: SaveContext) -> Decision:
        """Whether a save is due at ``c.point`` and what it does."""
        durable = self.durable(c.point)
        by_time_only = c.point == STEP and not _by_steps(c)  # a save due by the interval alone, mid-epoch
        if by_time_only and (self.several_ranks or self.interval <= 0 or c.since_save < self.interval):
            return NOT_DUE  # (several ranks take interval saves at epoch ends, as their plan says)
        if c.point == EPOCH_END and self.interval > 0 and (c.plan is False or (c.plan is None and not self.several_ranks
                                                                             and c.since_save < self.interval)):
            return NOT_DUE  # (several ranks: rank 0's clock said so through the plan)
        if c.plan is False and not durable:
            return Decision(SKIP, PLAN)
        d = self._busy(c, durable)
        if d.action == SKIP and by_time_only:
            return NOT_DUE  # stays due: taken at the first batch boundary after the previous checkpoint is written
        if (d.action == SAVE and not durable and not self.several_ranks and self.busy_policy in (SKIP, AUTO)
                and c.skips < ARENA_SKIPS and c.arena_left >= ARENA_SKIP_BYTES):
            return Decision(SKIP, ARENA)
        return d

    def _busy(self, c: SaveContext, durable: bool) -> Decision:
        """What a due save does while the previous checkpoint may still be written (the busy policy)."""
        if not c.busy:
            return Decision(SAVE)
        queue = self.busy_policy == QUEUE and c.queue_free and c.queue_fits
        if c.plan is True and not durable:  # the ranks' plan took it: waited for (or queued), never skipped
            return Decision(QUEUE if queue else WAIT)
        if durable or self.busy_policy == WAIT:
            return Decision(WAIT)
        if self.busy_policy == AUTO:
            return Decision(SKIP, COSTLY) if c.expected_wait > c.allowance else Decision(WAIT, budget=c.allowance)
        return Decision(QUEUE) if queue else Decision(SKIP, BUSY)

    def describe(self) -> str:
        """What a save due while the previous checkpoint is being written does (the start line)."""
        policy = self.busy_policy
        if self.several_ranks and policy != WAIT:
            return (f"a checkpoint still being written when the next comes due: rank 0's save plan takes every n-th "
                    f"due one (n about persist / time between due points, at most 8; PADDLE_ACP_BUSY_POLICY={policy})")
        what = {
            AUTO: (f"waits for it while the range's waits stay within {AUTO_WAIT_SHARE:.0%} of its time beyond its "
                   f"first {AUTO_WAIT_FREE_S:g} s, else it is skipped"),
            SKIP: "it is skipped",
            QUEUE: "it waits in a second host buffer when memory allows, else it is skipped",
            WAIT: "training waits for the previous one",
        }[policy]
        return f"a checkpoint due while the previous one is still being written: {what} (PADDLE_ACP_BUSY_POLICY={policy})"


def _by_steps(c: SaveContext) -> bool:
    return c.point == STEP and c.every is not None and c.step is not None and c.step % c.every == 0
