"""Saves of several ranks decided together: rank 0's save plan, posted through the ranks' coordinator, read by every rank.

Every rank counts its due points alike, in two sequences (``due``: epoch ends when every epoch saves and
``save_every_steps`` boundaries; ``interval``: epoch ends when ``save_checkpoint_inter`` > 0), and takes a due
point exactly when the plan (:class:`~paddle_acp.format.save_plan.SavePlan`) says so. Only rank 0's clock decides
(:class:`Planner`, pure). A sequence's points fall in blocks of ``H`` (block ``b`` >= 1 from point
``s = b*H - O`` on, :func:`blocks`); the plan changes only at a block's first point. Rank 0 decides the block at
``s`` at its point ``s - W`` and writes it in the background, waiting for that write at ``s - W + 1``; every other
rank starts one read at ``s - W + 2`` and uses it from ``s`` on. Data-parallel ranks are in lockstep through their
gradient collectives, so that read sees every change rank 0 made for the block. Through a store
(``Coordinator.instant``) ``W`` is 1: rank 0 posts the block before it passes ``s - 1``, the others read it at
``s``. Without lockstep a rank may decide on an older plan: the ranks then disagree on a checkpoint, which is
abandoned (a global checkpoint needs every part), never resumed wrongly, and the rank warns.

The busy policy becomes a stride: under ``skip`` and ``queue`` rank 0 takes every ``s``-th due point, ``s`` about
the persist time over the time between due points, at most :data:`MAX_STRIDE`. Interval saves: once
``save_checkpoint_inter`` seconds of rank 0's clock passed (and, but under ``wait``, its previous checkpoint is
written), it asks for one at the next block's first interval point. Final and preemption saves are outside the plan.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import uuid
from typing import Callable, Deque, Dict, List, Optional, Tuple

from paddle_acp.errors import AcpError, CorruptCheckpointError
from paddle_acp.format.commit.fencing import Fence, FencedError
from paddle_acp.format.save_plan import MAX_PLAN_SIZE, PLAN_NAME, SavePlan
from paddle_acp.runtime.coord.base import Coordinator
from paddle_acp.runtime.coord.files import StorageCoordinator
from paddle_acp.runtime.save_decision import WAIT
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

MAX_STRIDE = 8  # every K-th due point at least is taken (waiting for the previous checkpoint if need be)
# (H, W) per sequence; O: block b >= 1 begins at point b*H - O (due: the second block is decided at point 0)
SCHEDULE = {"due": (4, 3), "interval": (2, 3)}
OFFSET = {"due": 1, "interval": 0}
# through a store (Coordinator.instant): W = 1, the first block is point 0 alone
INSTANT_SCHEDULE = {"due": (4, 1), "interval": (2, 1)}
INSTANT_OFFSET = {"due": 3, "interval": 1}


def blocks(kind: str, instant: bool) -> Tuple[int, int, int]:
    """(H, W, O) of the sequence ``kind`` when the plan travels through storage or (``instant``) a store."""
    h, w = (INSTANT_SCHEDULE if instant else SCHEDULE)[kind]
    return h, w, (INSTANT_OFFSET if instant else OFFSET)[kind]


MARGIN = 1.2  # the stride covers the persist time with this margin
# a shorter stride is planned only when it is at most this fraction of the current one (no plan write for 7 vs 8)
SHORTEN_BELOW = 0.8
PERSIST_WINDOW = 4  # the persist time planned for: the longest of this many last persists
READ_TIMEOUT = 60.0  # seconds a rank waits at a due point for its read of the plan
_TORN_RETRIES = 5


def initial_plan(range_name: str, base: Optional[str], token: str) -> SavePlan:
    """The plan every rank holds before it reads one: every due point."""
    return SavePlan(range_name, base, token, default_stride=1)


class Planner:
    """Rank 0's decisions (the only clock that decides). No I/O, no clock reads: ``now`` is passed in."""

    def __init__(self, plan: SavePlan, policy: str, interval: float, now: float, floor: float = 0.0,
                 instant: bool = False) -> None:
        """``floor``: the least a persist takes on this storage before any is measured; ``instant``: a store."""
        self.plan = plan
        self.instant = instant
        self.policy = policy
        self.interval = interval
        self._last_due: Optional[float] = None
        self.gap: Optional[float] = None  # seconds between due points (moving average)
        self.floor = floor
        self.planned_for = 0.0  # the persist time the last decision planned for (logged)
        self.persist = 0.0  # the longest of the last PERSIST_WINDOW persists' seconds (submit to end)
        self._persists: Deque[float] = collections.deque(maxlen=PERSIST_WINDOW)
        # the start times of the persists in flight, oldest first (the next may start before a commit ended)
        self._inflight: Deque[float] = collections.deque()
        self._last_interval = now

    def restart_clock(self, now: float, partial: bool = False) -> None:
        """The loop starts: interval saves count from now, and so does the first gap between due points
        (``partial``: the first epoch resumes mid-epoch and its length says nothing: the second point's gap is)."""
        self._last_interval = now
        self._last_due = None if partial else now

    def point_done(self, now: float) -> None:
        """The due point's save (or skip) returned: the time to the next one is training time."""
        self._last_due = now

    def persist_started(self, now: float) -> None:
        self._inflight.append(now)

    def persist_ended(self, now: float) -> None:
        """The oldest persist in flight ended (called from the saver's or the committer's thread)."""
        if self._inflight:
            self._persists.append(now - self._inflight.popleft())
            self.persist = max(self._persists)

    def estimate(self, now: float) -> float:
        """The persist time: the longest of the last few (one slow write in a few would otherwise make every rank
        wait), or longer while the oldest in flight has taken longer; before any ended, at least the floor."""
        known = self.persist if self._persists else max(self.persist, self.floor)
        inflight = list(self._inflight)[:1]  # (a copy: another thread may end it meanwhile)
        if not inflight:
            return known
        return max(known, now - inflight[0])

    def at(self, kind: str, index: int, now: float, busy: bool) -> Optional[SavePlan]:
        """Rank 0 at point ``index`` of ``kind``: the new plan to publish (for the next block), or None."""
        h, w, o = blocks(kind, self.instant)
        decide = (index + o + w) % h == 0
        if kind == "interval":
            return self._interval(index, now, busy, index + w if decide else None)
        if self._last_due is not None:
            gap = now - self._last_due
            self.gap = gap if self.gap is None else 0.5 * self.gap + 0.5 * gap
        self._last_due = now
        if not decide or self.policy == WAIT or not self.gap or self.gap <= 0:
            return None
        start = index + w
        if self.plan.strides and self.plan.strides[-1][0] >= index:
            return None  # the previous change does not hold yet
        anchor, stride = self.plan.stride_at(start)
        self.planned_for = self.estimate(now)
        want = max(1, min(MAX_STRIDE, math.ceil(MARGIN * self.planned_for / self.gap)))
        if want == stride or stride * SHORTEN_BELOW < want < stride:
            return None
        # anchored at a point the current plan takes (no streak of skips longer than the larger stride): a longer
        # stride counts from the last point taken before the block, else from the block's first point taken
        last = start - 1 - (start - 1 - anchor) % stride
        anchor = last if last + want >= start else start + (anchor - start) % stride
        self.plan = self.plan.with_stride(anchor, want)
        return self.plan

    def _interval(self, index: int, now: float, busy: bool, start: Optional[int]) -> Optional[SavePlan]:
        if index in self.plan.requests:
            self._last_interval = now  # taken now
        if start is None or any(r > index for r in self.plan.requests):
            return None  # not a point that decides, or one asked for already
        if now - self._last_interval < self.interval:
            return None
        if busy and self.policy != WAIT:
            return None  # stays due: asked for once the previous checkpoint is written
        self.plan = self.plan.with_request(start)
        return self.plan


