#!/usr/bin/env python3
"""Benchmark: how fast ``paddle-acp ls`` starts on a local root, against Python importing pyarrow.

Issue 17: the operator tools must not import Paddle; ``paddle-acp ls`` should start about as fast as
``python -c "import pyarrow"``. Each round runs, in fresh processes and in a rotating order:

* ``python -c "import pyarrow"`` (the baseline),
* ``paddle-acp ls ROOT`` (the console script, next to this interpreter),
* ``python -m paddle_acp ls ROOT`` (through the package: the version gate imports Paddle; for scale).

ROOT is a job with one empty range, made here (``ls`` lists it and exits 0). The figure is the ratio of
the medians, ``paddle-acp ls`` / ``import pyarrow`` (1.0 = as fast; lower is better). Wall time of the
whole process, start to exit.

Usage: python ci/bench/cli_startup.py [--rounds 7] [--key KEY | --json FILE]
(the run is added to ci/bench/results/cli_startup.json under --key, or written alone to --json FILE)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import results_io  # noqa: E402


def timed(cmd, env) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    results_io.add_args(ap, __file__)
    args = ap.parse_args()
    script = os.path.join(os.path.dirname(sys.executable), "paddle-acp")
    if not os.path.exists(script):
        raise SystemExit(f"no console script {script}: install paddle-acp into this environment (ci/env.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_ACP_")}
    env["GLOG_minloglevel"] = "2"
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "job1", "range", "_range_0"))
        with open(os.path.join(root, "job1", "job.json"), "w") as f:
            json.dump({"created": time.time()}, f)
        cases = {
            "import pyarrow": [sys.executable, "-c", "import pyarrow"],
            "paddle-acp ls": [script, "ls", root],
            "python -m paddle_acp ls": [sys.executable, "-m", "paddle_acp", "ls", root],
        }
        names = list(cases)
        for name in names:  # warm the page cache once
            timed(cases[name], env)
        times = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(timed(cases[name], env))
    med = {name: statistics.median(v) for name, v in times.items()}
    ratio = med["paddle-acp ls"] / med["import pyarrow"]
    for name in names:
        print(f"{name:26s} median {med[name] * 1000:7.1f} ms  (min {min(times[name]) * 1000:.1f}, "
              f"max {max(times[name]) * 1000:.1f}, {args.rounds} rounds)")
    print(f"paddle-acp ls / import pyarrow = {ratio:.2f}x; "
          f"python -m paddle_acp ls / import pyarrow = {med['python -m paddle_acp ls'] / med['import pyarrow']:.2f}x")
    doc = {"command": " ".join(["python"] + sys.argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "rounds": args.rounds, "median_s": med, "times_s": times, "ratio": ratio}
    print(f"wrote {results_io.write(doc, __file__, args.json, args.key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
