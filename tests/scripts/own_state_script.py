"""Training script whose loop is at module level and whose own state changes in the ways of issue 41.

A linear model trained with SGD on a fixed data set; each epoch's noise (added to the targets)
and step scale come from state the script keeps itself (``--case``):

* ``spawn``: a module global ``rng = np.random.default_rng(7)`` spawns a child each epoch
  (``rng.spawn(1)[0]``), which draws the epoch's noise;
* ``seedseq``: a module global ``ss = np.random.SeedSequence(7)`` spawns a child seed each epoch
  (``np.random.default_rng(ss.spawn(1)[0])``);
* ``rebind``: ``rng = np.random.default_rng(7)``, rebound in epoch 1 to
  ``np.random.default_rng(rng.integers(2**32))``, draws the noise;
* ``nested``: ``state={"metrics": metrics}`` with ``hist = metrics["hist"]``: the script appends
  the epoch's loss to ``hist`` and scales the step by ``len(hist)``;
* ``value``: ``state={"v": v}`` with ``v = acp.Value([])`` and ``lst = v.value``, used as ``nested``;
* ``many``: ``rngs = [np.random.default_rng(i) for i in range(--count)]``, every one draws each epoch.

Writes one JSON line per trained epoch to OUT/epochs.jsonl (``{"epoch", "noise": hex, "scale",
"loss": hex, "pid"}``), the parameters and a summary of the script's state to OUT/final.npz and
OUT/final.json, and OUT/done at the end. ``--kill-at E`` SIGKILLs the process at the start of
epoch E's body, once (OUT/killed marks it): with a checkpoint at every epoch and synchronous
saves, epoch E-1's checkpoint is committed then.
"""

import argparse
import json
import os
import signal

import numpy as np
import paddle

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--case", choices=["spawn", "seedseq", "rebind", "nested", "value", "many"], required=True)
ap.add_argument("--epochs", type=int, default=4)
ap.add_argument("--count", type=int, default=300)
ap.add_argument("--kill-at", type=int, default=None)
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)

import paddle_acp as acp  # noqa: E402

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

data_rs = np.random.RandomState(5)
XB, YB = data_rs.rand(8, 5).astype("float32"), data_rs.rand(8, 1).astype("float32")
del data_rs
marker = os.path.join(a.out, "killed")
log = open(os.path.join(a.out, "epochs.jsonl"), "a")

state = None
if a.case in ("spawn", "rebind"):
    rng = np.random.default_rng(7)
elif a.case == "seedseq":
    ss = np.random.SeedSequence(7)
elif a.case == "nested":
    metrics = {"hist": [], "best": {"loss": 1e9}}
    hist = metrics["hist"]
    state = {"metrics": metrics}
elif a.case == "value":
    v = acp.Value([])
    hist = v.value
    state = {"v": v}
else:
    rngs = [np.random.default_rng(i) for i in range(a.count)]

for epoch in acp.train_epoch_range(a.epochs, save_checkpoint_inter=0, state=state):
    if a.kill_at == epoch and not os.path.exists(marker):
        open(marker, "w").close()
        log.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    scale = 1.0
    if a.case == "spawn":
        noise = rng.spawn(1)[0].normal()
    elif a.case == "seedseq":
        noise = np.random.default_rng(ss.spawn(1)[0]).normal()
    elif a.case == "rebind":
        if epoch == 1:
            rng = np.random.default_rng(rng.integers(2**32))
        noise = rng.normal()
    elif a.case in ("nested", "value"):
        noise = 0.0
        scale = 1.0 / (1 + len(hist))
    else:
        noise = sum(r.normal() for r in rngs) / len(rngs)
    f = np.array([scale], "float32")
    (lv,) = exe.run(main_prog, feed={"x": XB, "y": YB + np.float32(noise), "factor": f}, fetch_list=[loss])
    if a.case in ("nested", "value"):
        hist.append(float(lv))
    if a.case == "nested":
        metrics["best"]["loss"] = min(metrics["best"]["loss"], float(lv))
    log.write(json.dumps({"epoch": epoch, "noise": float(noise).hex(), "scale": scale, "loss": float(lv).hex(),
                          "pid": os.getpid()}) + "\n")
    log.flush()

scope = paddle.static.global_scope()
np.savez(os.path.join(a.out, "final.npz"), **{n: np.array(scope.find_var(n).get_tensor()) for n in ("w", "b")})
summary = {}
if a.case in ("spawn", "rebind"):
    summary = {"next": float(rng.normal()).hex(), "children": int(rng.bit_generator.seed_seq.n_children_spawned)}
elif a.case == "seedseq":
    summary = {"children": ss.n_children_spawned}
elif a.case == "nested":
    summary = {"metrics": metrics, "hist_is_held": metrics["hist"] is hist}
elif a.case == "value":
    summary = {"value": v.value, "hist_is_held": v.value is hist}
else:
    summary = {"next": [float(r.normal()).hex() for r in rngs]}
with open(os.path.join(a.out, "final.json"), "w") as f:
    json.dump(summary, f)
open(os.path.join(a.out, "done"), "w").close()
