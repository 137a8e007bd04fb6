"""Benchmark: paddle-acp's save/restore/hook costs as ratios against baselines run in the same process.

Figures (each the median over paired rounds, A and B back to back; reads are cold: the files are
dropped from the page cache first with posix_fadvise(DONTNEED), as after a restart):
  1. stall per checkpoint (async) vs the floor, a bare two-thread memcpy of the same bytes into a
     reused, populated buffer (target <= 1.15x); vs Paddle's own save path made durable (save_vars or
     save_persistables + fsync of its files; target <= 0.1x); vs Paddle's page-cache save (no fsync);
     vs a raw write + fsync of the same bytes
  2. synchronous save throughput vs a raw sequential write + fsync of the same bytes
  3. restore time vs (a raw cold read of the same bytes into preallocated buffers + one memcpy of them
     into the scope's tensors) (target <= 1.15x; also on the rounds where the disk was fast)
  4. Executor.run hook overhead on a tiny program (with vs without the hook; inside an active range),
     and the hook's own cost per call (the same wrapper around a no-op, without Paddle's noise)
  5. end-to-end training with a checkpoint every epoch vs checkpointing off: the median of
     --e2e-rounds (>= 5) paired rounds (target <= +3%); its state size is --e2e-params
  6. cost as the state grows (--scale-sizes GB, PIR): stall, sync save and restore seconds at each size
     (figures 1-3 in a process per size), and their slope in seconds per GB (least squares)

Usage: python ci/bench/local_costs.py [--ir pir|legacy|both] [--params 100e6] [--rounds 3] [--only 1,3,5,6]
                                      [--key KEY | --json FILE]
       python ci/bench/local_costs.py --quick                 # tiny sizes, one round: a smoke run
       python ci/bench/local_costs.py --only 5 --e2e-hdfs ... # figure 5 with checkpoints on a real HDFS (127.0.0.1)
Prints one line per round, then the table of figures against their targets, and adds them to
ci/bench/results/local_costs.json under --key (or writes them alone to --json FILE).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import results_io  # noqa: E402

BYTES_PER_PARAM = 12  # float32 parameter + Adam's two moments


def log(msg):
    print(msg, flush=True)


def child(args, figures, ir, params, rounds, extra_env=None):
    """Measure ``figures`` in a process of its own (the IR is fixed at paddle import; a figure's
    buffers left mapped must not disturb the next)."""
    env = dict(os.environ, PADDLE_ACP_LOG_LEVEL="WARNING")
    env.pop("PADDLE_ACP_CHECKPOINT_URI", None)
    env.update(extra_env or {})
    if ir == "legacy":
        env["FLAGS_enable_pir_api"] = "0"
    else:
        env.pop("FLAGS_enable_pir_api", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", "--params", str(params), "--rounds", str(rounds),
           "--e2e-rounds", str(args.e2e_rounds), "--epoch-seconds", str(args.epoch_seconds),
           "--e2e-epochs", str(args.e2e_epochs), "--only", ",".join(map(str, figures))]
    if args.dir:
        cmd += ["--dir", args.dir]
    if args.quick:
        cmd.append("--quick")
    if args.e2e_uri:
        cmd += ["--e2e-uri", args.e2e_uri]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    lines = p.stdout.splitlines()
    for line in lines:
        if not line.startswith("RESULT "):
            print(line, flush=True)
    if p.returncode != 0 or not lines or not lines[-1].startswith("RESULT "):
        raise RuntimeError(f"bench of figures {figures} ({ir}) failed (exit {p.returncode})")
    return json.loads(lines[-1][7:])


def slope(xs, ys):
    """Least-squares slope and intercept of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    return b, my - b * mx