class Agreement:
    """One range's due points on one rank: counts them; rank 0 publishes the plan, the others read it."""

    def __init__(self, storage: Storage, range_dir: str, range_name: str, rank: int, policy: str,
                 interval: float, base: Optional[str] = None, fence: Optional[Fence] = None,
                 coord: Optional[Coordinator] = None) -> None:
        """``fence``: checked before rank 0 writes a plan; ``coord``: how the plan travels (None: ``plan.json`` on
        ``storage``). Until a persist is measured rank 0 plans on two small writes (a part's, the global manifest)."""
        self.coord = coord if coord is not None else StorageCoordinator(storage, range_dir)
        self.range_name = range_name
        self.rank = rank
        self.base = base
        self.fence = fence
        self.counts = {"due": 0, "interval": 0}
        self.plan = initial_plan(range_name, base, "-")  # until one is read
        self.instant = self.coord.instant
        self.planner = Planner(self.plan, policy, interval, time.monotonic(),
                               floor=2 * max(fence.took_s if fence is not None else 0.0, storage.small_write_s),
                               instant=self.instant) if rank == 0 else None
        self._pending: Dict[str, Tuple[threading.Thread, List[Optional[SavePlan]]]] = {}
        self._history: Deque[Tuple[str, int, bool, str]] = collections.deque(maxlen=8)
        self.disagreements = 0
        self.read_failures = 0
        self.write_failures = 0
        # rank 0's plan write in flight: (its thread, the plan before it, what it raised)
        self._writing: Optional[Tuple[threading.Thread, Optional[SavePlan], List[BaseException]]] = None

    def start(self, base: Optional[str]) -> None:
        """At the range's open: rank 0 writes a fresh plan in the background (waited for at its first due point)."""
        self.finish()
        self.base = base
        self.plan = initial_plan(self.range_name, base, "-")
        if self.planner is None:
            return
        self.planner.plan = self.plan = initial_plan(self.range_name, base, uuid.uuid4().hex[:16])
        self._publish(self.planner.plan, None)

    def tell(self, event: Callable[[Planner, float], None]) -> None:
        """Rank 0: tell its planner of the loop's ``event`` now; the other ranks have none."""
        if self.planner is not None:
            event(self.planner, time.monotonic())

    def point(self, kind: str, busy: bool, where: str) -> Tuple[int, bool]:
        """This rank reached its next due point of ``kind`` (at position ``where``): (its index, taken)."""
        index = self.counts[kind]
        self.counts[kind] += 1
        h, w, o = blocks(kind, self.instant)
        if self.planner is not None:
            now = time.monotonic()  # the point's time: the wait for the plan write below is not training time
            self.finish()  # the change decided at the previous point is on storage before this point is passed
            old = self.planner.plan
            new = self.planner.at(kind, index, now, busy)
            if new is not None:
                self._publish(new, old)
                if self.instant:
                    self.finish()  # posted before this point is passed: the others read it at the next
            self.plan = self.planner.plan
        elif (index + o) % h == 0 and index > 0:
            if self.instant:
                self._start_read(kind)  # rank 0 posted this block's plan before it passed the point before
            if self._pending.get(kind) is not None:
                self._adopt(self._await_read(kind))
        self.coord.check()  # a rank that lost rank 0's store (or the etcd) stops here
        taken = self.plan.taken(kind, index)
        self._history.append((kind, index, taken, where))
        if self.planner is None and not self.instant and (index + o + w - 2) % h == 0:
            self._start_read(kind)  # rank 0 wrote the next block's plan (from point index + 1 on) before it passed index - 1
        return index, taken

    def close(self) -> None:
        """The range ended: rank 0's plan write in flight is done, and the coordinator closed."""
        self.finish()
        self.coord.close()

    def finish(self) -> None:
        """Rank 0: wait for the plan write in flight; when it failed, the ranks go on with the plan before it."""
        if self._writing is None:
            return
        t, old, raised = self._writing
        self._writing = None
        t.join()
        exc = raised[0] if raised else None
        if exc is None or isinstance(exc, FencedError):
            return  # written, or fenced: said once by the fence; this writer commits nothing any more
        if not isinstance(exc, AcpError):
            raise exc  # not a storage failure: raised on the training thread, as when the write ran there
        self.write_failures += 1
        if self.write_failures == 1:
            logger.warning("range %s: could not write the save plan (%s); the ranks go on with the previous one "
                           "(said once)", self.range_name, exc)
        if old is not None and self.planner is not None:
            self.planner.plan = self.plan = old

    def _write(self, plan: SavePlan, raised: List[BaseException]) -> None:
        try:
            if self.fence is not None:
                self.fence.check("write the save plan")
            self.coord.post(PLAN_NAME, plan.dumps())
        except BaseException as exc:  # told (or raised) on the training thread by finish()
            raised.append(exc)

    def _publish(self, plan: SavePlan, old: Optional[SavePlan]) -> None:
        """Start writing ``plan`` in the background (:meth:`finish` waits for it)."""
        assert self.planner is not None and self._writing is None
        raised: List[BaseException] = []
        t = threading.Thread(target=self._write, args=(plan, raised), name="paddle-acp-plan-write", daemon=True)
        self._writing = (t, old, raised)
        t.start()
        if plan.strides and (old is None or plan.strides != old.strides):
            anchor, stride = plan.strides[-1]
            logger.info("range %s: the ranks save at every %s due point from due point %d on (a checkpoint takes "
                        "~%.3f s to write, due points come every ~%.3f s; at least every %d)", self.range_name,
                        "" if stride == 1 else _ordinal(stride), anchor, self.planner.planned_for,
                        self.planner.gap or 0.0, MAX_STRIDE)

    def _read(self) -> Optional[SavePlan]:
        for attempt in range(_TORN_RETRIES):
            try:
                raw = self.coord.latest(PLAN_NAME, MAX_PLAN_SIZE)
                return None if raw is None else SavePlan.loads(raw)
            except CorruptCheckpointError as exc:  # rank 0 is rewriting it: read again
                if attempt == _TORN_RETRIES - 1:
                    raise
                logger.debug("range %s: save plan unreadable (%s), reading again", self.range_name, exc)
                time.sleep(0.02 * (attempt + 1))
        return None

    def _read_into(self, box: List[Optional[SavePlan]]) -> None:
        try:
            box.append(self._read())
        except (AcpError, OSError) as exc:
            self.read_failures += 1
            if self.read_failures == 1:
                logger.warning("range %s: rank %d could not read the save plan (%s); it goes on with the plan it has "
                               "(a checkpoint the ranks then decide differently is abandoned)", self.range_name,
                               self.rank, exc)

    def _start_read(self, kind: str) -> None:
        box: List[Optional[SavePlan]] = []  # this read's result (a read that hangs never fills a later one's)
        t = threading.Thread(target=self._read_into, args=(box,), name="paddle-acp-plan", daemon=True)
        self._pending[kind] = (t, box)
        t.start()

    def _await_read(self, kind: str) -> Optional[SavePlan]:
        t, box = self._pending.pop(kind)
        t.join(READ_TIMEOUT)
        if t.is_alive():
            logger.warning("range %s: rank %d: reading the save plan takes more than %g s; this due point is decided "
                           "on the plan it has", self.range_name, self.rank, READ_TIMEOUT)
            return None
        return box[0] if box else None

    def _adopt(self, plan: Optional[SavePlan]) -> None:
        if plan is None or plan.range_name != self.range_name or plan.base != self.base:
            return  # none yet, or of another start: the plan held stays
        if plan.token == self.plan.token and plan.seq <= self.plan.seq:
            return
        for kind, index, taken, where in self._history:
            if plan.taken(kind, index) != taken:
                self.disagreements += 1
                logger.warning(
                    "range %s: rank %d decided the save at %s (due point %d) on an older save plan than rank 0's "
                    "(it ran ahead of rank 0: the ranks are not in lockstep): that checkpoint is abandoned, and "
                    "the job resumes from an earlier one if it stops before the next", self.range_name, self.rank,
                    where, index)
        self.plan = plan


def _ordinal(n: int) -> str:
    return {2: "2nd", 3: "3rd"}.get(n, f"{n}th")
