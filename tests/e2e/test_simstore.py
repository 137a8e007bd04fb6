"""The benchmarks' simulated remote store (ci/bench/simstore.py, ``sim://``): the storage contract in both
commit styles, its timing (latency, per-client and aggregate bandwidth, across real processes)
spent without CPU, and its options and link record (hypothesis).

The contract tests are tests/unit/storage/test_storage_contract.py's own functions, run here on ``sim://``
storages; the object-store variant runs them as the contract's ``s3`` kind (manifest-last commits,
no appends), which is the contract the simulation claims for it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "ci", "bench"))  # the benchmarks' store lives with the benchmarks
sys.path.insert(0, os.path.join(HERE, "unit", "storage"))  # the storage contract (tests/unit/storage/test_storage_contract.py)
import simstore  # noqa: E402
import test_storage_contract as contract  # noqa: E402
from test_storage_contract import (  # noqa: E402,F401  (the contract, collected here on sim://)
    _opened,
    large_blob,
    test_append_create_exclusive_and_sub,
    test_checkpointer_round_trip_retention_and_leftovers,
    test_delete_file_and_dir,
    test_global_commit_and_writer_fencing_on_every_backend,
    test_large_object,
    test_list_makedirs_and_missing,
    test_per_rank_fencing_on_every_backend,
    test_rename,
    test_unicode_and_spaces_in_names,
    test_write_image,
    test_write_read_exists_size_overwrite,
)

from paddle_acp.errors import ConfigError  # noqa: E402
from paddle_acp.storage import MANIFEST_LAST, RENAME, open_storage  # noqa: E402

simstore.register()
MB = 1 << 20


@pytest.fixture(params=["sim-rename", "sim-manifest-last"])
def backend(request, tmp_path_factory, monkeypatch):
    """A ``sim://`` store without delays (the contract, not the timing); options from the
    environment so that the contract's ``fresh()`` (URI + "/sub") opens the same kind."""
    commit = RENAME if request.param == "sim-rename" else MANIFEST_LAST
    for var in simstore.ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ACP_SIM_COMMIT", commit)
    uri = simstore.uri(str(tmp_path_factory.mktemp("sim") / "root"))
    kind = "local" if commit == RENAME else "s3"  # the contract's names for "rename" and "object store"
    return contract.Backend(kind, open_storage(uri), uuid.uuid4().hex[:8], uri, {})


@pytest.mark.parametrize("commit", [RENAME, MANIFEST_LAST])
def test_sim_capabilities_are_a_remote_stores(tmp_path, commit):
    st = open_storage(simstore.uri(str(tmp_path / "s"), simstore.SimOptions(commit=commit)))
    assert type(st) is simstore.SimStorage and st.commit_style == commit
    assert st.local_path("a") is None and not st.has_symlinks and not st.direct_io and st.overlap_writes
    assert "?" not in st.uri and st.uri.startswith("sim://")


def test_bad_uris_and_options_are_clear_errors(tmp_path):
    for bad, why in [("sim://host/x", "absolute"), (f"sim://{tmp_path}?latency_ms=-1", "latency_ms"),
                     (f"sim://{tmp_path}?client_mbps=fast", "not a number"),
                     (f"sim://{tmp_path}?commit=copy", "commit"), (f"sim://{tmp_path}?bw=1", "unknown option"),
                     (f"sim://{tmp_path}?aggregate_mbps=inf", "finite")]:
        with pytest.raises(ConfigError, match=why):
            open_storage(bad)


def _cpu_and_wall(fn):
    c0, w0 = time.process_time(), time.monotonic()
    fn()
    return time.process_time() - c0, time.monotonic() - w0


def test_latency_and_bandwidth_wait_without_cpu(tmp_path):
    """24 MB at 100 MB/s take >= 0.24 s, each call >= its latency; the waiting burns no CPU."""
    opts = simstore.SimOptions(latency_ms=20.0, client_mbps=100.0)
    st = open_storage(simstore.uri(str(tmp_path / "s"), opts))
    data = np.random.default_rng(1).integers(0, 256, 24 * MB, dtype=np.uint8)
    _c, wall = _cpu_and_wall(lambda: st.listdir(""))
    assert wall >= 0.019
    cpu, wall = _cpu_and_wall(lambda: st.write_buffers("blob", [data]))
    assert wall >= 0.24 + 0.02, wall  # bytes, plus the open's and the close's round trips
    assert cpu < 0.5 * wall, (cpu, wall)
    image = simstore_aligned(24 * MB)
    image[:] = data
    cpu, wall = _cpu_and_wall(lambda: st.write_image("img", image, 24 * MB - 5))
    assert wall >= 0.24 and cpu < 0.5 * wall, (cpu, wall)
    assert st.read_bytes("img") == data[:24 * MB - 5].tobytes()
    back = np.empty(24 * MB, dtype=np.uint8)
    with st.open_input("blob") as f:
        cpu, wall = _cpu_and_wall(lambda: f.readinto(memoryview(back)))
    assert wall >= 0.24 and cpu < 0.5 * wall and np.array_equal(back, data)