def scaling(args):
    """Figure 6: figures 1-3 at each size, one process per size (PIR)."""
    rows = []
    for gb in args.scale_sizes:
        params = gb * 1e9 / BYTES_PER_PARAM
        r = child(args, [1, 3], "pir", params, args.scale_rounds)
        rows.append({"gb": r["state_bytes"] / 1e9, "stall_s": r["stall_seconds"], "memcpy_s": r["bare_memcpy_seconds"],
                     "sync_save_s": r["sync_save_seconds"], "restore_s": r["restore_seconds"],
                     "read_plus_memcpy_s": r["read_plus_memcpy_seconds"],
                     "stall_vs_bare_memcpy": r["stall_vs_bare_memcpy"],
                     "restore_vs_read_plus_memcpy": r["restore_vs_read_plus_memcpy"]})
    out = {"sizes": rows}
    if len(rows) >= 2:
        xs = [r["gb"] for r in rows]
        for key in ("stall_s", "memcpy_s", "sync_save_s", "restore_s", "read_plus_memcpy_s"):
            b, a = slope(xs, [r[key] for r in rows])
            out[f"{key}_per_gb"] = b
            out[f"{key}_fixed"] = a
            # flat per-GB cost = linear growth; > 1 means the largest size costs more per GB than the smallest
            out[f"{key}_per_gb_largest_vs_smallest"] = (rows[-1][key] / xs[-1]) / (rows[0][key] / xs[0])
    return out


FIGURES = [  # (key, label, target, format)
    ("stall_vs_bare_memcpy", "1. stall / bare two-thread memcpy of the same bytes", "<= 1.15", "{:.3f}"),
    ("stall_vs_paddle_durable", "1. stall / Paddle's save made durable (+fsync)", "<= 0.1", "{:.3f}"),
    ("stall_vs_paddle", "1. stall / Paddle's page-cache save", "", "{:.3f}"),
    ("stall_vs_raw_write", "1. stall / raw write + fsync", "", "{:.3f}"),
    ("stall_seconds", "1. stall, seconds", "", "{:.3f}"),
    ("sync_save_throughput_vs_raw", "2. sync save throughput / raw write + fsync", ">= 0.8", "{:.3f}"),
    ("restore_vs_read_plus_memcpy", "3. restore / (raw cold read + one memcpy)", "<= 1.15", "{:.3f}"),
    ("restore_vs_read_plus_memcpy_fast_disk", "3. the same, fast-disk rounds", "<= 1.15", "{:.3f}"),
    ("restore_throughput_vs_raw_read", "3. restore throughput / raw cold read", "", "{:.3f}"),
    ("hook_overhead", "4. hook overhead on a tiny exe.run", "<= +2%", "{:+.2%}"),
    ("end_to_end_overhead", "5. end to end, checkpoint every epoch vs off (median)", "<= +3%", "{:+.2%}"),
    ("seconds_lost_per_checkpoint", "5. training seconds lost per checkpoint", "", "{:.3f}"),
]


