#!/usr/bin/env python3
"""The Paddle version matrix: paddle-acp installed beside each supported Paddle, the way a user would.

For every Paddle version (default: 2.6.2, 3.0.0, 3.2.2, 3.3.1) this script

1. keeps a virtual environment with exactly that Paddle (CPU wheel) plus pytest, hypothesis and pytest-xdist
   under ``.cache/matrix/paddle-<version>/`` (created once, reused: reruns take seconds);
2. builds paddle-acp's wheel once (``pip wheel --no-deps``, into ``.cache/matrix/dist/``) and installs it
   into each environment with a plain ``pip install <wheel>`` (no ``--no-deps``), then checks
   that the installed Paddle distributions did not change (name and version) and that
   ``import paddle_acp`` from outside the checkout loads the installed copy;
3. runs that version's test subset (see :func:`subset`) with the environment's ``pytest``, the
   training subprocesses importing the installed paddle-acp (``PADDLE_ACP_TEST_INSTALLED=1``).

It ends with one summary line per version and exits 1 when anything failed.

    python ci/matrix.py                          # the default matrix
    python ci/matrix.py --versions 3.1.1,3.3.0   # others
    python ci/matrix.py --prepare 3.0.0          # only make that environment; prints its path
    python ci/matrix.py --main-python .venv/bin/python   # .ci/run: the version .venv holds is ci/test.sh's

With ``--main-python`` (``.ci/run`` passes ``.venv``'s interpreter, the one ``ci/test.sh`` runs the whole suite
with), the version whose Paddle that environment holds gets no environment of its own (on a fresh machine that
saves its venv, ~30 s, and its subset, ~35 s, which the whole suite runs on the same Paddle anyway): its plain
install is checked with pip's resolver against that environment instead (``pip install --dry-run --report
<wheel>``: nothing of Paddle may be installed, upgraded or replaced), after ``ci/env.sh`` checked that
installing paddle-acp with its dependencies (``pip install -e .[test]``) left that Paddle as it was; the wheel's
own contents are checked by the other versions' real installs (the same wheel), and its tests run in ci/test.sh.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("PADDLE_ACP_MATRIX_CACHE", os.path.join(ROOT, ".cache", "matrix"))
DEFAULT_VERSIONS = ("2.6.2", "3.0.0", "3.2.2", "3.3.1")
PADDLE_DISTS = ("paddlepaddle", "paddlepaddle-gpu")
TEST_DEPS = ("pytest>=7", "hypothesis>=6", "pytest-xdist>=3")
# the version's tests run on two workers (its few test files: test by test, the reference runs made in each)
WORKERS = ("-n", os.environ.get("PADDLE_ACP_TEST_WORKERS", "2"), "--dist", "load")

# What each version runs (the whole suite runs on 3.3.1 in .venv through ci/test.sh). Everywhere: the
# version gate with its Paddle-specific branches, and the RNG state. Then, in every IR the version
# supports (2.6.2: legacy only), the kill-and-resume core: an uninterrupted checkpointed run equal to one
# without paddle-acp, a SIGKILL at epoch 3 resumed with synchronous and with background saves, the
# same through `python -m paddle_acp run` and Paddle's module names, and a finished job restarted.
# 2.6.2, 3.0.0 and 3.2.2 add program detection and the compatibility scenarios; 3.3.1 runs those in
# ci/test.sh. The rest of test_e2e_resume.py (two ranges, two programs, other kill points) exercises
# paddle-acp's own logic, the same on every Paddle, and runs on 3.3.1 in ci/test.sh.
ALWAYS = ["tests/e2e/test_paddle_version.py", "tests/unit/adapter/test_rng_state.py"]
E2E_CORE = ["test_uninterrupted_with_checkpointing_matches_reference[{ir}]", "test_kill_and_resume[3-sync-{ir}]",
            "test_kill_and_resume[3-async-{ir}]", "test_kill_and_resume_through_runner[paddle-sync-{ir}]",
            "test_restart_after_completion_restores_final_state[{ir}]"]
DETECTION = ["tests/unit/adapter/test_programs.py", "tests/e2e/test_compat_scenarios.py"]
WITHOUT_DETECTION = ("3.3.1",)
LOW_DISK = 8 * 2**30  # below this much free space, a tested version's environment is removed after its tests


def subset(version: str) -> list:
    """The pytest arguments for ``version``."""
    irs = ("legacy",) if version.startswith("2.") else ("pir", "legacy")
    e2e = ["tests/e2e/test_e2e_resume.py::" + t.format(ir=ir) for ir in irs for t in E2E_CORE]
    return ALWAYS + ([] if version in WITHOUT_DETECTION else DETECTION) + e2e


def log(msg: str) -> None:
    print("[matrix] " + msg, flush=True)


def venv_dir(version: str) -> str:
    return os.path.join(CACHE, "paddle-" + version)


def _python() -> str:
    return os.environ.get("PYTHON_FOR_VENV") or shutil.which("python3.11") or sys.executable


@contextlib.contextmanager
def _lock(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def ensure_venv(version: str) -> str:
    """The path of an environment holding Paddle ``version`` (CPU) and the test tools; made once."""
    d = venv_dir(version)
    ready = os.path.join(d, ".matrix-ready")
    made = " ".join((version,) + TEST_DEPS) + "\n"  # an environment made for other test tools is made again
    with _lock(d + ".lock"):
        if os.path.exists(ready) and open(ready).read() == made:
            return d
        shutil.rmtree(d, ignore_errors=True)
        p = _run([_python(), "-m", "venv", d])
        if p.returncode != 0:
            raise RuntimeError(f"python -m venv {d} failed:\n{p.stdout}")
        py = os.path.join(d, "bin", "python")
        # no pip cache: a second copy of each Paddle wheel (~200 MB) is disk a fresh machine may lack
        p = _run([py, "-m", "pip", "install", "-q", "--no-cache-dir", f"paddlepaddle=={version}", *TEST_DEPS])
        if p.returncode != 0:
            raise RuntimeError(f"installing paddlepaddle=={version} failed:\n{p.stdout[-4000:]}")
        with open(ready, "w") as f:
            f.write(made)
    return d


def _prepare_quietly(versions: list) -> None:
    """Make the environments of ``versions`` in order; a failure is left to run_version (it tries again, reports it)."""
    for v in versions:
        with contextlib.suppress(Exception):
            ensure_venv(v)


def paddle_dists(py: str) -> dict:
    """{distribution name: version} of the Paddle distributions installed for ``py``."""
    p = _run([py, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
    if p.returncode != 0:
        raise RuntimeError(f"pip list failed:\n{p.stdout}")
    out = p.stdout[p.stdout.index("["):]
    return {d["name"].lower(): d["version"] for d in json.loads(out) if d["name"].lower() in PADDLE_DISTS}


def _junit_counts(path: str) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            counts["failed"] += 1
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    for suite in root.iter("testsuite"):  # collection errors have no testcase
        counts["failed"] += max(0, int(suite.get("errors", 0)) - sum(
            1 for c in suite.iter("testcase") if any(ch.tag == "error" for ch in c)))
    return counts


def build_wheel() -> str:
    """Build paddle-acp's wheel from this checkout (as a release would) and return its path."""
    dist = os.path.join(CACHE, "dist")
    shutil.rmtree(dist, ignore_errors=True)
    os.makedirs(dist)
    p = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist, ROOT])
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")] if p.returncode == 0 else []
    if len(wheels) != 1:
        raise RuntimeError(f"building the paddle-acp wheel failed:\n{p.stdout[-4000:]}")
    return os.path.join(dist, wheels[0])


