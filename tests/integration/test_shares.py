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
from support.shares import own_share, share_nbytes, snapshot_items

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, RestartRequiredError
from paddle_acp.format import global_manifest as gm
from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.engine import shares
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.global_manifest import GlobalManifest, PartRecord
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.storage import open_storage

JOB, RANGE = "job", "_range_0"


def state(epoch):
    """The replicated state (the same on every rank): two programs, tensors of varied sizes."""
    rng = np.random.default_rng(epoch)
    a = [TensorData(f"w{i}", "float32", rng.standard_normal(5 + 37 * i).astype("float32")) for i in range(7)]
    b = [TensorData("emb", "float64", rng.standard_normal((13, 9))), TensorData("step", "int64", np.array([epoch]))]
    return [ProgramSnapshot("fp-a", "a", a, {"last_epoch": epoch}), ProgramSnapshot("fp-b", "b", b, None)]


def snap(rank, world, epoch, spread=True, cap=None):
    programs = state(epoch)
    share = None
    if spread:
        programs, share = own_share(programs, rank, world, cap)
    elif rank != 0:
        programs = [ProgramSnapshot(p.key, p.label, [], p.lr_scheduler) for p in programs]
    return Snapshot(RangeRecord(RANGE, epoch, 100, None), programs, None, "3.3.1", "pir",
                    extra={"loader_state": {"rank": rank, "epoch": epoch}}, share=share)


def gck(root, rank, world, timeout=60.0):
    g = GlobalCheckpointer(open_storage(str(root)), JOB, RANGE, rank, world, 3, timeout)
    g.poll_interval = 0.005
    return g


def save_all(root, world, epoch, spread=True, spread_ranks=None, timeout=60.0, cap=None, caps=None):
    """Every rank saves ``epoch``; ``cap``: the share writers' cap (None: every rank), ``caps``: per rank."""
    res = {}

    def one(r):
        return snap(r, world, epoch, spread if spread_ranks is None else r in spread_ranks, caps[r] if caps else cap)

    t = threading.Thread(target=lambda: res.setdefault(0, gck(root, 0, world, timeout).save(one(0), "replicated")))
    t.start()
    for r in range(1, world):
        gck(root, r, world, timeout).save(one(r), "replicated")
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
    """The reader of the range's one-writer checkpoints (a part, an earlier release's ckpt-N): the restart's first argument."""
    return PartReader(open_storage(str(root)), JOB, RANGE)


# -- the split ------------------------------------------------------------------------
items_st = st.lists(st.tuples(st.sampled_from(["p", "q"]), st.text("abcxyz", min_size=1, max_size=4),
                              st.integers(0, 10**6)), max_size=40, unique_by=lambda x: (x[0], x[1]))


@given(items_st, st.integers(1, 9), st.randoms())
@settings(max_examples=200, deadline=None)
def test_split_is_deterministic_complete_and_balanced(raw, world, rnd):
    items = [(k, n, "float32", (b,), b) for k, n, b in raw]
    split = shares.split(items, world)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert shares.split(shuffled, world) == split  # every rank computes the same, whatever its order
    assert set(split) == set(range(world))
    for k, n, _d, _s, b in items:  # every tensor once: whole on one rank, or pieces that tile its bytes
        held = sorted((piece or (0, b), r) for r in range(world) for kn, piece in split[r].items() if kn == (k, n))
        assert held, (k, n)
        assert [lo for (lo, _hi), _r in held] == [0] + [hi for (_lo, hi), _r in held[:-1]]
        assert held[-1][0][1] == b and all(hi > lo for (lo, hi), _r in held if b)
        assert len(held) == 1 or all(piece is not None for r in range(world)
                                     for kn, piece in split[r].items() if kn == (k, n))
        assert [r for _p, r in held] == sorted({r for _p, r in held})  # pieces go to consecutive writers
    total = sum(b for *_x, b in items)
    loads = [share_nbytes([(k, n, b) for k, n, _d, _s, b in items], r, world) for r in range(world)]
    assert sum(loads) == total and max(loads) - min(loads) <= 1  # equal byte ranges, whatever the tensors
    assert all(shares.share_layout_nbytes(items, r, world) >= loads[r] for r in range(world))


