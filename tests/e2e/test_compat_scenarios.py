"""Paddle's own auto-checkpoint scenarios as real two-process restarts, in both IRs.

``tests/scripts/compat_scenarios.py`` imports Paddle's module
(``from paddle.incubate.checkpoint import auto_checkpoint as acp``) and runs
under ``python -m paddle_acp run`` with the PaddleCloud environment Paddle's
tests used; each IR runs it twice against the same checkpoint directory
(the second time with ``--restart``: loops that left with ``break`` before
now run to their end, as in Paddle's tests).
The two IRs run concurrently (one chain of processes each).
"""
import json
import os
import subprocess
import sys
import threading

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "compat_scenarios.py")
from support.paddle_compat import IRS  # noqa: E402  (the IRs this Paddle supports: legacy only on 2.6)

MAIN_SCENARIOS = ("full", "break0", "break1", "break2", "multi", "checker", "saver")
TIMEOUT = 240

_STRIP_PREFIXES = ("PADDLE_ACP_", "PADDLE_EDL_")
_STRIP_NAMES = ("PADDLE_JOB_ID", "PADDLE_TRAINER_ID", "PADDLE_RUNNING_ENV", "PADDLE_RUNNING_PLATFORM",
                "FLAGS_enable_pir_api")


def child_env(ir, ckpt, running_env=True, drop=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STRIP_PREFIXES) and k not in _STRIP_NAMES}
    if os.environ.get("PADDLE_ACP_TEST_INSTALLED") != "1":  # ci/matrix.py: the installed copy
        env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("GLOG_minloglevel", "2")
    if ir == "legacy":
        env["FLAGS_enable_pir_api"] = "0"
    env.update({
        "PADDLE_RUNNING_ENV": "PADDLE_EDL_AUTO_CHECKPOINT",
        "PADDLE_JOB_ID": "compat-%s" % ir,
        "PADDLE_EDL_HDFS_CHECKPOINT_PATH": str(ckpt),
        "PADDLE_TRAINER_ID": "0",
        "PADDLE_EDL_ONLY_FOR_CE_TEST": "1",
        "PADDLE_EDL_HDFS_NAME": "",
        "PADDLE_EDL_HDFS_HOME": "/nonexistent",
        "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "0",
        "PADDLE_ACP_ASYNC": "0",
    })
    if not running_env:
        del env["PADDLE_RUNNING_ENV"]
    for k in drop:
        env.pop(k, None)
    return env


def run(cmd_args, env, cwd):
    cmd = [sys.executable, "-m", "paddle_acp", "run", SCRIPT] + list(cmd_args)
    return subprocess.run(cmd, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=TIMEOUT)


def describe(proc):
    return "cmd: %s\nrc: %s\n--- stdout ---\n%s\n--- stderr (tail) ---\n%s" % (
        " ".join(proc.args), proc.returncode, proc.stdout[-3000:], proc.stderr[-5000:])


