"""Per-rank parts and the global commit, on real local storage: the global manifest's
format, the commit protocol (parts in any order, some never), restore of the newest
globally committed checkpoint, topology checks, writer fencing and safe retention."""

import json
import os
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.newest import committed, one_process, save, write_numbered

from paddle_acp.errors import CheckpointError, CorruptCheckpointError
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.commit.fencing import Fence, FencedError, check_deletable, write_job_marker
from paddle_acp.format.engine import reader
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.global_manifest import GlobalManifest, PartRecord
from paddle_acp.format.layout import GLOBAL_NAME, parse_name, position_key, position_name, position_number
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.storage import open_storage

JOB, RANGE = "job", "_range_0"


def snapshot(rank, epoch, step=None, tensors=True, key=None):
    """Rank ``rank``'s state at a position: same names on every rank, values its own."""
    rng = np.random.default_rng(1000 * rank + 10 * epoch + (step or 0))
    ts = [TensorData("w", "float32", rng.standard_normal(7).astype("float32")),
          TensorData("rank", "int64", np.array([rank, epoch], dtype="int64"))] if tensors else []
    prog = ProgramSnapshot(key or "fp-shared", "test", ts, {"last_epoch": epoch})
    rng_state = {"marker": [rank, epoch]}  # opaque here: validated only by the runtime's restore
    return Snapshot(RangeRecord(RANGE, epoch, 100, step), [prog], None, "3.3.1", "pir",
                    extra={"loader_state": {"rank": rank, "epoch": epoch}, "rng_probe": rng_state})


def gck(root, rank, world, timeout=5.0, fence=None, keep=3):
    g = GlobalCheckpointer(open_storage(str(root)), JOB, RANGE, rank, world, keep, timeout, fence)
    g.poll_interval = 0.005
    return g


def v2(root):
    """The reader of the range's one-writer checkpoints (an earlier release's ckpt-N), as a restart builds it."""
    return PartReader(open_storage(str(root)), JOB, RANGE)


def one(root, keep=3, fence=None):
    """A one-process job's checkpointer (rank 0 of 1)."""
    return one_process(open_storage(str(root)), JOB, RANGE, keep, fence)


def numbered(root, number, epoch):
    """An earlier release's single-process checkpoint ``ckpt-N`` at the end of ``epoch``."""
    write_numbered(open_storage(str(root)), number, snapshot(0, epoch), JOB, RANGE)


def save_all(root, world, epoch, mode="per-rank", order=None, missing=(), timeout=None):
    """Ranks write their parts of one position in ``order``; rank 0 commits in a thread.
    Returns rank 0's SaveResult."""
    order = list(range(world)) if order is None else order
    if timeout is None:  # parts that will come are waited for generously; missing ones briefly
        timeout = 0.15 if missing else 120.0
    res = {}
    t = None
    for r in order:
        if r in missing:
            continue
        if r == 0:
            t = threading.Thread(target=lambda: res.setdefault(0, gck(root, 0, world, timeout).save(
                snapshot(0, epoch), mode)))
            t.start()
        else:
            gck(root, r, world, timeout).save(snapshot(r, epoch, tensors=mode == "per-rank"), mode)
    if t is not None:
        t.join()
    return res.get(0)


def own_values(loaded):
    return {name: arr.copy() for (_key, name), arr in loaded.arrays.items()}


# -- the global manifest -------------------------------------------------------------

parts_st = st.integers(1, 6).flatmap(lambda w: st.tuples(
    st.just(w),
    st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(1, 10**6), st.integers(0, 10**12),
                       st.lists(st.text("0123456789abcdef.", min_size=1, max_size=20), max_size=3)),
             min_size=w, max_size=w)))


@settings(max_examples=150, deadline=None)
@given(parts=parts_st, epoch=st.integers(0, 10**9), step=st.one_of(st.none(), st.integers(0, 10**9)),
       mode=st.sampled_from(["replicated", "per-rank"]), gen=st.integers(-1, 10**6),
       base=st.one_of(st.none(), st.just("ckpt-e3"), st.just("ckpt-7")), flip=st.integers(0, 10**6))