def test_a_large_tensor_is_cut_into_pieces_that_join_bit_identically():
    """Six equal tensors over four writers: each writes a quarter (cut by whole tensor two would write a third)."""
    rng = np.random.default_rng(3)
    programs = [ProgramSnapshot("fp", "l", [TensorData(f"t{i}", "float32", rng.standard_normal((50, 7)).astype("float32"))
                                            for i in range(6)], None)]
    total = sum(t.array.nbytes for t in programs[0].tensors)
    held = {}
    for r in range(4):
        (part,), _rec = own_share(programs, r, 4)
        assert sum(t.array.nbytes for t in part.tensors) == total // 4
        for t in part.tensors:
            held.setdefault(t.name, []).append(t)
            assert t.piece is None or (t.array.dtype == np.uint8 and t.shape == (50, 7))
    assert any(t.piece is not None for ts in held.values() for t in ts)
    for t in programs[0].tensors:
        joined = b"".join(x.array.tobytes() for x in sorted(held[t.name], key=lambda x: (x.piece or (0, 0))[0]))
        assert joined == t.array.tobytes()


# -- the global manifest, version 4 ------------------------------------------------------
@given(st.integers(2, 5), st.integers(0, 10**6), st.sampled_from(["one", "all"]), st.integers(0, 10**4), st.data())
@settings(max_examples=100, deadline=None)
def test_global_manifest_records_the_writers_and_any_edit_is_caught(world, epoch, writers, flip, data):
    parts = [PartRecord(k, 7 * k, 100 + k, 64 * k, ["fp-a"]) for k in range(world)]
    n = data.draw(st.integers(1, world)) if writers == "all" else 0
    g = GlobalManifest(f"ckpt-e{epoch}", RANGE, epoch, None, world, "replicated", parts, 1.5, 3, None, writers=writers,
                       share_writers=n)
    raw = g.dumps()
    assert json.loads(raw)["version"] == (4 if writers == "all" else 3)
    assert ("writers" in json.loads(raw)) == ("share_writers" in json.loads(raw)) == (writers == "all")
    back = GlobalManifest.loads(raw)
    assert back == g and back.writers == writers and back.share_writers == n
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
    (lambda d: d.pop("share_writers"), "share_writers is missing"),
    (lambda d: d.update(share_writers=0), "share_writers 0 must be from 1 to the world size 2"),
    (lambda d: d.update(share_writers=3), "share_writers 3 must be from 1 to the world size 2"),
    (lambda d: d.update(share_writers=True), "share_writers has the wrong type"),
    (lambda d: d.update(share_writers="2"), "share_writers has the wrong type"),
    (lambda d: (d.update(version=3), d.pop("writers")), "share_writers is not a field of version 3"),
])
def test_crafted_spread_global_manifests_are_refused(edit, msg):
    g = GlobalManifest("ckpt-e1", RANGE, 1, None, 2, "replicated", [PartRecord(k, 1, 10, 0, []) for k in (0, 1)],
                       1.0, writers="all", share_writers=2)
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
    assert g["version"] == 4 and g["writers"] == "all" and g["share_writers"] == 3
    sizes = [(ckdir(tmp_path, "ckpt-e4") / f"rank-{k}" / "tensors.bin").stat().st_size for k in range(3)]
    assert all(s > 0 for s in sizes) and max(sizes) < sum(sizes) * 0.6  # every rank wrote a share
    parts = [json.loads((ckdir(tmp_path, "ckpt-e4") / f"rank-{k}" / "manifest.json").read_bytes()) for k in range(3)]
    cut = [t for d in parts for p in d["programs"] for t in p["tensors"] if "piece" in t]
    assert cut and all(d["version"] == (3 if any("piece" in t for p in d["programs"] for t in p["tensors"]) else 2)
                       for d in parts)  # tensors cut into pieces across the shares: those parts are version 3
    held = [sum(t["nbytes"] for p in d["programs"] for t in p["tensors"]) for d in parts]
    assert max(held) - min(held) <= 1  # equal byte ranges
    for world in (3, 2, 1, 4):
        for r in range(world):
            loaded = load_newest(v2(tmp_path), gck(tmp_path, r, world), "replicated")
            assert loaded.global_manifest.writers == "all"
            assert same(values(loaded), expected(4))
            assert loaded.manifest.program("fp-a").lr_scheduler == {"last_epoch": 4}
            own = r if r < 3 else 0
            assert loaded.manifest.extra["loader_state"] == {"rank": own, "epoch": 4}
            loaded.close()


