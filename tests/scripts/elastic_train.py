#!/usr/bin/env python
"""A trainer for paddle-acp's elastic tests, run by ``paddle.distributed.launch``.

Every trainer trains the same tiny model (16 -> 32 -> 1, Adam) on the same
data: static-graph collectives need GPUs, so on CPU the trainers of a job keep
in lockstep without them, through a file barrier at the end of each epoch
(``OUT/barrier/<gen>/e<epoch>.r<rank>``; ``<gen>`` is the launcher's
``PADDLE_MASTER``, new for every (re)start of the pod, so files of an earlier
incarnation never satisfy a barrier). A trainer that gets SIGTERM while it
waits at the barrier stops waiting, so paddle-acp saves (trainer 0) and exits
143 at once instead of being SIGKILLed by the launcher 30 s later.

Data: batch ``s`` of epoch ``e`` is drawn from ``RandomState(1000 * e + s)``,
so it does not depend on the rank or on a restart; batches go through
``paddle_acp.resumable`` (mid-epoch resume after a SIGTERM-triggered save).

``--kill-rank R --kill-epoch E --kill-step S``: trainer R SIGKILLs itself
before step S of epoch E, once (``OUT/killed`` is created first, so its next
incarnation goes on).

Output in ``--out OUT`` (shared by all trainers of the job):

* ``events.r<rank>.jsonl``: ``{"event": "start", ...}`` per incarnation (pid,
  env the launcher gave: PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_JOB_ID,
  PADDLE_MASTER, POD_NAME; the first epoch/step it runs and the checkpoint it
  restored), ``{"event": "epoch", "epoch": e, "first_step": s, "loss": hex}``
  per finished epoch, ``{"event": "exit", "code": 143, "preempted": true}``
  when it leaves through SystemExit (paddle-acp's ``Preempted`` after SIGTERM),
  ``{"event": "end"}`` after the last epoch;
* ``pids``: one line per trainer process (for the tests' cleanup);
* ``violations.r<rank>.jsonl``: in a trainer whose rank is not 0, every call
  of a mutating ``paddle_acp.storage.Storage`` method on a path that is not
  its own (its part ``ckpt-e*/rank-<rank>``, its metrics file, its rank's writer
  generations ``writers/rank-<rank>/gen-<n>``): there must be none;
* ``final.r<rank>.npz``: the parameters at the end; ``done.r<rank>``: last.
"""
import argparse
import ctypes
import json
import os
import signal
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="batches per epoch")
    p.add_argument("--sleep", type=float, default=0.1, help="seconds per batch")
    p.add_argument("--save-every-steps", type=int, default=None)
    p.add_argument("--kill-rank", type=int, default=None)
    p.add_argument("--kill-epoch", type=int, default=2)
    p.add_argument("--kill-step", type=int, default=2)
    p.add_argument("--barrier-timeout", type=float, default=120.0)
    p.add_argument("--no-barrier", action="store_true", help="train alone (no peers to wait for)")
    p.add_argument("--per-rank-values", action="store_true",
                   help="tensor-parallel-like: initial values and data seeded by the rank (same names and shapes)")
    return p.parse_args(argv)


ARGS = parse_args()
OUT = os.path.abspath(ARGS.out)
RANK = int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0)
NRANKS = int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1)
os.makedirs(OUT, exist_ok=True)

# Die with the launcher: trainers run in their own sessions, so a launcher that
# is SIGKILLed would otherwise leave them behind.
try:
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
except Exception:
    pass
with open(os.path.join(OUT, "pids"), "a") as f:
    f.write(f"{os.getpid()} {RANK}\n")

_term = {"got": None}


def _on_term(signum, frame):
    # Chained to by paddle-acp's handler while a range is active; alone before it.
    _term["got"] = signum
    import paddle_acp

    if paddle_acp.active_range() is None:
        raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, _on_term)


def event(**kw):
    kw.setdefault("pid", os.getpid())
    kw.setdefault("t", time.time())
    with open(os.path.join(OUT, f"events.r{RANK}.jsonl"), "a") as f:
        f.write(json.dumps(kw) + "\n")
        f.flush()
        os.fsync(f.fileno())


import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_acp as acp  # noqa: E402

if RANK != 0:
    # Record (and let pass) every write a non-zero trainer makes through paddle-acp's storage layer.
    import re

    from paddle_acp.storage import Storage as _Storage

    _OWN = re.compile(r"/range/_range_\d+/ckpt-e\d+(-s\d+)?(/rank-%d(\.tmp-(g\d+-)?[0-9a-f]+)?(/[a-z.]+)?)?$"
                      r"|/metrics(/trainer-%d\.jsonl)?$|/writers(/rank-%d(/gen-\d+)?)?$" % (RANK, RANK, RANK))

    def _spy(name, orig):
        def wrapper(self, *a, **k):
            paths = [x for x in a if isinstance(x, str)]
            if not all(_OWN.search(x) for x in paths):
                with open(os.path.join(OUT, f"violations.r{RANK}.jsonl"), "a") as f:
                    f.write(json.dumps({"method": name, "args": [str(x) for x in a], "pid": os.getpid()}) + "\n")
            return orig(self, *a, **k)
        return wrapper

    def _backends(cls):  # the interface and every backend class (each defines its own methods)
        yield cls
        for sub in cls.__subclasses__():
            yield from _backends(sub)

    for _cls in set(_backends(_Storage)):
        for _name in ("makedirs", "open_output", "append_bytes", "write_bytes", "write_buffers", "write_image",
                      "_write_direct", "create_exclusive", "delete_dir", "delete_file", "rename"):
            if _name in vars(_cls):
                setattr(_cls, _name, _spy(_name, vars(_cls)[_name]))

