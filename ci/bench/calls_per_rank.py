#!/usr/bin/env python3
"""Benchmark (on demand): storage calls per rank against the world size W, Paddle-free.

Drives the format layer of a job of W simulated ranks in one process (issue 28 item 4): every rank
takes its writer fence, writes its part of each checkpoint (``GlobalCheckpointer.save``, tiny
per-rank state) while rank 0 waits for the parts and commits ``global.json``; then every rank
restarts: a new fence, ``load_newest`` (find, verify, load), ``resume_from`` and ``discard_newer``,
as a restarted rank does. Ranks run in a thread pool (``--threads``), rank 0 in a thread of its own
from the start of each checkpoint (its commit loop polls while the others write).

Counted per phase:

* storage calls, client side: every rank has its own pass-through counting wrapper around the same
  backend connection (tests/support/counting.py; one call as the format layer makes it);
* NameNode RPCs (HDFS), server side: the NameNode's JMX counter ``RpcProcessingTimeNumOps`` of
  the client RPC port (the DataNode talks to a separate service RPC port, so its heartbeats are not
  in it), read before and after each phase once the JMX cache has refreshed (metrics period 1 s);
  per RPC method from ``RpcDetailedActivityForPort<port>``;
* S3 (SeaweedFS): client-side counts only (the server exposes no request counter here).

Reported per W (and in the JSON per phase: ``calls_by_method``, all ranks' client calls per storage
method, ``calls_by_method_rank1``, rank 1's own, and ``nn_rpcs_by_method``): calls per checkpoint per rank (all ranks' calls of the last checkpoint / W; rank
0's own calls beside the median rank's: the difference is rank 0's commit loop), calls per rank
at restart (max over ranks), commit latency (rank 0's wait from its part written to the commit,
and from the last part written to the commit), and per figure the slope in calls per extra rank
(least squares over W). Targets (issue 28): restart <= 20 per rank, per checkpoint <= 12 per rank,
slope <= 0.05.

``--coordination store``: the ranks count their parts in through a real Paddle TCP store hosted in this
process (paddle_acp.runtime.coord: rank 0's commit lists a position once every rank counted in, instead of
at every poll round); imports Paddle. Default ``storage`` (storage only, Paddle-free).

Usage: python ci/bench/calls_per_rank.py [--worlds 8,64,256,1024] [--backends hdfs,s3] [--checkpoints 2]
                                         [--threads 16] [--coordination storage|store] [--key KEY | --json FILE]
       python ci/bench/calls_per_rank.py --backends local --worlds 2,4 --checkpoints 1 --json FILE   (smoke run, no server)
The run is added to ci/bench/results/calls_per_rank.json under --key (or written alone to --json FILE).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))  # the test helpers: tests/support

import results_io  # noqa: E402
from support import servers  # noqa: E402  (the real HDFS and S3 servers)

_spec = importlib.util.spec_from_file_location("acp_counting", os.path.join(REPO, "tests", "support", "counting.py"))
assert _spec is not None and _spec.loader is not None
counting = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(counting)

TARGETS = {"restart_per_rank": 20, "checkpoint_per_rank": 12, "slope": 0.05}
JMX_WAIT = 1.3  # seconds: the NameNode's JMX values are cached for the metrics period (1 s here)


def log(msg: str) -> None:
    print(msg, flush=True)


def slope(xs: List[float], ys: List[float]) -> Optional[float]:
    """Least-squares slope of ys over xs (None with fewer than two points)."""
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else None


# -- the NameNode's RPC counters --------------------------------------------------------------
class CountedHDFS(servers.HDFSServer):
    """The test HDFS server with the DataNode on a service RPC port of its own and a metrics period
    of 1 s, so that the client port's JMX counters hold the clients' RPCs only, and fresh."""

    def _configure(self) -> None:
        if "dfs.namenode.servicerpc-address" not in self.extra_conf:  # chosen once, kept by restarts
            port = servers.free_ports(1)[0]
            self.extra_conf["dfs.namenode.servicerpc-address"] = f"127.0.0.1:{port}"
        super()._configure()
        (self.conf_dir / "hadoop-metrics2.properties").write_text("*.period=1\n")

    def rpc_counts(self) -> Dict[str, int]:
        """NumOps of every RPC method on the client port, and their total ("total"), once stable."""
        def read() -> Dict[str, int]:
            port = self.port
            total = self._jmx(self.http_port, f"Hadoop:service=NameNode,name=RpcActivityForPort{port}") or {}
            detail = self._jmx(self.http_port, f"Hadoop:service=NameNode,name=RpcDetailedActivityForPort{port}") or {}
            out = {k[:-len("NumOps")]: int(v) for k, v in detail.items() if k.endswith("NumOps")}
            out["total"] = int(total.get("RpcProcessingTimeNumOps", -1))
            return out

        last = read()
        for _ in range(20):  # until the cached values stop changing (the phase's calls are all done)
            time.sleep(JMX_WAIT)
            now = read()
            if now == last:
                return now
            last = now
        return last


def rpc_delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))
            if after.get(k, 0) != before.get(k, 0)}


# -- the simulated ranks --------------------------------------------------------------------
def tiny_snapshot(rank: int, epoch: int):
    import numpy as np

    from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
    from paddle_acp.format.manifest import RangeRecord

    ts = [TensorData("w", "float32", np.full(4, rank + epoch, dtype=np.float32)),
          TensorData("rank", "int64", np.array([rank, epoch], dtype=np.int64))]
    prog = ProgramSnapshot("fp-bench", "bench", ts, {"last_epoch": epoch})
    return Snapshot(RangeRecord("_range_0", epoch, 1000), [prog], None, "3.3.1", "pir",
                    extra={"loader_state": {"rank": rank, "epoch": epoch}})


class Job:
    """W simulated ranks of one job on one backend, each with its own counted storage."""

    def __init__(self, base, world: int, threads: int, keep: int = 3, coordination: str = "storage") -> None:
        self.base = base
        self.coordination = coordination
        self.world = world
        self.threads = threads
        self.keep = keep
        self.job = f"bench-w{world}-{uuid.uuid4().hex[:8]}"
        self.st = [counting.counting(base) for _ in range(world)]
        self.gck: List[Any] = [None] * world

    def calls(self) -> List[int]:
        return [counting.total(s) for s in self.st]

    def reset(self) -> None:
        for s in self.st:
            counting.reset(s)

    def ranks(self, fn, ranks) -> list:
        with ThreadPoolExecutor(self.threads) as pool:
            return list(pool.map(fn, ranks))

    def start(self) -> None:
        """Each rank's first start (not counted): the job marker, a fence per rank, the start's look for a
        checkpoint and its clean-up."""
        from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
        from paddle_acp.format.checkpoints.part_reader import PartReader
        from paddle_acp.format.checkpoints.restart import load_newest
        from paddle_acp.format.commit.fencing import Fence, write_job_marker

        write_job_marker(self.st[0], self.job)
        coord = None
        if self.coordination == "store":  # one real store, hosted here (world size 1: no rendezvous), every rank's link
            from support.coord import free_port

            from paddle_acp.adapter.store import StoreEndpoint
            from paddle_acp.runtime.coord.store import StoreCoordinator, StoreLink

            link = StoreLink(StoreEndpoint("127.0.0.1", free_port(), "MASTER_ADDR"), 0, 1, open_timeout=60)
            coord = StoreCoordinator(link, f"{self.job}/_range_0")

        def one(r: int) -> None:
            fence = Fence.take(self.st[r], self.job, r)
            g = GlobalCheckpointer(self.st[r], self.job, "_range_0", r, self.world, self.keep, 1800.0, fence)
            g.arrivals = coord
            g.announce()  # as the range's open does (its generation to the store, not waited for)
            # as the runtime starts a rank (runtime/restore.py): nothing to load in a new range, then the clean-up
            loaded = load_newest(PartReader(self.st[r], self.job, "_range_0"), g, "per-rank")
            assert loaded is None
            g.resume_from(None)
            g.start.discard_newer(None)
            self.gck[r] = g
        self.ranks(one, range(self.world))

    def checkpoint(self, epoch: int) -> Dict[str, Any]:
        """Every rank writes its part of ``epoch``; rank 0 (in its own thread) commits."""
        ends: Dict[int, float] = {}
        res: Dict[str, Any] = {}

        def rank0() -> None:
            res["save"] = self.gck[0].save(tiny_snapshot(0, epoch), "per-rank")
            ends[0] = time.monotonic()

        def other(r: int) -> None:
            self.gck[r].save(tiny_snapshot(r, epoch), "per-rank")
            ends[r] = time.monotonic()

        t0 = time.monotonic()
        t = threading.Thread(target=rank0)
        t.start()
        self.ranks(other, range(1, self.world))
        t.join()
        save = res["save"]
        last_part = max((v for k, v in ends.items() if k != 0), default=ends[0])
        return {"committed": save.committed, "commit_wait_s": round(save.waited, 3),
                "commit_after_last_part_s": round(max(0.0, ends[0] - last_part), 3),
                "wall_s": round(time.monotonic() - t0, 3)}

    def restart(self) -> Dict[str, Any]:
        """Every rank restarts: a new fence, the newest checkpoint found, verified and loaded, the
        clean-up of anything newer (what a restarted rank does in the format layer)."""
        from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
        from paddle_acp.format.checkpoints.part_reader import PartReader
        from paddle_acp.format.checkpoints.restart import load_newest
        from paddle_acp.format.commit.fencing import Fence, write_job_marker

        def one(r: int) -> Tuple[Optional[str], int]:
            st = self.st[r]
            if r == 0:
                write_job_marker(st, self.job)
            fence = Fence.take(st, self.job, r)
            g = GlobalCheckpointer(st, self.job, "_range_0", r, self.world, self.keep, 1800.0, fence)
            loaded = load_newest(PartReader(st, self.job, "_range_0"), g, "per-rank")
            g.resume_from(loaded)
            g.start.discard_newer(loaded.position_key if loaded is not None else None)
            if loaded is None:
                return None, -1
            got = int(loaded.arrays[("fp-bench", "rank")][0])
            loaded.close()
            return loaded.name, got

        t0 = time.monotonic()
        out = self.ranks(one, range(self.world))
        chosen = sorted({name for name, _ in out if name})
        return {"wall_s": round(time.monotonic() - t0, 3), "chosen": chosen,
                "own_state": all(got == r for r, (_n, got) in enumerate(out))}


def run_world(base, world: int, args, hdfs: Optional[CountedHDFS]) -> Dict[str, Any]:
    job = Job(base, world, args.threads, coordination=args.coordination)
    job.start()
    res: Dict[str, Any] = {"world": world, "checkpoints": []}

    def phase(fn):
        before = hdfs.rpc_counts() if hdfs is not None else None
        job.reset()
        out = fn()
        calls = job.calls()
        out["calls_total"] = sum(calls)
        out["calls_per_rank"] = round(sum(calls) / world, 3)
        out["calls_rank0"] = calls[0]
        others = calls[1:] or calls
        out["calls_rank_median"] = statistics.median(others)
        out["calls_rank_max"] = max(calls)
        by_method: Dict[str, int] = {}
        for st in job.st:
            for k, v in st.calls.items():
                by_method[k] = by_method.get(k, 0) + v
        out["calls_by_method"] = dict(sorted(by_method.items()))  # all ranks' calls of the phase, per method
        if world > 1:  # a non-zero rank's own (rank 1; rank 0 adds its commit loop)
            out["calls_by_method_rank1"] = dict(sorted(job.st[1].calls.items()))
        if hdfs is not None and before is not None:
            delta = rpc_delta(before, hdfs.rpc_counts())
            out["nn_rpcs_total"] = delta.pop("total", 0)
            out["nn_rpcs_per_rank"] = round(out["nn_rpcs_total"] / world, 3)
            out["nn_rpcs_by_method"] = delta
        return out

    for c in range(args.checkpoints):
        ck = phase(lambda c=c: job.checkpoint(c))
        ck["rank0_commit_loop_calls"] = ck["calls_rank0"] - ck["calls_rank_median"]
        res["checkpoints"].append(ck)
        log(f"  W={world:5d} checkpoint {c}: {ck['calls_per_rank']:7.2f} calls/rank (rank 0: {ck['calls_rank0']}, "
            f"median rank: {ck['calls_rank_median']}, rank 1: {ck.get('calls_by_method_rank1')})"
            + (f", {ck['nn_rpcs_per_rank']:7.2f} NameNode RPCs/rank {ck['nn_rpcs_by_method']}" if "nn_rpcs_per_rank" in ck else "")
            + f", commit {ck['commit_wait_s']:.2f} s ({ck['commit_after_last_part_s']:.2f} s after the last part), "
              f"wall {ck['wall_s']:.1f} s")
    rs = phase(job.restart)
    res["restart"] = rs
    log(f"  W={world:5d} restart: max {rs['calls_rank_max']} calls/rank (mean {rs['calls_per_rank']:.2f})"
        + (f", {rs['nn_rpcs_per_rank']:.2f} NameNode RPCs/rank" if "nn_rpcs_per_rank" in rs else "")
        + f", chose {rs['chosen']}, own state {rs['own_state']}, wall {rs['wall_s']:.1f} s")
    return res


def summarize(per_world: List[Dict[str, Any]]) -> Dict[str, Any]:
    ws = [float(r["world"]) for r in per_world]
    figs = {
        "checkpoint_calls_per_rank": [r["checkpoints"][-1]["calls_per_rank"] for r in per_world],
        "checkpoint_calls_median_rank": [r["checkpoints"][-1]["calls_rank_median"] for r in per_world],
        "checkpoint_rank0_commit_loop_calls": [r["checkpoints"][-1]["rank0_commit_loop_calls"] for r in per_world],
        "restart_calls_max_rank": [r["restart"]["calls_rank_max"] for r in per_world],
        "restart_calls_per_rank": [r["restart"]["calls_per_rank"] for r in per_world],
        "commit_wait_s": [r["checkpoints"][-1]["commit_wait_s"] for r in per_world],
        "commit_after_last_part_s": [r["checkpoints"][-1]["commit_after_last_part_s"] for r in per_world],
    }
    if all("nn_rpcs_per_rank" in r["restart"] for r in per_world):
        figs["checkpoint_nn_rpcs_per_rank"] = [r["checkpoints"][-1]["nn_rpcs_per_rank"] for r in per_world]
        figs["restart_nn_rpcs_per_rank"] = [r["restart"]["nn_rpcs_per_rank"] for r in per_world]
    out: Dict[str, Any] = {"worlds": [int(w) for w in ws]}
    for k, ys in figs.items():
        s = slope(ws, [float(y) for y in ys])
        out[k] = {"values": ys, "slope_per_extra_rank": None if s is None else round(s, 5)}
    return out


def open_backend(kind: str, work: str, hdfs: Optional[CountedHDFS], s3) -> Any:
    from paddle_acp.storage import open_storage

    tag = uuid.uuid4().hex[:8]
    if kind == "local":
        return open_storage(os.path.join(work, "local", tag))
    if kind == "hdfs":
        assert hdfs is not None
        return open_storage(f"{hdfs.uri}/bench_ranks/{tag}")
    return open_storage(f"s3://{s3.bucket}/bench_ranks/{tag}")


def git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", default="8,64,256,1024", help="world sizes (default 8,64,256,1024)")
    ap.add_argument("--backends", default="hdfs,s3", help="of local, hdfs, s3 (default hdfs,s3)")
    ap.add_argument("--checkpoints", type=int, default=2, help="checkpoints per W; the last one is reported (default 2)")
    ap.add_argument("--threads", type=int, default=16, help="ranks running at once (default 16)")
    results_io.add_args(ap, __file__)
    ap.add_argument("--coordination", choices=("storage", "store"), default="storage",
                    help="how the ranks count their parts in (store: a real Paddle TCP store in this process)")
    ap.add_argument("--hdfs-client", choices=("pyarrow", "hdfs-native", "cli"), default=None,
                    help="the HDFS client (PADDLE_ACP_HDFS_CLIENT; default: the first that connects, libhdfs here)")
    args = ap.parse_args(argv)
    if args.hdfs_client:
        os.environ["PADDLE_ACP_HDFS_CLIENT"] = args.hdfs_client
    worlds = [int(w) for w in args.worlds.split(",") if w]
    kinds = [k for k in args.backends.split(",") if k]
    results: Dict[str, Any] = {"command": "python ci/bench/calls_per_rank.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                               "commit": git_head(), "targets": TARGETS, "threads": args.threads,
                               "checkpoints": args.checkpoints, "coordination": args.coordination,
                               "hdfs_client": args.hdfs_client or "first that connects",
                               "backends": {}, "errors": {}}
    hdfs = s3 = None
    work = tempfile.mkdtemp(prefix="bench-ranks-")
    try:
        if "hdfs" in kinds:
            try:
                hdfs = CountedHDFS().start()
                hdfs.apply_client_env()
            except servers.ServerUnavailable as e:
                results["errors"]["hdfs"] = str(e)
                kinds.remove("hdfs")
        if "s3" in kinds:
            try:
                s3 = servers.S3Server().start()
                os.environ.update(s3.client_env())
            except servers.ServerUnavailable as e:
                results["errors"]["s3"] = str(e)
                kinds.remove("s3")
        for kind in kinds:
            log(f"{kind}:")
            per_world = []
            for w in worlds:
                base = open_backend(kind, work, hdfs, s3)
                per_world.append(run_world(base, w, args, hdfs if kind == "hdfs" else None))
            results["backends"][kind] = {"per_world": per_world, "summary": summarize(per_world)}
    finally:
        for srv in (s3, hdfs):
            if srv is not None:
                srv.cleanup()
    log("")
    log(f"{'backend':8s} {'W':>5s} {'ckpt calls/rank':>15s} {'rank0 commit':>12s} {'restart max':>11s} "
        f"{'NN RPC/rank ckpt':>16s} {'NN RPC/rank restart':>19s} {'commit s':>8s}")
    for kind, doc in results["backends"].items():
        for r in doc["per_world"]:
            ck, rs = r["checkpoints"][-1], r["restart"]
            log(f"{kind:8s} {r['world']:5d} {ck['calls_per_rank']:15.2f} {ck['rank0_commit_loop_calls']:12.0f} "
                f"{rs['calls_rank_max']:11d} {ck.get('nn_rpcs_per_rank', float('nan')):16.2f} "
                f"{rs.get('nn_rpcs_per_rank', float('nan')):19.2f} {ck['commit_wait_s']:8.2f}")
        for k, v in doc["summary"].items():
            if isinstance(v, dict):
                log(f"{kind:8s} slope of {k}: {v['slope_per_extra_rank']} per extra rank")
    log(f"wrote {results_io.write(results, __file__, args.json, args.key)}")
    print(json.dumps({k: v for k, v in results.items() if k != "backends"}))
    return 1 if results["errors"] and not results["backends"] else 0


if __name__ == "__main__":
    sys.exit(main())