def test_spread_checkpoints_of_earlier_builds_cut_by_whole_tensor_still_restore(tmp_path, monkeypatch):
    """Builds before byte ranges gave each tensor whole to the least-loaded writer (largest first): their
    version-2 parts (no pieces) under a version-4 global manifest restore bit-identically."""
    def by_tensor(items, writers):  # the earlier split, as it was
        loads, out = [0] * writers, {r: {} for r in range(writers)}
        for key, name, _d, _s, nbytes in sorted(items, key=lambda i: (-i[4], i[0], i[1])):
            k = min(range(writers), key=lambda r: (loads[r], r))
            out[k][(key, name)] = None
            loads[k] += nbytes
        return out

    with monkeypatch.context() as m:
        m.setattr(shares, "split", by_tensor)
        assert save_all(tmp_path, 3, 5).committed
    parts = [json.loads((ckdir(tmp_path, "ckpt-e5") / f"rank-{k}" / "manifest.json").read_bytes()) for k in range(3)]
    assert all(d["version"] == 2 and all("piece" not in t for p in d["programs"] for t in p["tensors"]) for d in parts)
    for world in (3, 2):
        for r in range(world):
            loaded = load_newest(v2(tmp_path), gck(tmp_path, r, world), "replicated")
            assert loaded.name == "ckpt-e5" and same(values(loaded), expected(5))
            loaded.close()


def test_one_writer_checkpoints_are_still_written_and_read(tmp_path):
    save_all(tmp_path, 2, 1, spread=False)
    g = json.loads((ckdir(tmp_path, "ckpt-e1") / "global.json").read_bytes())
    assert g["version"] == 3 and "writers" not in g and "share_writers" not in g
    assert (ckdir(tmp_path, "ckpt-e1") / "rank-1" / "tensors.bin").stat().st_size == 0
    for r in range(2):
        loaded = load_newest(v2(tmp_path), gck(tmp_path, r, 2), None)
        assert loaded.global_manifest.writers == "one" and same(values(loaded), expected(1))
        loaded.close()


def test_export_of_any_rank_of_a_one_writer_checkpoint_holds_rank_0s_tensors(tmp_path, capsys):
    """Replicated state written by rank 0 alone: ``export --rank 1`` writes the tensors rank 1 restores
    (rank 0's; rank 1's part holds none), not empty files."""
    import pickle

    from paddle_acp import cli

    save_all(tmp_path, 2, 1, spread=False)
    want = {name: a for (key, name), a in expected(1).items() if key == "fp-a"}
    for rank in (0, 1):
        dest = tmp_path / f"export-{rank}"
        assert cli.main(["export", str(ckdir(tmp_path, "ckpt-e1")), "--rank", str(rank), "--program", "fp-a",
                         "--to", str(dest), "--optimizer-state"]) == 0
        capsys.readouterr()
        got = {}
        for f in ("model.pdparams", "model.pdopt"):
            with open(dest / f, "rb") as fh:
                got.update(pickle.load(fh))
        assert sorted(got) == sorted(want) and all(np.array_equal(got[n], want[n]) for n in want), rank
        info = json.loads((dest / "model.export.json").read_text())
        assert info["rank"] == rank and info["lr_scheduler"] == {"last_epoch": 1}