def test_global_manifest_round_trip_and_any_edit_is_caught(parts, epoch, step, mode, gen, base, flip):
    world, recs = parts
    g = GlobalManifest(position_name(epoch, step), RANGE, epoch, step, world, mode,
                       [PartRecord(i, *r[:3], list(r[3])) for i, r in enumerate(recs)], 12.5, gen, base)
    raw = g.dumps()
    back = GlobalManifest.loads(raw)
    assert back == g
    assert parse_name(back.name) == (epoch, step)
    # any changed byte is refused (JSON error or checksum mismatch), never read as another manifest
    i = flip % len(raw)
    bad = raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:]
    with pytest.raises(CorruptCheckpointError):
        GlobalManifest.loads(bad)


@pytest.mark.parametrize("edit, msg", [
    (lambda d: d["topology"].update(world_size=3), "ranks 0..2"),
    (lambda d: d["topology"].update(mode="sharded"), "mode"),
    (lambda d: d.update(name="ckpt-e9"), "does not match its position"),
    (lambda d: d["parts"][1].update(rank=0), "ranks 0..1"),
    (lambda d: d["parts"][0].update(manifest_crc32=-1), "bad rank"),
    (lambda d: d.update(version=5), "format version 5 is newer than this paddle-acp reads"),  # UnknownFormatError
    (lambda d: d.update(version=2), "not supported"),
])
def test_global_manifest_validation_names_the_problem(edit, msg):
    from paddle_acp.format.manifest import seal

    g = GlobalManifest("ckpt-e2", RANGE, 2, None, 2, "per-rank",
                       [PartRecord(0, 1, 10, 64, ["a"]), PartRecord(1, 2, 10, 64, ["b"])])
    d = g.to_json()
    edit(d)
    with pytest.raises(CorruptCheckpointError, match=msg):
        GlobalManifest.loads(seal(d))


def test_position_names_order_steps_before_the_epoch_end():
    names = ["ckpt-e2", "ckpt-e2-s5", "ckpt-e10-s0", "ckpt-e1"]
    keys = sorted(names, key=lambda n: position_key(*parse_name(n)))
    assert keys == ["ckpt-e1", "ckpt-e2-s5", "ckpt-e2", "ckpt-e10-s0"]
    for bad in ("ckpt-2", "ckpt-e", "ckpt-e1-s", "ckpt-e1.tmp-ab", "ckpt-e-1"):
        assert parse_name(bad) is None


# -- the commit protocol ---------------------------------------------------------------

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_commit_protocol_parts_in_any_order_some_never(tmp_path_factory, data):
    """Whatever order the parts arrive in, and whichever never arrive, a checkpoint is
    visible iff every rank's part arrived, and every rank restores the newest such one
    with its OWN values."""
    root = tmp_path_factory.mktemp("proto")
    world = data.draw(st.integers(2, 4), label="world")
    complete = []
    for epoch in range(data.draw(st.integers(1, 3), label="positions")):
        order = data.draw(st.permutations(range(world)), label="order")
        missing = data.draw(st.sets(st.integers(0, world - 1), max_size=world - 1), label="missing")
        res = save_all(root, world, epoch, order=order, missing=missing)
        committed = (root / JOB / "range" / RANGE / f"ckpt-e{epoch}" / GLOBAL_NAME).exists()
        assert committed == (not missing)
        if 0 not in missing:
            assert res.committed is (not missing)
        if not missing:
            complete.append(epoch)
    for r in range(world):
        loaded = load_newest(v2(root), gck(root, r, world), "per-rank")
        if not complete:
            assert loaded is None
            continue
        assert loaded.global_manifest.epoch_no == complete[-1]
        vals = own_values(loaded)
        want = snapshot(r, complete[-1]).programs[0].tensors
        assert np.array_equal(vals["w"], want[0].array) and vals["rank"].tolist() == [r, complete[-1]]
        assert loaded.manifest.extra["loader_state"] == {"rank": r, "epoch": complete[-1]}
        loaded.close()


