"""The ranks' save plan (issue 28 item 1): the record, rank 0's planner, and agreement between ranks.

The record is untrusted input (hypothesis: round trips, every mutation and truncation is refused
cleanly). The planner is pure: hypothesis drives rank 0 with arbitrary persist and epoch times and
a second rank that reads the plan at any moment the lockstep of data-parallel training allows; the
two decision sequences must be equal, every streak of skips shorter than K. Real processes and a
real HDFS are in tests/e2e/test_agree_e2e.py.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format.save_plan import MAX_ENTRIES, MAX_PLAN_SIZE, PLAN_NAME, SavePlan
from paddle_acp.runtime.agree import MAX_STRIDE, SCHEDULE, Agreement, Planner, blocks, initial_plan
from paddle_acp.runtime.coord.files import StorageCoordinator
from paddle_acp.storage import open_storage

increasing = st.lists(st.integers(0, 10**9), max_size=MAX_ENTRIES, unique=True).map(sorted)
plans = st.builds(
    SavePlan,
    range_name=st.text(min_size=1, max_size=20).filter(lambda s: s.encode("utf-8", "ignore").decode() == s),
    base=st.one_of(st.none(), st.sampled_from(["ckpt-e3", "ckpt-e10-s4"])),
    token=st.text("0123456789abcdef", min_size=1, max_size=16),
    seq=st.integers(0, 10**6),
    default_stride=st.integers(1, MAX_STRIDE),
    strides=st.tuples(increasing, st.lists(st.integers(1, MAX_STRIDE), min_size=MAX_ENTRIES, max_size=MAX_ENTRIES))
    .map(lambda t: tuple(zip(t[0], t[1]))),
    requests=increasing.map(tuple),
)


def read_plan(storage, range_dir):
    """The plan the storage-only coordinator posted (what the other ranks read), or None."""
    raw = StorageCoordinator(storage, range_dir).latest(PLAN_NAME, MAX_PLAN_SIZE)
    return None if raw is None else SavePlan.loads(raw)


def write_plan(storage, range_dir, plan):
    """Post ``plan`` as rank 0 does on the storage-only path."""
    StorageCoordinator(storage, range_dir).post(PLAN_NAME, plan.dumps())


@settings(max_examples=200, deadline=None)
@given(plans)
def test_plan_record_round_trips(plan):
    assert SavePlan.loads(plan.dumps()) == plan


@settings(max_examples=200, deadline=None)
@given(plans, st.data())
def test_a_damaged_or_torn_plan_is_refused(plan, data):
    raw = plan.dumps()
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CorruptCheckpointError):
        SavePlan.loads(raw[:cut])  # a torn read while rank 0 rewrites it
    pos = data.draw(st.integers(0, len(raw) - 1))
    flipped = raw[:pos] + bytes([raw[pos] ^ data.draw(st.integers(1, 255))]) + raw[pos + 1:]
    try:
        got = SavePlan.loads(flipped)
    except CorruptCheckpointError:
        return
    assert got == plan  # only a change the checksum does not cover (e.g. whitespace) may pass


@pytest.mark.parametrize("field,value", [
    ("strides", [[5, 0]]), ("strides", [[5, 2], [5, 3]]), ("strides", [[-1, 2]]), ("strides", [[1, True]]),
    ("requests", [4, 4]), ("requests", ["1"]), ("seq", -1), ("token", ""), ("range", ""),
    ("strides", [[i, 1] for i in range(MAX_ENTRIES + 1)]), ("default_stride", 0), ("default_stride", 2**20 + 1),
])
def test_bad_fields_are_refused_even_resealed(field, value):
    from paddle_acp.format.manifest import seal

    doc = json.loads(SavePlan("r", None, "t").dumps())
    doc[field] = value
    with pytest.raises(CorruptCheckpointError):
        SavePlan.loads(seal(doc))


def test_taken_follows_strides_and_requests():
    p = SavePlan("r", None, "t").with_stride(4, 3).with_stride(10, 2)
    assert [i for i in range(16) if p.taken("due", i)] == [0, 1, 2, 3, 4, 7, 10, 12, 14]
    p = p.with_request(5)
    assert [i for i in range(8) if p.taken("interval", i)] == [5]


# -- a model of two ranks ----------------------------------------------------------------
def simulate(policy, epochs, persists, lag_choices, interval=0.0, floor=0.0, instant=False):
    """Rank 0 plans at each due point with its clock (``epochs``: seconds between due points, the
    first one from the loop's start; ``persists``: each taken save's persist time); rank 1 decides
    block b (points [s, s + H), s = b*H - O) on the plan as rank 0 had it after passing point x, for
    any x in [s - W + 1, s] (lockstep: its read starts when it reaches point s - W + 2, which it
    reaches only after rank 0 passed s - W + 1, where rank 0 waited for the write of the change it
    decided at s - W; and rank 0 reaches s + 1 only after rank 1 passed s). ``instant`` (a store, W = 1):
    any x in [s - 1, s] (rank 1 reads at s, after rank 0 posted and passed s - 1). Returns (rank 0's
    decisions, rank 1's)."""
    kind = "interval" if interval > 0 else "due"
    h, w, o = blocks(kind, instant)
    planner = Planner(initial_plan("r", None, "t"), policy, interval, 0.0, floor=floor, instant=instant)
    planner.restart_clock(0.0)
    now, done_at = 0.0, None
    after = []  # the plan as rank 0 had it after passing point i
    mine = []
    p = iter(persists)
    for i, gap in enumerate(epochs):
        now += gap
        if done_at is not None and now >= done_at:
            planner.persist_ended(done_at)
            done_at = None
        busy = done_at is not None
        planner.at(kind, i, now, busy)
        taken = planner.plan.taken(kind, i)
        mine.append(taken)
        if taken:
            if busy:  # wait for the previous one
                planner.persist_ended(done_at)
                now = done_at
            planner.persist_started(now)
            done_at = now + next(p, 1.0)
        planner.point_done(now)
        after.append(SavePlan.loads(planner.plan.dumps()))  # as the others read it
    before0 = initial_plan("r", None, "t")
    theirs = []
    for i in range(len(epochs)):
        b = (i + o) // h
        if b == 0:
            plan = before0
        else:
            start = b * h - o
            lo = start - w if instant else start - w + 1
            x = lo + lag_choices[b % len(lag_choices)] % (start - lo + 1)
            plan = after[min(x, len(after) - 1)]
        theirs.append(plan.taken(kind, i))
    return mine, theirs


times = st.lists(st.floats(0.001, 5.0), min_size=1, max_size=100)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["auto", "skip", "queue", "wait"]), times, times, st.lists(st.integers(0, 8), min_size=1, max_size=8),
       st.sampled_from([0.0, 0.05, 0.5, 5.0]), st.booleans())