def chain(ir, base):
    """Every process of one IR, in order; returns a dict of results (or raises)."""
    out = {"ckpt": base / "ckpt", "plain_ckpt": base / "plain_ckpt", "runs": [], "plain": []}
    main_args = []
    for s in MAIN_SCENARIOS:
        main_args += ["--scenario", s]
    main_args += ["--saver-root", str(base / "saver")]
    for k in (1, 2):
        res = base / ("run%d.json" % k)
        args = ["--out", str(res)] + main_args + (["--restart"] if k == 2 else [])
        proc = run(args, child_env(ir, out["ckpt"]), base)
        assert proc.returncode == 0, describe(proc)
        with open(res) as f:
            out["runs"].append(json.load(f))
    for k in (1, 2):
        res = base / ("plain%d.json" % k)
        args = ["--out", str(res), "--scenario", "plain"] + (["--restart"] if k == 2 else [])
        proc = run(args, child_env(ir, out["plain_ckpt"], running_env=False), base)
        assert proc.returncode == 0, describe(proc)
        with open(res) as f:
            out["plain"].append(json.load(f))
    if ir == IRS[0]:
        out["missing_job_id"] = run(["--out", str(base / "never.json"), "--scenario", "full"],
                                    child_env(ir, base / "never", drop=("PADDLE_JOB_ID",)), base)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    done, errors = {}, {}

    def work(ir, base):
        try:
            done[ir] = chain(ir, base)
        except BaseException as exc:  # reported by the tests
            errors[ir] = exc

    # the directories are made here, in one thread: pytest makes its base temporary directory on the first
    # mktemp (remove, then mkdir), and two threads doing that at once fail with FileExistsError (CI, stop 51)
    bases = {ir: tmp_path_factory.mktemp("compat-%s" % ir) for ir in IRS}
    threads = [threading.Thread(target=work, args=(ir, bases[ir])) for ir in IRS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def get(ir):
        if ir in errors:
            raise errors[ir]
        return done[ir]

    return get


def pair(results, ir, scenario):
    first, second = results(ir)["runs"]
    return first[scenario], second[scenario]


def assert_same_losses(first, second):
    common = sorted(set(first["losses"]) & set(second["losses"]))
    assert common
    for e in common:
        assert first["losses"][e] == second["losses"][e], "epoch %s trained differently after the restart" % e


@pytest.mark.parametrize("ir", IRS)
def test_paddle_module_names_resolve_to_paddle_acp(results, ir):
    for r in results(ir)["runs"]:
        assert r["module"] == "paddle_acp.compat.auto_checkpoint"
        assert r["same_module"]
        assert r["pir"] == (ir == "pir")
    first, second = results(ir)["runs"]
    assert first["pid"] != second["pid"]


@pytest.mark.parametrize("ir", IRS)
def test_full_range_then_restart(results, ir):
    first, second = pair(results, ir, "full")
    assert first["epochs"] == [0, 1, 2]
    assert first["restored_from"] == ["memory_init"] * 3
    assert first["n_status"] == [1, 1, 1]
    assert first["none_before"] and first["none_after"] and first["range_is_stable"]
    # The last epoch is saved too (Paddle 3.3.1 did not save it and re-ran [2]).
    assert second["epochs"] == [] and second["none_after"]
    job = results(ir)["ckpt"] / ("compat-%s-full" % ir)
    assert os.path.isdir(job / "range" / first["range_name"])


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("break_at,expected", [(0, [0, 1, 2]), (1, [1, 2]), (2, [2])])
def test_break_then_restart(results, ir, break_at, expected):
    first, second = pair(results, ir, "break%d" % break_at)
    assert first["epochs"] == list(range(break_at + 1))
    assert first["restored_from"] == ["memory_init"] * (break_at + 1)
    assert first["none_after"]
    assert second["epochs"] == expected
    resumed = "checkpoint" if break_at > 0 else "memory_init"
    assert second["restored_from"] == [resumed] * len(expected)
    assert second["status_restored"] == [[resumed]] * len(expected)
    assert second["range_name"] == first["range_name"]
    assert_same_losses(first, second)
    if break_at == 2:
        assert second["final"] == first["final"]


@pytest.mark.parametrize("ir", IRS)
def test_two_programs_one_executor_then_restart(results, ir):
    first, second = pair(results, ir, "multi")
    assert first["epochs"] == [0, 1, 2]
    assert first["n_status"] == [2, 2, 2]
    assert second["epochs"] == [2]
    assert second["n_status"] == [2]
    assert second["restored_from"] == ["checkpoint"]
    assert second["status_restored"] == [["checkpoint", "checkpoint"]]
    assert len(second["losses"]["2"]) == 2
    assert_same_losses(first, second)
    assert second["final"] == first["final"]


@pytest.mark.parametrize("ir", IRS)
def test_without_running_env_the_range_is_plain(results, ir):
    r = results(ir)
    for run_result in r["plain"]:
        p = run_result["plain"]
        assert p["epochs"] == [0, 1, 2]
        assert p["restored_from"] == [] and p["n_status"] == []
        assert p["can_auto_checkpoint"] == [[False]] * 3
        assert p["checker_valid"] is False
    assert_same_losses(r["plain"][0]["plain"], r["plain"][1]["plain"])
    assert not os.path.exists(r["plain_ckpt"]), "no state may be created"


@pytest.mark.parametrize("ir", IRS)
def test_checker_in_the_process(results, ir):
    first, second = pair(results, ir, "checker")
    assert first == second
    c = first
    ckpt = str(results(ir)["ckpt"])
    job = "compat-%s-checker" % ir
    assert c["valid"] and c["run_env"] == "PADDLE_EDL_AUTO_CHECKPOINT"
    assert (c["job_id"], c["trainer_id"], c["ce_test"], c["save_checkpoint_inter"]) == (job, 0, 1, 0)
    assert (c["hdfs_home"], c["hdfs_name"], c["platform"]) == ("/nonexistent", None, None)
    assert c["range_path"] == "%s/%s/range/_range_0" % (ckpt, job)
    assert c["job_path"] == "%s/%s" % (ckpt, job)
    assert "job_id:%s hdfs_home:/nonexistent" % job in c["str"]
    name, message, is_value_error = c["missing_job_id"]
    assert name == "ConfigError" and is_value_error and "PADDLE_JOB_ID" in message


def test_runner_with_missing_job_id_fails_clearly(results):
    proc = results(IRS[0])["missing_job_id"]
    assert proc.returncode == 2, describe(proc)
    assert "PADDLE_JOB_ID is not set" in proc.stderr, describe(proc)
    assert "Traceback" not in proc.stderr, describe(proc)


@pytest.mark.parametrize("ir", IRS)
def test_checkpoint_saver_across_processes(results, ir):
    first, second = pair(results, ir, "saver")
    assert first["before"] == [] and first["junk_only"] == []
    assert [s[:2] for s in first["saved"]] == [["__paddle_checkpoint__.%d" % i, i] for i in range(3)]
    assert first["after_save"] == [0, 1, 2]
    assert first["deleted"] == [0] and first["after_clean"] == [1, 2]
    assert second["before"] == [1, 2]
    assert second["loaded"] == first["saved"][-1][2], "the newest checkpoint must load bit-identically"
    assert [s[1] for s in second["saved"]] == [3, 4, 5]
    assert second["deleted"] == [1, 2, 3, 4] and second["after_clean"] == [5]
    assert first["tmp_left"] == second["tmp_left"] == []
