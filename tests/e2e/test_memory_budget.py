"""The host-memory budget (PADDLE_ACP_HOST_MEMORY) and sizing without copying, on real processes.

* A training run whose state is far larger than the budget: its peak resident memory (VmHWM of
  the process) stays within that of the same run without checkpointing plus the budget plus a
  small slack, the save streams in chunks (the metrics record says so), and a run SIGKILLed in the
  middle resumes bit-identically, its restore within the same bound.
* The same run with the default (adaptive) budget holds the whole state in its snapshot buffer:
  its peak is higher by about the state, which shows the measurement can tell the two apart; a
  restart of it restores into that buffer: its peak stays within 64 MiB of the run from scratch.
* Registration sizes the snapshot buffer from each tensor's element count and dtype: no tensor is
  viewed or copied before the first save.

Cost: six training processes of a ~170 MB state, about a minute and a half on 2 cores.
"""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import assert_same_as_reference, describe, is_done, load_result, run_script  # noqa: E402
from support.server_fixtures import s3_server  # noqa: E402,F401  (fixture)

HIDDEN = 800_000  # 16 -> 800000 -> 1 MLP with Adam: ~173 MB of state
STATE = (16 * HIDDEN + HIDDEN + HIDDEN + 1) * 4 * 3  # parameters and Adam's two moments (float32)
BUDGET = 32 << 20
SLACK = 48 << 20  # threads, the copy's bookkeeping, allocator noise
RESTORE_SLACK = 64 << 20  # a restart's peak above the same run's from scratch (issue 44's bound)
# the killed run saves synchronously: its checkpoints of epochs 0 and 1 are committed when it kills itself at the
# start of epoch 2 (an asynchronous save of ~170 MB can still be running there on a loaded machine: no checkpoint
# to restore, and the restart trains from scratch); the restart, the run measured, saves as a default run does
SAVED_BEFORE_THE_KILL = {"PADDLE_ACP_ASYNC": "0"}
ARGS = ("--epochs", 4, "--steps-per-epoch", 2, "--hidden", HIDDEN, "--dropout", 0)


def peak(out):
    with open(os.path.join(str(out), "peak.rss")) as f:
        return int(f.read())


def train(tmp_path, name, ckpt, env=None, *extra):
    out = tmp_path / name
    proc = run_script(out, ckpt, "pir", *ARGS, "--peak-rss", out / "peak.rss", *extra, env=env, timeout=600)
    return out, proc


def metrics(ckpt):
    from support.e2e import JOB_ID

    path = os.path.join(str(ckpt), JOB_ID, "metrics", "trainer-0.jsonl")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("budget-ref")
    out, proc = train(tmp, "ref", None)
    assert proc.returncode == 0 and is_done(out), describe(proc)
    return load_result(out), peak(out)


def test_budget_bounds_peak_memory_and_resume_is_bit_identical(baseline, tmp_path):
    reference, p0 = baseline
    ckpt = tmp_path / "ckpt"
    env = {"PADDLE_ACP_HOST_MEMORY": "32MiB"}
    out, proc = train(tmp_path, "run", ckpt, dict(env, **SAVED_BEFORE_THE_KILL), "--kill-at-epoch", 2)
    assert proc.returncode == -9, describe(proc)
    assert "larger than the host-memory budget" in proc.stderr, describe(proc)
    saved = [m for m in metrics(ckpt) if m.get("event") == "saved"]
    assert saved and all(m["streamed"]["buffer"] <= BUDGET and m["streamed"]["chunks"] > STATE // BUDGET
                         for m in saved), saved
    out2, proc2 = train(tmp_path, "run", ckpt, env, "--kill-at-epoch", 2)  # the marker stops a second kill
    assert proc2.returncode == 0 and is_done(out2), describe(proc2)
    assert "resumed at epoch" in proc2.stdout, describe(proc2)
    assert_same_as_reference(load_result(out2), reference)
    # the resumed process restored (no mapping of the data file) and saved within the budget
    assert peak(out2) <= p0 + BUDGET + SLACK, (peak(out2) - p0) / 2**20