def test_two_ranks_take_the_same_due_points_at_any_interleaving(policy, epochs, persists, lags, floor, instant):
    mine, theirs = simulate(policy, epochs, persists, lags, floor=floor, instant=instant)
    assert mine == theirs
    streak = longest = 0
    for taken in mine:
        streak = 0 if taken else streak + 1
        longest = max(longest, streak)
    assert longest < MAX_STRIDE, mine  # a checkpoint at least every K due points
    if policy == "wait":
        assert all(mine)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["auto", "skip", "queue", "wait"]), times, times, st.lists(st.integers(0, 8), min_size=1, max_size=8),
       st.floats(0.5, 20.0), st.booleans())
def test_two_ranks_take_the_same_interval_saves_at_any_interleaving(policy, epochs, persists, lags, interval, instant):
    mine, theirs = simulate(policy, epochs, persists, lags, interval=interval, instant=instant)
    assert mine == theirs


def test_the_stride_covers_the_persist():
    """Epochs of 1 s, persists of 3.5 s: rank 0 settles on every 5th due point (3.5 * 1.2 / 1);
    a persist of 100 s is capped at K; under ``wait`` every point is taken."""
    mine, _ = simulate("skip", [1.0] * 80, [3.5] * 80, [0])
    taken = [i for i, t in enumerate(mine) if t]
    assert taken[:4] == [0, 1, 2, 3] and {b - a for a, b in zip(taken[8:], taken[9:])} == {5}, taken
    mine, _ = simulate("skip", [1.0] * 80, [100.0] * 80, [0])
    taken = [i for i, t in enumerate(mine) if t]
    assert {b - a for a, b in zip(taken[8:], taken[9:])} == {MAX_STRIDE}, taken
    assert all(simulate("wait", [1.0] * 30, [3.5] * 30, [0])[0])