def test_a_rank_that_skips_a_save_abandons_it_at_once_and_the_next_commits(tmp_path):
    """Rank 1 skips epoch 1 (its previous save still running, say): rank 0 stops waiting
    as soon as rank 1's part of a later position appears, not after the timeout."""
    save_all(tmp_path, 2, 0)
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, gck(tmp_path, 0, 2, timeout=120).save(snapshot(0, 1), "per-rank")))
    t.start()
    gck(tmp_path, 1, 2).save(snapshot(1, 2), "per-rank")  # rank 1 is already at epoch 2
    t.join(60)
    assert not t.is_alive() and res[0].committed is False
    assert save_all(tmp_path, 2, 2, order=[1, 0]).committed is True
    got = [load_newest(v2(tmp_path), gck(tmp_path, r, 2), "per-rank").global_manifest.name for r in (0, 1)]
    assert got == ["ckpt-e2", "ckpt-e2"]
    # retention removed the abandoned checkpoint (older than the newest commit)
    assert not (tmp_path / JOB / "range" / RANGE / "ckpt-e1").exists()


@pytest.mark.parametrize("damage", ["edited", "removed"])
def test_a_damaged_part_is_seen_by_its_rank_which_marks_it_and_every_rank_falls_back_alike(tmp_path, damage):
    """Each rank reads only the parts it loads (issue 28): rank 2's damaged part manifest is seen by
    rank 2 alone, which marks the copy and stops; the ranks that accepted it stop at their base check,
    and the restart falls back to ckpt-e0 on every rank alike, never one rank alone."""
    import zlib

    from paddle_acp.errors import RestartRequiredError
    from paddle_acp.format.layout import bad_mark

    for e in (0, 1):
        save_all(tmp_path, 3, e)
    ck = tmp_path / JOB / "range" / RANGE / "ckpt-e1"
    part = ck / "rank-2" / "manifest.json"
    if damage == "edited":
        part.write_bytes(part.read_bytes().replace(b'"last_epoch": 1', b'"last_epoch": 7'))
    else:
        os.remove(part)
    crc = zlib.crc32((ck / GLOBAL_NAME).read_bytes())
    accepted = {}
    for r in (0, 1):  # they never read rank 2's part: they accept ckpt-e1
        g = gck(tmp_path, r, 3)
        loaded = load_newest(v2(tmp_path), g, None)
        assert loaded.global_manifest.name == "ckpt-e1"
        g.resume_from(loaded)
        accepted[r] = g
        loaded.close()
    with pytest.raises(RestartRequiredError, match="rank 2: its part of checkpoint .*does not fall back alone"):
        load_newest(v2(tmp_path), gck(tmp_path, 2, 3), None)
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("bad-")) == [bad_mark(2, crc)]
    for g in accepted.values():  # the ranks that accepted it stop before they save or commit
        with pytest.raises(RestartRequiredError, match="marked bad at restore by rank.s. 2"):
            g.check_base()
    for r in range(3):  # the restart: every rank sees the mark and falls back alike
        loaded = load_newest(v2(tmp_path), gck(tmp_path, r, 3), None)
        assert loaded.global_manifest.name == "ckpt-e0"
        loaded.close()


def test_own_data_corrupt_marks_the_checkpoint_bad_so_every_rank_falls_back(tmp_path):
    for e in (0, 1):
        save_all(tmp_path, 2, e)
    data = tmp_path / JOB / "range" / RANGE / "ckpt-e1" / "rank-1" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[3] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="marked bad"):
        load_newest(v2(tmp_path), gck(tmp_path, 1, 2), "per-rank")
    for r in (0, 1):  # after the restart both fall back alike
        assert load_newest(v2(tmp_path), gck(tmp_path, r, 2), "per-rank").global_manifest.name == "ckpt-e0"