def test_a_capped_number_of_share_writers_at_a_larger_world_restores_bit_identical(tmp_path, monkeypatch):
    """W=5 with cap 2: ranks 0 and 1 write the shares, ranks 2..4 parts with no tensors; every rank's
    restore (at 5, and at other world sizes at an epoch end) opens the 2 shares' data files only."""
    res = save_all(tmp_path, 5, 3, cap=2)
    assert res.committed
    d = ckdir(tmp_path, "ckpt-e3")
    g = json.loads((d / "global.json").read_bytes())
    assert g["version"] == 4 and g["writers"] == "all" and g["share_writers"] == 2
    sizes = [(d / f"rank-{k}" / "tensors.bin").stat().st_size for k in range(5)]
    assert sizes[0] > 0 and sizes[1] > 0 and sizes[2:] == [0, 0, 0], sizes
    from paddle_acp.tools.inspect_checkpoint import inspect, render

    assert "ranks 0..1 each write a share of the tensors); this is the part of rank 3, no tensors (not a share " \
        "writer)" in render(inspect(str(d), rank=3))
    assert inspect(str(d), rank=1).part["share_writers"] == 2
    opened = []
    real = PartReader.load

    def spy(self, number, base, raw=None, landing=None):  # the real load; records which part's data this rank opens
        opened.append(base.rsplit("/", 1)[-1])
        return real(self, number, base, raw, landing)

    monkeypatch.setattr(PartReader, "load", spy)
    for world in (5, 3, 1, 7):
        for r in range(world):
            opened.clear()
            loaded = load_newest(v2(tmp_path), gck(tmp_path, r, world), "replicated")
            assert sorted(opened) == ["rank-0", "rank-1"], (world, r, opened)
            assert loaded.global_manifest.share_writers == 2 and same(values(loaded), expected(3))
            assert loaded.manifest.program("fp-a").lr_scheduler == {"last_epoch": 3}
            assert loaded.manifest.extra["loader_state"] == {"rank": r if r < 5 else 0, "epoch": 3}
            loaded.close()


def test_the_cap_may_change_between_checkpoints_and_world_sizes(tmp_path):
    """A cap above W means every rank writes; another cap (or W) on the next checkpoint reads alike."""
    assert save_all(tmp_path, 3, 1, cap=8).committed
    assert json.loads((ckdir(tmp_path, "ckpt-e1") / "global.json").read_bytes())["share_writers"] == 3
    assert save_all(tmp_path, 4, 2, cap=1).committed  # one share writer: rank 0 holds every tensor, version 4
    g = json.loads((ckdir(tmp_path, "ckpt-e2") / "global.json").read_bytes())
    assert g["share_writers"] == 1
    assert [(ckdir(tmp_path, "ckpt-e2") / f"rank-{k}" / "tensors.bin").stat().st_size > 0 for k in range(4)] == \
        [True, False, False, False]
    for world in (2, 4):
        for r in range(world):
            loaded = load_newest(v2(tmp_path), gck(tmp_path, r, world), None)
            assert loaded.name == "ckpt-e2" and same(values(loaded), expected(2))
            loaded.close()


