"""Driving ``tests/scripts/steps_script.py`` from outside, as a node's agent would: started in a session of its own,
held right after a training step (``--stop-at E:S``), acted on (a signal), let go, and waited for.

The script writes ``OUT/stopping`` once it reached the step and waits there until ``OUT/stopped`` exists.
"""
import os
import signal
import subprocess
import sys
import time

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "steps_script.py")


def start(out, ck, *args, env=None):
    """Start the script (``args`` after ``--out``) with its checkpoints at ``ck``, saving synchronously, ``env`` over
    the caller's environment, in a session of its own (its process group: the script and its DataLoader workers);
    its stdout and stderr piped, as text."""
    e = dict(os.environ, PADDLE_ACP_CHECKPOINT_URI=str(ck), PADDLE_ACP_ASYNC="0", **(env or {}))
    return subprocess.Popen([sys.executable, SCRIPT, "--out", str(out), *args], env=e, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path, proc, timeout=60):
    """Wait until the file ``path`` (a ``pathlib.Path``) exists; fails if ``proc`` ends first or ``timeout`` passes."""
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.01)


def act_when_held(proc, d, act):
    """``proc`` (started in a session of its own, its output piped) writes ``d/stopping`` and waits until
    ``d/stopped`` exists: once it waits, ``act(proc)`` (e.g. send it a signal), let it go on and wait for it (60 s).
    ``(stdout, stderr, what act returned)``; its whole process group is SIGKILLed if it has not ended by then."""
    try:
        wait_for(d / "stopping", proc)
        acted = act(proc)
        (d / "stopped").touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out, err, acted


def act_at_step(out, ck, act, *args, at="1:3", env=None):
    """Run the script (``start``'s ``args`` and ``env``) until it waits right after step ``at``; then as
    ``act_when_held``. ``(exit status, stderr, what act returned)``."""
    p = start(out, ck, *args, "--stop-at", at, env=env)
    _, err, acted = act_when_held(p, out, act)
    return p.returncode, err, acted
