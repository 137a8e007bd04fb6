"""Mid-epoch resume (paddle_acp.resumable) and preemption by SIGTERM, with real processes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "steps_script.py")
IRS = ["pir", "legacy"]


def run(out, ckpt, ir, *args, env_extra=None, timeout=120):
    env = dict(os.environ)
    env.pop("PADDLE_ACP_CHECKPOINT_URI", None)
    if ckpt is not None:
        env["PADDLE_ACP_CHECKPOINT_URI"] = str(ckpt)
    env["PADDLE_ACP_ASYNC"] = "0"
    if ir == "legacy":
        env["FLAGS_enable_pir_api"] = "0"
    env.update(env_extra or {})
    return subprocess.run([sys.executable, SCRIPT, "--out", str(out), *args], env=env, capture_output=True, text=True, timeout=timeout)


def steps(out):
    rows = {}
    order = []
    for line in open(os.path.join(out, "steps.jsonl")):
        r = json.loads(line)
        key = (r["epoch"], r["step"])
        if key in rows:
            assert rows[key] == r["loss"], f"step {key} re-trained with a different loss"
        rows[key] = r["loss"]
        order.append((key, r["pid"]))
    return rows, order


def params(out):
    z = np.load(os.path.join(out, "final.npz"))
    return {k: z[k] for k in z.files}


_refs = {}


def reference(tmp_path_factory, ir, *args):
    key = (ir,) + args
    if key not in _refs:
        out = tmp_path_factory.mktemp("ref")
        p = run(out, None, ir, *args)
        assert p.returncode == 0, p.stderr
        _refs[key] = (steps(out)[0], params(out))
    return _refs[key]


def assert_same(out, ref):
    got, _ = steps(out)
    assert got == ref[0]
    p = params(out)
    assert p.keys() == ref[1].keys()
    for k in p:
        assert np.array_equal(p[k], ref[1][k]), k


@pytest.mark.parametrize("ir", IRS)
def test_sigterm_mid_epoch_saves_exits_143_and_resumes_at_next_batch(tmp_path, tmp_path_factory, ir):
    ref = reference(tmp_path_factory, ir)
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = run(out, ck, ir, "--term-at", "1:3")
    assert p.returncode == 143, p.stderr[-3000:]
    _, order = steps(out)
    assert order[-1][0] == (1, 3)  # nothing trained after the signal's step
    p = run(out, ck, ir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed at epoch 1 step 4" in p.stdout
    _, order = steps(out)
    second = [k for k, pid in order if pid == order[-1][1]]
    assert second[0] == (1, 4)  # resumed at the next batch: no repeat, no skip
    assert_same(out, ref)


@pytest.mark.parametrize("ir", IRS)
def test_sigkill_mid_epoch_with_step_checkpoints(tmp_path, tmp_path_factory, ir):
    ref = reference(tmp_path_factory, ir)
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = run(out, ck, ir, "--save-every-steps", "3", "--kill-at", "1:5")
    assert p.returncode == -9
    p = run(out, ck, ir, "--save-every-steps", "3")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed at epoch 1 step 3" in p.stdout  # the last step checkpoint was after 3 batches
    assert_same(out, ref)


@pytest.mark.parametrize("loader", ["list", "dataloader", "stateful"])
def test_other_loaders_resume_mid_epoch(tmp_path, tmp_path_factory, loader):
    ref = reference(tmp_path_factory, "pir", "--loader", loader)
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = run(out, ck, "pir", "--loader", loader, "--term-at", "1:2")
    assert p.returncode == 143, p.stderr[-3000:]
    p = run(out, ck, "pir", "--loader", loader)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed at epoch 1 step 3" in p.stdout
    if loader == "stateful":
        assert "loader position restored through set_state_dict" in p.stdout
    assert_same(out, ref)


@pytest.mark.parametrize("ir", IRS)
def test_preemption_after_an_epochs_last_batch_resumes_exactly(tmp_path, tmp_path_factory, ir):
    """A SIGTERM after the epoch's last batch: the checkpoint is taken at the epoch's end, after
    the code that ends the epoch (here sched.step()). A mid-epoch checkpoint at that point would
    resume with no batch left to run, so the restore would come after sched.step(): the LR
    schedule, and every loss after it, would silently differ."""
    ref = reference(tmp_path_factory, ir)
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = run(out, ck, ir, "--term-at", "1:7")  # 8 batches: step 7 is the last
    assert p.returncode == 143, p.stderr[-3000:]
    p = run(out, ck, ir)
    assert p.returncode == 0, p.stderr[-3000:]
    _, order = steps(out)
    second = [k for k, pid in order if pid == order[-1][1]]
    assert second[0] == (2, 0)
    assert_same(out, ref)


def test_step_checkpoints_are_never_taken_after_an_epochs_last_batch(tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = run(out, ck, "pir", "--save-every-steps", "4", "--epochs", "2")  # 8 batches: 4 and (not) 8
    assert p.returncode == 0, p.stderr[-3000:]
    from support.newest import committed, part_dir

    from paddle_acp.format.manifest import Manifest
    from paddle_acp.storage import open_storage

    steps_seen = set()
    rng_dir = ck / "default" / "range" / "_range_0"
    names = sorted(d.name for d in rng_dir.iterdir())
    assert names == sorted(committed(open_storage(str(ck)), "default")), names
    for name in names:
        with open(os.path.join(part_dir(rng_dir, name), "manifest.json"), "rb") as f:
            m = Manifest.loads(f.read())
        steps_seen.add((m.range.epoch_no, m.range.step))
    assert all(step in (None, 4) for _, step in steps_seen), steps_seen


def test_a_checkpoint_after_the_last_batch_from_an_earlier_build_is_refused_clearly(tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = run(out, ck, "pir", "--term-at", "1:6")  # a mid-epoch checkpoint after 7 batches
    assert p.returncode == 143
    p = run(out, ck, "pir", "--batches", "7")  # now 7 batches: that checkpoint is after the last one
    assert p.returncode != 0
    assert "was taken after the last batch (7) of epoch 1" in p.stderr
    assert "Traceback" not in p.stderr.split("CheckpointError")[-1]


def test_fewer_batches_after_restart_is_a_clear_error(tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    p = run(out, ck, "pir", "--term-at", "1:6")
    assert p.returncode == 143
    p = run(out, ck, "pir", "--shrink")
    assert p.returncode != 0
    assert "the data changed since the checkpoint" in p.stderr
    assert "after 7 batches of epoch 1, but the data now yields only 5" in p.stderr


def test_sigterm_chains_to_user_handler_and_can_continue(tmp_path):
    code = r'''
import os, signal, sys
import paddle_acp as acp
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
for epoch in acp.train_epoch_range(3, 0):
    if epoch == 1:
        os.kill(os.getpid(), signal.SIGTERM)
print("seen", seen, "epochs done", acp.active_range() is None)
'''
    env = dict(os.environ, PADDLE_ACP_CHECKPOINT_URI=str(tmp_path / "ck"), PADDLE_ACP_EXIT_ON_PREEMPT="0")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "seen [15] epochs done True" in p.stdout
    env.pop("PADDLE_ACP_EXIT_ON_PREEMPT")
    p = subprocess.run([sys.executable, "-c", code.replace("epoch == 1", "epoch == 0")], env=dict(env, PADDLE_ACP_CHECKPOINT_URI=str(tmp_path / "ck2")), capture_output=True, text=True, timeout=120)
    assert p.returncode == 143
    assert "seen" not in p.stdout
