"""Rank 0's commit costs O(W) storage calls in total, not per poll round (issue 28, item 4).

Paddle-free: W simulated ranks write their parts of one position through GlobalCheckpointer on a
real local store; rank 0's save (its part, the wait for the others, global.json, retention) runs
on a store that counts every Storage method call made by the code under test."""

import collections
import threading
import time

import numpy as np
import pytest

from paddle_acp.format.fencing import Fence
from paddle_acp.format.layout import GLOBAL_NAME, range_dir
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.format.multirank import GlobalCheckpointer
from paddle_acp.format.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.storage import open_storage

JOB, RANGE = "job", "_range_0"
CKDIR = f"{range_dir(JOB, RANGE)}/ckpt-e0"


class Counting:
    """A real storage whose every method call (from the caller) is counted, with its first argument."""

    def __init__(self, inner):
        self._inner = inner
        self.calls = collections.Counter()
        self.log = []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        v = getattr(self._inner, name)
        if not callable(v) or name.startswith("__"):
            return v

        def counted(*args, **kwargs):
            with self._lock:
                self.calls[name] += 1
                self.log.append((name, args[0] if args else None))
            return v(*args, **kwargs)

        return counted

    @property
    def total(self):
        return sum(self.calls.values())

    def rounds(self, world):
        """Poll rounds of the commit: the times it looked for the last rank's part (a listing of the
        position's directory, or a read of that part's manifest, whichever way the commit looks)."""
        last = f"{CKDIR}/rank-{world - 1}/manifest.json"
        log = list(self.log)
        return max(sum(1 for name, path in log if name == "listdir" and path == CKDIR),
                   sum(1 for name, path in log if name in ("read_bytes", "exists", "open_input") and path == last))


def snapshot(rank, epoch=0):
    ts = [TensorData("w", "float32", np.full(4, rank, dtype="float32"))]
    return Snapshot(RangeRecord(RANGE, epoch, 10, None), [ProgramSnapshot("fp", "t", ts, None)], None, "3.3.1", "pir",
                    extra={"rank": rank})


def ranks(root, world):
    st = open_storage(str(root))
    out = []
    for r in range(world):
        g = GlobalCheckpointer(st, JOB, RANGE, r, world, 3, 120.0, Fence.take(st, JOB, r))
        g.poll_interval = 0.002
        out.append(g)
    return out


def rank0_on(counting, g0):
    g = GlobalCheckpointer(counting, JOB, RANGE, 0, g0.world_size, 3, 120.0, g0.fence)
    g.poll_interval = g0.poll_interval
    return g


@pytest.mark.parametrize("world", [4, 16, 64])
def test_commit_with_every_part_there_costs_a_few_calls_per_rank(tmp_path, world):
    gs = ranks(tmp_path, world)
    for g in gs[1:]:
        g.save(snapshot(g.rank), "per-rank")
    counting = Counting(open_storage(str(tmp_path)))
    res = rank0_on(counting, gs[0]).save(snapshot(0), "per-rank")
    assert res.committed is True
    assert (tmp_path / CKDIR / GLOBAL_NAME).exists()
    # per other rank: its manifest read once, its generation looked up once (the cache forgotten, one listing)
    assert counting.total <= 3 * world + 40, (counting.total, counting.calls)
    assert counting.calls["read_bytes"] <= world + 5, counting.calls


@pytest.mark.parametrize("world", [4, 16, pytest.param(64, marks=pytest.mark.long)])
def test_the_commit_costs_a_constant_per_poll_round_not_one_call_per_rank(tmp_path, world):
    """The parts arrive one by one while rank 0 polls: many rounds, each a few calls whatever W."""
    gs = ranks(tmp_path, world)
    counting = Counting(open_storage(str(tmp_path)))
    g0 = rank0_on(counting, gs[0])
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, g0.save(snapshot(0), "per-rank")))
    t.start()
    deadline = time.monotonic() + 30
    while not counting.rounds(world) and time.monotonic() < deadline:
        time.sleep(0.001)
    for g in gs[1:]:
        g.save(snapshot(g.rank), "per-rank")
        # at least two rounds between two parts (rounds come at most 0.5 s apart: two take up to ~1 s, more
        # under load; the rank's own save and the final commit list the position no more, so only rounds count)
        before, until = counting.rounds(world), time.monotonic() + 5.0
        while counting.rounds(world) < before + 2 and t.is_alive() and time.monotonic() < until:
            time.sleep(0.001)
    t.join(60)
    assert res[0].committed is True
    rounds = counting.rounds(world)
    assert rounds >= 2 * (world - 1), rounds
    # each round: forget the cache, list the position, list the range (parts missing) and its later positions (none)
    per_round = (counting.total - (3 * world + 40)) / rounds
    assert per_round <= 3, (per_round, rounds, counting.calls)
    assert counting.calls["read_bytes"] <= world + 5, counting.calls