def test_world_size_change_of_a_per_rank_checkpoint_fails_clearly_on_every_rank(tmp_path):
    save_all(tmp_path, 2, 0)
    for r in range(3):
        with pytest.raises(CheckpointError) as ei:
            load_newest(v2(tmp_path), gck(tmp_path, r, 3), None)
        msg = str(ei.value)
        assert "world size 2, per-rank" in msg and "world size 3" in msg and "PADDLE_TRAINERS_NUM=2" in msg
        assert "PADDLE_JOB_ID" in msg


def test_replicated_checkpoint_restores_at_another_data_parallel_degree(tmp_path):
    save_all(tmp_path, 2, 0, mode="replicated")
    assert (tmp_path / JOB / "range" / RANGE / "ckpt-e0" / "rank-1" / "tensors.bin").stat().st_size == 0
    for world in (1, 2, 3):
        for r in range(world):
            loaded = load_newest(v2(tmp_path), gck(tmp_path, r, world), "replicated")
            vals = own_values(loaded)
            assert vals["rank"].tolist() == [0, 0]  # the one copy of the tensors: rank 0's
            own = r if r < 2 else 0  # RNG and loader position: the rank's own (a new rank: rank 0's)
            assert loaded.manifest.extra["loader_state"] == {"rank": own, "epoch": 0}
            loaded.close()
    # a job that keeps per-rank state must not take it
    with pytest.raises(CheckpointError, match="replicated"):
        load_newest(v2(tmp_path), gck(tmp_path, 1, 2), "per-rank")


def test_single_rank_checkpoints_still_restore_in_a_multi_rank_job(tmp_path):
    ck = v2(tmp_path)
    numbered(tmp_path, 0, 4)  # an earlier release's ckpt-0 at the end of epoch 4
    loaded = load_newest(ck, gck(tmp_path, 1, 2), None)
    assert loaded.global_manifest is None and loaded.name == "ckpt-0" and loaded.manifest.range.epoch_no == 4
    loaded.close()
    with pytest.raises(CheckpointError, match="trainer 0 alone"):
        load_newest(ck, gck(tmp_path, 1, 2), "per-rank")
    # a newer global checkpoint wins over it, an older one does not
    save_all(tmp_path, 2, 3)
    assert load_newest(ck, gck(tmp_path, 1, 2), None).name == "ckpt-0"
    save_all(tmp_path, 2, 5)
    assert load_newest(ck, gck(tmp_path, 1, 2), None).name == "ckpt-e5"


def test_discard_newer_removes_what_an_earlier_start_left_past_the_resume_point(tmp_path):
    for e in (0, 1):
        save_all(tmp_path, 2, e)
    gck(tmp_path, 1, 2).save(snapshot(1, 2), "per-rank")  # a part that never got committed
    rdir = tmp_path / JOB / "range" / RANGE
    for r in (1, 0):
        g = gck(tmp_path, r, 2)
        g.start.discard_newer(position_key(0, None))  # e.g. ckpt-e1 turned out bad: resume from e0
    assert not (rdir / "ckpt-e1" / GLOBAL_NAME).exists()
    assert not (rdir / "ckpt-e1" / "rank-0").exists() and not (rdir / "ckpt-e1" / "rank-1").exists()
    assert not (rdir / "ckpt-e2" / "rank-1").exists()
    assert (rdir / "ckpt-e0" / GLOBAL_NAME).exists()


def test_parts_of_an_earlier_incarnation_are_never_committed(tmp_path):
    """Rank 1's part at a position, written by a start that resumed from another checkpoint
    (its base), is not taken by rank 0: rank 0 waits for this start's part."""
    old = gck(tmp_path, 1, 2)
    old.base = "ckpt-e7"
    old.save(snapshot(1, 0), "per-rank")
    res = save_all(tmp_path, 2, 0, missing={1}, timeout=0.2)
    assert res.committed is False


