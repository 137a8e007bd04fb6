"""A job stopped as Kubernetes and Slurm stop it: a signal to every process of it, DataLoader workers included.

Real processes throughout: the training script runs in a session of its own with a ``paddle.io.DataLoader``
of two worker processes; the test signals the whole process group from outside it (``os.killpg``), as the
node's agent would, while the script waits at a known step.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from support.newest import committed
from support.stop_at import act_at_step, act_when_held, start, wait_for
from test_steps import assert_same, reference, steps

from paddle_acp.storage import open_storage


def running(pid):
    """The process exists and has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop_group_at_step(out, ck, sig):
    """Run the script with 2 DataLoader workers; at epoch 1 step 3 send ``sig`` to its whole process group.
    Its status, its stderr and the pids of the workers signalled."""
    def signal_group(p):
        workers = [int(w) for w in os.listdir(out / "workers") if running(w)]
        assert len(workers) == 2, workers  # the epoch's loader's workers, in the script's process group
        assert all(os.getpgid(w) == p.pid for w in workers)
        os.killpg(p.pid, sig)
        return workers

    return act_at_step(out, ck, signal_group, "--loader", "dataloader", "--workers", "2")


def test_sigterm_to_the_process_group_with_dataloader_workers_saves_exits_143_and_resumes(tmp_path, tmp_path_factory):
    """Before: a worker died of the SIGTERM first and Paddle raised SystemError in the training process,
    inside the preemption save; no checkpoint, exit status 1."""
    ref = reference(tmp_path_factory, "pir", "--loader", "dataloader", "--workers", "2")
    out, ck = tmp_path / "out", tmp_path / "ck"
    rc, err, workers = stop_group_at_step(out, ck, signal.SIGTERM)
    assert rc == 143, err[-3000:]
    assert "SystemError" not in err and "exited unexpectedly" not in err
    assert "saved checkpoint ckpt-e1-s4 (epoch 1 step 4)" in err
    assert [w for w in workers if running(w)] == []  # the workers ended with the process, none left behind
    _, order = steps(out)
    assert order[-1][0] == (1, 3)
    p = start(out, ck, "--loader", "dataloader", "--workers", "2")
    o, e = p.communicate(timeout=120)
    assert p.returncode == 0, e[-3000:]
    assert "resumed at epoch 1 step 4" in o
    assert_same(out, ref)


def test_ctrl_c_to_the_process_group_with_dataloader_workers_is_unchanged(tmp_path, tmp_path_factory):
    """SIGINT is not a preemption signal: KeyboardInterrupt, no save, the committed checkpoint intact (as before)."""
    ref = reference(tmp_path_factory, "pir", "--loader", "dataloader", "--workers", "2")
    out, ck = tmp_path / "out", tmp_path / "ck"
    rc, err, workers = stop_group_at_step(out, ck, signal.SIGINT)
    assert rc == -signal.SIGINT, err[-3000:]
    assert "KeyboardInterrupt" in err
    assert [w for w in workers if running(w)] == []
    assert sorted(os.listdir(ck / "default" / "range" / "_range_0")) == ["ckpt-e0"]
    assert committed(open_storage(str(ck)), "default") == ["ckpt-e0"]  # epoch 0's, committed, nothing half-written
    p = start(out, ck, "--loader", "dataloader", "--workers", "2")
    o, e = p.communicate(timeout=120)
    assert p.returncode == 0, e[-3000:]
    assert "resumed at epoch 1 step 0" in o
    assert_same(out, ref)


@pytest.mark.parametrize("order", ["term-then-kill", "kill-then-term"])
def test_workers_of_a_killed_training_process_still_end_on_the_jobs_sigterm(tmp_path, order):
    """The workers hold the job's SIGTERM only while their training process lives: once it is gone (here
    SIGKILLed before it could save), a SIGTERM held or sent then ends them, as it would have without
    paddle-acp (Paddle's orphaned workers do not end by themselves)."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = start(out, ck, "--loader", "dataloader", "--workers", "2", "--stop-at", "1:3")
    try:
        wait_for(out / "stopping", p)
        workers = [int(w) for w in os.listdir(out / "workers") if running(w)]
        assert len(workers) == 2, workers
        if order == "term-then-kill":
            os.killpg(p.pid, signal.SIGTERM)
            time.sleep(0.3)
            assert all(running(w) for w in workers)  # held: the training process lives
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)  # (not communicate: the workers hold its pipes open)
        if order == "kill-then-term":
            assert all(running(w) for w in workers)
            os.killpg(p.pid, signal.SIGTERM)  # the group outlives its leader while the workers live
        end = time.monotonic() + 30
        while any(running(w) for w in workers) and time.monotonic() < end:
            time.sleep(0.01)
        assert [w for w in workers if running(w)] == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for w in os.listdir(out / "workers") if (out / "workers").exists() else []:
            if running(w):
                os.kill(int(w), signal.SIGKILL)


def test_other_children_forked_in_a_range_still_take_sigterm(tmp_path):
    """Only Paddle's DataLoader workers are shielded: a process the script forks itself ends on the job's SIGTERM."""
    code = textwrap.dedent(f"""
        import multiprocessing, os, time
        import paddle_acp as acp
        def sleep():
            open({str(tmp_path / "stopping")!r}, "w").close()  # the child runs its own code: the fork is done
            time.sleep(60)
        for epoch in acp.train_epoch_range(1, 0):
            child = multiprocessing.get_context("fork").Process(target=sleep, daemon=True)
            child.start()
            while not os.path.exists({str(tmp_path / "stopped")!r}):
                time.sleep(0.01)
        child.join(30)
        print("child exitcode", child.exitcode, flush=True)
    """)
    env = dict(os.environ, PADDLE_ACP_CHECKPOINT_URI=str(tmp_path / "ck"), PADDLE_ACP_EXIT_ON_PREEMPT="0")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    o, e, _ = act_when_held(p, tmp_path, lambda p: os.killpg(p.pid, signal.SIGTERM))
    assert p.returncode == 0, e[-3000:]
    assert f"child exitcode {-signal.SIGTERM}" in o