# -- the runtime side, on a real local store ------------------------------------------------
def in_lockstep(r0, r1, points, persist, every):
    """Rank 0's and rank 1's decisions at ``points`` due points in lockstep: either rank may reach point i first
    (rank 0 first at every ``every``-th point but the multiples), rank 1 only after rank 0 passed i - 1; rank 0
    plans on ``persist(i)`` seconds of persist."""
    got0, got1 = [], []
    for i in range(points):
        r0.planner.persist = persist(i)
        first, second = ((r0, got0), (r1, got1)) if i % every else ((r1, got1), (r0, got0))
        for r, got in (first, second):
            got.append(r.point("due", False, f"epoch {i}")[1])
        r0.tell(Planner.point_done)
    return got0, got1


def test_agreement_through_a_real_store_in_lockstep_and_ahead(tmp_path, caplog):
    """Two ranks' Agreement objects on one local store. In lockstep (rank 1 decides point i
    after rank 0 passed i - 1) they decide alike; a rank that runs three points ahead decides on
    an older plan, and says so when it reads the plan that contradicts it."""
    storage = open_storage(str(tmp_path))
    storage.makedirs("j/range/r")

    def pair():
        a = [Agreement(storage, "j/range/r", "r", k, "skip", 0.0) for k in (0, 1)]
        for x in a:
            x.start(None)
        return a

    r0, r1 = pair()
    got0, got1 = in_lockstep(r0, r1, 60, lambda i: 0.0 if i < 20 else 1e6, 3)  # every point, then every K-th
    assert got0 == got1 and r1.disagreements == 0
    assert [s for _, s in r0.planner.plan.strides] == [MAX_STRIDE], r0.planner.plan
    assert all(got0[:20]) and not all(got0[28:])
    r0.finish()
    assert read_plan(storage, "j/range/r") == r0.planner.plan

    # rank 1 far ahead of rank 0 (no lockstep): it decides points on the plan it has
    r0, r1 = pair()
    caplog.set_level(logging.WARNING, logger="paddle_acp")
    ahead = [r1.point("due", False, f"epoch {i}")[1] for i in range(20)]
    r0.planner.persist = 1e6  # rank 0's persists are far longer than its due points are apart: stride K
    for i in range(20):
        r0.point("due", False, f"epoch {i}")
        r0.tell(Planner.point_done)
    for i in range(20, 25):
        r1.point("due", False, f"epoch {i}")
    assert all(ahead) and not all(r0.planner.plan.taken("due", i) for i in range(8, 20))
    assert r1.disagreements >= 1
    assert any("on an older save plan than rank 0's" in m for m in caplog.messages), caplog.messages


class _Gate:
    """Holds the real store's writes of the plan until released (a slow remote write, made deterministic)."""

    def __init__(self, storage, fail: bool = False):
        self.real = storage.write_bytes
        self.fail = fail
        self.held = threading.Event()
        self.release = threading.Event()
        self.writes = 0
        storage.write_bytes = self.write

    def write(self, path, data):
        if path.endswith("/plan.json"):
            self.writes += 1
            self.held.set()
            assert self.release.wait(60)
            self.release.clear()
            if self.fail:
                raise StorageError(f"injected: the store refused {path}")
        self.real(path, data)


def _lockstep(storage, points, fail=False):
    """Rank 0 then rank 1 at each point, in lockstep; a plan write rank 0 starts is held until rank 0 reaches
    its next point. Returns both ranks' decisions and how many points rank 0 passed with its write held."""
    r0, r1 = [Agreement(storage, "j/range/r", "r", k, "skip", 0.0) for k in (0, 1)]
    for x in (r0, r1):
        x.start(None)
    r0.finish()  # the fresh plan's write (in the background since the open)
    gate = _Gate(storage, fail)  # the writes of changes from now on
    got0, got1, went_on = [], [], 0
    for i in range(points):
        r0.planner.persist = 0.0 if i < 12 else 1e6
        if gate.held.is_set():  # rank 0 is at the point after the one that started a write: let it finish
            gate.held.clear()
            threading.Timer(0.05, gate.release.set).start()
        got0.append(r0.point("due", False, f"epoch {i}")[1])
        if r0._writing is not None:  # a write started at this point: wait until it is held at the gate (its
            assert gate.held.wait(30)  # thread may not have reached the store yet on a loaded machine)
        if gate.held.is_set():
            went_on += 1  # rank 0 passed this point while its plan write was still held
            assert r0._writing is not None and r0._writing[0].is_alive()
        got1.append(r1.point("due", False, f"epoch {i}")[1])
        r0.tell(Planner.point_done)
    if gate.held.is_set():
        gate.release.set()
    r0.finish()
    return gate, r0, r1, got0, got1, went_on


