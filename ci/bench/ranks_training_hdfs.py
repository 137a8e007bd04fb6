#!/usr/bin/env python
"""Training time of a 2-rank data-parallel job checkpointing every epoch to the real HDFS (issue 28 item 1).

Both ranks run tests/scripts/rank_train.py (``--kind dp``: identical replicated state; a file
barrier at every epoch keeps them in lockstep, as the gradient all-reduce would), one step per
epoch, epochs far shorter than a persist to HDFS. Each round runs the same job without
checkpoints and with a checkpoint every epoch (``PADDLE_ACP_BUSY_POLICY``: ``--policy``, default ``skip``),
in alternating order; the job's training time is the longer of its two ranks' epoch loops
(the final checkpoint's commit included). Reported: the median of the per-round ratios, the
checkpoints committed and skipped (from the metrics records). Not a timed test: a benchmark
(this machine has 2 cores shared with the HDFS JVMs).

    python ci/bench/ranks_training_hdfs.py --rounds 3   # added to ci/bench/results/ranks_training_hdfs.json
    python ci/bench/ranks_training_hdfs.py --rounds 3 --coordination store,storage   # both paths in the same paired rounds

``--coordination``: how the ranks of the job with checkpoints coordinate (``PADDLE_ACP_COORDINATION``;
``store``: ``PADDLE_MASTER`` on a new free port for each job, rank 0 hosting Paddle's TCP store). With
several, each round runs the job without checkpoints and one job per path, in rotating order, and each
path's ratio is reported (``ratio_<path>``; the first path's also as ``ratio``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))  # the test helpers: tests/support

import results_io  # noqa: E402
from support import e2e as eu  # noqa: E402
from support import servers  # noqa: E402
from support.coord import COORDINATIONS, coord_env  # noqa: E402
from support.launch import popen_ranks  # noqa: E402


def log(msg: str) -> None:
    print(f"[ranks_training_hdfs] {msg}", flush=True)


def run_job(work: str, tag: str, uri, env: dict, args, coordination: str = "storage") -> float:
    """Start the ranks (support/launch.py, as the tests start theirs); the job's training time (the slower
    rank's epoch loop)."""
    if uri is not None:
        env = {**env, **coord_env(coordination)}  # one store (port) per job, as a launcher gives one
    env = dict(env, PADDLE_ACP_LOG_LEVEL="WARNING")
    if uri is not None:
        env["PADDLE_ACP_BUSY_POLICY"] = args.policy
    timings = [os.path.join(work, f"timing-{tag}-{r}.json") for r in range(args.world)]
    procs = popen_ranks(os.path.join(work, f"out-{tag}"), args.world,
                        ["--kind", "dp", "--epochs", args.epochs, "--steps-per-epoch", 1, "--hidden", args.hidden,
                         "--sleep", args.sleep], uri, tag, env=env, barrier=os.path.join(work, f"barrier-{tag}"),
                        rank_args={r: ["--timing", t] for r, t in enumerate(timings)}, no_acp=uri is None,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"job {tag} failed (rc {p.returncode}): {out[-3000:]}")
    secs, opens = [], []
    for t in timings:
        with open(t) as f:
            rec = json.load(f)
        secs.append(rec["train_s"])
        opens.append(rec.get("open_s") or 0.0)
    OPEN_S[tag] = max(opens)
    return max(secs)


OPEN_S: dict = {}  # per job: the slower rank's range open (to its first epoch), inside its training time


