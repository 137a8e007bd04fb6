"""Helpers for the end-to-end resume tests and the kill-anywhere harness.

The training script is ``tests/scripts/train_script.py``; see its docstring
for what it logs.  Everything here works on its output directory:

* ``losses.jsonl``: one JSON line per trained epoch (with the pid that
  trained it), appended across restarts;
* ``final.npz``: the parameters at the end of the run;
* ``done``: written last.
"""
import json
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "train_script.py")
JOB_ID = "e2e"

# Variables that would activate / steer a checkpointer (ours or Paddle's)
# from the caller's environment; never inherited by the child.
_STRIP_PREFIXES = ("PADDLE_ACP_", "PADDLE_EDL_")
_STRIP_NAMES = ("PADDLE_JOB_ID", "PADDLE_TRAINER_ID", "PADDLE_RUNNING_ENV",
                "PADDLE_RUNNING_PLATFORM", "FLAGS_enable_pir_api")

IRS = ("pir", "legacy")

# ci/matrix.py: the training processes import the pip-installed paddle-acp, not the checkout.
INSTALLED = os.environ.get("PADDLE_ACP_TEST_INSTALLED") == "1"


def script_env(ckpt_dir=None, ir="pir", env=None, runner=False):
    """Environment for one run of the training script.

    ``ckpt_dir`` activates the library through ``PADDLE_ACP_CHECKPOINT_URI``
    (unless ``runner``: then the runner's flags do it).  ``env`` entries
    override; a ``None`` value deletes the variable.
    """
    if ir not in IRS:
        raise ValueError("ir must be one of %r, not %r" % (IRS, ir))
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(_STRIP_PREFIXES) and k not in _STRIP_NAMES}
    if not INSTALLED:
        e["PYTHONPATH"] = os.pathsep.join(
            [REPO] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    e["PYTHONUNBUFFERED"] = "1"
    e.setdefault("OMP_NUM_THREADS", "1")
    e.setdefault("GLOG_minloglevel", "1")  # hide Paddle's INFO chatter
    if ir == "legacy":
        e["FLAGS_enable_pir_api"] = "0"
    if ckpt_dir is not None and not runner:
        e["PADDLE_ACP_CHECKPOINT_URI"] = str(ckpt_dir)
        e["PADDLE_JOB_ID"] = JOB_ID
        e["PADDLE_ACP_SAVE_INTERVAL"] = "0"
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = str(v)
    return e


def script_cmd(out_dir, ckpt_dir=None, *args, runner=False):
    """Command line for one run of the training script.

    With ``runner``, the unchanged script runs under
    ``python -m paddle_acp run --checkpoint ckpt_dir`` and uses Paddle's
    ``auto_checkpoint`` module (``--api paddle`` is added unless given).
    """
    args = [str(a) for a in args]
    if runner:
        cmd = [sys.executable, "-m", "paddle_acp", "run"]
        if ckpt_dir is not None:
            cmd += ["--checkpoint", str(ckpt_dir), "--interval", "0",
                    "--job-id", JOB_ID]
        cmd += [SCRIPT, "--out", str(out_dir)]
        if "--api" not in args:
            cmd += ["--api", "paddle"]
        return cmd + args
    return [sys.executable, SCRIPT, "--out", str(out_dir)] + args


def run_script(out_dir, ckpt_dir, ir, *args, env=None, runner=False,
               timeout=300):
    """Run the training script to completion (or death); CompletedProcess.

    ``ckpt_dir=None`` runs without the library active (a plain range).
    """
    return subprocess.run(
        script_cmd(out_dir, ckpt_dir, *args, runner=runner),
        env=script_env(ckpt_dir, ir, env, runner),
        cwd=os.path.dirname(str(out_dir)) if INSTALLED else REPO,  # `-m paddle_acp` must not see the checkout
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        timeout=timeout)


def describe(proc):
    """Short text of a CompletedProcess for assertion messages."""
    return "cmd: %s\nreturncode: %s\n--- stdout ---\n%s\n--- stderr (tail) ---\n%s" % (
        " ".join(proc.args), proc.returncode, proc.stdout,
        (proc.stderr or "")[-4000:])


def committed_positions(range_dir):
    """The positions of a range directory whose global checkpoint is committed (``global.json`` there),
    oldest first. Rank 0 commits on its committer thread, so a checkpoint becomes visible some time
    after its epoch: a test that kills a job to resume from a checkpoint waits for one."""
    import re

    if not os.path.isdir(str(range_dir)):
        return []
    found = []
    for name in os.listdir(str(range_dir)):
        m = re.fullmatch(r"ckpt-e(\d+)(?:-s(\d+))?", name)
        if m and os.path.exists(os.path.join(str(range_dir), name, "global.json")):
            found.append(((int(m.group(1)), int(m.group(2) or -1)), name))
    return [name for _, name in sorted(found)]


def read_log(out_dir):
    """All entries of losses.jsonl, in order (a torn last line is dropped:
    the process may have been killed while appending it)."""
    path = os.path.join(str(out_dir), "losses.jsonl")
    entries = []
    if not os.path.exists(path):
        return entries
    with open(path) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:  # torn last line (no newline yet)
                continue
            raise
    return entries


def key_of(entry):
    return (entry["range"], entry["epoch"])


def strip_pid(entry):
    return {k: v for k, v in entry.items() if k != "pid"}


def load_params(out_dir):
    with np.load(os.path.join(str(out_dir), "final.npz")) as z:
        return {k: z[k].copy() for k in z.files}


def load_result(out_dir):
    """(losses, params): losses maps (range, epoch) -> the LAST entry logged
    for it; params maps name -> array from final.npz."""
    losses = {}
    for e in read_log(out_dir):
        losses[key_of(e)] = e
    return losses, load_params(out_dir)


def is_done(out_dir):
    return os.path.exists(os.path.join(str(out_dir), "done"))


def compare_results(result, reference):
    """List of differences between two load_result() values (empty: same).

    Losses are compared bit for bit (the hex strings, every field but the
    pid); parameters with np.array_equal plus dtype and shape.
    """
    losses, params = result
    ref_losses, ref_params = reference
    diffs = []
    if sorted(losses) != sorted(ref_losses):
        diffs.append("epochs logged %s != reference %s"
                     % (sorted(losses), sorted(ref_losses)))
    for k in sorted(set(losses) & set(ref_losses)):
        a, b = strip_pid(losses[k]), strip_pid(ref_losses[k])
        if a != b:
            diffs.append("losses of (range, epoch)=%s differ: %s != reference %s"
                         % (k, a, b))
    if sorted(params) != sorted(ref_params):
        diffs.append("parameter names %s != reference %s"
                     % (sorted(params), sorted(ref_params)))
    for n in sorted(set(params) & set(ref_params)):
        a, b = params[n], ref_params[n]
        if a.dtype != b.dtype or a.shape != b.shape:
            diffs.append("parameter %s: %s%s != reference %s%s"
                         % (n, a.dtype, a.shape, b.dtype, b.shape))
        elif not np.array_equal(a, b):
            diffs.append("parameter %s differs (max abs diff %g)"
                         % (n, float(np.max(np.abs(a.astype(np.float64)
                                                   - b.astype(np.float64))))))
    return diffs


def assert_same_as_reference(result, reference):
    """Assert two load_result() values are bit-identical."""
    diffs = compare_results(result, reference)
    assert not diffs, "result differs from the reference:\n  " + "\n  ".join(diffs)


def all_keys(epochs, ranges=1):
    return [(r, e) for r in range(ranges) for e in range(epochs)]


def pid_groups(entries):
    """Consecutive runs of entries logged by the same pid:
    [(pid, [keys...]), ...] in order."""
    groups = []
    for e in entries:
        if groups and groups[-1][0] == e["pid"]:
            groups[-1][1].append(key_of(e))
        else:
            groups.append((e["pid"], [key_of(e)]))
    return groups


def assert_no_repeat_no_skip(out_dir, epochs, kill_epoch, kill_range=0,
                             ranges=1, max_redo=0):
    """After one kill at the start of (kill_range, kill_epoch) and one rerun:
    the first process logged every epoch before the kill point and the
    second the rest: no epoch skipped, and none repeated (max_redo=0).

    With asynchronous saves the checkpoint of the epoch just before the kill
    may not have committed yet; max_redo=1 then allows the rerun to train
    that one epoch again, and requires it to log the same values again.
    Returns the (range, epoch) the rerun started at.
    """
    keys = all_keys(epochs, ranges)
    split = keys.index((kill_range, kill_epoch))
    entries = read_log(out_dir)
    groups = pid_groups(entries)
    got = [g[1] for g in groups]
    first = keys[:split]
    ok = False
    start = None
    if split == 0 and len(got) == 1 and got[0] == keys:
        ok, start = True, keys[0]
    elif len(got) == 2 and got[0] == first:
        for s in range(split, max(-1, split - max_redo - 1), -1):
            if got[1] == keys[s:]:
                ok, start = True, keys[s]
                break
    assert ok, (
        "epochs logged per process %s; expected %s (kill at range %d epoch "
        "%d%s)" % (got, [g for g in (first, keys[split:]) if g], kill_range,
                   kill_epoch, ", or a rerun of up to %d epoch(s) before it"
                   % max_redo if max_redo else ""))
    seen = {}
    for e in entries:
        k = key_of(e)
        assert k not in seen or strip_pid(seen[k]) == strip_pid(e), (
            "epoch %s trained again with different values: %s then %s"
            % (k, strip_pid(seen[k]), strip_pid(e)))
        seen.setdefault(k, e)
    return start


def check_restart_log(entries, epochs, ranges=1):
    """For a run restarted any number of times at arbitrary moments.

    Returns (problems, rewinds): problems is a list of strings (empty: ok);
    rewinds lists, per restart, how many already-logged epochs the new
    process trained again.  Checks: every process logs consecutive epochs,
    each process starts no later than right after the previous process's
    last logged epoch (nothing skipped), every epoch was logged, and every
    epoch logged more than once has identical values each time.
    """
    keys = all_keys(epochs, ranges)
    index = {k: i for i, k in enumerate(keys)}
    problems, rewinds = [], []
    groups = pid_groups(entries)
    prev_last = -1
    for pid, gkeys in groups:
        idx = []
        for k in gkeys:
            if k not in index:
                problems.append("pid %s logged unknown epoch %s" % (pid, k))
                return problems, rewinds
            idx.append(index[k])
        if idx != list(range(idx[0], idx[0] + len(idx))):
            problems.append("pid %s logged non-consecutive epochs %s"
                            % (pid, gkeys))
        if idx[0] > prev_last + 1:
            problems.append("pid %s started at %s but the previous process "
                            "last logged %s: epochs skipped"
                            % (pid, gkeys[0],
                               keys[prev_last] if prev_last >= 0 else None))
        if prev_last >= 0:
            rewinds.append(prev_last + 1 - idx[0])
        prev_last = max(prev_last, idx[-1])
    seen = {}
    for e in entries:
        k = key_of(e)
        if k in seen and strip_pid(seen[k]) != strip_pid(e):
            problems.append("epoch %s re-trained with different values: %s "
                            "then %s" % (k, strip_pid(seen[k]), strip_pid(e)))
        seen.setdefault(k, e)
    missing = [k for k in keys if k not in seen]
    if missing:
        problems.append("epochs never logged: %s" % missing)
    return problems, rewinds


def tree_files(root):
    """Relative paths of every file and directory under root (sorted);
    [] when root does not exist."""
    out = []
    root = str(root)
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            out.append(os.path.relpath(os.path.join(d, n), root))
    return sorted(out)


def stopped(pid):
    """Every thread of ``pid`` is stopped (the SIGSTOP took effect)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:
            continue
    return bool(states) and all(s in ("T", "t") for s in states)
