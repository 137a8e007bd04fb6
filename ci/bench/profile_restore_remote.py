#!/usr/bin/env python
"""Where a remote restore's time goes (issue 44): one restore per variant, its main thread's waits for the ranged
reads, the checksums and the copy into the tensors summed (by wrapping those functions in the child process only).

A real HDFS (or S3) server from tests/support/servers.py holds a checkpoint written by ci/bench/restore.py's save child;
each round runs every variant (ranged readers 4/1/2, with or without populating each range of the lent arena before its
read) in a rotated order, then restore.py's floor (a plain pyarrow read + memcpy).

    python ci/bench/profile_restore_remote.py --backend hdfs --mb 1000 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
REL = "bench-restore/range/_range_0/ckpt-e0/rank-0/tensors.bin"
VARIANTS = [(4, False), (4, True), (1, False), (2, True)]


def child(mb: int, readers: int, populate: bool) -> None:
    import ctypes

    sys.path.insert(0, HERE)
    import numpy as np
    import restore

    _paddle, main, exe, loss = restore._build(mb)
    import paddle_acp as acp
    from paddle_acp.format import manifest
    from paddle_acp.format.engine import chunks, stager

    t: dict = {"read_wait_s": 0.0, "crc_s": 0.0, "copy_s": 0.0, "read_s": 0.0, "populate_s": 0.0}
    lock = threading.Lock()
    libc = ctypes.CDLL(None, use_errno=True)
    init, get, read, stage, checksum_function = (chunks.RangedChunks.__init__, chunks.RangedChunks.get,
                                                 chunks.RangedChunks._read, stager.HostStager.stage,
                                                 manifest.checksum_function)

    def timed(key, fn, *a):
        t0 = time.perf_counter()
        try:
            return fn(*a)
        finally:
            with lock:
                t[key] += time.perf_counter() - t0

    def ranged_read(self, pos, n):
        if populate:  # MADV_POPULATE_WRITE on the range before the read
            addr = self._image[pos:pos + n].ctypes.data
            base = addr // 4096 * 4096
            timed("populate_s", libc.madvise, ctypes.c_void_p(base), ctypes.c_size_t(addr + n - base), 23)
        timed("read_s", read, self, pos, n)

    def crc(version):
        fn = checksum_function(version)
        return lambda buf, c: timed("crc_s", fn, buf, c)

    chunks.RangedChunks.__init__ = lambda self, *a, **k: init(self, *a[:4], readers=readers)  # (the reader passes it 5th)
    chunks.RangedChunks.get = lambda self, pos, n, slot: timed("read_wait_s", get, self, pos, n, slot)
    chunks.RangedChunks._read = ranged_read
    stager.HostStager.stage = lambda self, pairs: timed("copy_s", stage, self, pairs)
    manifest.checksum_function = crc
    feed = {"x": np.ones((1, 1), np.float32)}
    train_epoch_range = acp.train_epoch_range
    t0 = time.perf_counter()
    for _ in train_epoch_range(2):
        t1 = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[loss])
        print(json.dumps(dict(readers=readers, populate=populate, open_s=round(t1 - t0, 3),
                              first_run_s=round(time.perf_counter() - t1, 3), **{k: round(v, 3) for k, v in t.items()})),
              flush=True)
        os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="hdfs", choices=("hdfs", "s3"))
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--_child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        child(args._child[0], args._child[1], bool(args._child[2]))
        return 0
    sys.path.insert(0, os.path.join(REPO, "tests"))
    sys.path.insert(0, REPO)
    from support import servers

    from paddle_acp.storage import open_storage

    with (servers.S3Server() if args.backend == "s3" else servers.HDFSServer()) as srv:
        env = dict(os.environ, PADDLE_ACP_LOG_LEVEL="WARNING", PADDLE_JOB_ID="bench-restore", PADDLE_ACP_CONNECT_EARLY="0",
                   PYTHONPATH=REPO, PADDLE_ACP_CHECKPOINT_URI=f"{srv.uri}/profile-restore/{args.mb}-{os.getpid()}",
                   **srv.client_env())
        os.environ.update(srv.client_env())
        run = subprocess.run([sys.executable, os.path.join(HERE, "restore.py"), "--_child", "save", str(args.mb), "-"],
                             env=env, capture_output=True, text=True, cwd=REPO)
        if run.returncode != 0:
            raise RuntimeError(f"the save failed: {run.stderr[-3000:]}")
        size = open_storage(env["PADDLE_ACP_CHECKPOINT_URI"]).size(REL)
        for r in range(args.rounds):
            for readers, populate in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
                run = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", str(args.mb), str(readers),
                                      str(int(populate))], env=env, capture_output=True, text=True, cwd=REPO)
                lines = [x for x in run.stdout.splitlines() if x.startswith("{")]
                print(r, lines[-1] if lines else run.stderr[-2000:], flush=True)
            out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"profile-restore-floor-{os.getpid()}.json")
            run = subprocess.run([sys.executable, os.path.join(HERE, "restore.py"), "--_child", "floor", REL, str(size),
                                  out, env["PADDLE_ACP_CHECKPOINT_URI"]], env=env, capture_output=True, text=True, cwd=REPO)
            print(r, "floor", open(out).read() if os.path.exists(out) else run.stderr[-2000:], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