def test_budget_run_peak_without_kill(baseline, tmp_path):
    reference, p0 = baseline
    out, proc = train(tmp_path, "run", tmp_path / "ckpt", {"PADDLE_ACP_HOST_MEMORY": "32MiB"})
    assert proc.returncode == 0 and is_done(out), describe(proc)
    assert_same_as_reference(load_result(out), reference)
    assert peak(out) <= p0 + BUDGET + SLACK, (peak(out) - p0) / 2**20


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The run with checkpoints at the default (adaptive) budget, from scratch."""
    tmp = tmp_path_factory.mktemp("budget-default")
    return train(tmp, "run", tmp / "ckpt")


def test_default_budget_holds_the_whole_state(baseline, default_run):
    """The measurement's sensitivity: with room to spare the snapshot buffer is the whole state."""
    reference, p0 = baseline
    out, proc = default_run
    assert proc.returncode == 0 and is_done(out), describe(proc)
    assert_same_as_reference(load_result(out), reference)
    assert peak(out) >= p0 + 0.75 * STATE, (peak(out) - p0) / 2**20
    assert "host-memory budget" not in proc.stderr


def test_default_budget_restore_lands_in_the_snapshot_buffer(baseline, default_run, tmp_path):
    """A restart at the default budget reads its checkpoint once, into the snapshot buffer the first save
    needs anyway: its peak stays within a small slack of the same run's without a checkpoint to restore
    (the data file stayed mapped from the range's open to the first run: +the whole state, issue 44)."""
    reference, _p0 = baseline
    fresh, _proc = default_run
    ckpt = tmp_path / "ckpt"
    out, proc = train(tmp_path, "run", ckpt, SAVED_BEFORE_THE_KILL, "--kill-at-epoch", 2)
    assert proc.returncode == -9, describe(proc)
    out2, proc2 = train(tmp_path, "run", ckpt, None, "--kill-at-epoch", 2)  # the marker stops a second kill
    assert proc2.returncode == 0 and is_done(out2) and "resumed at epoch" in proc2.stdout, describe(proc2)
    assert_same_as_reference(load_result(out2), reference)
    assert peak(out2) <= peak(fresh) + RESTORE_SLACK, (peak(out2) - peak(fresh)) / 2**20


def test_budget_on_s3_streams_saves_and_spools_the_restore(request, tmp_path):
    """Remote storage: saves stream through the budget's buffer (each chunk handed to the client as
    a copy), and a restore larger than the budget is verified into a local spool file, not memory."""
    srv = request.getfixturevalue("s3_server")
    uri = f"s3://{srv.bucket}/budget/{os.getpid()}-{tmp_path.name}"
    env = dict(srv.client_env(), PADDLE_ACP_HOST_MEMORY="16MiB", PADDLE_ACP_BUSY_POLICY="wait")
    args = ("--epochs", 3, "--steps-per-epoch", 2, "--hidden", 150_000, "--dropout", 0)  # ~32 MB of state
    ref = tmp_path / "ref"
    proc = run_script(ref, None, "pir", *args, timeout=600)
    assert proc.returncode == 0, describe(proc)
    out = tmp_path / "run"
    proc = run_script(out, uri, "pir", *args, "--kill-at-epoch", 2, env=env, timeout=600)
    assert proc.returncode == -9 and "larger than the host-memory budget" in proc.stderr, describe(proc)
    proc = run_script(out, uri, "pir", *args, "--kill-at-epoch", 2, env=env, timeout=600)
    assert proc.returncode == 0 and is_done(out), describe(proc)
    assert "resumed at epoch" in proc.stdout and "local spool file" in proc.stderr, describe(proc)
    assert_same_as_reference(load_result(out), load_result(ref))
