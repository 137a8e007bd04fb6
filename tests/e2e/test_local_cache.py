"""The node-local cache tier (PADDLE_ACP_LOCAL_CACHE) against REAL HDFS and S3 servers.

A writer with a cache keeps a local copy of each checkpoint it commits on the remote; a
restart on the same node reads the data from that copy only when its manifest is byte for
byte the remote's committed manifest and every checksum verifies, and from the remote
otherwise (a stale copy, a corrupt one, a checkpoint the remote no longer has, a part the
global commit does not name), with one log line saying why. No mocks: real servers
(tests/support/server_fixtures.py), real files, real training processes killed with SIGKILL.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import sys
import threading
import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import JOB_ID, compare_results, describe, is_done, load_result, run_script  # noqa: E402
from support.newest import committed as committed_on  # noqa: E402
from support.newest import one_process, save  # noqa: E402
from support.server_fixtures import hdfs_server, s3_server  # noqa: E402,F401  (fixtures)

from paddle_acp.config import from_env  # noqa: E402
from paddle_acp.errors import ConfigError  # noqa: E402
from paddle_acp.format.checkpoints.cache import LocalCache  # noqa: E402
from paddle_acp.format.checkpoints.cache_key import cache_key, canonical_location  # noqa: E402
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer  # noqa: E402
from paddle_acp.format.checkpoints.part_reader import PartReader  # noqa: E402
from paddle_acp.format.checkpoints.restart import load_newest  # noqa: E402
from paddle_acp.format.commit.fencing import Fence, FencedError  # noqa: E402
from paddle_acp.format.engine.arena import Arena  # noqa: E402
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData, copy_into  # noqa: E402
from paddle_acp.format.layout import GLOBAL_NAME, layout, parse_name, position_number  # noqa: E402
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME, RangeRecord  # noqa: E402
from paddle_acp.storage import open_storage  # noqa: E402
from paddle_acp.tools.metrics import read_metrics as _read_job_metrics  # noqa: E402


def read_metrics(storage, job, trainer):
    """The metrics records of one trainer, through the tools' one reader."""
    records, _bad = _read_job_metrics(storage, job)
    return [r for r in records if r["trainer"] == trainer]

RANGE = "_range_0"
CACHE_LOG = "from the local cache"
REMOTE_LOG = "not the local cache"


# -- the key (a name format: property-tested) -----------------------------------------------------
_seg = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_characters="/?#@%\\",
                                      blacklist_categories=("Cc", "Cs", "Zs")),
               min_size=1, max_size=12).filter(lambda s: s != ".")
_host = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z0-9]{1,5}){0,2}(:[1-9][0-9]{1,4})?", fullmatch=True)
_scheme = st.sampled_from(["hdfs", "viewfs", "s3", "HDFS"])


KEY_RE = re.compile(r"[a-z0-9]{1,16}-[A-Za-z0-9._-]{0,48}-[0-9a-f]{32}", re.ASCII)  # scheme-host..-hash


@settings(max_examples=200, deadline=None)
@given(_scheme, _host, st.lists(_seg, min_size=0, max_size=4), st.text(min_size=3, max_size=10,
       alphabet="abcdefghijklmnopqrstuvwxyzXYZ0123456789"))
def test_cache_key_format_and_secrets(scheme, host, segs, secret):
    path = "/".join(segs)
    uri = f"{scheme}://{host}/{path}"
    key = cache_key(uri, s3_endpoint=None)
    assert KEY_RE.fullmatch(key), key
    assert "/" not in key and ".." not in key.split("-")[1:2] and not key.startswith(".")
    assert key == cache_key(uri, s3_endpoint=None)  # deterministic
    # credentials (user info, credential query parameters) do not change the location, nor appear in it
    with_creds = f"{scheme}://u{secret}:p{secret}@{host}/{path}?access_key=A{secret}&secret_key=S{secret}"
    assert canonical_location(with_creds, s3_endpoint=None) == canonical_location(uri, s3_endpoint=None)  # the key derives from it
    assert cache_key(with_creds, s3_endpoint=None) == key
    # a trailing or doubled slash names the same place
    assert cache_key(f"{scheme}://{host}//{path}/", s3_endpoint=None) == key