def test_ranks_with_different_caps_abandon_the_checkpoint(tmp_path, caplog):
    save_all(tmp_path, 3, 0, cap=2)
    res = save_all(tmp_path, 3, 1, caps={0: 2, 1: 3, 2: 3}, timeout=5.0)
    assert res.committed is False and "do not agree on the share" in caplog.text
    for r in range(3):
        assert load_newest(v2(tmp_path), gck(tmp_path, r, 3), None).global_manifest.name == "ckpt-e0"


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
    # a share every rank reads is missing (ckpt-e2), and parts are swapped (ckpt-e1): a rank that rejects data
    # marks the copy and stops, never falls back alone; each restart skips the marked copies on every rank alike
    # (the ranks load one after another here, so a later rank may already see an earlier rank's mark)
    with pytest.raises(RestartRequiredError, match="ckpt-e2"):
        load_newest(v2(tmp_path), gck(tmp_path, 0, 3), None)
    for _restart in range(2):
        for r in range(3):
            try:
                load_newest(v2(tmp_path), gck(tmp_path, r, 3), None).close()
            except RestartRequiredError as exc:
                assert "ckpt-e1" in str(exc) or "ckpt-e2" in str(exc)
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
    good = {"writers": "all", "share_writers": 2, "items": 2, "digest": shares.digest(items)}
    assert shares.check_cover({0: part(0, ["a"], good), 1: part(1, ["b"], good)}, "x") == good
    one = {**good, "share_writers": 1}  # rank 0 the only share writer: rank 1's part holds no tensors
    assert shares.check_cover({0: part(0, ["a", "b"], one), 1: part(1, [], one)}, "x") == one
    with pytest.raises(CorruptCheckpointError, match="rank 1 holds tensors, but only the parts of ranks 0..0 hold"):
        shares.check_cover({0: part(0, ["a"], one), 1: part(1, ["b"], one)}, "x")
    three = {**good, "share_writers": 3}
    with pytest.raises(CorruptCheckpointError, match="record 3 share writers, but the checkpoint has the parts of ranks"):
        shares.check_cover({0: part(0, ["a"], three), 1: part(1, ["b"], three)}, "x")
    with pytest.raises(CorruptCheckpointError, match=r"held twice by the parts of ranks \[0, 1\]"):
        shares.check_cover({0: part(0, ["a", "b"], good), 1: part(1, ["b"], good)}, "x")
    with pytest.raises(CorruptCheckpointError, match="not the 2"):
        shares.check_cover({0: part(0, ["a"], good), 1: part(1, [], good)}, "x")
    for bad in ({**good, "items": True}, {**good, "digest": -1}, {**good, "extra": 1}, "all",
                {**good, "share_writers": 0}, {**good, "share_writers": False}, {**good, "share_writers": 2**17},
                {k: v for k, v in good.items() if k != "share_writers"}):
        with pytest.raises(CorruptCheckpointError):
            shares.check_cover({0: part(0, ["a"], bad), 1: part(1, ["b"], bad)}, "x")


def test_crafted_pieces_are_refused_on_every_rank():
    """The pieces of a tensor (untrusted, as every manifest) must tile its bytes exactly once, with one
    dtype and shape: a gap, an overlap, a piece missing or a different shape is CorruptCheckpointError."""
    from paddle_acp.format.manifest import Manifest, ProgramRecord, TensorRecord

    items = [("fp", "a", "float32", (4,), 16), ("fp", "b", "float32", (2,), 8)]
    good = {"writers": "all", "share_writers": 2, "items": 2, "digest": shares.digest(items)}

    def part(rank, recs):
        return Manifest(0, 1.0, RangeRecord(RANGE, 0, 1), [ProgramRecord("fp", "l", recs)], 64,
                        extra={"part": {"rank": rank, "share": good}}, version=3)

    def a(lo, hi, shape=(4,), dtype="float32"):
        return TensorRecord("a", dtype, list(shape), 0, hi - lo, 0, (lo, hi))

    b = TensorRecord("b", "float32", [2], 32, 8, 0)
    assert shares.check_cover({0: part(0, [a(0, 10)]), 1: part(1, [a(10, 16), b])}, "x") == good
    for recs0, recs1, msg in [
        ([a(0, 9)], [a(10, 16), b], r"held without its bytes \[9, 10\) by the parts of ranks \[0, 1\]"),
        ([a(0, 11)], [a(10, 16), b], r"held twice by the parts of ranks \[0, 1\]"),
        ([a(0, 10)], [b], r"bytes \[0, 10\) of tensor 'a' of program fp, which has 16 \(a piece is missing\)"),
        ([a(2, 10)], [a(10, 16), b], r"without its bytes \[0, 2\)"),
        ([a(0, 10)], [a(10, 16, (2, 2)), b], r"is float32\[4\] in the part of rank 0 and float32\[2, 2\]"),
        ([a(0, 10)], [a(10, 16, dtype="int32"), b], "and int32"),
        ([TensorRecord("a", "float32", [4], 0, 16, 0)], [a(10, 16), b], "held twice"),
    ]:
        with pytest.raises(CorruptCheckpointError, match=msg):
            shares.check_cover({0: part(0, recs0), 1: part(1, recs1)}, "x")


