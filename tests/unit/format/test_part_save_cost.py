"""A rank's save of its part costs its two files, two look-ups and a rename (issue 28, item 4), and
every safety check the cheaper path replaced still holds.

Paddle-free, on real local storage: W simulated ranks with their own writer fences; the storage
calls of one rank are counted by tests/support/counting.py (the calls as the format layer makes
them; on HDFS each look-up of a missing path is one NameNode RPC, a listing three)."""

import threading

import numpy as np
import pytest
from support import counting

from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.commit import fencing
from paddle_acp.format.commit.fencing import Fence, FencedError, writers_dir
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.layout import GLOBAL_NAME, range_dir
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.storage import open_storage

JOB, RANGE = "job", "_range_0"
RDIR = range_dir(JOB, RANGE)


def snapshot(rank, epoch, tag="a"):
    ts = [TensorData("w", "float32", np.full(4, rank + epoch, dtype="float32"))]
    return Snapshot(RangeRecord(RANGE, epoch, 10, None), [ProgramSnapshot("fp", "t", ts, None)], None, "3.3.1", "pir",
                    extra={"loader_state": {"rank": rank, "tag": tag}})


def rank(st, r, world, timeout=60.0, fence=None):
    g = GlobalCheckpointer(st, JOB, RANGE, r, world, 3, timeout, fence or Fence.take(st, JOB, r))
    g.poll_interval = 0.002
    return g


def commit(g0, epoch):
    """Rank 0's save of ``epoch`` in a thread (it waits for the others' parts): a joiner returning its result."""
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, g0.save(snapshot(0, epoch), "per-rank")))
    t.start()

    def join():
        t.join(60)
        assert not t.is_alive()
        return res[0]
    return join


def loaded_tag(st, r, world, name):
    g = GlobalCheckpointer(st, JOB, RANGE, r, world, 3, 5.0, None)
    loaded = g.load(name, "per-rank")
    try:
        return loaded.manifest.extra["loader_state"]["tag"]
    finally:
        loaded.close()


def test_a_nonzero_ranks_save_is_its_files_two_lookups_and_a_rename(tmp_path):
    st = open_storage(str(tmp_path))
    counted = counting.counting(st)  # rank 1's storage (its fence's too)
    g0, g1, g2 = rank(st, 0, 3), rank(counted, 1, 3), rank(st, 2, 3)
    counting.reset(counted)
    done = commit(g0, 0)
    assert g1.save(snapshot(1, 0), "per-rank").committed is None
    g2.save(snapshot(2, 0), "per-rank")
    assert done().committed is True
    # its own part there? (one look-up); the tmp part's directory (local disks: HDFS's first file makes
    # it); the data and the manifest; the fence's look-up of the next generation; the rename. Before:
    # exists(global.json), makedirs of the position, its listing, and a listing of the fence's records.
    # On a local disk (Storage.has_symlinks) one lstat more: nothing is written through a link or into a file at
    # the position's name (HDFS and S3 have no links: no call there).
    assert dict(counted.calls) == {"kind": 1, "exists": 2, "makedirs": 1, "write_buffers": 1, "write_bytes": 1,
                                   "rename": 1}, counted.calls
    # the next position costs the same (nothing is listed)
    counting.reset(counted)
    done = commit(g0, 1)
    g1.save(snapshot(1, 1), "per-rank")
    g2.save(snapshot(2, 1), "per-rank")
    assert done().committed is True
    assert counting.total(counted) == 7 and "listdir" not in counted.calls, counted.calls
    assert loaded_tag(st, 1, 3, "ckpt-e1") == "a"


