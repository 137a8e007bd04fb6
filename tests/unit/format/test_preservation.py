"""What to keep (issue 43 section 3): ``retention.preserve``, the one preservation function of the writer's
retention, ``paddle-acp gc`` and the node-local cache, as a pure function under hypothesis.

A range is drawn as checkpoints newest first, each committed or not, of a known format or not, stale (not of
the history a restart follows) or not; the restart's pick is drawn among the committed known ones (or none, or
not looked for). The never-lose rules must hold for every draw; the callers' own tests (tests/e2e/test_tools.py gc,
tests/e2e/test_local_cache.py, tests/unit/format/test_one_writer.py) run them on real storage.
"""
from __future__ import annotations

import dataclasses
from typing import List

from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.format.commit import retention
from paddle_acp.format.commit.retention import GONE, UNKNOWN, preserve, to_delete


@dataclasses.dataclass(eq=False)
class C:
    n: int
    committed: bool = True
    known: bool = True
    stale: bool = False


def ckpts(draw_list: List[tuple]) -> List[C]:
    return [C(len(draw_list) - k, *t) for k, t in enumerate(draw_list)]  # newest first


ranges = st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), max_size=14).map(ckpts)


def decide(cs: List[C], keep: int, restart: object = UNKNOWN) -> List[str]:
    return preserve(cs, keep, lambda c: c.committed, lambda c: c.known, lambda c: c.stale, restart)


@st.composite
def cases(draw):
    cs = draw(ranges)
    keep = draw(st.integers(-1, 6))
    eligible = [c for c in cs if c.committed and c.known and not c.stale]
    restart = draw(st.sampled_from([UNKNOWN, None] + eligible))
    return cs, keep, restart


@settings(max_examples=500, deadline=None)
@given(cases())
def test_the_never_lose_rules(case):
    cs, keep, restart = case
    why = decide(cs, keep, restart)
    gone = {id(c) for c, w in zip(cs, why) if w in GONE}
    live = [c for c in cs if c.committed and not c.stale]
    # nothing uncommitted goes unless stale; nothing of a format this paddle-acp does not know
    assert all(c.stale for c in cs if id(c) in gone and not c.committed)
    assert not any(id(c) in gone for c in live if not c.known)
    # the newest committed known checkpoint, and the one a restart loads, always stay
    known = [c for c in live if c.known]
    if known:
        assert id(known[0]) not in gone
    if restart is not UNKNOWN and restart is not None:
        assert id(restart) not in gone
    # never more than the known ones beyond the newest ``keep``; nothing committed at all when none can be loaded
    # or keep <= 0
    committed_gone = [c for c in live if id(c) in gone]
    assert len(committed_gone) <= max(0, len(known) - max(keep, 0))
    if keep <= 0 or restart is None:
        assert committed_gone == []
    elif restart is UNKNOWN:  # exactly the known ones beyond the newest ``keep``, the oldest
        assert committed_gone == known[keep:]
    # every stale one goes
    assert all(id(c) in gone for c in cs if c.stale)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_preservation_is_idempotent(case):
    """What survives one pass loses nothing to a second (retention after every commit, gc after retention)."""
    cs, keep, restart = case
    survivors = [c for c, w in zip(cs, decide(cs, keep, restart)) if w not in GONE]
    assert not any(w in GONE for w in decide(survivors, keep, restart))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_deletions_come_oldest_first(case):
    cs, keep, restart = case
    order = [c.n for c in to_delete(cs, decide(cs, keep, restart))]
    assert order == sorted(order)


def test_reasons_gc_shows():
    """Each reason, once: gc prints them, the writer and the cache only act on them."""
    old, corrupt, restart, newer, newest = C(1), C(2), C(3), C(4, known=False), C(6)
    pending, leftover = C(7, committed=False), C(5, committed=False, stale=True)
    cs = [pending, newest, leftover, newer, restart, corrupt, old]
    assert decide(cs, 2, restart=None) == [retention.PENDING, retention.NO_RESTART, retention.STALE,
                                           retention.FOREIGN] + [retention.NO_RESTART] * 3
    assert decide(cs, 1, restart) == [retention.PENDING, retention.NEWEST, retention.STALE, retention.FOREIGN,
                                      retention.RESTART, retention.OLDER, retention.OLDER]
    assert decide(cs, 0) == [retention.PENDING, retention.ALL, retention.STALE] + [retention.ALL] * 4


def test_a_writer_whose_format_check_reads_storage_is_asked_about_committed_ones_only():
    asked: List[int] = []

    def known(c: C) -> bool:
        asked.append(c.n)
        return True

    cs = [C(3, committed=False), C(2), C(1, stale=True)]
    preserve(cs, 1, lambda c: c.committed, known, lambda c: c.stale)
    assert asked == [2]

