"""Checkpoints written by the last release's own code, for tests/e2e/test_old_checkpoints.py.

The release (:data:`OLD_RELEASE`) is taken from this checkout's git history with ``git archive | tar -x``
into ``.cache/old_fixtures/<commit>/src`` (gitignored; reused once its ``DONE`` marker, written last, is
there). Its ``paddle_acp`` then runs ``tests/scripts/fixture_train.py`` (public API only, the same file
today's restarts run) in subprocesses with ``PYTHONPATH`` = that tree, on this venv's Python and Paddle.
Nothing here is written by hand: every checkpoint, and the state it must restore to, comes from the
old process.

Each old run stops at :attr:`Spec.stop` as if killed (``os._exit``) right after a committed synchronous
checkpoint, having written (per rank, in ``out/r<k>/``) ``state_saved.npz`` (its whole state as saved:
what an export must hold) and ``state_stop.npz`` (its state after the next training step: what a
restarted run must reach after its first step, bit for bit).
"""
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from support.e2e import JOB_ID, REPO, script_env

OLD_RELEASE = "1276c34"  # the last landed release (its one process writes the ckpt-N layout)
SCRIPT = os.path.join(REPO, "tests", "scripts", "fixture_train.py")
CACHE = os.path.join(REPO, ".cache", "old_fixtures")
RANGE = "_range_0"


@dataclass(frozen=True)
class Spec:
    """One fixture: how the old release's job ran (and how a restart of it runs today)."""

    name: str
    ir: str  # "pir" or "legacy"
    world: int  # 1: the one-process layout; 2: the global layout of a 2-rank job
    args: Tuple[str, ...] = ()  # fixture_train.py's options, the same for the old run and every restart
    stop: str = "2"  # where the old process stops: epoch E (plain range) or E:S (resumable)
    rank_state: Optional[str] = None  # PADDLE_ACP_RANK_STATE of a 2-rank job
    env: Tuple[Tuple[str, str], ...] = ()


_STEPS = ("--steps", "5", "--save-every-steps", "2", "--script-state")
SPECS = {s.name: s for s in (
    Spec("pir-plain", "pir", 1),
    Spec("legacy-plain", "legacy", 1),
    Spec("legacy-steps-state", "legacy", 1, _STEPS, stop="1:2"),
    Spec("pir-ranks", "pir", 2, rank_state="per-rank"),
    Spec("pir-replicated", "pir", 2, ("--same-seed",), rank_state="replicated"),  # every rank a share: version 4
    Spec("legacy-replicated-one", "legacy", 2, ("--same-seed",), rank_state="replicated",
         env=(("PADDLE_ACP_REPLICATED_WRITERS", "one"),)),  # rank 0 writes the tensors: version 3
    # the long run's variants (tests/e2e/test_old_checkpoints.py marks them)
    Spec("pir-steps-state", "pir", 1, _STEPS, stop="1:2"),
    Spec("legacy-ranks", "legacy", 2, rank_state="per-rank"),
    Spec("pir-ranks-steps-state", "pir", 2, _STEPS, stop="1:2", rank_state="per-rank"),
)}
DEFAULT = ("pir-plain", "legacy-plain", "legacy-steps-state", "pir-ranks", "pir-replicated", "legacy-replicated-one")
LONG = tuple(n for n in SPECS if n not in DEFAULT)


def old_commit() -> str:
    """The release's full commit id; a clear error when this checkout's history lacks it."""
    p = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", "--quiet", OLD_RELEASE + "^{commit}"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise RuntimeError(
            f"the last release {OLD_RELEASE} is not in the git history of {REPO} ({p.stderr.strip() or 'not found'}): "
            "the old-checkpoint fixtures are built from its code; fetch the full history (git fetch --unshallow)")
    return p.stdout.strip()


def old_source() -> str:
    """The release's tree, extracted once into the cache (reused while its DONE marker is there)."""
    commit = old_commit()
    base = os.path.join(CACHE, commit)
    src = os.path.join(base, "src")
    if os.path.exists(os.path.join(src, "DONE")):
        return src
    os.makedirs(base, exist_ok=True)
    tmp = os.path.join(base, f"src.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    archive = subprocess.Popen(["git", "-C", REPO, "archive", "--format=tar", commit], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", tmp], stdin=archive.stdout, stderr=subprocess.PIPE, text=True)
    assert archive.stdout is not None
    archive.stdout.close()
    if archive.wait() != 0 or tar.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"git archive {commit} | tar -x failed: {tar.stderr.strip()}")
    if not os.path.exists(os.path.join(tmp, "paddle_acp", "__init__.py")):
        raise RuntimeError(f"{commit}'s tree has no paddle_acp package")
    with open(os.path.join(tmp, "DONE"), "w") as f:
        f.write(commit + "\n")
    shutil.rmtree(src, ignore_errors=True)  # an incomplete earlier extraction (no DONE)
    try:
        os.rename(tmp, src)
    except OSError:  # another session put a complete one there first
        shutil.rmtree(tmp, ignore_errors=True)
    return src


