#!/usr/bin/env python3
"""Benchmark: one checkpoint of ~1 GB of training state per storage backend.

For each backend (local disk; HDFS through pyarrow/libhdfs, hdfs-native and the
``hadoop fs`` command line; S3), in the same run and on the same bytes:

* paddle-acp save  = a one-process job's save (``GlobalCheckpointer.save``, rank 0 of 1) of a Snapshot of real-size float32
  arrays (what the async saver thread does: data file from the page-aligned
  image, checksums, manifest, atomic commit, retention) vs a plain
  ``pyarrow.fs`` write of the same bytes through the same filesystem object;
* paddle-acp restore = the restart's ``load_newest`` (scan, manifest, full read
  into a new buffer, checksum verification) vs a plain ``pyarrow.fs`` read of the
  file into a new buffer (32 MB ``readinto`` pieces, like the reader);
* HDFS also: Paddle's ``paddle.distributed.fleet.utils.fs.HDFSClient``
  upload/download of the same file (through the test server's ``bin/hadoop``;
  run in a fresh Python process, as a Paddle job would).

Ratios are paddle-acp throughput / baseline throughput (> 1: paddle-acp faster).
Servers are real (tests/support/servers.py), on 127.0.0.1, started and stopped here. The
servers' disks are this machine's, so their page cache is warm; local reads are
made cold with posix_fadvise(DONTNEED), as after a restart. Plain local writes
are fsynced like paddle-acp's.

With ``--fixed-cost``: the fixed cost of one checkpoint per backend instead (a
tiny state, ``--checkpoints`` saves per round, paired rounds): the median time of
one save as the saver thread runs it (write, commit, retention, metrics line), and
the storage round trips it costs per operation kind (counted by a pass-through
``pyarrow.fs`` handler around the backend's filesystem; local data files written
with O_DIRECT and fsyncs bypass it). With ``--before-code DIR`` the paddle_acp of
another checkout (e.g. ``git worktree add /tmp/before <commit>``) is measured too,
each round's two runs in processes of their own against the same server.

With ``--cache``: restore time of one checkpoint (``--size-mb``) from HDFS with the node-local cache
(``PADDLE_ACP_LOCAL_CACHE``: the copy the writer kept, its manifest compared with the remote's, every
checksum verified) against a restore of the same checkpoint from a local URI and from HDFS without the
cache, paired rounds in one process (order rotating). A restore is what a restarted job does: the
newest checkpoint found, verified and written into the program's tensors (a real Paddle scope); the
local files (the local URI's and the cache's) are evicted from the page cache first.

With ``--training``: training time of the end-to-end script with a checkpoint every
epoch on HDFS against no checkpointing, paired rounds (tests/scripts/train_script.py
``--timing``: from the first epoch to the last checkpoint committed).

Usage: python ci/bench/storage_backends.py [--size-mb 1024] [--backends local,hdfs-pyarrow,...] [--quick]
       python ci/bench/storage_backends.py --fixed-cost [--before-code DIR] [--checkpoints 30] [--rounds 3]
       python ci/bench/storage_backends.py --cache [--size-mb 1024] [--rounds 5]
       python ci/bench/storage_backends.py --training [--epochs 60] [--sleep 0.1] [--hidden 200] [--rounds 3]
       (each: [--key KEY | --json FILE])
Prints one line per figure, then the JSON, which it adds to ci/bench/results/storage_backends.json under
--key (or writes alone to --json FILE).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))  # the test helpers: tests/support
if os.environ.get("ACP_BENCH_CODE"):  # --fixed-cost --before-code: a child measuring another checkout
    sys.path.insert(0, os.environ["ACP_BENCH_CODE"])

import results_io  # noqa: E402
from support import servers  # noqa: E402

BACKENDS = ["local", "hdfs-pyarrow", "hdfs-native", "hdfs-cli", "s3"]
MB = 1 << 20
READ_CHUNK = 32 * MB


def log(msg: str) -> None:
    print(msg, flush=True)


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6 if seconds > 0 else float("inf")


def make_snapshot(size: int):
    """A Snapshot of ~``size`` bytes shaped like a model + Adam moments, its tensors
    being views into the page-aligned image the async saver writes from."""
    import numpy as np

    from paddle_acp.format.engine.arena import Arena
    from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
    from paddle_acp.format.layout import layout
    from paddle_acp.format.manifest import RangeRecord

    # a few large weight matrices, a few biases; each with two Adam moments
    shares = [0.40, 0.30, 0.15, 0.10, 0.03, 0.02]
    weights = [max(1, int(size / 3 * s / 4)) for s in shares]
    tensors = []
    for i, n in enumerate(weights):
        for kind in ("", "_moment1", "_moment2"):
            tensors.append(TensorData(f"fc{i}.w{kind}", "float32", np.empty(n, dtype=np.float32)))
    tensors.append(TensorData("step", "int64", np.empty(1, dtype=np.int64)))
    prog = ProgramSnapshot("bench", "benchmark model", tensors, {"last_epoch": 0, "last_lr": 0.001})
    total = layout([prog])
    image = Arena().ensure(total)
    rng = np.random.default_rng(0)
    for t in tensors:
        view = image[t.offset:t.offset + t.array.nbytes].view(t.array.dtype)
        view[...] = rng.random(view.size, dtype=np.float32) if t.array.dtype == np.float32 else 7
        t.array = view
    snap = Snapshot(RangeRecord("_range_0", 0, 1), [prog], None, "3.3.1", "pir", image=image, data_size=total)
    return snap, image, total


def drop_local_cache(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_tree_cache(root: str) -> None:
    for d, _dirs, files in os.walk(root):
        for f in files:
            drop_local_cache(os.path.join(d, f))


def plain_write(fs, path: str, data, fsync_local: bool) -> float:
    """Sequential writes in the same pieces paddle-acp uses (one 1 GB write would
    be one 1 GB Java array in libhdfs)."""
    from paddle_acp.storage import WRITE_CHUNK

    mv = memoryview(data)
    t0 = time.perf_counter()
    with fs.open_output_stream(path) as out:
        for i in range(0, mv.nbytes, WRITE_CHUNK):
            out.write(mv[i:i + WRITE_CHUNK])
    if fsync_local:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def plain_read(fs, path: str, size: int):
    """Read into a freshly allocated buffer, as a restore must (the reader does
    the same); returns (seconds, buffer)."""
    import numpy as np

    t0 = time.perf_counter()
    buf = np.empty(size, dtype=np.uint8)
    with fs.open_input_file(path) as f:
        pos, n = 0, buf.nbytes
        while pos < n:
            got = f.readinto(memoryview(buf[pos:pos + READ_CHUNK]))
            if got <= 0:
                raise RuntimeError(f"short read at {pos}")
            pos += got
    return time.perf_counter() - t0, buf


HDFSCLIENT_CODE = r"""
import json, os, sys, time
from paddle.distributed.fleet.utils.fs import HDFSClient
hadoop_home, fs_name, local, remote, back, rounds = sys.argv[1:7]
c = HDFSClient(hadoop_home, {"fs.default.name": fs_name})
ups, downs = [], []
for r in range(int(rounds)):
    t0 = time.perf_counter(); c.upload(local, remote, multi_processes=1); ups.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); c.download(remote, back, multi_processes=1); downs.append(time.perf_counter() - t0)
    ok = os.path.getsize(back) == os.path.getsize(local)
    c.delete(remote); os.remove(back)
    assert ok, "downloaded size differs"