@settings(max_examples=200, deadline=None)
@given(_host, st.lists(_seg, min_size=1, max_size=3), st.lists(_seg, min_size=1, max_size=3))
def test_cache_keys_of_different_locations_differ(host, a, b):
    ua, ub = f"hdfs://{host}/{'/'.join(a)}", f"hdfs://{host}/{'/'.join(b)}"
    assert (cache_key(ua, s3_endpoint=None) == cache_key(ub, s3_endpoint=None)) == (a == b)
    # the same bucket and prefix on another S3 endpoint is another location
    s3 = f"s3://bucket/{'/'.join(a)}"
    assert cache_key(s3, s3_endpoint="http://10.0.0.1:8333") != cache_key(
        s3, s3_endpoint="http://10.0.0.2:8333")
    assert cache_key(s3 + "?endpoint_override=h1:1", s3_endpoint=None) != cache_key(s3 + "?endpoint_override=h2:1", s3_endpoint=None)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**15 - 1), st.integers(0, 10**12 - 1), st.integers(0, 10**12 - 1),
       st.one_of(st.none(), st.integers(0, 10**12 - 1)))
def test_copy_names_parse_and_order_like_the_remote(n, e1, e2, s2):
    """The names of committed copies are the remote's (``ckpt-N``, ``ckpt-eE[-sS]``) and sort as the
    remote sorts them; a temporary name, a non-canonical or foreign name is never a committed copy."""
    from paddle_acp.format.checkpoints.cache import _TMP_RE, _position
    from paddle_acp.format.layout import position_key, position_name

    assert _position(f"ckpt-{n}") == (n, 0)
    assert _position(f"ckpt-0{n}") is None and _position(f"ckpt-{n}.tmp-0123456789ab") is None
    assert _TMP_RE.fullmatch("ckpt.tmp-0123456789ab") and _position("ckpt.tmp-0123456789ab") is None
    a, b = position_name(e1, None), position_name(e2, s2)
    assert (_position(a) < _position(b)) == (position_key(e1, None) < position_key(e2, s2))
    assert _position(a) == _position(b) or a != b


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.binary(max_size=300), st.just(b"[" * 100000),
                 st.builds(lambda loc: ('{"format": "paddle-acp/local-cache", "version": 1, "location": %s}'
                                        % json.dumps(loc)).encode(), st.text(max_size=40))))
