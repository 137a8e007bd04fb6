"""End-to-end kill-and-resume against REAL remote storage: HDFS and S3, both IRs.

The training script (tests/scripts/train_script.py) checkpoints every epoch to
``PADDLE_ACP_CHECKPOINT_URI`` = ``hdfs://127.0.0.1:PORT/...`` (default client:
pyarrow/libhdfs, JVM in the training process) or ``s3://bucket/...`` (SeaweedFS),
SIGKILLs itself at the start of an epoch, and is run again: the rerun must
resume from the remote checkpoint and end bit-identical to an uninterrupted run
without the library. Servers: tests/support/servers.py via tests/support/server_fixtures.py
(skipped with the reason when they cannot be prepared here).
"""
from __future__ import annotations

import os
import signal
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import JOB_ID, check_restart_log, compare_results, describe, is_done, load_result, read_log, run_script  # noqa: E402
from support.newest import committed as committed_names  # noqa: E402
from support.newest import load_as_restart, reader  # noqa: E402
from support.server_fixtures import hdfs_server, s3_server  # noqa: E402,F401  (fixtures)

from paddle_acp.format.layout import parse_name  # noqa: E402
from paddle_acp.storage import open_storage  # noqa: E402

EPOCHS, KILL_AT = 4, 2
ARGS = ("--epochs", EPOCHS, "--steps-per-epoch", 3)

@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cache = {}

    def get(ir):
        if ir not in cache:
            out = tmp_path_factory.mktemp(f"ref-{ir}")
            proc = run_script(out, None, ir, *ARGS)
            assert proc.returncode == 0 and is_done(out), describe(proc)
            cache[ir] = load_result(out)
        return cache[ir]

    return get


def remote(request, kind):
    """(checkpoint URI, extra environment for the training process)."""
    tag = uuid.uuid4().hex[:8]
    if kind == "hdfs":
        srv = request.getfixturevalue("hdfs_server")
        return f"{srv.uri}/e2e/{tag}", srv.client_env()
    srv = request.getfixturevalue("s3_server")
    return f"s3://{srv.bucket}/e2e/{tag}", srv.client_env()


@pytest.mark.parametrize("ir", ["pir", "legacy"])
@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_kill_and_resume_on_remote_storage(kind, ir, reference, request, tmp_path, monkeypatch):
    uri, env = remote(request, kind)
    # every epoch's checkpoint taken (ckpt-e{E} for every epoch E): the `wait` busy policy;
    # the default `skip` policy on HDFS is tested in tests/e2e/test_busy_policy.py
    env = dict(env, PADDLE_ACP_BUSY_POLICY="wait")
    out = tmp_path / "out"
    p1 = run_script(out, uri, ir, *ARGS, "--kill-at-epoch", KILL_AT, env=env)
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    assert not is_done(out), describe(p1)
    if kind == "hdfs":
        assert "using the pyarrow client" in p1.stderr, describe(p1)

    # What the killed run left on the server. Saves are asynchronous: the save
    # submitted at the end of epoch KILL_AT-1 may still have been in flight when
    # the process killed itself (a remote write takes a while), and is then lost
    # whole: the last committed checkpoint is epoch KILL_AT-1 or KILL_AT-2.
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    st = open_storage(uri)
    committed = committed_names(st, JOB_ID, "_range_0")  # ckpt-e{E}: the checkpoint of epoch E
    assert committed and committed[-1] in (f"ckpt-e{KILL_AT - 2}", f"ckpt-e{KILL_AT - 1}"), committed
    resume_at = parse_name(committed[-1])[0] + 1

    p2 = run_script(out, uri, ir, *ARGS, "--kill-at-epoch", KILL_AT, env=env)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    assert f"resumed at epoch {resume_at}" in p2.stdout, describe(p2)
    problems = compare_results(load_result(out), reference(ir))
    log_problems, rewinds = check_restart_log(read_log(out), EPOCHS)
    problems += log_problems
    if rewinds != [KILL_AT - resume_at]:
        problems.append(f"rerun started {rewinds} epochs back, expected {[KILL_AT - resume_at]}")
    assert not problems, "\n".join(problems) + "\n" + describe(p2)
    # the last epoch is always saved: the final state is on the server too
    assert load_as_restart(reader(st, JOB_ID, "_range_0")).manifest.range.epoch_no == EPOCHS - 1
