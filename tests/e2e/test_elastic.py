"""Elastic training under Paddle's own launcher with a real etcd master.

``python -m paddle.distributed.launch --master etcd://127.0.0.1:PORT
--elastic_level 1 --max_restart 3`` runs ``tests/scripts/elastic_train.py``
(2 trainers that train identical data in lockstep through a per-epoch file
barrier; see its docstring). Trainer 1 SIGKILLs itself inside epoch 2 once;
the launcher stops the rest of the job (SIGTERM: trainer 0 saves and exits
143) and starts it again. We demand:

* the job completes; both trainers end with parameters (and Adam state)
  bit-identical to an uninterrupted run without paddle-acp;
* neither trainer restarts from scratch: both second incarnations start
  from the same committed checkpoint, at epoch >= 2;
* every trainer writes only its own part of each checkpoint (its tensors are
  none: data parallel is replicated; its RNG state and loader position), no
  mutating ``Storage`` call of trainer 1 touches anything else; every globally
  committed checkpoint is one trainer 0 logged; and a trainer-1-only run
  leaves every file it found as it was.

The job id is ``PADDLE_JOB_ID`` in the launcher's environment: the launcher
takes it as its own ``--job_id`` and the trainers inherit it (the launcher does
not export ``--job_id`` to them).

With two launchers, Paddle 3.3.1's launcher sometimes exits instead of
restarting when its only trainer failed (a race with etcd's watch callback,
see ``tests/support/etcd.py`` ``LaunchGroup``); the test then starts that launcher again,
as a cluster's restart policy would, and prints "relaunched after a launcher
race". The trainers' checks are the same either way.

etcd comes from Debian's ``etcd-server`` and the launcher's client from PyPI
``etcd3`` (both installed on first use by ``tests/support/etcd.py``); where that fails the
tests skip, or fail with ``PADDLE_ACP_REQUIRE_SERVERS=1``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

from support import etcd  # noqa: E402

SCRIPT = str(REPO / "tests" / "scripts" / "elastic_train.py")
EPOCHS, STEPS, KILL_EPOCH, KILL_STEP = 5, 6, 2, 2
TRAIN_ARGS = ["--epochs", EPOCHS, "--steps", STEPS, "--sleep", 0.1]
LAUNCH_TIMEOUT = 150


def trainer_env(extra=None):
    env = {k: v for k, v in os.environ.items() if k not in etcd.LAUNCHER_VARS and not k.startswith("PADDLE_ACP_")}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOG_minloglevel="1")
    env.update(extra or {})
    return env


def run_alone(out, *args, env=None, timeout=120):
    """One trainer without the launcher (no peers: --no-barrier)."""
    cmd = [sys.executable, SCRIPT, "--out", str(out), "--no-barrier"] + [str(a) for a in TRAIN_ARGS] + \
        ["--sleep", "0"] + [str(a) for a in args]
    p = subprocess.run(etcd.child_cmd(cmd), env=trainer_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout[-4000:]
    return p


def events(out, rank):
    path = Path(out) / f"events.r{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def params(out, rank):
    with np.load(Path(out) / f"final.r{rank}.npz") as d:
        return {k: d[k] for k in d.files}


def assert_same_params(got, ref, what):
    assert sorted(got) == sorted(ref), what
    bad = [k for k in ref if not np.array_equal(got[k], ref[k])]
    assert not bad, f"{what}: differs from the uninterrupted run in {bad}"


def tree(root):
    """{relative path: (size, mtime_ns, sha256)} of every file and dir under root."""
    root = Path(root)
    out = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[str(p.relative_to(root))] = (st.st_size if p.is_file() else 0, st.st_mtime_ns, digest)
    return out


def alive(pid):
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return b"elastic_train.py" in cmd and stat.rsplit(")", 1)[1].split()[0] != "Z"


def trainer_pids(out):
    f = Path(out) / "pids"
    return [int(line.split()[0]) for line in f.read_text().splitlines()] if f.exists() else []


class ElasticJob:
    """The launchers of one job (``etcd.LaunchGroup``); ``close()`` kills them and every trainer they started."""

    def __init__(self, tmp, job_id, env_extra=None, args_extra=()):
        self.tmp, self.job_id = Path(tmp), job_id
        self.out, self.ckpt = self.tmp / "out", self.tmp / "ckpt"
        self.out.mkdir(parents=True)
        self.args_extra = list(args_extra)
        env = etcd.launcher_env(job_id, base=trainer_env(), PADDLE_ACP_CHECKPOINT_URI=str(self.ckpt), **(env_extra or {}))
        self.group = etcd.LaunchGroup(self.tmp, env, relaunch=1)

    def launch(self, master_url, *, nnodes, nproc_per_node, rank=None, name="node0"):
        cmd = etcd.launch_command(master_url, SCRIPT,
                                  ["--out", self.out] + TRAIN_ARGS + ["--kill-rank", 1, "--kill-epoch", KILL_EPOCH,
                                                                      "--kill-step", KILL_STEP] + self.args_extra,
                                  nnodes=nnodes, nproc_per_node=nproc_per_node, rank=rank, max_restart=3,
                                  log_dir=str(self.tmp / f"log.{name}"))
        return self.group.add(name, cmd)

    def wait(self, timeout=LAUNCH_TIMEOUT):
        codes = self.group.wait(timeout)
        if codes is None:
            pytest.fail(f"the launchers did not finish within {timeout} s\n{self.describe()}", pytrace=False)
        if self.group.relaunched:
            print(f"relaunched after a launcher race: {self.group.relaunched}")
        return [codes[n] for n in self.group.nodes]

    def log(self, name):
        return self.group.log_text(name)

    def describe(self):
        parts = []
        for name in self.group.nodes:
            parts.append(f"--- launcher {name} (rc {self.group.current(name).poll()}):\n" + self.log(name)[-3000:])
        for wl in sorted(self.tmp.glob("log.*/workerlog.*")):
            parts.append(f"--- {wl.parent.name}/{wl.name}:\n" + wl.read_text(errors="replace")[-2500:])
        for r in (0, 1):
            parts.append(f"--- events.r{r}:\n" + "\n".join(json.dumps(e) for e in events(self.out, r)))
        return "\n".join(parts)

    def close(self):
        self.group.close()
        for pid in trainer_pids(self.out):
            if alive(pid):
                etcd.kill_group(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def etcd_server():
    try:
        etcd.find_etcd()
        etcd.ensure_etcd3(sys.executable)
        srv = etcd.EtcdServer().start()
    except etcd.EtcdUnavailable as exc:
        etcd.require_or_skip(exc)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run without paddle-acp: (params, {epoch: loss hex})."""
    out = tmp_path_factory.mktemp("elastic-ref")
    run_alone(out)
    return params(out, 0), {e["epoch"]: e["loss"] for e in events(out, 0) if e["event"] == "epoch"}


