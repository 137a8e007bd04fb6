"""A rank that has no part says so on storage (``absent-rank-<k>``) and rank 0 abandons the position
at once (issue 28, item 2): the file's format (hypothesis), its strict name, which ones count
(the live generation of that rank, this incarnation's base), a save that fails writes one, the
tools and retention take it with the position, and rank 0's commits run off its saver's thread."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.spawn import wrapped

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.commit import absence
from paddle_acp.format.commit.absence import MAX_ABSENT_SIZE, Absence, clean_reason
from paddle_acp.format.commit.fencing import Fence
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.layout import GLOBAL_NAME, absent_mark, parse_absent_mark, position_name, range_dir
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.secrets import register_secret
from paddle_acp.storage import open_storage

JOB, RANGE = "job", "_range_0"
RDIR = range_dir(JOB, RANGE)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def snapshot(rank, epoch, n=4):
    ts = [TensorData("w", "float32", np.full(n, rank + epoch, dtype="float32"))]
    return Snapshot(RangeRecord(RANGE, epoch, 10, None), [ProgramSnapshot("fp", "t", ts, None)], None, "3.3.1", "pir",
                    extra={"rank": rank})


def gck(root, rank, world=2, timeout=120.0, fence=None):
    g = GlobalCheckpointer(open_storage(str(root)), JOB, RANGE, rank, world, 3, timeout, fence)
    g.poll_interval = 0.005
    return g


# -- the format --------------------------------------------------------------------------------

positions = st.builds(position_name, st.integers(0, 10**12 - 1), st.one_of(st.none(), st.integers(0, 10**12 - 1)))


@settings(max_examples=300, deadline=None)
@given(checkpoint=positions, rank=st.integers(0, 10**6 - 1), gen=st.integers(-1, 10**18 - 1),
       base=st.one_of(st.none(), positions, st.text(min_size=1, max_size=200)), reason=st.text(max_size=3000))
def test_absence_round_trips_within_its_size_cap(checkpoint, rank, gen, base, reason):
    a = Absence(checkpoint, rank, gen, base, reason)
    raw = a.dumps()
    assert len(raw) <= MAX_ABSENT_SIZE
    back = Absence.loads(raw, absent_mark(rank))
    assert (back.checkpoint, back.rank, back.generation, back.base) == (checkpoint, rank, gen, base)
    assert clean_reason(reason).startswith(back.reason) and "\n" not in back.reason
    with pytest.raises(CorruptCheckpointError):
        Absence.loads(raw, absent_mark((rank + 1) % 10**6))  # the content names another rank's file


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(
    st.binary(max_size=300),
    st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(
        st.sampled_from(["format", "version", "checkpoint", "rank", "generation", "base", "reason", "x"]),
        st.one_of(st.none(), st.booleans(), st.integers(-2, 10**19), st.text(max_size=30),
                  st.just("paddle-acp/absent"), st.just("ckpt-e1"), st.just(1), st.lists(st.integers(), max_size=2)),
        max_size=8)),
    st.builds(lambda n: b"[" * n + b"]" * n, st.integers(100, 5000)),
))
def test_hostile_absence_content_is_read_or_refused_as_corrupt(raw):
    try:
        a = Absence.loads(raw)
    except CorruptCheckpointError:
        return
    assert Absence.loads(a.dumps()) == a


@given(st.integers(0, 10**6 - 1))
def test_absence_names_round_trip_and_are_strict(rank):
    assert parse_absent_mark(absent_mark(rank)) == rank
    for other in (f"absent-rank-{rank}\n", f"absent-rank-0{rank}", f"absent-rank-{rank} ", f"absent-rank-{rank}.tmp-ab",
                  f"Absent-rank-{rank}", "absent-rank-\u0661", "absent-rank-", f"absent-rank-{rank + 10**6}"):
        assert parse_absent_mark(other) is None, other


def test_the_reason_keeps_no_secret():
    register_secret("s3cr3tpassw0rd")
    a = Absence("ckpt-e1", 1, 0, None, "writing s3://AKIAXYZ:hunter22@bucket/x?secret_key=zzz failed\n"
                                       "token s3cr3tpassw0rd")
    raw = a.dumps().decode()
    assert "hunter22" not in raw and "AKIAXYZ" not in raw and "zzz" not in raw and "s3cr3tpassw0rd" not in raw
    assert "s3://bucket/x" in raw


# -- rank 0 and the absences ------------------------------------------------------------------------

def test_a_rank_that_declares_itself_absent_abandons_the_position_at_once(tmp_path, caplog):
    fences = [Fence.take(open_storage(str(tmp_path)), JOB, r) for r in (0, 1)]
    gck(tmp_path, 1, fence=fences[1]).save(snapshot(1, 0), "per-rank")
    gck(tmp_path, 0, fence=fences[0]).save(snapshot(0, 0), "per-rank")  # committed: the base of nothing yet
    assert gck(tmp_path, 1, fence=fences[1]).declare_absent("ckpt-e1", "disk full at /x") is not None
    t0 = time.monotonic()
    res = gck(tmp_path, 0, timeout=120, fence=fences[0]).save(snapshot(0, 1), "per-rank")
    assert res.committed is False and time.monotonic() - t0 < 20
    assert not (tmp_path / RDIR / "ckpt-e1" / GLOBAL_NAME).exists()
    assert not (tmp_path / RDIR / "ckpt-e1" / "rank-0").exists()  # rank 0's own part goes at once
    lines = [r.getMessage() for r in caplog.records if "abandoned at once" in r.getMessage()]
    assert len(lines) == 1 and "rank 1 has no part (disk full at /x)" in lines[0], lines
    # the next position commits, and retention removes the abandoned one with its absence
    gck(tmp_path, 1, fence=fences[1]).save(snapshot(1, 2), "per-rank")
    assert gck(tmp_path, 0, fence=fences[0]).save(snapshot(0, 2), "per-rank").committed is True
    assert not (tmp_path / RDIR / "ckpt-e1").exists()


def test_a_stale_absence_never_abandons_a_new_checkpoint(tmp_path):
    """Left by an earlier incarnation of rank 1 (an older generation) or written from another base: ignored;
    rank 0 commits once rank 1's live part comes, and removes the stale absences with its commit."""
    st_ = open_storage(str(tmp_path))
    old1 = Fence.take(st_, JOB, 1)
    gck(tmp_path, 1, fence=old1).declare_absent("ckpt-e0", "an earlier incarnation failed")
    f0, f1 = Fence.take(st_, JOB, 0), Fence.take(st_, JOB, 1)  # the job restarted: new generations
    assert f1.generation == old1.generation + 1
    ck = tmp_path / RDIR / "ckpt-e0"
    other_base = Absence("ckpt-e0", 1, f1.generation, "ckpt-e9", "from another base")
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, gck(tmp_path, 0, fence=f0).save(snapshot(0, 0), "per-rank")))
    t.start()
    deadline = time.monotonic() + 60
    while not (ck / "rank-0" / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)  # rank 0's part is written: its commit polls from now on
    time.sleep(0.5)
    assert t.is_alive(), "the stale absence abandoned the checkpoint"
    (ck / "absent-rank-1").write_bytes(other_base.dumps())
    time.sleep(0.5)
    assert t.is_alive(), "an absence from another base abandoned the checkpoint"
    gck(tmp_path, 1, fence=f1).save(snapshot(1, 0), "per-rank")
    t.join(60)
    assert res[0].committed is True
    assert sorted(p.name for p in ck.iterdir()) == ["global.json", "rank-0", "rank-1"]