def main_version(version: str, wheel: str, main_python: str) -> dict:
    """``version`` is the Paddle of ``main_python``'s environment (ci/test.sh's): pip's resolver, asked what a plain
    install of ``wheel`` would change there, must leave Paddle alone; the tests are ci/test.sh's (the whole suite)."""
    t0 = time.monotonic()
    res = {"version": version, "ok": False, "problems": [], "tests": None, "main": True}
    report = os.path.join(CACHE, "main-dry-run.json")
    p = _run([main_python, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check",
              "--report", report, wheel])
    if p.returncode != 0:
        res["problems"].append("pip install --dry-run of paddle-acp failed")
        log(p.stdout[-4000:])
    else:
        with open(report) as f:
            plan = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(f)["install"]}
        changed = {k: v for k, v in plan.items() if k in PADDLE_DISTS}
        if changed:
            res["problems"].append(f"a plain pip install would change Paddle: {changed}")
        log(f"{version}: the environment of {main_python} (ci/test.sh runs the whole suite there, Paddle "
            f"{paddle_dists(main_python)}): a plain `pip install {os.path.basename(wheel)}` would install {plan or 'nothing'}")
    res["ok"] = not res["problems"]
    res["seconds"] = time.monotonic() - t0
    return res


def run_version(version: str, timeout: float, wheel: str) -> dict:
    t0 = time.monotonic()
    res = {"version": version, "ok": False, "problems": [], "tests": None}
    try:
        d = ensure_venv(version)
    except RuntimeError as exc:
        res["problems"].append(str(exc).splitlines()[0])
        log(str(exc))
        res["seconds"] = time.monotonic() - t0
        return res
    py = os.path.join(d, "bin", "python")
    before = paddle_dists(py)
    log(f"{version}: environment {os.path.relpath(d, ROOT)}, Paddle before install: {before}")
    _run([py, "-m", "pip", "uninstall", "-q", "-y", "paddle-acp"])  # a reused environment: install anew
    p = _run([py, "-m", "pip", "install", "-q", wheel])  # what a user types: no --no-deps
    if p.returncode != 0:
        res["problems"].append("pip install of paddle-acp failed")
        log(p.stdout[-4000:])
    after = paddle_dists(py)
    if after != before:
        res["problems"].append(f"pip install changed Paddle: {before} -> {after}")
    p = _run([py, "-c", "import paddle, paddle_acp; print(paddle.__version__); print(paddle_acp.__file__)"],
             cwd="/")
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or len(lines) < 2:
        res["problems"].append("import paddle_acp failed: " + (lines[-1] if lines else "no output"))
        log(p.stdout[-3000:])
    else:
        if lines[-2] != version:
            res["problems"].append(f"paddle.__version__ is {lines[-2]}, expected {version}")
        if not lines[-1].startswith(d):
            res["problems"].append(f"import paddle_acp loaded {lines[-1]}, not the installed copy")
    log(f"{version}: after plain `pip install {os.path.basename(wheel)}`: Paddle {after}, paddle_acp from {lines[-1] if lines else '?'}")
    junit = os.path.join(d, "junit.xml")
    if os.path.exists(junit):
        os.remove(junit)
    args = subset(version)
    env = dict(os.environ, PADDLE_ACP_TEST_INSTALLED="1", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    cmd = [os.path.join(d, "bin", "pytest"), "-q", "-p", "no:cacheprovider", *WORKERS, f"--junitxml={junit}",
           *args]
    log(f"{version}: {' '.join(cmd[1:])}")
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = None
        res["problems"].append(f"tests timed out after {timeout:.0f} s")
    if os.path.exists(junit):
        res["tests"] = _junit_counts(junit)
    if rc not in (0, None):
        res["problems"].append(f"pytest exited {rc}")
    if res["tests"] is None or res["tests"]["passed"] == 0:
        res["problems"].append("no test passed")
    res["ok"] = not res["problems"]
    res["seconds"] = time.monotonic() - t0
    _drop_if_disk_is_low(d)
    return res


def _drop_if_disk_is_low(d: str) -> None:
    """Remove a tested version's environment (~0.9 GB) when the disk is short, so later steps can install."""
    free = shutil.disk_usage(CACHE).free
    if free < LOW_DISK:
        log(f"only {free / 2**30:.1f} GiB free: removing {os.path.relpath(d, ROOT)} (made again on the next run)")
        with _lock(d + ".lock"):
            shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", default=",".join(DEFAULT_VERSIONS),
                    help="comma-separated Paddle versions (default: %(default)s)")
    ap.add_argument("--prepare", metavar="VERSION", help="only make the environment of VERSION and print its path")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for one version's tests")
    ap.add_argument("--main-python", metavar="PYTHON",
                    help="the interpreter ci/test.sh runs the whole suite with: the version its Paddle is gets no "
                    "environment of its own, only pip's dry run of the plain install there (see above)")
    args = ap.parse_args(argv)
    if args.prepare:
        print(ensure_venv(args.prepare))
        return 0
    t0 = time.monotonic()
    wheel = build_wheel()
    log(f"built {os.path.relpath(wheel, ROOT)}")
    main_paddle = paddle_dists(args.main_python) if args.main_python else {}
    versions = [v for v in (x.strip() for x in args.versions.split(",")) if v]
    own = [v for v in versions if main_paddle != {"paddlepaddle": v}]
    # the environments are made (a first run: a venv and a Paddle wheel each, ~30 s) one after the other in the
    # background while the versions before them run their tests; run_version waits for its own (the file lock)
    threading.Thread(target=_prepare_quietly, args=(own,), daemon=True).start()
    results = [run_version(v, args.timeout, wheel) if v in own else main_version(v, wheel, args.main_python)
               for v in versions]
    print("\n[matrix] summary (Paddle version: result, tests, seconds)", flush=True)
    for r in results:
        t = r["tests"] or {}
        tests = "passed %d, failed %d, skipped %d" % (t.get("passed", 0), t.get("failed", 0), t.get("skipped", 0))
        if r.get("main"):
            tests = "plain install: pip's dry run in ci/test.sh's environment; tests: ci/test.sh (the whole suite)"
        line = "  %-7s %s  %s  %5.0f s" % (r["version"], "PASS" if r["ok"] else "FAIL", tests, r["seconds"])
        if r["problems"]:
            line += "  -- " + "; ".join(r["problems"])
        print(line, flush=True)
    failed = [r["version"] for r in results if not r["ok"]]
    print("[matrix] %s in %.0f s" % ("FAILED: " + ", ".join(failed) if failed else "all versions passed",
                                     time.monotonic() - t0), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