@given(st.lists(st.integers(1, 200), min_size=1, max_size=6), st.integers(1, 5), st.data())
@settings(max_examples=200, deadline=None)
def test_any_edit_of_the_pieces_is_caught_or_the_same_tiling(sizes, writers, data):
    """The split's pieces pass the cover check; moving any piece's bounds (or dropping a record) either
    still tiles every tensor exactly (then the same bytes are read) or is CorruptCheckpointError."""
    from paddle_acp.format.manifest import Manifest, ProgramRecord, TensorRecord

    items = [("fp", f"t{i}", "uint8", (n,), n) for i, n in enumerate(sizes)]
    split = shares.split(items, writers)
    rec = shares.record(items, writers)
    recs = {r: [TensorRecord(n, "uint8", [b], 0, (piece or (0, b))[1] - (piece or (0, b))[0], 0, piece)
                for (_k, n, _d, _s, b) in items if ("fp", n) in split[r] for piece in [split[r][("fp", n)]]]
            for r in range(writers)}

    def parts():
        return {r: Manifest(0, 1.0, RangeRecord(RANGE, 0, 1), [ProgramRecord("fp", "l", recs[r])], 10**4,
                            extra={"part": {"rank": r, "share": rec}}, version=3) for r in range(writers)}

    assert shares.check_cover(parts(), "x") == rec
    r = data.draw(st.sampled_from([r for r in range(writers) if recs[r]] or [0]))
    if not recs[r]:
        return
    i = data.draw(st.integers(0, len(recs[r]) - 1))
    t = recs[r][i]
    if data.draw(st.booleans()):
        del recs[r][i]
    else:
        whole = t.whole_nbytes
        lo = data.draw(st.integers(0, whole - 1))
        hi = data.draw(st.integers(lo + 1, whole))
        recs[r][i] = TensorRecord(t.name, t.dtype, t.shape, 0, hi - lo, 0, (lo, hi))
    try:
        shares.check_cover(parts(), "x")
    except CorruptCheckpointError:
        return
    for (_k, n, _d, _s, b) in items:  # accepted: every tensor's records still tile its bytes exactly once
        ranges = sorted(x.piece or (0, x.nbytes) for q in recs.values() for x in q if x.name == n)
        assert ranges[0][0] == 0 and ranges[-1][1] == b
        assert all(ranges[j][1] == ranges[j + 1][0] for j in range(len(ranges) - 1))


def test_a_piece_is_never_read_into_a_whole_tensor():
    """Defence in depth under the manifest checks: a source refuses to fill an array with a record of
    another size (a piece would leave the rest of the tensor as it was: a silent partial restore)."""
    from paddle_acp.format.engine.loaded import FileSource, MemorySource
    from paddle_acp.format.manifest import TensorRecord

    piece = TensorRecord("w", "float32", [2, 2], 0, 6, 0, (4, 10))
    with pytest.raises(CorruptCheckpointError, match="holds 6 bytes of it \\(a piece\\), not the 16"):
        MemorySource({("k", "w"): np.zeros(6, np.uint8)}).read_into([("k", piece, np.empty((2, 2), np.float32))])
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(bytes(range(64)))
        f.flush()
        src = FileSource(os.dup(f.fileno()), "x")
        with pytest.raises(CorruptCheckpointError, match="not the 16"):
            src.read_into([("k", piece, np.empty((2, 2), np.float32))])
        out = np.empty(6, np.uint8)
        src.read_into([("k", piece, out)])
        assert out.tobytes() == bytes(range(6))
        src.close()


