"""The save-decision policy (issue 43 section 3) as a pure function: hypothesis over its facts.

``SaveDecisionPolicy.should_save(SaveContext) -> Decision`` is all of "when to save": the interval, every N
steps, preemption and final saves, the busy policy (skip / queue / wait / auto) and, with several ranks, rank
0's save plan. Real processes exercise it in tests/e2e/test_busy_policy.py, test_defaults.py, test_steps.py,
test_agree_e2e.py; here the rules themselves, for every combination of facts.
"""
from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.runtime.save_decision import (
    ARENA,
    ARENA_SKIP_BYTES,
    ARENA_SKIPS,
    AUTO,
    BUSY,
    COSTLY,
    EPOCH_END,
    FINAL,
    NONE,
    PLAN,
    PREEMPT,
    QUEUE,
    SAVE,
    SKIP,
    STEP,
    WAIT,
    SaveContext,
    SaveDecisionPolicy,
)

POLICIES = (AUTO, SKIP, QUEUE, WAIT)
points = st.sampled_from((EPOCH_END, STEP, PREEMPT, FINAL))
policies = st.builds(SaveDecisionPolicy, interval=st.sampled_from((0.0, 0.5, 30.0)), busy_policy=st.sampled_from(POLICIES),
                     synchronous=st.booleans(), several_ranks=st.booleans())
# what one rank knows of itself alone: its clock, its saver, its memory
local_facts = st.fixed_dictionaries({
    "since_save": st.floats(0, 100), "busy": st.booleans(), "queue_free": st.booleans(), "queue_fits": st.booleans(),
    "expected_wait": st.floats(0, 10), "allowance": st.floats(0, 10), "arena_left": st.sampled_from((0, ARENA_SKIP_BYTES)),
    "skips": st.integers(0, 3)})


def contexts(point: str, plan: object, step: object, every: object) -> st.SearchStrategy[SaveContext]:
    return local_facts.map(lambda f: SaveContext(point, plan=plan, step=step, every=every, **f))  # type: ignore[arg-type]


def taken(action: str) -> bool:
    return action not in (NONE, SKIP)


def test_the_busy_policy_of_one_writer_at_an_epoch_end_is_the_whole_table():
    """Every combination, one writer saving every epoch: an idle saver saves; durable saves and the wait policy
    wait; auto waits within its budget (else skips, COSTLY); queue only with a free, affordable second buffer;
    otherwise skip (BUSY)."""
    for policy, busy, point, free, fits, costly in itertools.product(POLICIES, (False, True), (EPOCH_END, FINAL),
                                                                     *[(False, True)] * 3):
        ctx = SaveContext(point, busy=busy, queue_free=free, queue_fits=fits, expected_wait=2.0 if costly else 0.5,
                          allowance=1.0)
        d = SaveDecisionPolicy(0.0, policy).should_save(ctx)
        if not busy:
            want = (SAVE, "", None)
        elif point == FINAL or policy == WAIT:
            want = (WAIT, "", None)
        elif policy == AUTO:
            want = (SKIP, COSTLY, None) if costly else (WAIT, "", 1.0)
        elif policy == QUEUE and free and fits:
            want = (QUEUE, "", None)
        else:
            want = (SKIP, BUSY, None)
        assert (d.action, d.why, d.budget) == want, (policy, busy, point, free, fits, costly, d)


def test_a_point_the_ranks_plan_decided():
    """Several ranks: a point the plan does not take is skipped alike on every rank; one it takes is never
    skipped: saved, waited for, or queued (the queue policy with a free second buffer that fits)."""
    pol = SaveDecisionPolicy(0.0, SKIP, several_ranks=True)
    assert pol.should_save(SaveContext(EPOCH_END, plan=False, busy=True)).action == SKIP
    assert pol.should_save(SaveContext(EPOCH_END, plan=False, busy=True)).why == PLAN
    assert pol.should_save(SaveContext(EPOCH_END, plan=True)).action == SAVE
    assert pol.should_save(SaveContext(EPOCH_END, plan=True, busy=True)).action == WAIT
    q = dataclasses.replace(pol, busy_policy=QUEUE)
    assert q.should_save(SaveContext(EPOCH_END, plan=True, busy=True, queue_free=True, queue_fits=True)).action == QUEUE
    assert q.should_save(SaveContext(EPOCH_END, plan=True, busy=True, queue_free=True)).action == WAIT


@settings(max_examples=300, deadline=None)
@given(policies.map(lambda p: dataclasses.replace(p, several_ranks=True)), points, st.integers(0, 12),
       st.sampled_from((None, 1, 3)), st.data())
def test_every_rank_reaches_the_same_decision_from_the_same_plan(pol, point, step, every, data):
    """Several ranks: which points count in the plan, and whether a point is due and taken, depend only on what
    every rank shares (the point, the position, the plan), never on a rank's own clock, saver or memory."""
    step_ = step if point == STEP else None
    every_ = every if point == STEP else None
    kind = pol.plan_point(SaveContext(point, step=step_, every=every_))
    plan = None if kind is None else data.draw(st.booleans())
    a, b = (pol.should_save(data.draw(contexts(point, plan, step_, every_))) for _ in range(2))
    assert (a.due, taken(a.action)) == (b.due, taken(b.action)), (a, b)
    if point in (PREEMPT, FINAL) or pol.synchronous:
        assert kind is None  # durable saves are outside the plan
    elif point == EPOCH_END:
        assert kind == ("interval" if pol.interval > 0 else "due")
    else:
        assert kind == ("due" if every is not None and step % every == 0 else None)


@settings(max_examples=300, deadline=None)
@given(policies, st.sampled_from((PREEMPT, FINAL)), local_facts)
def test_preemption_and_final_saves_are_always_taken(pol, point, facts):
    d = pol.should_save(SaveContext(point, **facts))
    assert d.action == (WAIT if facts["busy"] else SAVE) and d.budget is None, d


@settings(max_examples=300, deadline=None)
@given(policies.map(lambda p: dataclasses.replace(p, several_ranks=False)), st.integers(1, 12),
       st.sampled_from((None, 2, 5)), local_facts)
def test_one_writer_mid_epoch(pol, step, every, facts):
    """Every ``save_every_steps`` batches a save is due (the busy policy says what it does); between them only
    the interval makes one due, and one the busy policy would skip stays due (NONE, never a SKIP)."""
    d = pol.should_save(SaveContext(STEP, step=step, every=every, **facts))
    if every is not None and step % every == 0:
        assert d.due
    elif pol.interval <= 0 or facts["since_save"] < pol.interval:
        assert d.action == NONE
    else:
        assert d.why in ("", ARENA), d


@settings(max_examples=300, deadline=None)
@given(policies.map(lambda p: dataclasses.replace(p, several_ranks=False, synchronous=False)), local_facts)
def test_one_writer_at_an_epoch_end(pol, facts):
    """The interval counts on this writer's clock; a populating arena skips at most ARENA_SKIPS saves in a row,
    and only under skip or auto with the saver idle."""
    d = pol.should_save(SaveContext(EPOCH_END, **facts))
    if pol.interval > 0 and facts["since_save"] < pol.interval:
        assert d.action == NONE
        return
    arena = (not facts["busy"] and pol.busy_policy in (SKIP, AUTO) and facts["skips"] < ARENA_SKIPS
             and facts["arena_left"] >= ARENA_SKIP_BYTES)
    assert (d.why == ARENA) == arena, d
    if d.action == SKIP:
        assert pol.busy_policy != WAIT
