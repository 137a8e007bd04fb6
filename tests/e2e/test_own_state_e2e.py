"""The script's own state survives SIGKILL in the ways issue 41 found it did not: real processes.

``tests/scripts/own_state_script.py`` (its loop at module level, a checkpoint at every epoch,
synchronous saves) is SIGKILLed at the start of an epoch, so the previous epoch's checkpoint is
committed, restarted, and must end with the per-epoch noise, losses, final parameters and the
state the script holds of an uninterrupted run without the library:

* a captured ``Generator`` spawning a child each epoch, and a captured ``SeedSequence`` doing
  the same (the seed sequence's spawn count is saved and restored in place);
* a captured name rebound to another Generator in epoch 1 (saved as the name holds it at each save);
* ``state={"metrics": metrics}`` with ``hist = metrics["hist"]`` and ``acp.Value([])`` with
  ``lst = v.value`` (restored in place: the script's list is the restored one);
* 300 captured RNGs (more than paddle-acp 0.x saved: every save failed).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from support.e2e import REPO, script_env

SCRIPT = os.path.join(REPO, "tests", "scripts", "own_state_script.py")


def run(out, ckpt, *args, expect_kill=False):
    env = {"PADDLE_ACP_ASYNC": "0", "PADDLE_ACP_BUSY_POLICY": "wait"} if ckpt else {}
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(out), *map(str, args)], cwd=REPO,
                          env=script_env(ckpt, "pir", env), capture_output=True, text=True, timeout=300)
    want = -9 if expect_kill else 0
    assert proc.returncode == want, f"rc {proc.returncode} (want {want})\n{proc.stderr[-4000:]}"
    return proc.stderr


def result(out):
    epochs = {}
    with open(os.path.join(str(out), "epochs.jsonl")) as f:
        for line in f:
            e = json.loads(line)
            epochs[e["epoch"]] = (e["noise"], e["scale"], e["loss"])
    with np.load(os.path.join(str(out), "final.npz")) as z:
        params = {k: z[k].tobytes() for k in z.files}
    with open(os.path.join(str(out), "final.json")) as f:
        summary = json.load(f)
    return epochs, params, summary


def kill_and_compare(tmp_path, case, kill_at, *args):
    ref = tmp_path / "ref"
    run(ref, None, "--case", case, *args)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    killed = run(out, ckpt, "--case", case, "--kill-at", kill_at, *args, expect_kill=True)
    stderr = run(out, ckpt, "--case", case, "--kill-at", kill_at, *args)
    assert f"resuming at epoch {kill_at} from checkpoint" in stderr, stderr[-3000:]
    want, got = result(ref), result(out)
    differ = [e for e in sorted(want[0]) if got[0].get(e) != want[0][e]]
    assert not differ, f"epochs that differ from the uninterrupted run: {differ}\n{stderr[-3000:]}"
    assert got[1] == want[1], "final parameters differ"
    assert got[2] == want[2], f"final state differs: {got[2]} != {want[2]}"
    return killed + stderr, want


def test_a_generator_spawning_a_child_each_epoch_resumes_identically(tmp_path):
    _, want = kill_and_compare(tmp_path, "spawn", 3, "--epochs", 5)
    assert want[2]["children"] == 5


def test_a_seed_sequence_global_spawning_each_epoch_is_captured_and_resumes_identically(tmp_path):
    stderr, want = kill_and_compare(tmp_path, "seedseq", 3, "--epochs", 5)
    assert "module_global:ss (numpy.SeedSequence)" in stderr
    assert want[2]["children"] == 5


def test_a_captured_name_rebound_inside_the_loop_is_saved_as_it_holds_then(tmp_path):
    stderr, _ = kill_and_compare(tmp_path, "rebind", 2)
    # the killed run said, once, that the name holds another object than when the loop opened
    said = [line for line in stderr.splitlines() if "module_global:rng holds another" in line]
    assert len(said) == 1, stderr[-3000:]


@pytest.mark.parametrize("case", ["nested", "value"])
def test_containers_inside_registered_state_are_restored_in_place(tmp_path, case):
    _, want = kill_and_compare(tmp_path, case, 2)
    assert want[2]["hist_is_held"] is True


def test_more_than_256_captured_rngs_are_saved_and_restored(tmp_path):
    kill_and_compare(tmp_path, "many", 2, "--epochs", 3)
