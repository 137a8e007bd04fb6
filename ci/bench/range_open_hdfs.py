#!/usr/bin/env python
"""A range's open on the real HDFS with and without the early connection (PADDLE_ACP_CONNECT_EARLY, issue 28).

Each run is a fresh process of ``tests/scripts/rank_train.py`` (one rank, one epoch of one step) that
imports paddle_acp with an HDFS checkpoint location, builds its small programs, runs its startup
program, sleeps ``--setup-sleep`` seconds (the script's own setup: its data and model; a sleep, no
CPU), then opens a range: the figure is the time from the range's call to its first epoch (the HDFS client's start where it has not started yet, the job marker and fence, the restore
check). Early connection on and off alternate (ABBA) over ``--rounds``, at each setup time given.
A benchmark, not a timed test: this machine's 2 cores also run the HDFS server JVMs.

    python ci/bench/range_open_hdfs.py --rounds 5 --setups 0,1.5   # added to ci/bench/results/range_open_hdfs.json
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
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

import results_io  # noqa: E402
from support import servers  # noqa: E402

SCRIPT = os.path.join(REPO, "tests", "scripts", "rank_train.py")  # its --timing file holds the range's open


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--setups", default="0,1.5", help="the script's setup seconds before its range, comma-separated")
    results_io.add_args(ap, __file__)
    args = ap.parse_args(argv)
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    res: dict = {}
    work = tempfile.mkdtemp(prefix="acp-bench-open-")
    with servers.HDFSServer() as hdfs:
        env = dict(os.environ, **hdfs.client_env(), PYTHONPATH=REPO, PADDLE_ACP_LOG_LEVEL="WARNING")
        env.pop("LIBHDFS_OPTS")  # as most users run: paddle-acp's options for libhdfs's JVM
        for r in range(args.rounds):
            for early in ("1", "0") if r % 2 == 0 else ("0", "1"):
                for setup in setups:
                    e = dict(env, PADDLE_ACP_CONNECT_EARLY=early,
                             PADDLE_ACP_CHECKPOINT_URI=f"{hdfs.uri}/bench-open/{uuid.uuid4().hex[:8]}")
                    timing = os.path.join(work, f"timing-{r}-{early}-{setup}.json")
                    cmd = [sys.executable, SCRIPT, "--out", os.path.join(work, f"out-{r}-{early}-{setup}"), "--kind", "dp",
                           "--epochs", "1", "--steps-per-epoch", "1", "--setup-sleep", setup, "--timing", timing]
                    out = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=300, cwd=REPO)
                    if out.returncode != 0:
                        raise RuntimeError(f"run failed (rc {out.returncode}): {out.stderr[-3000:]}")
                    with open(timing) as f:
                        res.setdefault(f"early={early} setup={setup}", []).append(json.load(f)["open_s"])
    shutil.rmtree(work, ignore_errors=True)
    summary = {k: {"median_s": statistics.median(v), "runs_s": [round(x, 3) for x in v]} for k, v in sorted(res.items())}
    for k, v in summary.items():
        print(f"[range_open_hdfs] {k}s: the range's open, median of {args.rounds}: {v['median_s']:.3f} s {v['runs_s']}")
    doc = {"rounds": args.rounds, "setups": setups, "results": summary}
    print(f"[range_open_hdfs] wrote {results_io.write(doc, __file__, args.json, args.key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
