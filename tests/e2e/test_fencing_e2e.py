"""Writers that are no longer the live one, with real processes: every rank of every start
takes its own generation; a superseded process (SIGSTOPped at a deterministic point, resumed
after a new start of the job) deletes and commits nothing, and says so in one error line.

The stop points are the test scripts' ``ACP_TEST_STOP`` hook (tests/scripts/stop_hook.py):
the process stops itself at the first call of a named library function and, once resumed,
marks when that call returned or raised.
"""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from support.coord import COORDINATIONS, coord_env
from support.e2e import JOB_ID, REPO, SCRIPT, read_log, run_script, script_env, stopped

from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.layout import GLOBAL_NAME
from paddle_acp.storage import open_storage

RANK_SCRIPT = os.path.join(REPO, "tests", "scripts", "rank_train.py")
RANGE = "_range_0"
WAIT = {"PADDLE_ACP_BUSY_POLICY": "wait"}  # every save is attempted
# an error logged by paddle-acp (its own handler's format, or Paddle's when Paddle configured logging first)
ERROR_LINE = re.compile(r"^(?:\[paddle_acp\] ERROR |\[[-0-9 :,]+\] \[ *ERROR\] )", re.M)


def wait_for(pred, timeout, what, procs=(), logs=()):
    deadline = time.monotonic() + timeout
    while not pred():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(f"--- {lg} ---\n{lg.read_text()[-3000:]}" for lg in logs if lg.exists())
            raise AssertionError(f"{what}: {'a process ended' if dead else 'timed out'}\n{tails}")
        time.sleep(0.01)


def wait_stopped(proc, mark, log):
    wait_for(lambda: mark.exists() and stopped(proc.pid), 240, f"stop at {mark.name}", [proc], [log])


def spawn(cmd, env, log):
    with open(log, "w") as f:
        # not a session of its own: the kernel continues (SIGCONT) stopped members of an orphaned process group
        return subprocess.Popen([str(c) for c in cmd], env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)


def kill(*procs):
    for p in procs:
        if p.poll() is None:
            p.kill()  # (a stopped process dies of SIGKILL too)
            p.wait()


def test_superseded_single_writer_never_removes_the_new_writers_save(tmp_path):
    """(a) The old writer stops at the start of its first save; a new start of the job is in
    the middle of its own first save (its part ``ckpt-e0/rank-0.tmp-*`` written, not committed) when the old
    one resumes: the old one deletes nothing (the new directory is no leftover of its) and logs
    that it is fenced once; the new save commits and every later one too."""
    ckpt = tmp_path / "ckpt"
    rdir = ckpt / JOB_ID / "range" / RANGE
    args = ["--epochs", 3, "--steps-per-epoch", 1]
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    old = spawn([sys.executable, SCRIPT, "--out", tmp_path / "old"] + args,
                script_env(ckpt, "pir", {"ACP_TEST_STOP": f"save:{tmp_path / 'old.stop'}", **WAIT}), old_log)
    new = None
    try:
        wait_stopped(old, tmp_path / "old.stop", old_log)
        new = spawn([sys.executable, SCRIPT, "--out", tmp_path / "new"] + args,
                    script_env(ckpt, "pir", {"ACP_TEST_STOP": f"write:{tmp_path / 'new.stop'}", **WAIT}), new_log)
        wait_stopped(new, tmp_path / "new.stop", new_log)
        in_progress = [n for n in os.listdir(rdir / "ckpt-e0") if n.startswith("rank-0.tmp-")]
        assert len(in_progress) == 1, os.listdir(rdir / "ckpt-e0")
        os.kill(old.pid, signal.SIGCONT)  # the old writer's save goes on while the new one is mid-save
        wait_for(lambda: (tmp_path / "old.stop.done").exists(), 120, "the old writer's save", [old], [old_log])
        assert in_progress[0] in os.listdir(rdir / "ckpt-e0"), "the superseded writer removed the new writer's save in progress"
        os.kill(new.pid, signal.SIGCONT)
        assert new.wait(240) == 0, new_log.read_text()[-3000:]
        assert old.wait(240) is not None
    finally:
        kill(old, *([new] if new else []))
    old_out, new_out = old_log.read_text(), new_log.read_text()
    assert "checkpoint save failed" not in new_out, new_out[-3000:]
    committed = sorted(n for n in os.listdir(rdir) if (rdir / n / GLOBAL_NAME).exists())
    assert committed == ["ckpt-e0", "ckpt-e1", "ckpt-e2"], os.listdir(rdir)  # every save of the new writer committed
    # the old writer: fenced, said once, deleted and committed nothing
    assert "this writer (generation 0) is fenced" in old_out and "(generation 1)" in old_out, old_out[-3000:]
    assert len(ERROR_LINE.findall(old_out)) == 1, old_out[-3000:]
    assert "removing leftover" not in old_out, old_out[-3000:]
    assert [n for d in os.listdir(rdir) for n in os.listdir(rdir / d) if ".tmp-" in n] == [], os.listdir(rdir)


