#!/usr/bin/env python
"""What each HDFS client costs a training process: memory and time to connect (not throughput).

Each run is a fresh Python process that imports paddle_acp (Paddle with it), then opens an HDFS location
through one client (``PADDLE_ACP_HDFS_CLIENT``: ``pyarrow``, libhdfs and its JVM in the process; ``hdfs-native``,
the Rust client) and writes and reads one small file. Reported per client, the medians over ``--rounds``
(the clients alternate, ABBA): the resident memory the client added (VmRSS after the read minus before the
open: libhdfs's JVM lives in the training process, outside paddle-acp's host-memory budget), the open's time
(the client's start and the connection's probe), and the small write's time (one block report's wait).
Throughput of large checkpoints is ``ci/bench/storage_backends.py``'s. A benchmark, not a timed test: this
machine's 2 cores also run the HDFS server JVMs.

    python ci/bench/hdfs_clients.py --rounds 4   # added to ci/bench/results/hdfs_clients.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

import results_io  # noqa: E402
from support import servers  # noqa: E402

CLIENTS = ("pyarrow", "hdfs-native")

CHILD = r"""
import json, sys, time
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
from paddle_acp.storage import open_storage
before = rss_mb()
t0 = time.monotonic()
st = open_storage(sys.argv[1])
t1 = time.monotonic()
st.write_bytes("probe.bin", b"x" * 4096)
t2 = time.monotonic()
assert st.read_bytes("probe.bin") == b"x" * 4096
print(json.dumps({"client": st.client, "rss_added_mb": round(rss_mb() - before, 1), "open_s": round(t1 - t0, 3),
                  "small_write_s": round(t2 - t1, 3)}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    results_io.add_args(ap, __file__)
    args = ap.parse_args(argv)
    runs = {c: [] for c in CLIENTS}
    with servers.HDFSServer() as hdfs:
        env = dict(os.environ, **hdfs.client_env(), PYTHONPATH=REPO, PADDLE_ACP_LOG_LEVEL="WARNING")
        env.pop("LIBHDFS_OPTS", None)  # as most users run: paddle-acp's options for libhdfs's JVM
        env.pop("PADDLE_ACP_CHECKPOINT_URI", None)  # (no early connection: the open is timed here)
        for r in range(args.rounds):
            order = CLIENTS if r % 4 in (0, 3) else CLIENTS[::-1]
            for client in order:
                out = subprocess.run([sys.executable, "-c", CHILD, f"{hdfs.uri}/hdfs_clients/{uuid.uuid4().hex[:8]}"],
                                     env=dict(env, PADDLE_ACP_HDFS_CLIENT=client), capture_output=True, text=True,
                                     timeout=300)
                if out.returncode != 0:
                    raise SystemExit(f"{client}: exited {out.returncode}: {out.stderr[-2000:]}")
                run = json.loads(out.stdout.strip().splitlines()[-1])
                assert run["client"] == client, run
                runs[client].append(run)
                print(f"[hdfs_clients] round {r} {client}: {run}", flush=True)
    summary = {c: {k: statistics.median(x[k] for x in runs[c]) for k in ("rss_added_mb", "open_s", "small_write_s")}
               for c in CLIENTS}
    for c in CLIENTS:
        print(f"[hdfs_clients] {c}: median {summary[c]}", flush=True)
    doc = {"command": "python ci/bench/hdfs_clients.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "rounds": args.rounds, "summary": summary, "runs": runs}
    print(f"[hdfs_clients] wrote {results_io.write(doc, __file__, args.json, args.key)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
