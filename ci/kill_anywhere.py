#!/usr/bin/env python
"""Kill-anywhere: SIGKILL the end-to-end training script at random moments.

Each trial starts ``tests/scripts/train_script.py`` with checkpointing on
(every epoch), waits until the process shows life (it has imported Paddle and
built its programs: its ``--ready-file`` exists), SIGKILLs its process group at
a moment drawn uniformly from then over the rest of an uninterrupted run's
duration (so kills land in restore, in training and inside saves), restarts
it, and repeats until a process completes.  After ``--max-restarts`` kills the
next process runs unkilled, so every trial ends.  Then the
final parameters and the per-epoch loss record must equal an uninterrupted
run's bit for bit; an epoch that was logged but whose checkpoint had not
committed is legitimately trained again, and must log the same values again.
No epoch may be skipped.

The reference is a run WITHOUT the library; an uninterrupted run WITH
checkpointing must match it too (and gives the duration).

    python ci/kill_anywhere.py --trials 20 --seed 1 --ir both
    python ci/kill_anywhere.py --trials 200 --ir pir --json /tmp/ka.json
    python ci/kill_anywhere.py --ranks 2 --trials 5 --ir pir   # N ranks, see below
    python ci/kill_anywhere.py --trials 5 --ir pir --hdfs       # checkpoints on a real HDFS, see below
    python ci/kill_anywhere.py --trials 5 --ir pir --s3 --local-cache --server-faults --sleep 0.05 --epochs 12

With ``--ranks N`` (N > 1) each trial runs N rank processes of
``tests/scripts/rank_train.py`` (a tensor-parallel-like job: same program
and parameter names on every rank, values and data seeded by the rank;
``--kind pp``: different programs per rank) in lockstep through a file
barrier, with ``PADDLE_ACP_RANK_STATE=per-rank``. At a moment drawn by
progress (during startup and restore, or inside a uniformly drawn epoch: the
machine's load makes clock times meaningless), one rank drawn at random is SIGKILLed,
and the others a moment later (as a launcher restarts the whole job); then
all are restarted. Every rank must end bit-identical to its own
uninterrupted run without the library, and in every restart all ranks that
got as far as their first epoch must have resumed from the same checkpoint.

With ``--hdfs`` (a Hadoop 2.7.3 server on 127.0.0.1, started here through
tests/support/servers.py) or ``--ckpt-uri hdfs://...|s3://...`` (a running server; its
client variables must be in this process's environment) the checkpoints go
to remote storage, where a persist takes longer than a tiny epoch: the default
busy policy then skips saves, and a restart resumes from an older epoch; the
result must still be bit-identical. Kills inside a save are counted on local
storage only. ``--s3`` does the same on a real S3 server (SeaweedFS), and all
of it works with ``--ranks N`` too (per-rank parts on the remote).

``--local-cache`` (remote storage) turns the node-local cache on
(``PADDLE_ACP_LOCAL_CACHE``: one directory per trial, kept across its restarts
and shared by its ranks, as on one node); restores from it are counted.
``--server-faults`` (with ``--hdfs`` or ``--s3``) also SIGKILLs the storage
server at a random moment of each restart round (HDFS: the NameNode, the
DataNode or both; S3: the ``weed`` process) and restarts it after up to
``--max-down`` seconds on the same ports and data (tests/support/storage_faults.py).
A process that then stops with a clear error (exit status 1, a
CheckpointError/StorageError naming its cause) is restarted, as a launcher
would, and counts as an interruption; the round after ``--max-restarts``
interruptions starts only once the server is up again and runs unkilled, with
the server left up. With the cache or server faults the harness also lists
the checkpoints between two rounds (``paddle-acp ls``): a restarted process
must resume from the newest checkpoint seen committed, or a newer one (an
older one or scratch is a silent wrong resume), and at the end every
checkpoint seen committed must still verify (``ls --verify``) unless
retention removed it (``max_to_keep`` newer committed ones remain).

Prints ``N/N trials resumed bit-identically``; exits 1 on any failed trial
(a correctness failure: a difference, a skipped epoch, a wrong resume, a lost
committed checkpoint, a process that failed without a clear error), 2 when
the reference runs fail, 3 when a trial had a liveness problem only (a
process that showed no life within ``--life-timeout`` seconds, an unkilled
one that did not finish within ``--timeout``, a storage server that did not
come back: the machine was too slow or a process hung, which says nothing
about the checkpoints), 4 when a trial ended with a clear error (without
``--server-faults``; with them a clear error is an accepted outcome, reported
apart, exit 0).  A failed trial's directory is kept (and printed); trial t of
IR ir draws its kill times from ``random.Random("<seed>:<ir>:<t>")`` (server
faults from ``"<seed>:<ir>:<t>:faults"``), so it can be replayed as far as the
machine's timing allows.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the test helpers: tests/support

from support import e2e as eu  # noqa: E402
from support import storage_faults as sf  # noqa: E402
from support.coord import COORDINATIONS, coord_env  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="SIGKILL the training script at "
                                "random moments and check bit-identical resume")
    p.add_argument("--trials", type=int, default=20, help="trials per IR")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ir", choices=["pir", "legacy", "both"], default="both")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--steps-per-epoch", type=int, default=1)
    p.add_argument("--sleep", type=float, default=0.0,
                   help="sleep per training step in the script (spreads the "
                        "run's time; keep it small)")
    p.add_argument("--hidden", type=int, default=32,
                   help="hidden width of the model (larger: longer saves, "
                        "so more kills land inside one)")
    p.add_argument("--ranges", type=int, choices=[1, 2], default=1)
    p.add_argument("--programs", type=int, choices=[1, 2], default=1)
    p.add_argument("--uri-root", default=None,
                   help="work directory for outputs and checkpoints "
                        "(default: a fresh temporary directory)")
    p.add_argument("--kill-window", choices=["training", "process"],
                   default="training",
                   help="training: kill times uniform over the run after "
                        "the process showed life (Paddle imported, programs "
                        "built); process: over the whole process life")
    p.add_argument("--max-restarts", type=int, default=20,
                   help="kills per trial; after this many, the next process "
                        "runs unkilled to its end (every trial ends)")
    p.add_argument("--round-timeout", type=float, default=None,
                   help="N ranks: seconds one restart round of a trial may take "
                        "(default: --timeout); past it the trial is a liveness problem")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds one process may run before it counts as hung")
    p.add_argument("--life-timeout", type=float, default=0,
                   help="seconds a process may take to show life before that "
                        "is a liveness problem (0: max(120, 20x the "
                        "reference's startup))")
    p.add_argument("--ckpt-uri", default=None,
                   help="remote checkpoint base URI (hdfs://, s3://); each run "
                        "gets its own directory under it")
    p.add_argument("--hdfs", action="store_true",
                   help="start a real HDFS server (tests/support/servers.py) and "
                        "checkpoint to it")
    p.add_argument("--s3", action="store_true",
                   help="start a real S3 server (SeaweedFS, tests/support/servers.py) and checkpoint to it")
    p.add_argument("--server-faults", action="store_true",
                   help="with --hdfs/--s3: also SIGKILL the storage server at a random moment "
                        "of a restart round and restart it on the same ports and data "
                        "(tests/support/storage_faults.py)")
    p.add_argument("--max-down", type=float, default=2.0,
                   help="--server-faults: the server stays down uniform(0, this) seconds")
    p.add_argument("--local-cache", action="store_true",
                   help="remote storage: PADDLE_ACP_LOCAL_CACHE on (one directory per trial, "
                        "kept across its restarts, shared by its ranks)")
    p.add_argument("--busy-policy", default=None,
                   help="PADDLE_ACP_BUSY_POLICY for the training processes "
                        "(default: the library's, auto)")
    p.add_argument("--host-memory", default=None,
                   help="PADDLE_ACP_HOST_MEMORY for the training processes (with a state larger than it, "
                        "saves stream in chunks and kills land inside streamed saves)")
    p.add_argument("--json", default=None, help="write a JSON report here")
    p.add_argument("--ranks", type=int, default=1,
                   help="ranks per job (> 1: the multi-rank harness)")
    p.add_argument("--kind", choices=["tp", "pp", "dp"], default="tp",
                   help="multi-rank: tp (same names, other values per "
                        "rank), pp (other programs per rank) or dp (data "
                        "parallel: replicated state, its writes spread over "
                        "the ranks unless PADDLE_ACP_REPLICATED_WRITERS=one)")
    p.add_argument("--save-every-steps", type=int, default=None,
                   help="multi-rank: also checkpoint every this many steps")
    p.add_argument("--coordination", choices=COORDINATIONS, default="storage",
                   help="multi-rank: how the ranks coordinate (store: PADDLE_MASTER on a "
                        "new free port at every start, rank 0 hosting Paddle's TCP store)")
    p.add_argument("--keep", action="store_true",
                   help="keep every trial's directory, not only failed ones")
    return p.parse_args(argv)


def script_args(a):
    return ["--epochs", a.epochs, "--steps-per-epoch", a.steps_per_epoch,
            "--sleep", a.sleep, "--hidden", a.hidden, "--ranges", a.ranges,
            "--programs", a.programs, "--interval", 0]


def ckpt_location(a, local_dir, name):
    """Where a run checkpoints: ``local_dir``, or a directory named ``name``
    under the remote base URI."""
    if a.ckpt_uri:
        return "%s/%s" % (a.ckpt_uri.rstrip("/"), name)
    return local_dir


def local_tree(ckpt):
    """Entries of a local checkpoint tree ([] for remote storage)."""
    return [] if "://" in str(ckpt) else eu.tree_files(ckpt)


def start(out, ckpt, ir, a, log_prefix, extra_env=None):
    """Start one process of the script in its own process group; it creates
    ``log_prefix + ".ready"`` once it shows life."""
    fo = open(log_prefix + ".stdout", "w")
    fe = open(log_prefix + ".stderr", "w")
    env = dict(extra_env or {})
    if a.busy_policy:
        env["PADDLE_ACP_BUSY_POLICY"] = a.busy_policy
    if a.host_memory:
        env["PADDLE_ACP_HOST_MEMORY"] = a.host_memory
    try:
        p = subprocess.Popen(eu.script_cmd(out, ckpt, *script_args(a),
                                           "--ready-file",
                                           log_prefix + ".ready"),
                             env=eu.script_env(ckpt, ir, env), cwd=eu.REPO,
                             stdout=fo, stderr=fe, start_new_session=True)
    finally:
        fo.close()
        fe.close()
    return p


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def tail(path, n=3000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def wait_for_life(p, prefix, limit):
    """Seconds until the process showed life (its ready file exists); None
    when it exited first or showed none within ``limit`` seconds."""
    t0 = time.monotonic()
    ready = prefix + ".ready"
    while True:
        if os.path.exists(ready):
            return time.monotonic() - t0
        if p.poll() is not None or time.monotonic() - t0 > limit:
            return None
        time.sleep(0.003)


def timed_run(out, ckpt, ir, a, prefix, extra_env=None):
    """Run the script to its end, noting when each epoch line appears.
    Returns (returncode, total seconds, [seconds of each line], seconds
    until it showed life)."""
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "losses.jsonl")
    t0 = time.monotonic()
    p = start(out, ckpt, ir, a, prefix, extra_env)
    line_times, seen, ready_s = [], 0, None
    while True:
        if ready_s is None and os.path.exists(prefix + ".ready"):
            ready_s = time.monotonic() - t0
        done = p.poll() is not None
        if os.path.exists(log):
            with open(log) as f:
                n = f.read().count("\n")
            while seen < n:
                line_times.append(time.monotonic() - t0)
                seen += 1
        if done:
            break
        if time.monotonic() - t0 > a.timeout:
            kill_group(p)
            raise RuntimeError("reference run hung (more than %s s)"
                               % a.timeout)
        time.sleep(0.003)
    total = time.monotonic() - t0
    return p.returncode, total, line_times, total if ready_s is None else ready_s


def reference_runs(ir, a, root):
    """(reference result, timing model) or raises RuntimeError.

    The reference is an uninterrupted run without the library; an
    uninterrupted run with checkpointing must equal it, and gives the run's
    duration.  Startup (interpreter, import paddle, building the programs)
    is estimated from both runs: the time before the first epoch began.
    """
    n_keys = len(eu.all_keys(a.epochs, a.ranges))
    runs = {}
    for kind, ckpt in (("pure", None), ("acp", "ckpt")):
        d = os.path.join(root, "ref-%s-%s" % (ir, kind))
        out = os.path.join(d, "out")
        loc = ckpt and ckpt_location(a, os.path.join(d, ckpt),
                                     "ref-%s-%s-%s" % (ir, kind, os.getpid()))
        cache = {"PADDLE_ACP_LOCAL_CACHE": os.path.join(d, "cache")} if ckpt and a.local_cache else {}
        rc, total, lines, ready_s = timed_run(out, loc, ir, a, os.path.join(d, "proc"), cache)
        if rc != 0 or not eu.is_done(out):
            raise RuntimeError("uninterrupted run %s the library failed (rc "
                               "%s):\n%s" % ("without" if ckpt is None else
                                             "with", rc,
                                             tail(os.path.join(d, "proc.stderr"))))
        runs[kind] = (out, total, lines, ready_s)
    ref = eu.load_result(runs["pure"][0])
    diffs = eu.compare_results(eu.load_result(runs["acp"][0]), ref)
    if diffs:
        raise RuntimeError("an uninterrupted run with checkpointing differs "
                           "from the run without it:\n  " + "\n  ".join(diffs))
    _, total, lines, ready_s = runs["acp"]
    if len(lines) >= 2:
        per_epoch = (lines[-1] - lines[0]) / (len(lines) - 1)
    else:
        per_epoch = total / (n_keys + 1)
    startup = min(max(0.0, r[2][0] - per_epoch) if r[2] else total / 2
                  for r in runs.values())
    return ref, {"total_s": total, "startup_s": startup, "ready_s": ready_s,
                 "per_epoch_s": per_epoch, "epochs_total": n_keys}


def kill_window(model, window):
    """(lo, hi): kill times are drawn uniformly from it.

    --kill-window training (the default): seconds after the process showed
    life (Paddle imported, programs built; on a busy machine that alone can
    take longer than a whole reference run, which is why the clock starts
    there), up to the rest of an uninterrupted run plus 10%: kills spread
    over restore, training and saves, and a restarted process (fewer epochs
    left) is killed at a uniform moment or, with a probability that grows as
    the run nears its end, completes.  --kill-window process: seconds after
    the start, over the whole run plus 10% (most kills land in `import
    paddle`).
    """
    if window == "process":
        return 0.0, max(model["total_s"] * 1.1, 0.05)
    return 0.0, max((model["total_s"] - model["ready_s"]) * 1.1, 0.05)


def life_timeout(model, a):
    return a.life_timeout if a.life_timeout > 0 else max(120.0, 20 * model["ready_s"])


def outcome(rec):
    """failed (a correctness problem) > liveness > clear_error (the trial ended with a process
    that stopped with a CheckpointError/StorageError naming its cause) > ok."""
    return ("failed" if rec["problems"] else "liveness" if rec["liveness"] else
            "clear_error" if rec.get("ended_with_clear_error") else "ok")


def resume_problems(new_entries, bound, who):
    """A process must resume from the newest checkpoint the harness saw committed before it
    started (``bound``: (name, entry) or None), or a newer one: its first epoch line comes after
    that checkpoint's epoch. Beginning earlier (from an older checkpoint, or from scratch) is a
    silent wrong resume."""
    if bound is None or not new_entries or bound[1]["step"] is not None:
        return []
    name, e = bound
    first = new_entries[0]["epoch"]
    if first > e["epoch"]:
        return []
    return ["%s began at epoch %d, although checkpoint %s (after epoch %d) was committed before it "
            "started: a silent wrong resume" % (who, first, name, e["epoch"])]


STATUS = {"ok": "ok", "failed": "FAILED", "liveness": "LIVENESS PROBLEM (not a checkpoint failure)",
          "clear_error": "CLEAR ERROR (a process stopped with an error naming its cause)"}


def storage_summary(rec):
    """', N server fault(s) (parts), M clear error(s), K cache restore(s), C committed seen'
    for a trial on remote storage with faults or the cache; '' otherwise."""
    if "cache_restores" not in rec or ("committed_seen" not in rec and not rec["server_faults"]):
        return ""
    return ", %d server fault(s) %s, %d clear error(s), %d restore(s) from the cache (%d from the remote), " \
        "%s committed seen" % (len(rec["server_faults"]), [f["part"] for f in rec["server_faults"]],
                               len(rec["clear_errors"]), rec["cache_restores"], len(rec["remote_restores"]),
                               rec.get("committed_seen", "-"))


def clear_error_exit(a, n):
    """Exit status when the worst outcome is a clear error: with --server-faults the storage
    itself failed, and a clear error is an accepted outcome (0); otherwise 4."""
    return 0 if not n or a.server_faults else 4


def print_clear_errors(a, n):
    if n:
        print("CLEAR ERRORS: %d trial(s) ended with a process that stopped with a CheckpointError/"
              "StorageError naming its cause (%s)" % (n, "accepted with --server-faults" if a.server_faults
                                                       else "exit status 4"), flush=True)


def run_trial(ir, t, a, root, ref, model):
    rng = random.Random("%d:%s:%d" % (a.seed, ir, t))
    tdir = os.path.join(root, "%s-trial-%03d" % (ir, t))
    out = os.path.join(tdir, "out")
    ckpt = ckpt_location(a, os.path.join(tdir, "ckpt"),
                         "%s-trial-%03d-%d" % (ir, t, os.getpid()))
    os.makedirs(out)
    rec = {"ir": ir, "trial": t, "ok": False, "outcome": None, "kills": 0,
           "kills_inside_save": 0, "kills_before_first_epoch": 0,
           "kills_in_training": 0, "kills_after_done": 0, "processes": 0,
           "kill_delays": [], "unkilled_runs": 0,
           "rewinds": [], "problems": [], "liveness": [], "clear_errors": [], "dir": tdir}
    ts = sf.TrialStorage(a, getattr(a, "faults", None), ckpt, tdir,
                         random.Random("%d:%s:%d:faults" % (a.seed, ir, t)))
    t_start = time.monotonic()
    while True:
        entries = eu.read_log(out)
        delay = rng.uniform(*kill_window(model, a.kill_window))
        tmps_before = {n for n in local_tree(ckpt) if ".tmp" in n}
        i = rec["processes"]
        prefix = os.path.join(tdir, "proc-%02d" % i)
        # progress is guaranteed: after --max-restarts interruptions a process runs unkilled
        unkilled = rec["kills"] + len(rec["clear_errors"]) >= a.max_restarts
        err = ts.before_round(unkilled)  # the server is up before an unkilled process starts
        if err:
            rec["liveness"].append(err)
            break
        bound = ts.newest()
        rec["processes"] += 1
        p = start(out, ckpt, ir, a, prefix, ts.env())
        lines_before = len(entries)
        if a.kill_window == "training" or unkilled:
            limit = life_timeout(model, a)
            if wait_for_life(p, prefix, limit) is None and p.poll() is None:
                kill_group(p)
                rec["liveness"].append(
                    "process %d showed no life (Paddle imported, programs "
                    "built) within %.0f s: the machine is too slow or the "
                    "process hangs; this says nothing about the checkpoints"
                    ":\n%s" % (i, limit, tail(prefix + ".stderr", 1500)))
                break
        ts.arm(delay, unkilled)  # a server fault before this process's kill: in restore, training or a save
        try:
            if unkilled:
                rec["unkilled_runs"] += 1
                p.wait(timeout=a.timeout)
            else:
                p.wait(timeout=delay)
            killed = False
        except subprocess.TimeoutExpired:
            kill_group(p)
            if unkilled:
                rec["liveness"].append(
                    "process %d, left unkilled after %d kills, did not finish "
                    "within --timeout %.0f s:\n%s" % (i, rec["kills"], a.timeout,
                                                      tail(prefix + ".stderr", 1500)))
                break
            killed = p.returncode == -signal.SIGKILL
        ts.after_round([prefix + ".stderr"])
        if a.ranges == 1:
            rec["problems"] += resume_problems(eu.read_log(out)[lines_before:], bound, "process %d" % i)
        if not killed and p.returncode != 0:
            ce = sf.clear_error(p.returncode, tail(prefix + ".stderr", 200000))
            if ce:  # a clear error: the storage server was killed, or the trial ends with it
                rec["clear_errors"].append("process %d: %s" % (i, ce))
                if ts.faults is not None and not unkilled and not rec["problems"]:
                    continue
                rec["ended_with_clear_error"] = True
                break
        if rec["problems"]:
            break
        if not killed:
            # Ran to its end before the kill time: it must have completed.
            if p.returncode != 0 or not eu.is_done(out):
                rec["problems"].append(
                    "process %d exited with %s without being killed "
                    "(done=%s):\n%s" % (i, p.returncode, eu.is_done(out),
                                        tail(prefix + ".stderr")))
            break
        rec["kills"] += 1
        rec["kill_delays"].append(round(delay, 4))
        # Inside a save: a temporary entry of the checkpoint tree that was
        # not there before this process started (leftovers of earlier kills
        # do not count).
        tmps = {n for n in local_tree(ckpt) if ".tmp" in n}
        if tmps - tmps_before:
            rec["kills_inside_save"] += 1
        # Where the kill landed: before this process logged an epoch
        # (startup, restore, the first epoch), after it logged one, or
        # after the script's last line (final.npz and `done` written).
        if eu.is_done(out):
            rec["kills_after_done"] += 1
            os.remove(os.path.join(out, "done"))
        elif len(eu.read_log(out)) == lines_before:
            rec["kills_before_first_epoch"] += 1
        else:
            rec["kills_in_training"] += 1
    problems, liveness = ts.finish()  # the server is back; nothing committed lost
    rec["problems"] += problems
    rec["liveness"] += liveness
    rec.update(ts.record())
    rec["seconds"] = round(time.monotonic() - t_start, 3)
    if not rec["problems"] and not rec["liveness"] and eu.is_done(out):
        entries = eu.read_log(out)
        problems, rewinds = eu.check_restart_log(entries, a.epochs, a.ranges)
        rec["rewinds"] = rewinds
        rec["problems"] += problems
        try:
            rec["problems"] += eu.compare_results(eu.load_result(out), ref)
        except (OSError, ValueError) as e:
            rec["problems"].append("cannot load the result: %r" % (e,))
    rec["outcome"] = outcome(rec)
    rec["ok"] = rec["outcome"] == "ok"
    if rec["ok"] and not a.keep:
        shutil.rmtree(tdir, ignore_errors=True)
        rec["dir"] = None
    return rec


RANK_SCRIPT = os.path.join(eu.REPO, "tests", "scripts", "rank_train.py")


def rank_env(a, ir, rank, ckpt, gen, extra_env=None):
    env = dict(extra_env or {})
    env.update({"PADDLE_TRAINER_ID": rank, "PADDLE_TRAINERS_NUM": a.ranks,
                "ACP_TEST_GEN": gen})
    if ckpt is not None:
        env.update(PADDLE_ACP_RANK_STATE="replicated" if a.kind == "dp" else "per-rank",
                   PADDLE_ACP_PART_TIMEOUT=60)
    if a.host_memory:
        env["PADDLE_ACP_HOST_MEMORY"] = a.host_memory
    return eu.script_env(ckpt, ir, env)


def rank_cmd(a, out, barrier, no_acp=False):
    cmd = [sys.executable, RANK_SCRIPT, "--out", out, "--kind", a.kind,
           "--epochs", str(a.epochs), "--steps-per-epoch",
           str(a.steps_per_epoch), "--hidden", str(a.hidden)]
    if a.save_every_steps:
        cmd += ["--save-every-steps", str(a.save_every_steps)]
    if barrier:
        cmd += ["--barrier", barrier]
    if no_acp:
        cmd.append("--no-acp")
    return cmd


def start_ranks(a, ir, d, ckpt, gen, prefix, no_acp=False, extra_env=None):
    os.makedirs(d, exist_ok=True)
    procs = []
    if ckpt is not None and a.ranks > 1:  # one store per start of the job, as a launcher gives one
        extra_env = {**coord_env(a.coordination), **(extra_env or {})}
    for r in range(a.ranks):
        fo = open("%s.r%d.stdout" % (prefix, r), "w")
        fe = open("%s.r%d.stderr" % (prefix, r), "w")
        try:
            procs.append(subprocess.Popen(
                rank_cmd(a, os.path.join(d, "out", "r%d" % r),
                         None if no_acp else os.path.join(d, "barrier"),
                         no_acp),
                env=rank_env(a, ir, r, ckpt, gen, extra_env), cwd=eu.REPO, stdout=fo,
                stderr=fe, start_new_session=True))
        finally:
            fo.close()
            fe.close()
    return procs


def rank_events(out):
    path = os.path.join(out, "events.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f.read().splitlines() if x.strip()
                and x.endswith("}")]


def multi_reference(ir, a, root):
    """Per rank: (reference result of an uninterrupted run without the
    library); and the duration of an uninterrupted job with it."""
    d = os.path.join(root, "ref-%s-pure" % ir)
    for p in start_ranks(a, ir, d, None, "ref", os.path.join(d, "proc"),
                         no_acp=True):
        p.wait(a.timeout)
    refs = []
    for r in range(a.ranks):
        out = os.path.join(d, "out", "r%d" % r)
        if not eu.is_done(out):
            raise RuntimeError("reference rank %d failed:\n%s" % (
                r, tail(os.path.join(d, "proc.r%d.stderr" % r))))
        refs.append(eu.load_result(out))
    d = os.path.join(root, "ref-%s-acp" % ir)
    t0 = time.monotonic()
    cache = {"PADDLE_ACP_LOCAL_CACHE": os.path.join(d, "cache")} if a.local_cache else {}
    procs = start_ranks(a, ir, d, ckpt_location(a, os.path.join(d, "ckpt"), "ref-%s-acp-%d" % (ir, os.getpid())),
                        "ref", os.path.join(d, "proc"), extra_env=cache)
    first_line = None
    log0 = os.path.join(d, "out", "r0", "losses.jsonl")
    while any(p.poll() is None for p in procs):
        if first_line is None and os.path.exists(log0):
            first_line = time.monotonic() - t0
        if time.monotonic() - t0 > a.timeout:
            for p in procs:
                kill_group(p)
            raise RuntimeError("the uninterrupted job hung")
        time.sleep(0.003)
    total = time.monotonic() - t0
    per_epoch = (total - (first_line or total)) / max(1, a.epochs - 1)
    startup = max(0.0, (first_line or 0) - per_epoch)
    for r in range(a.ranks):
        out = os.path.join(d, "out", "r%d" % r)
        if not eu.is_done(out):
            raise RuntimeError("uninterrupted job with the library: rank %d "
                               "failed:\n%s" % (r, tail(os.path.join(
                                   d, "proc.r%d.stderr" % r))))
        diffs = eu.compare_results(eu.load_result(out), refs[r])
        if diffs:
            raise RuntimeError("uninterrupted job, rank %d differs from its "
                               "run without the library:\n  %s"
                               % (r, "\n  ".join(diffs)))
    if a.ranks > 1 and a.kind != "dp" and not eu.compare_results(refs[0], refs[1]):
        raise RuntimeError("ranks 0 and 1 hold the same state: the harness "
                           "would not tell their checkpoints apart")
    return refs, {"total_s": total, "startup_s": startup,
                  "per_epoch_s": max(per_epoch, 0.01)}


def multi_trial(ir, t, a, root, refs, model):
    rng = random.Random("%d:%s:%d:ranks%d" % (a.seed, ir, t, a.ranks))
    tdir = os.path.join(root, "%s-trial-%03d" % (ir, t))
    ckpt = ckpt_location(a, os.path.join(tdir, "ckpt"), "%s-trial-%03d-r%d-%d" % (ir, t, a.ranks, os.getpid()))
    outs = [os.path.join(tdir, "out", "r%d" % r) for r in range(a.ranks)]
    rec = {"ir": ir, "trial": t, "ok": False, "kills": 0,
           "kills_inside_save": 0, "processes": 0, "resumed_from": [],
           "problems": [], "liveness": [], "clear_errors": [], "unkilled_runs": 0, "dir": tdir,
           "rewinds": []}
    ts = sf.TrialStorage(a, getattr(a, "faults", None), ckpt, tdir,
                         random.Random("%d:%s:%d:ranks%d:faults" % (a.seed, ir, t, a.ranks)))
    t_start = time.monotonic()
    rnd = 0
    while True:
        gen = "t%d-%d" % (t, rnd)
        # When to kill, in terms of the job's progress rather than of the clock
        # (this machine's load, and so a process's startup, varies by a factor
        # of several): with probability 0.15 during startup and restore (a
        # uniform moment of the reference run's startup), else a uniform moment
        # inside epoch k of this round, k uniform over the job's epochs: a
        # round that has fewer epochs left than k completes, which ends the trial.
        in_startup = rng.random() < 0.15
        target = rng.randrange(a.epochs)
        sub = rng.uniform(0.0, model["per_epoch_s"])
        victim = rng.randrange(a.ranks)
        lines0 = len(eu.read_log(outs[0]))
        tmps_before = {n for n in local_tree(ckpt) if ".tmp" in n}
        # progress is guaranteed: after --max-restarts interruptions the round runs unkilled
        unkilled = rec["kills"] + len(rec["clear_errors"]) >= a.max_restarts
        err = ts.before_round(unkilled)  # the server is up before an unkilled round starts
        if err:
            rec["liveness"].append(err)
            break
        bound = ts.newest()
        procs = start_ranks(a, ir, tdir, ckpt, gen,
                            os.path.join(tdir, "proc-%02d" % rnd), extra_env=ts.env())
        rec["processes"] += len(procs)
        t0 = time.monotonic()
        rec["unkilled_runs"] += unkilled
        fire = t0 + rng.uniform(0.0, model["startup_s"]) if in_startup and not unkilled else None
        # a server fault before the round's kill (about when it comes: the clock is only a guess here)
        ts.arm(fire - t0 if fire is not None else model["startup_s"] + target * model["per_epoch_s"] + sub,
               unkilled)
        hung = False
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break  # a rank failed: the launcher stops the job
            now = time.monotonic()
            if fire is None and not unkilled and len(eu.read_log(outs[0])) >= lines0 + target:
                fire = now + sub
            if fire is not None and now >= fire:
                break
            if now - t0 > (a.round_timeout or a.timeout):
                hung = True
                break
            time.sleep(0.005)
        if hung:
            for p in procs:
                kill_group(p)
            rec["liveness"].append(
                "round %d (%s) did not finish within --timeout %s s: the machine is too "
                "slow or a rank hangs; this says nothing about the checkpoints"
                % (rnd, "unkilled" if unkilled else "to be killed", a.round_timeout or a.timeout))
            break
        killed = False
        clear = []
        for r, p in enumerate(procs):
            if p.poll() is not None and p.returncode != 0:
                err_path = os.path.join(tdir, "proc-%02d.r%d.stderr" % (rnd, r))
                ce = sf.clear_error(p.returncode, tail(err_path, 200000))
                if ce:
                    clear.append("round %d, rank %d: %s" % (rnd, r, ce))
                else:
                    rec["problems"].append("rank %d exited with %s before the kill:\n%s"
                                           % (r, p.returncode, tail(err_path)))
        if clear:
            for p in procs:
                kill_group(p)
        elif any(p.poll() is None for p in procs):
            killed = True
            kill_group(procs[victim])
            time.sleep(rng.uniform(0.0, 0.3))
            for p in procs:
                kill_group(p)
        else:
            for r, p in enumerate(procs):
                if p.returncode != 0 or not eu.is_done(outs[r]):
                    rec["problems"].append(
                        "rank %d exited with %s unkilled:\n%s" % (
                            r, p.returncode, tail(os.path.join(
                                tdir, "proc-%02d.r%d.stderr" % (rnd, r)))))
        starts = {}
        for r in range(a.ranks):
            for e in rank_events(outs[r]):
                if e.get("gen") == gen:
                    starts[r] = e["restored"]
        rec["resumed_from"].append(starts)
        if len(set(map(str, starts.values()))) > 1:
            rec["problems"].append("restart %d: ranks resumed from different "
                                   "checkpoints: %s" % (rnd, starts))
        rec["problems"] += multi_resume_problems(starts, bound, ts, rnd)
        ts.after_round([os.path.join(tdir, "proc-%02d.r%d.stderr" % (rnd, r)) for r in range(a.ranks)])
        rnd += 1
        if clear:
            rec["clear_errors"] += clear
            if ts.faults is not None and not unkilled and not rec["problems"]:
                for out in outs:
                    if eu.is_done(out):
                        os.remove(os.path.join(out, "done"))
                continue
            rec["ended_with_clear_error"] = True
            break
        if not killed or rec["problems"]:
            break
        rec["kills"] += 1
        if {n for n in local_tree(ckpt) if ".tmp" in n} - tmps_before:
            rec["kills_inside_save"] += 1
        for out in outs:
            if eu.is_done(out):
                os.remove(os.path.join(out, "done"))
    problems, liveness = ts.finish()  # the server is back; nothing committed lost
    rec["problems"] += problems
    rec["liveness"] += liveness
    rec.update(ts.record())
    rec["seconds"] = round(time.monotonic() - t_start, 3)
    if not rec["problems"] and not rec["liveness"] and not rec.get("ended_with_clear_error"):
        for r in range(a.ranks):
            problems, rewinds = eu.check_restart_log(eu.read_log(outs[r]),
                                                     a.epochs)
            rec["rewinds"] += rewinds
            rec["problems"] += ["rank %d: %s" % (r, x) for x in problems]
            try:
                rec["problems"] += ["rank %d: %s" % (r, x) for x in
                                    eu.compare_results(eu.load_result(outs[r]),
                                                       refs[r])]
            except (OSError, ValueError) as e:
                rec["problems"].append("rank %d: cannot load the result: %r"
                                       % (r, e))
    rec["outcome"] = outcome(rec)
    rec["ok"] = rec["outcome"] == "ok"
    if rec["ok"] and not a.keep:
        shutil.rmtree(tdir, ignore_errors=True)
        rec["dir"] = None
    return rec


def multi_resume_problems(starts, bound, ts, rnd):
    """Every rank that began training must have restored the newest checkpoint the harness saw
    committed before the round (``bound``) or a newer one; none may start from scratch then."""
    if bound is None:
        return []
    seen = {name: e for (_, _, name), e in ts.log.seen.items()}
    problems = []
    for r, restored in sorted(starts.items()):
        e = seen.get(restored) if isinstance(restored, str) else None
        if restored is None or (e is not None and e["number"] < bound[1]["number"]):
            problems.append("restart %d: rank %d resumed from %s, although checkpoint %s was committed before "
                            "the round started: a silent wrong resume" % (rnd, r, restored or "scratch", bound[0]))
    return problems


def main_multi(a, irs, root, own_root):
    report = {"seed": a.seed, "ranks": a.ranks, "kind": a.kind,
              "trials_per_ir": a.trials, "root": root, "irs": {},
              "storage": a.ckpt_uri or "local", "server_faults": a.server_faults,
              "local_cache": a.local_cache, "trials": []}
    total_ok = total = total_liveness = total_clear = 0
    exit_code = 0
    for ir in irs:
        print("[%s] %d-rank reference runs ..." % (ir, a.ranks), flush=True)
        try:
            refs, model = multi_reference(ir, a, root)
        except RuntimeError as e:
            print("[%s] REFERENCE FAILED: %s" % (ir, e), flush=True)
            report["irs"][ir] = {"reference_error": str(e)}
            exit_code = 2
            continue
        print("[%s] uninterrupted %d-rank job %.2f s (startup %.2f s, %.3f s "
              "per epoch)" % (ir, a.ranks, model["total_s"],
                              model["startup_s"], model["per_epoch_s"]),
              flush=True)
        ok = kills = inside = liveness = failed = clear = 0
        for t in range(a.trials):
            rec = multi_trial(ir, t, a, root, refs, model)
            report["trials"].append(rec)
            ok += rec["ok"]
            liveness += rec["outcome"] == "liveness"
            clear += rec["outcome"] == "clear_error"
            failed += rec["outcome"] == "failed"
            kills += rec["kills"]
            inside += rec["kills_inside_save"]
            print("[%s] trial %d/%d: %s, %d kill(s) (%d inside a save), "
                  "resumed from %s, rewinds %s, %.1f s%s"
                  % (ir, t + 1, a.trials, STATUS[rec["outcome"]],
                     rec["kills"], rec["kills_inside_save"],
                     [sorted(set(map(str, s.values())))
                      for s in rec["resumed_from"]],
                     rec["rewinds"], rec["seconds"], storage_summary(rec)), flush=True)
            if not rec["ok"]:
                for prob in rec["problems"] + rec["liveness"] + rec["clear_errors"][-1:]:
                    print("    " + prob.replace("\n", "\n    "), flush=True)
                print("    trial dir kept: %s" % rec["dir"], flush=True)
        report["irs"][ir] = {"trials": a.trials, "ok": ok, "failed": failed,
                             "liveness_problems": liveness, "clear_errors": clear, "kills": kills,
                             "kills_inside_save": inside,
                             "reference": model}
        print("[%s] %d/%d %d-rank trials resumed bit-identically on every "
              "rank (%d kills, %d inside a save)" % (ir, ok, a.trials,
                                                     a.ranks, kills, inside),
              flush=True)
        total_ok += ok
        total += a.trials
        total_liveness += liveness
        total_clear += clear
        if failed:
            exit_code = 1
    # a correctness failure outranks everything; a liveness problem is its own outcome (3)
    if exit_code == 0:
        exit_code = 3 if total_liveness else clear_error_exit(a, total_clear)
    report.update(ok=total_ok, total=total, liveness_problems=total_liveness,
                  clear_errors=total_clear, exit_code=exit_code)
    print("%d/%d trials resumed bit-identically" % (total_ok, total),
          flush=True)
    print_clear_errors(a, total_clear)
    if total_liveness:
        print("LIVENESS: %d trial(s) did not complete for lack of progress "
              "(exit status 3); the checkpoints were not at fault"
              % total_liveness, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if exit_code == 0 and own_root and not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    elif exit_code != 0:
        print("work directory kept: %s" % root, flush=True)
    return exit_code


def main(argv=None):
    a = parse_args(argv)
    if sum(map(bool, (a.hdfs, a.s3, a.ckpt_uri))) > 1:
        print("--hdfs, --s3 and --ckpt-uri exclude each other", flush=True)
        return 2
    if a.server_faults and not (a.hdfs or a.s3):
        print("--server-faults needs a server started here: --hdfs or --s3", flush=True)
        return 2
    if a.local_cache and not (a.hdfs or a.s3 or a.ckpt_uri):
        print("--local-cache needs remote storage: --hdfs, --s3 or --ckpt-uri", flush=True)
        return 2
    if a.hdfs or a.s3:
        from support import servers

        srv = servers.HDFSServer() if a.hdfs else servers.S3Server()
        try:
            srv.start()
        except servers.ServerStartError as exc:  # the machine, not the checkpoints: a liveness problem
            print("%s server did not start (LIVENESS PROBLEM, not a checkpoint failure): %s"
                  % (srv.kind.upper(), str(exc).splitlines()[0]), flush=True)
            srv.cleanup()
            return 3
        with srv:
            srv.apply_client_env()
            a.ckpt_uri = "%s/kill-anywhere" % srv.uri
            print("%s server at %s" % (srv.kind.upper(), srv.uri), flush=True)
            if a.server_faults:
                a.faults = sf.ServerFaults(srv, max_down_s=a.max_down)
            try:
                return run_all(a)
            finally:
                if a.server_faults:
                    a.faults.close()
    return run_all(a)


def run_all(a):
    irs = ["pir", "legacy"] if a.ir == "both" else [a.ir]
    own_root = a.uri_root is None
    root = a.uri_root or tempfile.mkdtemp(prefix="kill-anywhere-")
    os.makedirs(root, exist_ok=True)
    if a.ranks > 1:
        return main_multi(a, irs, root, own_root)
    report = {"seed": a.seed, "trials_per_ir": a.trials,
              "storage": a.ckpt_uri or "local", "busy_policy": a.busy_policy,
              "server_faults": a.server_faults, "local_cache": a.local_cache,
              "script_args": [str(x) for x in script_args(a)],
              "root": root, "irs": {}, "trials": []}
    total_ok = total = total_failed = total_liveness = total_clear = 0
    reference_failed = False
    t_all = time.monotonic()
    for ir in irs:
        print("[%s] reference runs ..." % ir, flush=True)
        try:
            ref, model = reference_runs(ir, a, root)
        except RuntimeError as e:
            print("[%s] REFERENCE FAILED: %s" % (ir, e), flush=True)
            report["irs"][ir] = {"reference_error": str(e)}
            reference_failed = True
            continue
        lo, hi = kill_window(model, a.kill_window)
        print("[%s] uninterrupted run %.2f s (startup %.2f s, showed life "
              "after %.2f s, %.3f s/epoch); kill times uniform in [%.2f, "
              "%.2f] s after %s; after %d kills a trial's next process runs "
              "unkilled"
              % (ir, model["total_s"], model["startup_s"], model["ready_s"],
                 model["per_epoch_s"], lo, hi,
                 "the start" if a.kill_window == "process" else
                 "the process showed life", a.max_restarts), flush=True)
        ok = kills = inside = failed = liveness = clear = 0
        recs = []
        for t in range(a.trials):
            rec = run_trial(ir, t, a, root, ref, model)
            recs.append(rec)
            ok += rec["ok"]
            failed += rec["outcome"] == "failed"
            liveness += rec["outcome"] == "liveness"
            clear += rec["outcome"] == "clear_error"
            kills += rec["kills"]
            inside += rec["kills_inside_save"]
            print("[%s] trial %d/%d: %s, %d kill(s) (%d before the process's "
                  "first epoch, %d in training, %d after done; %d inside a "
                  "save), %d process(es), rewinds %s, %.1f s%s"
                  % (ir, t + 1, a.trials, STATUS[rec["outcome"]], rec["kills"],
                     rec["kills_before_first_epoch"], rec["kills_in_training"],
                     rec["kills_after_done"], rec["kills_inside_save"],
                     rec["processes"], rec["rewinds"], rec["seconds"], storage_summary(rec)),
                  flush=True)
            if not rec["ok"]:
                for prob in rec["problems"] + rec["liveness"] + rec["clear_errors"][-1:]:
                    print("    " + prob.replace("\n", "\n    "), flush=True)
                print("    trial dir kept: %s" % rec["dir"], flush=True)
        report["trials"] += recs
        report["irs"][ir] = {
            "trials": a.trials, "ok": ok, "failed": failed,
            "liveness_problems": liveness, "clear_errors": clear, "kills": kills,
            "unkilled_runs": sum(r["unkilled_runs"] for r in recs),
            "kills_inside_save": inside,
            "kills_before_first_epoch": sum(r["kills_before_first_epoch"]
                                            for r in recs),
            "kills_in_training": sum(r["kills_in_training"] for r in recs),
            "kills_after_done": sum(r["kills_after_done"] for r in recs),
            "max_rewind": max([0] + [x for r in recs for x in r["rewinds"]]),
            "reference": model}
        st = report["irs"][ir]
        print("[%s] %d/%d trials resumed bit-identically (%d kills: %d "
              "before the process's first epoch, %d in training, %d after "
              "done; %d inside a save; max rewind %d epoch(s))"
              % (ir, ok, a.trials, kills, st["kills_before_first_epoch"],
                 st["kills_in_training"], st["kills_after_done"], inside,
                 st["max_rewind"]), flush=True)
        if liveness:
            print("[%s] %d trial(s) with a liveness problem: a process showed "
                  "no life in time or hung; the checkpoints were not at fault"
                  % (ir, liveness), flush=True)
        total_ok += ok
        total += a.trials
        total_failed += failed
        total_liveness += liveness
        total_clear += clear
    # a correctness failure outranks everything; a liveness problem is its own outcome
    exit_code = (1 if total_failed else 2 if reference_failed else
                 3 if total_liveness else clear_error_exit(a, total_clear))
    report["ok"] = total_ok
    report["failed"] = total_failed
    report["liveness_problems"] = total_liveness
    report["clear_errors"] = total_clear
    report["total"] = total
    report["seconds"] = round(time.monotonic() - t_all, 1)
    report["exit_code"] = exit_code
    print("%d/%d trials resumed bit-identically" % (total_ok, total),
          flush=True)
    print_clear_errors(a, total_clear)
    if total_liveness:
        print("LIVENESS: %d trial(s) did not complete for lack of progress "
              "(exit status 3); %d correctness failure(s)"
              % (total_liveness, total_failed), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    if exit_code == 0 and own_root and not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    elif exit_code != 0:
        print("work directory kept: %s" % root, flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