def test_a_part_of_another_run_put_into_a_committed_checkpoint_is_corrupt_at_restore(tmp_path):
    """The commit refuses a part of another incarnation (above); one swapped in afterwards, with global.json's
    record of it resealed as an attacker would, is refused by the restore too: a restart never loads two runs'
    parts as one state."""
    import shutil
    import zlib

    from paddle_acp.format.manifest import seal

    other = tmp_path / "other"
    for epoch in (0, 1):
        save_all(tmp_path, 2, epoch)
    gen = gck(other, 1, 2)
    gen.base = "ckpt-e0"  # another run at the same position, resumed from ckpt-e0
    t = threading.Thread(target=lambda: gck(other, 0, 2, 0.2).save(snapshot(0, 1), "per-rank"))
    t.start()
    gen.save(snapshot(1, 1), "per-rank")
    t.join()
    src = other / JOB / "range" / RANGE / "ckpt-e1" / "rank-1"
    ck = tmp_path / JOB / "range" / RANGE / "ckpt-e1"
    shutil.rmtree(ck / "rank-1")
    shutil.copytree(src, ck / "rank-1")
    raw = (ck / "rank-1" / "manifest.json").read_bytes()
    doc = json.loads((ck / GLOBAL_NAME).read_bytes())
    doc.pop("checksum")
    doc["parts"][1].update(manifest_crc32=zlib.crc32(raw) & 0xFFFFFFFF, manifest_size=len(raw),
                           data_size=(ck / "rank-1" / "tensors.bin").stat().st_size)
    (ck / GLOBAL_NAME).write_bytes(seal(doc))
    with pytest.raises(CorruptCheckpointError, match="parts of two runs"):
        gck(tmp_path, 0, 2).check_global("ckpt-e1")


# -- fencing and retention -------------------------------------------------------------

def test_older_writer_generation_is_fenced_and_newest_never_goes_backwards(tmp_path, caplog):
    st_ = open_storage(str(tmp_path))
    live = Fence.take(st_, JOB)
    ck_live = one(tmp_path, keep=2, fence=live)
    for e in range(3):
        save(ck_live, snapshot(0, 50 + e))
    zombie_ck = one(tmp_path, keep=2, fence=live)
    newer = Fence.take(st_, JOB)  # a second writer starts: the first is now a zombie
    assert newer.generation == live.generation + 1
    ck_new = one(tmp_path, keep=2, fence=newer)
    save(ck_new, snapshot(0, 53))
    with pytest.raises(FencedError, match=f"generation {live.generation} is fenced by generation {newer.generation}"):
        zombie_ck.save(snapshot(0, 22), "replicated")
    assert any("is fenced" in r.message and str(newer.generation) in r.message for r in caplog.records)
    newest = committed(st_, JOB, RANGE)[-1]
    assert newest == "ckpt-e53"
    part = f"{JOB}/range/{RANGE}/ckpt-e53/rank-0"
    assert reader.read_manifest(open_storage(str(tmp_path)), part, position_number(53, None), RANGE).range.epoch_no == 53
    assert not (tmp_path / JOB / "range" / RANGE / "ckpt-e22" / GLOBAL_NAME).exists()
    assert not [p for p in (tmp_path / JOB / "range" / RANGE).rglob("*") if ".tmp" in p.name]
    # fenced for good: its retention deletes nothing either
    with pytest.raises(FencedError):
        zombie_ck.apply_retention(keep=1)
    assert committed(st_, JOB, RANGE) == ["ckpt-e52", "ckpt-e53"]
    # the global commit is fenced the same way
    g_old = gck(tmp_path, 0, 2, timeout=1, fence=live)
    gck(tmp_path, 1, 2).save(snapshot(1, 60), "per-rank")
    with pytest.raises(FencedError):
        g_old.save(snapshot(0, 60), "per-rank")
    assert not (tmp_path / JOB / "range" / RANGE / "ckpt-e60" / GLOBAL_NAME).exists()


