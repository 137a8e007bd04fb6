"""A tiny training script for ``paddle-acp check`` (tests/e2e/test_check.py).

``--mode``:

* ``resumable``: seeded (Paddle, NumPy's global RNG); the batches come from NumPy's global RNG,
  which paddle-acp checkpoints: it resumes exactly.
* ``unseeded``: nothing seeded: two uninterrupted runs already differ.
* ``counter``: seeded, but a Python counter of the script (``step_count``, a global) scales the
  loss, i.e. the learning rate; paddle-acp does not checkpoint it, so a restart resumes differently.
  An ``itertools.count`` of the script (``noise_ids``) shifts the labels: state not captured either.
* ``paddle_api``: as ``resumable``, through Paddle's own ``auto_checkpoint`` module (run it under
  ``python -m paddle_acp run``).
* ``milestone``: as ``resumable``, but a plain global step counter (``step_count``) switches the
  learning rate at step 10000 (a milestone after the checked epochs): the checked epochs match, but
  a restart resets the counter, so a long run would not resume exactly.
* ``milestone_object``: as ``milestone``, the counter an attribute (``warm.n``) of an object of a class the
  script defines (a hand-written warm-up scheduler): caught the same way.
* ``early_stop``: a validation loss that stops improving; ``best`` and ``patience`` are locals of
  ``train()``, the loop leaves with ``break`` once ``patience`` reaches 1 (at epoch 2): a restart after
  a kill in the last epoch forgets them and trains an epoch more.
* ``spawn``: the data's noise comes from a child generator spawned each epoch from a global
  ``np.random.default_rng`` (``Generator.spawn``): resumes exactly once the spawn counter is captured.
* ``rebind``: a global ``rng`` rebound each epoch to a generator seeded from the previous one (a
  captured name rebound after the range opened): resumes exactly once the name is read at each save.

Every mode but ``counter`` and ``milestone`` holds its step count in a tracked ``paddle_acp.Counter``.
``--break-at E`` leaves the loop with ``break`` after training epoch E; ``--resumable`` iterates the
batches through ``paddle_acp.resumable`` (``--save-every-steps N``: a mid-epoch checkpoint every N
batches). ``--log-file PATH`` keeps an open log file in the script's globals (not training state).
``--background-child`` starts a ``sleep`` in the background that outlives the script; ``--pid-file``
gets this process's pid, then the child's (one a line). The loop asks for 1000 epochs; ``paddle-acp
check`` (or ``PADDLE_ACP_CHECK_EPOCHS``) cuts it short. Each step sleeps ``--sleep`` seconds.
"""
import argparse
import itertools
import os
import subprocess
import time

import numpy as np
import paddle

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("resumable", "unseeded", "counter", "paddle_api", "milestone", "early_stop", "spawn",
                                  "rebind", "milestone_object"), default="resumable")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--sleep", type=float, default=0.06)
p.add_argument("--break-at", type=int, default=None)
p.add_argument("--resumable", action="store_true")
p.add_argument("--save-every-steps", type=int, default=None)
p.add_argument("--log-file", default=None)
p.add_argument("--background-child", action="store_true")
p.add_argument("--pid-file", default=None)
args = p.parse_args()

if args.pid_file:
    with open(args.pid_file, "a") as f:
        f.write(f"{os.getpid()}\n")
if args.background_child:  # outlives this process: paddle-acp check must end it
    child = subprocess.Popen(["sleep", "600"])
    if args.pid_file:
        with open(args.pid_file, "a") as f:
            f.write(f"{child.pid}\n")
log = open(args.log_file, "a") if args.log_file else None

if args.mode == "paddle_api":
    from paddle.incubate.checkpoint import auto_checkpoint as acp  # resolves to paddle-acp under the runner

    train_epoch_range = acp.train_epoch_range
else:
    import paddle_acp

    train_epoch_range = paddle_acp.train_epoch_range

paddle.enable_static()
if args.mode != "unseeded":  # each rank of a job (PADDLE_TRAINER_ID) its own seed: ranks hold different state
    paddle.seed(7 + int(os.environ.get("PADDLE_TRAINER_ID", "0")))
    np.random.seed(7 + int(os.environ.get("PADDLE_TRAINER_ID", "0")))

main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [-1, 8], "float32")
    y = paddle.static.data("y", [-1, 1], "float32")
    scale = paddle.static.data("scale", [1], "float32")
    pred = paddle.static.nn.fc(x, 1, weight_attr=paddle.ParamAttr(name="w"), bias_attr=paddle.ParamAttr(name="b"))
    loss = paddle.mean(paddle.square(pred - y)) * scale
    paddle.optimizer.Momentum(0.05, momentum=0.9).minimize(loss)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)

import paddle_acp  # noqa: E402  (Counter, track, resumable; under the runner too)

rng = np.random.default_rng(11)
if args.mode in ("counter", "milestone"):
    step_count = 0  # a plain int: not captured
else:
    step_count = paddle_acp.track("step_count", paddle_acp.Counter())
noise_ids = itertools.count() if args.mode == "counter" else None


class Warmup:
    """A hand-written schedule of the script (``milestone_object``): its step count a plain attribute."""

    def __init__(self):
        self.n = 0


warm = Warmup()


def scale_now():
    if args.mode == "counter":
        return 1.0 / (1.0 + 0.5 * step_count)
    if args.mode == "milestone":
        return 0.1 if step_count >= 10000 else 1.0
    if args.mode == "milestone_object":
        return 0.1 if warm.n >= 10000 else 1.0
    return 1.0


def train_epoch(epoch):
    global step_count, rng
    noise = 0.0
    if args.mode == "spawn":
        noise = rng.spawn(1)[0].random()
    elif args.mode == "rebind":
        rng = np.random.default_rng(int(rng.integers(2 ** 31)))
        noise = rng.random()
    batches = range(args.steps)
    if args.resumable:
        batches = paddle_acp.resumable(batches, save_every_steps=args.save_every_steps)
    for _ in batches:
        xb = np.random.rand(4, 8).astype("float32")
        yb = xb.sum(axis=1, keepdims=True).astype("float32") + np.float32(noise)
        if noise_ids is not None:
            yb = yb + np.float32(0.001 * (next(noise_ids) % 7))
        out = exe.run(main, feed={"x": xb, "y": yb, "scale": np.array([scale_now()], "float32")}, fetch_list=[loss])
        step_count += 1
        if args.mode == "milestone_object":
            warm.n += 1
        if log is not None:
            log.write(f"epoch {epoch} loss {float(np.asarray(out[0]).reshape(-1)[0]):.6f}\n")
        time.sleep(args.sleep)


def train():
    best, patience = float("inf"), 0
    val = [5.0, 4.0, 4.5, 4.6, 4.7, 4.8, 4.9, 5.0, 5.1, 5.2]
    for epoch in train_epoch_range(1000):
        train_epoch(epoch)
        v = val[min(epoch, len(val) - 1)]
        if v < best:
            best, patience = v, 0
        else:
            patience += 1
        if patience >= 1:
            break


if args.mode == "early_stop":
    train()
else:
    for epoch in train_epoch_range(1000):
        train_epoch(epoch)
        if epoch == args.break_at:
            break