def test_hostile_origin_file_is_refused_not_a_crash(raw):
    """origin.json is untrusted input: anything but this location's record disables the cache
    (one warning), never an exception, never another location's directory used."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        uri = "hdfs://nn:9000/ck"
        root = os.path.join(d, cache_key(uri))
        os.makedirs(root)
        with open(os.path.join(root, "origin.json"), "wb") as f:
            f.write(raw)
        c = LocalCache.open(d, uri, 3)
        assert c is None or raw == (
            '{"format": "paddle-acp/local-cache", "version": 1, "location": "hdfs://nn:9000/ck"}').encode()
        fresh = LocalCache.open(os.path.join(d, "new"), uri, 3)  # what open() writes, it reads back
        assert fresh is not None and LocalCache.open(os.path.join(d, "new"), uri, 3) is not None


# -- configuration ---------------------------------------------------------------------------------
def test_config_local_cache(tmp_path, monkeypatch):
    base = {"PADDLE_ACP_CHECKPOINT_URI": "hdfs://nn:9000/ck"}
    assert from_env(base).local_cache is None
    assert from_env(dict(base, PADDLE_ACP_LOCAL_CACHE="  ")).local_cache is None
    assert from_env(dict(base, PADDLE_ACP_LOCAL_CACHE=str(tmp_path / "c"))).local_cache == str(tmp_path / "c")
    monkeypatch.chdir(tmp_path)
    assert from_env(dict(base, PADDLE_ACP_LOCAL_CACHE="rel/c")).local_cache == str(tmp_path / "rel" / "c")
    f = tmp_path / "a-file"
    f.write_text("x")
    for bad, words in ((str(f), "is not a directory"), ("s3://b/c", "is a URI")):
        with pytest.raises(ConfigError, match="PADDLE_ACP_LOCAL_CACHE") as ei:
            from_env(dict(base, PADDLE_ACP_LOCAL_CACHE=bad))
        assert words in str(ei.value)


def test_unusable_cache_directory_is_one_warning_and_no_cache(tmp_path, caplog):
    f = tmp_path / "a-file"
    f.write_text("x")
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        assert LocalCache.open(str(f / "cache"), "hdfs://u:pw@nn:9000/ck", 3) is None
    lines = [r.getMessage() for r in caplog.records if "PADDLE_ACP_LOCAL_CACHE" in r.getMessage()]
    assert len(lines) == 1 and "cannot be used" in lines[0] and "pw" not in lines[0], lines


def test_key_directory_of_another_location_is_not_used(tmp_path, caplog):
    c = LocalCache.open(str(tmp_path), "hdfs://nn:9000/a", 3)
    assert c is not None
    origin = os.path.join(c.storage.root, "origin.json")
    with open(origin, "w") as f:
        f.write('{"location": "hdfs://other:1/x"}')
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        assert LocalCache.open(str(tmp_path), "hdfs://nn:9000/a", 3) is None
    assert "names another location" in caplog.text


# -- helpers ---------------------------------------------------------------------------------------
def snapshot(epoch: int, seed: int = 0, image: bool = True, mb: float = 0.05) -> Snapshot:
    rng = np.random.default_rng(seed * 1000 + epoch)
    n = max(1, int(mb * (1 << 20) / 4))
    tensors = [TensorData("w", "float32", rng.standard_normal(n).astype("float32")),
               TensorData("b", "float32", rng.standard_normal(33).astype("float32")),
               TensorData("step", "int64", np.array([epoch, seed], dtype="int64"))]
    prog = ProgramSnapshot("prog", "cache test", tensors, {"last_epoch": epoch})
    size = layout([prog])
    buf = None
    if image:  # the async saver's page-aligned image (its copy is written with O_DIRECT)
        buf = Arena().ensure(size)
        copy_into([prog], buf)
    return Snapshot(RangeRecord(RANGE, epoch, 100), [prog], None, "3.3.1", "pir", image=buf, data_size=size)


def values(loaded):
    return {name: arr.copy() for (_key, name), arr in loaded.arrays.items()}


def expected(snap):
    return {t.name: t.array for t in snap.programs[0].tensors}


def assert_values(loaded, snap):
    got, want = values(loaded), expected(snap)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


def remote_uri(request, kind: str) -> str:
    tag = uuid.uuid4().hex[:8]
    if kind == "hdfs":
        return f"{request.getfixturevalue('hdfs_server').uri}/cache/{tag}"
    srv = request.getfixturevalue("s3_server")
    return f"s3://{srv.bucket}/cache/{tag}"


@pytest.fixture
def s3_env(request, monkeypatch):
    """Client variables of the S3 server for this process (the HDFS fixture sets its own)."""
    def apply(kind):
        if kind == "s3":
            for k, v in request.getfixturevalue("s3_server").client_env().items():
                monkeypatch.setenv(k, v)
    return apply


def writer(uri: str, cache_dir, keep: int = 3, fence=None) -> GlobalCheckpointer:
    """A one-process job's checkpointer (rank 0 of 1) with its node-local copies (rank 0's), as the runtime opens it."""
    cache = LocalCache.open(str(cache_dir), uri, keep).for_range(JOB_ID, RANGE, 0) if cache_dir is not None else None
    return one_process(open_storage(uri), JOB_ID, RANGE, keep, fence=fence, cache=cache)


def restart(uri: str, cache_dir):
    """What a restart of the one-process job on the node of ``cache_dir`` loads: the runtime's two readers
    (an earlier release's ckpt-N, today's checkpoints of one part), each with its node-local copies."""
    g = writer(uri, cache_dir)
    cache = LocalCache.open(str(cache_dir), uri, 3).for_range(JOB_ID, RANGE) if cache_dir is not None else None
    return load_newest(PartReader(g.storage, JOB_ID, RANGE, cache=cache), g, None)


def cache_files(cache_dir, uri: str, name: str) -> str:
    """The local copy of ``name`` of a one-process job: rank 0's."""
    return os.path.join(str(cache_dir), cache_key(uri), JOB_ID, "range", RANGE, "rank-0", name)


