"""`paddle-acp stats` after a SIGKILL agrees with the committed checkpoints.

Metrics lines were buffered up to 10 s on every storage: a job killed after 8 committed
checkpoints showed "4 save(s)". On a local disk each line is now written when its checkpoint
commits; elsewhere (S3 here: an append is a rewrite of the object) lines stay batched, and
stats counts the committed checkpoints a kill left without a line and says so.
"""
import json
import os
import signal
import subprocess
import sys
import uuid

from support.e2e import JOB_ID, REPO, describe, is_done, run_script, script_env
from support.newest import committed as committed_names
from support.server_fixtures import s3_server  # noqa: F401  (fixture)

from paddle_acp.storage import open_storage

KEEP_ALL = {"PADDLE_ACP_MAX_TO_KEEP": 1000, "PADDLE_ACP_BUSY_POLICY": "wait"}
ARGS = ("--epochs", 12, "--steps-per-epoch", 1)


def _stats(uri, env):
    p = subprocess.run([sys.executable, "-m", "paddle_acp", "stats", uri, "--job", JOB_ID, "--json"], cwd=REPO,
                       env=script_env(None, "pir", env), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout)


def _text(uri, env):
    p = subprocess.run([sys.executable, "-m", "paddle_acp", "stats", uri, "--job", JOB_ID], cwd=REPO,
                       env=script_env(None, "pir", env), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _committed(uri, env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    return committed_names(open_storage(uri), JOB_ID, "_range_0")  # names, oldest first (ckpt-e{E}: epoch E's)


def test_stats_on_a_local_disk_counts_every_committed_checkpoint_after_a_kill(tmp_path, monkeypatch):
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    p1 = run_script(out, ckpt, "pir", *ARGS, "--kill-at-epoch", 8, env=KEEP_ALL)
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    committed = _committed(str(ckpt), {}, monkeypatch)
    assert len(committed) >= 7, committed
    s = _stats(str(ckpt), {})
    assert s["count"] == s["ok"] == len(committed), (s["count"], committed)
    assert s["unrecorded"] == 0
    assert f"{len(committed)} save(s)" in _text(str(ckpt), {})
    # the restart goes on and the figures still agree
    p2 = run_script(out, ckpt, "pir", *ARGS, "--kill-at-epoch", 8, env=KEEP_ALL)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    committed = _committed(str(ckpt), {}, monkeypatch)
    assert committed == [f"ckpt-e{e}" for e in range(12)], committed  # one per epoch (the killed one saved again)
    s = _stats(str(ckpt), {})
    assert (s["count"], s["restarts"], s["unrecorded"]) == (12, 1, 0), s


def test_stats_on_s3_says_how_many_committed_checkpoints_a_kill_left_unrecorded(s3_server, tmp_path, monkeypatch):  # noqa: F811
    uri, env = f"s3://{s3_server.bucket}/stats/{uuid.uuid4().hex[:8]}", dict(s3_server.client_env(), **KEEP_ALL)
    out = tmp_path / "out"
    p1 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", 8, env=env)
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    before = _committed(uri, env, monkeypatch)
    recorded = _stats(uri, env)["count"]
    p2 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", 8, env=env)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    assert len(_committed(uri, env, monkeypatch)) == 12
    assert before == [f"ckpt-e{e}" for e in range(len(before))]  # one process from scratch: epochs follow each other
    s = _stats(uri, env)
    lost = len(before) - recorded  # committed by the killed process, not recorded (its batch died with it)
    assert s["unrecorded"] == lost and s["count"] + s["unrecorded"] == 12, (s, before, recorded)
    text = _text(uri, env)
    if lost:
        assert f"note: a kill may have lost up to {lost} save record(s)" in text, text
    else:
        assert "may have lost" not in text, text
    assert os.environ.get("PADDLE_ACP_CHECKPOINT_URI") is None
