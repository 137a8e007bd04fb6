"""Same verdict on every rank (issue 25): a rank that rejects data the others may accept never
falls back alone; a mark condemns one exact copy of a checkpoint, not its position; parts moved
between ranks are refused. Real training processes (tests/scripts/rank_train.py), real local
storage and a real S3 server, each rank with its own node-local cache; the mark's name and content
formats are property-tested."""
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.e2e import JOB_ID, REPO, compare_results, is_done, load_result, read_log, script_env
from support.server_fixtures import s3_server  # noqa: F401  (fixture)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unit", "format"))  # tests/unit/format/test_multirank.py (its helpers, imported below)

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, RestartRequiredError
from paddle_acp.format.commit.verdict import MAX_MARK_SIZE, MAX_REASON, Mark
from paddle_acp.format.layout import bad_mark, parse_bad_mark
from paddle_acp.format.manifest import seal
from paddle_acp.storage import open_storage

RANK_SCRIPT = os.path.join(REPO, "tests", "scripts", "rank_train.py")
RDIR = f"{JOB_ID}/range/_range_0"
CACHE_LOG = "from the local cache"


def launch(tmp, world, *args, ckpt=None, gen="g0", env=None, rank_env=None, outs="out", barrier=True, no_acp=False,
           rank_0_first=False):
    """Start ``world`` ranks of rank_train.py (each with ``env`` and its own ``rank_env[r]``); [(rc, output)].
    ``rank_0_first``: the other ranks start once rank 0 has restored (and begun its first epoch)."""
    procs = []
    for r in range(world):
        if r == 1 and rank_0_first:
            deadline = time.monotonic() + 200
            while procs[0].poll() is None and time.monotonic() < deadline and not any(
                    s.get("gen") == gen for s in starts(tmp / outs / "r0", missing_ok=True)):
                time.sleep(0.02)
        e = {"PADDLE_TRAINER_ID": r, "PADDLE_TRAINERS_NUM": world, "ACP_TEST_GEN": gen, "PADDLE_ACP_PART_TIMEOUT": 60,
             **(env or {}), **((rank_env or {}).get(r, {}))}
        cmd = [sys.executable, RANK_SCRIPT, "--out", str(tmp / outs / f"r{r}")] + [str(a) for a in args]
        if barrier:
            cmd += ["--barrier", str(tmp / "barrier")]
        if no_acp:
            cmd.append("--no-acp")
        procs.append(subprocess.Popen(cmd, env=script_env(ckpt, "pir", e), cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs_ = [p.communicate(timeout=400)[0] for p in procs]
    return [(p.returncode, out) for p, out in zip(procs, outs_)]


def starts(out, missing_ok=False):
    if missing_ok and not os.path.exists(os.path.join(str(out), "events.jsonl")):
        return []
    with open(os.path.join(str(out), "events.jsonl")) as f:
        return [json.loads(x) for x in f.read().splitlines() if x.strip()]


def undone(tmp, outs="out", world=2):
    for r in range(world):
        p = tmp / outs / f"r{r}" / "done"
        if p.exists():
            os.remove(p)


def flip_one_byte(storage, path):
    raw = bytearray(storage.read_bytes(path))
    raw[len(raw) // 2] ^= 0x10
    storage.write_bytes(path, bytes(raw))


def tool(*args):
    return subprocess.run([sys.executable, "-m", "paddle_acp", *[str(a) for a in args]], cwd=REPO, env=script_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


# The restart where one rank rejects the checkpoint the job resumed from: that rank sends no part. Rank 0 checks the
# marks on its base while it waits for the missing part (format/commit/part_commit.py: every LATER_PARTS_EVERY
# seconds from the second round on), so it stops within seconds of the mark, not when PADDLE_ACP_PART_TIMEOUT ends
# (it used to wait that out: 300 s by default). These restarts set a timeout longer than launch()'s own 400 s limit:
# a rank 0 that waited it out fails the test.
REJECTED_PART_TIMEOUT = 600


def tail(res):
    return "\n".join(f"--- rank {r} (rc {rc}) ---\n{out[-4000:]}" for r, (rc, out) in enumerate(res))


# -- the mark's name and content (formats: property-tested) --------------------------------------
@settings(max_examples=300, deadline=None)
@given(rank=st.integers(0, 10**6 - 1), crc=st.integers(0, 2**32 - 1))
def test_mark_names_round_trip_canonically(rank, crc):
    name = bad_mark(rank, crc)
    assert parse_bad_mark(name) == (rank, crc)
    assert name == f"bad-rank-{rank}-{crc:08x}"
    # any other spelling of the same verdict is foreign: never read, never deleted
    for other in (f"bad-rank-0{rank}-{crc:08x}", f"bad-rank-{rank}-{crc:08X}" if f"{crc:08x}" != f"{crc:08X}" else "x",
                  f"bad-rank-{rank}-{crc:09x}", f"bad-rank-{rank}", f"bad-rank-{rank}-{crc:08x}.tmp", f" {name}",
                  f"bad-rank-+{rank}-{crc:08x}", f"bad-rank-{rank}-{crc:08x}\n"):
        assert parse_bad_mark(other) is None, other


@settings(max_examples=500, deadline=None)
@given(text=st.text(max_size=40) | st.from_regex(r"bad-rank-[0-9]{1,8}-[0-9a-fA-F]{6,10}", fullmatch=True))
def test_any_name_parses_to_none_or_to_its_one_canonical_spelling(text):
    got = parse_bad_mark(text)
    assert got is None or bad_mark(*got) == text


@settings(max_examples=300, deadline=None)
@given(rank=st.integers(0, 10**6 - 1), crc=st.integers(0, 2**32 - 1),
       checkpoint=st.sampled_from(["ckpt-e3", "ckpt-e12-s400"]),
       reason=st.text(max_size=3000) | st.text(st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF), max_size=800))
def test_mark_content_round_trips_within_its_size_cap(rank, crc, checkpoint, reason):
    m = Mark(checkpoint, rank, crc, reason)
    raw = m.dumps()
    assert len(raw) <= MAX_MARK_SIZE
    back = Mark.loads(raw, m.name)
    assert (back.checkpoint, back.rank, back.global_crc32) == (checkpoint, rank, crc)
    assert reason[:MAX_REASON].startswith(back.reason)
    if len(reason) <= 300:
        assert back.reason == reason
    with pytest.raises(CorruptCheckpointError, match="holds the content of"):
        Mark.loads(raw, bad_mark(rank, crc ^ 1))


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(max_size=300) | st.builds(
    lambda d: json.dumps(d).encode(),
    st.fixed_dictionaries({"format": st.sampled_from(["paddle-acp/bad-mark", "x"]), "version": st.sampled_from([1, 2, True]),
                           "checkpoint": st.text(max_size=5) | st.integers(), "rank": st.integers(-2, 2**40) | st.none(),
                           "global_crc32": st.integers(-1, 2**33) | st.text(max_size=3), "reason": st.text(max_size=5)})))
def test_hostile_mark_content_is_read_or_refused_as_corrupt(raw):
    try:
        m = Mark.loads(raw)
    except CorruptCheckpointError:
        return
    assert 0 <= m.rank < 10**6 and 0 <= m.global_crc32 < 2**32 and m.checkpoint


# -- the protocol, in process (real local storage) ------------------------------------------------
def test_a_mark_condemns_one_copy_and_the_position_written_again_is_clean(tmp_path):
    from test_multirank import JOB, gck, save_all, v2

    from paddle_acp.format.checkpoints.restart import load_newest

    for e in (0, 1):
        save_all(tmp_path, 2, e)
    ck = tmp_path / JOB / "range" / "_range_0" / "ckpt-e1"
    first_crc = zlib.crc32((ck / "global.json").read_bytes())
    data = ck / "rank-1" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[3] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(RestartRequiredError, match="its part of checkpoint .*marked bad .*restart the job"):
        load_newest(v2(tmp_path), gck(tmp_path, 1, 2), "per-rank")
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("bad-")) == [bad_mark(1, first_crc)]
    got = {}
    for r in (1, 0):  # the restart: both see the mark and fall back alike
        g = gck(tmp_path, r, 2)
        got[r] = load_newest(v2(tmp_path), g, "per-rank")
        assert got[r].global_manifest.name == "ckpt-e0"
        g.start.discard_newer(got[r].position_key)
    # a rank that had accepted ckpt-e1 (resumed from it) stops at its first save and rank 0 before a commit
    for r in (0, 1):
        g = gck(tmp_path, r, 2)
        g.base, g.base_crc = "ckpt-e1", first_crc
        with pytest.raises(RestartRequiredError, match="which this job resumed from, was marked bad at restore by rank"):
            g.check_base()
    # ckpt-e1 written again (from the ranks' base ckpt-e0): the old mark is removed, the new copy loads
    assert save_all(tmp_path, 2, 1).committed is True
    assert zlib.crc32((ck / "global.json").read_bytes()) != first_crc
    assert not [p.name for p in ck.iterdir() if p.name.startswith("bad-")]
    # even a verdict on the old copy that comes back (a slow rank's late write) does not condemn the new one
    (ck / bad_mark(1, first_crc)).write_bytes(Mark("ckpt-e1", 1, first_crc, "late").dumps())
    for r in (0, 1):
        assert load_newest(v2(tmp_path), gck(tmp_path, r, 2), "per-rank").global_manifest.name == "ckpt-e1"


# -- item 1: replicated ranks, each with its own node-local cache (real S3) ----------------------
def test_replicated_ranks_with_their_own_caches_never_resume_from_different_checkpoints(s3_server, tmp_path, monkeypatch):
    """Rank 0's node holds an intact copy of ckpt-e3; on the remote one byte of its data is damaged.
    Rank 1 (which reads the remote) rejects it: it marks the copy bad and stops, and rank 0, which
    restored ckpt-e3 from its cache, stops before it commits anything. The restart falls back alike
    to ckpt-e2 on both ranks and ends bit-identical to an uninterrupted run."""
    ref = launch(tmp_path, 1, "--kind", "dp", "--epochs", 6, outs="ref", barrier=False, no_acp=True)
    assert ref[0][0] == 0, ref[0][1][-3000:]
    reference = load_result(tmp_path / "ref" / "r0")
    uri = f"s3://{s3_server.bucket}/verdict/{uuid.uuid4().hex[:8]}"
    # one writer: every rank restores rank 0's data (from rank 0's node-local copy on rank 0)
    env = dict(s3_server.client_env(), PADDLE_ACP_RANK_STATE="replicated", PADDLE_ACP_PART_TIMEOUT=40,
               PADDLE_ACP_REPLICATED_WRITERS="one")
    nodes = {r: {"PADDLE_ACP_LOCAL_CACHE": str(tmp_path / f"node{r}")} for r in (0, 1)}
    res = launch(tmp_path, 2, "--kind", "dp", "--epochs", 4, ckpt=uri, env=env, rank_env=nodes, gen="a")
    assert all(rc == 0 for rc, _ in res), tail(res)
    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    st_ = open_storage(uri)
    flip_one_byte(st_, f"{RDIR}/ckpt-e3/rank-0/tensors.bin")
    crc = zlib.crc32(st_.read_bytes(f"{RDIR}/ckpt-e3/global.json"))
    undone(tmp_path)
    # rank 1 starts once rank 0 has restored ckpt-e3 (from its cache) and trains on (no barrier holds it up)
    res = launch(tmp_path, 2, "--kind", "dp", "--epochs", 6, ckpt=uri, env=dict(env, PADDLE_ACP_PART_TIMEOUT=REJECTED_PART_TIMEOUT),
                 rank_env=nodes, gen="b", barrier=False,
                 rank_0_first=True)
    (rc0, out0), (rc1, out1) = res
    assert f"checkpoint ckpt-e3 (part of rank 0) of {uri}" in out0 and CACHE_LOG in out0, tail(res)  # the premise
    assert rc1 != 0 and "RestartRequiredError: rank 1: rank 0's data of checkpoint" in out1, tail(res)
    assert "does not fall back alone" in out1 and "restart the job" in out1, tail(res)
    assert rc0 != 0 and "RestartRequiredError: rank 0: checkpoint" in out0, tail(res)
    assert "which this job resumed from, was marked bad at restore by rank(s) 1" in out0, tail(res)
    assert [e.name for e in st_.listdir(f"{RDIR}/ckpt-e3") if e.name.startswith("bad-")] == [bad_mark(1, crc)]
    assert not st_.exists(f"{RDIR}/ckpt-e4/global.json")  # rank 0 committed nothing on its own
    assert starts(tmp_path / "out" / "r1")[-1]["gen"] == "a"  # rank 1 never started training
    # the restart: both ranks see the mark and fall back to ckpt-e2, whatever their caches hold
    undone(tmp_path)
    res = launch(tmp_path, 2, "--kind", "dp", "--epochs", 6, ckpt=uri, env=env, rank_env=nodes, gen="c")
    assert all(rc == 0 for rc, _ in res), tail(res)
    for r in (0, 1):
        assert starts(tmp_path / "out" / f"r{r}")[-1] == {**starts(tmp_path / "out" / f"r{r}")[-1],
                                                         "restored": "ckpt-e2", "epoch": 3, "gen": "c"}
        assert is_done(tmp_path / "out" / f"r{r}")
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), reference), r