def log_lines(caplog, words: str):
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


# -- one writer ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_copy_committed_after_remote_and_used_on_restart(kind, request, s3_env, tmp_path, caplog):
    s3_env(kind)
    uri = remote_uri(request, kind)
    cache = tmp_path / "cache"
    w = writer(uri, cache)
    snaps = [snapshot(e, image=e != 1) for e in range(4)]  # epoch 1: a synchronous save's tensor views
    for s in snaps:
        save(w, s)
    # retention: the copies kept are the newest 2 (the remote keeps 3); no leftovers
    rdir = os.path.dirname(cache_files(cache, uri, "x"))
    assert sorted(os.listdir(rdir)) == ["ckpt-e2", "ckpt-e3"]
    assert sorted(os.listdir(os.path.join(rdir, "ckpt-e3"))) == sorted([DATA_NAME, MANIFEST_NAME])
    # the copy's manifest is the remote's (rank 0's part), byte for byte
    st = open_storage(uri)
    with open(os.path.join(rdir, "ckpt-e3", MANIFEST_NAME), "rb") as f:
        assert f.read() == st.read_bytes(f"{JOB_ID}/range/{RANGE}/ckpt-e3/rank-0/{MANIFEST_NAME}")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restart(uri, cache)
    assert loaded.name == "ckpt-e3" and loaded.source == "cache"
    assert_values(loaded, snaps[3])
    assert len(log_lines(caplog, CACHE_LOG)) == 1 and not log_lines(caplog, REMOTE_LOG)
    # without the cache the same checkpoint comes from the remote, equal
    plain = restart(uri, None)
    assert plain.name == "ckpt-e3" and plain.source == "remote"
    assert_values(plain, snaps[3])


@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_stale_copy_remote_advanced_by_another_writer(kind, request, s3_env, tmp_path, caplog):
    s3_env(kind)
    uri = remote_uri(request, kind)
    cache = tmp_path / "cache"
    w = writer(uri, cache)
    save(w, snapshot(0))
    save(w, snapshot(1))
    other = writer(uri, tmp_path / "other-node")  # another node takes over and writes checkpoint ckpt-e2
    newer = snapshot(2, seed=7)
    assert save(other, newer).name == "ckpt-e2"
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restart(uri, cache)
    assert loaded.name == "ckpt-e2" and loaded.source == "remote"
    assert_values(loaded, newer)
    lines = log_lines(caplog, REMOTE_LOG)
    assert len(lines) == 1 and "no local copy" in lines[0] and "ckpt-e1" in lines[0], lines
    assert not log_lines(caplog, CACHE_LOG)


@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_corrupt_copy_falls_back_to_remote(kind, request, s3_env, tmp_path, caplog):
    s3_env(kind)
    uri = remote_uri(request, kind)
    cache = tmp_path / "cache"
    w = writer(uri, cache)
    save(w, snapshot(0))
    snap = snapshot(1)
    save(w, snap)
    data = cache_files(cache, uri, "ckpt-e1") + "/" + DATA_NAME
    with open(data, "r+b") as f:  # one flipped bit in the middle of the tensors
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0x10]))
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restart(uri, cache)
    assert loaded.name == "ckpt-e1" and loaded.source == "remote"
    assert_values(loaded, snap)
    lines = log_lines(caplog, REMOTE_LOG)
    assert len(lines) == 1 and "failed verification" in lines[0] and "checksum mismatch" in lines[0], lines
    assert not os.path.exists(data), "the corrupt copy was not removed"
    # a copy whose manifest differs from the remote's (same name, another run) is not used either
    save(w, snapshot(2))
    man = cache_files(cache, uri, "ckpt-e2") + "/" + MANIFEST_NAME
    with open(man, "rb") as f:
        raw = f.read()
    with open(man, "wb") as f:
        f.write(raw.replace(b'"pir"', b'"PIR"'))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restart(uri, cache)
    assert loaded.name == "ckpt-e2" and loaded.source == "remote"
    assert "manifest differs" in " ".join(log_lines(caplog, REMOTE_LOG))


