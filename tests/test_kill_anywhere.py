"""Quick run of the kill-anywhere harness (ci/kill_anywhere.py): 3 trials
under PIR.  CI runs it with many more trials per IR."""
import json
import os
import subprocess
import sys

from e2e_util import REPO

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
