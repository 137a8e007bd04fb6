"""The stager seam (issue 44 item 5): a save's copy into the snapshot arena and a restore's copy into the
scope's tensors go through the same stager, the range's (``format/engine/stager.py``: ``HostStager``
today; a device stager would plug in there).

Real training processes (tests/scripts/stager_count.py) on a real local location wrap the range's stager
in a counting one: a first process trains and saves, a second restores and trains on. Within the default
budget a save copies into the arena in one call and the restore copies out of the lent arena; under a
16 MiB budget each save streams its chunks through the stager and the restore copies out of the mapped file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import INSTALLED, REPO, script_env  # noqa: E402

SCRIPT = os.path.join(REPO, "tests", "scripts", "stager_count.py")


def run(tmp_path, ckpt, epochs, width, env, name):
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--epochs", str(epochs), "--width", str(width)],
                          env=script_env(ckpt, "pir", dict({"PADDLE_ACP_ASYNC": "1"}, **env)),
                          cwd=str(tmp_path) if INSTALLED else REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("width,env", [(512, {}), (2048, {"PADDLE_ACP_HOST_MEMORY": "16MiB"})],
                         ids=["arena", "streamed-16MiB"])
def test_save_and_restore_copy_through_the_ranges_stager(tmp_path, width, env):
    ckpt = tmp_path / "ckpt"
    first = run(tmp_path, ckpt, 2, width, env, "first")
    state = sum(n for _a, n in first["tensors"].values())
    assert state >= 3 * width * width * 4  # the weight and Adam's two moments, at least
    # every save (epochs 0 and 1) copied the whole state through the stager, nothing else did
    assert len(first["save"]) >= 2, first["save"]
    per_save = sum(sum(c) for c in first["save"]) / 2
    assert per_save >= state, (per_save, state)
    if env:  # streamed: several chunks per save, none over the budget
        assert len(first["save"]) > 2 and max(sum(c) for c in first["save"]) <= 16 << 20, first["save"]
    assert first["restore"] == [] and first["open"] == []  # a fresh start restores nothing

    second = run(tmp_path, ckpt, 3, width, env, "second")
    assert second["open"] == []  # the open verifies; nothing is copied into the scope before the first step
    restored = [tuple(pair) for call in second["restore"] for pair in call]
    # the restore copied into the scope's own tensors (in place: their addresses), each once, the whole state
    assert sorted(restored) == sorted(tuple(v) for v in second["tensors"].values()), (restored, second["tensors"])
    assert second["loss"] == first["final_loss"]  # the first step ran on exactly the state the first run ended with
    assert len(second["save"]) >= 1  # the resumed range's own save went through it too