def test_a_one_writer_global_manifest_over_parts_that_hold_shares_is_refused_alike(tmp_path):
    """A crafted global.json that says one writer (version 3) over spread parts (whose records it keeps):
    no rank reads rank 0's share as if it were the whole state; every rank falls back alike."""
    from paddle_acp.format.manifest import seal

    save_all(tmp_path, 2, 0, spread=False)
    save_all(tmp_path, 2, 1)
    path = ckdir(tmp_path, "ckpt-e1") / "global.json"
    d = json.loads(path.read_bytes())
    d.pop("checksum")
    d.pop("writers")
    d.pop("share_writers")
    d["version"] = 3
    path.write_bytes(seal(d))
    why = None
    for _restart in range(2):
        for r in range(2):
            try:
                loaded = load_newest(v2(tmp_path), gck(tmp_path, r, 2), None)
            except RestartRequiredError as exc:
                why = str(exc)
                continue
            assert loaded.global_manifest.name == "ckpt-e0" and same(values(loaded), expected(0))
            loaded.close()
    assert why is not None and "holds a share" in why, why  # the first rank to read it marked it bad


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
    # a part that holds pieces of tensors is a version-3 manifest: a build that reads up to version 2 says so
    from paddle_acp.errors import UnknownFormatError
    from paddle_acp.format import manifest as mf

    raw = (ckdir(tmp_path, "ckpt-e1") / "rank-0" / "manifest.json").read_bytes()
    assert json.loads(raw)["version"] == 3
    monkeypatch.setattr(mf, "TENSOR_CHECKSUMS", {1: "crc32", 2: "crc32c"})
    with pytest.raises(UnknownFormatError, match="manifest format version 3 is newer than this paddle-acp reads"):
        mf.Manifest.loads(raw)


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
    pieces = [(k, t) for k in range(3) for p in json.loads((ckdir(tmp_path, "ckpt-e2") / f"rank-{k}" / "manifest.json")
                                                           .read_bytes())["programs"] for t in p["tensors"] if "piece" in t]
    k, t = pieces[0]  # a piece is shown as the byte range of its tensor that the part holds
    out = tool("inspect", str(ckdir(tmp_path, "ckpt-e2")), "--rank", str(k)).stdout
    assert f"its bytes {t['piece'][0]}..{t['piece'][1]}" in out, out
    exp = tool("export", str(ckdir(tmp_path, "ckpt-e2")), "--program", "fp-a", "--to", str(tmp_path / "x"),
               "--optimizer-state")
    assert exp.returncode == 0, exp.stdout
    info = json.loads((tmp_path / "x" / "model.export.json").read_text())
    got = sorted((info["parameters"] or []) + (info["optimizer_state"] or []))
    assert got == sorted(t.name for t in state(2)[0].tensors)  # every share's tensors, not rank 0's alone
    import paddle  # the exported files hold the tensors bit-identically, pieces joined

    exported = {**paddle.load(str(tmp_path / "x" / "model.pdparams"), return_numpy=True)}
    if (tmp_path / "x" / "model.pdopt").exists():
        exported.update(paddle.load(str(tmp_path / "x" / "model.pdopt"), return_numpy=True))
    assert {n: a.tobytes() for n, a in exported.items()} == {t.name: t.array.tobytes() for t in state(2)[0].tensors}
    data = ckdir(tmp_path, "ckpt-e2") / "rank-2" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    v = tool("verify", str(tmp_path))
    assert v.returncode == 1 and "ckpt-e2 is bad" in v.stdout, v.stdout


json_st = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=5),
                       lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)


@given(st.sampled_from(["writers", "share_writers", "items", "digest", "extra"]), json_st, st.integers(0, 1))
@settings(max_examples=300, deadline=None)
def test_any_edit_of_a_share_record_is_caught_or_harmless(key, value, which):
    """A crafted ``extra.part.share`` (untrusted, as every manifest) either is the record every part
    carries, or the cover check raises CorruptCheckpointError, never anything else."""
    from paddle_acp.format.manifest import Manifest, ProgramRecord, TensorRecord

    items = [("fp", n, "float32", (1,), 4) for n in ("a", "b")]
    good = {"writers": "all", "share_writers": 2, "items": 2, "digest": shares.digest(items)}
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

    from paddle_acp.format.checkpoints.cache import LocalCache

    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    uri = f"s3://{s3_server.bucket}/spread/{uuid.uuid4().hex[:8]}"

    def cgck(rank):
        g = GlobalCheckpointer(open_storage(uri), JOB, RANGE, rank, 2, 3, 60.0,
                               cache=LocalCache.open(str(tmp_path / f"node{rank}"), uri, 3).for_range(JOB, RANGE, rank))
        g.poll_interval = 0.01
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
            loaded = load_newest(PartReader(open_storage(uri), JOB, RANGE), cgck(r), None)
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
        load_newest(PartReader(st_, JOB, RANGE), cgck(0), None)
    for r in (0, 1):  # rank 1's intact copy of its share does not save the copy every rank must agree on
        loaded = load_newest(PartReader(st_, JOB, RANGE), cgck(r), None)
        assert loaded.name == "ckpt-e0" and same(values(loaded), expected(0))
        loaded.close()