def proc_cpu(pids) -> float:
    """CPU seconds (user + system) the live processes ``pids`` (and their waited-for children) have used."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        if pid is None:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / tick  # utime, stime, cutime, cstime
    return total


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def counts(uri: str, records: str = "") -> dict:
    from paddle_acp import tools
    from paddle_acp.storage import open_storage

    recs, _ = tools.read_metrics(open_storage(uri), eu.JOB_ID)
    if records:  # every metrics record of the job, for a closer look (one JSON list per job, appended)
        with open(records, "a") as f:
            f.write(json.dumps(recs) + "\n")
    r0 = [x for x in recs if x.get("trainer") == 0]
    return {"committed": sum(1 for x in r0 if x.get("committed") is True),
            "skipped": sum(1 for x in r0 if x["event"] == "skipped"),
            "abandoned": sum(1 for x in r0 if x.get("committed") is False),
            "waited_s": round(sum(x.get("waited_s", 0.0) for x in recs if x["event"] == "saved"), 3),
            "split": split(recs)}


def split(recs: list) -> dict:
    """Where the training threads were blocked, per rank (seconds, from the "saved" records): waiting for the
    previous checkpoint (``waited_s``) in the first block of due points (the plan takes every point until rank 0
    has measured a persist), in the later ones, and at the last epoch (the final save); and the rest of the
    stall (the snapshot copy, the hand-off, rank 0's decision and plan write); and the skipped points' stall."""
    out: dict = {}
    saved = [x for x in recs if x["event"] == "saved"]
    last = max((x.get("epoch", 0) for x in saved), default=0)
    for x in saved:
        d = out.setdefault(f"rank{x.get('trainer', 0)}", {"waited_first8": 0.0, "waited_later": 0.0,
                                                          "waited_final": 0.0, "copy_and_handoff": 0.0,
                                                          "saves": 0})
        w = x.get("waited_s", 0.0)
        key = "waited_final" if x.get("epoch") == last else "waited_first8" if x.get("epoch", 0) < 8 else "waited_later"
        d[key] += w
        d["copy_and_handoff"] += max(0.0, x.get("stall_s", 0.0) - w)
        d["saves"] += 1
    for r, d in out.items():  # each rank's persists (rank 0: to the global commit; the others: their part)
        ps = [x.get("persist_s", 0.0) for x in saved if f"rank{x.get('trainer', 0)}" == r]
        d["persist_first3"] = [round(v, 3) for v in ps[:3]]
        d["persist_median"] = statistics.median(ps) if ps else 0.0
    for x in recs:  # a skipped point's stall: deciding it (rank 0: and writing a changed plan)
        if x["event"] == "skipped" and f"rank{x.get('trainer', 0)}" in out:
            out[f"rank{x.get('trainer', 0)}"].setdefault("skipped_stall", 0.0)
            out[f"rank{x.get('trainer', 0)}"]["skipped_stall"] += x.get("stall_s", 0.0)
    return {r: {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()} for r, d in sorted(out.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--sleep", type=float, default=0.1, help="seconds of 'work' per epoch (default 0.1)")
    ap.add_argument("--hidden", type=int, default=20000, help="hidden width (20000: ~4 MB of state with Adam)")
    ap.add_argument("--policy", default="skip")
    results_io.add_args(ap, __file__)
    ap.add_argument("--libhdfs-opts", default=None,
                    help="the ranks' LIBHDFS_OPTS (default: unset, so paddle-acp's; '': the JVM's own defaults; "
                         "the tests' client uses %r)" % servers.CLIENT_JVM_OPTS)
    ap.add_argument("--records", default="", help="append each job's metrics records (a JSON list per line) to this file")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for the ranks of both jobs (e.g. PADDLE_ACP_CONNECT_EARLY=0)")
    ap.add_argument("--coordination", default="storage",
                    help="comma-separated paths of the job with checkpoints, each run in every round: "
                         f"{', '.join(COORDINATIONS)} (default storage)")
    ap.add_argument("--only", choices=("on", "off"), default=None,
                    help="run only the job with (on) or without (off) checkpoints (for profiling; no ratio)")
    args = ap.parse_args(argv)
    coords = [c.strip() for c in args.coordination.split(",") if c.strip()]
    if not coords or any(c not in COORDINATIONS for c in coords):
        ap.error(f"--coordination takes {', '.join(COORDINATIONS)}, comma-separated")
    work = tempfile.mkdtemp(prefix="acp-bench-agree-")
    results = {"world": args.world, "epochs": args.epochs, "sleep": args.sleep, "hidden": args.hidden,
               "policy": args.policy, "libhdfs_opts": args.libhdfs_opts, "env": args.env, "coordination": coords,
               "rounds": []}
    with servers.HDFSServer() as hdfs:
        env = hdfs.client_env()
        env.pop("LIBHDFS_OPTS")  # as most users run: paddle-acp's options for the ranks' libhdfs JVM
        if args.libhdfs_opts is not None:  # what a user sets in LIBHDFS_OPTS ("": the JVM's own defaults)
            env["LIBHDFS_OPTS"] = args.libhdfs_opts
        for kv in args.env:
            k, _, v = kv.partition("=")
            env[k] = v
        for r in range(args.rounds):
            row = {}
            jobs = ["off"] + [f"on_{c}" for c in coords]
            jobs = jobs[r % len(jobs):] + jobs[:r % len(jobs)]  # rotating order: no path always first
            for job in (k for k in jobs if args.only in (None, k.split("_")[0])):
                kind = job if job == "off" else "on" if job == f"on_{coords[0]}" else job
                uri = None if job == "off" else f"{hdfs.uri}/bench-agree/{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                c0, s0 = children_cpu(), proc_cpu([hdfs.namenode_pid, hdfs.datanode_pid])
                row[kind] = run_job(work, f"{kind}{r}", uri, env, args, job.partition("_")[2] or "storage")
                row[f"open_{kind}"] = round(OPEN_S[f"{kind}{r}"], 3)
                # where the 2 cores went: the ranks' processes (training, their saver threads and the
                # in-process libhdfs JVM) and the HDFS server JVMs, over the whole job (start-up included)
                row[f"cpu_{kind}"] = {"ranks_s": round(children_cpu() - c0, 2),
                                      "hdfs_servers_s": round(proc_cpu([hdfs.namenode_pid, hdfs.datanode_pid])
                                                              - s0, 2)}
                if uri is not None:
                    row.update({k if kind == "on" else f"{k}_{kind}": v for k, v in counts(uri, args.records).items()})
                    log(f"round {r}: blocked by saves {row['split' if kind == 'on' else f'split_{kind}']}")
                log(f"round {r} {kind}: {row[kind]:.2f} s (of it the range's open {row[f'open_{kind}']:.2f} s; job wall {time.perf_counter() - t0:.1f} s, "
                    f"CPU {row[f'cpu_{kind}']})")
            if args.only:
                continue
            row["ratio"] = row["on"] / row["off"]
            for c in coords:
                row[f"ratio_{c}"] = row["on" if c == coords[0] else f"on_{c}"] / row["off"]
                if c != coords[0]:
                    row[f"ratio_after_open_{c}"] = (row[f"on_{c}"] - row[f"open_on_{c}"]) / (row["off"] - row["open_off"])
            # the epoch loop after the range's open: the per-epoch cost, without the one-time start of the
            # HDFS client (libhdfs' JVM: ~2 s of CPU here), the job marker and the restore check
            row["ratio_after_open"] = (row["on"] - row["open_on"]) / (row["off"] - row["open_off"])
            results["rounds"].append(row)
    if args.only:
        return 0
    results["median_ratio"] = statistics.median(x["ratio"] for x in results["rounds"])
    results["median_ratio_after_open"] = statistics.median(x["ratio_after_open"] for x in results["rounds"])
    results["open_on_median_s"] = statistics.median(x["open_on"] for x in results["rounds"])
    results["off_median_s"] = statistics.median(x["off"] for x in results["rounds"])
    results["on_median_s"] = statistics.median(x["on"] for x in results["rounds"])
    for c in coords:
        results[f"median_ratio_{c}"] = statistics.median(x[f"ratio_{c}"] for x in results["rounds"])
        per_round = ", ".join("%.3f" % x[f"ratio_{c}"] for x in results["rounds"])
        log(f"the ranks coordinated through {c}: median ratio {results[f'median_ratio_{c}']:.3f} (rounds {per_round})")
    log(f"{args.world} ranks, {args.epochs} epochs of ~{args.sleep:g} s, checkpoint every epoch to HDFS "
        f"({args.policy}): {results['on_median_s']:.2f} s vs {results['off_median_s']:.2f} s without checkpoints, "
        f"median ratio {results['median_ratio']:.3f} (target <= 1.25); after the range's open (median "
        f"{results['open_on_median_s']:.2f} s: the HDFS client's start) {results['median_ratio_after_open']:.3f}")
    log(f"wrote {results_io.write(results, __file__, args.json, args.key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
