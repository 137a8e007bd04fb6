#!/usr/bin/env python
"""Paddle's own auto-checkpoint scenarios, written against Paddle's module API.

Used two ways by ``tests/e2e/test_compat_scenarios.py``:

* as a script, run twice (a real restart) under
  ``python -m paddle_acp run compat_scenarios.py --out result.json --scenario ...``;
  it imports Paddle's module names, which the runner points at
  ``paddle_acp.compat.auto_checkpoint``;
* in-process: the test imports this file and calls :func:`run_scenario` with
  ``paddle_acp.compat.auto_checkpoint``, calling ``paddle_acp.simulate_restart()``
  between the two "processes".

The IR is whatever Paddle is in: legacy IR (``FLAGS_enable_pir_api=0`` or
``paddle.pir_utils.OldIrGuard``) trains through ``paddle.static.CompiledProgram``
and ``DataLoader.from_generator`` as Paddle's tests did; PIR runs the program
itself with feed dicts (``CompiledProgram`` rejects PIR programs).

Scenarios (each with its own ``PADDLE_JOB_ID`` suffix when run as a script):

* ``full``: a 3-epoch range, saving every epoch.
* ``break0`` / ``break1`` / ``break2``: leave the loop with ``break`` in that epoch.
* ``multi``: one executor, two training programs, ``break`` in epoch 2.

``break`` happens only in the first run; the restart (``--restart``) runs the
loop to its end, as Paddle's tests' ``_run_load_0`` did.
* ``plain``: the same loop; the test runs it without ``PADDLE_RUNNING_ENV``.
* ``checker``: ``AutoCheckpointChecker`` with the environment, and with
  ``PADDLE_JOB_ID`` removed.
* ``saver``: ``CheckpointSaver`` + ``PaddleModel`` over ``LocalFS``.

Every result is plain JSON data; losses are float hex strings so two runs can
be compared bit for bit.
"""
import argparse
import hashlib
import json
import os
import random
import sys

import numpy as np
import paddle

EPOCHS = 3
BATCHES = 4
BATCH_SIZE = 2
CLASSES = 2
TRAIN_SCENARIOS = ("full", "break0", "break1", "break2", "multi", "plain")
ALL_SCENARIOS = TRAIN_SCENARIOS + ("checker", "saver")


def in_pir():
    return bool(paddle.framework.in_pir_mode())


def sample_generator():
    """Paddle's tests' reader: BATCHES batches of [image(4x4), label] lists, from NumPy's global RNG."""
    def reader():
        for _ in range(BATCHES):
            yield [
                (np.random.random((4, 4)).astype("float32"),
                 np.random.randint(0, CLASSES, size=(1,)).astype("int64"))
                for _ in range(BATCH_SIZE)
            ]
    return reader


class Model:
    """One small classifier with explicitly named parameters (stable across restarts)."""

    def __init__(self, prefix, exe, lr=0.1):
        self.exe = exe
        self.prefix = prefix
        self.main = paddle.static.Program()
        self.startup = paddle.static.Program()
        self.w_name, self.b_name = prefix + "fc.w", prefix + "fc.b"
        with paddle.static.program_guard(self.main, self.startup):
            image = paddle.static.data(prefix + "image", [-1, 4, 4], "float32")
            label = paddle.static.data(prefix + "label", [-1, 1], "int64")
            logits = paddle.static.nn.fc(
                image, CLASSES,
                weight_attr=paddle.ParamAttr(name=self.w_name),
                bias_attr=paddle.ParamAttr(name=self.b_name))
            self.loss = paddle.mean(paddle.nn.functional.cross_entropy(logits, label))
            paddle.optimizer.SGD(learning_rate=lr).minimize(self.loss)
            self.loader = None
            if not in_pir():
                self.loader = paddle.base.io.DataLoader.from_generator(
                    feed_list=[image, label], capacity=8, use_double_buffer=True, iterable=True)
                self.loader.set_sample_list_generator(sample_generator(), paddle.CPUPlace())
        self.image, self.label = prefix + "image", prefix + "label"
        # What exe.run gets: a CompiledProgram in legacy IR (as Paddle's tests), the program in PIR.
        self.runnable = self.main if in_pir() else paddle.static.CompiledProgram(self.main)
        exe.run(self.startup)

    def feeds(self):
        if self.loader is not None:
            yield from self.loader()
            return
        for batch in sample_generator()():
            yield {
                self.image: np.stack([s[0] for s in batch]),
                self.label: np.stack([s[1] for s in batch]),
            }

    def train_epoch(self):
        losses = []
        for feed in self.feeds():
            (loss,) = self.exe.run(self.runnable, feed=feed, fetch_list=[self.loss])
            losses.append(float(np.asarray(loss).reshape(-1)[0]).hex())
        return losses

    def params(self):
        scope = paddle.static.global_scope()
        return {n: np.array(scope.find_var(n).get_tensor()) for n in (self.w_name, self.b_name)}


def digest(arrays):
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode() + b"\0" + np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()[:16]


def seed_all(n):
    paddle.seed(n)
    np.random.seed(n)
    random.seed(n)


