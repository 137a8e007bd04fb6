"""A child forked inside a training loop leaves its parent's range alone (issue 42: signals and forks)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "fork_in_loop.py")


def test_a_child_forked_inside_the_loop_writes_logs_and_closes_nothing_of_the_range(tmp_path):
    env = dict(os.environ, PADDLE_ACP_CHECKPOINT_URI=str(tmp_path / "ckpt"), PADDLE_JOB_ID="fork",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = re.findall(r"^pid=(\d+) (.*)$", proc.stderr, re.M)
    child = {pid for pid, msg in lines if msg == "child left the loop"}
    assert len(child) == 1, proc.stderr[-3000:]
    child_lines = [msg for pid, msg in lines if pid in child]
    # the child's only line is the script's own: the range (its parent's) neither logged nor closed anything there
    assert child_lines == ["child left the loop"], child_lines
    assert "child status 0" in proc.stderr
    parent_saves = [msg for pid, msg in lines if pid not in child and "saved checkpoint" in msg]
    assert len(parent_saves) == 3, proc.stderr[-3000:]