def test_rank_0_trains_on_while_its_plan_is_written_and_the_others_read_it_after(tmp_path):
    """Rank 0 starts the plan write at the point that decides a change and passes that point while the write
    is still held; it waits for the write only at its next point, and rank 1, reading at the point after
    that, decides every point as rank 0 does (the write used to hold rank 0's training thread, and with it
    every rank in lockstep, at each change: ~0.1-0.5 s on HDFS)."""
    storage = open_storage(str(tmp_path))
    storage.makedirs("j/range/r")
    gate, r0, r1, got0, got1, went_on = _lockstep(storage, 40)
    assert gate.writes >= 1 and went_on == gate.writes
    assert got0 == got1 and r1.disagreements == 0 and r0.write_failures == 0
    assert not all(got0[16:]) and read_plan(storage, "j/range/r") == r0.planner.plan


def test_the_fresh_plan_is_written_while_rank_0_trains_its_first_epoch(tmp_path):
    """The open returns while rank 0's fresh plan is still being written (a file write: ~0.4 s on HDFS 2.7);
    rank 0 waits for it at its first due point, before any other rank reads a plan."""
    storage = open_storage(str(tmp_path))
    storage.makedirs("j/range/r")
    write_plan(storage, "j/range/r", SavePlan("r", None, "earlier-start").with_stride(0, 7))
    gate = _Gate(storage)
    r0 = Agreement(storage, "j/range/r", "r", 0, "skip", 0.0)
    r0.start(None)
    assert gate.held.wait(10) and r0._writing is not None and r0._writing[0].is_alive()  # the open returned
    assert read_plan(storage, "j/range/r").token == "earlier-start"
    threading.Timer(0.05, gate.release.set).start()
    assert r0.point("due", False, "epoch 0") == (0, True)
    assert r0._writing is None and read_plan(storage, "j/range/r") == r0.planner.plan != SavePlan("r", None, "-")
    assert read_plan(storage, "j/range/r").token == r0.planner.plan.token != "earlier-start"


def test_a_plan_write_that_fails_in_the_background_leaves_every_rank_on_the_previous_plan(tmp_path, caplog):
    storage = open_storage(str(tmp_path))
    storage.makedirs("j/range/r")
    caplog.set_level(logging.WARNING, logger="paddle_acp")
    gate, r0, r1, got0, got1, went_on = _lockstep(storage, 40, fail=True)
    assert gate.writes >= 2 and r0.write_failures == gate.writes
    assert got0 == got1 and all(got0) and r1.disagreements == 0  # nobody followed the plan that was not written
    assert sum("could not write the save plan" in m for m in caplog.messages) == 1


def test_a_plan_of_another_start_is_not_followed(tmp_path):
    storage = open_storage(str(tmp_path))
    storage.makedirs("j/range/r")
    write_plan(storage, "j/range/r", SavePlan("r", "ckpt-e1", "old").with_stride(0, 7))
    r1 = Agreement(storage, "j/range/r", "r", 1, "wait", 0.0)
    r1.start("ckpt-e4")
    assert all(r1.point("due", False, f"e{i}")[1] for i in range(30))


def test_stride_is_never_above_k():
    planner = Planner(SavePlan("r", None, "t"), "skip", 0.0, 0.0)
    planner.persist = 1e6
    for i in range(50):
        planner.at("due", i, float(i), True)
    assert max(s for _, s in planner.plan.strides) == MAX_STRIDE
    assert math.isclose(planner.gap, 1.0)


def test_the_stride_covers_an_occasional_slow_persist():
    """Epochs of 1 s, persists of 1 s with every 4th one 3.5 s (a storage's occasional slow write, e.g. HDFS's
    retried block completion): rank 0 plans for the slow one (every 5th point), not for the last persist
    (which took the stride down to 2 after every fast one, so every rank waited after each slow persist)."""
    persists = [3.5 if i % 4 == 0 else 1.0 for i in range(80)]
    mine, _ = simulate("skip", [1.0] * 80, persists, [0])
    taken = [i for i, t in enumerate(mine) if t]
    assert {b - a for a, b in zip(taken[12:], taken[13:])} == {5}, taken