def test_generations_are_taken_exclusively_under_races(tmp_path):
    st_ = open_storage(str(tmp_path))
    got = []
    threads = [threading.Thread(target=lambda: got.append(Fence.take(st_, JOB).generation)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(8))


def test_retention_never_deletes_another_jobs_checkpoints_nor_through_a_symlink(tmp_path):
    other = one(tmp_path / "o")  # another job's checkpoints, elsewhere
    other.storage.makedirs(JOB)
    write_job_marker(other.storage, JOB)
    for e in range(4):
        save(other, snapshot(0, e))
    before = sorted(str(p) for p in (tmp_path / "o").rglob("*"))
    # our job's range directory is a symlink to that job's range directory
    (tmp_path / "me" / JOB / "range").mkdir(parents=True)
    os.symlink(tmp_path / "o" / JOB / "range" / RANGE, tmp_path / "me" / JOB / "range" / RANGE)
    mine = one(tmp_path / "me", keep=1)
    with pytest.raises(CheckpointError, match="symlink"):
        mine.apply_retention()
    g = gck(tmp_path / "me", 0, 2, keep=1)
    save_all(tmp_path / "me", 2, 9)  # commits through the link, but retention refuses to delete
    save_all(tmp_path / "me", 2, 10)
    with pytest.raises(CheckpointError, match="symlink"):
        g.apply_retention()
    after = sorted(str(p) for p in (tmp_path / "o").rglob("*"))
    assert set(before) <= set(after)
    # a job directory whose marker names another job is not ours to prune
    (tmp_path / "x" / JOB).mkdir(parents=True)
    (tmp_path / "x" / JOB / "job.json").write_text(json.dumps({"job_id": "someone-else"}))
    with pytest.raises(CheckpointError, match="names another job"):
        check_deletable(open_storage(str(tmp_path / "x")), JOB, f"{JOB}/range/{RANGE}")
    with pytest.raises(CheckpointError, match="not inside"):
        check_deletable(open_storage(str(tmp_path / "x")), JOB, "otherjob/range")


def test_ls_and_verify_show_and_check_checkpoints_of_several_ranks(tmp_path):
    import subprocess
    import sys

    from support.e2e import REPO

    numbered(tmp_path, 0, 0)  # a single-process checkpoint from before (ckpt-0), older by position
    for e in (1, 2):
        save_all(tmp_path, 2, e)
    gck(tmp_path, 1, 2).save(snapshot(1, 3), "per-rank")  # an abandoned one

    def tool(*args):
        return subprocess.run([sys.executable, "-m", "paddle_acp", *args, str(tmp_path)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)

    out = tool("ls").stdout
    assert "a restart loads ckpt-e2" in out, out
    lines = [x for x in out.splitlines() if "ckpt-" in x and "restart loads" not in x]
    assert [x.split()[1] if x.split()[0] == "*" else x.split()[0] for x in lines] == ["ckpt-e3", "ckpt-e2", "ckpt-e1", "ckpt-0"]
    assert "ok (2 ranks, per-rank)" in out and "not committed, or abandoned" in out
    assert tool("verify").returncode == 0
    data = tmp_path / JOB / "range" / RANGE / "ckpt-e2" / "rank-1" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    v = tool("verify")
    assert v.returncode == 1 and "ckpt-e2 is bad" in v.stdout and "fall back to ckpt-e1" in v.stdout, v.stdout


# -- crafted global manifests (the checksum guards against accidents, not edits) -----------

def _crafted(edit):
    from paddle_acp.format.manifest import seal

    g = GlobalManifest("ckpt-e2", RANGE, 2, None, 2, "per-rank",
                       [PartRecord(0, 1, 10, 64, ["a"]), PartRecord(1, 2, 10, 64, ["b"])], 12.5, 0)
    d = g.to_json()
    edit(d)
    return seal(d)


@pytest.mark.parametrize("edit, msg", [
    (lambda d: d.update(deep=json.loads("[" * 5000 + "]" * 5000)), "nested"),
    (lambda d: d.update(created=10**400), "created"),
    (lambda d: d.update(created=1e300), "created"),
    (lambda d: d.update(generation=2**70), "generation"),
    (lambda d: d["parts"][0].update(rank=2**40), "ranks 0..1|bad rank"),
    (lambda d: d["parts"][0].update(data_size=10**30), "bad rank"),
    (lambda d: d["parts"][0].update(manifest_size=10**9), "bad rank"),
    (lambda d: d["parts"][0].update(programs=["k"] * 5000), "program keys"),
    (lambda d: d.update(range="r" * 10**5), "range"),
])
def test_crafted_global_manifests_are_refused_as_corrupt(edit, msg):
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))  # so that json.dumps can write the crafted document
    try:
        raw = _crafted(edit)
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(CorruptCheckpointError, match=msg):
        GlobalManifest.loads(raw)