def test_reads_are_charged_the_bytes_they_get_not_the_bytes_asked_for(tmp_path, monkeypatch):
    """A small file read through read_bytes (which asks for 1 MB pieces), readinto a larger buffer or
    read_at past the end reserves the link for the file's bytes only, as a remote store sends them:
    charging the ask cost a 3 KB manifest ~30 ms at 100 MB/s."""
    st = open_storage(simstore.uri(str(tmp_path / "s"), simstore.SimOptions(client_mbps=100.0)))
    st.write_bytes("small", bytes(range(256)) * 12)
    reserved = []
    real = simstore.Links.reserve

    def reserve(self, direction, nbytes):
        if direction == simstore.READ:
            reserved.append(nbytes)
        return real(self, direction, nbytes)
    monkeypatch.setattr(simstore.Links, "reserve", reserve)
    assert st.read_bytes("small", limit=64 << 20) == bytes(range(256)) * 12
    assert sum(reserved) == 3072, reserved
    reserved.clear()
    buf = bytearray(2 * MB)
    with st.open_input("small") as f:
        assert f.readinto(memoryview(buf)) == 3072
        assert f.read_at(4096, 3000) == (bytes(range(256)) * 12)[3000:]
        assert f.read_at(10, 5000) == b""
    assert sum(reserved) == 3072 + 72, reserved


_TRACED_RUN = """
import sys
sys.path.insert(0, {ci!r})
import simstore
simstore.register()
from paddle_acp.storage import open_storage
st = open_storage(sys.argv[1])
st.makedirs("d")
st.write_bytes("d/f", b"x" * 10)
st.rename("d/f", "d/g")
assert st.read_bytes("d/g") == b"x" * 10
"""


def test_trace_records_every_call_of_a_process_in_order(tmp_path):
    """ACP_SIM_TRACE: a real process's calls, one line each, in the order made, with their thread."""
    script = _TRACED_RUN.format(ci=os.path.join(ROOT, "ci", "bench"))
    env = dict(os.environ, ACP_SIM_TRACE=str(tmp_path / "trace"), PADDLE_TRAINER_ID="3")
    subprocess.run([sys.executable, "-c", script, simstore.uri(str(tmp_path / "s"))], env=env, check=True, timeout=120)
    (name,) = os.listdir(tmp_path / "trace")
    assert name.startswith("trace-3-")
    import json

    rows = [json.loads(line) for line in open(tmp_path / "trace" / name)]
    assert [r["op"] for r in rows] == ["makedirs", "open_output", "SimOutput.close", "rename", "open_input"]
    assert rows[0]["path"] == "d" and rows[3]["path"] == "d/f" and rows[4]["path"] == "d/g"
    assert all(r["thread"] == "MainThread" and r["t0"] <= r["t1"] for r in rows)
    assert [r["t0"] for r in rows] == sorted(r["t0"] for r in rows)


def simstore_aligned(n):
    """A page-aligned buffer (as the saver's arena): the write goes O_DIRECT underneath."""
    import mmap

    return np.frombuffer(mmap.mmap(-1, n), dtype=np.uint8)