def test_a_zombie_writer_stops_with_an_error_instead_of_training_on_unsaved(tmp_path):
    """A writer still running (3000 epochs) when a restart of its job (80 epochs) starts: once a save of the
    old one is fenced, it raises FencedError at its next epoch end (a traceback, nonzero exit) instead of
    training on with nothing saved; the new one finishes and every checkpoint it keeps verifies."""
    ckpt, out_z, log_z = tmp_path / "ckpt", tmp_path / "zombie", tmp_path / "zombie.log"
    zombie = spawn([sys.executable, SCRIPT, "--out", out_z, "--epochs", 3000, "--steps-per-epoch", 1, "--sleep", 0.5],
                   script_env(ckpt, "pir"), log_z)
    try:
        wait_for(lambda: len(read_log(out_z)) >= 3, 120, "the zombie's first epochs", [zombie], [log_z])
        new = run_script(tmp_path / "new", ckpt, "pir", "--epochs", 80, "--steps-per-epoch", 1)
        assert new.returncode == 0, new.stderr[-3000:]
        rc = zombie.wait(120)  # (it would train for minutes on)
    finally:
        kill(zombie)
    out = log_z.read_text()
    assert rc == 1 and "FencedError" in out and "a newer incarnation of the job (writer generation 1) took over" in out, \
        out[-3000:]
    assert len(ERROR_LINE.findall(out)) == 1 and "removing leftover" not in out, out[-3000:]
    g = GlobalCheckpointer(open_storage(str(ckpt)), JOB_ID, RANGE, 0, 1)
    live = [e for e in g.scan() if e.committed]
    assert max(e.epoch_no for e in live) == 79, live  # the new writer's last epoch
    for e in live:
        g.verify(e.name)  # CorruptCheckpointError when the zombie deleted or replaced a part


SPELLINGS = """
import os, sys, numpy as np, paddle
paddle.enable_static()
import paddle_acp as acp
main, start = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, start):
    x = paddle.static.data("x", [4, 2], "float32")
    loss = paddle.mean(paddle.static.nn.fc(x, 1))
    paddle.optimizer.SGD(0.1).minimize(loss)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(start)
for uri in sys.argv[1:]:
    os.environ["PADDLE_ACP_CHECKPOINT_URI"] = uri
    for e in acp.train_epoch_range(2, save_checkpoint_inter=0):
        exe.run(main, feed={"x": np.ones((4, 2), "float32")}, fetch_list=[loss])
print("ALL DONE")
"""