def test_the_persist_planned_for_is_the_longest_of_the_last_few():
    planner = Planner(SavePlan("r", None, "t"), "skip", 0.0, 0.0)
    for start, seconds in enumerate([0.5, 3.0, 0.5, 0.5, 0.5, 0.5, 0.5]):
        planner.persist_started(10.0 * start)
        planner.persist_ended(10.0 * start + seconds)
    assert planner.estimate(100.0) == 0.5  # the slow one is PERSIST_WINDOW persists ago
    planner.persist_started(200.0)
    planner.persist_ended(202.0)
    assert planner.estimate(300.0) == 2.0
    planner.persist_started(300.0)
    assert planner.estimate(304.0) == 4.0  # in flight for longer than any


def test_persists_that_overlap_are_each_measured_from_their_own_start():
    """Rank 0's saver is free once its own part is written while that checkpoint's global commit goes on, so the
    next persist often starts before the previous one ended. Each is measured from its own start: the next start
    once replaced the first's, so the first was measured from the second's start and the second not at all; the
    plan's stride came out too small and every rank waited at taken points (ci/bench/ranks_training_hdfs.py's 2-rank HDFS job:
    commits of 1.0-1.3 s planned as 0.3-0.5 s)."""
    planner = Planner(SavePlan("r", None, "t"), "skip", 0.0, 0.0)
    planner.persist_started(0.0)
    planner.persist_started(1.0)
    assert planner.estimate(2.0) == 2.0  # the oldest one in flight
    planner.persist_ended(2.5)
    assert planner.persist == 2.5
    planner.persist_ended(3.5)
    assert planner.persist == 2.5  # the second took 2.5 s as well
    assert planner.estimate(4.0) == 2.5
    planner.persist_ended(5.0)  # nothing in flight: nothing measured
    assert planner.estimate(6.0) == 2.5


def test_the_stride_covers_commits_that_outlast_the_parts():
    """Due points every 0.15 s; each rank's part is written in 0.3 s, the global commit decided 1.2 s after the
    save (rank 0's saver is free at 0.3 s, its commit goes on): the plan takes a point at most every 1.2 s of
    training time, so taken points never find a part in flight."""
    planner = Planner(initial_plan("r", None, "t"), "skip", 0.0, 0.0)
    now, part_done, commits = 0.0, None, []
    waits = []
    for i in range(120):
        now += 0.15
        while commits and commits[0] <= now:
            planner.persist_ended(commits.pop(0))
        busy = part_done is not None and part_done > now
        planner.at("due", i, now, busy)
        if planner.plan.taken("due", i):
            waits.append((i, busy))
            if busy:
                now = part_done
            planner.persist_started(now)
            part_done, _ = now + 0.3, commits.append(now + 1.2)
        planner.point_done(now)
    late = [i for i, busy in waits if busy and i >= 3 * SCHEDULE["due"][0]]  # from the third block on
    assert not late, waits
    assert planner.plan.stride_at(100)[1] >= math.ceil(1.2 / 0.15), planner.plan.strides


def test_the_wait_for_a_plan_write_is_not_counted_as_training_time(tmp_path):
    """Rank 0 waits at a point for the plan write it started at the previous one; that wait is not time between
    due points (it once was: the gap grew by the write's length and the planned stride came out too small)."""
    storage = open_storage(str(tmp_path))
    storage.makedirs("j/range/r")
    r0 = Agreement(storage, "j/range/r", "r", 0, "skip", 0.0)
    r0.start(None)
    r0.finish()
    gate = _Gate(storage)
    r0.planner.persist = 1e6  # every decision changes the plan to stride K: a write to wait for
    gaps = []
    for i in range(12):
        if gate.held.is_set():
            gate.held.clear()
            threading.Timer(0.5, gate.release.set).start()  # the write takes 0.5 s more
        r0.point("due", False, f"epoch {i}")
        gaps.append(r0.planner.gap)
        time.sleep(0.01)  # training between due points
        r0.tell(Planner.point_done)
    assert gate.writes >= 1
    if gate.held.is_set():
        gate.release.set()
    r0.finish()
    assert max(g for g in gaps if g is not None) < 0.25, gaps


