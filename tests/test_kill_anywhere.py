"""Quick run of the kill-anywhere harness (ci/kill_anywhere.py): 3 trials
under PIR.  CI runs it with many more trials per IR."""
import json
import os
import subprocess
import sys

from support.e2e import REPO

HARNESS = os.path.join(REPO, "ci", "kill_anywhere.py")


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
