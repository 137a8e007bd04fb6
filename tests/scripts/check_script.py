"""A tiny training script for ``paddle-acp check`` (tests/test_check.py).

``--mode``:

* ``resumable``: seeded (Paddle, NumPy's global RNG); the batches come from NumPy's global RNG,
  which paddle-acp checkpoints: it resumes exactly.
* ``unseeded``: nothing seeded: two uninterrupted runs already differ.
* ``counter``: seeded, but a Python counter of the script (``step_count``, a global) scales the
  loss, i.e. the learning rate; paddle-acp does not checkpoint it, so a restart resumes differently.
  An ``itertools.count`` of the script (``noise_ids``) shifts the labels: state not captured either.
* ``paddle_api``: as ``resumable``, through Paddle's own ``auto_checkpoint`` module (run it under
  ``python -m paddle_acp run``).

``--break-at E`` leaves the loop with ``break`` after training epoch E; ``--resumable`` iterates the
batches through ``paddle_acp.resumable``. The loop asks for 1000 epochs; ``paddle-acp check`` (or
``PADDLE_ACP_CHECK_EPOCHS``) cuts it short. Each step sleeps ``--sleep``
seconds so that an epoch lasts long enough to be killed inside.
"""
import argparse
import itertools
import time

import numpy as np
import paddle

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("resumable", "unseeded", "counter", "paddle_api"), default="resumable")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--sleep", type=float, default=0.06)
p.add_argument("--break-at", type=int, default=None)
p.add_argument("--resumable", action="store_true")
args = p.parse_args()

if args.mode == "paddle_api":
    from paddle.incubate.checkpoint import auto_checkpoint as acp  # resolves to paddle-acp under the runner

    train_epoch_range = acp.train_epoch_range
else:
    import paddle_acp

    train_epoch_range = paddle_acp.train_epoch_range

paddle.enable_static()
if args.mode != "unseeded":
    paddle.seed(7)
    np.random.seed(7)

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

step_count = 0
noise_ids = itertools.count() if args.mode == "counter" else None
for epoch in train_epoch_range(1000):
    batches = range(args.steps)
    if args.resumable:
        import paddle_acp

        batches = paddle_acp.resumable(batches)
    for _ in batches:
        xb = np.random.rand(4, 8).astype("float32")
        yb = xb.sum(axis=1, keepdims=True).astype("float32")
        if noise_ids is not None:
            yb = yb + np.float32(0.001 * (next(noise_ids) % 7))
        s = 1.0 / (1.0 + 0.5 * step_count) if args.mode == "counter" else 1.0
        exe.run(main, feed={"x": xb, "y": yb, "scale": np.array([s], "float32")}, fetch_list=[loss])
        step_count += 1
        time.sleep(args.sleep)
    if epoch == args.break_at:
        break
