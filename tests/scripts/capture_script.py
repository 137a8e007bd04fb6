"""Training script that keeps state of its own (an RNG object, a step counter) for the capture tests.

A linear model trained with SGD on a fixed data set; what changes between epochs comes from
state the script keeps itself, not from Paddle's or NumPy's global RNGs:

* ``--rng generator|randomstate|random``: the batch order of each epoch is drawn at the epoch's
  start, and a noise term per step, from ``np.random.default_rng(0)`` /
  ``np.random.RandomState(0)`` / ``random.Random(0)`` held at module level (``--where local``:
  in ``main()``'s locals);
* ``--rng counter``: a Python step counter (``paddle_acp.Counter`` registered with
  ``train_epoch_range(state=...)``; ``--no-register``: a plain int, not registered) drives a
  warmup factor fed into the program through ``feed`` (it scales the SGD step like a learning rate).

Writes one JSON line per trained step to OUT/steps.jsonl (``{"epoch", "step", "loss": hex,
"pid"}``), the parameters to OUT/final.npz and OUT/done at the end.
``--kill-at E:S`` SIGKILLs the process before step S of epoch E, once (OUT/killed marks it).
"""

import argparse
import json
import os
import random
import signal

import numpy as np
import paddle

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rng", choices=["generator", "randomstate", "random", "counter"], required=True)
ap.add_argument("--where", choices=["global", "local"], default="global")
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--batches", type=int, default=6)
ap.add_argument("--kill-at", default=None)
ap.add_argument("--save-every-steps", type=int, default=None)
ap.add_argument("--no-register", action="store_true")
ap.add_argument("--seed-by-rank", action="store_true", help="seed the RNG with PADDLE_TRAINER_ID (per-rank state)")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)

import paddle_acp as acp

paddle.enable_static()
paddle.seed(3)
main_prog, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main_prog, startup):
    x = paddle.static.data("x", [None, 5], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    factor = paddle.static.data("factor", [1], "float32")
    pred = paddle.static.nn.fc(x, 1, weight_attr=paddle.ParamAttr(name="w"), bias_attr=paddle.ParamAttr(name="b"))
    loss = paddle.mean((pred - y) ** 2)
    paddle.optimizer.SGD(learning_rate=0.05).minimize(loss * factor)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)

data_rs = np.random.RandomState(7)  # the fixed data set (not captured: it is used up before the loop)
DATA = [(data_rs.rand(4, 5).astype("float32"), data_rs.rand(4, 1).astype("float32")) for _ in range(a.batches)]
del data_rs
TOTAL = a.epochs * a.batches
kill_at = tuple(int(v) for v in a.kill_at.split(":")) if a.kill_at else None
marker = os.path.join(a.out, "killed")
log = open(os.path.join(a.out, "steps.jsonl"), "a")


SEED = int(os.environ.get("PADDLE_TRAINER_ID", "0")) if a.seed_by_rank else 0


def make_rng():
    return {"generator": lambda: np.random.default_rng(SEED), "randomstate": lambda: np.random.RandomState(SEED),
            "random": lambda: random.Random(SEED), "counter": lambda: None}[a.rng]()


def order_and_noise(rng):
    """The epoch's batch order (drawn at its start) and a per-step noise function."""
    n = a.batches
    if a.rng == "generator":
        return list(rng.permutation(n)), lambda: float(rng.normal())
    if a.rng == "randomstate":
        return list(rng.permutation(n)), lambda: float(rng.randn())
    if a.rng == "random":
        order = list(range(n))
        rng.shuffle(order)
        return order, lambda: rng.gauss(0.0, 1.0)
    return list(range(n)), lambda: 0.0


def train(rng, step):
    # (the RNG variants pass no state=: they run unchanged on a paddle-acp that captures nothing)
    kw = {"state": {"step": step}} if a.rng == "counter" and not a.no_register else {}
    for epoch in acp.train_epoch_range(a.epochs, save_checkpoint_inter=0, **kw):
        order, noise = order_and_noise(rng)
        batches = ((i, DATA[i]) for i in order)
        for s, (i, (xb, yb)) in enumerate(acp.resumable(batches, save_every_steps=a.save_every_steps)):
            r = acp.active_range()
            s = r.step if r is not None else s
            if kill_at == (epoch, s) and not os.path.exists(marker):
                open(marker, "w").close()
                log.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            n = noise()
            cur = step.value if hasattr(step, "value") else step
            f = np.array([(cur + 1) / TOTAL if a.rng == "counter" else 1.0], "float32")
            (lv,) = exe.run(main_prog, feed={"x": xb, "y": yb + np.float32(0.1 * n), "factor": f}, fetch_list=[loss])
            log.write(json.dumps({"epoch": epoch, "step": s, "batch": int(i), "loss": float(lv).hex(),
                                  "pid": os.getpid()}) + "\n")
            log.flush()
            if hasattr(step, "value"):
                step += 1  # in place: the registered Counter
            else:
                step = step + 1
    return step


def finish():
    scope = paddle.static.global_scope()
    params = {n: np.array(scope.find_var(n).get_tensor()) for n in ("w", "b")}
    np.savez(os.path.join(a.out, "final.npz"), **params)
    open(os.path.join(a.out, "done"), "w").close()


def main():
    # --where local: the RNG is only a local of main(), passed on to train() (the frame that opens the loop)
    train(make_rng(), acp.Counter(0) if a.rng == "counter" and not a.no_register else 0)
    finish()


if a.where == "global":
    rng = make_rng()
    step = acp.Counter(0) if a.rng == "counter" and not a.no_register else 0
    train(rng, step)
    finish()
else:
    main()
