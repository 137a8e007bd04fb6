"""Benchmark: training time with a checkpoint every epoch against none, to a SIMULATED remote store.

The store is ci/bench/simstore.py (``sim://``): bytes in a local directory, every call and byte delayed
like a store on other hosts (latency, per-client and aggregate bandwidth), the delays spent in sleeps
that use no CPU. This machine's 2 cores cannot also host a fair HDFS; every figure of this
benchmark says it is simulated, and with which parameters.

The job: W rank processes (``PADDLE_TRAINERS_NUM=W``, ``PADDLE_ACP_RANK_STATE=per-rank``: every rank
holds its own state, rank 0 commits the global checkpoint; W = 1: one plain process). Each holds
``--params`` float32 parameters with Adam (12 bytes per parameter: 100e6 = 1.2 GB per rank) in
``--layers`` square fc layers (default 2: six equal large tensors, the weights and their two moments). An
epoch is ``--batches`` batches; a batch is one run of a real small Paddle program (fc 64x64 + Adam)
and a sleep of ``epoch_seconds / batches``, which stands for the accelerator's compute (a GPU's
work uses no host CPU; on 2 cores 4 ranks cannot each compute 12 s per epoch honestly), and each
epoch starts with one real optimizer step of the large program (every byte of the state changes), as
a script's training program runs from its range's first step (``--step-at-end``: at each epoch's end,
the layout of the runs before 2026-12-05, where the program registered right before the first save).
The ranks keep in lockstep through a file barrier at each epoch start, as data-parallel ranks do
through their collectives.

Each rank process runs every round's two runs itself (one Paddle start per configuration): with
checkpoints (a fresh ``sim://`` directory, async saves, a checkpoint at every epoch end, the range
waiting for its last commit) and without (a plain ``range``), in ABBA order. A run's time is the
job's: from the barrier before its first epoch to its last rank's end, commit of the final
checkpoint included. The figure is the median over the rounds of (with / without) - 1.

The persist figure (``--persist --state replicated``): the same job with checkpoints only, each
rank holding the same (replicated) state; rank 0's persist seconds of every checkpoint (from the
start of its save to the global commit, from the library's metrics lines), median per world size,
and the largest world's against the smallest's. With ``--client-mbps`` as the per-rank cap, one
writer takes state / cap whatever W is; writes spread over W ranks take about 1/W of it. The ranks
run under the busy policy ``wait`` there, so that every checkpoint is written and timed.

Usage: python ci/bench/sim_training.py [--ranks 1,4] [--params 100e6] [--epochs 6] [--epoch-seconds 12]
           [--rounds 5] [--latency-ms 2] [--client-mbps 500] [--aggregate-mbps 2000]
           [--commit rename|manifest-last] [--key KEY | --json FILE]
       python ci/bench/sim_training.py --persist --state replicated --ranks 1,4 --client-mbps 200 --aggregate-mbps 0
           [--env NAME=VALUE ...]     # persist time of replicated state, W = 4 against one writer
       python ci/bench/sim_training.py --quick     # tiny sizes, two rounds: a smoke run
The run is added to ci/bench/results/sim_training.json under --key (or written alone to --json FILE).
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import results_io  # noqa: E402
import simstore  # noqa: E402

BYTES_PER_PARAM = 12


def log(msg):
    print(msg, flush=True)


def saves_of(run_dir, rank):
    """This rank's saves of a run, from the metrics lines the library wrote on the store (read as
    local files: the benchmark's privilege): (stall_s, waited_s, persist_s, committed) each; rank 0's
    persist runs from the start of its save to the global commit."""
    import glob

    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "**", "metrics", f"trainer-{rank}.jsonl"), recursive=True)):
        for line in open(path):
            rec = json.loads(line)
            if rec.get("event") in ("saved", "failed"):
                out.append({k: rec.get(k) for k in ("event", "epoch", "stall_s", "waited_s", "persist_s", "committed", "time",
                                                     "parts_wait_s", "bytes")})
    return out


# -- one rank ----------------------------------------------------------------------------------
def barrier(where, name, rank, world, timeout=600.0):
    if world <= 1:
        return
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, f"{name}.r{rank}"), "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + timeout
    want = [os.path.join(where, f"{name}.r{r}") for r in range(world)]
    while not all(os.path.exists(w) for w in want):
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: barrier {name} timed out")
        time.sleep(0.002)


def rank_main(args):
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0") or 0)
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1") or 1)
    simstore.register()
    import numpy as np
    import paddle

    import paddle_acp as acp
    from paddle_acp.runtime import api

    paddle.enable_static()
    seed = 1 if args.state == "replicated" else rank + 1  # per-rank state: every rank's values differ
    paddle.seed(seed)
    np.random.seed(seed)
    width = max(8, int((args.params / args.layers) ** 0.5))

    def build(w, prefix, layers=2):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard(prefix):
            x = paddle.static.data("x", [None, w], "float32")
            h = x
            for _ in range(layers):
                h = paddle.static.nn.fc(h, w)
            loss = paddle.mean(h * h)
            paddle.optimizer.Adam(1e-4).minimize(loss)
        return main, startup, loss

    big, big_start, big_loss = build(width, "big_", args.layers)
    small, small_start, small_loss = build(64, "small_")
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(big_start)
    exe.run(small_start)
    big_feed = {"x": np.random.rand(2, width).astype("float32")}
    exe.run(big, feed=big_feed, fetch_list=[big_loss])  # Adam's moments exist from here on
    sleep = args.epoch_seconds / args.batches
    out = open(args.out, "a")

    def run(index, on):
        run_dir = os.path.join(args.store, f"run{index}")
        if on:
            os.environ["PADDLE_ACP_CHECKPOINT_URI"] = simstore.uri(run_dir, args.sim)
        else:
            os.environ.pop("PADDLE_ACP_CHECKPOINT_URI", None)
        api.reset()
        barrier(args.barrier, f"run{index}", rank, world)
        t0 = time.time()
        boundaries = 0.0
        epochs = acp.train_epoch_range(args.epochs, save_checkpoint_inter=0) if on else range(args.epochs)
        it = iter(epochs)
        epoch = 0
        while True:
            tb = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                boundaries += time.perf_counter() - tb
                break
            boundaries += time.perf_counter() - tb
            barrier(args.barrier, f"run{index}.e{epoch}", rank, world)
            if not args.step_at_end:  # the epoch's first step: the state's program runs from a range's first step
                exe.run(big, feed=big_feed, fetch_list=[big_loss])
            for _ in range(args.batches):
                exe.run(small, feed={"x": np.random.rand(8, 64).astype("float32")}, fetch_list=[small_loss])
                time.sleep(sleep)  # the accelerator's compute: no host CPU
            if args.step_at_end:
                exe.run(big, feed=big_feed, fetch_list=[big_loss])
            epoch += 1
        t1 = time.time()
        saves = saves_of(run_dir, rank) if on else []
        out.write(json.dumps({"run": index, "on": on, "rank": rank, "t0": t0, "t1": t1, "boundaries": boundaries,
                              "saves": saves}) + "\n")
        out.flush()
        barrier(args.barrier, f"run{index}.end", rank, world)
        if on and rank == 0:
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.rmtree(run_dir + ".simlink", ignore_errors=True)

    index = 0
    for r in range(args.rounds):
        order = (True,) if args.persist else (True, False) if r % 2 == 0 else (False, True)  # ABBA
        for on in order:
            run(index, on)
            index += 1
    api.reset()
    return 0


# -- the driver --------------------------------------------------------------------------------
def measure(args, world, work):
    """One configuration: W rank processes; returns its figure and the rounds."""
    res_file = os.path.join(work, f"w{world}.jsonl")
    cmd = [sys.executable, os.path.abspath(__file__), "--_rank", "--state", args.state] + (["--persist"] if args.persist else []) + [ "--out", res_file, "--store", os.path.join(work, f"store{world}"),
           "--barrier", os.path.join(work, f"barrier{world}"), "--params", str(args.params), "--layers", str(args.layers), "--epochs", str(args.epochs),
           "--epoch-seconds", str(args.epoch_seconds), "--batches", str(args.batches), "--rounds", str(args.rounds),
           "--_sim", args.sim.query()] + (["--step-at-end"] if args.step_at_end else [])
    env = dict(os.environ, PADDLE_ACP_LOG_LEVEL="WARNING", PADDLE_ACP_ASYNC="1", PADDLE_ACP_MAX_TO_KEEP="1",
               PADDLE_TRAINERS_NUM=str(world), OMP_NUM_THREADS="1", GLOG_minloglevel="2")
    env.pop("PADDLE_ACP_CHECKPOINT_URI", None)
    if world > 1:
        env["PADDLE_ACP_RANK_STATE"] = args.state
    if args.persist:
        # the persist figure times every checkpoint: none may be skipped because the one before is still
        # being written (the default busy policy, auto, would once its waits pass their budget)
        env["PADDLE_ACP_BUSY_POLICY"] = "wait"
    for kv in args.env:
        k, _, v = kv.partition("=")
        env[k] = v
    t0 = time.monotonic()
    procs = [subprocess.Popen(cmd, env=dict(env, PADDLE_TRAINER_ID=str(r))) for r in range(world)]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise RuntimeError(f"W={world}: rank exit codes {codes}")
    rows = [json.loads(line) for line in open(res_file)]
    runs = {}
    for row in rows:
        runs.setdefault(row["run"], []).append(row)
    if args.persist:
        persist = [sv["persist_s"] for i in sorted(runs) for row in runs[i] if row["rank"] == 0 for sv in row["saves"]
                   if sv["event"] == "saved" and sv.get("committed", True) is not False]
        log(f"W={world}: persist seconds of rank 0 (to the global commit) {['%.2f' % p for p in persist]}")
        return {"ranks": world, "state": args.state, "persist_s_median": statistics.median(persist), "persist_s": persist,
                "state_bytes_per_rank": int(args.params) * BYTES_PER_PARAM, "wall_s": time.monotonic() - t0}
    return dict(summarize(args, world, runs, time.monotonic() - t0), rank_rows=rows)


def summarize(args, world, runs, wall_s):
    """The figure of one configuration from its rows (one per rank and run)."""
    times = {}
    for i, rs in sorted(runs.items()):
        assert len(rs) == world, (i, rs)
        saves = [r["saves"] for r in rs if r["saves"]]
        times[i] = {"on": rs[0]["on"], "s": max(r["t1"] for r in rs) - min(r["t0"] for r in rs),
                    "blocked": max(r["boundaries"] for r in rs),
                    # the first save of a range waits for its snapshot arena to be populated (once per range)
                    "first_stall": max((sv[0]["stall_s"] for sv in saves), default=0.0),
                    "later_stalls": max((sum(x["stall_s"] for x in sv[1:]) for sv in saves), default=0.0),
                    "persist": [x["persist_s"] for r in rs if r["rank"] == 0 for x in r["saves"]]}
    rounds = []
    for r in range(args.rounds):
        a, b = times[2 * r], times[2 * r + 1]
        on, off = (a, b) if a["on"] else (b, a)
        rounds.append({"with_s": on["s"], "without_s": off["s"], "overhead": on["s"] / off["s"] - 1.0,
                       "blocked_at_boundaries_s": on["blocked"] - off["blocked"],
                       "first_save_stall_s": on["first_stall"], "later_stalls_s": on["later_stalls"],
                       "overhead_without_first_stall": (on["s"] - on["first_stall"]) / off["s"] - 1.0,
                       "rank0_persist_s": on["persist"]})
        x = rounds[-1]
        log(f"W={world} round {r}: with checkpoints {on['s']:.2f}s, without {off['s']:.2f}s ({x['overhead']:+.2%}); "
            f"blocked at epoch boundaries {x['blocked_at_boundaries_s']:.2f}s on the slowest rank, of which the first "
            f"save's stall {x['first_save_stall_s']:.2f}s (arena population) and the other stalls {x['later_stalls_s']:.2f}s; "
            f"rank 0's persists {', '.join('%.2f' % p for p in on['persist'])}s")
    return {"ranks": world, "overhead": statistics.median(r["overhead"] for r in rounds), "rounds": rounds,
            "overhead_without_first_stall": statistics.median(r["overhead_without_first_stall"] for r in rounds),
            "state_bytes_per_rank": int(args.params) * BYTES_PER_PARAM,
            "epoch_seconds_as_run": statistics.median(r["without_s"] for r in rounds) / args.epochs,
            "wall_s": wall_s}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="1,4", help="world sizes to measure, comma-separated")
    ap.add_argument("--params", type=float, default=100e6, help="parameters per rank (x12 bytes with Adam)")
    ap.add_argument("--layers", type=int, default=2,
                    help="fc layers of the large program (width x width each; with Adam three equal tensors per "
                         "layer: with 2, six equal tensors, which spread writes over 4 ranks cut into byte ranges)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--epoch-seconds", type=float, default=12.0, help="the accelerator's compute per epoch (a sleep)")
    ap.add_argument("--batches", type=int, default=20, help="batches per epoch (one small Paddle run each)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=2.0)
    ap.add_argument("--client-mbps", type=float, default=500.0, help="per-client (per-rank) bandwidth, MB/s; 0: none")
    ap.add_argument("--aggregate-mbps", type=float, default=2000.0, help="the store's aggregate bandwidth, MB/s; 0: none")
    ap.add_argument("--commit", choices=["rename", "manifest-last"], default="rename")
    ap.add_argument("--state", choices=["per-rank", "replicated"], default="per-rank",
                    help="PADDLE_ACP_RANK_STATE of jobs of several ranks (replicated: the same state on every rank)")
    ap.add_argument("--persist", action="store_true",
                    help="the persist figure: runs with checkpoints only; rank 0's persist seconds (to the global "
                         "commit) per world size, and the largest world's against the smallest's")
    ap.add_argument("--step-at-end", action="store_true",
                    help="run the large program's step at each epoch's end, not at its start (the layout of runs "
                         "before 2026-12-05: the program then registers right before the first save, whose copy "
                         "waits for the snapshot arena's population)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for the ranks (e.g. a feature switch of the code under test)")
    ap.add_argument("--dir", default=None, help="scratch directory (default: system temp)")
    results_io.add_args(ap, __file__)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, two rounds: a smoke run")
    ap.add_argument("--rows", action="append", default=[], metavar="W:FILE",
                    help="a configuration already measured: its rank rows (a --_rank --out file kept from an earlier "
                         "run with the same settings), summarized instead of measured again")
    ap.add_argument("--_rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_sim", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--barrier", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._rank:
        args.sim = simstore.parse_options(args._sim, env={})
        return rank_main(args)
    if args.quick:
        args.params, args.epochs, args.epoch_seconds, args.batches, args.rounds = 2e5, 2, 0.4, 4, 2
    args.sim = simstore.SimOptions(latency_ms=args.latency_ms, client_mbps=args.client_mbps,
                                   aggregate_mbps=args.aggregate_mbps, commit=args.commit)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    log(f"storage: {args.sim.describe()}")
    log("compute: a sleep of epoch_seconds per epoch (the accelerator's work, no host CPU), one small Paddle "
        "program run per batch, one optimizer step of the full state per epoch, at its "
        + ("end" if args.step_at_end else "start"))
    work = tempfile.mkdtemp(prefix="acp-bench-sim-", dir=args.dir)
    results = []
    try:
        for spec in args.rows:
            w, _, path = spec.partition(":")
            runs = {}
            for line in open(path):
                row = json.loads(line)
                runs.setdefault(row["run"], []).append(row)
            log(f"W={w}: from the rows in {path}")
            results.append(dict(summarize(args, int(w), runs, None), from_rows=path))
        for world in [int(x) for x in args.ranks.split(",") if x.strip()]:
            results.append(measure(args, world, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    persist_ratio = None
    if args.persist and len(results) >= 2:
        persist_ratio = results[-1]["persist_s_median"] / results[0]["persist_s_median"]
        log(f"persist time W={results[-1]['ranks']} / W={results[0]['ranks']} ({args.state}, {' '.join(args.env) or 'default settings'}): "
            f"{persist_ratio:.3f} (issue 28's target for spread writes: <= 0.35) [{args.sim.describe()}]")
    for r in ([] if args.persist else results):
        log(f"W={r['ranks']}: end to end, a checkpoint every epoch vs none, median of {args.rounds} paired rounds: "
            f"{r['overhead']:+.2%} (target <= +3%; without the first save's stall {r['overhead_without_first_stall']:+.2%}); "
            f"{r['state_bytes_per_rank'] / 1e9:.2f} GB per rank, "
            f"epochs of {r['epoch_seconds_as_run']:.1f} s as run [{args.sim.describe()}]")
    doc = {"command": " ".join(["python"] + sys.argv), "date": started, "machine": f"{os.cpu_count()} cores, {platform.machine()}",
           "storage": {"simulated": True, "description": args.sim.describe(), **vars(args.sim)},
           "compute": "sleep of epoch_seconds per epoch for the accelerator + one small Paddle run per batch "
                      "+ one optimizer step of the full state per epoch, at its " + ("end" if args.step_at_end else "start"),
           "args": {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("sim", "out", "store", "barrier")},
           "results": results}
    if persist_ratio is not None:
        doc["persist_ratio_largest_vs_smallest_world"] = persist_ratio
    log(f"wrote {results_io.write(doc, __file__, args.json, args.key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
