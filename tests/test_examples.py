"""The scripts in examples/ run as the README says, and resume bit-identically after a SIGKILL.

Each example is run three ways with real processes: without checkpointing (the reference), and with
checkpointing, SIGKILLed once it has printed a given line, then restarted with the same command. The
restarted run must end with the reference's parameters, bit for bit, and must have resumed (not trained
from epoch 0 again).
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
CLI = os.path.join(os.path.dirname(sys.executable), "paddle-acp")


def _env(ckpt=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_ACP_", "PADDLE_JOB_ID", "FLAGS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    if ckpt is not None:
        env["PADDLE_ACP_CHECKPOINT_URI"] = ckpt
        env["PADDLE_JOB_ID"] = "example"
        # these epochs take milliseconds, less than a persist: wait for each checkpoint, so that the kill
        # finds one committed (the default policy, skip, would skip most of them)
        env["PADDLE_ACP_BUSY_POLICY"] = "wait"
    return env


def _cmd(example, params, runner, ckpt):
    script = os.path.join(EXAMPLES, example)
    if runner and ckpt is not None:
        return [CLI, "run", "--checkpoint", ckpt, "--interval", "0", script, "--params-out", params]
    return [sys.executable, script, "--params-out", params]


def _run(cmd, env, kill_after_line=None, timeout=300):
    """Run ``cmd``; with ``kill_after_line`` SIGKILL it once a checkpoint was saved and it then printed a
    line starting with ``kill_after_line`` (so there is something to resume from)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = []
    saved = False
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        saved = saved or "saved checkpoint" in line
        if kill_after_line is not None and saved and line.startswith(kill_after_line):
            os.killpg(proc.pid, signal.SIGKILL)
            break
        assert time.monotonic() < deadline, "example ran past %d s:\n%s" % (timeout, "".join(lines[-30:]))
    proc.stdout.close()
    rc = proc.wait(timeout=60)
    return rc, "".join(lines)


def _params(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("example,kill_after,runner", [
    ("train_pir.py", "epoch ", False),
    ("train_legacy_resumable.py", "", False),  # right after the first (mid-epoch) checkpoint
    ("paddle_auto_checkpoint.py", "epoch ", True),
])
def test_example_resumes_bit_identically(tmp_path, example, kill_after, runner):
    ref_params = str(tmp_path / "reference.npz")
    rc, out = _run(_cmd(example, ref_params, runner, None), _env())
    assert rc == 0, out
    ckpt = str(tmp_path / "ckpt")
    params = str(tmp_path / "resumed.npz")
    rc, out = _run(_cmd(example, params, runner, ckpt), _env(ckpt), kill_after_line=kill_after)
    assert rc == -signal.SIGKILL, out
    assert not os.path.exists(params)
    rc, out = _run(_cmd(example, params, runner, ckpt), _env(ckpt))
    assert rc == 0, out
    assert "resuming at" in out, out  # it resumed from a checkpoint, not from epoch 0
    if kill_after:  # killed after a whole epoch's checkpoint: epoch 0 is not trained again
        assert "epoch 0:" not in out, out
    ref, got = _params(ref_params), _params(params)
    assert sorted(ref) == sorted(got)
    for name in ref:
        assert ref[name].tobytes() == got[name].tobytes(), name
