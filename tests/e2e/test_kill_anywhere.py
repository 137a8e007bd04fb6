"""Quick run of the kill-anywhere harness (ci/kill_anywhere.py): 3 trials
under PIR.  CI runs it with many more trials per IR."""
import json
import os
import random
import subprocess
import sys
import time

import pytest
from support.e2e import REPO

HARNESS = os.path.join(REPO, "ci", "kill_anywhere.py")


@pytest.mark.long  # on demand: bash ci/test.sh --long
def test_kill_anywhere_three_trials_pir(tmp_path):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, HARNESS, "--trials", "3", "--seed", "7", "--ir",
         "pir", "--uri-root", str(tmp_path / "work"),
         "--json", str(report)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert "3/3 trials resumed bit-identically" in proc.stdout, proc.stdout
    data = json.loads(report.read_text())
    assert data["ok"] == data["total"] == 3
    assert data["irs"]["pir"]["kills"] >= 1, proc.stdout


@pytest.mark.long  # on demand: bash ci/test.sh --long
def test_kill_anywhere_two_ranks_tensor_parallel_like(tmp_path):
    """Two ranks with different values under the same names, a mid-epoch checkpoint every
    other step: any rank killed at any moment, the whole job restarted, each rank ends
    bit-identical to its own uninterrupted run and all ranks resume from the same checkpoint."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, HARNESS, "--ranks", "2", "--trials", "2", "--seed", "7", "--ir", "pir",
         "--epochs", "8", "--steps-per-epoch", "5", "--save-every-steps", "2",
         "--uri-root", str(tmp_path / "work"), "--json", str(report)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert "2/2 trials resumed bit-identically" in proc.stdout, proc.stdout
    data = json.loads(report.read_text())
    assert data["ok"] == data["total"] == 2 and data["ranks"] == 2
    for t in data["trials"]:
        for starts in t["resumed_from"]:
            assert len(set(map(str, starts.values()))) <= 1, t


@pytest.mark.parametrize("coordination", [
    # .ci/run's step 1b runs the 2-rank harness through storage every time; here on demand (bash ci/test.sh --long)
    pytest.param("storage", marks=pytest.mark.long),
    "store"])
def test_kill_anywhere_two_ranks_data_parallel_spread_writes(tmp_path, coordination):
    """Data parallel (replicated state, each rank writing its share of the tensors): any rank killed
    at any moment (rank 0, the store's host, included), mid-epoch checkpoints every other step, the whole
    job restarted: every rank ends bit-identical to the uninterrupted run and all ranks resume from the
    same checkpoint, the ranks coordinated through storage or through Paddle's store."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, HARNESS, "--ranks", "2", "--kind", "dp", "--trials", "2", "--seed", "11", "--ir", "pir",
         "--epochs", "8", "--steps-per-epoch", "5", "--save-every-steps", "2", "--coordination", coordination,
         "--uri-root", str(tmp_path / "work"), "--json", str(report)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert "2/2 trials resumed bit-identically" in proc.stdout, proc.stdout
    data = json.loads(report.read_text())
    assert data["ok"] == data["total"] == 2 and data["kind"] == "dp"
    for t in data["trials"]:
        for starts in t["resumed_from"]:
            assert len(set(map(str, starts.values()))) <= 1, t


def _harness(tmp_path, *args, timeout=900):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, HARNESS, "--ir", "pir", "--uri-root", str(tmp_path / "work"),
         "--json", str(report), *map(str, args)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return proc, json.loads(report.read_text())


def test_every_trial_ends_after_max_restarts_kills(tmp_path):
    """After --max-restarts kills the next process runs unkilled: a trial cannot be killed
    forever (a busy machine once made a trial give up after 51 kills)."""
    proc, data = _harness(tmp_path, "--trials", 2, "--seed", 3, "--epochs", 6, "--max-restarts", 1)
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert data["ok"] == data["total"] == 2 and data["failed"] == data["liveness_problems"] == 0
    for rec in data["trials"]:
        assert rec["kills"] <= 1 and rec["outcome"] == "ok", rec
        assert rec["unkilled_runs"] == rec["kills"], rec  # one kill, then one unkilled run


def test_liveness_problem_is_reported_apart_from_correctness(tmp_path):
    """A process that shows no life within --life-timeout (here deliberately far too short) is a
    liveness problem: exit status 3 and its own message, not a failed trial."""
    proc, data = _harness(tmp_path, "--trials", 1, "--seed", 4, "--epochs", 4, "--life-timeout", 0.01)
    assert proc.returncode == 3, proc.stdout[-8000:]
    assert "LIVENESS PROBLEM (not a checkpoint failure)" in proc.stdout, proc.stdout[-8000:]
    assert "showed no life" in proc.stdout and "FAILED" not in proc.stdout, proc.stdout[-8000:]
    assert data["failed"] == 0 and data["liveness_problems"] == 1 and data["exit_code"] == 3
    assert data["trials"][0]["outcome"] == "liveness" and data["trials"][0]["problems"] == []


def test_two_rank_trials_end_after_max_restarts_and_report_liveness_apart(tmp_path):
    """The N-rank harness guarantees progress the same way (after --max-restarts kills a round
    runs unkilled) and reports a round that cannot finish in time (here --round-timeout far too short)
    as a liveness problem, exit status 3, never as a correctness failure."""
    proc, data = _harness(tmp_path / "a", "--ranks", 2, "--trials", 2, "--seed", 5, "--epochs", 4,
                          "--steps-per-epoch", 4, "--save-every-steps", 2, "--max-restarts", 0)
    assert proc.returncode == 0, proc.stdout[-8000:]
    for rec in data["trials"]:
        assert rec["kills"] == 0 and rec["unkilled_runs"] == 1 and rec["outcome"] == "ok", rec
    proc, data = _harness(tmp_path / "b", "--ranks", 2, "--trials", 1, "--seed", 5, "--epochs", 4,
                          "--steps-per-epoch", 4, "--save-every-steps", 2, "--max-restarts", 0,
                          "--round-timeout", 0.05)
    assert proc.returncode == 3, proc.stdout[-8000:]
    assert "LIVENESS PROBLEM (not a checkpoint failure)" in proc.stdout and "FAILED" not in proc.stdout
    assert data["liveness_problems"] == 1 and data["trials"][0]["problems"] == []


# ---------------------------------------------------------------------------
# tests/support/storage_faults.py: the parts of the server-fault mode that decide a verdict, each against
# real processes, a real server and a real checkpoint tree (the full mode costs minutes: .ci/run).

from support import e2e as eu  # noqa: E402
from support import storage_faults as sf  # noqa: E402
from support.server_fixtures import own_s3_server as s3_server  # noqa: E402,F401  (fixture: it kills and restarts it)

_RAISE = """
import os, sys
import paddle_acp_cli  # defers the Paddle import: only the error classes are needed
from paddle_acp.errors import CheckpointError, ConfigError, StorageError
kind = sys.argv[1]
if kind == "storage":
    raise StorageError("reading s3://b/x failed: cannot connect to the S3 endpoint")
if kind == "checkpoint":
    raise CheckpointError("no valid checkpoint in s3://b/x: every one failed its checks")
if kind == "config-from-storage":
    try:
        raise StorageError("checking s3://b/x/job.json failed: cannot connect")
    except StorageError as e:
        raise ConfigError("checkpoint location 's3://b/x' is not reachable or not writable: %s" % e) from e
if kind == "config":
    raise ConfigError("PADDLE_ACP_SAVE_INTERVAL='x' is not a number")
if kind == "oserror":
    raise OSError("When getting information for key 'x': AWS Error NETWORK_CONNECTION")
if kind == "exit3":
    sys.stderr.write("barrier timed out\\n")
    sys.exit(3)
if kind == "sigkill":
    os.kill(os.getpid(), 9)
"""


def test_clear_error_tells_a_named_storage_failure_from_any_other_exit():
    verdicts = {}
    for kind in ("storage", "checkpoint", "config-from-storage", "config", "oserror", "exit3", "sigkill"):
        p = subprocess.run([sys.executable, "-c", _RAISE, kind], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60)
        verdicts[kind] = sf.clear_error(p.returncode, p.stderr)
    assert verdicts["storage"].startswith("paddle_acp.errors.StorageError: reading s3://b/x failed"), verdicts
    assert verdicts["checkpoint"].startswith("paddle_acp.errors.CheckpointError: no valid checkpoint"), verdicts
    assert verdicts["config-from-storage"].startswith("paddle_acp.errors.ConfigError: checkpoint location"), verdicts
    for kind in ("config", "oserror", "exit3", "sigkill"):
        assert verdicts[kind] is None, (kind, verdicts)


def test_committed_log_finds_a_lost_checkpoint_and_allows_retention(tmp_path):
    """The 'nothing committed lost' verdict on a real checkpoint tree: intact -> no problem; the
    newest one's commit file gone -> lost; an older one gone while max_to_keep newer ones remain ->
    retention, no problem."""
    ckpt = tmp_path / "ckpt"
    proc = eu.run_script(tmp_path / "out", ckpt, "pir", "--epochs", 5, "--interval", 0,
                         env={"PADDLE_ACP_BUSY_POLICY": "wait"})
    assert proc.returncode == 0, eu.describe(proc)
    log = sf.CommittedLog(str(ckpt))
    assert log.observe() is None and len(log.seen) == 3, log.seen  # retention keeps 3
    assert log.final_check() == []
    name, newest = log.newest()
    (job, rng), = {k[:2] for k in log.seen}
    log.seen[(job, rng, "ckpt-e0")] = dict(newest, number=0, epoch=0)  # seen earlier, retention removed it
    assert log.final_check() == []
    del log.seen[(job, rng, "ckpt-e0")]
    os.remove(ckpt / job / "range" / rng / name / "global.json")  # its commit (one process: a job of one rank)
    problems = log.final_check()
    assert len(problems) == 1 and name in problems[0] and "lost" in problems[0], problems


def _read_when_back(srv, path, limit=60.0):
    """The object's bytes; a restarted weed answers HEAD bucket before its volume serves reads
    (GetObject fails with INTERNAL_FAILURE for a moment), so transient errors are retried."""
    deadline = time.monotonic() + limit
    while True:
        try:
            with srv.filesystem().open_input_stream(path) as f:
                return f.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_server_faults_kill_and_restart_s3_on_the_same_port_with_its_data(s3_server):  # noqa: F811
    fs = s3_server.filesystem()
    with fs.open_output_stream("%s/kept.bin" % s3_server.bucket) as f:
        f.write(b"committed before the fault")
    port, pid = s3_server.port, s3_server.pid
    faults = sf.ServerFaults(s3_server, max_down_s=0.5)
    try:
        job = faults.schedule(random.Random(1), 0.2)
        assert job is not None and faults.schedule(random.Random(2), 0.2) is None  # one at a time
        assert faults.settle(timeout=120) is None
        assert job["fired"] and "error" not in job, job
        assert s3_server.pid not in (None, pid) and s3_server.port == port
        assert _read_when_back(s3_server, "%s/kept.bin" % s3_server.bucket) == b"committed before the fault"
        # a disarmed fault never fires
        job = faults.schedule(random.Random(3), 30.0)
        faults.cancel()
        assert faults.settle(timeout=60) is None and not job["fired"]
        assert [r["part"] for r in faults.records()] == ["weed"]
    finally:
        faults.close()