def table(results, scale):
    irs = [r["ir"] for r in results]
    head = ["figure"] + irs + ["target"]
    rows = []
    for key, label, target, fmt in FIGURES:
        if not any(key in r for r in results):
            continue
        rows.append([label] + [fmt.format(r[key]) if key in r else "-" for r in results] + [target])
    if scale:
        for s in scale["sizes"]:
            rows.append([f"6. {s['gb']:.2f} GB: stall / sync save / restore, s per GB",
                         f"{s['stall_s'] / s['gb']:.3f} / {s['sync_save_s'] / s['gb']:.3f} / {s['restore_s'] / s['gb']:.3f}"]
                        + [""] * (len(irs) - 1) + ["flat"])
        if "stall_s_per_gb" in scale:
            rows.append(["6. slope, s per GB: stall / sync save / restore",
                         f"{scale['stall_s_per_gb']:.3f} / {scale['sync_save_s_per_gb']:.3f} / {scale['restore_s_per_gb']:.3f}"]
                        + [""] * (len(irs) - 1) + [""])
            rows.append(["6. per GB, largest / smallest size: stall / save / restore",
                         f"{scale['stall_s_per_gb_largest_vs_smallest']:.2f} / {scale['sync_save_s_per_gb_largest_vs_smallest']:.2f}"
                         f" / {scale['restore_s_per_gb_largest_vs_smallest']:.2f}"] + [""] * (len(irs) - 1) + ["~1"])
    widths = [max(len(str(row[i])) for row in [head] + rows) for i in range(len(head))]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(head, widths)), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ir", choices=["pir", "legacy", "both"], default="both")
    ap.add_argument("--params", type=float, default=100e6, help="model parameters (float32); Adam triples the state")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--e2e-params", type=float, default=25e6, help="figure 5's model (25e6: a 300 MB state)")
    ap.add_argument("--e2e-rounds", type=int, default=5, help="paired rounds of figure 5 (its median)")
    ap.add_argument("--epoch-seconds", type=float, default=0.5, help="epoch length for the end-to-end figure")
    ap.add_argument("--e2e-epochs", type=int, default=25, help="epochs per run for the end-to-end figure")
    ap.add_argument("--scale-sizes", default="0.3,1.2,2.4", help="figure 6: state sizes in GB")
    ap.add_argument("--scale-rounds", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated figure numbers to measure (default: all)")
    results_io.add_args(ap, __file__)
    ap.add_argument("--dir", default=None, help="scratch directory (default: system temp)")
    ap.add_argument("--quick", action="store_true", help="tiny model, one round: a smoke run")
    ap.add_argument("--e2e-hdfs", action="store_true",
                    help="figure 5 checkpoints to a real HDFS server (tests/support/servers.py, started here) instead of a local disk")
    ap.add_argument("--e2e-uri", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        if args.quick:
            args.rounds, args.epoch_seconds, args.e2e_epochs = 1, 0.3, 3
        import local_costs_figures

        print("RESULT " + json.dumps(local_costs_figures.bench_one(args)), flush=True)
        return 0
    args.scale_sizes = [float(x) for x in args.scale_sizes.split(",") if x.strip()]
    if args.quick:
        args.params, args.e2e_params, args.rounds, args.e2e_rounds = min(args.params, 2e5), 2e5, 1, 2
        args.scale_sizes, args.scale_rounds = [0.003, 0.012], 1
    hdfs = None
    if args.e2e_hdfs:
        sys.path.insert(0, os.path.join(REPO, "tests"))  # the test helpers: tests/support
        from support import servers

        hdfs = servers.HDFSServer().start()
        os.environ.update(hdfs.client_env())
        args.e2e_uri = f"{hdfs.uri}/bench"
        log(f"figure 5 checkpoints to HDFS at {hdfs.uri}")
    try:
        return run(args)
    finally:
        if hdfs is not None:
            hdfs.cleanup()


def run(args):
    figures = [int(x) for x in args.only.split(",")] if args.only else [1, 2, 3, 4, 5, 6]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = []
    for ir in (["pir", "legacy"] if args.ir == "both" else [args.ir]):
        merged = {"ir": ir}
        main_figs = [f for f in figures if f in (1, 2, 3, 4)]
        if main_figs:
            merged.update(child(args, main_figs, ir, args.params, args.rounds))
        if 5 in figures:  # in a process of its own: the other figures' buffers disturbed it (+1% -> +26%)
            e2e = child(args, [5], ir, args.e2e_params, args.rounds)
            merged.update({k: v for k, v in e2e.items() if k != "state_bytes"})
            merged["e2e_state_bytes"] = e2e["state_bytes"]
        results.append(merged)
    scale = scaling(args) if 6 in figures else None
    print()
    print(table(results, scale))
    doc = {"command": " ".join(["python"] + sys.argv), "date": started, "machine": f"{os.cpu_count()} cores, {platform.machine()}",
           "args": {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "e2e_uri"},
           "results": results}
    if scale is not None:
        doc["scaling"] = scale
    print(f"wrote {results_io.write(doc, __file__, args.json, args.key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
