#!/usr/bin/env python
"""A restart's restore through the real path, against the floor of reading the same bytes (issue 44).

Each measurement is a fresh process that builds a static program of 50 float32 parameters (``--sizes``
MB of state, plus one tiny trained parameter: the step itself costs next to nothing), runs its startup
program, opens ``train_epoch_range`` on a location holding a committed checkpoint of that state and runs
its first step. Its figures:

- restore: the range's open -> the state in the scope (the log line "restored program"): the read, the
  checksums and the copy into the scope's tensors (the package's runtime imported before: import_s apart);
- first step: the range's open -> the first ``Executor.run`` returned (restore + the step);
- RSS: the process's peak resident memory (VmHWM) once the snapshot buffer is populated, minus that of
  the same restart on an empty location (no checkpoint: the buffer is populated in the background).

The floor (another fresh process): a plain ``readinto`` of the data file into a preallocated, touched
buffer and a two-thread memcpy of it into populated buffers (the scope's tensors; as ci/bench/local_costs.py's figure 3); warm: the same with the file in
the page cache. Cold rounds drop the checkpoint's files from the page cache first
(``posix_fadvise(DONTNEED)``) and pause ``--settle`` seconds; warm ones read them once first. Remote
rounds (no eviction on the server) compare the restore with the pyarrow read under the same conditions. ``--before DIR`` adds the same restart
with the paddle_acp package in DIR (e.g. ``git archive 960c25c paddle_acp | tar -x -C DIR``), each
round running every variant back to back in a rotated order.

``--backend s3`` or ``hdfs`` (real servers, tests/support/servers.py): the checkpoint on that store; the
floor is then a plain pyarrow read of the file (``open_input_stream().readinto``) + the memcpy; ``--cache``
adds PADDLE_ACP_LOCAL_CACHE (the node-local copy the restore reads instead).

    python ci/bench/restore.py --sizes 1200,300 --rounds 5 [--before /tmp/acp-before] [--key KEY | --json FILE]

The run is added to ci/bench/results/restore.json under --key (or written alone to --json FILE).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)  # not REPO: the restart children import paddle_acp from their PYTHONPATH (--before)
import results_io  # noqa: E402

NPARAMS = 50
JOB = "bench-restore"


# -- the child processes ------------------------------------------------------------------
def _vm(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _build(mb: int):
    import paddle

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    n = (mb << 20) // 4 // NPARAMS
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [1, 1], "float32")
        for i in range(NPARAMS):
            paddle.static.create_parameter([n], "float32", name=f"p{i}",
                                           default_initializer=paddle.nn.initializer.Constant(0.5))
        w = paddle.static.create_parameter([1], "float32", name="w")
        loss = paddle.mean(x * w)
        paddle.optimizer.SGD(0.1).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    return paddle, main, exe, loss


def child_train(mb: int, out: str, save: bool) -> None:
    """save: one epoch, its checkpoint committed. Else a restart: open, restore, first step, report."""
    import logging

    import numpy as np

    paddle, main, exe, loss = _build(mb)
    import paddle_acp as acp
    from paddle_acp.runtime.state import STATE

    restored = []

    class Mark(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "restored program" in record.getMessage():
                restored.append(time.perf_counter())

    log = logging.getLogger("paddle_acp")
    log.addHandler(Mark())
    log.setLevel(logging.INFO)
    feed = {"x": np.ones((1, 1), np.float32)}
    # the package's runtime is imported on first use (paddle_acp.__getattr__): a cost of any restart with the
    # package, checkpoint or not (0.15-0.37 s here, where PYTHONDONTWRITEBYTECODE=1 compiles it each time),
    # measured apart (import_s) so that restore_s is the range's open -> the state in the scope
    ti = time.perf_counter()
    train_epoch_range = acp.train_epoch_range
    import_s = time.perf_counter() - ti
    rss0 = _vm("VmRSS")
    t0 = time.perf_counter()
    for _epoch in train_epoch_range(2 if not save else 1):
        t1 = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[loss])
        t2 = time.perf_counter()
        exe.run(main, feed=feed, fetch_list=[loss])
        t3 = time.perf_counter()
        if save:
            continue
        r = STATE.active
        assert r is not None
        r.persister.buffers.join()  # the snapshot buffer populated (a restart without a checkpoint: in the background)
        r.persister.buffers.ready()
        res = {"import_s": import_s, "open_s": t1 - t0, "restore_s": (restored[0] - t0) if restored else None, "first_step_s": t2 - t0,
               "second_step_s": t3 - t2, "restored": bool(restored), "hwm": _vm("VmHWM"), "rss_before": rss0}
        with open(out, "w") as f:
            json.dump(res, f)
        os._exit(0)  # no save at the epoch's end: every round restores the same checkpoint


def child_floor(path: str, size: int, out: str, remote: str) -> None:
    """A plain read of the file into a fresh buffer + a two-thread memcpy into populated buffers."""
    import threading

    import numpy as np

    dst = np.ones(size, np.uint8)  # the scope's tensors: populated
    src = np.ones(size, np.uint8)  # preallocated and touched (ci/bench/local_costs.py's figure 3 floor)
    t0 = time.perf_counter()
    if remote:
        from paddle_acp.storage import open_storage

        st = open_storage(remote)
        with st.fs.open_input_stream(st.full(path)) as f:  # type: ignore[attr-defined]
            mv, got = memoryview(src), 0
            while got < size:
                got += f.readinto(mv[got:])
    else:
        with open(path, "rb", buffering=0) as f:  # 16 MB reads, sequential readahead (as the restore asks for)
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            mv, got = memoryview(src), 0
            while got < size:
                got += f.readinto(mv[got:got + (16 << 20)])
    t1 = time.perf_counter()
    half = size // 2
    th = threading.Thread(target=np.copyto, args=(dst[:half], src[:half]))
    th.start()
    np.copyto(dst[half:], src[half:])
    th.join()
    t2 = time.perf_counter()
    with open(out, "w") as f:
        json.dump({"read_s": t1 - t0, "memcpy_s": t2 - t1, "floor_s": t2 - t0}, f)


# -- the parent -----------------------------------------------------------------------------
def drop_cache(root: str) -> None:
    for d, _dirs, files in os.walk(root):
        for name in files:
            try:
                fd = os.open(os.path.join(d, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def warm_up(root: str) -> None:
    """Read every file under ``root`` once (into the page cache) before a warm round."""
    for d, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(d, name), "rb", buffering=0) as f:
                while f.read(16 << 20):
                    pass


def run(cmd, env, out):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    if p.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{cmd[2:]} failed (rc {p.returncode}): {p.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1200,300", help="state sizes in MB, comma-separated")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--settle", type=float, default=1.0, help="seconds of pause before each cold read")
    ap.add_argument("--before", default=None, help="a directory holding the paddle_acp package to compare with")
    ap.add_argument("--backend", default="local", choices=("local", "s3", "hdfs"))
    ap.add_argument("--cache", action="store_true", help="remote: with PADDLE_ACP_LOCAL_CACHE")
    ap.add_argument("--no-warm", action="store_true")
    ap.add_argument("--dir", default=None, help="where the local checkpoints go (default: a temporary directory)")
    results_io.add_args(ap, __file__)
    ap.add_argument("--_child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        kind = args._child[0]
        if kind == "floor":
            child_floor(args._child[1], int(args._child[2]), args._child[3], args._child[4] if len(args._child) > 4 else "")
        else:
            child_train(int(args._child[1]), args._child[2], kind == "save")
        return 0
    work = tempfile.mkdtemp(prefix="acp-bench-restore-", dir=args.dir)
    base_env = dict(os.environ, PADDLE_ACP_LOG_LEVEL="WARNING", PADDLE_JOB_ID=JOB, PADDLE_ACP_CONNECT_EARLY="0")
    for k in ("PADDLE_ACP_CHECKPOINT_URI", "PADDLE_ACP_HOST_MEMORY", "PADDLE_ACP_LOCAL_CACHE"):
        base_env.pop(k, None)
    srv = None
    if args.backend != "local":
        sys.path.insert(0, os.path.join(REPO, "tests"))
        from support import servers

        srv = (servers.S3Server() if args.backend == "s3" else servers.HDFSServer()).__enter__()
        base_env.update(srv.client_env())
        os.environ.update(srv.client_env())  # this process looks up the data file's size
    variants = {"after": REPO}
    if args.before:
        variants["before"] = os.path.abspath(args.before)
    results: dict = {"backend": args.backend, "cache": args.cache, "rounds": args.rounds, "sizes": {}}
    me = [sys.executable, os.path.abspath(__file__), "--_child"]
    try:
        for mb in [int(s) for s in args.sizes.split(",") if s.strip()]:
            if srv is not None:
                uri = f"{srv.uri}/bench-restore/{mb}-{os.getpid()}"
                empty_uri = f"{srv.uri}/bench-restore/{mb}-{os.getpid()}-empty"
            else:
                uri, empty_uri = os.path.join(work, f"ckpt-{mb}"), os.path.join(work, f"empty-{mb}")
            env = dict(base_env, PYTHONPATH=REPO, PADDLE_ACP_CHECKPOINT_URI=uri)
            if args.cache:
                env["PADDLE_ACP_LOCAL_CACHE"] = os.path.join(work, "cache")
            saved = subprocess.run(me + ["save", str(mb), "-"], env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
            if saved.returncode != 0:
                raise RuntimeError(f"the save failed (rc {saved.returncode}): {saved.stderr[-3000:]}")
            rel = f"{JOB}/range/_range_0/ckpt-e0/rank-0/tensors.bin"
            data = os.path.join(uri, rel) if srv is None else rel
            if srv is None:
                size = os.path.getsize(data)
            else:
                from paddle_acp.storage import open_storage

                size = open_storage(uri).size(rel)
            rows: dict = {}
            names = ["floor"] + [f"restore-{v}" for v in variants] + ["no-checkpoint"]
            for r in range(args.rounds):
                order = names[r % len(names):] + names[:r % len(names)]  # rotated
                for warm in ((False,) if args.no_warm else (False, True)):
                    for name in order:
                        if name == "no-checkpoint" and warm:
                            continue
                        if not warm:
                            if srv is None:
                                drop_cache(uri)
                            if args.cache:
                                drop_cache(os.path.join(work, "cache"))
                            time.sleep(args.settle)
                        elif srv is None:
                            warm_up(uri)
                        out = os.path.join(work, f"{name}-{r}-{warm}.json")
                        if name == "floor":
                            cmd = me + ["floor", data, str(size), out] + ([uri] if srv is not None else [])
                            res = run(cmd, dict(base_env, PYTHONPATH=REPO), out)
                        else:
                            variant = name.split("-", 1)[1] if name.startswith("restore-") else "after"
                            e = dict(env, PYTHONPATH=variants[variant])
                            if name == "no-checkpoint":
                                e["PADDLE_ACP_CHECKPOINT_URI"] = empty_uri + f"-{r}"
                            res = run(me + ["restart", str(mb), out], e, out)
                            if name != "no-checkpoint" and not res["restored"]:
                                raise RuntimeError(f"{name}: nothing restored")
                        rows.setdefault(f"{name}{'-warm' if warm else ''}", []).append(res)
                        print(f"[restore] {mb} MB round {r} {name}{' warm' if warm else ''}: "
                              + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()),
                              flush=True)
            results["sizes"][str(mb)] = summarize(rows, variants, size, args.no_warm)
    finally:
        if srv is not None:
            srv.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=1))
    print(f"[restore] wrote {results_io.write(results, __file__, args.json, args.key)}")
    return 0


def summarize(rows: dict, variants: dict, size: int, no_warm: bool) -> dict:
    """Per round ratios (each against the floor of the same round), then their medians."""
    out: dict = {"bytes": size}
    base = rows["no-checkpoint"]
    for warm in ((False,) if no_warm else (False, True)):
        sfx = "-warm" if warm else ""
        floors = [x["floor_s"] for x in rows[f"floor{sfx}"]]
        out[f"floor{sfx}_s"] = [round(x, 3) for x in floors]
        for v in variants:
            runs = rows[f"restore-{v}{sfx}"]
            ratios = [x["restore_s"] / f for x, f in zip(runs, floors)]
            entry = {"restore_s": [round(x["restore_s"], 3) for x in runs],
                     "ratio_per_round": [round(x, 3) for x in ratios], "ratio_median": round(statistics.median(ratios), 3),
                     "first_step_after_restore_s": [round(x["first_step_s"] - x["restore_s"], 3) for x in runs],
                     "import_s": [round(x.get("import_s", 0.0), 3) for x in runs]}
            if not warm:
                entry["rss_above_no_checkpoint_mb"] = [round((x["hwm"] - b["hwm"]) / 2**20, 1) for x, b in zip(runs, base)]
            out[f"restore-{v}{sfx}"] = entry
    out["no-checkpoint_first_step_s"] = [round(x["first_step_s"], 3) for x in base]
    out["no-checkpoint_open_s"] = [round(x["open_s"], 3) for x in base]  # the range's open without any checkpoint
    return out


if __name__ == "__main__":
    sys.exit(main())
