"""Spread writes of replicated state (PADDLE_ACP_REPLICATED_WRITERS=all), on real local storage:
the deterministic split, the version-4 global manifest, commit and restore of shares (same and
other world size), agreement on a bad share, the newer-format gate for older builds, the tools."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.server_fixtures import s3_server  # noqa: F401  (fixture)

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, RestartRequiredError
from paddle_acp.format import global_manifest as gm
from paddle_acp.format import index, shares
from paddle_acp.format.checkpointer import Checkpointer
from paddle_acp.format.global_manifest import GlobalManifest, PartRecord
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.format.multirank import GlobalCheckpointer
from paddle_acp.format.restart import load_newest
from paddle_acp.format.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.storage import open_storage

JOB, RANGE = "job", "_range_0"


def state(epoch):
    """The replicated state (the same on every rank): two programs, tensors of varied sizes."""
    rng = np.random.default_rng(epoch)
    a = [TensorData(f"w{i}", "float32", rng.standard_normal(5 + 37 * i).astype("float32")) for i in range(7)]
    b = [TensorData("emb", "float64", rng.standard_normal((13, 9))), TensorData("step", "int64", np.array([epoch]))]
    return [ProgramSnapshot("fp-a", "a", a, {"last_epoch": epoch}), ProgramSnapshot("fp-b", "b", b, None)]


def snap(rank, world, epoch, spread=True):
    programs = state(epoch)
    share = None
    if spread:
        programs, share = shares.own_share(programs, rank, world)
    elif rank != 0:
        programs = [ProgramSnapshot(p.key, p.label, [], p.lr_scheduler) for p in programs]
    s = Snapshot(RangeRecord(RANGE, epoch, 100, None), programs, None, "3.3.1", "pir",
                 extra={"loader_state": {"rank": rank, "epoch": epoch}})
    s.share = share
    return s


def gck(root, rank, world, timeout=60.0):
    g = GlobalCheckpointer(open_storage(str(root)), JOB, RANGE, rank, world, 3, timeout)
    g.poll_interval = 0.005
    return g


def save_all(root, world, epoch, spread=True, spread_ranks=None, timeout=60.0):
    res = {}
    t = threading.Thread(target=lambda: res.setdefault(0, gck(root, 0, world, timeout).save(
        snap(0, world, epoch, spread if spread_ranks is None else 0 in spread_ranks), "replicated")))
    t.start()
    for r in range(1, world):
        gck(root, r, world, timeout).save(snap(r, world, epoch, spread if spread_ranks is None else r in spread_ranks),
                                          "replicated")
    t.join()
    return res[0]


def values(loaded):
    return {k: a.copy() for k, a in loaded.arrays.items()}


def expected(epoch):
    return {(p.key, t.name): t.array for p in state(epoch) for t in p.tensors}


def same(got, want):
    return set(got) == set(want) and all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes() for k in want)


def ckdir(root, name):
    return root / JOB / "range" / RANGE / name


def v2(root):
    return Checkpointer(open_storage(str(root)), JOB, RANGE, 3)


# -- the split ------------------------------------------------------------------------
items_st = st.lists(st.tuples(st.sampled_from(["p", "q"]), st.text("abcxyz", min_size=1, max_size=4),
                              st.integers(0, 10**6)), max_size=40, unique_by=lambda x: (x[0], x[1]))


@given(items_st, st.integers(1, 9), st.randoms())
@settings(max_examples=200, deadline=None)
def test_split_is_deterministic_complete_and_balanced(raw, world, rnd):
    items = [(k, n, "float32", (b,), b) for k, n, b in raw]
    owner = shares.split(items, world)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert shares.split(shuffled, world) == owner  # every rank computes the same, whatever its order
    assert set(owner) == {(k, n) for k, n, *_ in items} and all(0 <= r < world for r in owner.values())
    loads = [sum(b for k, n, _d, _s, b in items if owner[(k, n)] == r) for r in range(world)]
    biggest = max((b for *_x, b in items), default=0)
    assert max(loads) - min(loads) <= biggest  # greedy, largest first: within one tensor
    assert sum(shares.share_nbytes([(k, n, b) for k, n, _d, _s, b in items], r, world) for r in range(world)) == sum(loads)


# -- the global manifest, version 4 ------------------------------------------------------
@given(st.integers(2, 5), st.integers(0, 10**6), st.sampled_from(["one", "all"]), st.integers(0, 10**4))
@settings(max_examples=100, deadline=None)
def test_global_manifest_records_the_writers_and_any_edit_is_caught(world, epoch, writers, flip):
    parts = [PartRecord(k, 7 * k, 100 + k, 64 * k, ["fp-a"]) for k in range(world)]
    g = GlobalManifest(f"ckpt-e{epoch}", RANGE, epoch, None, world, "replicated", parts, 1.5, 3, None, writers=writers)
    raw = g.dumps()
    assert json.loads(raw)["version"] == (4 if writers == "all" else 3)
    assert ("writers" in json.loads(raw)) == (writers == "all")
    back = GlobalManifest.loads(raw)
    assert back == g and back.writers == writers
    bad = bytearray(raw)
    bad[flip % len(bad)] ^= 0x01
    try:
        other = GlobalManifest.loads(bytes(bad))
    except CorruptCheckpointError:
        return
    assert other == g  # a flip that keeps the document (whitespace) changes nothing


@pytest.mark.parametrize("edit, msg", [
    (lambda d: d.update(writers="some"), "must be 'all'"),
    (lambda d: d.pop("writers"), "writers is missing"),
    (lambda d: d["topology"].update(mode="per-rank"), "shares of replicated tensors in a per-rank"),
    (lambda d: d.update(version=3), "not a field of version 3"),
    (lambda d: d.update(version=5), "format version 5 is newer"),
])
def test_crafted_spread_global_manifests_are_refused(edit, msg):
    g = GlobalManifest("ckpt-e1", RANGE, 1, None, 2, "replicated", [PartRecord(k, 1, 10, 0, []) for k in (0, 1)],
                       1.0, writers="all")
    d = json.loads(g.dumps())
    d.pop("checksum")
    edit(d)
    from paddle_acp.format.manifest import seal

    with pytest.raises(CorruptCheckpointError, match=msg):
        GlobalManifest.loads(seal(d))


# -- commit and restore -------------------------------------------------------------------
def test_shares_restore_bit_identical_at_the_same_and_other_world_sizes(tmp_path):
    res = save_all(tmp_path, 3, 4)
    assert res.committed
    g = json.loads((ckdir(tmp_path, "ckpt-e4") / "global.json").read_bytes())
    assert g["version"] == 4 and g["writers"] == "all"
    sizes = [(ckdir(tmp_path, "ckpt-e4") / f"rank-{k}" / "tensors.bin").stat().st_size for k in range(3)]
    assert all(s > 0 for s in sizes) and max(sizes) < sum(sizes) * 0.6  # every rank wrote a share
    for world in (3, 2, 1, 4):
        for r in range(world):
            loaded = load_newest(v2(tmp_path), gck(tmp_path, r, world), "replicated")
            assert loaded.global_manifest.writers == "all"
            assert same(values(loaded), expected(4))
            assert loaded.manifest.program("fp-a").lr_scheduler == {"last_epoch": 4}
            own = r if r < 3 else 0
            assert loaded.manifest.extra["loader_state"] == {"rank": own, "epoch": 4}
            loaded.close()


def test_one_writer_checkpoints_are_still_written_and_read(tmp_path):
    save_all(tmp_path, 2, 1, spread=False)
    g = json.loads((ckdir(tmp_path, "ckpt-e1") / "global.json").read_bytes())
    assert g["version"] == 3 and "writers" not in g
    assert (ckdir(tmp_path, "ckpt-e1") / "rank-1" / "tensors.bin").stat().st_size == 0
    for r in range(2):
        loaded = load_newest(v2(tmp_path), gck(tmp_path, r, 2), None)
        assert loaded.global_manifest.writers == "one" and same(values(loaded), expected(1))
        loaded.close()


def test_ranks_that_disagree_on_the_writers_abandon_the_checkpoint(tmp_path, caplog):
    save_all(tmp_path, 2, 0)
    res = save_all(tmp_path, 2, 1, spread_ranks={0}, timeout=5.0)
    assert res.committed is False and "do not agree on the share" in caplog.text
    res = save_all(tmp_path, 2, 2, spread_ranks={1}, timeout=5.0)
    assert res.committed is False and "PADDLE_ACP_REPLICATED_WRITERS differs" in caplog.text
    for r in range(2):
        assert load_newest(v2(tmp_path), gck(tmp_path, r, 2), None).global_manifest.name == "ckpt-e0"


def test_a_corrupt_share_stops_every_rank_through_the_bad_mark(tmp_path):
    for e in (0, 1):
        save_all(tmp_path, 2, e)
    data = ckdir(tmp_path, "ckpt-e1") / "rank-1" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[5] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(RestartRequiredError, match="rank 1's share .*marked bad"):
        load_newest(v2(tmp_path), gck(tmp_path, 0, 2), None)  # rank 0 reads rank 1's share: never falls back alone
    assert [p.name for p in ckdir(tmp_path, "ckpt-e1").iterdir() if p.name.startswith("bad-")]
    for r in range(2):  # the restart: both fall back alike
        loaded = load_newest(v2(tmp_path), gck(tmp_path, r, 2), None)
        assert loaded.global_manifest.name == "ckpt-e0" and same(values(loaded), expected(0))
        loaded.close()


def test_a_missing_or_swapped_share_is_seen_alike_by_every_rank(tmp_path):
    for e in (0, 1, 2):
        save_all(tmp_path, 3, e)
    os.remove(ckdir(tmp_path, "ckpt-e2") / "rank-2" / "tensors.bin")
    # ckpt-e1: rank 1's and rank 2's parts swapped (each part records its rank: caught before any data is read)
    a, b = ckdir(tmp_path, "ckpt-e1") / "rank-1", ckdir(tmp_path, "ckpt-e1") / "rank-2"
    os.rename(a, a.with_name("tmp"))
    os.rename(b, a)
    os.rename(a.with_name("tmp"), b)
    for r in range(3):
        loaded = load_newest(v2(tmp_path), gck(tmp_path, r, 3), None)
        assert loaded.global_manifest.name == "ckpt-e0"
        loaded.close()


def test_a_crafted_share_record_is_refused_on_every_rank():
    from paddle_acp.format.manifest import Manifest

    def part(rank, tensors, share):
        from paddle_acp.format.manifest import ProgramRecord, TensorRecord

        recs = [TensorRecord(n, "float32", [1], 0, 4, 0) for n in tensors]
        return Manifest(0, 1.0, RangeRecord(RANGE, 0, 1), [ProgramRecord("fp", "l", recs)], 64,
                        extra={"part": {"rank": rank, "share": share}})

    items = [("fp", n, "float32", (1,), 4) for n in ("a", "b")]
    good = {"writers": "all", "items": 2, "digest": shares.digest(items)}
    assert shares.check_cover({0: part(0, ["a"], good), 1: part(1, ["b"], good)}, "x") == good
    with pytest.raises(CorruptCheckpointError, match="ranks 0 and 1"):
        shares.check_cover({0: part(0, ["a", "b"], good), 1: part(1, ["b"], good)}, "x")
    with pytest.raises(CorruptCheckpointError, match="not the 2"):
        shares.check_cover({0: part(0, ["a"], good), 1: part(1, [], good)}, "x")
    for bad in ({**good, "items": True}, {**good, "digest": -1}, {**good, "extra": 1}, "all"):
        with pytest.raises(CorruptCheckpointError):
            shares.check_cover({0: part(0, ["a"], bad), 1: part(1, ["b"], bad)}, "x")


def test_an_older_paddle_acp_refuses_a_spread_checkpoint_as_a_newer_format(tmp_path, monkeypatch):
    """What a build that reads global manifests up to version 3 (every one before spread writes) does."""
    save_all(tmp_path, 2, 0, spread=False)
    save_all(tmp_path, 2, 1)
    monkeypatch.setattr(gm, "GLOBAL_VERSION", 3)
    monkeypatch.setattr(index, "GLOBAL_VERSION", 3)
    why = index.newer_format(open_storage(str(tmp_path)), f"{JOB}/range/{RANGE}/ckpt-e1")
    assert why is not None and "format version 4 is newer than this paddle-acp reads (up to 3)" in why
    for r in range(2):  # never judged corrupt, never deleted: the job refuses to train over it, clearly
        with pytest.raises(CheckpointError, match="ckpt-e1 .* are of a newer format .*version 4 is newer.*Nothing was deleted"):
            load_newest(v2(tmp_path), gck(tmp_path, r, 2), None)
        gck(tmp_path, r, 2).apply_retention(keep=1)
    assert (ckdir(tmp_path, "ckpt-e1") / "global.json").exists()


def test_tools_verify_ls_inspect_and_export_spread_checkpoints(tmp_path):
    from support.e2e import REPO

    save_all(tmp_path, 3, 2)

    def tool(*args):
        return subprocess.run([sys.executable, "-m", "paddle_acp", *args], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120)

    out = tool("ls", str(tmp_path)).stdout
    assert "a restart loads ckpt-e2" in out and "ok (3 ranks, replicated" in out, out
    assert tool("verify", str(tmp_path)).returncode == 0
    ins = tool("inspect", str(ckdir(tmp_path, "ckpt-e2")))
    assert ins.returncode == 0 and "share" in ins.stdout, ins.stdout
    exp = tool("export", str(ckdir(tmp_path, "ckpt-e2")), "--program", "fp-a", "--to", str(tmp_path / "x"),
               "--optimizer-state")
    assert exp.returncode == 0, exp.stdout
    info = json.loads((tmp_path / "x" / "model.export.json").read_text())
    got = sorted((info["parameters"] or []) + (info["optimizer_state"] or []))
    assert got == sorted(t.name for t in state(2)[0].tensors)  # every share's tensors, not rank 0's alone
    data = ckdir(tmp_path, "ckpt-e2") / "rank-2" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    v = tool("verify", str(tmp_path))
    assert v.returncode == 1 and "ckpt-e2 is bad" in v.stdout, v.stdout


json_st = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=5),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)


@given(st.sampled_from(["writers", "items", "digest", "extra"]), json_st, st.integers(0, 1))
@settings(max_examples=300, deadline=None)
def test_any_edit_of_a_share_record_is_caught_or_harmless(key, value, which):
    """A crafted ``extra.part.share`` (untrusted, as every manifest) either is the record every part
    carries, or the cover check raises CorruptCheckpointError, never anything else."""
    from paddle_acp.format.manifest import Manifest, ProgramRecord, TensorRecord

    items = [("fp", n, "float32", (1,), 4) for n in ("a", "b")]
    good = {"writers": "all", "items": 2, "digest": shares.digest(items)}
    recs = [dict(good), dict(good)]
    recs[which][key] = value
    parts = {k: Manifest(0, 1.0, RangeRecord(RANGE, 0, 1), [ProgramRecord("fp", "l", [TensorRecord(n, "float32", [1], 0, 4, 0)])],
                         64, extra={"part": {"rank": k, "share": recs[k]}}) for k, n in ((0, "a"), (1, "b"))}
    try:
        got = shares.check_cover(parts, "x")
    except CorruptCheckpointError:
        return
    assert got == good and recs[which] == good


def test_spread_shares_with_node_local_caches_on_s3(s3_server, monkeypatch, tmp_path, caplog):
    """Each rank caches its own share; at restore it reads that share from its node's copy and the
    other ranks' shares from S3 (in parallel), bit-identical. A damaged remote share of the other rank
    goes through the bad mark on this rank (its cache holds only its own share)."""
    import logging
    import uuid

    from paddle_acp.format.cache import LocalCache

    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    uri = f"s3://{s3_server.bucket}/spread/{uuid.uuid4().hex[:8]}"

    def cgck(rank):
        g = GlobalCheckpointer(open_storage(uri), JOB, RANGE, rank, 2, 3, 60.0)
        g.poll_interval = 0.01
        g.cache = LocalCache.open(str(tmp_path / f"node{rank}"), uri, 3).for_range(JOB, RANGE, rank)
        return g

    for epoch in (0, 1):
        res = {}
        t = threading.Thread(target=lambda res=res, e=epoch: res.setdefault(0, cgck(0).save(snap(0, 2, e), "replicated")))
        t.start()
        cgck(1).save(snap(1, 2, epoch), "replicated")
        t.join()
        assert res[0].committed
    for r in (0, 1):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="paddle_acp"):
            loaded = load_newest(Checkpointer(open_storage(uri), JOB, RANGE, 3), cgck(r), None)
        assert loaded.name == "ckpt-e1" and loaded.source == "mixed", loaded.source  # own share cached, the other remote
        assert f"checkpoint ckpt-e1 (part of rank {r})" in caplog.text and "from the local cache" in caplog.text
        assert same(values(loaded), expected(1))
        loaded.close()
    st_ = open_storage(uri)
    path = f"{JOB}/range/{RANGE}/ckpt-e1/rank-1/tensors.bin"
    raw = bytearray(st_.read_bytes(path))
    raw[len(raw) // 2] ^= 0x10
    st_.write_bytes(path, bytes(raw))
    with pytest.raises(RestartRequiredError, match="rank 1's share"):
        load_newest(Checkpointer(st_, JOB, RANGE, 3), cgck(0), None)
    for r in (0, 1):  # rank 1's intact copy of its share does not save the copy every rank must agree on
        loaded = load_newest(Checkpointer(st_, JOB, RANGE, 3), cgck(r), None)
        assert loaded.name == "ckpt-e0" and same(values(loaded), expected(0))
        loaded.close()


def test_the_writers_setting():
    from paddle_acp.config import from_env
    from paddle_acp.errors import ConfigError

    base = {"PADDLE_ACP_CHECKPOINT_URI": "/tmp/x", "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "1"}
    assert from_env(base).replicated_writers == "all"
    assert from_env({**base, "PADDLE_ACP_REPLICATED_WRITERS": " One "}).replicated_writers == "one"
    with pytest.raises(ConfigError, match="PADDLE_ACP_REPLICATED_WRITERS='some' must be one of all, one"):
        from_env({**base, "PADDLE_ACP_REPLICATED_WRITERS": "some"})
