#!/usr/bin/env python
"""Deterministic end-to-end training script for the auto-checkpoint tests.

A tiny MLP (16 -> 32 -> 1 by default, dropout 0.3) trained with Adam + StepDecay in
Paddle static-graph mode, under PIR (default) or legacy IR
(``FLAGS_enable_pir_api=0`` in the environment).  Everything that makes the
run reproducible has to survive a restart for the losses to be bit-identical:

* parameters and Adam moments (persistables),
* the ``StepDecay`` scheduler (``sched.step()`` at the end of every epoch),
* Paddle's global generator (dropout draws from it: ``program.random_seed``
  stays 0; parameter init also draws from it),
* NumPy's global RNG (training data is drawn with ``np.random.*``),
* Python's ``random`` (the per-step noise scale is drawn with ``random``).

Output, in ``--out DIR``:

* ``losses.jsonl``: one line per trained epoch:
  ``{"range": r, "epoch": e, "train_loss": hex, "eval_loss": hex, "pid": pid}``
  (with ``--programs 2`` also ``train_loss_p1`` / ``eval_loss_p1``);
* ``final.npz``: every parameter (name -> array) read from the global scope;
* ``done``: written last.

``--kill-at-epoch K`` makes the process SIGKILL itself at the start of epoch
K's body in range ``--kill-range`` (default 0), unless ``DIR/killed_K``
already exists (it is created just before the kill, so a rerun goes on).
"""
import argparse
import json
import os
import random
import signal
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for results")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--api", choices=["acp", "paddle", "paddle_base"],
                   default="acp",
                   help="acp: import paddle_acp; paddle: "
                        "paddle.incubate.checkpoint.auto_checkpoint; "
                        "paddle_base: paddle.base.incubate.checkpoint."
                        "auto_checkpoint (the Paddle modules are for "
                        "`python -m paddle_acp run`)")
    p.add_argument("--ranges", type=int, choices=[1, 2], default=1)
    p.add_argument("--programs", type=int, choices=[1, 2], default=1)
    p.add_argument("--kill-at-epoch", type=int, default=None)
    p.add_argument("--kill-range", type=int, default=0,
                   help="range index in which --kill-at-epoch applies")
    p.add_argument("--steps-per-epoch", type=int, default=4)
    p.add_argument("--sleep", type=float, default=0.0,
                   help="seconds to sleep per step")
    p.add_argument("--hidden", type=int, default=32,
                   help="hidden width (a larger model makes saves longer)")
    p.add_argument("--dropout", type=float, default=0.3,
                   help="dropout rate (0: no dropout op; Paddle 2.6 cannot carry the "
                        "CPU generator's engine state across processes)")
    p.add_argument("--interval", type=float, default=0,
                   help="save_checkpoint_inter passed to train_epoch_range")
    p.add_argument("--hold-range", action="store_true",
                   help="keep the train_epoch_range generator in a variable "
                        "(after an uncaught error it then lives until the "
                        "interpreter exits, as in many scripts)")
    p.add_argument("--ready-file", default=None,
                   help="created once Paddle is imported and the programs are built, "
                        "just before the first train_epoch_range (the process shows "
                        "life: ci/kill_anywhere.py draws its kill times from then)")
    p.add_argument("--timing", default=None,
                   help="write {train_s, epochs} here: seconds from the start of "
                        "this process's first epoch to the end of its last "
                        "range (final checkpoint committed), for benchmarks")
    p.add_argument("--peak-rss", default=None,
                   help="write the process's peak resident memory (VmHWM, bytes) here at the end")
    return p.parse_args(argv)


ARGS = parse_args()

import numpy as np  # noqa: E402
import paddle  # noqa: E402

if ARGS.api == "acp":
    import paddle_acp as acp  # noqa: E402
elif ARGS.api == "paddle":
    from paddle.incubate.checkpoint import auto_checkpoint as acp  # noqa: E402
else:
    from paddle.base.incubate.checkpoint import auto_checkpoint as acp  # noqa: E402,E501

paddle.enable_static()
if os.environ.get("ACP_TEST_STOP"):  # tests: stop at a named point of the library (stop_hook.py)
    import stop_hook  # noqa: E402

    stop_hook.install()

IN_DIM, HIDDEN, BATCH = 16, ARGS.hidden, 8
# PIR is the default; FLAGS_enable_pir_api=0 before `import paddle` selects
# legacy IR.
PIR = bool(paddle.framework.in_pir_mode())