def test_a_live_absence_written_while_rank_0_waits_ends_the_wait(tmp_path):
    st_ = open_storage(str(tmp_path))
    f0, f1 = Fence.take(st_, JOB, 0), Fence.take(st_, JOB, 1)
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, gck(tmp_path, 0, fence=f0).save(snapshot(0, 0), "per-rank")))
    t.start()
    time.sleep(0.3)
    gck(tmp_path, 1, fence=f1).declare_absent("ckpt-e0", "it could not")
    t.join(20)
    assert not t.is_alive() and res[0].committed is False


def test_a_rank_whose_part_cannot_be_written_says_so(tmp_path):
    """Rank 1 in its own process, its file sizes capped by the kernel (RLIMIT_FSIZE): its part's data
    cannot be written, its small absence can; rank 0, waiting up to 120 s, abandons at once."""
    st_ = open_storage(str(tmp_path))
    f0 = Fence.take(st_, JOB, 0)
    code = f"""
import sys, numpy as np
sys.path[:0] = [{os.path.join(REPO, 'tests')!r}, {os.path.join(REPO, 'tests', 'integration')!r}]
from test_absence import gck, snapshot
from paddle_acp.errors import StorageError
try:
    gck(sys.argv[1], 1).save(snapshot(1, 0, n=1 << 16), "per-rank")
except StorageError as exc:
    print("FAILED", exc)
"""

    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, gck(tmp_path, 0, fence=f0).save(snapshot(0, 0), "per-rank")))
    t.start()
    t0 = time.monotonic()
    # the file-size cap through an exec wrapper: a preexec_fn could deadlock the fork (thread t runs)
    p = subprocess.run(wrapped([sys.executable, "-c", code, str(tmp_path)], fsize=8192), cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert "FAILED" in p.stdout, p.stdout + p.stderr[-3000:]
    t.join(60)
    assert res[0].committed is False and time.monotonic() - t0 < 60
    a = absence.read(st_, f"{RDIR}/ckpt-e0", 1)
    assert a is not None and a.rank == 1 and a.base is None and "could not be written" in a.reason, a


def test_rank_0s_saver_is_free_while_its_commit_waits_and_commits_keep_position_order(tmp_path):
    st_ = open_storage(str(tmp_path))
    f0, f1 = Fence.take(st_, JOB, 0), Fence.take(st_, JOB, 1)
    g0, g1 = gck(tmp_path, 0, fence=f0), gck(tmp_path, 1, fence=f1)
    t0 = time.monotonic()
    r0 = g0.save(snapshot(0, 0), "per-rank", wait=False)
    r1 = g0.save(snapshot(0, 1), "per-rank", wait=False)
    assert time.monotonic() - t0 < 10 and r0.committed is None and not r0.pending.done and not r1.pending.done
    order = []
    r0.pending.add_done_callback(lambda p: order.append((p.name, p.committed)))
    r1.pending.add_done_callback(lambda p: order.append((p.name, p.committed)))
    g1.save(snapshot(1, 1), "per-rank")  # rank 1 skipped epoch 0: that one is abandoned, epoch 1 committed
    g0.committer.wait_all()
    assert order == [("ckpt-e0", False), ("ckpt-e1", True)]


def test_cancel_ends_a_wait_at_once_and_commits_nothing(tmp_path):
    g0 = gck(tmp_path, 0, timeout=300)
    r = g0.save(snapshot(0, 0), "per-rank", wait=False)
    time.sleep(0.2)
    t0 = time.monotonic()
    g0.committer.cancel("interrupted (test)")
    assert r.pending.wait() is False and time.monotonic() - t0 < 5
    g0.committer.wait_all()
    assert not (tmp_path / RDIR / "ckpt-e0" / GLOBAL_NAME).exists()


def test_the_tools_and_retention_take_absences_with_their_position(tmp_path):
    """ls, verify and gc accept a committed position holding a stray absence and an abandoned one holding
    a live one; gc deletes the abandoned position whole, absence included; `delete_checkpoint` too."""
    from paddle_acp.format.commit.retention import delete_checkpoint

    st_ = open_storage(str(tmp_path))
    for e in (1, 2):
        gck(tmp_path, 1).save(snapshot(1, e), "per-rank")
        assert gck(tmp_path, 0).save(snapshot(0, e), "per-rank").committed is True
    gck(tmp_path, 1).declare_absent("ckpt-e3", "it failed")
    gck(tmp_path, 0, timeout=0.2).save(snapshot(0, 3), "per-rank")  # abandoned
    (tmp_path / RDIR / "ckpt-e2" / "absent-rank-1").write_bytes(Absence("ckpt-e2", 1, -1, None, "stray").dumps())

    def tool(*args):
        return subprocess.run([sys.executable, "-m", "paddle_acp", *args, str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)

    out = tool("ls").stdout
    assert "a restart loads ckpt-e2" in out and "not committed, or abandoned" in out, out
    v = tool("verify")
    assert v.returncode == 0, v.stdout
    g = tool("gc", "--keep", "1", "--leftover-age", "0")
    assert g.returncode == 0, g.stdout
    assert sorted(os.listdir(tmp_path / RDIR)) == ["ckpt-e2"], os.listdir(tmp_path / RDIR)
    delete_checkpoint(st_, f"{RDIR}/ckpt-e2")
    assert os.listdir(tmp_path / RDIR) == []


def test_a_preemption_signal_brings_pending_deadlines_forward(tmp_path, monkeypatch):
    """SIGTERM (a preemption) while rank 0 waits up to 300 s for a part: it waits at most a preemption save's wait."""
    from paddle_acp.runtime import interrupt

    g0 = gck(tmp_path, 0, timeout=300)
    interrupt.watch(g0.committer)
    r = g0.save(snapshot(0, 0), "per-rank", wait=False)
    t0 = time.monotonic()
    monkeypatch.setattr(interrupt, "PREEMPT_PART_WAIT", 0.5)
    interrupt.preempted()
    assert r.pending.wait() is False and time.monotonic() - t0 < 10


def test_a_rank_that_wrote_this_position_and_a_later_one_meanwhile_does_not_abandon_it(tmp_path, caplog):
    """Rank 0 lists position e0 (rank 1's part not there yet); rank 1 then writes its parts of e0 AND e1 before
    rank 0 looks for ranks at later positions. Rank 1 moved on, but wrote e0 first: rank 0 lists e0 once more
    and commits it (it used to abandon the complete checkpoint: "rank(s) [1] already wrote a later one")."""
    r0, r1 = gck(tmp_path, 0), gck(tmp_path, 1)
    real = r0.storage.listdir
    done = []

    def listdir(path):
        out = real(path)
        if (path.endswith("/ckpt-e0") and threading.current_thread() is not threading.main_thread() and not done
                and not any(e.name == "rank-1" for e in out)):
            done.append(path)
            r1.save(snapshot(1, 0), "per-rank")  # both written between that listing and the next look
            r1.save(snapshot(1, 1), "per-rank")
        return out

    r0.storage.listdir = listdir
    res = r0.save(snapshot(0, 0), "per-rank")
    assert done, "test setup: rank 0's commit never listed the position before rank 1's part was there"
    assert res.committed is True, caplog.messages
    assert r0.storage.exists(f"{r0.dir}/ckpt-e0/{GLOBAL_NAME}")
    assert not any("already wrote a later checkpoint" in m for m in caplog.messages)