@pytest.fixture
def job(tmp_path):
    jobs = []

    def make(job_id, **kw):
        j = ElasticJob(tmp_path, job_id, **kw)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.close()


# ---------------------------------------------------------------------------
# checks shared by both layouts


SAVED_RE = re.compile(r"saved global checkpoint (ckpt-e\d+(?:-s\d+)?) ")
RESUMING_RE = re.compile(r"resuming at epoch \d+.* from global checkpoint (ckpt-e\d+(?:-s\d+)?) ")
ETCD_RE = re.compile(r"the ranks coordinate through etcd at 127\.0\.0\.1:\d+, named by the launcher \(pid \d+\) "
                     r"\(PADDLE_ACP_COORDINATION=auto\)")
PART_RE = re.compile(r"rank 1 wrote its part of checkpoint (ckpt-e\d+(?:-s\d+)?) ")


def check_elastic_run(j, reference, worker_logs):
    """``worker_logs``: {rank: path of that trainer's launcher log (workerlog.<local rank>)}."""
    info = j.describe
    ref_params, ref_losses = reference

    for r in (0, 1):
        assert (j.out / f"done.r{r}").exists(), f"trainer {r} did not finish\n{info()}"
        assert_same_params(params(j.out, r), ref_params, f"trainer {r}")

    starts = {r: [e for e in events(j.out, r) if e["event"] == "start"] for r in (0, 1)}
    kills = [e for e in events(j.out, 1) if e["event"] == "kill"]
    assert len(kills) == 1 and (kills[0]["epoch"], kills[0]["step"]) == (KILL_EPOCH, KILL_STEP), info()
    for r in (0, 1):
        # one restart of the pod: two incarnations, different processes, with the env the launcher gives
        assert len(starts[r]) == 2, f"trainer {r}: {len(starts[r])} incarnations\n{info()}"
        first, second = starts[r]
        assert first["pid"] != second["pid"]
        for s in (first, second):
            assert s["env"]["PADDLE_TRAINER_ID"] == str(r) and s["env"]["PADDLE_TRAINERS_NUM"] == "2"
            assert s["env"]["PADDLE_JOB_ID"] == j.job_id
        assert (first["epoch"], first["step"], first["restored"]) == (0, 0, None), info()
        # not from scratch: at least the epochs before the killed one are kept
        assert second["restored"] is not None and second["epoch"] >= KILL_EPOCH, info()
        # a restart happened between the two: the launcher gave them a new PADDLE_MASTER
        assert first["env"]["PADDLE_MASTER"] != second["env"]["PADDLE_MASTER"]
    # every trainer restores the same committed checkpoint, at the same point
    key = lambda s: (s["restored"], s["epoch"], s["step"])  # noqa: E731
    assert key(starts[0][1]) == key(starts[1][1]), info()
    assert starts[1][0]["env"]["PADDLE_MASTER"] == starts[0][0]["env"]["PADDLE_MASTER"]
    assert starts[1][1]["env"]["PADDLE_MASTER"] == starts[0][1]["env"]["PADDLE_MASTER"]

    # epochs trained from their first batch have the uninterrupted run's loss
    for r in (0, 1):
        for e in events(j.out, r):
            if e["event"] == "epoch" and e["first_step"] == 0:
                assert e["loss"] == ref_losses[e["epoch"]], f"trainer {r} epoch {e['epoch']}\n{info()}"

    # trainer 1 writes only its own parts; all committed checkpoints are trainer 0's global
    # commits; the one restored was committed (logged saved) before anyone resumed from it
    assert not (j.out / "violations.r1.jsonl").exists(), (j.out / "violations.r1.jsonl").read_text()
    log0, log1 = (Path(worker_logs[r]).read_text(errors="replace") for r in (0, 1))
    for lg in (log0, log1):  # every incarnation of both found the launcher's etcd (auto) and coordinated there
        assert len(ETCD_RE.findall(lg)) == 2, lg[-3000:]
    assert not SAVED_RE.search(log1), "trainer 1 logged a global commit"
    assert PART_RE.search(log1), "trainer 1 wrote no part"
    saved0 = SAVED_RE.findall(log0)
    res0 = RESUMING_RE.search(log0)
    assert res0, log0[-3000:]
    restored = res0.group(1)
    assert restored in SAVED_RE.findall(log0[:res0.start()]), log0[-3000:]
    # trainer 0 was stopped by the launcher (SIGTERM): it tried to save (trainer 1, dead, never
    # delivers its part, so that checkpoint is abandoned) and exited 143
    exits0 = [e for e in events(j.out, 0) if e["event"] == "exit"]
    assert [(e["code"], e["preempted"], e["pid"]) for e in exits0] == [(143, True, starts[0][0]["pid"])], info()
    pre = log0.find("preempted by signal 15")
    assert 0 <= pre < res0.start(), log0[-3000:]
    assert SAVED_RE.findall(log0[:pre])[-1] == restored, log0[-3000:]
    res1 = RESUMING_RE.search(log1)
    assert res1 and res1.group(1) == restored, log1[-3000:]

    rng_dir = j.ckpt / j.job_id / "range" / "_range_0"
    committed = sorted(p.name for p in rng_dir.iterdir() if (p / "global.json").exists())
    assert committed and set(committed) <= set(saved0), (committed, saved0)
    assert saved0[-1] in committed
    leftovers = [str(p) for p in rng_dir.rglob("*") if ".tmp" in p.name]
    assert not leftovers, leftovers
    assert [p.name for p in j.ckpt.iterdir()] == [j.job_id], "checkpoints outside the job's own directory"

    # two barrier generations (one per incarnation), and nobody is left running
    assert len(list((j.out / "barrier").iterdir())) == 2
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in trainer_pids(j.out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in trainer_pids(j.out) if alive(pid)], "trainers outlived their launcher"