# -- scenarios ------------------------------------------------------------------
def run_range(acp, models, break_at=None, epochs=EPOCHS):
    """Paddle's test loop: train every model each epoch, watch the range object."""
    exe_seen = models[0].exe
    res = {"epochs": [], "restored_from": [], "n_status": [], "status_restored": [],
           "losses": {}, "range_name": None, "range_is_stable": True,
           "can_auto_checkpoint": [], "none_before": acp._get_train_epoch_range() is None}
    for i in acp.train_epoch_range(epochs, 0):
        o = acp._get_train_epoch_range()
        res["epochs"].append(i)
        if o is not None:
            res["range_name"] = o.name
            res["restored_from"].append(o.restored_from)
            assert o.get() == i, (o.get(), i)
        res["losses"][str(i)] = [m.train_epoch() for m in models]
        res["can_auto_checkpoint"].append([acp._can_auto_checkpoint(m.runnable) for m in models])
        if o is not None:
            res["range_is_stable"] &= acp._get_train_epoch_range() is o
            status = o._exe_status
            res["n_status"].append(len(status))
            res["status_restored"].append(sorted(t._restored_from for t in status.values()))
            assert all(t._epoch_no == i for t in status.values())
        if break_at is not None and i == break_at:
            break
    res["none_after"] = acp._get_train_epoch_range() is None
    res["final"] = digest({k: v for m in models for k, v in m.params().items()})
    assert exe_seen is models[0].exe
    return res


def scenario_train(acp, name, restart):
    seed_all(2024)
    exe = paddle.static.Executor(paddle.CPUPlace())
    if name == "multi":
        models = [Model(name + "_a_", exe), Model(name + "_b_", exe)]
        return run_range(acp, models, break_at=None if restart else 2)
    models = [Model(name + "_", exe)]
    break_at = int(name[5:]) if name.startswith("break") and not restart else None
    res = run_range(acp, models, break_at=break_at)
    checker = acp.AutoCheckpointChecker()
    res["checker_valid"] = checker.valid()
    return res


def scenario_checker(acp, name):
    c = acp.AutoCheckpointChecker()
    res = {
        "valid": c.valid(), "run_env": c.run_env, "platform": c.platform, "job_id": c.job_id,
        "trainer_id": c.trainer_id, "hdfs_home": c.hdfs_home, "hdfs_name": c.hdfs_name,
        "hdfs_checkpoint_path": c.hdfs_checkpoint_path, "ce_test": c.ce_test,
        "save_checkpoint_inter": c.save_checkpoint_inter, "str": str(c),
        "job_path": c.get_job_path(), "range_path": c.get_range_checkpoint_path("_range_0"),
        "exe_path": c.get_exe_checkpoint_path("k"),
    }
    saved = os.environ.pop("PADDLE_JOB_ID", None)
    try:
        acp.AutoCheckpointChecker()
        res["missing_job_id"] = None
    except Exception as exc:  # the test checks the type and the message
        res["missing_job_id"] = [type(exc).__name__, str(exc), isinstance(exc, ValueError)]
    finally:
        if saved is not None:
            os.environ["PADDLE_JOB_ID"] = saved
    return res


def scenario_saver(acp, name, root):
    """First run: junk names + 3 checkpoints, keep the newest 2. Later runs: load the newest, 3 more, keep 1."""
    from paddle.distributed.fleet.utils.fs import LocalFS

    fs = LocalFS()
    seed_all(7)
    exe = paddle.static.Executor(paddle.CPUPlace())
    model = Model(name + "_", exe)
    saver = acp.CheckpointSaver(fs)
    res = {"before": saver.get_checkpoint_no(root)}
    first = not res["before"]
    if first:
        for junk in ("exe.exe", "exe.1", "exe", "__paddle_checkpoint__.exe"):
            fs.mkdirs(f"{root}/{junk}")
        res["junk_only"] = saver.get_checkpoint_no(root)
    else:
        saver.load_checkpoint(root, [acp.PaddleModel(exe, model.runnable)], trainer_id=0)
        res["loaded"] = digest(model.params())
    res["saved"] = []
    for _ in range(3):
        model.train_epoch()
        path, no = saver.save_checkpoint(root, [acp.PaddleModel(exe, model.runnable)], trainer_id=0)
        res["saved"].append([os.path.basename(path), no, digest(model.params())])
    res["after_save"] = saver.get_checkpoint_no(root)
    if first:
        res["deleted"] = saver.clean_redundant_checkpoints(root, keep_last=2)
    else:
        res["deleted"] = saver.clean_redundant_checkpoints(root)
    res["after_clean"] = saver.get_checkpoint_no(root)
    res["tmp_left"] = sorted(d for d in os.listdir(root) if d.endswith(".tmp"))
    return res


def run_scenario(acp, name, restart=False, saver_root=None):
    """Run one scenario with ``acp`` (Paddle's module API); ``restart``: the second run."""
    if name in TRAIN_SCENARIOS:
        return scenario_train(acp, name, restart)
    if name == "checker":
        return scenario_checker(acp, name)
    if name == "saver":
        return scenario_saver(acp, name, saver_root)
    raise ValueError("unknown scenario %r" % name)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file for the results")
    p.add_argument("--scenario", action="append", choices=ALL_SCENARIOS, required=True)
    p.add_argument("--saver-root", default=None)
    p.add_argument("--restart", action="store_true", help="the run after the restart: no break")
    args = p.parse_args(argv)

    # Paddle's module names: `python -m paddle_acp run` points them at paddle_acp.compat.auto_checkpoint.
    from paddle.base.incubate.checkpoint import auto_checkpoint as acp_base
    from paddle.incubate.checkpoint import auto_checkpoint as acp

    paddle.enable_static()
    base_job = os.environ.get("PADDLE_JOB_ID")
    results = {"module": acp.__name__, "same_module": acp is acp_base, "pir": in_pir(), "pid": os.getpid()}
    for name in args.scenario:
        if base_job is not None:
            os.environ["PADDLE_JOB_ID"] = "%s-%s" % (base_job, name)
        results[name] = run_scenario(acp, name, args.restart, args.saver_root)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    print("compat_scenarios: done", ", ".join(args.scenario))
    return 0


if __name__ == "__main__":
    sys.exit(main())
