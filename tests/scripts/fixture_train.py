#!/usr/bin/env python
"""Training script that writes the old-release checkpoint fixtures (tests/support/old_fixtures.py).

It uses only the public API every release since 3b12adc shares (``train_epoch_range`` with
``state=``, ``resumable``, ``Value``, ``Counter``), so the same file runs on the old release's
tree (``PYTHONPATH`` = its extracted source) and on today's checkout.

A tiny MLP (Adam, StepDecay, dropout) in static-graph mode, PIR or legacy IR
(``FLAGS_enable_pir_api=0``). ``--rank-barrier DIR``: one rank of a job (``PADDLE_TRAINER_ID`` /
``PADDLE_TRAINERS_NUM``), seeded by its rank (its state is its own), kept in lockstep with its peers by
a file barrier at every epoch. ``--script-state``: the range also saves ``state=`` (an ``acp.Value``,
an ``acp.Counter``, a NumPy ``Generator`` and a ``random.Random``), all of which the training uses.
``--steps``: batches per epoch; with ``--save-every-steps`` they go through ``acp.resumable``.

``--stop-at E`` or ``E:S``: at the body of epoch E (step S), once ``--wait-for`` exists (the
checkpoint taken just before, committed), the process writes its state as saved to
``OUT/state_saved.npz``, trains that one step, writes its state to ``OUT/state_stop.npz`` and ends at
once (``os._exit``: no final save, like a kill). ``--dump-first``: after the first step it trains (a
resumed run: the first one after the restore, which writes a program's tensors into the scope at its
first run), the process writes its state to ``OUT/state_first.npz`` and goes on. A state: every
persistable of the program as it is in the scope, the LR scheduler's ``state_dict``, Paddle's,
NumPy's and Python's global RNG states and the script state's values (arrays; ``meta`` holds a JSON
text of the rest, with the epoch, step and that step's loss). ``OUT/losses.jsonl`` gets one line per
trained epoch, ``OUT/done`` is written last.
"""
import argparse
import json
import os
import random
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=4)
ap.add_argument("--steps", type=int, default=3, help="batches per epoch")
ap.add_argument("--save-every-steps", type=int, default=None, help="mid-epoch checkpoints (through resumable)")
ap.add_argument("--script-state", action="store_true")
ap.add_argument("--rank-barrier", default=None)
ap.add_argument("--same-seed", action="store_true", help="every rank seeded alike (data parallel: replicated state)")
ap.add_argument("--stop-at", default=None, help="E or E:S")
ap.add_argument("--wait-for", default=None, help="a file that must exist before --stop-at stops")
ap.add_argument("--dump-first", action="store_true")
ARGS = ap.parse_args()

RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0)
WORLD = int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_acp as acp  # noqa: E402

paddle.enable_static()
PIR = bool(paddle.framework.in_pir_mode())
IN_DIM, HIDDEN, BATCH = 8, 16, 4


def barrier(epoch):
    if not ARGS.rank_barrier:
        return
    d = os.path.join(ARGS.rank_barrier, os.environ.get("ACP_TEST_GEN", "0"))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "e%d.r%d" % (epoch, RANK)), "w") as f:
        f.write("%d\n" % os.getpid())
    deadline = time.monotonic() + 120
    want = [os.path.join(d, "e%d.r%d" % (epoch, r)) for r in range(WORLD)]
    while not all(os.path.exists(w) for w in want):
        if time.monotonic() > deadline:
            sys.stderr.write("barrier of epoch %d timed out\n" % epoch)
            os._exit(3)
        time.sleep(0.005)


def persistables(program):
    """The persistable variables' names, as paddle_acp.adapter.programs finds them."""
    names = set()
    if PIR:
        for op in program.global_block().ops:
            if op.name() == "builtin.parameter":
                names.add(op.str_attr("parameter_name"))
            elif op.name() == "pd_op.data" and op.result(0).persistable:
                names.add(op.str_attr("name"))
    else:
        for var in program.list_vars():
            if paddle.static.io.is_persistable(var):
                names.add(var.name)
    return sorted(names)


