#!/usr/bin/env python
"""Training script for tests/e2e/test_arena_first_save.py: a range whose snapshot arena is not populated
when its first saves come due.

The library populates the snapshot buffer on a background thread (``paddle-acp-arena``) at a lower
priority from the program's registration on. Here that thread gets almost no CPU, as a low-priority
thread on a host loaded with other work: it starts on a CPU where a CPU hog (a child process) runs
(the training thread registers the program there), and a watcher thread moves it to ``SCHED_IDLE``
the moment it runs, and the training thread back to its own CPU. Before the end of epoch
``--release-at`` (the save that must populate the arena) the arena thread goes back to the training
CPU, still ``SCHED_IDLE``: a chunk it holds the address-space lock for then completes whenever training
waits, instead of after minutes beside the hog.
One fc layer ``--width`` x ``--width`` with Adam (12 bytes per weight).

Writes ``--out``/result.json: {"boundaries": seconds the training thread spent at each epoch's end (the
save, or its skip, and the range's close), "starved": whether the arena thread was moved while more
of the arena than a save skips for was still unclaimed}.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--width", type=int, default=4000)
    p.add_argument("--sleep", type=float, default=0.2, help="seconds of 'compute' per epoch")
    p.add_argument("--release-at", type=int, default=None,
                   help="the epoch before whose end the arena thread goes back to the training CPU (default: "
                        "min(2, epochs - 1)): from then on it runs whenever training waits, as on any host, "
                        "so that a save populating the arena does not wait behind a chunk it holds")
    args = p.parse_args()
    if args.release_at is None:
        args.release_at = min(2, args.epochs - 1)
    cpus = sorted(os.sched_getaffinity(0))
    hog_cpu, train_cpu = cpus[0], cpus[-1]
    os.sched_setaffinity(0, {train_cpu})
    hogs = [subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{hog_cpu}}})\nwhile True: pass"])
            for _ in range(1)]
    try:
        return train(args, hog_cpu, train_cpu)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


class Watcher(threading.Thread):
    """Moves the arena thread to SCHED_IDLE on the hog's CPU as soon as it runs."""

    def __init__(self, hog_cpu, train_cpu):
        super().__init__(daemon=True)
        self.cpu, self.train_cpu = hog_cpu, train_cpu
        self.main_tid = threading.get_native_id()
        self.arena_tid = None
        self.starved = None  # whether the arena was still being populated when its thread was moved
        self.done = threading.Event()

    def run(self):
        import paddle_acp as acp
        from paddle_acp.runtime import save_decision  # (ARENA_SKIP_BYTES' home)

        os.sched_setaffinity(0, {self.train_cpu})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for t in threading.enumerate():
                if t.name == "paddle-acp-arena" and t.native_id is not None:
                    self.arena_tid = t.native_id
                    try:
                        os.sched_setaffinity(t.native_id, {self.cpu})
                        os.sched_setscheduler(t.native_id, os.SCHED_IDLE, os.sched_param(0))
                    except ProcessLookupError:  # it ended already
                        self.starved = False
                    else:
                        r = acp.active_range()
                        # more than a save skips for, unclaimed (a library without ``unpopulated`` always
                        # waited for this thread)
                        left = getattr(r.persister.buffers, "unpopulated", None) if r is not None else 0
                        self.starved = left is None or left >= save_decision.ARENA_SKIP_BYTES + (32 << 20)
                    os.sched_setaffinity(self.main_tid, {self.train_cpu})  # training goes on on its own CPU
                    self.done.set()
                    return
            time.sleep(0.0005)
        self.done.set()


    def release(self):
        """The arena thread back on the training CPU (still SCHED_IDLE: it runs when training waits)."""
        if self.arena_tid is not None:
            try:
                os.sched_setaffinity(self.arena_tid, {self.train_cpu})
            except ProcessLookupError:  # it ended
                pass


def train(args, hog_cpu, train_cpu):
    import numpy as np
    import paddle

    import paddle_acp as acp

    paddle.enable_static()
    paddle.seed(1)
    np.random.seed(1)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, args.width], "float32")
        h = paddle.static.nn.fc(x, args.width)
        loss = paddle.mean(h * h)
        paddle.optimizer.Adam(1e-4).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    feed = {"x": np.random.rand(2, args.width).astype("float32")}
    watcher = Watcher(hog_cpu, train_cpu)
    watcher.start()
    # until the watcher moved it: this thread, and the arena thread it starts at the program's
    # registration (threads inherit their creator's CPUs), beside the hog
    os.sched_setaffinity(0, {hog_cpu})
    boundaries = []
    it = iter(acp.train_epoch_range(args.epochs, save_checkpoint_inter=0))
    epoch = 0
    while True:
        if epoch == args.release_at + 1:  # next(it) ends epoch release_at
            watcher.release()
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            boundaries.append(time.perf_counter() - t0)
            break
        if epoch > 0:
            boundaries.append(time.perf_counter() - t0)
        exe.run(main, feed=feed, fetch_list=[loss])  # the first run registers the program
        if epoch == 0:
            watcher.done.wait(120)
        time.sleep(args.sleep)
        epoch += 1
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"boundaries": boundaries, "starved": watcher.starved}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