# -- the per-rank job the next two tests start from ----------------------------------------------------
TP_ARGS = ["--kind", "tp", "--steps-per-epoch", 2]
TP_ENV = {"PADDLE_ACP_RANK_STATE": "per-rank", "PADDLE_ACP_PART_TIMEOUT": 40}


@pytest.fixture(scope="module")
def tp_job(tmp_path_factory):
    """The two ranks' uninterrupted 6-epoch runs without paddle-acp (``ref/``) and a per-rank job
    trained to epoch 4 (``ckpt/``, ``out/``, start "a"), run once for the module: the tests below only
    read them, each in its own copy (``tp_copy``), which it then damages and restarts."""
    base = tmp_path_factory.mktemp("tp_job")
    ref = launch(base, 2, *TP_ARGS, "--epochs", 6, outs="ref", barrier=False, no_acp=True)
    assert all(rc == 0 for rc, _ in ref), tail(ref)
    res = launch(base, 2, *TP_ARGS, "--epochs", 4, ckpt=base / "ckpt", env=TP_ENV, gen="a")
    assert all(rc == 0 for rc, _ in res), tail(res)
    return base


def tp_copy(tp_job, tmp_path):
    """This test's own copy of ``tp_job``'s checkpoints and outputs; the reference runs' results."""
    for d in ("out", "ckpt"):
        shutil.copytree(tp_job / d, tmp_path / d, symlinks=True)
    return [load_result(tp_job / "ref" / f"r{r}") for r in (0, 1)]