def test_an_oversized_global_manifest_is_refused_before_it_is_parsed():
    from paddle_acp.format.global_manifest import MAX_GLOBAL_SIZE

    with pytest.raises(CorruptCheckpointError, match="larger than"):
        GlobalManifest.loads(b" " * (MAX_GLOBAL_SIZE + 1) + b"{}")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.lists(st.sampled_from(["parts", 0, 1, "topology", "position", "world_size", "epoch_no", "step",
                                      "created", "generation", "rank", "programs", "data_size"]), max_size=3),
       value=st.recursive(st.none() | st.booleans() | st.integers(-2**80, 2**80) | st.floats(allow_nan=False)
                          | st.text(max_size=8), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                          max_leaves=8))
def test_attacker_edits_of_a_global_manifest_load_or_raise_corrupt_only(path, value):
    """An edit with the checksum recomputed either loads (and re-serialises to a valid manifest)
    or raises CorruptCheckpointError: never another exception type."""

    def edit(d):
        node = d
        for k in path[:-1]:
            try:
                node = node[k]
            except (KeyError, IndexError, TypeError):
                return
        if not path:
            d["extra"] = value
            return
        try:
            node[path[-1]] = value
        except (IndexError, TypeError):
            pass

    try:
        raw = _crafted(edit)
    except (ValueError, TypeError):
        return  # not serialisable as JSON (e.g. a huge float): nothing an attacker can write
    try:
        g = GlobalManifest.loads(raw)
    except CorruptCheckpointError:
        return
    assert GlobalManifest.loads(g.dumps()) == g


def test_a_symlinked_generation_record_is_not_a_writer(tmp_path):
    from paddle_acp.format.commit.fencing import newest_generation, writers_dir

    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "gen-999").write_text("{}")
    st_ = open_storage(str(tmp_path / "root"))
    g = Fence.take(st_, JOB).generation
    os.symlink(other / "gen-999", tmp_path / "root" / writers_dir(JOB) / "gen-999")
    assert newest_generation(st_, JOB) == g


def test_verify_reads_every_part_and_catches_one_flipped_bit(tmp_path):
    """GlobalCheckpointer.verify (what the tools call): every part's checksums, with progress."""
    res = save_all(tmp_path, 3, 0)
    assert res.committed
    seen = []
    g = gck(tmp_path, 0, 1).verify("ckpt-e0", progress=lambda n, total: seen.append(n))
    assert g.world_size == 3 and sum(seen) == sum(p.data_size for p in g.parts)
    data = tmp_path / JOB / "range" / RANGE / "ckpt-e0" / "rank-2" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpointError, match="rank-2.*checksum mismatch"):
        gck(tmp_path, 0, 1).verify("ckpt-e0")


def _newer_global(root, name, version=5):
    from paddle_acp.format.manifest import seal

    path = root / JOB / "range" / RANGE / name / GLOBAL_NAME
    doc = json.loads(path.read_bytes())
    doc.pop("checksum")
    doc["version"] = version
    path.write_bytes(seal(doc))