def test_per_client_cap_is_shared_by_a_processs_threads(tmp_path):
    """Two threads of one client, 8 MB each, 80 MB/s per client: together >= 0.2 s (not 0.1 s)."""
    st = open_storage(simstore.uri(str(tmp_path / "s"), simstore.SimOptions(client_mbps=80.0)))
    blob = bytes(8 * MB)

    def both():
        ts = [threading.Thread(target=st.write_bytes, args=(f"f{i}", blob)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    _cpu, wall = _cpu_and_wall(both)
    assert wall >= 0.2 * 0.98, wall


_WRITER = """
import sys, time
sys.path.insert(0, {ci!r})
import simstore
simstore.register()
from paddle_acp.storage import open_storage
st = open_storage(sys.argv[1])
go = float(sys.argv[2])
time.sleep(max(0.0, go - time.time()))
t0 = time.monotonic()
st.write_bytes(sys.argv[3], bytes(8 << 20))
print(time.monotonic() - t0)
"""


def _writers(tmp_path, opts, n):
    uri = simstore.uri(str(tmp_path / "s"), opts)
    script = _WRITER.format(ci=os.path.join(ROOT, "ci", "bench"))
    go = time.time() + 6.0  # every process imported and ready before it
    ps = [subprocess.Popen([sys.executable, "-c", script, uri, repr(go), f"w{i}"], stdout=subprocess.PIPE, text=True)
          for i in range(n)]
    outs = [p.communicate(timeout=120)[0] for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    return [float(o.strip().splitlines()[-1]) for o in outs]


@pytest.mark.long  # on demand: bash ci/test.sh --long
def test_clients_in_processes_share_the_aggregate_cap_only(tmp_path):
    """Real processes: three clients of 8 MB at 80 MB/s each and no aggregate cap run side by side
    (~0.1 s each); with a 40 MB/s aggregate cap they share it (the last ends after >= 0.6 s)."""
    free = _writers(tmp_path / "a", simstore.SimOptions(client_mbps=80.0), 3)
    assert all(0.1 * 0.98 <= t < 0.6 for t in free), free
    capped = _writers(tmp_path / "b", simstore.SimOptions(client_mbps=80.0, aggregate_mbps=40.0), 3)
    assert max(capped) >= 0.6 * 0.98 and min(capped) >= 0.2 * 0.98, capped


def test_training_script_runs_through_the_wrapper_and_resumes(tmp_path):
    """``python ci/bench/simstore.py run SCRIPT``: a real training process checkpoints to ``sim://`` (rename and
    manifest-last) and a second start resumes from it."""
    script = os.path.join(HERE, "scripts", "rank_train.py")
    for commit in (RENAME, MANIFEST_LAST):
        uri = simstore.uri(str(tmp_path / commit / "store"), simstore.SimOptions(latency_ms=1.0, commit=commit))
        env = dict(os.environ, PADDLE_ACP_CHECKPOINT_URI=uri, PADDLE_TRAINERS_NUM="1",
                   PADDLE_TRAINER_ID="0", PADDLE_ACP_ASYNC="1")
        for start, epochs in enumerate((2, 4)):
            out = tmp_path / commit / f"out{start}"
            p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench", "simstore.py"), "run", script, "--out", str(out),
                                "--epochs", str(epochs), "--steps-per-epoch", "2"], env=env, capture_output=True,
                               text=True, timeout=300)
            assert p.returncode == 0, p.stderr[-3000:]
        import json

        events = [json.loads(line) for line in (tmp_path / commit / "out1" / "events.jsonl").read_text().splitlines()]
        assert events[0]["epoch"] == 2 and events[0]["restored"] is not None, events


finite = hs.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(lat=finite, cli=finite, agg=finite, commit=hs.sampled_from([RENAME, MANIFEST_LAST]))
def test_options_round_trip_through_the_uri_query(lat, cli, agg, commit):
    opts = simstore.SimOptions(latency_ms=lat, client_mbps=cli, aggregate_mbps=agg, commit=commit)
    assert simstore.parse_options(opts.query(), env={}) == opts
    # the query overrides the environment, option by option
    env = {"ACP_SIM_LATENCY_MS": "7", "ACP_SIM_COMMIT": MANIFEST_LAST}
    assert simstore.parse_options(f"client_mbps={cli!r}", env=env) == simstore.SimOptions(7.0, cli, 0.0, MANIFEST_LAST)


@settings(max_examples=200, deadline=None)
@given(raw=hs.binary(max_size=40))
def test_any_link_record_reads_as_times_never_an_error(raw):
    a, b = simstore.unpack_link(raw)
    assert 0.0 <= a < float("inf") and 0.0 <= b < float("inf")


@settings(max_examples=200, deadline=None)
@given(a=hs.floats(min_value=0.0, max_value=1e12), b=hs.floats(min_value=0.0, max_value=1e12))
def test_link_record_round_trip(a, b):
    assert simstore.unpack_link(simstore.pack_link(a, b)) == (a, b)


@settings(max_examples=50, deadline=None)
@given(sizes=hs.lists(hs.integers(min_value=1, max_value=64 << 20), min_size=1, max_size=8),
       cli=hs.floats(min_value=1.0, max_value=1e4), agg=hs.floats(min_value=1.0, max_value=1e4))
def test_reserved_slots_never_beat_either_cap(tmp_path_factory, sizes, cli, agg):
    """Back-to-back reservations end no earlier than the bytes at the slower of the two caps."""
    link = str(tmp_path_factory.mktemp("link") / "l.simlink")
    links = simstore.Links(simstore.SimOptions(client_mbps=cli, aggregate_mbps=agg), link)
    simstore._client_next[simstore.WRITE] = 0.0
    t0 = time.monotonic()
    try:
        end = max(links.reserve(simstore.WRITE, n) for n in sizes)
    finally:
        simstore._client_next[simstore.WRITE] = 0.0  # this process's link: free again for other tests
    assert end - t0 >= sum(sizes) / (min(cli, agg) * 1e6) * (1 - 1e-9)