# -- item 3: a position written again carries no verdict of the copy it replaced ------------------
def test_a_rewritten_position_is_resumed_from_and_the_tools_agree(tp_job, tmp_path):
    """Per-rank job: rank 1's part of ckpt-e3 is damaged; the restart stops both ranks (rank 1
    marks the copy), the next falls back to ckpt-e2 and writes ckpt-e3 again; the restart after
    that resumes from the new ckpt-e3 (not from ckpt-e2 again), `ls` and `verify` say so, and
    each rank ends bit-identical to its own uninterrupted run."""
    args, env = TP_ARGS, TP_ENV
    refs = tp_copy(tp_job, tmp_path)  # the reference runs, and the job trained to epoch 4 (start "a")
    ckpt = tmp_path / "ckpt"
    st_ = open_storage(str(ckpt))
    flip_one_byte(st_, f"{RDIR}/ckpt-e3/rank-1/tensors.bin")
    old_crc = zlib.crc32(st_.read_bytes(f"{RDIR}/ckpt-e3/global.json"))
    undone(tmp_path)
    # rank 1 starts once rank 0 has restored ckpt-e3 and trains on (rank 0 has accepted the copy rank 1 rejects)
    res = launch(tmp_path, 2, *args, "--epochs", 6, ckpt=ckpt, env=dict(env, PADDLE_ACP_PART_TIMEOUT=REJECTED_PART_TIMEOUT),
                 gen="b", barrier=False, rank_0_first=True)
    (rc0, out0), (rc1, out1) = res
    assert rc1 != 0 and "rank 1: its part of checkpoint" in out1 and "marked bad" in out1, tail(res)
    assert rc0 != 0 and "which this job resumed from, was marked bad at restore by rank(s) 1" in out0, tail(res)
    assert [e.name for e in st_.listdir(f"{RDIR}/ckpt-e3") if e.name.startswith("bad-")] == [bad_mark(1, old_crc)]
    v = tool("verify", ckpt)
    assert v.returncode == 1 and "ckpt-e3 is bad" in v.stdout and "marked bad at restore by rank(s) 1" in v.stdout, v.stdout
    # restart: both fall back to ckpt-e2 and write ckpt-e3 again
    undone(tmp_path)
    res = launch(tmp_path, 2, *args, "--epochs", 4, ckpt=ckpt, env=env, gen="c")
    assert all(rc == 0 for rc, _ in res), tail(res)
    for r in (0, 1):
        assert (starts(tmp_path / "out" / f"r{r}")[-1]["restored"], starts(tmp_path / "out" / f"r{r}")[-1]["epoch"]) == (
            "ckpt-e2", 3)
    assert zlib.crc32(st_.read_bytes(f"{RDIR}/ckpt-e3/global.json")) != old_crc
    assert not [e.name for e in st_.listdir(f"{RDIR}/ckpt-e3") if e.name.startswith("bad-")]
    ls = tool("ls", ckpt)
    e3 = [ln for ln in ls.stdout.splitlines() if ln.strip().lstrip("* ").startswith("ckpt-e3 ")]  # its table row
    assert "a restart loads ckpt-e3" in ls.stdout and len(e3) == 1 and "ok (2 ranks, per-rank)" in e3[0], ls.stdout
    v = tool("verify", ckpt)
    assert v.returncode == 0, v.stdout
    # restart again: both resume from the rewritten ckpt-e3
    undone(tmp_path)
    res = launch(tmp_path, 2, *args, "--epochs", 6, ckpt=ckpt, env=env, gen="d")
    assert all(rc == 0 for rc, _ in res), tail(res)
    for r in (0, 1):
        last = starts(tmp_path / "out" / f"r{r}")[-1]
        assert (last["restored"], last["epoch"], last["gen"]) == ("ckpt-e3", 4, "d"), last
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), refs[r]), r