@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_copy_of_a_checkpoint_the_remote_no_longer_has_is_not_used(kind, request, s3_env, tmp_path, caplog):
    s3_env(kind)
    uri = remote_uri(request, kind)
    cache = tmp_path / "cache"
    w = writer(uri, cache)
    s0 = snapshot(0)
    save(w, s0)
    save(w, snapshot(1))
    st = open_storage(uri)
    base = f"{JOB_ID}/range/{RANGE}/ckpt-e1"
    st.delete_file(f"{base}/{GLOBAL_NAME}")  # withdrawn on the remote (as `paddle-acp gc` / retention do)
    st.delete_dir(base)
    assert os.path.exists(cache_files(cache, uri, "ckpt-e1"))
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restart(uri, cache)
    assert loaded.name == "ckpt-e0", "a copy of a checkpoint the remote does not hold was used"
    assert_values(loaded, s0)
    assert loaded.source == "cache"  # checkpoint ckpt-e0 is still the remote's, and its copy is identical
    # nothing left on the remote: the copies alone never resume anything
    st.delete_dir(f"{JOB_ID}/range/{RANGE}")
    assert restart(uri, cache) is None


def test_copy_not_committed_when_the_remote_commit_fails(hdfs_server, tmp_path):
    """A newer writer fences this one: its next checkpoint is written but not committed on
    the remote, and its local copy is not committed either (no leftover stays in the cache)."""
    uri = f"{hdfs_server.uri}/cache/{uuid.uuid4().hex[:8]}"
    cache = tmp_path / "cache"
    st = open_storage(uri)
    w = writer(uri, cache, fence=Fence.take(st, JOB_ID))
    save(w, snapshot(0))
    Fence.take(st, JOB_ID)  # another writer of the job started
    with pytest.raises(FencedError):
        w.save(snapshot(1), "replicated")
    rdir = os.path.dirname(cache_files(cache, uri, "x"))
    assert os.listdir(rdir) == ["ckpt-e0"], os.listdir(rdir)
    assert committed_on(st, JOB_ID, RANGE) == ["ckpt-e0"]


# -- several ranks ---------------------------------------------------------------------------------
def rank_snapshot(rank: int, epoch: int, seed: int = 0) -> Snapshot:
    return dataclasses.replace(snapshot(epoch, seed=seed * 100 + rank, mb=0.02), extra={"loader_state": {"rank": rank}})


def gck(uri: str, rank: int, cache_dir, world: int = 2) -> GlobalCheckpointer:
    cache = LocalCache.open(str(cache_dir), uri, 3).for_range(JOB_ID, RANGE, rank) if cache_dir is not None else None
    g = GlobalCheckpointer(open_storage(uri), JOB_ID, RANGE, rank, world, 3, 60.0, cache=cache)
    g.poll_interval = 0.01
    return g


def save_both(uri, caches, epoch, seed=0, missing=()):
    res = {}
    snaps = {r: rank_snapshot(r, epoch, seed) for r in (0, 1)}
    t = threading.Thread(target=lambda: res.setdefault(0, gck(uri, 0, caches[0]).save(snaps[0], "per-rank")))
    if 0 not in missing:
        t.start()
    if 1 not in missing:
        gck(uri, 1, caches[1]).save(snaps[1], "per-rank")
    if 0 not in missing:
        t.join()
    return snaps


def restore(uri, rank, cache_dir):
    g = gck(uri, rank, cache_dir)
    return load_newest(PartReader(g.storage, JOB_ID, RANGE), g, "per-rank")