def test_the_second_block_is_planned_at_the_first_point_on_the_opens_write_time():
    """Due points 0.1 s apart, persists of 0.4 s. Rank 0 decides the second block (points 3-6) at its first
    point, on the first epoch's length and, before any persist ended, on the floor (the fence record's write
    at the open): every 5th point from the first block's last (2) on, none in the second block. Without a
    floor nothing is known yet: every point. Once a persist is measured, it alone counts (a faster one brings
    the stride down)."""
    def second_block(floor):
        planner = Planner(initial_plan("r", None, "t"), "skip", 0.0, 0.0, floor=floor)
        planner.restart_clock(0.0)
        planner.at("due", 0, 0.1, False)  # the first due point, one epoch after the loop's start
        planner.persist_started(0.1)
        planner.point_done(0.1)
        return [i for i in range(3, 7) if planner.plan.taken("due", i)], planner

    assert second_block(0.0)[0] == [3, 4, 5, 6]
    taken, planner = second_block(0.4)
    assert taken == [] and planner.plan.strides == ((2, 5),) and planner.planned_for == pytest.approx(0.4)
    assert [i for i in range(3) if planner.plan.taken("due", i)] == [0, 1, 2]  # the first block: every point
    planner.persist_ended(0.25)  # the first persist took 0.15 s: the floor no longer counts
    assert planner.estimate(0.3) == pytest.approx(0.15)


def test_the_fence_records_how_long_its_record_took(tmp_path):
    from paddle_acp.format.commit.fencing import Fence

    storage = open_storage(str(tmp_path))
    real = storage.create_exclusive

    def slow(path, data):
        time.sleep(0.2)
        return real(path, data)

    storage.create_exclusive = slow
    fence = Fence.take(storage, "j", 0)
    assert fence.generation == 0 and 0.2 <= fence.took_s < 30
    r0 = Agreement(storage, "j/range/r", "r", 0, "skip", 0.0, fence=fence)
    assert r0.planner.floor == 2 * fence.took_s  # rank 0's persist: its part's manifest, then the global one
    assert storage.read_bytes("j/writers/gen-0") == b""  # the name is the record (HDFS: no block to wait for)
    storage.small_write_s = 0.45  # a storage whose small writes are known to take longer (HDFS: the block report)
    r0 = Agreement(storage, "j/range/r", "r", 0, "skip", 0.0, fence=fence)
    assert r0.planner.floor == 0.9


def test_a_stride_at_the_last_anchor_replaces_it_and_the_plan_reads_back():
    plan = SavePlan("r", None, "t").with_stride(3, 2).with_stride(7, 6)
    again = plan.with_stride(7, 8)
    assert again.strides == ((3, 2), (7, 8)) and again.seq == plan.seq + 1
    assert SavePlan.loads(again.dumps()) == again
    with pytest.raises(ValueError, match="before the last one"):
        again.with_stride(5, 4)


def test_a_slightly_shorter_stride_is_not_worth_a_plan_write():
    """At every 8th point, a wanted 7th (the estimates swing between blocks) leaves the plan as it is: each change
    is a write rank 0 waits for at its next point. A 6th, or any shorter stride below 6, is planned."""
    def plan_after(persist):
        planner = Planner(initial_plan("r", None, "t"), "skip", 0.0, 0.0)
        planner.restart_clock(0.0)
        now = 0.0
        for i in range(20):
            planner.persist = 1e6 if i < 8 else persist  # stride K first, then the wanted one
            now += 1.0
            planner.at("due", i, now, False)
            planner.point_done(now)
        return planner.plan.stride_at(19)[1]

    assert plan_after(5.5) == MAX_STRIDE  # wants every 7th: ceil(1.2 * 5.5)
    assert plan_after(4.9) == 6
    assert plan_after(0.5) == 1


# -- through a store: the plan is posted and read at once (W = 1) ----------------------------
def test_through_a_store_the_second_block_starts_at_point_1_and_long_epochs_save_every_epoch():
    """Through a store rank 0 decides the points from 1 on at point 0, on the first epoch's length and the open's
    write time: due points 0.1 s apart and persists of at least 0.4 s take point 0, then every 5th (no wait for a
    persist at points 1 and 2, as the storage path's first block of three has); epochs far longer than a persist
    save at every one of them, as a single process does."""
    mine, theirs = simulate("skip", [0.1] * 30, [0.4] * 30, [0], floor=0.4, instant=True)
    assert mine == theirs
    assert [i for i, t in enumerate(mine) if t][:3] == [0, 5, 10], mine
    slow, _ = simulate("skip", [0.1] * 30, [0.4] * 30, [0], floor=0.4)
    assert slow[:3] == [True, True, True]  # the storage path: the first block takes every point
    mine, theirs = simulate("skip", [30.0] * 12, [0.4] * 12, [0], floor=0.4, instant=True)
    assert mine == theirs and all(mine)