# -- issue 28: each rank reads only the parts it loads; a bad one is agreed on through the mark ----
def test_a_damaged_part_manifest_is_seen_by_its_rank_alone_and_every_rank_falls_back_alike(tp_job, tmp_path):
    """Per-rank job: one byte of rank 1's part manifest of ckpt-e3 is damaged. Rank 0 never reads
    rank 1's part and accepts ckpt-e3; rank 1 alone sees the damage, marks the copy bad and stops
    (it does not fall back alone); rank 0 stops before it commits anything. The restart falls
    back to ckpt-e2 on both ranks, and each ends bit-identical to its own uninterrupted run."""
    args, env = TP_ARGS, TP_ENV
    refs = tp_copy(tp_job, tmp_path)  # the reference runs, and the job trained to epoch 4 (start "a")
    ckpt = tmp_path / "ckpt"
    st_ = open_storage(str(ckpt))
    flip_one_byte(st_, f"{RDIR}/ckpt-e3/rank-1/manifest.json")
    crc = zlib.crc32(st_.read_bytes(f"{RDIR}/ckpt-e3/global.json"))
    undone(tmp_path)
    res = launch(tmp_path, 2, *args, "--epochs", 6, ckpt=ckpt, env=dict(env, PADDLE_ACP_PART_TIMEOUT=REJECTED_PART_TIMEOUT),
                 gen="b", barrier=False, rank_0_first=True)
    (rc0, out0), (rc1, out1) = res
    assert rc1 != 0 and "RestartRequiredError: rank 1: its part of checkpoint" in out1, tail(res)
    assert "does not match the checksum the global manifest records" in out1 and "does not fall back alone" in out1, tail(res)
    assert starts(tmp_path / "out" / "r0")[-1]["gen"] == "b"  # rank 0 accepted ckpt-e3 and trained on ...
    assert starts(tmp_path / "out" / "r1")[-1]["gen"] == "a"  # ... rank 1 never started
    assert rc0 != 0 and "which this job resumed from, was marked bad at restore by rank(s) 1" in out0, tail(res)
    assert [e.name for e in st_.listdir(f"{RDIR}/ckpt-e3") if e.name.startswith("bad-")] == [bad_mark(1, crc)]
    assert not st_.exists(f"{RDIR}/ckpt-e4/global.json")  # rank 0 committed nothing on its own
    # the restart: both ranks see the mark and fall back to ckpt-e2 alike
    undone(tmp_path)
    res = launch(tmp_path, 2, *args, "--epochs", 6, ckpt=ckpt, env=env, gen="c")
    assert all(rc == 0 for rc, _ in res), tail(res)
    for r in (0, 1):
        last = starts(tmp_path / "out" / f"r{r}")[-1]
        assert (last["restored"], last["epoch"], last["gen"]) == ("ckpt-e2", 3, "c"), last
        assert is_done(tmp_path / "out" / f"r{r}")
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), refs[r]), r


