"""``paddle-acp check -- CMD``: real runs of a real training script (twice uninterrupted, then killed by
the runtime's own SIGKILL at each kill point and restarted), and the verdict its report gives (exit
status, --json, the text report).

The scripts are tests/scripts/check_script.py (tiny model, a few ms per epoch; one ``--mode`` per
known answer) and tests/scripts/check_ranks.py (two ranks of it). Each check runs the command 4-8
times; the same verdict under load (a busy-loop process beside it) is tested on one script by
default and on every known answer in the long run.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.e2e import script_env

from paddle_acp import config
from paddle_acp.errors import ConfigError
from paddle_acp.tools import check_report as report
from paddle_acp.tools.check import kill_points, parse_kill_at
from paddle_acp.tools.check_runs import strip_runner_options
from paddle_acp.tools.discovery import ToolError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
SCRIPT = os.path.join(HERE, "scripts", "check_script.py")
RANKS = os.path.join(HERE, "scripts", "check_ranks.py")
FAST = ["--sleep", "0.002", "--steps", "4"]  # a few ms per epoch


def run_check(*cmd, json_out=True, epochs=3, cwd=None, kill_at=(), env=None):
    args = [sys.executable, "-m", "paddle_acp", "check", "--epochs", str(epochs)]
    for k in kill_at:
        args += ["--kill-at", k]
    if json_out:
        args.append("--json")
    proc = subprocess.run(args + ["--"] + list(cmd), env=script_env(ir="pir", env=env), cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    doc = json.loads(proc.stdout) if json_out and proc.stdout.strip().startswith("{") else None
    return proc, doc


def _why(proc):
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not reaped yet by init) is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def busy():
    """A busy-loop process beside the test (the other core loaded), ended after it."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield p
    p.kill()
    p.wait()


def _points(doc):
    return [(k["range"], k["epoch"], k["step"]) for k in doc["kills"]]


# -- known answers -----------------------------------------------------------------------------
def _resumable(tmp_path, busy_loop=None):
    pids = tmp_path / "pids"
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", "resumable", "--resumable", "--save-every-steps", "2",
                          "--log-file", str(tmp_path / "train.log"), "--background-child", "--pid-file", str(pids),
                          *FAST, env={"TMPDIR": str(tmp_path)})
    return proc, doc, [int(x) for x in pids.read_text().split()]


def test_resumable_script_resumes_exactly_at_every_kill_point(tmp_path):
    proc, doc, pids = _resumable(tmp_path)
    assert proc.returncode == 0, _why(proc)
    assert doc["verdict"] == "resumes_exactly" and doc["exit_status"] == 0, doc
    assert doc["first_difference"] is None and doc["compared_epochs"] == 3
    # early, middle (the same epoch of 3) and last epochs, and the batch after the first mid-epoch checkpoint
    assert _points(doc) == [("_range_0", 1, None), ("_range_0", 2, None), ("_range_0", 0, 2)], doc["kills"]
    assert [k["resumed_at_epoch"] for k in doc["kills"]] == [1, 2, 0], doc["kills"]
    assert [k["resumed_mid_epoch"] for k in doc["kills"]] == [False, False, True], doc["kills"]
    assert [r["name"] for r in doc["runs"]] == ["reference", "repeat", "killed-1", "killed-2", "killed-3"]
    assert "run 1/5 took" in proc.stderr and "the check needs about" in proc.stderr, proc.stderr
    assert "killed (SIGKILL) at epoch 0, batch 2 of range _range_0" in proc.stderr, proc.stderr
    # the step count is a tracked acp.Counter, the batches go through paddle_acp.resumable, and an open
    # log file is not training state: nothing to report
    assert doc["state_not_captured"] == {"scalars": [], "objects": []}, doc
    # every process it started ended with it (the script's background child too), its directory is gone
    assert len(pids) == 16, pids  # 8 processes (a killed run is two), each with its background child
    time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], pids
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("paddle-acp-check-")] == []


