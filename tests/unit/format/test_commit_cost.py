"""Rank 0's commit costs O(W) storage calls in total, not per poll round (issue 28, item 4).

Paddle-free: W simulated ranks write their parts of one position through GlobalCheckpointer on a
real local store; rank 0's save (its part, the wait for the others, global.json, retention) runs
on a store that counts every Storage method call made by the code under test."""

import collections
import threading
import time

import numpy as np
import pytest

from paddle_acp.errors import StorageError
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.commit.fencing import Fence
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.layout import GLOBAL_NAME, range_dir
from paddle_acp.format.manifest import RangeRecord
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


def _counted_rank0(tmp_path, world, keep=3):
    """The other ranks on a plain store; rank 0 (its fence too) on a counted one."""
    gs = ranks(tmp_path, world)
    counting = Counting(open_storage(str(tmp_path)))
    g0 = GlobalCheckpointer(counting, JOB, RANGE, 0, world, keep, 120.0, Fence(counting, JOB, gs[0].fence.generation, 0))
    g0.poll_interval = 0.002
    return gs, counting, g0


def _save_with_parts_late(counting, g0, others, snap0, snaps):
    """Rank 0 saves first (its commit's first round finds the others' parts missing), then the others."""
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, g0.save(snap0, "per-rank")))
    t.start()
    ckdir = f"{range_dir(JOB, RANGE)}/ckpt-e{snap0.range.epoch_no}"
    deadline = time.monotonic() + 30
    while ("listdir", ckdir) not in list(counting.log) and time.monotonic() < deadline:
        time.sleep(0.001)
    for g, s in zip(others, snaps):
        g.save(s, "per-rank")
    t.join(60)
    assert not t.is_alive()
    return res[0]


def test_rank0_looks_up_its_own_next_generation_once_per_commit(tmp_path):
    """Rank 0's own part is not judged by a look-up of its own generation records: the check right
    before global.json's rename decides (one look-up for the commit; before: three, and a listing at
    the first commit), besides the one before its own part's rename."""
    world = 4
    gs, counting, g0 = _counted_rank0(tmp_path, world)
    for g in gs[1:]:
        g.save(snapshot(g.rank), "per-rank")
    assert g0.save(snapshot(0), "per-rank").committed is True
    own_next = f"{JOB}/writers/gen-{g0.fence.generation + 1}"
    looks = [c for c in counting.log if c[1] == own_next and c[0] != "forget_cached"]
    assert looks == [("exists", own_next)] * 2, looks  # its part's rename, global.json's rename
    assert ("listdir", f"{JOB}/writers") not in counting.log, counting.log


def test_retention_after_a_commit_uses_the_commits_range_listing(tmp_path):
    """When the commit listed the range (parts were missing at its first round), retention uses that
    listing and does not look up the global.json just written; it still removes what it must: a
    committed checkpoint beyond max_to_keep and an abandoned position older than the newest commit."""
    world = 3
    gs, counting, g0 = _counted_rank0(tmp_path, world, keep=1)
    assert _save_with_parts_late(counting, g0, gs[1:], snapshot(0, 0), [snapshot(g.rank, 0) for g in gs[1:]]).committed
    orphan = Snapshot(RangeRecord(RANGE, 1, 10, 5), snapshot(1, 1).programs, None, "3.3.1", "pir", extra={"rank": 1})
    gs[1].save(orphan, "per-rank")  # a part of ckpt-e1-s5, never committed (rank 0 does not take that position)
    rdir = range_dir(JOB, RANGE)
    assert (tmp_path / rdir / "ckpt-e1-s5" / "rank-1").is_dir()
    counting.calls.clear()
    counting.log.clear()
    res = _save_with_parts_late(counting, g0, gs[1:], snapshot(0, 2), [snapshot(g.rank, 2) for g in gs[1:]])
    assert res.committed is True
    assert sorted(p.name for p in (tmp_path / rdir).iterdir()) == ["ckpt-e2"]  # e0 (keep 1) and the orphan: gone
    assert counting.log.count(("listdir", rdir)) == 1, counting.log
    assert ("exists", f"{rdir}/ckpt-e2/{GLOBAL_NAME}") not in counting.log, counting.log


def test_the_commit_is_decided_at_global_json_and_retention_runs_after(tmp_path):
    """The outcome (the done callbacks: rank 0's metrics line, the save plan's end of the persist) is
    told and ``decided_at`` taken when global.json is in place, before retention deletes the older
    checkpoint (a persist used to be timed to retention's last delete); ``wait`` (a durable save)
    returns only once retention is done too."""
    gs = ranks(tmp_path, 2)
    for g in gs:
        g.max_to_keep = 1
    rdir = tmp_path / range_dir(JOB, RANGE)
    for epoch in (0, 1):
        gs[1].save(snapshot(1, epoch), "per-rank")
        res = gs[0].save(snapshot(0, epoch), "per-rank", wait=False)
        seen = []
        res.pending.add_done_callback(lambda p, seen=seen, name=f"ckpt-e{epoch}": seen.append(
            (p.committed, sorted(x.name for x in rdir.iterdir()), (rdir / name / GLOBAL_NAME).exists(),
             p.decided_at is not None)))
        assert res.pending.wait() is True
        assert seen == [(True, ["ckpt-e0"] + (["ckpt-e1"] if epoch else []), True, True)], seen
        assert sorted(x.name for x in rdir.iterdir()) == [f"ckpt-e{epoch}"]  # e0 removed (keep 1) once wait returned