def test_several_ranks_each_caches_its_part(s3_server, monkeypatch, tmp_path, caplog):
    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    uri = f"s3://{s3_server.bucket}/cache/{uuid.uuid4().hex[:8]}"
    caches = {0: tmp_path / "node0", 1: tmp_path / "node1"}
    save_both(uri, caches, 0)
    snaps = save_both(uri, caches, 1)
    for r in (0, 1):
        part = os.path.join(str(caches[r]), cache_key(uri), JOB_ID, "range", RANGE, f"rank-{r}", "ckpt-e1")
        assert sorted(os.listdir(part)) == sorted([DATA_NAME, MANIFEST_NAME])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="paddle_acp"):
            loaded = restore(uri, r, caches[r])
        assert loaded.name == "ckpt-e1" and loaded.source == "cache", r
        assert_values(loaded, snaps[r])
        assert len(log_lines(caplog, CACHE_LOG)) == 1
    # rank 1 restarts on node 0: no copy of its part there, read from the remote
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restore(uri, 1, caches[0])
    assert loaded.source == "remote" and "no local copy" in " ".join(log_lines(caplog, REMOTE_LOG))
    assert_values(loaded, snaps[1])


def test_several_ranks_copy_not_named_by_the_global_commit(s3_server, monkeypatch, tmp_path, caplog):
    """A part cached by rank 1 whose checkpoint was never committed globally (rank 0 did not
    come) is not used; nor is a copy whose part another incarnation of rank 1 rewrote before
    the global commit (the global manifest records the other bytes)."""
    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    uri = f"s3://{s3_server.bucket}/cache/{uuid.uuid4().hex[:8]}"
    caches = {0: tmp_path / "node0", 1: tmp_path / "node1"}
    snaps0 = save_both(uri, caches, 0)
    save_both(uri, caches, 1, missing=(0,))  # abandoned: rank 1's part (and its copy) only
    st = open_storage(uri)
    assert not st.exists(f"{JOB_ID}/range/{RANGE}/ckpt-e1/{GLOBAL_NAME}")
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restore(uri, 1, caches[1])
    assert loaded.name == "ckpt-e0" and loaded.source == "cache"
    assert_values(loaded, snaps0[1])
    # epoch 2: rank 1 on node 1 writes and caches its part; then its part is rewritten by another
    # incarnation on node 2 (other values) and rank 0 commits globally what is on the remote now
    g1 = gck(uri, 1, caches[1])
    g1.save(rank_snapshot(1, 2), "per-rank")
    moved = rank_snapshot(1, 2, seed=5)
    snaps_now = {0: rank_snapshot(0, 2)}
    t = threading.Thread(target=lambda: gck(uri, 0, caches[0]).save(snaps_now[0], "per-rank"))
    gck(uri, 1, tmp_path / "node2").save(moved, "per-rank")
    t.start()
    t.join()
    assert st.exists(f"{JOB_ID}/range/{RANGE}/ckpt-e2/{GLOBAL_NAME}")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        loaded = restore(uri, 1, caches[1])
    assert loaded.name == "ckpt-e2" and loaded.source == "remote"
    assert_values(loaded, moved)
    assert "manifest differs" in " ".join(log_lines(caplog, REMOTE_LOG))


# -- end to end: a training process SIGKILLed and restarted on the same node ------------------------
EPOCHS, KILL_AT = 4, 2
ARGS = ("--epochs", EPOCHS, "--steps-per-epoch", 3, "--hidden", 64)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    proc = run_script(out, None, "pir", *ARGS)
    assert proc.returncode == 0 and is_done(out), describe(proc)
    return load_result(out)


