"""What the log says, said plainly (issue 27, item 5): a loop left with ``break`` leaves that epoch
unsaved and says so; no "waited ... for the previous checkpoint" when nothing was in flight; the resume
line says which epoch the checkpoint holds; the SIGTERM line promises a batch boundary only under
``paddle_acp.resumable``. Real processes of tests/scripts/check_script.py.
"""
import os
import signal
import subprocess
import sys
import time

from support.e2e import script_env

from paddle_acp.tools import check_report as report

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SCRIPT = os.path.join(HERE, "scripts", "check_script.py")


def _env(tmp_path, epochs, interval="0", **extra):
    env = {"PADDLE_ACP_CHECKPOINT_URI": str(tmp_path / "ckpt"), "PADDLE_JOB_ID": "plain",
           "PADDLE_ACP_SAVE_INTERVAL": interval, "PADDLE_ACP_CHECK_EPOCHS": str(epochs)}
    env.update(extra)
    return script_env(ir="pir", env=env)


def run(tmp_path, epochs, *args, interval="0"):
    proc = subprocess.run([sys.executable, SCRIPT, "--sleep", "0", *args], env=_env(tmp_path, epochs, interval),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def test_final_save_with_nothing_in_flight_logs_no_wait(tmp_path):
    out = run(tmp_path, 2, interval="900")  # one checkpoint only: after the last epoch
    assert "saved checkpoint ckpt-e1 (epoch 1)" in out, out[-4000:]
    assert "waited" not in out, out[-4000:]


def test_resume_line_says_which_epoch_the_checkpoint_holds(tmp_path):
    run(tmp_path, 2)  # checkpoints ckpt-e0 (epoch 0) and ckpt-e1 (epoch 1)
    out = run(tmp_path, 3)
    assert "resuming at epoch 2 from checkpoint ckpt-e1 (" in out and "): it holds the state after epoch 1" in out, out[-4000:]


def test_break_leaves_the_epoch_unsaved_and_says_so(tmp_path):
    out = run(tmp_path, 5, "--break-at", "1")
    assert ("range _range_0: the loop was left inside epoch 1 (break, return or an exception): epoch 1 is not "
            "saved; a restart trains it again from the last checkpoint before it") in out, out[-4000:]
    assert "(epoch 1)" not in out  # no checkpoint of epoch 1
    out = run(tmp_path, 3)
    assert "resuming at epoch 1 from checkpoint ckpt-e0 (" in out and "it holds the state after epoch 0" in out, out[-4000:]


def _sigterm_line(tmp_path, *args):
    digests = tmp_path / "d.jsonl"
    env = _env(tmp_path, 50, PADDLE_ACP_CHECK_DIGESTS=str(digests))
    proc = subprocess.Popen([sys.executable, SCRIPT, "--sleep", "0.1", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # inside epoch 1: its start record is the last one
            recs = report.read_records(str(digests))
            if recs and recs[-1]["kind"] == "start" and recs[-1]["epoch"] >= 1:
                break
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            time.sleep(0.01)
        time.sleep(0.15)  # inside the epoch's batches
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out[-4000:]
    return [line for line in out.splitlines() if "received SIGTERM" in line], out


def test_sigterm_line_without_resumable_promises_the_epoch_end(tmp_path):
    lines, out = _sigterm_line(tmp_path)
    assert len(lines) == 1 and "checkpointing at the end of epoch" in lines[0], out[-4000:]
    assert "this epoch's batches do not go through paddle_acp.resumable, so not before" in lines[0]
    assert "step" not in lines[0] and "batch boundary" not in lines[0]


def test_sigterm_line_with_resumable_promises_the_next_batch(tmp_path):
    lines, out = _sigterm_line(tmp_path, "--resumable")
    assert len(lines) == 1 and lines[0].endswith("received SIGTERM: checkpointing at the next batch boundary "
                                                 "(paddle_acp.resumable)"), out[-4000:]