paddle.enable_static()
SEED = 7 + (RANK if ARGS.per_rank_values else 0)
paddle.seed(SEED)
np.random.seed(SEED)

IN, HID, BATCH = 16, 32, 8
main_prog, startup = paddle.static.Program(), paddle.static.Program()
main_prog.random_seed = startup.random_seed = SEED
with paddle.static.program_guard(main_prog, startup):
    x = paddle.static.data("x", [None, IN], "float32")
    y = paddle.static.data("y", [None, 1], "float32")
    h = paddle.nn.functional.relu(paddle.static.nn.fc(x, HID))
    pred = paddle.static.nn.fc(h, 1)
    loss = paddle.mean((pred - y) ** 2)
    paddle.optimizer.Adam(learning_rate=0.01).minimize(loss)

exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
W_TRUE = np.random.RandomState(99).randn(IN, 1).astype("float32")


def batches(epoch):
    for s in range(ARGS.steps):
        rs = np.random.RandomState(1000 * epoch + s + (100000 * RANK if ARGS.per_rank_values else 0))
        xb = rs.randn(BATCH, IN).astype("float32")
        yield {"x": xb, "y": (xb @ W_TRUE + 0.1 * rs.randn(BATCH, 1)).astype("float32")}


def barrier(epoch):
    if ARGS.no_barrier:
        return True
    gen = "".join(c if c.isalnum() else "_" for c in os.environ.get("PADDLE_MASTER", "solo"))
    d = os.path.join(OUT, "barrier", gen)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, f"e{epoch}.r{RANK}"), "w").close()
    deadline = time.monotonic() + ARGS.barrier_timeout
    while _term["got"] is None:
        if all(os.path.exists(os.path.join(d, f"e{epoch}.r{r}")) for r in range(NRANKS)):
            return True
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {RANK}: barrier of epoch {epoch} timed out")
        time.sleep(0.02)
    return False  # SIGTERM: paddle-acp saves (trainer 0) and exits at the epoch end


def train():
    started = False
    for epoch in acp.train_epoch_range(ARGS.epochs, save_checkpoint_inter=0):
        r = acp.active_range()
        first_step = (r.restorer.resume_step or 0) if r is not None else 0  # mid-epoch resume
        if not started:
            started = True
            event(event="start", rank=RANK, epoch=epoch, step=first_step,
                  restored=r.restored_number if r is not None else None,
                  env={k: os.environ.get(k) for k in ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_JOB_ID",
                                                      "PADDLE_MASTER", "POD_NAME", "PADDLE_ACP_CHECKPOINT_URI")})
        step = first_step
        last = None
        for feed in acp.resumable(batches(epoch), save_every_steps=ARGS.save_every_steps):
            if (RANK == ARGS.kill_rank and epoch == ARGS.kill_epoch and step == ARGS.kill_step
                    and not os.path.exists(os.path.join(OUT, "killed"))):
                fd = os.open(os.path.join(OUT, "killed"), os.O_CREAT | os.O_WRONLY, 0o644)
                os.write(fd, f"{os.getpid()} {epoch} {step}\n".encode())
                os.fsync(fd)
                os.close(fd)
                event(event="kill", epoch=epoch, step=step)
                os.kill(os.getpid(), signal.SIGKILL)
            (last,) = exe.run(main_prog, feed=feed, fetch_list=[loss])
            step += 1
            time.sleep(ARGS.sleep)
        event(event="epoch", epoch=epoch, first_step=first_step,
              loss=float(np.asarray(last).reshape(-1)[0]).hex() if last is not None else None)
        barrier(epoch)


try:
    train()
except SystemExit as exc:  # paddle_acp.Preempted after a SIGTERM: 143, once the checkpoint is committed
    event(event="exit", code=exc.code, preempted=isinstance(exc, acp.Preempted))
    raise

scope = paddle.static.global_scope()
params = {}
for name in sorted(scope.local_var_names()):  # parameters, Adam moments, learning rate...
    if name in ("x", "y", "feed", "fetch") or "@" in name:
        continue
    try:
        t = scope.find_var(name).get_tensor()
        if t._is_initialized():
            params[name] = np.array(t)
    except Exception:
        pass
np.savez(os.path.join(OUT, f"final.r{RANK}.npz"), **params)
event(event="end")
open(os.path.join(OUT, f"done.r{RANK}"), "w").close()