@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_kill_and_restart_restores_from_the_cache(kind, request, reference, tmp_path, monkeypatch):
    uri = remote_uri(request, kind)
    srv = request.getfixturevalue("hdfs_server" if kind == "hdfs" else "s3_server")
    cache = tmp_path / "cache"
    # synchronous saves: the checkpoint of epoch KILL_AT-1 (remote and copy) is committed
    # before epoch KILL_AT starts, so the restart has a copy of the remote's newest
    env = dict(srv.client_env(), PADDLE_ACP_LOCAL_CACHE=str(cache), PADDLE_ACP_ASYNC="0")
    out = tmp_path / "out"
    p1 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", KILL_AT, env=env)
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    p2 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", KILL_AT, env=env)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    assert f"resumed at epoch {KILL_AT}" in p2.stdout, describe(p2)
    used = [ln for ln in p2.stderr.splitlines() if CACHE_LOG in ln]
    # one process is a job of one rank: the copy it restores from is rank 0's part of ckpt-e{KILL_AT-1}
    assert len(used) == 1 and f"checkpoint ckpt-e{KILL_AT - 1} (part of rank 0) of " in used[0], describe(p2)
    assert REMOTE_LOG not in p2.stderr, describe(p2)
    assert not compare_results(load_result(out), reference), compare_results(load_result(out), reference)
    for k, v in srv.client_env().items():
        monkeypatch.setenv(k, v)
    starts = [r for r in read_metrics(open_storage(uri), JOB_ID, 0) if r.get("event") == "start"]
    assert [r.get("restore_source") for r in starts] == [None, "cache"], starts