def build(idx):
    """One training program with its own parameters, optimizer and scheduler.

    Returns a dict with main/startup/eval programs, fetch targets, the
    scheduler and the parameter names.
    """
    main, startup = paddle.static.Program(), paddle.static.Program()
    pfx = "m%d_" % idx
    names = [pfx + n for n in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")]
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data(pfx + "x", [None, IN_DIM], "float32")
        y = paddle.static.data(pfx + "y", [None, 1], "float32")
        h = paddle.static.nn.fc(
            x, HIDDEN, weight_attr=paddle.ParamAttr(name=names[0]),
            bias_attr=paddle.ParamAttr(name=names[1]))
        h = paddle.nn.functional.relu(h)
        if ARGS.dropout > 0:
            h = paddle.nn.functional.dropout(h, p=ARGS.dropout, training=True)
        pred = paddle.static.nn.fc(
            h, 1, weight_attr=paddle.ParamAttr(name=names[2]),
            bias_attr=paddle.ParamAttr(name=names[3]))
        loss = paddle.mean(paddle.square(pred - y))
        # Eval program cloned BEFORE minimize (forward only).
        if PIR:
            # PIR's Program.clone() has no for_test; map the loss value.
            mapping = paddle.pir.IrMapping()
            eval_prog = main.clone(mapping)
            eval_loss = mapping.look_up(loss)
        else:
            eval_prog = main.clone(for_test=True)
            eval_loss = loss
        sched = paddle.optimizer.lr.StepDecay(learning_rate=0.01, step_size=2,
                                              gamma=0.5)
        paddle.optimizer.Adam(learning_rate=sched).minimize(loss)
    assert main.random_seed == 0
    return dict(main=main, startup=startup, eval=eval_prog, loss=loss,
                eval_loss=eval_loss, sched=sched, names=names,
                x=pfx + "x", y=pfx + "y")


def main():
    out = ARGS.out
    os.makedirs(out, exist_ok=True)
    paddle.seed(0)
    np.random.seed(0)
    random.seed(0)

    # Target weights drawn from the global numpy RNG at program start.
    true_w = np.random.randn(IN_DIM, 1).astype("float32")
    # Fixed eval data, independent from the global RNGs.
    ers = np.random.RandomState(1234)
    eval_x = ers.randn(64, IN_DIM).astype("float32")
    eval_y = (eval_x @ true_w).astype("float32")

    progs = [build(i) for i in range(ARGS.programs)]
    exe = paddle.static.Executor(paddle.CPUPlace())
    for p in progs:
        exe.run(p["startup"])

    log_path = os.path.join(out, "losses.jsonl")
    if ARGS.ready_file:
        with open(ARGS.ready_file, "w") as f:
            f.write("%d\n" % os.getpid())
    t_first, n_epochs = None, 0
    for r in range(ARGS.ranges):
        first = True
        if ARGS.hold_range:
            epochs = acp.train_epoch_range(ARGS.epochs,
                                           save_checkpoint_inter=ARGS.interval)
        for epoch in (epochs if ARGS.hold_range else acp.train_epoch_range(
                ARGS.epochs, save_checkpoint_inter=ARGS.interval)):
            n_epochs += 1
            if t_first is None:
                t_first = time.perf_counter()
            if first:
                first = False
                if epoch > 0:
                    msg = "resumed at epoch %d" % epoch
                    if ARGS.ranges > 1:
                        msg += " in range %d" % r
                    print(msg, flush=True)
            if ARGS.kill_at_epoch is not None and r == ARGS.kill_range \
                    and epoch == ARGS.kill_at_epoch:
                marker = os.path.join(out, "killed_%d" % epoch)
                if not os.path.exists(marker):
                    with open(marker, "w") as f:
                        f.write("%d\n" % os.getpid())
                    print("killing myself at epoch %d" % epoch, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

            rec = {"range": r, "epoch": epoch}
            last = [None] * len(progs)
            for _ in range(ARGS.steps_per_epoch):
                noise = random.uniform(0.05, 0.15)
                for i, p in enumerate(progs):
                    x = np.random.randn(BATCH, IN_DIM).astype("float32")
                    y = (x @ true_w
                         + noise * np.random.randn(BATCH, 1)).astype("float32")
                    (lv,) = exe.run(p["main"], feed={p["x"]: x, p["y"]: y},
                                    fetch_list=[p["loss"]])
                    last[i] = float(np.asarray(lv).reshape(-1)[0])
                if ARGS.sleep:
                    time.sleep(ARGS.sleep)
            for i, p in enumerate(progs):
                (ev,) = exe.run(p["eval"], feed={p["x"]: eval_x, p["y"]: eval_y},
                                fetch_list=[p["eval_loss"]])
                sfx = "" if i == 0 else "_p%d" % i
                rec["train_loss" + sfx] = float.hex(last[i])
                rec["eval_loss" + sfx] = float.hex(
                    float(np.asarray(ev).reshape(-1)[0]))
                p["sched"].step()
            rec["pid"] = os.getpid()
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
                f.flush()
        if first:
            print("range %d: nothing left to train" % r, flush=True)
    if ARGS.timing and t_first is not None:
        with open(ARGS.timing, "w") as f:
            json.dump({"train_s": time.perf_counter() - t_first,
                       "epochs": n_epochs}, f)

    scope = paddle.static.global_scope()
    params = {}
    for p in progs:
        for n in p["names"]:
            params[n] = np.array(scope.find_var(n).get_tensor())
    tmp = os.path.join(out, "final.tmp.npz")
    np.savez(tmp, **params)
    os.replace(tmp, os.path.join(out, "final.npz"))
    if ARGS.peak_rss:
        with open("/proc/self/status") as f:
            hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
        with open(ARGS.peak_rss, "w") as f:
            f.write("%d\n" % hwm)
    with open(os.path.join(out, "done"), "w") as f:
        f.write("%d\n" % os.getpid())
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