def test_same_verdict_and_kill_point_under_load(busy):
    """The default representative of the load variants (all known answers: test_known_answers_under_load):
    a kill one batch after a mid-epoch checkpoint, the most timing-sensitive point, on a loaded machine."""
    proc, doc = run_check(sys.executable, SCRIPT, "--resumable", "--save-every-steps", "2", *FAST, kill_at=["1:3"])
    assert proc.returncode == 0, _why(proc)
    assert [(k["epoch"], k["step"], k["resumed_at_epoch"], k["resumed_mid_epoch"]) for k in doc["kills"]] == [
        (1, 3, 1, True)], doc["kills"]


def test_unseeded_script_is_not_deterministic():
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", "unseeded", *FAST)
    assert proc.returncode == 1, _why(proc)
    assert doc["verdict"] == "not_deterministic", doc
    d = doc["first_difference"]
    assert d["epoch"] == 0 and d["range"] == "_range_0" and d["rank"] == 0, d
    assert {"w", "b"} <= set(d["tensors"]) and d["fetched"] == ["fetch[0]"], d
    assert [r["name"] for r in doc["runs"]] == ["reference", "repeat"]  # no kill run: it would prove nothing


def test_counter_feeding_the_learning_rate_resumes_differently():
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", "counter", *FAST)
    assert proc.returncode == 2, _why(proc)
    assert doc["verdict"] == "resumes_differently", doc
    d = doc["first_difference"]
    assert doc["kills"][0]["epoch"] == 1 and len(doc["kills"]) == 1, doc["kills"]  # stops at the first difference
    assert d["epoch"] == 1 and {"w", "b"} <= set(d["tensors"]), doc
    scalars = {s["name"]: s for s in doc["state_not_captured"]["scalars"]}
    c = scalars["step_count"]
    assert c["type"] == "int" and c["after_restart"] < c["expected"], c
    assert "acp.Counter(0)" in c["fix"] and "acp.track('step_count', step_count)" in c["fix"], c
    objects = {o["name"]: o["type"] for o in doc["state_not_captured"]["objects"]}
    assert objects == {"noise_ids": "counter (itertools.count): itertools.count"}, objects


def test_reset_counter_behind_a_later_milestone_is_not_green():
    """The checked epochs train alike, but the restart reset the counter that switches the LR later."""
    proc, _ = run_check(sys.executable, SCRIPT, "--mode", "milestone", *FAST, json_out=False, kill_at=["2"])
    assert proc.returncode == 4, _why(proc)
    assert proc.stdout.startswith("state not restored:"), proc.stdout
    assert "step_count (int)" in proc.stdout and "fix: hold it in acp.Counter(0)" in proc.stdout, proc.stdout


def test_reset_counter_in_an_object_of_the_script_is_not_green():
    """The same milestone, its counter an attribute of the script's own object (``warm.n``): once green."""
    proc, _ = run_check(sys.executable, SCRIPT, "--mode", "milestone_object", *FAST, json_out=False, kill_at=["2"])
    assert proc.returncode == 4, _why(proc)
    assert proc.stdout.startswith("state not restored:"), proc.stdout
    assert "warm.n (int)" in proc.stdout and "acp.track('warm.n', warm.n)" in proc.stdout, proc.stdout


def test_early_stopping_in_locals_is_caught_by_the_kill_in_the_last_epoch():
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", "early_stop", *FAST, epochs=6)
    assert proc.returncode == 2, _why(proc)
    # the script stops after epoch 2; killed in epoch 1 it resumes exactly, killed in epoch 2 it trains on
    assert _points(doc) == [("_range_0", 1, None), ("_range_0", 2, None)], doc["kills"]
    assert [k["identical"] for k in doc["kills"]] == [True, False], doc["kills"]
    d = doc["first_difference"]
    assert d["epoch"] == 2 and d["missing"] == ("the loop was left inside epoch 2 of range _range_0 (break, return or an "
                                                "exception) in the uninterrupted run only"), d
    scalars = {s["name"]: (s["expected"], s["after_restart"]) for s in doc["state_not_captured"]["scalars"]}
    assert scalars == {"train().patience": (1, 0), "train().best": (4.0, 4.5)}, doc["state_not_captured"]