def test_sigkill_while_the_copy_is_uncommitted(hdfs_server, tmp_path, monkeypatch):
    """A training process with asynchronous saves is SIGKILLed while a local copy is being
    written (its ``*.tmp-*`` directory exists, the remote upload still running): the restart
    resumes bit-identically from the remote's newest committed checkpoint, from its copy exactly
    when a committed copy of that very checkpoint exists, and the leftover is removed."""
    import re
    import subprocess
    import time

    from support.e2e import read_log, script_cmd, script_env

    args = ("--epochs", 6, "--steps-per-epoch", 1, "--hidden", 400000, "--dropout", 0)
    ref_out = tmp_path / "ref"
    ref = run_script(ref_out, None, "pir", *args)
    assert ref.returncode == 0, describe(ref)
    uri = f"{hdfs_server.uri}/cache/{uuid.uuid4().hex[:8]}"
    cache = tmp_path / "cache"
    env = dict(hdfs_server.client_env(), PADDLE_ACP_LOCAL_CACHE=str(cache), PADDLE_ACP_BUSY_POLICY="wait")
    out = tmp_path / "out"
    # one process is a job of one rank: its copies are rank 0's, in the range's rank-0 directory
    rdir = os.path.join(str(cache), cache_key(uri), JOB_ID, "range", RANGE, "rank-0")
    tmp_re = re.compile(r"ckpt\.tmp-[0-9a-f]{12}")

    def leftovers():
        try:
            return [n for n in os.listdir(rdir) if tmp_re.fullmatch(n)]
        except FileNotFoundError:
            return []

    def committed():
        """The committed copies: named as a checkpoint, with a manifest (a ``*.tmp-*`` directory holds one
        while its copy is being committed: written there before the rename that commits it)."""
        try:
            return [n for n in os.listdir(rdir)
                    if parse_name(n) is not None and os.path.exists(os.path.join(rdir, n, MANIFEST_NAME))]
        except FileNotFoundError:
            return []

    def stopped(pid: int) -> bool:
        """Every thread of ``pid`` is stopped (SIGSTOP took effect)."""
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # the thread ended
                continue
        return all(st_ in ("T", "t") for st_ in states)

    proc = subprocess.Popen(script_cmd(out, uri, *args), env=script_env(uri, "pir", env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        frozen = False
        while not frozen and proc.poll() is None and time.monotonic() < deadline:
            if committed() and leftovers():
                # freeze it, then look again: the copy may have been committed in between
                os.kill(proc.pid, signal.SIGSTOP)
                while not stopped(proc.pid):
                    time.sleep(0.001)
                frozen = bool(leftovers())
                if not frozen:
                    os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.002)
        assert frozen, "never caught a copy being written after the first one was committed"
        proc.send_signal(signal.SIGKILL)  # (a stopped process dies of SIGKILL too)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert leftovers(), "the kill left no uncommitted copy (it is what this test is about)"
    for k, v in hdfs_server.client_env().items():
        monkeypatch.setenv(k, v)
    newest = committed_on(open_storage(uri), JOB_ID, RANGE)[-1]  # ckpt-e{E}: the checkpoint of epoch E
    epoch = parse_name(newest)
    assert epoch is not None and epoch[1] is None, newest
    copies = committed()
    p2 = run_script(out, uri, "pir", *args, env=env)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    assert f"resumed at epoch {epoch[0] + 1}" in p2.stdout, describe(p2)
    source = "cache" if newest in copies else "remote"
    starts = [r for r in read_metrics(open_storage(uri), JOB_ID, 0) if r.get("event") == "start"]
    assert starts[-1].get("restore_source") == source, (starts, copies)
    assert starts[-1].get("restored") == position_number(*epoch), (starts, copies)  # a part's manifest number
    assert not compare_results(load_result(out), load_result(ref_out)), compare_results(load_result(out), load_result(ref_out))
    assert len(read_log(out)) >= 6
    assert not leftovers(), os.listdir(rdir)
    assert len([n for n in os.listdir(rdir) if n.startswith("ckpt-")]) <= 2, os.listdir(rdir)


def test_several_ranks_restart_each_from_its_cached_part(s3_server, tmp_path, monkeypatch):
    """A job of two ranks holding different state (real processes, per-rank parts on S3, one cache
    directory on their node) stops after epoch 1 and is started again: each rank restores its own part
    from its local copy (one log line each, the metrics' start record says so) and ends bit-identical
    to its own uninterrupted run."""
    from test_multirank_e2e import events, start_job

    args = ["--kind", "tp", "--epochs", 4]
    ref = start_job(tmp_path, 2, *args, outs="ref", barrier=False, no_acp=True)
    assert all(rc == 0 for rc, _ in ref), ref
    refs = [load_result(tmp_path / "ref" / f"r{r}") for r in (0, 1)]
    uri = f"s3://{s3_server.bucket}/cache/{uuid.uuid4().hex[:8]}"
    env = dict(s3_server.client_env(), PADDLE_ACP_RANK_STATE="per-rank", PADDLE_ACP_LOCAL_CACHE=str(tmp_path / "cache"))
    res = start_job(tmp_path, 2, "--kind", "tp", "--epochs", 2, ckpt=uri, env=env)
    assert all(rc == 0 for rc, _ in res), res
    for r in (0, 1):
        os.remove(tmp_path / "out" / f"r{r}" / "done")
    res = start_job(tmp_path, 2, *args, ckpt=uri, env=env, gen="g1")
    assert all(rc == 0 for rc, _ in res), res
    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    for r, (_rc, out) in enumerate(res):
        used = [ln for ln in out.splitlines() if CACHE_LOG in ln]
        assert len(used) == 1 and f"checkpoint ckpt-e1 (part of rank {r})" in used[0], out[-3000:]
        assert REMOTE_LOG not in out, out[-3000:]
        assert events(tmp_path / "out" / f"r{r}")[-1]["restored"] == "ckpt-e1"
        starts = [m for m in read_metrics(open_storage(uri), JOB_ID, r) if m.get("event") == "start"]
        assert [m.get("restore_source") for m in starts] == [None, "cache"], starts
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), refs[r]), r


def test_local_checkpoint_uri_needs_no_cache(tmp_path, caplog):
    """With a local checkpoint URI the variable is ignored (one line), and nothing is created in DIR."""
    from paddle_acp.runtime.state import ProcessState

    cache = tmp_path / "cache"
    cfg = from_env({"PADDLE_ACP_CHECKPOINT_URI": str(tmp_path / "ck"), "PADDLE_ACP_LOCAL_CACHE": str(cache)})
    state = ProcessState()
    with caplog.at_level(logging.INFO, logger="paddle_acp"):
        assert state.local_cache(cfg, open_storage(cfg.uri)) is None
        assert state.local_cache(cfg, open_storage(cfg.uri)) is None  # said once per process
    assert len(log_lines(caplog, "PADDLE_ACP_LOCAL_CACHE is not used")) == 1
    assert not cache.exists()