def test_agreement_through_a_real_tcp_store_reads_each_block_when_it_starts(tmp_path):
    """Two ranks' Agreements on one real Paddle TCP store, in lockstep (rank 1 at point i after rank 0 passed
    i - 1, either first at i): they decide alike, rank 1 reads the plan only at a block's first point (never in
    the background), and rank 0's long persists leave points 1-7 untaken."""
    pytest.importorskip("paddle")
    from support.coord import free_port

    from paddle_acp.adapter.store import StoreEndpoint
    from paddle_acp.runtime.coord.store import StoreCoordinator, StoreLink

    link = StoreLink(StoreEndpoint("127.0.0.1", free_port(), "MASTER_ADDR"), 0, 1, open_timeout=60)
    coord = StoreCoordinator(link, "j/r")
    try:
        storage = open_storage(str(tmp_path))
        r0, r1 = [Agreement(storage, "j/range/r", "r", k, "skip", 0.0, coord=coord) for k in (0, 1)]
        assert r0.instant and r1.instant
        for x in (r0, r1):
            x.start(None)
        r0.tell(Planner.restart_clock)  # the loop starts
        reads = []
        real = r1._start_read
        r1._start_read = lambda kind: (reads.append(r1.counts[kind] - 1), real(kind))
        # persists far longer than due points are apart: every K-th from point 0
        got0, got1 = in_lockstep(r0, r1, 24, lambda i: 1e6, 2)
        assert got0 == got1 and r1.disagreements == 0 and r1.read_failures == 0
        assert [i for i, t in enumerate(got0) if t] == [0, 8, 16], got0
        assert reads == [1, 5, 9, 13, 17, 21] and not r1._pending
    finally:
        r0.close()
        r1.close()


@pytest.mark.parametrize("instant", [False, True])
def test_a_first_epoch_resumed_mid_epoch_decides_nothing(instant):
    """A restart mid-epoch: the first due point comes after the epoch's remaining steps (0.01 s here), which says
    nothing of an epoch's length (60 s). Its point decides no stride from it (K would skip the next epochs, each a
    minute of training, while nothing is being written): every point is taken until a whole epoch was measured."""
    planner = Planner(initial_plan("r", None, "t"), "skip", 0.0, 0.0, floor=0.8, instant=instant)
    planner.restart_clock(0.0, partial=True)
    planner.at("due", 0, 0.01, False)
    assert planner.plan.strides == ()
    now = 0.01
    for i in range(1, 12):
        now += 60.0
        planner.at("due", i, now, False)
    assert all(planner.plan.taken("due", i) for i in range(12)), planner.plan
    whole = Planner(initial_plan("r", None, "t"), "skip", 0.0, 0.0, floor=0.8, instant=instant)
    whole.restart_clock(0.0)
    whole.at("due", 0, 0.01, False)  # a whole first epoch of 0.01 s: every 8th point (at most K) from then on
    assert whole.plan.strides and whole.plan.strides[-1][1] == MAX_STRIDE


@pytest.mark.parametrize("change", [False, True])
def test_a_busy_policy_changed_after_the_open_reaches_rank_0s_save_plan(tmp_path, change):
    """Paddle's train_epoch_range takes every due checkpoint: the compat layer sets the busy policy to ``wait`` on
    every rank after the range opened (SaveSchedule.set_busy_policy). With several ranks rank 0's save plan decides
    which due points they take, so it follows the change: every point is taken however long the persists are (it
    once kept the policy the range opened with and strode past due points)."""
    from paddle_acp.runtime.save_decision import WAIT
    from paddle_acp.runtime.schedule import SaveSchedule
    storage = open_storage(str(tmp_path))
    storage.makedirs("j/range/r")
    r0 = Agreement(storage, "j/range/r", "r", 0, "skip", 0.0)
    r0.start(None)
    schedule = SaveSchedule(0.0, "skip", r0)
    if change:
        schedule.set_busy_policy(WAIT)
    r0.planner.persist = 1e6  # persists far longer than the due points are apart: "skip" strides past points
    taken = []
    for i in range(20):
        taken.append(r0.point("due", True, f"epoch {i}")[1])
        r0.tell(Planner.point_done)
    r0.finish()
    assert all(taken) is change, taken
