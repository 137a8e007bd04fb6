"""Training script with step-level progress (paddle_acp.resumable) for mid-epoch and SIGTERM tests.

Writes one JSON line per trained step to OUT/steps.jsonl: {"epoch", "step", "loss" (hex), "pid"}
and all parameters to OUT/final.npz at the end.
Options: --kill-at E:S (SIGKILL itself before training step S of epoch E, once),
--term-at E:S (SIGTERM itself right after training step S of epoch E, once),
--stop-at E:S (right after training step S of epoch E, once: writes OUT/stopping and waits until OUT/stopped
exists, for a test that signals it from outside, e.g. its whole process group), --save-every-steps K,
--loader generator|list|dataloader|stateful, --batches N, --shrink (data has N-3 batches),
--workers N (the DataLoader's num_workers; each worker writes its pid to OUT/workers/<pid>).
"""

import argparse
import json
import os
import random
import signal
import time

import numpy as np
import paddle

import paddle_acp as acp

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--batches", type=int, default=8)
ap.add_argument("--kill-at", default=None)
ap.add_argument("--term-at", default=None)
ap.add_argument("--stop-at", default=None)
ap.add_argument("--workers", type=int, default=0)
ap.add_argument("--save-every-steps", type=int, default=None)
ap.add_argument("--loader", choices=["generator", "list", "dataloader", "stateful"], default="generator")
ap.add_argument("--shrink", action="store_true")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
legacy = os.environ.get("FLAGS_enable_pir_api") == "0"

paddle.enable_static()
paddle.seed(1)
np.random.seed(1)
random.seed(1)
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [None, 6], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    h = paddle.nn.functional.dropout(paddle.static.nn.fc(x, 12, activation="tanh"), 0.25)
    loss = paddle.mean((paddle.static.nn.fc(h, 1) - y) ** 2)
    sched = paddle.optimizer.lr.StepDecay(0.05, 1, 0.7)
    paddle.optimizer.Adam(sched).minimize(loss)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)

n_batches = a.batches - 3 if a.shrink else a.batches


def make_batches():
    # shuffle order drawn from the global numpy RNG at iterator creation, per-batch noise from `random`
    order = np.random.permutation(n_batches)
    for i in order:
        rs = np.random.RandomState(int(i))
        xb = rs.rand(4, 6).astype("float32")
        yb = (xb.sum(1, keepdims=True) + random.random()).astype("float32")
        yield {"x": xb, "y": yb}


class StatefulLoader:
    """A loader that knows its position: paddle-acp uses state_dict/set_state_dict instead of re-iterating."""

    def __init__(self):
        self.pos = 0
        self.data = [{"x": np.full((4, 6), i, "float32") / 10, "y": np.full((4, 1), i, "float32") / 5} for i in range(n_batches)]
        self.skipped_by_state = False

    def state_dict(self):
        return {"pos": self.pos}

    def set_state_dict(self, st):
        self.pos = st["pos"]
        self.skipped_by_state = True

    def __iter__(self):
        while self.pos < len(self.data):
            b = self.data[self.pos]
            self.pos += 1
            yield b
        self.pos = 0


def loader_for_epoch():
    if a.loader == "generator":
        return make_batches()
    if a.loader == "list":
        return list(make_batches())
    if a.loader == "stateful":
        return stateful
    ds = [(b["x"], b["y"]) for b in make_batches()]

    class DS(paddle.io.Dataset):
        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            return ds[i][0][0], ds[i][1][0]

    return paddle.io.DataLoader(DS(), feed_list=[x, y], batch_size=1, shuffle=False, return_list=False,
                                num_workers=a.workers, worker_init_fn=note_worker if a.workers else None)


def note_worker(worker_id):
    os.makedirs(os.path.join(a.out, "workers"), exist_ok=True)
    open(os.path.join(a.out, "workers", str(os.getpid())), "w").close()


stateful = StatefulLoader()


def parse(spec):
    if spec is None:
        return None
    e, s = spec.split(":")
    return int(e), int(s)


kill_at, term_at, stop_at = parse(a.kill_at), parse(a.term_at), parse(a.stop_at)
log = open(os.path.join(a.out, "steps.jsonl"), "a")
first = True
for epoch in acp.train_epoch_range(a.epochs, save_checkpoint_inter=0):
    for step, batch in enumerate(acp.resumable(loader_for_epoch(), save_every_steps=a.save_every_steps)):
        r = acp.active_range()
        step = r.step if r is not None else step
        if first:
            if epoch or step:
                print(f"resumed at epoch {epoch} step {step}", flush=True)
            first = False
        if kill_at == (epoch, step) and not os.path.exists(os.path.join(a.out, "killed")):
            open(os.path.join(a.out, "killed"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        feed = batch if isinstance(batch, dict) else batch[0]
        (lv,) = exe.run(main, feed=feed, fetch_list=[loss])
        log.write(json.dumps({"epoch": epoch, "step": step, "loss": float(lv).hex(), "pid": os.getpid()}) + "\n")
        log.flush()
        if term_at == (epoch, step) and not os.path.exists(os.path.join(a.out, "termed")):
            open(os.path.join(a.out, "termed"), "w").close()
            os.kill(os.getpid(), signal.SIGTERM)
        if stop_at == (epoch, step) and not os.path.exists(os.path.join(a.out, "stopping")):
            open(os.path.join(a.out, "stopping"), "w").close()
            while not os.path.exists(os.path.join(a.out, "stopped")):  # the test signals now (from outside)
                time.sleep(0.01)
    sched.step()
scope = paddle.static.global_scope()
names = [op.str_attr("parameter_name") for op in main.global_block().ops if op.name() == "builtin.parameter"] if not legacy else [p.name for p in main.all_parameters()]
np.savez(os.path.join(a.out, "final.npz"), **{n: np.array(scope.find_var(n).get_tensor()) for n in names})
if a.loader == "stateful" and stateful.skipped_by_state:
    print("loader position restored through set_state_dict", flush=True)