# -- item 5: parts swapped between ranks -----------------------------------------------------------
def test_swapped_parts_are_refused_on_every_rank(tp_job, tmp_path):
    """The rank-0 and rank-1 directories of ckpt-e3 (the newest) are swapped, and their records in global.json
    too (resealed: every checksum holds). Every rank stops with one clear error naming the
    checkpoint and both identities; nothing is trained, and nothing is deleted."""
    tp_copy(tp_job, tmp_path)  # the job trained to epoch 4 (start "a")
    ckpt = tmp_path / "ckpt"
    ck = ckpt / RDIR / "ckpt-e3"
    os.rename(ck / "rank-0", ck / "rank-x")
    os.rename(ck / "rank-1", ck / "rank-0")
    os.rename(ck / "rank-x", ck / "rank-1")
    d = json.loads((ck / "global.json").read_text())
    d.pop("checksum")
    p0, p1 = d["parts"]
    d["parts"] = [dict(p1, rank=0), dict(p0, rank=1)]
    (ck / "global.json").write_bytes(seal(d))
    before = {r: len(read_log(tmp_path / "out" / f"r{r}")) for r in (0, 1)}
    tree = sorted(str(p.relative_to(ckpt)) for p in (ckpt / RDIR).rglob("*"))
    undone(tmp_path)
    res = launch(tmp_path, 2, *TP_ARGS, "--epochs", 6, ckpt=ckpt, env=TP_ENV, gen="b", barrier=False)
    for r, (rc, out) in enumerate(res):  # each rank reads its own part only (issue 28), and refuses it
        assert rc != 0, tail(res)
        assert "CheckpointError: checkpoint" in out and f"ckpt-e3: the part in rank-{r}/ records rank {1 - r} of world size 2" in out, tail(res)
        assert f"lists it as rank {r} of world size 2, mode 'per-rank'" in out and "moved or swapped" in out, tail(res)
        assert len(read_log(tmp_path / "out" / f"r{r}")) == before[r]  # not one step trained
        assert starts(tmp_path / "out" / f"r{r}")[-1]["gen"] == "a"
    assert sorted(str(p.relative_to(ckpt)) for p in (ckpt / RDIR).rglob("*")) == tree  # nothing deleted
    v = tool("verify", ckpt)
    assert v.returncode == 1 and "ckpt-e3 is bad" in v.stdout and "moved or swapped" in v.stdout, v.stdout