# ---------------------------------------------------------------------------
# tests


def test_one_launcher_two_trainers_restart_resumes(etcd_server, reference, job):
    """--nnodes 1 --nproc_per_node 2: trainer 1 dies; the launcher restarts both; exact resume."""
    j = job("elastic-one-node")
    t0 = time.monotonic()
    j.launch(etcd_server.master_url, nnodes=1, nproc_per_node=2)
    assert j.wait() == [0], j.describe()
    launcher_log = j.log("node0")
    assert f"Job: {j.job_id}," in launcher_log  # PADDLE_JOB_ID is the launcher's job id too
    assert launcher_log.count("Pod failed") == 1 and "Pod completed" in launcher_log, launcher_log[-3000:]
    check_elastic_run(j, reference, {0: j.tmp / "log.node0" / "workerlog.0", 1: j.tmp / "log.node0" / "workerlog.1"})
    print(f"one launcher, 2 trainers, one restart: {time.monotonic() - t0:.1f} s")


@pytest.mark.long  # on demand (bash ci/test.sh --long): ~26 s; one launcher restarting two trainers stays in the default run
def test_two_launchers_one_trainer_each_restart_resumes(etcd_server, reference, job):
    """--nnodes 2 (two launcher processes, --rank 0/1): node 1 loses its trainer; both pods restart."""
    j = job("elastic-two-nodes")
    t0 = time.monotonic()
    for node in (0, 1):
        j.launch(etcd_server.master_url, nnodes=2, nproc_per_node=1, rank=node, name=f"node{node}")
    assert j.wait() == [0, 0], j.describe()
    logs = [j.log("node0"), j.log("node1")]
    for lg in logs:
        assert f"Job: {j.job_id}," in lg and "Pod completed" in lg, lg[-3000:]
    # the node hosting trainer 1 saw its container fail; node 0 was restarted as a peer
    assert logs[1].count("Pod failed") == 1, logs[1][-3000:]
    assert "Pod failed" not in logs[0], logs[0][-3000:]
    s0 = [e for e in events(j.out, 0) if e["event"] == "start"]
    s1 = [e for e in events(j.out, 1) if e["event"] == "start"]
    assert {s["env"]["POD_NAME"] for s in s0}.isdisjoint({s["env"]["POD_NAME"] for s in s1}), "one pod per node"
    check_elastic_run(j, reference, {0: j.tmp / "log.node0" / "workerlog.0", 1: j.tmp / "log.node1" / "workerlog.0"})
    print(f"two launchers, one trainer each, one restart: {time.monotonic() - t0:.1f} s")


