#!/usr/bin/env python
"""One rank of a multi-rank training job whose ranks hold DIFFERENT state.

Static-graph collectives need NCCL, so on a CPU the ranks of a job run as
separate processes that keep in lockstep through a file barrier at the start
of every epoch (``BARRIER/<gen>/e<epoch>.r<rank>``; ``<gen>`` comes from
``ACP_TEST_GEN`` and is new for every start of the job, so files of an
earlier start never satisfy a barrier). Rank and world size come from
``PADDLE_TRAINER_ID`` / ``PADDLE_TRAINERS_NUM`` as the launcher sets them.

``--kind``:

* ``tp``: tensor-parallel-like: every rank builds the same program with the
  same parameter names and shapes, but its initial values (``paddle.seed``),
  its data (NumPy) and its noise (``random``) are seeded by its rank;
* ``pp``: pipeline-like: rank k's program has other layers (other names and
  widths), so the programs' fingerprints differ;
* ``dp``: data parallel: identical programs and state on every rank.

Each epoch runs ``--steps-per-epoch`` steps (through ``paddle_acp.resumable``
with ``--save-every-steps``: mid-epoch checkpoints). Output in ``--out DIR``
(one directory per rank): ``losses.jsonl`` (one line per epoch, as
``train_script.py``, with the loss on fixed evaluation data after the epoch: a
checkpoint taken after an epoch's last step resumes with no step left to
train), ``events.jsonl`` (``{"event": "start", "restored":
<the checkpoint the range resumed from, or null>, "epoch": first epoch}``),
``final.npz`` and ``done`` (last).
"""
import argparse
import json
import os
import random
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--kind", choices=["tp", "pp", "dp"], default="tp")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--steps-per-epoch", type=int, default=3)
    p.add_argument("--save-every-steps", type=int, default=None)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--barrier", default=None, help="shared directory for the epoch barrier (omit: no peers)")
    p.add_argument("--barrier-timeout", type=float, default=120.0)
    p.add_argument("--no-acp", action="store_true", help="plain range (the reference run)")
    p.add_argument("--inter", type=float, default=0.0, help="save_checkpoint_inter (seconds; 0: every epoch)")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds each epoch sleeps (a longer epoch)")
    p.add_argument("--setup-sleep", type=float, default=0.0,
                   help="seconds slept before the range (the script's own setup: its data, its model)")
    p.add_argument("--timing", default=None, help="write {'train_s': seconds of the epoch loop} to this file")
    p.add_argument("--clock-skew", type=float, default=0.0,
                   help="shift this process's wall clock (time.time) by this many seconds, before anything imports it")
    return p.parse_args(argv)


ARGS = parse_args()
if ARGS.clock_skew:  # a host whose clock is off: every time.time() of this process (paddle_acp's too) reads it
    _real_time = time.time

    def _skewed_time():
        return _real_time() + ARGS.clock_skew

    time.time = _skewed_time
RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0)
WORLD = int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_acp as acp  # noqa: E402

paddle.enable_static()
if os.environ.get("ACP_TEST_STOP"):  # tests: stop at a named point of the library (stop_hook.py)
    import stop_hook  # noqa: E402

    stop_hook.install()
PIR = bool(paddle.framework.in_pir_mode())
IN_DIM, BATCH = 16, 8


def barrier(epoch):
    if not ARGS.barrier:
        return
    d = os.path.join(ARGS.barrier, os.environ.get("ACP_TEST_GEN", "0"))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "e%d.r%d" % (epoch, RANK)), "w") as f:
        f.write("%d\n" % os.getpid())
    deadline = time.monotonic() + ARGS.barrier_timeout
    want = ["e%d.r%d" % (epoch, r) for r in range(WORLD)]
    while not all(os.path.exists(os.path.join(d, w)) for w in want):
        if time.monotonic() > deadline:
            sys.stderr.write("barrier of epoch %d timed out\n" % epoch)
            sys.exit(3)
        time.sleep(0.005)


