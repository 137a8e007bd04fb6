"""Small static-graph models for the tests, buildable under PIR and legacy IR.

Usage (the IR guard must cover building *and* running)::

    with ir_mode("legacy"):
        main, startup, extras = build("adam")
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        exe.run(main, feed=extras["feed"], fetch_list=[extras["loss"]])

Every builder returns ``(main, startup, extras)``; ``extras`` is a dict with

* ``kind``, ``ir``;
* ``loss`` (the loss value/variable of ``main``) and ``feed`` (a NumPy batch);
* ``feed_names``: the data variables (``("x", "y")``);
* ``params``: the parameter names (every parameter is named explicitly);
* ``accumulators``: the optimizer state names expected among the persistables;
* ``lr_name``: the learning-rate variable (``None`` for a forward-only program);
* ``eval`` / ``eval_loss``: the eval clone made *before* ``minimize``
  (legacy: ``clone(for_test=True)``; PIR: ``clone()``, which has no ``for_test``);
* ``optimizer``, ``scheduler`` (``None`` without an LR scheduler).
"""
from __future__ import annotations

import contextlib

import numpy as np
import paddle

paddle.enable_static()

IN_DIM, HIDDEN, BATCH = 8, 16, 4

from support.paddle_compat import IRS, legacy_ir_guard  # noqa: E402  (the IRs this Paddle supports)

#: Kinds whose ``main`` is a training program.
TRAIN_KINDS = ("sgd", "adam", "adamw", "momentum", "adam_lr", "dropout",
               "momentum_clip")
#: Kinds whose ``main`` is not a training program.
NON_TRAIN_KINDS = ("forward", "eval")
KINDS = TRAIN_KINDS + NON_TRAIN_KINDS

_ADAM_ACC = ("moment1_0", "moment2_0", "beta1_pow_acc_0", "beta2_pow_acc_0")
_MOMENTUM_ACC = ("velocity_0",)


@contextlib.contextmanager
def ir_mode(ir):
    """Select the IR for building and running programs in this process."""
    if ir == "legacy":
        guard = legacy_ir_guard()
    elif ir == "pir":
        guard = paddle.pir_utils.IrGuard()
    else:
        raise ValueError("ir must be one of %r, not %r" % (IRS, ir))
    paddle.enable_static()
    with guard:
        yield


def current_ir():
    return "pir" if paddle.framework.in_pir_mode() else "legacy"


def _clone_for_eval(main, loss):
    if current_ir() == "pir":
        mapping = paddle.pir.IrMapping()
        prog = main.clone(mapping)
        return prog, mapping.look_up(loss)
    return main.clone(for_test=True), loss


def _optimizer(kind, params):
    """(optimizer, scheduler, accumulator suffixes) for a training kind."""
    if kind == "sgd":
        return paddle.optimizer.SGD(learning_rate=0.1), None, ()
    if kind in ("adam", "dropout"):
        return paddle.optimizer.Adam(learning_rate=0.01), None, _ADAM_ACC
    if kind == "adamw":
        return (paddle.optimizer.AdamW(learning_rate=0.01, weight_decay=0.01),
                None, _ADAM_ACC)
    if kind == "momentum":
        return (paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9),
                None, _MOMENTUM_ACC)
    if kind == "adam_lr":
        sched = paddle.optimizer.lr.StepDecay(learning_rate=0.01, step_size=2,
                                              gamma=0.5)
        return paddle.optimizer.Adam(learning_rate=sched), sched, _ADAM_ACC
    if kind == "momentum_clip":
        # ClipGradByValue fails in PIR, ClipGradByGlobalNorm fails in legacy
        # IR (Paddle 3.3.1); ClipGradByNorm works in both.
        clip = paddle.nn.ClipGradByNorm(clip_norm=1.0)
        return (paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9,
                                          grad_clip=clip),
                None, _MOMENTUM_ACC)
    raise ValueError("unknown training kind %r" % kind)


def _build(kind, train):
    main, startup = paddle.static.Program(), paddle.static.Program()
    params = ["fc1.w", "fc1.b", "fc2.w", "fc2.b"]
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, IN_DIM], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        h = paddle.static.nn.fc(x, HIDDEN,
                                weight_attr=paddle.ParamAttr(name=params[0]),
                                bias_attr=paddle.ParamAttr(name=params[1]))
        h = paddle.nn.functional.relu(h)
        if kind == "dropout":
            h = paddle.nn.functional.dropout(h, p=0.3, training=True)
        pred = paddle.static.nn.fc(h, 1,
                                   weight_attr=paddle.ParamAttr(name=params[2]),
                                   bias_attr=paddle.ParamAttr(name=params[3]))
        loss = paddle.mean(paddle.square(pred - y))
        eval_prog, eval_loss = _clone_for_eval(main, loss)
        opt = sched = None
        suffixes = ()
        if train:
            opt, sched, suffixes = _optimizer(kind, params)
            opt.minimize(loss)
    rs = np.random.RandomState(0)
    feed = {"x": rs.randn(BATCH, IN_DIM).astype("float32"),
            "y": rs.randn(BATCH, 1).astype("float32")}
    extras = dict(
        kind=kind, ir=current_ir(), loss=loss, feed=feed,
        feed_names=("x", "y"), params=tuple(params),
        accumulators=tuple("%s_%s" % (p, s) for p in params for s in suffixes),
        lr_name="learning_rate_0" if train else None,
        eval=eval_prog, eval_loss=eval_loss, optimizer=opt, scheduler=sched,
    )
    return main, startup, extras


def build(kind, fresh_names=True):
    """Build model ``kind`` in the current IR; see the module docstring.

    ``kind == "forward"``: the same network without ``minimize``.
    ``kind == "eval"``: ``main`` is the eval clone of the Adam model (made
    before ``minimize``); ``extras["train"]`` is that training program.
    With ``fresh_names`` the build runs in a fresh ``unique_name.guard()``,
    so accumulator names (``*_moment1_0``, ``learning_rate_0``) do not depend
    on what was built before.
    """
    if kind not in KINDS:
        raise ValueError("unknown kind %r (one of %r)" % (kind, KINDS))
    ctx = paddle.utils.unique_name.guard() if fresh_names \
        else contextlib.nullcontext()
    with ctx:
        if kind == "forward":
            return _build(kind, train=False)
        if kind == "eval":
            main, startup, extras = _build("adam", train=True)
            ev = dict(extras, kind="eval", train=main, train_loss=extras["loss"],
                      loss=extras["eval_loss"], accumulators=(), lr_name=None)
            return extras["eval"], startup, ev
        return _build(kind, train=True)


def run_once(program, startup, extras, loss=None):
    """Run ``startup`` then one step of ``program`` in a fresh scope; return
    the loss (default ``extras["loss"]``) as a float.  ``program`` may be a
    ``CompiledProgram`` (legacy IR)."""
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(startup)
        out = exe.run(program, feed=extras["feed"],
                      fetch_list=[extras["loss"] if loss is None else loss])
    return float(np.asarray(out[0]))