@pytest.mark.parametrize("mode", ["spawn", "rebind"])
def test_captured_rng_patterns_resume_exactly(mode):
    """Known answers that depend on paddle_acp.runtime.capture (Generator.spawn's counter, a captured
    name rebound after the range opened)."""
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", mode, *FAST, kill_at=["2"])
    assert proc.returncode == 0, _why(proc)
    assert doc["verdict"] == "resumes_exactly", doc


@pytest.mark.long
@pytest.mark.parametrize("mode,expected", [("resumable", 0), ("unseeded", 1), ("counter", 2), ("milestone", 4),
                                           ("early_stop", 2), ("spawn", 0), ("rebind", 0)])
def test_known_answers_under_load(mode, expected, busy):
    extra = ["--resumable", "--save-every-steps", "2"] if mode == "resumable" else []
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", mode, *extra, *FAST, epochs=6 if mode == "early_stop" else 3)
    assert proc.returncode == expected, _why(proc)


# -- where it kills ----------------------------------------------------------------------------
@pytest.mark.long  # on demand (bash ci/test.sh --long): ~12 s; the default kill points stay in the default run
def test_kill_at_chosen_points_is_reported():
    proc, doc = run_check(sys.executable, SCRIPT, "--resumable", "--save-every-steps", "2", *FAST,
                          kill_at=["2", "1:3"], json_out=True)
    assert proc.returncode == 0, _why(proc)
    assert _points(doc) == [("_range_0", 2, None), ("_range_0", 1, 3)], doc["kills"]
    # batch 3 of epoch 1: after the mid-epoch checkpoint at batch 2, resumed there
    assert doc["kills"][1]["resumed_at_epoch"] == 1 and doc["kills"][1]["resumed_mid_epoch"] is True
    proc, _ = run_check(sys.executable, SCRIPT, *FAST, kill_at=["7"])
    assert proc.returncode == 3 and "--kill-at 7: the first run never started epoch 7" in proc.stderr, _why(proc)
    proc, _ = run_check(sys.executable, SCRIPT, *FAST, kill_at=["x:1"])
    assert proc.returncode == 3 and "--kill-at 'x:1': EPOCH or EPOCH:STEP" in proc.stderr, _why(proc)


def test_runtime_kills_itself_after_the_checkpoint_before_the_point(tmp_path):
    """PADDLE_ACP_CHECK_KILL_AT: the process dies by its own SIGKILL in batch 3 of epoch 1, after the
    mid-epoch checkpoint at batch 2 committed: the restart resumes there."""
    digests = tmp_path / "d.jsonl"
    env = script_env(tmp_path / "ckpt", env={"PADDLE_ACP_CHECK_DIGESTS": str(digests),
                                             "PADDLE_ACP_CHECK_KILL_AT": "1:3@_range_0", "PADDLE_ACP_CHECK_EPOCHS": "3",
                                             "PADDLE_ACP_BUSY_POLICY": "wait"})
    cmd = [sys.executable, SCRIPT, "--resumable", "--save-every-steps", "2", *FAST]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stdout[-3000:]
    recs = report.read_records(str(digests))
    kill = [r for r in recs if r["kind"] == "kill"]
    assert [(k["epoch"], k["step"]) for k in kill] == [(1, 3)], recs
    assert [(r["epoch"], r["step"]) for r in recs if r["kind"] == "save"] == [(0, 2), (1, 2)], recs
    env.pop("PADDLE_ACP_CHECK_KILL_AT")
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    starts = [r for r in report.read_records(str(digests)) if r["kind"] == "start"][len([r for r in recs if r["kind"] == "start"]):]
    assert (starts[0]["epoch"], starts[0]["resumed_mid_epoch"]) == (1, True), starts