print("RESULT " + json.dumps({"upload_s": ups, "download_s": downs}))
"""


def paddle_hdfsclient(srv, image, size: int, work: str, rounds: int) -> dict:
    """Upload + download of the same bytes with Paddle's HDFSClient (fresh process;
    its delete between rounds is not timed)."""
    local = os.path.join(work, "hdfsclient-src.bin")
    back = os.path.join(work, "hdfsclient-back.bin")
    with open(local, "wb") as f:
        f.write(memoryview(image)[:size])
    remote = f"/bench/hdfsclient-{uuid.uuid4().hex[:8]}.bin"
    srv.hadoop("fs", "-mkdir", "-p", "/bench")
    env = dict(os.environ, **srv.client_env())
    env.setdefault("GLOG_minloglevel", "2")
    try:
        r = subprocess.run([sys.executable, "-c", HDFSCLIENT_CODE, str(srv.hadoop_home), srv.uri, local, remote,
                            back, str(rounds)], env=env, capture_output=True, text=True, timeout=3600)
    finally:
        for p in (local, back):
            if os.path.exists(p):
                os.remove(p)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"HDFSClient run failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    res = json.loads(line[0][len("RESULT "):])
    up, down = statistics.median(res["upload_s"]), statistics.median(res["download_s"])
    return {"upload_mb_s": mbps(size, up), "download_mb_s": mbps(size, down),
            "upload_s": up, "download_s": down, "runs_s": res}


def bench_backend(kind: str, uri: str, snap, image, size: int, work: str, rounds: int) -> dict:
    """``rounds`` paired rounds (paddle-acp and plain back to back, order alternating);
    throughputs are medians, ratios medians of the per-round ratios."""
    import numpy as np

    from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
    from paddle_acp.format.checkpoints.part_reader import PartReader
    from paddle_acp.format.checkpoints.restart import load_newest
    from paddle_acp.storage import open_storage

    if kind.startswith("hdfs-"):
        client = kind.split("-", 1)[1]
        os.environ["PADDLE_ACP_HDFS_CLIENT"] = "hdfs-native" if client == "native" else client
    else:
        os.environ.pop("PADDLE_ACP_HDFS_CLIENT", None)
    st = open_storage(uri, cache_dir=os.path.join(work, "fscache"))
    handler = getattr(st.fs, "handler", None)
    local = st.local_path("") is not None
    ck = GlobalCheckpointer(st, "bench", "_range_0", 0, 1, max_to_keep=1)  # a one-process job
    saves = [0]  # each save at the next epoch (a position is written once)
    plain_dir = st.full("plain")
    st.fs.create_dir(plain_dir, recursive=True)
    path = f"{plain_dir}/blob.bin"
    t0_name = snap.programs[0].tensors[0].name
    runs = {"acp_save_s": [], "acp_restore_s": [], "plain_write_s": [], "plain_read_s": []}
    res = {"backend": kind, "bytes": size, "rounds": rounds}

    def acp():
        c0 = getattr(handler, "commands_run", None)
        t0 = time.perf_counter()
        this = dataclasses.replace(snap, range=dataclasses.replace(snap.range, epoch_no=saves[0]))
        saves[0] += 1
        result = ck.save(this, "replicated")
        name, written = result.name, result.nbytes
        runs["acp_save_s"].append(time.perf_counter() - t0)
        assert written == size
        if c0 is not None:
            res["acp_save_hadoop_commands"] = handler.commands_run - c0
        if local:
            drop_tree_cache(st.full(ck.dir))
        c1 = getattr(handler, "commands_run", None)
        t0 = time.perf_counter()
        loaded = load_newest(PartReader(st, "bench", "_range_0"), GlobalCheckpointer(st, "bench", "_range_0", 0, 1), None)
        runs["acp_restore_s"].append(time.perf_counter() - t0)
        if c1 is not None:
            res["acp_restore_hadoop_commands"] = handler.commands_run - c1
        assert loaded is not None and loaded.name == name
        got = loaded.arrays[("bench", t0_name)]
        assert np.array_equal(got[:1000], snap.programs[0].tensors[0].array[:1000])

    def plain():
        runs["plain_write_s"].append(plain_write(st.fs, path, memoryview(image)[:size], fsync_local=local))
        if local:
            drop_local_cache(path)
        seconds, buf = plain_read(st.fs, path, size)
        runs["plain_read_s"].append(seconds)
        assert np.array_equal(buf[:4096], image[:4096]) and np.array_equal(buf[-4096:], image[size - 4096:size])

    for r in range(rounds):
        for step in ((acp, plain) if r % 2 == 0 else (plain, acp)):
            step()
    res.update({k: statistics.median(v) for k, v in runs.items()})
    res["runs_s"] = runs
    res["acp_save_mb_s"] = mbps(size, res["acp_save_s"])
    res["acp_restore_mb_s"] = mbps(size, res["acp_restore_s"])
    res["plain_write_mb_s"] = mbps(size, res["plain_write_s"])
    res["plain_read_mb_s"] = mbps(size, res["plain_read_s"])
    # ratio of throughputs = inverse ratio of times, per round
    res["save_ratio"] = statistics.median(p / a for a, p in zip(runs["acp_save_s"], runs["plain_write_s"]))
    res["restore_ratio"] = statistics.median(p / a for a, p in zip(runs["acp_restore_s"], runs["plain_read_s"]))
    st.delete_dir("")
    return res


# -- fixed cost per checkpoint ------------------------------------------------------------
def counting_storage(st):
    """``st`` with every filesystem call counted by kind: (storage, counter)."""
    import collections
    import copy

    import pyarrow.fs as pafs

    counts = collections.Counter()
    inner = st.fs

    class Counting(pafs.FileSystemHandler):
        def __eq__(self, other):
            return self is other

        def __ne__(self, other):
            return self is not other

        def get_type_name(self):
            return "counting"

        def normalize_path(self, path):
            return path

        def get_file_info(self, paths):
            counts["stat"] += len(paths)
            return inner.get_file_info(paths)

        def get_file_info_selector(self, selector):
            counts["list"] += 1
            return inner.get_file_info(selector)

        def create_dir(self, path, recursive):
            counts["mkdir"] += 1
            inner.create_dir(path, recursive=recursive)

        def delete_dir(self, path):
            counts["delete"] += 1
            inner.delete_dir(path)

        def delete_dir_contents(self, path, missing_dir_ok=False):
            counts["delete"] += 1
            inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

        def delete_root_dir_contents(self):
            raise NotImplementedError

        def delete_file(self, path):
            counts["delete"] += 1
            inner.delete_file(path)

        def move(self, src, dest):
            counts["rename"] += 1
            inner.move(src, dest)

        def copy_file(self, src, dest):
            counts["copy"] += 1
            inner.copy_file(src, dest)

        def open_input_stream(self, path):
            counts["read"] += 1
            return inner.open_input_stream(path)

        def open_input_file(self, path):
            counts["read"] += 1
            return inner.open_input_file(path)

        def open_output_stream(self, path, metadata):
            counts["write (create+close)"] += 1
            return inner.open_output_stream(path)

        def open_append_stream(self, path, metadata):
            counts["append (open+close)"] += 1
            return inner.open_append_stream(path)

    counted = copy.copy(st)  # the same backend class and capabilities, its filesystem calls counted
    counted.fs = pafs.PyFileSystem(Counting())
    return counted, counts


def tiny_snapshot(nbytes: int):
    import numpy as np

    from paddle_acp.format.engine.arena import Arena
    from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData, copy_into
    from paddle_acp.format.layout import layout
    from paddle_acp.format.manifest import RangeRecord

    n = max(1, nbytes // 4 // 6)
    tensors = [TensorData(f"w{i}", "float32", np.full(n, i, dtype=np.float32)) for i in range(6)]
    prog = ProgramSnapshot("bench", "benchmark model", tensors, None)
    size = layout([prog])
    image = Arena().ensure(size)
    copy_into([prog], image)
    return Snapshot(RangeRecord("_range_0", 0, 1), [prog], None, "3.3.1", "pir", image=image, data_size=size)


def fixed_child(kind: str, uri: str, checkpoints: int, nbytes: int, work: str) -> dict:
    """One process's measurement (the code under test is whatever ``paddle_acp`` this
    process imports): round trips per checkpoint, then seconds per checkpoint.

    A checkpoint here is what the saver thread does per save: the checkpointer's save (write,
    commit, retention) and the metrics line. Code without the issue-21 API (no
    ``MetricsLog.add``) is driven the way its saver did: a fresh listing per save and a
    metrics append per save."""
    from paddle_acp.format.checkpoints.metrics_log import MetricsLog
    try:  # code before the one protocol (issue 43): a one-process job's checkpoints were ckpt-N of a Checkpointer
        from paddle_acp.format.checkpoints.checkpointer import Checkpointer
    except ImportError:
        Checkpointer = None
    from paddle_acp.storage import open_storage

    if kind.startswith("hdfs-"):
        client = kind.split("-", 1)[1]
        os.environ["PADDLE_ACP_HDFS_CLIENT"] = "hdfs-native" if client == "native" else client
    else:
        os.environ.pop("PADDLE_ACP_HDFS_CLIENT", None)
    new_api = hasattr(MetricsLog, "add")
    try:
        from paddle_acp.format.metrics_record import MetricsRecord as record_type
    except ImportError:  # code before issue 26 takes dicts
        record_type = None
    base = open_storage(uri, cache_dir=os.path.join(work, "fscache"))
    snap = tiny_snapshot(nbytes)
    warm = 4  # retention starts after max_to_keep (3) checkpoints

    def loop(st, name, on_warm=None):
        if Checkpointer is None:  # today: rank 0 of 1, the save waits for its commit and retention
            from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer

            g = GlobalCheckpointer(st, "bench", name, 0, 1, 3)
            save = lambda snap: g.save(snap, "replicated").name  # noqa: E731
        else:
            ck = (Checkpointer(st, "bench", name, max_to_keep=3, single_writer=True) if new_api
                  else Checkpointer(st, "bench", name, max_to_keep=3))
            save = lambda snap: ck.save(snap).number  # noqa: E731
        metrics = MetricsLog(st, "bench", abs(hash(name)) % 100000)
        times = []
        for i in range(checkpoints + warm):
            if i == warm and on_warm:
                on_warm()
            # (a new snapshot per position: a snapshot is not written into)
            this = dataclasses.replace(snap, range=type(snap.range)(name, i, checkpoints + warm))
            t0 = time.perf_counter()
            rec = {"event": "saved", "time": time.time(), ("number" if Checkpointer else "name"): save(this)}
            if record_type is not None:  # issue 26: a record is a MetricsRecord, no longer a dict
                rec = record_type.from_dict(rec)
            if new_api:
                metrics.add(rec)
                metrics.flush_due()
            else:
                metrics.append(rec)
            if i >= warm:
                times.append(time.perf_counter() - t0)
        if new_api:
            metrics.flush()
        return times

    st, counts = counting_storage(base)
    loop(st, f"_range_count{uuid.uuid4().hex[:6]}", counts.clear)
    times = loop(base, f"_range_time{uuid.uuid4().hex[:6]}")
    return {"api": "now" if new_api else "before", "times": times, "bytes": snap.data_size,
            "ops": {k: v / checkpoints for k, v in sorted(counts.items())}}


def fixed_cost_backend(kind: str, uri: str, args, work: str) -> dict:
    """Paired rounds of the current code ("now") and, with --before-code, the code in that
    directory ("before"), each in a process of its own against the same server."""
    code = {"now": REPO}
    if args.before_code:
        code["before"] = os.path.abspath(args.before_code)
    res = {"backend": kind, "checkpoints": args.checkpoints, "rounds": args.rounds}
    times = {v: [] for v in code}
    for r in range(args.rounds):
        order = list(code) if r % 2 == 0 else list(reversed(list(code)))
        for variant in order:
            env = dict(os.environ, ACP_BENCH_CODE=code[variant])
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--_fixed-child", kind, f"{uri}/{variant}{r}",
                 str(args.checkpoints), str(args.state_kb * 1024), work],
                env=env, cwd=code[variant], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=1800)
            if out.returncode != 0:
                raise RuntimeError(f"{variant} child failed: {out.stderr[-2000:]}")
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            times[variant] += doc["times"]
            res[f"{variant}_ops_per_checkpoint"] = doc["ops"]
            res[f"{variant}_ops_total"] = sum(doc["ops"].values())
            res["bytes"] = doc["bytes"]
    for variant, ts in times.items():
        res[f"{variant}_median_s"] = statistics.median(ts)
        res[f"{variant}_p90_s"] = sorted(ts)[int(0.9 * (len(ts) - 1))]
    if "before" in times:
        res["now_vs_before"] = res["now_median_s"] / res["before_median_s"]
    return res


FIXED_BACKENDS = ["local", "hdfs-pyarrow", "hdfs-native", "s3"]


def run_fixed_cost(args, kinds, work) -> dict:
    kinds = [k for k in kinds if k in FIXED_BACKENDS]
    results = {"mode": "fixed-cost", "checkpoints": args.checkpoints, "rounds": args.rounds,
               "state_bytes": args.state_kb * 1024, "backends": {}, "errors": {}}
    hdfs = s3 = None
    try:
        if any(k.startswith("hdfs") for k in kinds):
            try:
                hdfs = servers.HDFSServer().start()
                hdfs.apply_client_env()
            except servers.ServerUnavailable as e:
                results["errors"]["hdfs"] = str(e)
                kinds = [k for k in kinds if not k.startswith("hdfs")]
        if "s3" in kinds:
            try:
                s3 = servers.S3Server().start()
                os.environ.update(s3.client_env())
            except servers.ServerUnavailable as e:
                results["errors"]["s3"] = str(e)
                kinds.remove("s3")
        for kind in kinds:
            tag = uuid.uuid4().hex[:8]
            uri = (os.path.join(work, "local", tag) if kind == "local" else
                   f"s3://{s3.bucket}/fixed/{tag}" if kind == "s3" else f"{hdfs.uri}/fixed/{kind}/{tag}")
            try:
                r = fixed_cost_backend(kind, uri, args, work)
            except Exception as e:
                results["errors"][kind] = f"{type(e).__name__}: {e}"
                log(f"{kind:13s} FAILED: {type(e).__name__}: {e}")
                continue
            results["backends"][kind] = r
    finally:
        for srv in (s3, hdfs):
            if srv is not None:
                srv.cleanup()
    log("")
    log(f"fixed cost of one checkpoint ({args.state_kb} KiB state, median of {args.checkpoints} x {args.rounds} "
        "checkpoints; round trips per checkpoint, steady state)")
    if args.before_code:
        log(f"{'backend':13s} {'before':>9s} {'now':>9s} {'ratio':>6s}   round trips before -> now")
    else:
        log(f"{'backend':13s} {'now':>9s}   round trips")
    for kind, r in results["backends"].items():
        now_ops = r["now_ops_per_checkpoint"]
        if not args.before_code:
            ops = ", ".join(f"{k} {v:g}" for k, v in now_ops.items())
            log(f"{kind:13s} {r['now_median_s'] * 1000:7.1f}ms   {r['now_ops_total']:.1f} ({ops})")
            continue
        before_ops = r["before_ops_per_checkpoint"]
        ops = ", ".join(f"{k} {before_ops.get(k, 0):g}->{now_ops.get(k, 0):g}" for k in sorted(set(before_ops) | set(now_ops)))
        log(f"{kind:13s} {r['before_median_s'] * 1000:7.1f}ms {r['now_median_s'] * 1000:7.1f}ms "
            f"{r['now_vs_before']:6.2f}   {r['before_ops_total']:.1f} -> {r['now_ops_total']:.1f} ({ops})")
    return results


# -- restore from HDFS through the node-local cache ------------------------------------------------
def run_cache(args, size_mb: float, rounds: int, work: str) -> dict:
    import numpy as np

    from paddle_acp.adapter.tensors import write_program
    from paddle_acp.format.checkpoints.cache import LocalCache
    from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
    from paddle_acp.format.checkpoints.part_reader import PartReader
    from paddle_acp.format.checkpoints.restart import load_newest
    from paddle_acp.storage import open_storage

    results = {"mode": "cache", "rounds": rounds, "runs": [], "errors": {}}
    with servers.HDFSServer() as hdfs:
        hdfs.apply_client_env()  # before the first libhdfs JVM starts in this process
        import paddle

        paddle.enable_static()
        snap, _image, size = make_snapshot(int(size_mb * MB))
        results["bytes"] = size
        log(f"snapshot: {len(snap.programs[0].tensors)} tensors, {size / MB:.0f} MiB")
        local_uri = os.path.join(work, "local")
        hdfs_uri = f"{hdfs.uri}/bench/cache-{uuid.uuid4().hex[:8]}"
        cache_dir = os.path.join(work, "cache")
        local_st, hdfs_st = open_storage(local_uri), open_storage(hdfs_uri)
        GlobalCheckpointer(local_st, "bench", "_range_0", 0, 1, 1).save(snap, "replicated")  # a one-process job
        writer = GlobalCheckpointer(hdfs_st, "bench", "_range_0", 0, 1, 1,
                                    cache=LocalCache.open(cache_dir, hdfs_uri, 1).for_range("bench", "_range_0", 0))
        t0 = time.perf_counter()
        writer.save(snap, "replicated")
        results["save_with_cache_s"] = time.perf_counter() - t0
        scope, place = paddle.static.Scope(), paddle.CPUPlace()
        for t in snap.programs[0].tensors:  # the program's tensors a restarted job writes into
            scope.var(t.name).get_tensor().set(np.zeros_like(t.array), place)
        check = snap.programs[0].tensors[0]

        def restore(kind: str) -> float:
            drop_tree_cache(local_uri)
            drop_tree_cache(cache_dir)
            t0 = time.perf_counter()
            st_ = local_st if kind == "local" else hdfs_st
            cache = (LocalCache.open(cache_dir, hdfs_uri, 1).for_range("bench", "_range_0", 0)
                     if kind == "hdfs_cache" else None)
            loaded = load_newest(PartReader(st_, "bench", "_range_0"),
                                 GlobalCheckpointer(st_, "bench", "_range_0", 0, 1, cache=cache), None)
            write_program(loaded, "bench", scope, place)
            seconds = time.perf_counter() - t0
            want = "cache" if kind == "hdfs_cache" else ("local" if kind == "local" else "remote")
            assert loaded.source == want, (kind, loaded.source)
            got = np.array(scope.find_var(check.name).get_tensor())
            assert np.array_equal(got, check.array), kind
            scope.var(check.name).get_tensor().set(np.zeros_like(check.array), place)
            return seconds

        kinds = ["local", "hdfs_cache", "hdfs"]
        for r in range(rounds):
            order = kinds[r % 3:] + kinds[:r % 3]
            row = {k: restore(k) for k in order}
            results["runs"].append(row)
            log("round %d: %s" % (r, ", ".join(f"{k} {row[k]:.3f} s" for k in kinds)))
    runs = results["runs"]
    for k in kinds:
        results[f"{k}_median_s"] = statistics.median(row[k] for row in runs)
    results["cache_vs_local"] = statistics.median(row["hdfs_cache"] / row["local"] for row in runs)
    results["hdfs_vs_cache"] = statistics.median(row["hdfs"] / row["hdfs_cache"] for row in runs)
    # this machine's disk alternates between fast and slow phases (a cold 1 GB read takes 0.8 s or
    # 5 s): also the ratio of the best rounds (each the fastest of its kind, i.e. on the fast disk)
    results["cache_vs_local_best"] = min(row["hdfs_cache"] for row in runs) / min(row["local"] for row in runs)
    log(f"restore of {size / MB:.0f} MiB, median of {rounds} paired rounds: local URI {results['local_median_s']:.3f} s, "
        f"HDFS with the cache {results['hdfs_cache_median_s']:.3f} s, HDFS without {results['hdfs_median_s']:.3f} s")
    log(f"  HDFS with the cache / local URI = {results['cache_vs_local']:.2f} (median of the rounds' ratios), "
        f"{results['cache_vs_local_best']:.2f} (best round of each) (target <= 1.2); "
        f"HDFS without / with the cache = {results['hdfs_vs_cache']:.2f}x")
    return results


# -- training time with a checkpoint every epoch on HDFS ------------------------------------
def run_training(args, work) -> dict:
    from support import e2e as eu

    results = {"mode": "training", "epochs": args.epochs, "sleep": args.sleep, "hidden": args.hidden,
               "rounds": args.rounds, "runs": [], "errors": {}}
    script_args = ("--epochs", args.epochs, "--steps-per-epoch", 1, "--sleep", args.sleep, "--hidden", args.hidden)
    with servers.HDFSServer() as hdfs:
        env = hdfs.client_env()

        def run(kind: str, r: int) -> float:
            out = os.path.join(work, f"train-{kind}-{r}")
            timing = os.path.join(work, f"timing-{kind}-{r}.json")
            ckpt = None if kind == "off" else f"{hdfs.uri}/train/{kind}-{r}-{uuid.uuid4().hex[:6]}"
            extra = dict(env)
            if kind in ("auto", "skip", "wait", "queue"):
                extra["PADDLE_ACP_BUSY_POLICY"] = kind
            proc = eu.run_script(out, ckpt, "pir", *script_args, "--timing", timing, env=extra, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"{kind} run failed: {proc.stderr[-2000:]}")
            with open(timing) as f:
                return json.load(f)["train_s"]

        kinds = ["off"] + args.policies.split(",")
        for r in range(args.rounds):
            order = kinds if r % 2 == 0 else list(reversed(kinds))
            row = {k: run(k, r) for k in order}
            results["runs"].append(row)
            log("round %d: %s" % (r, ", ".join(f"{k} {v:.2f} s" for k, v in row.items())))
    for k in args.policies.split(","):
        ratios = [row[k] / row["off"] for row in results["runs"]]
        results[f"{k}_vs_off"] = statistics.median(ratios)
        results[f"{k}_median_s"] = statistics.median(row[k] for row in results["runs"])
    results["off_median_s"] = statistics.median(row["off"] for row in results["runs"])
    log(f"training {args.epochs} epochs (~{args.sleep:.2f} s each, hidden {args.hidden}), checkpoint every epoch "
        f"to HDFS, vs no checkpointing (median of {args.rounds} paired rounds):")
    for k in args.policies.split(","):
        log(f"  {k:6s} {results[k + '_median_s']:.2f} s vs {results['off_median_s']:.2f} s: "
            f"{(results[k + '_vs_off'] - 1) * 100:+.1f}%")
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=1024, help="checkpoint size in MB (default 1024)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated subset of {BACKENDS}")
    ap.add_argument("--no-hdfsclient", action="store_true", help="skip Paddle's HDFSClient comparison")
    results_io.add_args(ap, __file__)
    ap.add_argument("--dir", default=None, help="local work dir (default: a temp dir)")
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds per backend (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 MB, one round")
    ap.add_argument("--fixed-cost", action="store_true", help="fixed cost per checkpoint per backend (see above)")
    ap.add_argument("--checkpoints", type=int, default=30, help="--fixed-cost: checkpoints per round (default 30)")
    ap.add_argument("--state-kb", type=int, default=39, help="--fixed-cost: state size in KiB (default 39)")
    ap.add_argument("--before-code", default=None, metavar="DIR",
                    help="--fixed-cost: also measure the paddle_acp in this checkout (e.g. a git worktree of "
                         "the commit before a change), paired with the current code")
    ap.add_argument("--_fixed-child", nargs=5, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", action="store_true", help="restore from HDFS with the node-local cache (see above)")
    ap.add_argument("--training", action="store_true", help="training time on HDFS vs no checkpointing (see above)")
    ap.add_argument("--epochs", type=int, default=60, help="--training: epochs per run (default 60)")
    ap.add_argument("--sleep", type=float, default=0.1, help="--training: seconds of 'work' per epoch (default 0.1)")
    ap.add_argument("--hidden", type=int, default=200, help="--training: hidden width (200: a ~40 KB state)")
    ap.add_argument("--policies", default="skip,wait", help="--training: busy policies to compare (default skip,wait)")
    args = ap.parse_args(argv)
    if args._fixed_child:
        kind, uri, n, nbytes, work = args._fixed_child
        os.environ.setdefault("PADDLE_ACP_LOG_LEVEL", "WARNING")
        print(json.dumps(fixed_child(kind, uri, int(n), int(nbytes), work)))
        return 0
    size_mb = 16 if args.quick else args.size_mb
    rounds = 1 if args.quick else max(1, args.rounds)
    kinds = [k.strip() for k in args.backends.split(",") if k.strip()]
    bad = [k for k in kinds if k not in BACKENDS]
    if bad:
        ap.error(f"unknown backends {bad}; choose from {BACKENDS}")
    os.environ.setdefault("PADDLE_ACP_LOG_LEVEL", "WARNING")
    os.environ.setdefault("PADDLE_ACP_CI_QUIET", "1")

    work = tempfile.mkdtemp(prefix="acp-bench-storage-", dir=args.dir)
    if args.fixed_cost or args.training or args.cache:
        try:
            if args.cache:
                results = run_cache(args, size_mb, rounds, work)
            elif args.fixed_cost:
                results = run_fixed_cost(args, kinds if args.backends != ",".join(BACKENDS) else FIXED_BACKENDS, work)
            else:
                results = run_training(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        text = json.dumps(results, indent=1, sort_keys=True)
        print(text)
        log(f"wrote {results_io.write(results, __file__, args.json, args.key)}")
        return 0
    hdfs = s3 = None
    results = {"size_mb": size_mb, "rounds": rounds, "backends": {}, "errors": {}}
    try:
        # servers first: no client threads (JVM, runtimes) exist yet in this process
        if any(k.startswith("hdfs") for k in kinds):
            try:
                hdfs = servers.HDFSServer().start()
                hdfs.apply_client_env()  # before the first libhdfs JVM starts in this process
            except servers.ServerUnavailable as e:
                results["errors"]["hdfs"] = str(e)
                log(f"HDFS unavailable, skipped: {e}")
                kinds = [k for k in kinds if not k.startswith("hdfs")]
        if "s3" in kinds:
            try:
                s3 = servers.S3Server().start()
                os.environ.update(s3.client_env())
            except servers.ServerUnavailable as e:
                results["errors"]["s3"] = str(e)
                log(f"S3 unavailable, skipped: {e}")
                kinds.remove("s3")

        t0 = time.perf_counter()
        snap, image, size = make_snapshot(int(size_mb * MB))
        log(f"snapshot: {len(snap.programs[0].tensors)} tensors, {size / MB:.0f} MiB "
            f"(built in {time.perf_counter() - t0:.1f} s)")
        results["bytes"] = size
        for kind in kinds:
            tag = uuid.uuid4().hex[:8]
            if kind == "local":
                uri = os.path.join(work, "local", tag)
            elif kind == "s3":
                uri = f"s3://{s3.bucket}/bench/{tag}"
            else:
                uri = f"{hdfs.uri}/bench/{kind}/{tag}"
            try:
                r = bench_backend(kind, uri, snap, image, size, work, rounds)
            except Exception as e:  # one backend failing must not hide the others
                results["errors"][kind] = f"{type(e).__name__}: {e}"
                log(f"{kind:13s} FAILED: {type(e).__name__}: {e}")
                continue
            results["backends"][kind] = r
            extra = ""
            if "acp_save_hadoop_commands" in r:
                extra = f"  ({r['acp_save_hadoop_commands']} / {r['acp_restore_hadoop_commands']} hadoop commands)"
            log(f"{kind:13s} save     paddle-acp {r['acp_save_mb_s']:8.1f} MB/s  plain pyarrow.fs "
                f"{r['plain_write_mb_s']:8.1f} MB/s  ratio {r['save_ratio']:.2f}{extra}")
            log(f"{kind:13s} restore  paddle-acp {r['acp_restore_mb_s']:8.1f} MB/s  plain pyarrow.fs "
                f"{r['plain_read_mb_s']:8.1f} MB/s  ratio {r['restore_ratio']:.2f}")
        if hdfs is not None and not args.no_hdfsclient:
            try:
                hc = paddle_hdfsclient(hdfs, image, size, work, rounds)
            except Exception as e:
                results["errors"]["hdfsclient"] = f"{type(e).__name__}: {e}"
                log(f"HDFSClient FAILED: {e}")
            else:
                results["paddle_hdfsclient"] = hc
                log(f"{'HDFSClient':13s} upload   {hc['upload_mb_s']:8.1f} MB/s  download "
                    f"{hc['download_mb_s']:8.1f} MB/s  (Paddle's hadoop-fs client, same bytes)")
                for kind, r in results["backends"].items():
                    if kind.startswith("hdfs"):
                        r["save_vs_hdfsclient"] = r["acp_save_mb_s"] / hc["upload_mb_s"]  # medians
                        r["restore_vs_hdfsclient"] = r["acp_restore_mb_s"] / hc["download_mb_s"]
                        log(f"{kind:13s} vs HDFSClient  save ratio {r['save_vs_hdfsclient']:.2f}  "
                            f"restore ratio {r['restore_vs_hdfsclient']:.2f}")
    finally:
        for srv in (s3, hdfs):
            if srv is not None:
                srv.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(results, indent=1, sort_keys=True)
    print(text)
    log(f"wrote {results_io.write(results, __file__, args.json, args.key)}")
    return 1 if results["errors"] and not results["backends"] else 0


if __name__ == "__main__":
    sys.exit(main())
