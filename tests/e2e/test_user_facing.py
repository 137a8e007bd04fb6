"""What a new user hits (issue 19, items 14, 16-19, 22), each with real processes or real
Paddle programs:

* Ctrl-C during a synchronous save stops the process, the last checkpoint intact (14);
* a finished job rerun after the model changed fails clearly, nothing written into the scope,
  and an error inside a range is not followed by noise at interpreter exit (16);
* the start of a range says when and where checkpoints will be taken (17);
* invalid PADDLE_ACP_LOG_LEVEL / PADDLE_TRAINER_ID are ConfigErrors naming the variable (18);
* restored tensors go to their own place (22).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import JOB_ID, REPO, describe, is_done, read_log, run_script, script_cmd, script_env  # noqa: E402

from paddle_acp import config  # noqa: E402
from paddle_acp.errors import ConfigError  # noqa: E402


def _python(code, env_extra, timeout=120):
    env = script_env(None, "pir", env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


# -- 18: invalid values are ConfigErrors naming the variable ------------------------------------
@pytest.mark.parametrize("name,value,want", [
    ("PADDLE_ACP_LOG_LEVEL", "LOUD", "PADDLE_ACP_LOG_LEVEL='LOUD' is not a log level"),
    ("PADDLE_TRAINER_ID", "x", "PADDLE_TRAINER_ID='x' is not an integer"),
    ("PADDLE_TRAINER_ID", "-1", "PADDLE_TRAINER_ID='-1' must be >= 0"),
    ("PADDLE_ACP_CONNECT_TIMEOUT", "0", "PADDLE_ACP_CONNECT_TIMEOUT='0' must be a number of seconds > 0"),
])
def test_invalid_variable_is_a_config_error(name, value, want):
    with pytest.raises(ConfigError) as e:
        config.from_env({name: value, "PADDLE_ACP_CHECKPOINT_URI": "/tmp/x"})
    assert want in str(e.value)


@pytest.mark.parametrize("name,value,want", [
    ("PADDLE_ACP_LOG_LEVEL", "LOUD", "PADDLE_ACP_LOG_LEVEL='LOUD' is not a log level"),
    ("PADDLE_TRAINER_ID", "x", "PADDLE_TRAINER_ID='x' is not an integer"),
])
def test_invalid_variable_fails_at_import_before_paddle(name, value, want):
    """Importing paddle_acp with a bad value raises ConfigError before Paddle is imported (Paddle's
    hapi logger would otherwise fail on PADDLE_TRAINER_ID=x with a bare ValueError)."""
    proc = _python("import sys\ntry:\n    import paddle_acp\nexcept Exception as e:\n"
                   "    print(type(e).__name__, e, 'paddle' in sys.modules)\n    raise SystemExit(3)",
                   {name: value})
    assert proc.returncode == 3, describe(proc)
    assert proc.stdout.startswith("ConfigError " + want), describe(proc)
    assert proc.stdout.strip().endswith("False"), describe(proc)  # Paddle was not imported
    assert "hapi" not in proc.stderr, describe(proc)


def test_log_level_is_case_insensitive():
    assert config.log_level_from_env({"PADDLE_ACP_LOG_LEVEL": " debug "}) == "DEBUG"
    assert config.log_level_from_env({}) == "INFO"
    assert config.connect_timeout_from_env({}) == 30.0
    assert config.connect_timeout_from_env({"PADDLE_ACP_CONNECT_TIMEOUT": "2.5"}) == 2.5


# -- 17: the plan is logged at the start of a range ----------------------------------------------
def test_start_says_when_and_where_checkpoints_are_taken(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = run_script(tmp_path / "out", ckpt, "pir", "--epochs", 2, "--steps-per-epoch", 1,
                      "--interval", 900, timeout=300)
    assert proc.returncode == 0, describe(proc)
    where = f"{ckpt}/{JOB_ID}/range/_range_0"
    lines = [x for x in proc.stderr.splitlines() if "checkpoints go to" in x]
    assert len(lines) == 1, describe(proc)
    assert where in lines[0] and "900 s" in lines[0] and "after the last epoch (1)" in lines[0], lines[0]
    # the rerun of the finished range has nothing to plan
    proc = run_script(tmp_path / "out2", ckpt, "pir", "--epochs", 2, "--steps-per-epoch", 1, timeout=300)
    assert proc.returncode == 0 and "checkpoints go to" not in proc.stderr, describe(proc)


# -- 16: a finished job rerun after the model changed --------------------------------------------
def test_finished_job_rerun_with_changed_model_fails_clearly(tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = run_script(tmp_path / "a", ckpt, "pir", "--epochs", 2, "--steps-per-epoch", 1, "--hidden", 64)
    assert proc.returncode == 0 and is_done(tmp_path / "a"), describe(proc)
    # the same model again: the restored state reaches the scope, as before
    proc = run_script(tmp_path / "same", ckpt, "pir", "--epochs", 2, "--steps-per-epoch", 1, "--hidden", 64)
    assert proc.returncode == 0 and "nothing left to train" in proc.stdout, describe(proc)
    a = np.load(tmp_path / "a" / "final.npz")
    same = np.load(tmp_path / "same" / "final.npz")
    assert all(np.array_equal(a[k], same[k]) for k in a.files)
    # the layer is now 32 wide: a clear CheckpointError, no final.npz with the old (16, 64) state
    proc = run_script(tmp_path / "b", ckpt, "pir", "--epochs", 2, "--steps-per-epoch", 1, "--hidden", 32)
    assert proc.returncode != 0, describe(proc)
    assert "CheckpointError" in proc.stderr and "the model changed" in proc.stderr, describe(proc)
    assert "m0_fc1.w: checkpoint float32[16, 64], program float32[16, 32]" in proc.stderr, describe(proc)
    assert not (tmp_path / "b" / "final.npz").exists()
    assert "Exception ignored" not in proc.stderr, describe(proc)


def test_midrun_model_change_error_has_no_noise_at_exit(tmp_path):
    ckpt = tmp_path / "ckpt"
    # every epoch's checkpoint is taken (busy policy wait): the kill at epoch 2 finds one to resume from
    proc = run_script(tmp_path / "a", ckpt, "pir", "--epochs", 4, "--steps-per-epoch", 1, "--hidden", 64,
                      "--kill-at-epoch", 2, env={"PADDLE_ACP_BUSY_POLICY": "wait"})
    assert proc.returncode == -signal.SIGKILL, describe(proc)
    # the script keeps the generator in a variable: after the uncaught error it lives until the
    # interpreter exits, and was then closed with imports failing ("import of numpy halted")
    proc = run_script(tmp_path / "b", ckpt, "pir", "--epochs", 4, "--steps-per-epoch", 1, "--hidden", 32,
                      "--hold-range")
    assert proc.returncode == 1, describe(proc)
    assert "CheckpointError" in proc.stderr and "the script's model changed" in proc.stderr, describe(proc)
    assert "Exception ignored" not in proc.stderr and "halted" not in proc.stderr, describe(proc)


# -- 14: Ctrl-C during a synchronous save ------------------------------------------------------------
def _positions(range_dir):
    """Each position directory of the range (``ckpt-e<E>[-s<S>]``) with the names inside it."""
    out = {}
    try:
        names = os.listdir(range_dir)
    except FileNotFoundError:
        return out
    for n in names:
        try:
            out[n] = set(os.listdir(os.path.join(range_dir, n)))
        except (FileNotFoundError, NotADirectoryError):
            out[n] = None  # gone since the listing, or not a directory
    return out


def _saves(range_dir):
    """(positions whose part is being written: a ``rank-0.tmp-*`` inside, no ``rank-0`` nor ``global.json``
    yet; committed positions: ``global.json`` inside)."""
    pos = _positions(range_dir)
    pending = {n for n, inside in pos.items() if inside and "global.json" not in inside and "rank-0" not in inside
               and any(x.startswith("rank-0.tmp-") for x in inside)}
    return pending, {n for n, inside in pos.items() if inside and "global.json" in inside}


def test_ctrl_c_during_synchronous_save_stops_the_process(tmp_path):
    """SIGINT delivered while a synchronous save is provably in progress (the process is frozen
    with SIGSTOP while its ckpt-eE/rank-0.tmp-* directory exists and neither ckpt-eE/rank-0 nor
    ckpt-eE/global.json does): the process must stop with KeyboardInterrupt, the partial save removed,
    the last checkpoint intact."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    range_dir = ckpt / JOB_ID / "range" / "_range_0"
    # ~110 MB of state (16 -> 500000 -> 1 with Adam): a save takes long enough to be caught in
    env = {"PADDLE_ACP_ASYNC": "0", "PADDLE_ACP_MAX_TO_KEEP": "2"}
    p = subprocess.Popen(script_cmd(out, ckpt, "--epochs", 40, "--steps-per-epoch", 1, "--hidden", 500000),
                         env=script_env(ckpt, "pir", env), cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    caught = None
    try:
        deadline = time.monotonic() + 400
        while caught is None and p.poll() is None and time.monotonic() < deadline:
            pending, _ = _saves(range_dir)
            if not pending:
                time.sleep(0.001)
                continue
            os.kill(p.pid, signal.SIGSTOP)
            pending2, done2 = _saves(range_dir)
            if pending2 and done2:  # frozen inside a save (not renamed yet) that has a predecessor
                caught = (sorted(pending2)[0], sorted(done2))
                os.kill(p.pid, signal.SIGINT)
            os.kill(p.pid, signal.SIGCONT)
            if caught is None:
                time.sleep(0.05)  # that save ended before the freeze: catch the next one
        stdout, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    proc = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    assert caught is not None, "no save was caught in progress: " + describe(proc)
    assert p.returncode in (-signal.SIGINT, 130, 1), describe(proc)
    assert "KeyboardInterrupt" in stderr, describe(proc)
    assert "checkpoint save interrupted by KeyboardInterrupt" in stderr, describe(proc)
    assert not is_done(out) and "training finished" not in stdout, describe(proc)
    pos = _positions(range_dir)
    tmps = {f"{n}/{x}" for n, inside in pos.items() for x in (inside or ()) if ".tmp-" in x}
    tmps |= {n for n in pos if ".tmp-" in n}
    assert tmps == set(), f"the interrupted save left {tmps} behind"
    _, done = _saves(range_dir)
    assert done and set(pos) <= set(caught[1]) | {caught[0]}, (pos, caught)
    verify = subprocess.run([sys.executable, "-m", "paddle_acp", "verify", str(ckpt)], cwd=REPO,
                            env=script_env(None, "pir"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=300)
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stdout
    # epochs logged so far are all the process trained: it did not go on after Ctrl-C
    epochs = [e["epoch"] for e in read_log(out)]
    assert epochs == list(range(len(epochs))) and len(epochs) < 40, epochs


# -- 22: places ----------------------------------------------------------------
def test_unrestored_state_is_written_to_each_tensors_own_place():
    """A finished range restarted: the restored state goes into the global scope on the place each
    variable lives on (here the CPU; on a GPU job its GPU), and a variable the scope holds on no
    place yet lands on the CPU."""
    import paddle

    from paddle_acp.adapter.tensors import own_place, set_tensor

    scope = paddle.static.Scope()
    t = scope.var("acp_place_probe").get_tensor()
    assert isinstance(own_place(t), type(paddle.CPUPlace()))  # holds nothing yet: the CPU
    set_tensor(t, np.arange(6, dtype="float32").reshape(2, 3), None)
    assert t._place().is_cpu_place()
    assert isinstance(own_place(t), type(paddle.CPUPlace()))
    set_tensor(t, np.ones((3, 2), "float32"), None)  # replaced on the place it lives on
    assert t._place().is_cpu_place() and np.array_equal(np.array(t), np.ones((3, 2), "float32"))
