"""``paddle-acp check -- CMD``: three real runs of a real training script (twice uninterrupted, once
SIGKILLed inside an epoch and restarted), and the verdict its report gives (exit status and --json).

The script is tests/scripts/check_script.py (tiny model, short epochs); each check runs it ~4 times.
"""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.e2e import script_env

from paddle_acp import config
from paddle_acp.errors import ConfigError
from paddle_acp.tools import check_report as report

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "scripts", "check_script.py")


def run_check(*cmd, json_out=True, epochs=3, cwd=None):
    args = [sys.executable, "-m", "paddle_acp", "check", "--epochs", str(epochs)]
    if json_out:
        args.append("--json")
    proc = subprocess.run(args + ["--"] + list(cmd), env=script_env(ir="pir"), cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    doc = json.loads(proc.stdout) if json_out and proc.stdout.strip().startswith("{") else None
    return proc, doc


def _why(proc):
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"


def test_resumable_script_resumes_exactly():
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", "resumable", "--resumable")
    assert proc.returncode == 0, _why(proc)
    assert doc["verdict"] == "resumes_exactly" and doc["exit_status"] == 0, doc
    assert doc["first_difference"] is None and doc["compared_epochs"] == 3
    names = [r["name"] for r in doc["runs"]]
    assert names == ["reference", "repeat", "killed"]
    killed = doc["runs"][2]
    # killed inside an epoch after the previous epoch's checkpoint: the restart re-runs that epoch
    assert 1 <= killed["killed_in_epoch"] <= 2 and killed["resumed_at_epoch"] == killed["killed_in_epoch"], killed
    # the progress lines and the wall-time estimate from the first run
    assert "run 1/3 took" in proc.stderr and "the check needs about" in proc.stderr, proc.stderr
    assert "killed (SIGKILL) in epoch" in proc.stderr
    # the script's own step counter restarts with the process: listed, though it does not steer training
    assert [s["name"] for s in doc["state_not_captured"]["scalars"]] == ["step_count"], doc
    # the batches go through paddle_acp.resumable: that generator's position is checkpointed, not reported
    assert doc["state_not_captured"]["objects"] == [], doc


def test_unseeded_script_is_not_deterministic():
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", "unseeded")
    assert proc.returncode == 1, _why(proc)
    assert doc["verdict"] == "not_deterministic", doc
    d = doc["first_difference"]
    assert d["epoch"] == 0 and d["range"] == "_range_0", d
    assert {"w", "b"} <= set(d["tensors"]) and d["fetched"] == ["fetch[0]"], d
    assert [r["name"] for r in doc["runs"]] == ["reference", "repeat"]  # no kill run: it would prove nothing


def test_counter_feeding_the_learning_rate_resumes_differently():
    proc, doc = run_check(sys.executable, SCRIPT, "--mode", "counter")
    assert proc.returncode == 2, _why(proc)
    assert doc["verdict"] == "resumes_differently", doc
    killed = doc["runs"][2]
    d = doc["first_difference"]
    assert d["epoch"] == killed["killed_in_epoch"] and {"w", "b"} <= set(d["tensors"]), doc
    scalars = {s["name"]: s for s in doc["state_not_captured"]["scalars"]}
    c = scalars["step_count"]
    assert c["type"] == "int" and c["after_restart"] < c["expected"], c
    objects = {o["name"]: o["type"] for o in doc["state_not_captured"]["objects"]}
    assert objects == {"noise_ids": "counter (itertools.count): itertools.count"}, objects


def test_text_report_names_the_counter():
    proc, _ = run_check(sys.executable, SCRIPT, "--mode", "counter", json_out=False)
    assert proc.returncode == 2, _why(proc)
    assert proc.stdout.startswith("resumes differently: after a kill in epoch"), proc.stdout
    assert "step_count (int)" in proc.stdout and "noise_ids: counter (itertools.count)" in proc.stdout, proc.stdout


def test_paddle_api_script_under_the_runner_resumes_exactly():
    proc, doc = run_check(sys.executable, "-m", "paddle_acp", "run", SCRIPT, "--mode", "paddle_api")
    assert proc.returncode == 0, _why(proc)
    assert doc["verdict"] == "resumes_exactly" and doc["compared_epochs"] == 3, doc


def test_failing_or_rangeless_command_cannot_be_checked(tmp_path):
    proc, doc = run_check(sys.executable, "-c", "import sys; sys.exit(5)")
    assert proc.returncode == 3 and doc is None, _why(proc)
    assert "the reference run failed with exit status 5" in proc.stderr
    proc, _ = run_check(sys.executable, "-c", "print('no training here')")
    assert proc.returncode == 3 and "ran no epoch of a paddle-acp range" in proc.stderr, _why(proc)
    proc, _ = run_check(sys.executable, SCRIPT, epochs=1)
    assert proc.returncode == 3 and "--epochs 1: at least 2" in proc.stderr, _why(proc)


def test_check_epochs_variable_is_validated():
    assert config.check_epochs_from_env({}) is None
    assert config.check_epochs_from_env({"PADDLE_ACP_CHECK_EPOCHS": "4"}) == 4
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ConfigError, match="PADDLE_ACP_CHECK_EPOCHS"):
            config.check_epochs_from_env({"PADDLE_ACP_CHECK_EPOCHS": bad})
    assert config.check_digests_from_env({"PADDLE_ACP_CHECK_DIGESTS": "/x/d.jsonl"}) == "/x/d.jsonl"


