"""Credentials never leak, connection attempts are bounded, and a storage outage is reported
one line per failed save (issue 19, items 13, 15 and 19).

A unique secret is planted in every form a URI or variable can carry one: S3 user info (with the
endpoint from AWS_ENDPOINT_URL, and in pyarrow's own query form), an S3 query secret_key, HDFS user
info, file:// user info, and PaddleCloud's PADDLE_EDL_HDFS_UGI password. Real training processes
and every ``paddle-acp`` tool command run with it, against a real S3 server whose secret key IS the
planted secret (so the runs that should work do work), against ports where nothing listens, and
against a server stopped mid-run; their stdout and stderr, every file under the checkpoint root,
the metrics and the exported files are searched for it.

Cost: ~14 processes that import Paddle (~3-5 s each on the CI machine) and one S3 server start.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import REPO, describe, read_log, script_cmd, script_env  # noqa: E402
from support.server_fixtures import _discard, _start, hdfs_server, servers  # noqa: E402,F401  (fixtures)

SECRET = "Pl4ntedS3cr3t" + uuid.uuid4().hex[:12]
ACCESS = "plantedaccess"


def dead_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def s3_planted():
    """A real S3 server whose secret key is the planted secret."""
    srv = _start(servers.S3Server(access_key=ACCESS, secret_key=SECRET))
    try:
        yield srv
    finally:
        _discard(srv)


def s3_env(srv, creds_in_env=False):
    """The S3 server's endpoint in the environment; its credentials only with ``creds_in_env``."""
    env = dict(srv.client_env())
    if not creds_in_env:
        env["AWS_ACCESS_KEY_ID"] = env["AWS_SECRET_ACCESS_KEY"] = None
    return env


def _texts_of_tree(root):
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                yield p, fh.read()


def _stored(srv, prefix):
    """(path, bytes) of every object under ``prefix`` in the server's bucket."""
    import pyarrow.fs as pafs

    fs = srv.filesystem()
    infos = fs.get_file_info(pafs.FileSelector(f"{srv.bucket}/{prefix}", recursive=True, allow_not_found=True))
    out = []
    for info in infos:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                out.append((info.path, f.read()))
    return out


def assert_no_secret(what, *texts, secret=SECRET):
    for t in texts:
        data = t if isinstance(t, bytes) else str(t).encode()
        assert secret.encode() not in data, f"{what}: the secret leaked:\n{data.decode('utf-8', 'replace')[-3000:]}"


def train(out, uri, env, *args, timeout=300):
    e = dict(env)
    e.setdefault("PADDLE_ACP_LOG_LEVEL", "DEBUG")
    e.setdefault("PADDLE_ACP_BUSY_POLICY", "wait")  # a checkpoint per epoch: ckpt-0..2, which the tools read
    cmd = script_cmd(out, uri, "--epochs", 3, "--steps-per-epoch", 1, *args)
    proc = subprocess.run(cmd, env=script_env(uri, "pir", e), cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)
    assert_no_secret(f"training run on {uri!r}", proc.stdout, proc.stderr)
    for path, data in _texts_of_tree(out):
        assert_no_secret(path, data)
    return proc


