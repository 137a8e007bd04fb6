"""The state a script keeps itself survives SIGKILL: real processes, both IRs.

``tests/scripts/capture_script.py`` shuffles and adds noise with an RNG object it holds
(``np.random.default_rng(0)``, ``np.random.RandomState(0)`` or ``random.Random(0)``, at module
level or as a local of the frame that opens the loop), or drives a warmup factor (fed through
``feed``) from a ``paddle_acp.Counter`` registered with ``train_epoch_range(state=...)``. Each
run is SIGKILLed inside an epoch, restarted, and must end with the per-step losses and final
parameters of an uninterrupted run without the library, bit for bit. Saves are synchronous
(``PADDLE_ACP_ASYNC=0``) so that the checkpoint the restart resumes from is known: the one of
epoch 0's end (epoch checkpoints) or of step 2 of epoch 1 (``save_every_steps=2``).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support.e2e import REPO, script_env
from support.paddle_compat import IRS

SCRIPT = os.path.join(REPO, "tests", "scripts", "capture_script.py")
VARIANTS = ("generator", "randomstate", "random", "counter")
KILL = "1:3"  # before step 3 of epoch 1


def start(out, ckpt, ir, *args, env=None):
    e = {"PADDLE_ACP_ASYNC": "0", "PADDLE_ACP_BUSY_POLICY": "wait"} if ckpt else {}
    return subprocess.Popen([sys.executable, SCRIPT, "--out", str(out), *map(str, args)], cwd=REPO,
                            env=script_env(ckpt, ir, {**e, **(env or {})}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, expect_kill=False):
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    want = -9 if expect_kill else 0
    assert proc.returncode == want, f"rc {proc.returncode} (want {want})\n{stderr[-4000:]}"
    return stderr


def run(out, ckpt, ir, *args, expect_kill=False, env=None):
    return finish(start(out, ckpt, ir, *args, env=env), expect_kill)


def steps(out):
    """(epoch, step) -> (batch, loss hex) of the last run that trained it."""
    got = {}
    with open(os.path.join(str(out), "steps.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            got[(e["epoch"], e["step"])] = (e["batch"], e["loss"])
    return got


def params(out):
    with np.load(os.path.join(str(out), "final.npz")) as z:
        return {k: z[k].copy() for k in z.files}


_refs: dict = {}


def reference(tmp_path_factory, ir, variant, where="global"):
    key = (ir, variant, where)
    if key not in _refs:
        out = tmp_path_factory.mktemp(f"ref-{ir}-{variant}-{where}")
        run(out, None, ir, "--rng", variant, "--where", where)
        _refs[key] = (steps(out), params(out))
    return _refs[key]


def kill_and_resume(tmp_path, ir, variant, *args):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    run(out, ckpt, ir, "--rng", variant, "--kill-at", KILL, *args, expect_kill=True)
    return out, run(out, ckpt, ir, "--rng", variant, "--kill-at", KILL, *args)


def assert_identical(out, ref, stderr):
    ref_steps, ref_params = ref
    got = steps(out)
    differ = [k for k in sorted(ref_steps) if got.get(k) != ref_steps[k]]
    assert not differ, f"steps that differ from the uninterrupted run: {differ[:6]}\n{stderr[-3000:]}"
    p = params(out)
    assert sorted(p) == sorted(ref_params)
    for k in p:
        assert p[k].tobytes() == ref_params[k].tobytes(), k


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("ir", IRS)
def test_killed_inside_an_epoch_resumes_from_the_epoch_checkpoint_bit_identically(tmp_path, tmp_path_factory, ir, variant):
    out, stderr = kill_and_resume(tmp_path, ir, variant)
    assert "resuming at epoch 1 from checkpoint" in stderr
    assert_identical(out, reference(tmp_path_factory, ir, variant), stderr)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("ir", IRS)
def test_killed_inside_an_epoch_resumes_mid_epoch_bit_identically(tmp_path, tmp_path_factory, ir, variant):
    out, stderr = kill_and_resume(tmp_path, ir, variant, "--save-every-steps", 2)
    assert "resuming at epoch 1, step 2" in stderr
    assert_identical(out, reference(tmp_path_factory, ir, variant), stderr)
    named = {"generator": "module_global:rng (numpy.Generator[PCG64])", "randomstate": "module_global:rng (numpy.RandomState)",
             "random": "module_global:rng (random.Random)", "counter": "the state step (Counter)"}[variant]
    assert "every checkpoint also saves" in stderr and named in stderr


@pytest.mark.parametrize("ir", IRS)
def test_an_rng_that_is_a_local_of_the_loops_frame_is_captured(tmp_path, tmp_path_factory, ir):
    out, stderr = kill_and_resume(tmp_path, ir, "generator", "--where", "local", "--save-every-steps", 2)
    assert "local:rng (numpy.Generator[PCG64])" in stderr and "module_global:rng" not in stderr
    assert_identical(out, reference(tmp_path_factory, ir, "generator", "local"), stderr)


def test_an_unregistered_counter_does_not_resume_identically(tmp_path, tmp_path_factory):
    """The control: the test above can tell (a plain int counter restarts at 0)."""
    out, stderr = kill_and_resume(tmp_path, "pir", "counter", "--no-register", "--save-every-steps", 2)
    ref_steps, _ = reference(tmp_path_factory, "pir", "counter")
    assert steps(out) != ref_steps
    assert "every checkpoint also saves" not in stderr


def test_an_object_renamed_since_the_checkpoint_is_named_in_one_warning(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    run(out, ckpt, "pir", "--rng", "generator", "--kill-at", KILL, expect_kill=True)
    stderr = run(out, ckpt, "pir", "--rng", "generator", "--where", "local")
    warnings = [line for line in stderr.splitlines() if "WARNING" in line and "script state" in line]
    assert any("local:rng" in w and "does not hold" in w for w in warnings), stderr[-3000:]
    assert any("module_global:rng" in w and "no such object" in w for w in warnings), stderr[-3000:]
    assert len([w for w in warnings if "local:rng" in w]) == 1


def test_each_rank_resumes_its_own_rng(tmp_path, tmp_path_factory):
    """Two ranks (per-rank state) whose RNGs are seeded by their rank: each rank's part holds its own."""
    ckpt = tmp_path / "ckpt"
    args = ("--rng", "generator", "--seed-by-rank", "--save-every-steps", 2)
    refs = []
    for rank in range(2):
        out = tmp_path_factory.mktemp(f"ref-rank{rank}")
        run(out, None, "pir", *args, env={"PADDLE_TRAINER_ID": rank})
        refs.append((steps(out), params(out)))
    assert refs[0][0] != refs[1][0]  # the ranks' state differs

    def both(expect_kill):
        env = {"PADDLE_TRAINERS_NUM": 2, "PADDLE_ACP_RANK_STATE": "per-rank"}
        procs = [start(tmp_path / f"rank{r}", ckpt, "pir", *args, "--kill-at", KILL, env={**env, "PADDLE_TRAINER_ID": r})
                 for r in range(2)]
        return [finish(p, expect_kill) for p in procs]

    both(expect_kill=True)
    stderrs = both(expect_kill=False)
    for rank in range(2):
        assert "resuming at epoch 1, step 2" in stderrs[rank], stderrs[rank][-3000:]
        assert_identical(tmp_path / f"rank{rank}", refs[rank], stderrs[rank])