def test_trainer1_alone_writes_only_its_own_parts(reference, tmp_path):
    """A non-zero trainer writes its own parts and its own rank's writer generations and nothing
    else: no global commit, no job marker, no generation of another rank, and every file it found
    stays as it was."""
    ref_params, _ = reference
    env = lambda ckpt, rank, world="2": {"PADDLE_ACP_CHECKPOINT_URI": str(ckpt), "PADDLE_JOB_ID": "alone",  # noqa: E731
                                         "PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": world}
    own = re.compile(r"^alone(/metrics(/trainer-1\.jsonl)?|/writers(/rank-1(/gen-\d+)?)?"
                     r"|/range(/_range_0(/ckpt-e\d+(/rank-1(/[a-z.]+)?)?)?)?)?$")
    # empty storage: trainer 1 trains everything from scratch; it writes its parts only
    empty = tmp_path / "empty"
    empty.mkdir()
    run_alone(tmp_path / "out1", env=env(empty, 1))
    written = tree(empty)
    assert any(k.endswith("rank-1/manifest.json") for k in written)
    assert [k for k in written if not own.match(k)] == []
    assert_same_params(params(tmp_path / "out1", 1), ref_params, "trainer 1 alone")
    assert not (tmp_path / "out1" / "violations.r1.jsonl").exists()

    # populated storage: a single trainer (world size unset) checkpoints 3 epochs; trainer 1 of a
    # 2-trainer job resumes there (replicated) and leaves every byte it found as it was
    ckpt = tmp_path / "ckpt"
    single = env(ckpt, 0)
    del single["PADDLE_TRAINERS_NUM"]
    run_alone(tmp_path / "out0", "--epochs", 3, env=single)
    before = tree(ckpt)
    assert any(k.endswith("manifest.json") for k in before)
    time.sleep(0.05)  # mtimes would move
    run_alone(tmp_path / "out2", env=env(ckpt, 1))
    after = tree(ckpt)
    assert {k: v for k, v in after.items() if k in before and not own.match(k)} == \
        {k: v for k, v in before.items() if not own.match(k)}
    assert [k for k in after if k not in before and not own.match(k)] == []
    start = [e for e in events(tmp_path / "out2", 1) if e["event"] == "start"][0]
    assert start["epoch"] == 3 and start["restored"] is not None
    assert_same_params(params(tmp_path / "out2", 1), ref_params, "trainer 1 resumed from trainer 0's checkpoint")
    assert not (tmp_path / "out2" / "violations.r1.jsonl").exists()