def tool(*args, env=None, timeout=300):
    e = script_env(None, "pir", dict(env or {}, PADDLE_ACP_LOG_LEVEL="DEBUG"))
    proc = subprocess.run([sys.executable, "-m", "paddle_acp", *map(str, args)], env=e, cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    assert_no_secret(f"paddle-acp {' '.join(map(str, args))}", proc.stdout, proc.stderr)
    return proc


# -- 13: working runs with the secret in the URI; every tool ---------------------------------------
def test_s3_userinfo_uri_with_endpoint_from_env_works_and_never_shows_the_secret(s3_planted, tmp_path):
    """``s3://KEY:SECRET@bucket/p`` with AWS_ENDPOINT_URL: the user info are the credentials (it
    never worked: they became part of the bucket path). Under paddle.distributed.launch without
    PADDLE_JOB_ID the warning shows the URI, redacted."""
    srv = s3_planted
    prefix = f"leak-{uuid.uuid4().hex[:8]}"
    uri = f"s3://{ACCESS}:{SECRET}@{srv.bucket}/{prefix}"
    env = dict(s3_env(srv), PADDLE_JOB_ID=None, PADDLE_LOG_DIR=str(tmp_path / "log"), POD_NAME="pod-0")
    proc = train(tmp_path / "out", uri, env)
    assert proc.returncode == 0, describe(proc)
    assert f"PADDLE_JOB_ID is not set: checkpoints go to job 'default' under s3://{srv.bucket}/{prefix}" in proc.stderr
    stored = _stored(srv, prefix)
    assert any(p.endswith("manifest.json") for p, _ in stored) and any("metrics" in p for p, _ in stored)
    for path, data in stored:
        assert_no_secret(path, data)

    tenv = s3_env(srv)
    ckpt = f"{uri}/default/range/_range_0/ckpt-e2"
    for args in (["ls", uri], ["ls", uri, "--verify", "--json"], ["inspect", ckpt], ["verify", uri],
                 ["gc", uri, "--keep", "1", "--dry-run"], ["stats", uri, "--job", "default"],
                 ["export", ckpt, "--to", tmp_path / "export"]):
        proc = tool(*args, env=tenv)
        assert proc.returncode == 0, describe(proc)
    for path, data in _texts_of_tree(tmp_path / "export"):
        assert_no_secret(path, data)
    # a checkpoint that does not exist, a job that does not exist: errors name the redacted URI
    proc = tool("inspect", f"{uri}/default/range/_range_0/ckpt-e99", env=tenv)
    assert proc.returncode != 0 and f"s3://{srv.bucket}/{prefix}" in proc.stderr, describe(proc)
    proc = tool("ls", uri, "--job", "nope", env=tenv)
    assert proc.returncode != 0, describe(proc)


def test_paddlecloud_ugi_password_never_shown(tmp_path):
    """PaddleCloud's PADDLE_EDL_HDFS_UGI=user,password (CE-test mode: local checkpoints)."""
    env = {"PADDLE_RUNNING_ENV": "PADDLE_EDL_AUTO_CHECKPOINT", "PADDLE_JOB_ID": "cloud", "PADDLE_TRAINER_ID": "0",
           "PADDLE_EDL_HDFS_CHECKPOINT_PATH": str(tmp_path / "ckpt"), "PADDLE_EDL_ONLY_FOR_CE_TEST": "1",
           "PADDLE_EDL_HDFS_NAME": "", "PADDLE_EDL_HDFS_UGI": f"someone,{SECRET}"}
    proc = train(tmp_path / "out", None, env)
    assert proc.returncode == 0 and len(read_log(tmp_path / "out")) == 3, describe(proc)
    for path, data in _texts_of_tree(tmp_path / "ckpt"):
        assert_no_secret(path, data)
    # the same UGI towards a namenode that does not answer, and a UGI without its comma
    env.update(PADDLE_EDL_ONLY_FOR_CE_TEST="0", PADDLE_EDL_HDFS_NAME=f"hdfs://127.0.0.1:{dead_port()}",
               PADDLE_ACP_HDFS_CLIENT="hdfs-native", PADDLE_ACP_CONNECT_TIMEOUT="5")
    proc = train(tmp_path / "out2", None, env, timeout=150)
    assert proc.returncode != 0 and "cannot reach HDFS" in proc.stderr, describe(proc)
    proc = train(tmp_path / "out3", None, dict(env, PADDLE_EDL_HDFS_UGI=SECRET), timeout=150)
    assert proc.returncode != 0 and "PADDLE_EDL_HDFS_UGI" in proc.stderr, describe(proc)


# -- 13: failing forms ---------------------------------------------------------------------------
def _failing_uris(port):
    return {
        "s3 user info, endpoint in the query, nothing listening":
            f"s3://{ACCESS}:{SECRET}@bucket/p?endpoint_override=127.0.0.1:{port}&scheme=http",
        "s3 secret_key in the query": f"s3://bucket/p?endpoint_override=127.0.0.1:{port}&scheme=http"
                                      f"&access_key={ACCESS}&secret_key={SECRET}",
        "hdfs user info": f"hdfs://someone:{SECRET}@127.0.0.1:{port}/ckpt",
        "file:// user info": f"file://someone:{SECRET}@localhost/tmp/acp-leak",
    }


@pytest.mark.parametrize("form", list(_failing_uris(1)))
def test_failing_uri_forms_never_show_the_secret(form, tmp_path):
    uri = _failing_uris(dead_port())[form]
    env = {"PADDLE_ACP_HDFS_CLIENT": "hdfs-native", "PADDLE_ACP_CONNECT_TIMEOUT": "5",
           "AWS_EC2_METADATA_DISABLED": "true"}
    proc = train(tmp_path / "out", uri, env, timeout=150)
    assert proc.returncode != 0, describe(proc)
    assert "ConfigError" in proc.stderr or "StorageError" in proc.stderr, describe(proc)
    proc = tool("ls", uri, env=env, timeout=150)
    assert proc.returncode == 2 and "paddle-acp: error:" in proc.stderr, describe(proc)
    if form == "file:// user info":
        assert "must not name user info" in proc.stderr, describe(proc)


# -- 19 + 13: storage down mid-run -------------------------------------------------------------------
def test_storage_down_one_line_per_failed_save_and_no_secret(tmp_path):
    """The S3 server stops after the first checkpoint: every later save fails. Each failure is one
    ERROR line with its cause; the traceback is printed once. Nothing shows the secret."""
    srv = _start(servers.S3Server(access_key=ACCESS, secret_key=SECRET))
    try:
        prefix = f"down-{uuid.uuid4().hex[:8]}"
        uri = f"s3://{ACCESS}:{SECRET}@{srv.bucket}/{prefix}"
        out = tmp_path / "out"
        # every save is attempted (busy policy wait), so that each failure can be counted
        env = dict(s3_env(srv), PADDLE_ACP_LOG_LEVEL="INFO", PADDLE_ACP_CONNECT_TIMEOUT="3",
                   PADDLE_ACP_BUSY_POLICY="wait")
        p = subprocess.Popen(script_cmd(out, uri, "--epochs", 7, "--steps-per-epoch", 1, "--sleep", 0.3),
                             env=script_env(uri, "pir", env), cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 240
            while not read_log(out) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert p.poll() is None, "the run ended before the server could be stopped"
            deadline = time.monotonic() + 240
            # the first checkpoint committed: its global.json (written last) is there
            while not [x for x in _stored(srv, prefix) if x[0].endswith("/global.json")] and p.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            srv.stop(kill=True)
            stdout, stderr = p.communicate(timeout=400)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
    finally:
        srv.cleanup()
    proc = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    assert_no_secret("training run with S3 down", stdout, stderr)
    failures = [x for x in stderr.splitlines() if "checkpoint save failed" in x]
    assert len(failures) >= 3, describe(proc)
    # the traceback once (one record; a chained exception prints two "Traceback" headers)
    assert stderr.count(", in _persist\n") == 1, stderr
    assert all("s3://" in x and "StorageError" in x for x in failures), failures
    assert "traceback at DEBUG level" in failures[-1], failures


# -- 15: connection attempts are bounded on every backend ----------------------------------------
def test_unreachable_hdfs_namenode_fails_within_the_connect_timeout_hdfs_native(tmp_path):
    """hdfs-native's defaults retried a refused connection for ~3 minutes per start and per tool
    call; with PADDLE_ACP_CONNECT_TIMEOUT the error comes within the test's (generous) limit."""
    uri = f"hdfs://127.0.0.1:{dead_port()}/ckpt"
    env = {"PADDLE_ACP_HDFS_CLIENT": "hdfs-native", "PADDLE_ACP_CONNECT_TIMEOUT": "5"}
    proc = tool("ls", uri, env=env, timeout=120)
    assert proc.returncode == 2 and "PADDLE_ACP_CONNECT_TIMEOUT=5" in proc.stderr, describe(proc)
    proc = train(tmp_path / "out", uri, env, timeout=120)
    assert proc.returncode != 0 and "PADDLE_ACP_CONNECT_TIMEOUT=5" in proc.stderr, describe(proc)


@pytest.mark.parametrize("client", ["pyarrow", "cli"])
def test_unreachable_hdfs_namenode_fails_within_the_connect_timeout_jvm_clients(hdfs_server, client):
    """libhdfs and the hadoop command line get Hadoop's ipc.client.connect.* settings."""
    env = {"PADDLE_ACP_HDFS_CLIENT": client, "PADDLE_ACP_CONNECT_TIMEOUT": "5",
           "PADDLE_EDL_HDFS_HOME": hdfs_server.client_env()["HADOOP_HOME"], **hdfs_server.client_env()}
    proc = tool("ls", f"hdfs://127.0.0.1:{dead_port()}/ckpt", env=env, timeout=150)
    assert proc.returncode == 2 and "PADDLE_ACP_CONNECT_TIMEOUT=5" in proc.stderr, describe(proc)


def test_unreachable_s3_endpoint_names_the_connect_timeout():
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead_port()}", "AWS_ACCESS_KEY_ID": ACCESS,
           "AWS_SECRET_ACCESS_KEY": SECRET, "PADDLE_ACP_CONNECT_TIMEOUT": "2", "AWS_EC2_METADATA_DISABLED": "true"}
    proc = tool("ls", "s3://bucket/ckpt", env=env, timeout=150)
    assert proc.returncode == 2 and "PADDLE_ACP_CONNECT_TIMEOUT=2" in proc.stderr, describe(proc)
