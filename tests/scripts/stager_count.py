#!/usr/bin/env python
"""Training script for tests/e2e/test_stager.py: a range whose every copy between the scope's tensors and
checkpoint bytes is counted by the stager it goes through.

The range's stager (``paddle_acp.runtime.range.HostStager``, the one a device stager would replace) is
wrapped by a counting subclass before the range opens; nothing else is replaced (real storage, real saves,
a real restore in a second process). One fc layer ``--width`` x ``--width`` with Adam.

Writes ``--out``: {"save": the byte sizes of each save's staged copies, "restore": (address, bytes) of each
copy or read staged while the first step runs (the restore), "tensors": {name: (address, bytes)} of the program's
initialized persistable tensors before that step, "loss": the first step's loss (computed before its update),
"final_loss": the loss of the state the range ended with (a step after it, fetched before its update)}.
"""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--width", type=int, default=512)
    args = p.parse_args()

    import numpy as np
    import paddle

    import paddle_acp as acp
    import paddle_acp.runtime.range as range_mod
    from paddle_acp.format.engine.stager import HostStager

    phase = ["open"]
    staged = {"open": [], "save": [], "restore": [], "step": [], "after": []}

    class CountingStager(HostStager):
        def stage(self, pairs):
            staged[phase[0]].append([(int(d.ctypes.data), int(d.nbytes)) for d, _ in pairs])
            super().stage(pairs)

        def fill(self, jobs):  # a restore out of a local file read (preadv) into the tensors
            staged[phase[0]].append([(int(d.ctypes.data), int(d.nbytes)) for d, _ in jobs])
            super().fill(jobs)

    range_mod.HostStager = CountingStager

    paddle.enable_static()
    paddle.seed(1)
    np.random.seed(1)
    main_prog, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_prog, startup):
        x = paddle.static.data("x", [None, args.width], "float32")
        h = paddle.static.nn.fc(x, args.width)
        loss = paddle.mean(h * h)
        paddle.optimizer.Adam(1e-3).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    feed = {"x": np.random.rand(4, args.width).astype("float32")}
    scope = paddle.static.global_scope()
    tensors, first_loss = {}, None
    for _epoch in acp.train_epoch_range(args.epochs, save_checkpoint_inter=0):
        if first_loss is None:
            for v in main_prog.list_vars():
                var = scope.find_var(v.name) if v.persistable else None
                t = var.get_tensor() if var is not None else None
                if t is not None and t._is_initialized():
                    tensors[v.name] = (int(t._ptr()), int(np.array(t).nbytes))
            phase[0] = "restore"
        else:
            phase[0] = "step"
        out = exe.run(main_prog, feed=feed, fetch_list=[loss])
        if first_loss is None:
            first_loss = float(np.asarray(out[0]))
        phase[0] = "save"  # the epoch's end (next(it)) saves
    phase[0] = "after"
    final = float(np.asarray(exe.run(main_prog, feed=feed, fetch_list=[loss])[0]))  # its forward: the state as ended
    with open(args.out, "w") as f:
        json.dump({"save": [[n for _a, n in call] for call in staged["save"]], "restore": staged["restore"],
                   "open": staged["open"], "step": staged["step"], "tensors": tensors, "loss": first_loss,
                   "final_loss": final}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