def test_the_writers_setting():
    from paddle_acp.config import from_env
    from paddle_acp.errors import ConfigError

    base = {"PADDLE_ACP_CHECKPOINT_URI": "/tmp/x", "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": "1"}
    from paddle_acp.config import DEFAULT_SHARE_WRITERS, CheckpointConfig, writer_cap

    assert from_env(base).replicated_writers == "all" and writer_cap("all") == DEFAULT_SHARE_WRITERS == 8
    assert from_env({**base, "PADDLE_ACP_REPLICATED_WRITERS": " One "}).replicated_writers == "one"
    assert writer_cap("one") is None
    for raw, want, cap in (("2", "2", 2), (" 16 ", "16", 16), ("08", "8", 8), ("1", "one", None), ("65536", "65536", 65536)):
        got = from_env({**base, "PADDLE_ACP_REPLICATED_WRITERS": raw}).replicated_writers
        assert got == want and writer_cap(got) == cap, (raw, got)
    for raw in ("some", "0", "-2", "2.5", "1e3", "65537", "٣", "0x10", "all,one"):
        with pytest.raises(ConfigError, match=rf"PADDLE_ACP_REPLICATED_WRITERS={raw!r} must be all, one or a whole "
                                               r"number of share writers from 1 to 65536"):
            from_env({**base, "PADDLE_ACP_REPLICATED_WRITERS": raw})
    for bad in ("0", "1", "x", 3):  # a config built in code is checked alike ("1" is spelled "one" there)
        with pytest.raises(ConfigError, match="PADDLE_ACP_REPLICATED_WRITERS="):
            CheckpointConfig(uri="/tmp/x", replicated_writers=bad)


def test_the_share_is_chosen_from_metadata_and_only_its_tensors_are_viewed(monkeypatch):
    """A real Paddle program: the metadata items are exactly what views would give (so the split and
    digest computed before any view agree with the written share), and a rank takes views of (on an
    accelerator: copies to the host) its share's tensors only."""
    import paddle
    from support import models

    from paddle_acp.adapter import tensors as adapter_tensors
    from paddle_acp.adapter.programs import program_info
    from paddle_acp.runtime.registry import ProgramEntry

    with models.ir_mode("pir"):
        main, startup, _ex = models.build("adam")
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            paddle.static.Executor(paddle.CPUPlace()).run(startup)
        entry = ProgramEntry("fp-x", program_info(main), main, scope, paddle.CPUPlace())
        items = entry.items()
        assert len(items) >= 4 and items == snapshot_items([entry.views()])
        viewed = []
        real = adapter_tensors.tensor_view

        def spy(tensor):  # the real view; records how many tensors are touched
            viewed.append(1)
            return real(tensor)

        monkeypatch.setattr(adapter_tensors, "tensor_view", spy)
        full = entry.views()
        assert len(viewed) == len(items)
        for rank in (0, 1, 2):
            viewed.clear()
            mine = shares.owned(items, rank, 2)
            part = entry.views(mine)
            assert len(viewed) == len(mine) == len(part.tensors) and (rank < 2) == bool(mine)
            want = [t if mine[("fp-x", t.name)] is None else t.cut(*mine[("fp-x", t.name)])
                    for t in full.tensors if ("fp-x", t.name) in mine]
            assert [(t.name, t.dtype, t.piece, t.array.tobytes()) for t in part.tensors] == \
                [(t.name, t.dtype, t.piece, t.array.tobytes()) for t in want]
            assert part.lr_scheduler == full.lr_scheduler