# -- the job's own location --------------------------------------------------------------------
def test_runner_options_never_reach_the_jobs_location(tmp_path):
    prod = tmp_path / "prod"
    proc, doc = run_check(sys.executable, "-m", "paddle_acp", "run", "--checkpoint", str(prod), "--job-id", "prod",
                          "--interval=600", SCRIPT, "--mode", "paddle_api", *FAST, kill_at=["2"])
    assert proc.returncode == 0, _why(proc)
    assert doc["verdict"] == "resumes_exactly", doc
    assert [n.split(" ")[1] for n in doc["notes"]] == ["--checkpoint", "--job-id", "--interval"], doc["notes"]
    assert str(prod) not in proc.stderr and not prod.exists()
    # a wrapper the check cannot see into: the runner itself ignores the options under the check
    proc, doc = run_check("sh", "-c", f'exec "{sys.executable}" -m paddle_acp run --checkpoint "{prod}" --job-id prod '
                          f'"{SCRIPT}" --mode paddle_api ' + " ".join(FAST), kill_at=["1"], epochs=2)
    assert proc.returncode == 0, _why(proc)
    assert not prod.exists()


def test_strip_runner_options():
    cmd = ["python", "-m", "paddle_acp", "run", "--checkpoint", "s3://b/p?k=secret", "--job-id=prod", "--interval",
           "60", "train.py", "--checkpoint", "mine"]
    out, removed = strip_runner_options(cmd)
    assert out == ["python", "-m", "paddle_acp", "run", "train.py", "--checkpoint", "mine"]  # the script's own stay
    assert removed == ["--checkpoint", "--job-id", "--interval"]
    assert strip_runner_options(["/usr/bin/paddle-acp", "run", "--checkpoint", "x", "t.py"]) == (
        ["/usr/bin/paddle-acp", "run", "t.py"], ["--checkpoint"])
    assert strip_runner_options(["python", "train.py", "run", "--checkpoint", "x"]) == (
        ["python", "train.py", "run", "--checkpoint", "x"], [])
    # abbreviated as argparse takes them
    assert strip_runner_options(["paddle-acp", "run", "--check", "s3://K:S@b/p", "--job=j", "--i", "5", "t.py"]) == (
        ["paddle-acp", "run", "t.py"], ["--checkpoint", "--job-id", "--interval"])


def test_the_checked_command_is_shown_redacted(tmp_path):
    """stderr's "run 1 (...): CMD" and the JSON report's "command": no URI's user info or credential query."""
    secrets = ("ChkS3cret1", "Chk/S3cret2", "ChkS3cret3", "ChkS3cret4", "ChkS3cret5")
    args = ["--data", "s3://AKID:ChkS3cret1@bucket/data", "--out=hdfs://u:Chk/S3cret2@nn/p",
            "s3://b/p?scheme=http;secret_key=ChkS3cret3", "root:ChkS3cret4@etcd:2379", "--password", "ChkS3cret5"]
    proc, _ = run_check(sys.executable, "-c", "print('no training here')", *args)
    assert proc.returncode == 3 and "run 1 (uninterrupted" in proc.stderr, _why(proc)
    assert not any(s in proc.stderr + proc.stdout for s in secrets), proc.stderr
    assert "s3://bucket/data --out=hdfs://nn/p s3://b/p ***@etcd:2379 --password ***" in proc.stderr, proc.stderr
    res = report.CheckResult(["python", "t.py", *args], 2, report.RESUMES_EXACTLY, [], None, [], [], 0)
    shown = json.dumps(report.to_json(res))
    assert not any(s in shown for s in secrets) and "s3://bucket/data" in shown, shown