def test_a_second_save_at_the_same_position_replaces_the_first_part(tmp_path):
    """A position this incarnation wrote before (a preemption save right after a regular one, or a
    retry after a failed save) is listed: the earlier part goes, the new one is committed."""
    st = open_storage(str(tmp_path))
    g0, g1 = rank(st, 0, 2), rank(st, 1, 2)
    g1.save(snapshot(1, 0, "first"), "per-rank")
    g1.save(snapshot(1, 0, "second"), "per-rank")
    assert sorted(p.name for p in (tmp_path / RDIR / "ckpt-e0").iterdir()) == ["rank-1"]
    assert g0.save(snapshot(0, 0), "per-rank").committed is True
    assert loaded_tag(st, 1, 2, "ckpt-e0") == "second"
    # and a position already committed is not written again
    assert g1.save(snapshot(1, 0, "third"), "per-rank").committed is True
    assert loaded_tag(st, 1, 2, "ckpt-e0") == "second"


def test_an_absence_this_incarnation_declared_goes_when_it_saves_there(tmp_path):
    st = open_storage(str(tmp_path))
    g0, g1 = rank(st, 0, 2), rank(st, 1, 2)
    assert g1.declare_absent("ckpt-e0", "its save failed") is not None
    g1.save(snapshot(1, 0), "per-rank")
    assert not [p for p in (tmp_path / RDIR / "ckpt-e0").iterdir() if p.name != "rank-1"]
    assert g0.save(snapshot(0, 0), "per-rank").committed is True


def test_a_restarted_rank_replaces_its_earlier_incarnations_part_and_the_old_part_is_never_committed(tmp_path):
    """Rank 1's first incarnation (generation 0) writes its part of ckpt-e1 and stops before the
    commit; a new incarnation starts (generation 1). Rank 0, which knew generation 0 from the commit
    of ckpt-e0, must not commit the old part; the new incarnation's first save there finds the old part
    (its one look-up), removes it and writes its own, which rank 0 then commits."""
    st = open_storage(str(tmp_path))
    g0, old = rank(st, 0, 2), rank(st, 1, 2)
    done = commit(g0, 0)
    old.save(snapshot(1, 0), "per-rank")
    assert done().committed is True
    g0.part_timeout = 0.3
    old.save(snapshot(1, 1, "old"), "per-rank")  # ... and the process stops before rank 0 commits
    new = rank(st, 1, 2)
    assert new.fence.generation == old.fence.generation + 1
    assert g0.save(snapshot(0, 1), "per-rank").committed is False  # the old part is not committed
    assert not (tmp_path / RDIR / "ckpt-e1" / GLOBAL_NAME).exists()
    new.save(snapshot(1, 1, "new"), "per-rank")
    g0.part_timeout = 60.0
    assert g0.save(snapshot(0, 1), "per-rank").committed is True
    assert loaded_tag(st, 1, 2, "ckpt-e1") == "new"
    # the old incarnation is fenced at its next commit (its quick look-up sees generation 1): no part
    with pytest.raises(FencedError):
        old.save(snapshot(1, 2, "old"), "per-rank")
    assert not (tmp_path / RDIR / "ckpt-e2" / "rank-1").exists()


def test_the_quick_fence_lookup_lists_when_a_next_generation_entry_is_there(tmp_path):
    """A foreign entry named like the next generation (a directory) makes the quick look-up list
    the records, which ignore it: the writer is not fenced by it. A real record fences it."""
    st = open_storage(str(tmp_path))
    g1 = rank(st, 1, 2)
    gen = g1.fence.generation
    (tmp_path / writers_dir(JOB, 1) / f"gen-{gen + 1}").mkdir()
    assert fencing.newer_recorded(st, JOB, 1, gen)
    g1.fence.check("commit", quick=True)  # not fenced: the listing ignores a directory
    g1.save(snapshot(1, 0), "per-rank")
    assert (tmp_path / RDIR / "ckpt-e0" / "rank-1").is_dir()
    (tmp_path / writers_dir(JOB, 1) / f"gen-{gen + 1}").rmdir()
    assert not fencing.newer_recorded(st, JOB, 1, gen)
    Fence.take(st, JOB, 1)
    with pytest.raises(FencedError):
        g1.fence.check("commit", quick=True)
