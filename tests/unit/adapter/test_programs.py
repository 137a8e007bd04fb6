"""Tests for paddle_acp.adapter.programs: training-program detection, fingerprints,
persistables and the per-program cache, under PIR and legacy IR.

Legacy IR is selected in-process with ``paddle.pir_utils.OldIrGuard()`` (2.6: its default)
(see ``models.ir_mode``); the guard covers building and running.
"""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from paddle_acp.adapter.programs import is_training_program, program_info

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from support import models  # noqa: E402
from support.models import IRS, KINDS, NON_TRAIN_KINDS, TRAIN_KINDS, ir_mode  # noqa: E402
from support.paddle_compat import PIR_SUPPORTED  # noqa: E402

pir_only = pytest.mark.skipif(not PIR_SUPPORTED, reason="PIR programs are refused on Paddle 2.6 "
                              "(tests/e2e/test_paddle_version.py checks the refusal there)")

paddle.enable_static()


def build(ir, kind):
    """Build ``kind`` under ``ir`` (in a fresh unique_name scope)."""
    with ir_mode(ir):
        return models.build(kind)


def compiled(program):
    """A legacy ``CompiledProgram`` around ``program`` (call inside OldIrGuard)."""
    return paddle.static.CompiledProgram(program)


# -- training-program detection --------------------------------------------------
@pytest.mark.parametrize("kind", TRAIN_KINDS)
@pytest.mark.parametrize("ir", IRS)
def test_training_program_detected(ir, kind):
    with ir_mode(ir):
        main, startup, ex = models.build(kind)
        info = program_info(main)
        assert info.ir == ir
        assert info.has_backward and info.has_optimizer, info
        assert info.is_training
        assert is_training_program(main) is True
        assert is_training_program(startup) is False
        assert is_training_program(ex["eval"]) is False, \
            "eval clone made before minimize is not a training program"
        if ir == "legacy":
            assert is_training_program(compiled(main)) is True
            assert is_training_program(compiled(startup)) is False
            assert is_training_program(compiled(ex["eval"])) is False


@pytest.mark.parametrize("kind", NON_TRAIN_KINDS)
@pytest.mark.parametrize("ir", IRS)
def test_non_training_programs(ir, kind):
    with ir_mode(ir):
        main, startup, ex = models.build(kind)
        info = program_info(main)
        assert info.ir == ir
        assert not info.has_backward and not info.has_optimizer, info
        assert is_training_program(main) is False
        assert is_training_program(startup) is False
        if ir == "legacy":
            assert is_training_program(compiled(main)) is False
            assert is_training_program(compiled(startup)) is False
        else:
            # PIR programs cannot be wrapped (Paddle 3.3.1 raises TypeError).
            with pytest.raises(TypeError):
                paddle.static.CompiledProgram(main)
        if kind == "eval":
            assert is_training_program(ex["train"]) is True


@pytest.mark.parametrize("obj", [None, "program", 3, object()])
def test_not_a_program_is_not_training(obj):
    assert is_training_program(obj) is False


# -- fingerprints ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ir", IRS)
def test_fingerprint_stable_across_builds(ir, kind):
    a, _, _ = build(ir, kind)
    b, _, _ = build(ir, kind)
    assert a is not b
    ia, ib = program_info(a), program_info(b)
    assert ia is not ib
    assert ia.fingerprint and ia.fingerprint == ib.fingerprint
    assert ia.persistables == ib.persistables
    assert ia.is_training == ib.is_training


_FP_SCRIPT = """
import json, sys
sys.path.insert(0, %r)
from support import models
from paddle_acp.adapter.programs import program_info
out = {}
for ir in models.IRS:
    with models.ir_mode(ir):
        # reversed: the build order must not matter in a fresh process either
        out[ir] = {k: program_info(models.build(k)[0]).fingerprint
                   for k in reversed(models.KINDS)}
print("FINGERPRINTS=" + json.dumps(out))
""" % HERE


@pytest.fixture(scope="module")
def subprocess_fingerprints():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PADDLE_ACP_", "PADDLE_EDL_"))
           and k not in ("FLAGS_enable_pir_api", "PADDLE_JOB_ID")}
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOG_minloglevel", "2")
    proc = subprocess.run([sys.executable, "-c", _FP_SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines()
             if ln.startswith("FINGERPRINTS=")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1].split("=", 1)[1])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ir", IRS)
def test_fingerprint_stable_across_processes(ir, kind, subprocess_fingerprints):
    main, _, _ = build(ir, kind)
    assert program_info(main).fingerprint == subprocess_fingerprints[ir][kind]


@pytest.mark.parametrize("kind", TRAIN_KINDS)
@pytest.mark.parametrize("ir", IRS)
def test_fingerprint_differs_for_eval_clone(ir, kind):
    main, _, ex = build(ir, kind)
    train, ev = program_info(main), program_info(ex["eval"])
    assert train.fingerprint != ev.fingerprint
    # the eval clone still holds the parameters, but no optimizer state
    assert set(ex["params"]) <= set(ev.persistables)
    assert not set(ex["accumulators"]) & set(ev.persistables)


@pytest.mark.parametrize("ir", IRS)
def test_fingerprint_differs_between_models(ir):
    kinds = TRAIN_KINDS + ("forward",)
    fps = {k: program_info(build(ir, k)[0]).fingerprint for k in kinds}
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            if ir == "legacy" and {a, b} == {"adam", "adam_lr"}:
                # In legacy IR an LR scheduler adds nothing to the program
                # (the executor feeds learning_rate_0 from sched()); the two
                # programs are structurally identical, so are their
                # fingerprints.  The scheduler is saved separately.
                continue
            assert fps[a] != fps[b], (a, b)