# -- Ctrl-C and SIGTERM ------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_check_ends_its_runs_and_removes_its_directory(tmp_path, sig):
    pids = tmp_path / "pids"
    check = subprocess.Popen(
        [sys.executable, "-m", "paddle_acp", "check", "--", sys.executable, SCRIPT, "--sleep", "0.5",
         "--background-child", "--pid-file", str(pids)],
        env=script_env(ir="pir", env={"TMPDIR": str(tmp_path)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < 2):
        time.sleep(0.05)
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 2 and all(_alive(p) for p in started), started
    check.send_signal(sig)
    out, err = check.communicate(timeout=60)
    assert check.returncode == 128 + sig, (check.returncode, err[-3000:])
    assert "interrupted" in err and "every process it started was ended" in err, err[-3000:]
    time.sleep(0.2)
    assert not [p for p in started if _alive(p)], started
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("paddle-acp-check-")] == []


# -- two ranks ---------------------------------------------------------------------------------
def test_two_rank_job_compared_per_rank():
    proc, doc = run_check(sys.executable, RANKS, *FAST, kill_at=["1"], epochs=2)
    assert proc.returncode == 0, _why(proc)
    assert doc["verdict"] == "resumes_exactly" and doc["compared_epochs"] == 4, doc  # 2 epochs of each rank
    assert [r["ranks"] for r in doc["runs"]] == [2, 2, 2], doc["runs"]


# -- the other failures ------------------------------------------------------------------------
def test_failing_or_rangeless_command_cannot_be_checked(tmp_path):
    proc, doc = run_check(sys.executable, "-c", "import sys; sys.exit(5)")
    assert proc.returncode == 3 and doc is None, _why(proc)
    assert "the reference run failed with exit status 5" in proc.stderr
    proc, _ = run_check(sys.executable, "-c", "print('no training here')")
    assert proc.returncode == 3 and "ran no epoch of a paddle-acp range" in proc.stderr, _why(proc)
    proc, _ = run_check(sys.executable, SCRIPT, epochs=1)
    assert proc.returncode == 3 and "--epochs 1: at least 2" in proc.stderr, _why(proc)


def test_check_variables_are_validated():
    assert config.check_epochs_from_env({}) is None
    assert config.check_epochs_from_env({"PADDLE_ACP_CHECK_EPOCHS": "4"}) == 4
    for bad in ("0", "-1", "two", "1.5", "１"):  # ASCII digits only
        with pytest.raises(ConfigError, match="PADDLE_ACP_CHECK_EPOCHS"):
            config.check_epochs_from_env({"PADDLE_ACP_CHECK_EPOCHS": bad})
    assert config.check_digests_from_env({"PADDLE_ACP_CHECK_DIGESTS": "/x/d.jsonl"}) == "/x/d.jsonl"
    assert config.check_kill_at_from_env({}) is None
    assert config.check_kill_at_from_env({"PADDLE_ACP_CHECK_KILL_AT": "3@_range_0"}) == ("_range_0", 3, None)
    assert config.check_kill_at_from_env({"PADDLE_ACP_CHECK_KILL_AT": "1:4@my@range"}) == ("my@range", 1, 4)
    for bad in ("3", "@r", "a@r", "1:2:3@r", "-1@r", "1:@r", "１@r"):
        with pytest.raises(ConfigError, match="PADDLE_ACP_CHECK_KILL_AT"):
            config.check_kill_at_from_env({"PADDLE_ACP_CHECK_KILL_AT": bad})
    assert "PADDLE_ACP_CHECK_KILL_AT" in config.ENV_VARS
    assert parse_kill_at("3") == (3, None) and parse_kill_at("0:5") == (0, 5)
    for bad in ("", "-1", "1:", "a", "1:2:3"):
        with pytest.raises(ToolError, match="--kill-at"):
            parse_kill_at(bad)


def test_default_kill_points():
    def starts(*keys):
        return [{"kind": "start", "range": r, "epoch": e} for r, e in keys]

    ten = starts(*[("_range_0", e) for e in range(10)])
    assert kill_points(ten, []) == [("_range_0", 1, None), ("_range_0", 5, None), ("_range_0", 9, None)]
    saves = [{"kind": "save", "range": "_range_0", "epoch": 0, "step": 4}]
    assert kill_points(starts(("_range_0", 0), ("_range_0", 1)) + saves, []) == [
        ("_range_0", 1, None), ("_range_0", 0, 4)]
    two = starts(("a", 0), ("a", 1), ("b", 0), ("b", 1))
    assert kill_points(two, []) == [("a", 1, None), ("b", 0, None), ("b", 1, None)]
    assert kill_points(two, [(1, 2), (0, None)]) == [("a", 1, 2), ("a", 0, None)]
    assert kill_points(starts(("a", 0)), []) == [("a", 0, None)]


# -- the digest files (a serialized format: one JSON object a line, one file per rank) -----------
_digests = st.dictionaries(st.sampled_from(["w", "b", "m/w", "fetch[0]"]), st.text("0123456789abcdef", min_size=16, max_size=16))
_record = st.fixed_dictionaries({
    "kind": st.sampled_from(["start", "epoch", "save", "kill"]), "range": st.sampled_from(["_range_0", "_range_1"]),
    "epoch": st.integers(0, 5), "tensors": _digests, "fetched": _digests, "resumed_mid_epoch": st.booleans()})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.integers(0, 3), st.lists(_record, max_size=8), max_size=3), st.integers(0, 40))