@pytest.mark.long  # on demand (bash ci/test.sh --long): ~21 s; the launcher's restart stays in the default run
def test_tensor_parallel_like_trainers_resume_their_own_state(etcd_server, job, tmp_path):
    """Under the real launcher: two trainers with the same program, names and shapes but their
    own initial values and data (PADDLE_ACP_RANK_STATE=per-rank). Trainer 1 dies in epoch 2;
    after the launcher's restart each ends bit-identical to ITS OWN uninterrupted run, and both
    resumed from the same global checkpoint."""
    refs = {}
    for r in (0, 1):
        out = tmp_path / f"ref{r}"
        run_alone(out, "--per-rank-values", env={"PADDLE_TRAINER_ID": str(r)})
        refs[r] = params(out, r)
    assert any(not np.array_equal(refs[0][k], refs[1][k]) for k in refs[0]), "the trainers must differ"
    j = job("elastic-tp", env_extra={"PADDLE_ACP_RANK_STATE": "per-rank"}, args_extra=["--per-rank-values"])
    j.launch(etcd_server.master_url, nnodes=1, nproc_per_node=2)
    assert j.wait() == [0], j.describe()
    starts = {r: [e for e in events(j.out, r) if e["event"] == "start"] for r in (0, 1)}
    for r in (0, 1):
        assert (j.out / f"done.r{r}").exists(), j.describe()
        assert_same_params(params(j.out, r), refs[r], f"trainer {r}")
        assert len(starts[r]) == 2 and starts[r][1]["restored"] is not None, j.describe()
    assert (starts[0][1]["restored"], starts[0][1]["epoch"], starts[0][1]["step"]) == \
        (starts[1][1]["restored"], starts[1][1]["epoch"], starts[1][1]["step"]), j.describe()
    log0 = (j.tmp / "log.node0" / "workerlog.0").read_text(errors="replace")
    assert "saves per-rank state (PADDLE_ACP_RANK_STATE=per-rank)" in log0
    g = json.loads(next((j.ckpt / j.job_id / "range" / "_range_0").glob("ckpt-e*/global.json")).read_text())
    assert g["topology"] == {"world_size": 2, "mode": "per-rank"}
    assert not (j.out / "violations.r1.jsonl").exists(), (j.out / "violations.r1.jsonl").read_text()