def dump(path, epoch, step, loss_value, main_prog, sched, script):
    """The process's whole training state now, to ``path`` (.npz)."""
    scope = paddle.static.global_scope()
    arrays, meta = {}, {"epoch": epoch, "step": step, "loss": None if loss_value is None else float.hex(loss_value)}
    for n in persistables(main_prog):
        var = scope.find_var(n)
        if var is not None and var.get_tensor()._is_initialized():
            arrays["p/" + n] = np.array(var.get_tensor())
    meta["sched"] = {k: (float(v) if isinstance(v, (float, np.floating)) else v) for k, v in sched.state_dict().items()}
    meta["paddle_rng"] = [[int(p[0]), int(p[1]), int(p[2]), bytes(p[3]).decode("ascii") if len(p) > 3 else ""]
                          for p in (st.__getstate__() for st in paddle.get_rng_state())]
    np_state = np.random.get_state()
    arrays["rng/numpy"] = np_state[1]
    meta["numpy_rng"] = [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])]
    py_state = random.getstate()
    meta["python_rng"] = [py_state[0], list(py_state[1]), py_state[2]]
    if script is not None:
        meta["value"] = script["value"].value
        meta["counter"] = script["counter"].value
        meta["gen"] = script["gen"].bit_generator.state
        meta["rand"] = list(script["rand"].getstate()[1])
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True, default=int).encode(), dtype=np.uint8)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def main():
    out = ARGS.out
    os.makedirs(out, exist_ok=True)
    seed = 11 + (0 if ARGS.same_seed else RANK)
    paddle.seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    main_prog, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_prog, startup):
        x = paddle.static.data("x", [None, IN_DIM], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        h = paddle.static.nn.fc(x, HIDDEN, weight_attr=paddle.ParamAttr(name="fc1.w"),
                                bias_attr=paddle.ParamAttr(name="fc1.b"))
        h = paddle.nn.functional.dropout(paddle.nn.functional.relu(h), p=0.3, training=True)
        pred = paddle.static.nn.fc(h, 1, weight_attr=paddle.ParamAttr(name="fc2.w"),
                                   bias_attr=paddle.ParamAttr(name="fc2.b"))
        loss = paddle.mean(paddle.square(pred - y))
        sched = paddle.optimizer.lr.StepDecay(learning_rate=0.01, step_size=2, gamma=0.5)
        paddle.optimizer.Adam(learning_rate=sched).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    true_w = np.random.RandomState(5).randn(IN_DIM, 1).astype("float32")

    script = state = None
    if ARGS.script_state:
        script = {"value": acp.Value([]), "counter": acp.Counter(), "gen": np.random.default_rng(7),
                  "rand": random.Random(9)}
        state = dict(script)
    stop = None
    if ARGS.stop_at:
        parts = [int(p) for p in ARGS.stop_at.split(":")]
        stop = (parts[0], parts[1] if len(parts) > 1 else None)
    first = True
    pending = []

    def before(epoch, step):
        """At the body of a step (of an epoch, without resumable): which states to write after it."""
        nonlocal first
        if ARGS.dump_first and first:
            pending.append(("state_first.npz", False))
        first = False
        if stop is not None and stop == (epoch, step):
            deadline = time.monotonic() + 120
            while ARGS.wait_for and not os.path.exists(ARGS.wait_for):
                if time.monotonic() > deadline:
                    sys.stderr.write("%s never appeared\n" % ARGS.wait_for)
                    os._exit(4)
                time.sleep(0.005)
            dump(os.path.join(out, "state_saved.npz"), epoch, step, None, main_prog, sched, script)
            pending.append(("state_stop.npz", True))

    def after(epoch, step, loss_value):
        """After that step: its state written (then, at the stop, the process ends as if killed)."""
        for name, end in pending:
            dump(os.path.join(out, name), epoch, step, loss_value, main_prog, sched, script)
            if end:
                os._exit(0)
        del pending[:]

    for epoch in acp.train_epoch_range(ARGS.epochs, save_checkpoint_inter=0, state=state):
        barrier(epoch)
        steps = range(ARGS.steps)
        if ARGS.save_every_steps:
            steps = acp.resumable(steps, save_every_steps=ARGS.save_every_steps)
        else:
            before(epoch, None)
        last = None
        for step in steps:
            if ARGS.save_every_steps:
                before(epoch, step)
            noise = random.uniform(0.05, 0.15)
            if script is not None:
                noise += float(script["gen"].normal()) * 0.01 + script["rand"].random() * 0.01
                script["counter"].increment()
            xb = np.random.randn(BATCH, IN_DIM).astype("float32")
            yb = (xb @ true_w + noise * np.random.randn(BATCH, 1)).astype("float32")
            (lv,) = exe.run(main_prog, feed={"x": xb, "y": yb}, fetch_list=[loss])
            last = float(np.asarray(lv).reshape(-1)[0])
            after(epoch, step, last)
        if script is not None:
            script["value"].value.append(float.hex(last))
        sched.step()
        with open(os.path.join(out, "losses.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "loss": float.hex(last), "pid": os.getpid()}) + "\n")
    with open(os.path.join(out, "done"), "w") as f:
        f.write("%d\n" % os.getpid())


if __name__ == "__main__":
    main()