def range_dir(ckpt: str) -> str:
    return os.path.join(ckpt, JOB_ID, "range", RANGE)


def start(spec: Spec, ckpt: str, out: str, gen: str, *extra: str, src: Optional[str] = None) -> List[subprocess.Popen]:
    """Start the job of ``spec`` (one process per rank) over the storage root ``ckpt``: the old release's
    code with ``src``, else today's. Rank k writes to ``out/r<k>``."""
    procs = []
    for rank in range(spec.world):
        env: Dict[str, object] = {"PADDLE_ACP_ASYNC": 0, **dict(spec.env)}
        if src is not None:
            env["PYTHONPATH"] = src
        args = ["--out", os.path.join(out, f"r{rank}"), *spec.args, *extra]
        if spec.world > 1:
            env.update({"PADDLE_TRAINER_ID": rank, "PADDLE_TRAINERS_NUM": spec.world, "ACP_TEST_GEN": gen,
                        "PADDLE_ACP_PART_TIMEOUT": 60, "PADDLE_ACP_RANK_STATE": spec.rank_state})
            args += ["--rank-barrier", os.path.join(out, "barrier")]
        log = open(os.path.join(out, f"r{rank}.{gen}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, SCRIPT, *args], env=script_env(ckpt, spec.ir, env), cwd=REPO,
                                      stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def finish(procs: Sequence[subprocess.Popen], out: str, gen: str, timeout: float = 240) -> None:
    """Wait for a job's processes; an AssertionError with each failing rank's log tail."""
    bad = []
    for rank, p in enumerate(procs):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if rc != 0:
            with open(os.path.join(out, f"r{rank}.{gen}.log")) as f:
                bad.append(f"rank {rank} exited {rc}:\n{f.read()[-3000:]}")
    assert not bad, "\n".join(bad)


def run_to_first_failure(spec: Spec, ckpt: str, out: str, gen: str, *extra: str, timeout: float = 240) -> Dict[int, str]:
    """Run today's job of ``spec`` as a launcher does: once a rank exits non-zero, the others are killed.
    rank -> its log, of the ranks that failed on their own (an AssertionError when none did)."""
    import time

    os.makedirs(out, exist_ok=True)
    procs = start(spec, ckpt, out, gen, *extra)
    deadline = time.monotonic() + timeout
    failed: Dict[int, str] = {}
    while not failed and time.monotonic() < deadline and any(p.poll() is None for p in procs):
        failed = {k: "" for k, p in enumerate(procs) if p.poll() not in (None, 0)}
        if not failed:
            time.sleep(0.05)
    failed = {k: "" for k, p in enumerate(procs) if p.poll() not in (None, 0)}
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    for k in failed:
        with open(os.path.join(out, f"r{k}.{gen}.log")) as f:
            failed[k] = f.read()
    assert failed, f"no rank of {spec.name} failed (start {gen})"
    return failed


def run(spec: Spec, ckpt: str, out: str, gen: str, *extra: str, src: Optional[str] = None) -> None:
    os.makedirs(out, exist_ok=True)
    finish(start(spec, ckpt, out, gen, *extra, src=src), out, gen)


def build(names: Sequence[str], root: str) -> Dict[str, Dict[str, str]]:
    """Run the old release's jobs of ``names`` at once, under ``root``; name -> {ckpt, out} (read-only for
    the tests: they work on copies)."""
    src = old_source()
    started = []
    for name in names:
        spec = SPECS[name]
        ckpt, out = os.path.join(root, name, "ckpt"), os.path.join(root, name, "out")
        os.makedirs(out)
        extra = ["--stop-at", spec.stop]
        if spec.world > 1:  # rank 0 commits: each rank stops once the checkpoint is committed
            e, _, s = spec.stop.partition(":")
            saved = f"ckpt-e{int(e) - 1}" if not s else f"ckpt-e{e}-s{s}"
            extra += ["--wait-for", os.path.join(range_dir(ckpt), saved, "global.json")]
        started.append((spec, ckpt, out, start(spec, ckpt, out, "old", *extra, src=src)))
    fixtures = {}
    for spec, ckpt, out, procs in started:
        finish(procs, out, "old")
        for rank in range(spec.world):
            for f in ("state_saved.npz", "state_stop.npz"):
                assert os.path.exists(os.path.join(out, f"r{rank}", f)), f"{spec.name}: rank {rank} wrote no {f}"
        fixtures[spec.name] = {"ckpt": ckpt, "out": out}
    return fixtures


def load_state(path: str) -> Dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k].copy() for k in z.files}


def meta(state: Dict[str, np.ndarray]) -> dict:
    import json

    return json.loads(state["meta"].tobytes().decode())


def state_diffs(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]) -> List[str]:
    """What differs between two dumped states, bit for bit (arrays: dtype, shape and bytes)."""
    diffs = []
    if sorted(got) != sorted(want):
        diffs.append(f"names {sorted(set(got) ^ set(want))} only on one side")
    for k in sorted(set(got) & set(want)):
        a, b = got[k], want[k]
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            diffs.append(k if k != "meta" else f"meta: {meta(got)} != {meta(want)}")
    return diffs
