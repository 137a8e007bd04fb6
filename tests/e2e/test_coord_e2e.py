"""The ranks coordinated through Paddle's own TCP store (paddle_acp.runtime.coord), with real processes.

Two data-parallel ranks of tests/scripts/rank_train.py with ``MASTER_ADDR``/``MASTER_PORT``
set (rank 0's process hosts the store; ``PADDLE_MASTER`` of ``paddle.distributed.launch`` too, asked for): the save plan goes through the
store, not to a file; a rank 0 SIGKILLed in the middle of a save takes the store with it, and the other
rank stops at its next due point with a clear error instead of training on uncheckpointed; nothing committed
is lost, and a restart resumes bit-identically. The link's bounds are tested against a real store host
process that is stopped (SIGSTOP), killed, or never started.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.coord import coord_env, free_port
from support.e2e import JOB_ID, compare_results, is_done, load_result, stopped
from test_agree_e2e import check_no_orphans, metrics, popen_job, reference, run_job

from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.layout import GLOBAL_NAME, range_dir
from paddle_acp.format.save_plan import PLAN_NAME
from paddle_acp.storage import open_storage

RANGE = "_range_0"


def committed(uri):
    g = GlobalCheckpointer(open_storage(str(uri)), JOB_ID, RANGE, 0, 2)
    return g, [e.name for e in g.scan() if e.committed]


@pytest.mark.parametrize("coordination", ["storage", "store", "launch"])
def test_interval_saves_agree_on_either_path_and_the_store_path_writes_no_plan_file(tmp_path, coordination):
    """Rank 0's clock alone decides interval saves (rank 1's clock 1 s ahead), on every path (storage; a store
    of ours at MASTER_ADDR/MASTER_PORT, which auto picks; the job's own store under PADDLE_MASTER, asked for):
    both ranks save the same epochs, none is abandoned, the result is bit-identical. Through a store, the
    range holds no plan file (before: ``plan.json`` was written at every start and change of the plan)."""
    args = ["--kind", "dp", "--epochs", 16, "--steps-per-epoch", 1, "--sleep", 0.25, "--inter", 1]
    ref = reference(tmp_path, args)
    ckpt = tmp_path / "ckpt"
    res = run_job(tmp_path, 2, args, ckpt, "s0", skews={1: 1.0}, env=coord_env(coordination))
    assert all(rc == 0 for rc, _ in res), [o[-3000:] for _, o in res]
    recs = metrics(str(ckpt))
    saved = {r: sorted(x["epoch"] for x in recs if x["event"] == "saved" and x["trainer"] == r) for r in (0, 1)}
    assert saved[0] == saved[1] and len(saved[0]) >= 3, saved
    assert not [x for x in recs if x["event"] == "failed" or x.get("committed") is False], recs
    check_no_orphans(str(ckpt))
    plan = os.path.join(ckpt, range_dir(JOB_ID, RANGE), PLAN_NAME)
    assert os.path.exists(plan) == (coordination == "storage"), os.listdir(os.path.dirname(plan))
    for r in (0, 1):
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r


# ~2.6 MB of state per rank: a save takes long enough on this machine to be killed inside it
KILL_ARGS = ["--kind", "dp", "--epochs", 30, "--steps-per-epoch", 1, "--hidden", 20000, "--sleep", 0.15]


def test_rank_0_killed_mid_save_the_other_rank_stops_and_nothing_committed_is_lost(tmp_path):
    """Rank 0 (the store's host) is SIGKILLed while its part of a checkpoint is being written, two committed
    checkpoints in. The ranks run without a barrier (as ranks whose collectives do not block), so rank 1
    reaches further due points: it stops at one with the store's error within seconds (before: it trained
    all 30 epochs on, its checkpoints never committed). Every checkpoint committed before the kill still
    verifies; a restart of both (a new store) resumes from one of them and ends bit-identical."""
    ref = reference(tmp_path, KILL_ARGS)
    ckpt = tmp_path / "ckpt"
    env = {"PADDLE_ACP_BUSY_POLICY": "wait", **coord_env("store")}
    procs = popen_job(tmp_path, 2, KILL_ARGS, ckpt, "k0", env=env, barrier=False, stdout=subprocess.PIPE,
                      stderr=subprocess.STDOUT, text=True, start_new_session=True)
    rdir = os.path.join(ckpt, range_dir(JOB_ID, RANGE))
    try:
        deadline = time.monotonic() + 240
        while not os.path.exists(os.path.join(rdir, "ckpt-e1", GLOBAL_NAME)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no commit of ckpt-e1"
            time.sleep(0.01)
        # its next part being written: a temporary part of rank 0 at a later position
        while not any(n.startswith("rank-0.tmp-") for d in os.listdir(rdir) if d.startswith("ckpt-e")
                      and d not in ("ckpt-e0", "ckpt-e1") for n in _ls(os.path.join(rdir, d))):
            assert time.monotonic() < deadline and procs[0].poll() is None, "rank 0 wrote no later part"
            time.sleep(0.001)
        os.killpg(procs[0].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        procs[0].wait()
        out1 = procs[1].communicate(timeout=60)[0]
        stopped_after = time.monotonic() - killed_at
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert procs[1].returncode not in (0, None), out1[-3000:]
    assert "CoordinationError" in out1 and "rank 0 is gone or unreachable" in out1, out1[-3000:]
    assert stopped_after < 30, stopped_after
    assert not is_done(tmp_path / "out" / "r1")
    g, before = committed(ckpt)
    assert before[:2] == ["ckpt-e0", "ckpt-e1"] or len(before) >= 2, before
    for name in before:
        g.verify(name)  # every committed checkpoint is whole
    res = run_job(tmp_path, 2, KILL_ARGS, ckpt, "k1", env={"PADDLE_ACP_BUSY_POLICY": "wait", **coord_env("store")})
    assert all(rc == 0 for rc, _ in res), [o[-3000:] for _, o in res]
    starts = []
    for r in (0, 1):
        with open(tmp_path / "out" / f"r{r}" / "events.jsonl") as f:
            starts.append([json.loads(x) for x in f.read().splitlines() if x.strip()][-1])
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r
    assert starts[0]["restored"] == starts[1]["restored"] and starts[0]["restored"] in before, (starts, before)


def _ls(path):
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


HOST = """
import sys, time
from paddle.base import core
s = core.TCPStore("127.0.0.1", int(sys.argv[1]), True, 2, 60)
print("up", flush=True)
time.sleep(600)
"""


@pytest.fixture
def link(monkeypatch):
    """This process as rank 1 of a store hosted by a real rank-0 process (a store of ours: MASTER_ADDR)."""
    from paddle_acp.adapter.store import StoreEndpoint
    from paddle_acp.runtime.coord import store

    monkeypatch.setattr(store, "CALL_TIMEOUT", 2.0)
    port = free_port()
    host = subprocess.Popen([sys.executable, "-c", HOST, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        lk = store.StoreLink(StoreEndpoint("127.0.0.1", port, "MASTER_ADDR"), 1, 2, open_timeout=60)
        yield host, store.StoreCoordinator(lk, "job/r")
    finally:
        if host.poll() is None:
            os.kill(host.pid, signal.SIGCONT)
            host.kill()
        host.wait()


@pytest.mark.parametrize("how", ["SIGSTOP", "SIGKILL"])
def test_a_store_whose_host_stops_or_dies_fails_every_call_within_its_bound(link, how):
    from paddle_acp.runtime.coord import CoordinationError

    host, coord = link
    assert coord.latest("plan.json", 100) is None  # (waits for the open: the host's rendezvous)
    coord.arrive("p")
    assert coord.arrivals("p") == 1
    coord.check()
    os.kill(host.pid, getattr(signal, how))
    if how == "SIGKILL":
        host.wait()
    else:  # kill() returns before the host stops: on a loaded machine its store answered one more call
        deadline = time.monotonic() + 60
        while not stopped(host.pid):
            assert time.monotonic() < deadline, "the store's host did not stop within 60 s of SIGSTOP"
            time.sleep(0.01)
    t0 = time.monotonic()
    with pytest.raises(CoordinationError, match="rank 0 is gone or unreachable"):
        coord.arrivals("p")
    assert time.monotonic() - t0 < 10
    t0 = time.monotonic()  # lost for good: every later call and the liveness check fail at once
    for call in (lambda: coord.post("plan.json", b"{}"), coord.check):
        with pytest.raises(CoordinationError):
            call()
    assert time.monotonic() - t0 < 0.5


def test_a_store_never_opened_fails_the_first_call_within_the_open_bound():
    from paddle_acp.adapter.store import StoreEndpoint
    from paddle_acp.runtime.coord import CoordinationError, store

    lk = store.StoreLink(StoreEndpoint("127.0.0.1", free_port(), "MASTER_ADDR"), 1, 2, open_timeout=3)
    t0 = time.monotonic()
    with pytest.raises(CoordinationError, match="rank 0 is gone or unreachable"):
        store.StoreCoordinator(lk, "job/r").latest("plan.json", 100)
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("env,want", [
    ({}, None),
    ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6170"}, ("10.0.0.1", 6170, "MASTER_ADDR", False)),
    ({"PADDLE_MASTER": "10.0.0.1:6170", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "1"},
     ("10.0.0.1", 6170, "PADDLE_MASTER", False)),
    ({"PADDLE_MASTER": "10.0.0.1:6170", "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6170,10.0.0.1:6171"},
     ("10.0.0.1", 6170, "PADDLE_MASTER", True)),
    ({"PADDLE_MASTER": "no-port"}, None),
    ({"MASTER_ADDR": "h", "MASTER_PORT": "99999"}, None),
])
def test_the_store_a_job_names(env, want):
    from paddle_acp.adapter.store import job_store_endpoint

    ep = job_store_endpoint(env)
    assert (None if ep is None else (ep.host, ep.port, ep.source, ep.shared_with_trainer)) == want


@pytest.mark.parametrize("env,kind", [
    ({"PADDLE_ACP_COORDINATION": "auto", "PADDLE_MASTER": "127.0.0.1:1"}, "storage"),  # the job's store: asked for only
    ({"PADDLE_ACP_COORDINATION": "storage", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "storage"),
    ({}, "storage"),
])
def test_auto_and_storage_keep_to_storage_where_they_must(tmp_path, env, kind):
    from paddle_acp.config import CheckpointConfig
    from paddle_acp.runtime.coord import open_coordinator

    c = open_coordinator(CheckpointConfig(uri=str(tmp_path), trainer_id=0, world_size=2), open_storage(str(tmp_path)),
                         "j/range/r", "r", env=env)
    assert c.kind == kind


def test_bad_coordination_settings_are_refused_by_name(tmp_path):
    from paddle_acp.config import CheckpointConfig
    from paddle_acp.errors import ConfigError
    from paddle_acp.runtime.coord import open_coordinator

    cfg = CheckpointConfig(uri=str(tmp_path), trainer_id=0, world_size=2)
    with pytest.raises(ConfigError, match="PADDLE_ACP_COORDINATION='zookeeper' is not a mode"):
        open_coordinator(cfg, open_storage(str(tmp_path)), "j/range/r", "r", env={"PADDLE_ACP_COORDINATION": "zookeeper"})
    with pytest.raises(ConfigError, match="names no store: set PADDLE_MASTER"):
        open_coordinator(cfg, open_storage(str(tmp_path)), "j/range/r", "r", env={"PADDLE_ACP_COORDINATION": "store"})


def test_a_job_restarted_after_its_last_checkpoint_opens_and_ends_as_fast_as_a_fresh_start(tmp_path):
    """A 2-rank job through a store of ours is run to its end, then started again (as a launcher restarts a
    job whose ranks were killed after the last commit): every rank resumes past the end and has nothing to do.
    Rank 1 starts first and is done before rank 0 hosts the store: it must still join the store's open, or
    rank 0's open (and the plan write its end waits for) waits out PADDLE_ACP_PART_TIMEOUT (60 s here; before:
    rank 0 took 60 s more than the fresh start, ``ci/kill_anywhere.py --coordination store`` trials 60 s
    more than on storage). Both end with 0 within seconds of the fresh job's time, with no error logged."""
    args = ["--kind", "dp", "--epochs", 2, "--steps-per-epoch", 2]
    ckpt = tmp_path / "ckpt"
    t = time.monotonic()
    res = run_job(tmp_path, 2, args, ckpt, "s0", env=coord_env("store"))
    fresh = time.monotonic() - t
    assert all(rc == 0 for rc, _ in res), [o[-3000:] for _, o in res]
    env = coord_env("store")
    logs = [open(tmp_path / f"again.r{r}.log", "w+") for r in (0, 1)]
    procs = []
    try:
        procs.append(popen_job(tmp_path, 2, args, ckpt, "s1", env=env, stdout=logs[1], stderr=subprocess.STDOUT,
                               only=1)[0])
        deadline = time.monotonic() + 120
        while "coordinate through the job's store" not in (tmp_path / "again.r1.log").read_text():
            assert time.monotonic() < deadline and procs[0].poll() is None, (tmp_path / "again.r1.log").read_text()
            time.sleep(0.01)
        t = time.monotonic()
        procs.append(popen_job(tmp_path, 2, args, ckpt, "s1", env=env, stdout=logs[0], stderr=subprocess.STDOUT,
                               only=0)[0])
        rcs = [p.wait(timeout=120) for p in procs]
        again = time.monotonic() - t
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    outs = [(tmp_path / f"again.r{r}.log").read_text() for r in (0, 1)]
    assert rcs == [0, 0], [o[-3000:] for o in outs]
    assert all("resuming at epoch 2" in o and "ERROR" not in o for o in outs), [o[-3000:] for o in outs]
    assert again < fresh + 5, (again, fresh)