# -- the digest file (a serialized format: one JSON object a line) -------------------------------
_digests = st.dictionaries(st.sampled_from(["w", "b", "m/w", "fetch[0]"]), st.text("0123456789abcdef", min_size=16, max_size=16))
_record = st.fixed_dictionaries({
    "kind": st.sampled_from(["start", "epoch"]), "range": st.sampled_from(["_range_0", "_range_1"]),
    "epoch": st.integers(0, 5), "tensors": _digests, "fetched": _digests, "resumed_mid_epoch": st.booleans()})


@settings(max_examples=60, deadline=None)
@given(st.lists(_record, max_size=12), st.integers(0, 40))
def test_digest_records_read_back_and_a_torn_line_is_dropped(tmp_path_factory, records, cut):
    path = tmp_path_factory.mktemp("d") / "run.jsonl"
    text = "".join(json.dumps(r) + "\n" for r in records)
    torn = json.dumps({"kind": "epoch", "range": "_range_0", "epoch": 9})
    path.write_text(text + torn[:cut])  # a kill while the last line was written
    got = report.read_records(str(path))
    assert got == records + ([json.loads(torn)] if cut >= len(torn) else [])
    last = {}
    for r in records:
        if r["kind"] == "epoch":
            last[(r["range"], r["epoch"])] = r
    assert report.epochs_of(records) == last
    assert report.first_difference(last, last, "a", "b") is None


def test_first_difference_ignores_fetches_of_a_mid_epoch_resume():
    a = {("_range_0", 0): {"tensors": {"w": "1"}, "fetched": {"loss": "x"}}}
    b = {("_range_0", 0): {"tensors": {"w": "1"}, "fetched": {"loss": "y"}, "resumed_mid_epoch": True}}
    assert report.first_difference(a, b, "a", "b") is None
    b[("_range_0", 0)]["tensors"] = {"w": "2"}
    assert report.first_difference(a, b, "a", "b").tensors == ["w"]
    d = report.first_difference(a, {}, "uninterrupted", "killed")
    assert d.missing == "epoch 0 of range _range_0 never ended in the killed run"


def test_uncaptured_kind_names_state_paddle_acp_does_not_checkpoint():
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
    # outside a range resumable() is iter(): the script's own iterator (inside one, paddle-acp's
    # generator is not reported: test_resumable_script_resumes_exactly)
    import paddle_acp

    assert uncaptured_kind(paddle_acp.resumable([1, 2])) == "iterator"
