"""Benchmark (not a test): persist time of replicated state, spread over the ranks or written by rank 0 alone.

Paddle-free: W real processes drive the format layer (``GlobalCheckpointer``) against a simulated
remote store with a per-rank (per-process) bandwidth cap, ``ci/bench/simstore.py`` (
this script needs it and says so when it is missing). Every rank holds the same state (``--mb``
MB in ``--tensors`` tensors of varied sizes); at each of ``--rounds`` positions the ranks start
their save together (a barrier); the persist time is rank 0's, from the barrier until its global
manifest is committed. Then every rank restores the last checkpoint (``restore_s``: rank 0's).

    python ci/bench/spread_writes.py --world 4 --mb 400 --client-mbps 200 --rounds 3

prints one JSON line per writers setting and the ratio spread / one writer (medians), and adds them to
ci/bench/results/spread_writes.json under --key (or writes them alone to --json FILE).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
TESTS = os.path.join(ROOT, "tests")  # support/shares.py: a rank's share from whole snapshots
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import results_io  # noqa: E402

JOB, RANGE = "bench", "_range_0"


def state(mb: float, n: int) -> List[Any]:
    import numpy as np

    from paddle_acp.format.engine.snapshot import ProgramSnapshot, TensorData

    total = int(mb * 1e6) // 4
    weights = np.linspace(1.0, 3.0, n)
    sizes = [max(1, int(total * w / weights.sum())) for w in weights]
    rng = np.random.default_rng(0)
    ts = [TensorData(f"t{i:04d}", "float32", rng.standard_normal(s, dtype=np.float32)) for i, s in enumerate(sizes)]
    return [ProgramSnapshot("fp-bench", "bench", ts, {"last_epoch": 0})]


def rank_main(rank: int, world: int, uri: str, writers: str, mb: float, n: int, rounds: int, barrier: Any, out: Any) -> None:
    import simstore

    simstore.register()
    from support.shares import own_share

    from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
    from paddle_acp.format.checkpoints.part_reader import PartReader
    from paddle_acp.format.checkpoints.restart import load_newest
    from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot
    from paddle_acp.format.manifest import RangeRecord
    from paddle_acp.storage import open_storage

    storage = open_storage(uri)
    full = state(mb, n)
    gck = GlobalCheckpointer(storage, JOB, RANGE, rank, world, 0, 600.0)
    gck.poll_interval = 0.01
    times = []
    for epoch in range(rounds):
        programs, share = full, None
        if writers == "all":
            programs, share = own_share(full, rank, world)
        elif rank != 0:
            programs = [ProgramSnapshot(p.key, p.label, [], p.lr_scheduler) for p in full]
        snap = Snapshot(RangeRecord(RANGE, epoch, 100), programs, None, "bench", "pir", extra={}, share=share)
        barrier.wait()  # every rank starts its save at once (rank 0 has committed the previous one)
        t0 = time.time()
        res = gck.save(snap, "replicated")
        times.append(time.time() - t0)
        if rank == 0 and not res.committed:
            raise SystemExit(f"checkpoint {res.name} not committed")
    out.put((rank, "persist", times))
    barrier.wait()  # the last checkpoint is committed: every rank restores it at once
    t = time.time()
    loaded = load_newest(PartReader(storage, JOB, RANGE), gck, "replicated")
    assert loaded is not None
    loaded.close()
    out.put((rank, "restore", time.time() - t))


def run(world: int, writers: str, mb: float, n: int, rounds: int, client_mbps: float, latency_ms: float) -> Dict[str, Any]:
    import simstore

    d = tempfile.mkdtemp(prefix=f"spread-bench-{writers}-")
    uri = simstore.uri(d, simstore.SimOptions(latency_ms=float(latency_ms), client_mbps=float(client_mbps)))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    barrier = ctx.Barrier(world)
    procs = [ctx.Process(target=rank_main, args=(r, world, uri, writers, mb, n, rounds, barrier, q)) for r in range(world)]
    for p in procs:
        p.start()
    got: Dict[str, Dict[int, Any]] = {"persist": {}, "restore": {}}
    deadline = time.time() + 600 + rounds * 3 * mb / client_mbps
    while sum(len(v) for v in got.values()) < 2 * world and time.time() < deadline:
        try:
            rank, what, value = q.get(timeout=1.0)
            got[what][rank] = value
        except Exception:
            if not any(p.is_alive() for p in procs):
                break
    for p in procs:
        p.join(timeout=30)
    if len(got["persist"]) < world:
        raise SystemExit(f"writers={writers}: only {sorted(got['persist'])} of {world} ranks reported")
    persist = got["persist"][0]
    return {"writers": writers, "world": world, "state_mb": mb, "client_mbps": client_mbps, "latency_ms": latency_ms,
            "persist_s": [round(x, 3) for x in persist], "persist_median_s": round(statistics.median(persist), 3),
            "restore_s": round(got["restore"].get(0, float("nan")), 3)}


def main(argv: List[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--mb", type=float, default=400.0)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--client-mbps", type=float, default=200.0)
    ap.add_argument("--latency-ms", type=float, default=2.0)
    results_io.add_args(ap, __file__)
    a = ap.parse_args(argv)
    try:
        import simstore  # noqa: F401
    except ImportError:
        raise SystemExit("ci/bench/simstore.py is missing beside this script") from None
    out = [run(a.world, w, a.mb, a.tensors, a.rounds, a.client_mbps, a.latency_ms) for w in ("one", "all")]
    for r in out:
        print(json.dumps(r))
    ratio = round(out[1]["persist_median_s"] / out[0]["persist_median_s"], 3)
    print(json.dumps({"ratio_spread_to_one": ratio}))
    doc = {"command": " ".join(["python"] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "runs": out, "ratio_spread_to_one": ratio}
    print(f"wrote {results_io.write(doc, __file__, a.json, a.key)}")


if __name__ == "__main__":
    threading.current_thread().name = "spread-bench"
    main(sys.argv[1:])