def test_one_process_is_one_writer_however_the_location_is_spelled(tmp_path):
    """Ranges of one process whose PADDLE_ACP_CHECKPOINT_URI names one directory in other spellings (a trailing
    '/', './', a link) take one writer generation: the process never fences itself (it once stopped with
    FencedError naming a second writer that did not exist)."""
    (tmp_path / "s.py").write_text(SPELLINGS)
    ck = tmp_path / "ck"
    ck.mkdir()
    os.symlink(ck, tmp_path / "link")
    spellings = [str(ck), f"{ck}/", f"{tmp_path}/./ck", str(tmp_path / "link"), f"file://{ck}"]
    p = subprocess.run([sys.executable, str(tmp_path / "s.py"), *spellings], env=script_env(ck),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "ALL DONE" in p.stdout, p.stderr[-3000:]
    assert "fenced" not in p.stderr, p.stderr[-3000:]
    assert sorted(os.listdir(ck / JOB_ID / "writers")) == ["gen-0"]


def rank_cmd(tmp, r, outs):
    return [sys.executable, RANK_SCRIPT, "--out", tmp / outs / f"r{r}", "--kind", "tp", "--epochs", 2,
            "--barrier", tmp / "barrier", "--barrier-timeout", 600]


def rank_env(ckpt, r, gen, extra=None):
    e = {"PADDLE_TRAINER_ID": r, "PADDLE_TRAINERS_NUM": 2, "ACP_TEST_GEN": gen, "PADDLE_ACP_PART_TIMEOUT": 60,
         "PADDLE_ACP_RANK_STATE": "per-rank"}
    return script_env(ckpt, "pir", {**e, **(extra or {})})


@pytest.mark.parametrize("coordination", COORDINATIONS)
@pytest.mark.parametrize("stale", [0, 1])
def test_superseded_rank_never_touches_the_live_jobs_checkpoint(tmp_path, stale, coordination):
    """(b) rank 0, (c) rank 1 of a first start of a two-rank job stops in its first save, at the start of
    the part's data write (the other rank of that start is killed); a second start of the job trains and
    commits the same positions; the stale rank then resumes: it deletes nothing of the live
    job's checkpoint (every committed checkpoint still verifies, part for part) and logs once
    that it is fenced. On both coordination paths (each start of the job with a store of its own)."""
    ckpt = tmp_path / "ckpt"
    logs = {r: tmp_path / f"a{r}.log" for r in (0, 1)}
    mark = tmp_path / "stale.stop"
    coord_a, coord_b = coord_env(coordination), coord_env(coordination)
    a = {r: spawn(rank_cmd(tmp_path, r, "a"), rank_env(ckpt, r, "a", {**coord_a, "ACP_TEST_STOP": f"write:{mark}"}
                                                                 if r == stale else coord_a), logs[r]) for r in (0, 1)}
    b = {}
    try:
        wait_stopped(a[stale], mark, logs[stale])
        kill(a[1 - stale])  # the launcher restarts the job; this one process is left behind, stopped
        for r in (0, 1):
            b[r] = spawn(rank_cmd(tmp_path, r, "b"), rank_env(ckpt, r, "b", coord_b), tmp_path / f"b{r}.log")
        for r in (0, 1):
            assert b[r].wait(300) == 0, (tmp_path / f"b{r}.log").read_text()[-3000:]
        st = open_storage(str(ckpt))
        g = GlobalCheckpointer(st, JOB_ID, RANGE, 0, 2)
        live = [e.name for e in g.scan() if e.committed]
        assert live == ["ckpt-e0", "ckpt-e1"], live
        os.kill(a[stale].pid, signal.SIGCONT)
        wait_for(lambda: (tmp_path / "stale.stop.done").exists(), 120, "the stale rank's write of its part", [a[stale]],
                 [logs[stale]])
        deadline = time.monotonic() + 20  # what the rest of its save would do (it must do nothing)
        while time.monotonic() < deadline and "is fenced" not in logs[stale].read_text():
            time.sleep(0.05)
        time.sleep(1.0)
    finally:
        kill(*a.values(), *b.values())
    for name in live:
        g.verify(name)  # CorruptCheckpointError when a part was deleted or replaced
    out = logs[stale].read_text()
    who = "this writer" if stale == 0 else "this writer of rank 1"
    assert f"{who} (generation 0) is fenced" in out and "(generation 1)" in out, out[-3000:]
    assert len(ERROR_LINE.findall(out)) == 1, out[-3000:]