@pytest.mark.parametrize("ir", IRS)
def test_eval_kind_matches_forward_network(ir):
    """The eval clone (before minimize) is the forward network: same fingerprint
    as the forward-only program, different from its training program."""
    ev, _, ex = build(ir, "eval")
    fwd, _, _ = build(ir, "forward")
    assert program_info(ev).fingerprint == program_info(fwd).fingerprint
    assert program_info(ev).fingerprint != program_info(ex["train"]).fingerprint


# -- persistables ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ir", IRS)
def test_persistables(ir, kind):
    with ir_mode(ir):
        main, startup, ex = models.build(kind)
        persist = program_info(main).persistables
        assert len(persist) == len(set(persist))
        names = set(persist)
        params = set(ex["params"])
        if ir == "legacy":
            assert {p.name for p in main.all_parameters()} == params
        assert params <= names, params - names
        assert set(ex["accumulators"]) <= names, set(ex["accumulators"]) - names
        if kind in ("adam", "adamw", "adam_lr", "dropout"):
            assert "fc1.w_moment1_0" in names and "fc2.b_moment2_0" in names
        if kind in ("momentum", "momentum_clip"):
            assert "fc1.w_velocity_0" in names
        expected = params | set(ex["accumulators"])
        if ex["lr_name"]:
            assert ex["lr_name"] == "learning_rate_0"
            expected.add(ex["lr_name"])
        else:
            assert "learning_rate_0" not in names
        for feed in ex["feed_names"]:
            assert feed not in names
        assert names == expected, (sorted(names ^ expected))


# -- cache and running -------------------------------------------------------------
@pytest.mark.parametrize("ir", IRS)
def test_info_is_cached(ir):
    with ir_mode(ir):
        main, startup, ex = models.build("adam")
        info = program_info(main)
        assert program_info(main) is info
        assert program_info(startup) is program_info(startup)
        assert program_info(startup) is not info
        if ir == "legacy":
            assert program_info(compiled(main)) is info
            cp_ev = compiled(ex["eval"])
            assert program_info(cp_ev) is program_info(ex["eval"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ir", IRS)
def test_info_after_running(ir, kind):
    with ir_mode(ir):
        main, startup, ex = models.build(kind)
        info = program_info(main)
        loss = models.run_once(main, startup, ex)
        assert np.isfinite(loss)
        assert program_info(main) is info
        assert is_training_program(main) is (kind in TRAIN_KINDS)
        if ir == "legacy":
            cp = compiled(main)
            assert np.isfinite(models.run_once(cp, startup, ex))
            assert program_info(cp) is info
            assert is_training_program(cp) is (kind in TRAIN_KINDS)

        # Analysed for the first time only after a run: same result as a
        # program that never ran (running does not change the fingerprint).
        ran, startup2, ex2 = models.build(kind)
        models.run_once(ran, startup2, ex2)
        fresh, _, _ = models.build(kind)
        assert program_info(ran) == program_info(fresh)
        assert program_info(ran).fingerprint == info.fingerprint


@pytest.mark.parametrize("ir", IRS)
def test_training_then_eval_run(ir):
    """Running the eval clone (before minimize) works and stays non-training."""
    with ir_mode(ir):
        main, startup, ex = models.build("dropout")
        assert np.isfinite(models.run_once(ex["eval"], startup, ex,
                                           loss=ex["eval_loss"]))
        assert is_training_program(ex["eval"]) is False
        assert is_training_program(main) is True


# -- control flow (PIR sub-blocks) -------------------------------------------------
def _cond_model(branch):
    """Training program whose whole loss (and so its backward) sits in a
    ``paddle.static.nn.cond``; the optimizer ops stay at the top level."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), \
            paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 4], "float32")
        flag = paddle.static.data("flag", [1], "bool")
        w = paddle.create_parameter([4, 1], "float32", name="cw")
        loss = paddle.static.nn.cond(
            flag, lambda: paddle.mean(paddle.matmul(x, w)),
            lambda: paddle.mean(branch(paddle.matmul(x, w))))
        paddle.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss


@pir_only
def test_pir_training_program_with_backward_inside_cond():
    """PIR: backward ops that live only in the blocks of a ``pd_op.if`` must
    count.  This program trains (the parameter changes on a run)."""
    with ir_mode("pir"):
        main, startup, loss = _cond_model(lambda v: v * 2.0)
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            scope = paddle.static.global_scope()
            exe.run(startup)
            w0 = np.array(scope.find_var("cw").get_tensor())
            exe.run(main, feed={"x": np.ones((2, 4), "float32"),
                                "flag": np.array([True])}, fetch_list=[loss])
            w1 = np.array(scope.find_var("cw").get_tensor())
        assert not np.allclose(w0, w1), "the cond model did not train"
        info = program_info(main)
        assert info.has_optimizer
        assert info.has_backward, info
        assert is_training_program(main) is True


@pir_only
def test_pir_fingerprint_sees_ops_inside_cond():
    """PIR: two programs that differ only inside a ``cond`` branch must not
    share a fingerprint."""
    with ir_mode("pir"):
        a, _, _ = _cond_model(lambda v: v * 2.0)
        b, _, _ = _cond_model(paddle.nn.functional.relu)
        assert program_info(a).persistables == program_info(b).persistables
        assert program_info(a).fingerprint != program_info(b).fingerprint