def build():
    main, startup = paddle.static.Program(), paddle.static.Program()
    hidden = ARGS.hidden if ARGS.kind != "pp" else ARGS.hidden // (RANK + 1)
    pfx = "s%d_" % RANK if ARGS.kind == "pp" else "m_"
    names = [pfx + n for n in ("fc1.w", "fc1.b", "fc2.w", "fc2.b")]
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, IN_DIM], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        h = paddle.static.nn.fc(x, hidden, weight_attr=paddle.ParamAttr(name=names[0]),
                                bias_attr=paddle.ParamAttr(name=names[1]))
        h = paddle.nn.functional.relu(h)
        h = paddle.nn.functional.dropout(h, p=0.3, training=True)
        pred = paddle.static.nn.fc(h, 1, weight_attr=paddle.ParamAttr(name=names[2]),
                                   bias_attr=paddle.ParamAttr(name=names[3]))
        loss = paddle.mean(paddle.square(pred - y))
        if PIR:  # the evaluation program: a forward-only clone (before minimize)
            mapping = paddle.pir.IrMapping()
            eval_prog = main.clone(mapping)
            eval_loss = mapping.look_up(loss)
        else:
            eval_prog, eval_loss = main.clone(for_test=True), loss
        sched = paddle.optimizer.lr.StepDecay(learning_rate=0.01, step_size=2, gamma=0.5)
        paddle.optimizer.Adam(learning_rate=sched).minimize(loss)
    return main, startup, loss, sched, names, eval_prog, eval_loss


def main():
    out = ARGS.out
    os.makedirs(out, exist_ok=True)
    seed = 0 if ARGS.kind == "dp" else RANK + 1
    paddle.seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    true_w = np.random.randn(IN_DIM, 1).astype("float32")
    main_prog, startup, loss, sched, names, eval_prog, eval_loss = build()
    ers = np.random.RandomState(4321 + (0 if ARGS.kind == "dp" else RANK))
    eval_x = ers.randn(32, IN_DIM).astype("float32")
    eval_y = (eval_x @ true_w).astype("float32")
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    time.sleep(ARGS.setup_sleep)
    epochs = range(ARGS.epochs) if ARGS.no_acp else acp.train_epoch_range(ARGS.epochs, save_checkpoint_inter=ARGS.inter)
    first = True
    t0 = time.perf_counter()
    open_s = None
    for epoch in epochs:
        if first:
            first = False
            open_s = time.perf_counter() - t0  # the range's open: storage connected, restore decided
            r = acp.active_range()
            restored = None if r is None or r.restored_number is None else r.restorer.loaded.name if r.restorer.loaded is not None else r.restored_number
            with open(os.path.join(out, "events.jsonl"), "a") as f:
                f.write(json.dumps({"event": "start", "pid": os.getpid(), "epoch": epoch, "restored": restored,
                                    "gen": os.environ.get("ACP_TEST_GEN")}) + "\n")
        barrier(epoch)
        batches = range(ARGS.steps_per_epoch)
        if not ARGS.no_acp:
            batches = acp.resumable(batches, save_every_steps=ARGS.save_every_steps)
        for _ in batches:
            noise = random.uniform(0.05, 0.15)
            x = np.random.randn(BATCH, IN_DIM).astype("float32")
            y = (x @ true_w + noise * np.random.randn(BATCH, 1)).astype("float32")
            exe.run(main_prog, feed={"x": x, "y": y}, fetch_list=[loss])
        if ARGS.sleep:
            time.sleep(ARGS.sleep)
        (ev,) = exe.run(eval_prog, feed={"x": eval_x, "y": eval_y}, fetch_list=[eval_loss])
        sched.step()
        rec = {"range": 0, "epoch": epoch, "eval_loss": float.hex(float(np.asarray(ev).reshape(-1)[0])),
               "pid": os.getpid()}
        with open(os.path.join(out, "losses.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
    if ARGS.timing:
        with open(ARGS.timing, "w") as f:
            json.dump({"train_s": time.perf_counter() - t0, "open_s": open_s}, f)
    scope = paddle.static.global_scope()
    params = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
    tmp = os.path.join(out, "final.tmp.npz")
    np.savez(tmp, **params)
    os.replace(tmp, os.path.join(out, "final.npz"))
    with open(os.path.join(out, "done"), "w") as f:
        f.write("%d\n" % os.getpid())


if __name__ == "__main__":
    main()