def test_digest_records_read_back_per_rank_and_a_torn_line_is_dropped(tmp_path_factory, ranks, cut):
    base = tmp_path_factory.mktemp("d") / "run.jsonl"
    torn = json.dumps({"kind": "epoch", "range": "_range_0", "epoch": 9})
    for rank, records in ranks.items():
        path = base if rank == 0 else base.parent / f"run.jsonl.rank{rank}"
        path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn[:cut])  # a kill mid-line
    (base.parent / "run.jsonl.rankx").write_text(torn + "\n")  # not a rank's file
    got = report.read_ranks(str(base))
    whole = [json.loads(torn)] if cut >= len(torn) else []
    assert got == {rank: recs + whole for rank, recs in ranks.items() if recs + whole}
    for records in got.values():
        last = {}
        for r in records:
            if r["kind"] == "epoch":
                last[(r["range"], r["epoch"])] = r
        assert report.epochs_of(records) == last
    epochs = report.rank_epochs(got)
    assert report.first_rank_difference(epochs, epochs, "a", "b") is None


def test_differences_are_found_per_rank():
    a = {0: {("_range_0", 0): {"tensors": {"w": "1"}}}, 1: {("_range_0", 0): {"tensors": {"w": "2"}}}}
    b = {0: {("_range_0", 0): {"tensors": {"w": "1"}}}, 1: {("_range_0", 0): {"tensors": {"w": "3"}}}}
    d = report.first_rank_difference(a, b, "first", "second")
    assert (d.rank, d.epoch, d.tensors) == (1, 0, ["w"])
    d = report.first_rank_difference(a, {0: a[0]}, "first", "second")
    assert d.rank == 1 and d.missing == "rank 1 wrote no digests in the second run"


def test_first_difference_ignores_fetches_of_a_mid_epoch_resume():
    a = {("_range_0", 0): {"tensors": {"w": "1"}, "fetched": {"loss": "x"}}}
    b = {("_range_0", 0): {"tensors": {"w": "1"}, "fetched": {"loss": "y"}, "resumed_mid_epoch": True}}
    assert report.first_difference(a, b, "a", "b") is None
    b[("_range_0", 0)]["tensors"] = {"w": "2"}
    assert report.first_difference(a, b, "a", "b").tensors == ["w"]
    d = report.first_difference(a, {}, "uninterrupted", "killed")
    assert d.missing == "epoch 0 of range _range_0 never ended in the killed run"