def test_check_part_names_both_identities():
    from paddle_acp.format.commit.verdict import check_part
    from paddle_acp.format.global_manifest import GlobalManifest, PartRecord
    from paddle_acp.format.manifest import Manifest, RangeRecord

    g = GlobalManifest("ckpt-e2", "_range_0", 2, None, 2, "replicated", [PartRecord(0, 1, 10, 0, []), PartRecord(1, 2, 10, 0, [])])

    def part(extra):
        return Manifest(number=g.number, created=0.0, range=RangeRecord("_range_0", 2, 9, None), programs=[],
                        data_size=0, extra=extra)

    check_part("d/ckpt-e2", g, 1, part({"part": {"rank": 1, "world_size": 2, "mode": "replicated", "base": None}}))
    for extra, says in [({"part": {"rank": 0, "world_size": 2, "mode": "replicated"}}, "records rank 0 of world size 2"),
                        ({"part": {"rank": 1, "world_size": 3, "mode": "replicated"}}, "records rank 1 of world size 3"),
                        ({"part": {"rank": 1, "world_size": 2, "mode": "per-rank"}}, "mode 'per-rank'"),
                        ({"part": {"rank": True, "world_size": 2, "mode": "replicated"}}, "records rank True"),
                        ({}, "records no part identity")]:
        with pytest.raises(CheckpointError, match=says):
            check_part("d/ckpt-e2", g, 1, part(extra))