def _tree(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_checkpoints_of_a_newer_format_are_never_withdrawn_or_deleted(tmp_path):
    """Issue 25, item 2: a global checkpoint of a newer format is skipped, never withdrawn by a
    restart (discard_newer), never deleted by retention; a job (of any world size) does not resume from
    an older one below it (it would train its position again over it), nor start fresh in place."""
    from paddle_acp.errors import NoUsableCheckpointError

    for e in (0, 1, 2):
        save_all(tmp_path, 2, e, mode="replicated")
    _newer_global(tmp_path, "ckpt-e2")
    before = _tree(tmp_path)
    for r in (0, 1):
        with pytest.raises(CheckpointError, match=r"ckpt-e2 .*are of a newer format.*from ckpt-e1"):
            load_newest(v2(tmp_path), gck(tmp_path, r, 2), None)
    # one process (a job of world size 1: it writes positions too) refuses it alike
    with pytest.raises(CheckpointError, match=r"^checkpoint\(s\) ckpt-e2 .*are of a newer format.*from ckpt-e1"):
        load_newest(v2(tmp_path), gck(tmp_path, 0, 1), None)
    g0 = gck(tmp_path, 0, 2)
    g0.start.discard_newer(position_key(0, None))  # as after a resume from ckpt-e0: ckpt-e1 goes, ckpt-e2 stays
    assert not (tmp_path / JOB / "range" / RANGE / "ckpt-e1" / GLOBAL_NAME).exists()
    assert (tmp_path / JOB / "range" / RANGE / "ckpt-e2" / GLOBAL_NAME).read_bytes() == before[
        f"{JOB}/range/{RANGE}/ckpt-e2/{GLOBAL_NAME}"]
    assert (tmp_path / JOB / "range" / RANGE / "ckpt-e2" / "rank-0" / "manifest.json").exists()
    # keep 1 of [e0, e2]: e2 is neither counted nor deleted, so e0 (the newest of this format) stays;
    # the withdrawn e1 is an abandoned leftover now
    assert gck(tmp_path, 0, 2, keep=1).apply_retention(1) == ["ckpt-e1"]
    assert (tmp_path / JOB / "range" / RANGE / "ckpt-e0" / GLOBAL_NAME).exists()
    _newer_global(tmp_path, "ckpt-e0")
    assert gck(tmp_path, 0, 2, keep=1).apply_retention(1) == []
    assert (tmp_path / JOB / "range" / RANGE / "ckpt-e0" / GLOBAL_NAME).exists()
    for r in (0, 1):
        with pytest.raises(NoUsableCheckpointError, match=r"rank %d: none of the 2 .*ckpt-e2 \(newer format.*ckpt-e0 \(newer" % r):
            load_newest(v2(tmp_path), gck(tmp_path, r, 2), None)
        with pytest.raises(CheckpointError, match="from scratch and cannot replace them"):
            load_newest(v2(tmp_path), gck(tmp_path, r, 2), None, start_fresh=True)
    assert (tmp_path / JOB / "range" / RANGE / "ckpt-e0" / GLOBAL_NAME).exists()


def test_restart_order_is_the_index_order(tmp_path):
    """Issue 25, item 7: the restart tries checkpoints in the order of format.checkpoints.index.entries (the tools'
    order): a checkpoint of several ranks before a ckpt-N at the same position, ckpt-N by its manifest's
    position once a committed checkpoint of several ranks exists, by number otherwise."""
    from paddle_acp.format.checkpoints import index

    st_ = open_storage(str(tmp_path))
    ck = v2(tmp_path)
    numbered(tmp_path, 0, 2)  # ckpt-0 at the end of epoch 2
    numbered(tmp_path, 1, 0)  # ckpt-1 at the end of epoch 0: newer by number
    (tmp_path / JOB / "range" / RANGE / "ckpt-e5").mkdir()  # uncommitted: changes nothing
    assert [e.name for e in index.entries(st_, JOB, RANGE)] == ["ckpt-1", "ckpt-0"]
    assert load_newest(ck, gck(tmp_path, 0, 1), None).name == "ckpt-1"
    save_all(tmp_path, 2, 2, mode="replicated")  # ckpt-e2: committed, at ckpt-0's position
    assert [e.name for e in index.entries(st_, JOB, RANGE)] == ["ckpt-e2", "ckpt-0", "ckpt-1"]
    assert [e.name for e in index.entries(st_, JOB, RANGE, uncommitted=True)] == ["ckpt-e5", "ckpt-e2", "ckpt-0", "ckpt-1"]
    assert load_newest(ck, gck(tmp_path, 0, 1), None).name == "ckpt-e2"