def test_uncaptured_kind_names_state_paddle_acp_does_not_checkpoint(tmp_path):
    import io
    import itertools
    import random

    import numpy as np

    from paddle_acp.runtime.digests import uncaptured_kind

    # RNG objects the script holds are captured (paddle_acp.runtime.capture): not reported
    for captured in (random.Random(1), np.random.RandomState(1), np.random.default_rng(1)):
        assert uncaptured_kind(captured) is None, captured
    assert uncaptured_kind(random.SystemRandom()) == "RNG object (random.SystemRandom)"  # no state to capture
    assert uncaptured_kind(x for x in range(3)) == "generator"
    assert uncaptured_kind(iter([1, 2])) == "iterator"
    assert uncaptured_kind(itertools.count()) == "counter (itertools.count)"
    # the global RNGs paddle-acp checkpoints, plain values and containers are not reported
    for captured in (random._inst, np.random.mtrand._rand, 3, 2.5, True, [1], {"a": 1}, range(3), "text", None):
        assert uncaptured_kind(captured) is None, captured
    # files (a log the script writes, a file it reads) iterate their lines but are not training state
    with open(tmp_path / "log.txt", "w") as text, open(tmp_path / "log.txt", "rb") as raw:
        for f in (text, raw, io.StringIO("a\nb"), io.BytesIO(b"x")):
            assert uncaptured_kind(f) is None, f
    # outside a range resumable() is iter(): the script's own iterator (inside one, paddle-acp's
    # generator is not reported: test_resumable_script_resumes_exactly_at_every_kill_point)
    import paddle_acp

    assert uncaptured_kind(paddle_acp.resumable([1, 2])) == "iterator"


def test_text_report_names_each_finding_and_its_fix():
    scalars = [{"name": "step_count", "type": "int", "epoch": 1, "range": "_range_0", "rank": 0, "expected": 10,
                "after_restart": 5, "fix": report._fix_number("step_count", 10)}]
    objects = [{"name": "noise_ids", "type": "counter (itertools.count): itertools.count",
                "fix": report.fix_for_object("counter (itertools.count)")}]
    kill = {"range": "_range_0", "epoch": 1, "step": None, "resumed_at_epoch": 1}
    runs = [{"name": "reference", "seconds": 1.0, "returncode": 0}]
    res = report.CheckResult(["python", "t.py"], 3, report.STATE_NOT_RESTORED, runs, None, scalars, objects, 3, [kill],
                             ["removed --checkpoint (and its value) from the paddle-acp run command: ..."])
    text = report.render(res)
    assert res.exit_status == 4 and text.startswith("state not restored: the 3 epoch ends compared are identical after "
                                                    "a SIGKILL at each of: epoch 1 of range _range_0 (resumed at epoch 1)")
    assert "step_count (int): 10 at the end of epoch 1 uninterrupted, 5 after the restart" in text, text
    assert "fix: hold it in acp.Counter(0)" in text and "acp.track('step_count', step_count)" in text, text
    assert "noise_ids: counter (itertools.count)" in text and "fix: use acp.Counter()" in text, text
    assert "note: removed --checkpoint" in text
    res.verdict, res.difference = report.RESUMES_DIFFERENTLY, report.Difference("_range_0", 1, ["w"], [], rank=1)
    text = report.render(res)
    assert text.startswith("resumes differently: after a SIGKILL at epoch 1 of range _range_0 (resumed at epoch 1)")
    assert "first difference: epoch 1 of range _range_0 on rank 1" in text and "tensors: w" in text, text
    res.verdict, res.scalars, res.uncaptured, res.kills[0]["step"] = report.RESUMES_EXACTLY, [], [], 3
    text = report.render(res)
    assert text.startswith("resumes exactly: 3 epoch ends identical in every run, after a SIGKILL at each of: epoch 1, "
                           "batch 3 of range _range_0"), text


def test_report_fixes_name_the_object():
    assert "acp.track('step', step)" in report._fix_number("step", 3)
    assert "state={'best': best}" in report._fix_number("train().best", 0.5) and "acp.Value(0.5)" in report._fix_number("train().best", 0.5)
    assert "acp.Counter()" in report.fix_for_object("counter (itertools.count)")
    assert "acp.resumable" in report.fix_for_object("iterator") and "default_rng" in report.fix_for_object("RNG object (x)")