def test_a_failing_retention_is_logged_and_leaves_the_commit_committed(tmp_path, caplog):
    """Retention after a decided commit that fails (a newer rank 0 took over once the commit was told:
    the fence stops the deletes) is a warning: the commit stays committed, nothing is deleted, the
    committer goes idle."""
    gs = ranks(tmp_path, 2)
    gs[0].max_to_keep = 1
    gs[1].save(snapshot(1, 0), "per-rank")
    assert gs[0].save(snapshot(0, 0), "per-rank").committed is True
    gs[1].save(snapshot(1, 1), "per-rank")
    res = gs[0].save(snapshot(0, 1), "per-rank", wait=False)
    res.pending.add_done_callback(lambda p: Fence.take(open_storage(str(tmp_path)), JOB, 0))
    with caplog.at_level("WARNING", logger="paddle_acp"):
        assert res.pending.wait() is True
        gs[0].committer.wait_all()
    rdir = tmp_path / range_dir(JOB, RANGE)
    assert (rdir / "ckpt-e1" / GLOBAL_NAME).exists() and (rdir / "ckpt-e0" / GLOBAL_NAME).exists()
    assert any("retention after checkpoint ckpt-e1 failed" in r.getMessage() for r in caplog.records), caplog.text


def test_a_fenced_rank0_leaves_neither_global_json_nor_its_temporary(tmp_path):
    """The fence is checked once, right before global.json's rename: a rank 0 fenced while it waited
    for the parts writes the temporary file, is stopped, and removes it again."""
    from paddle_acp.format.commit.fencing import FencedError

    world = 3
    gs = ranks(tmp_path, world)
    res = gs[0].save(snapshot(0), "per-rank", wait=False)
    Fence.take(open_storage(str(tmp_path)), JOB, 0)  # a newer rank 0 starts
    for g in gs[1:]:
        g.save(snapshot(g.rank), "per-rank")
    with pytest.raises(FencedError):
        res.pending.wait()
    assert sorted(p.name for p in (tmp_path / CKDIR).iterdir()) == [f"rank-{k}" for k in range(world)]


def test_a_ranks_first_save_after_its_starts_clean_up_looks_up_no_part_of_its_own(tmp_path):
    """A rank's start removes its parts newer than the checkpoint it resumes from (discard_newer); a
    first save at a newer position then makes no look-up for a part of its own there (one NameNode RPC
    per rank and checkpoint on HDFS). A position where that removal failed is still looked into, and
    its leftover part is removed before the new one is written."""
    st = open_storage(str(tmp_path))
    g1 = GlobalCheckpointer(st, JOB, RANGE, 1, 2, 3, 120.0, Fence.take(st, JOB, 1))
    g1.save(snapshot(1, epoch=3), "per-rank")  # a part of an earlier start that never got committed
    counted = Counting(open_storage(str(tmp_path)))
    fence = Fence.take(st, JOB, 1)
    g = GlobalCheckpointer(counted, JOB, RANGE, 1, 2, 3, 120.0, fence)
    real_delete_dir = counted._inner.delete_dir

    def failing_delete_dir(path):
        raise StorageError(f"cannot delete {path}")
    counted._inner.delete_dir = failing_delete_dir
    g.start.discard_newer(None)  # (a new range: every position is newer) removal fails at ckpt-e3
    counted._inner.delete_dir = real_delete_dir
    counted.calls.clear()
    counted.log.clear()
    g.save(snapshot(1, epoch=0), "per-rank")
    part = f"{range_dir(JOB, RANGE)}/ckpt-e0/rank-1"
    assert ("exists", part) not in counted.log, counted.log
    assert not any(name == "listdir" and path.endswith("/ckpt-e0") for name, path in counted.log), counted.log
    counted.log.clear()
    g.save(snapshot(1, epoch=3), "per-rank")  # the position whose clean-up failed: looked into, replaced
    assert ("listdir", f"{range_dir(JOB, RANGE)}/ckpt-e3") in counted.log, counted.log
    m = st.read_bytes(f"{range_dir(JOB, RANGE)}/ckpt-e3/rank-1/manifest.json")
    assert f'"generation":{fence.generation}' in m.decode().replace(" ", ""), m


def test_a_part_an_older_process_of_the_rank_wrote_after_the_clean_up_is_never_committed(tmp_path):
    """The look-up the clean-up saves guarded nothing a rename does not: an older process of rank 1 (a
    zombie) writes its part at a position after the live rank 1's start cleaned up. The live rank's part
    cannot replace it (the rename onto a directory fails here; libhdfs would move it inside), the rank
    says it has no part there, and rank 0 abandons that position at once: the zombie's part never enters a
    global checkpoint; the next position commits."""
    st = open_storage(str(tmp_path))
    gs = ranks(tmp_path, 2)  # the live job's ranks (generation 0 of each)
    zombie = GlobalCheckpointer(st, JOB, RANGE, 1, 2, 3, 120.0, gs[1].fence)
    live1 = GlobalCheckpointer(st, JOB, RANGE, 1, 2, 3, 120.0, Fence.take(st, JOB, 1))
    for g in (gs[0], live1):
        g.start.discard_newer(None)
    zombie.fence.check = lambda *a, **k: None  # its check passed before the live rank 1 started: it renames now
    zombie._write_part("ckpt-e0", snapshot(1), "per-rank")
    with pytest.raises(StorageError):
        live1.save(snapshot(1), "per-rank")
    res = gs[0].save(snapshot(0), "per-rank")
    assert res.committed is False
    assert not st.exists(f"{CKDIR}/{GLOBAL_NAME}")
    live1.save(snapshot(1, epoch=1), "per-rank")
    assert gs[0].save(snapshot(0, epoch=1), "per-rank").committed is True
