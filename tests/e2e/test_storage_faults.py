"""Storage faults with REAL servers (tests/support/servers.py): servers stopped during saves,
unreachable at restore, wrong S3 credentials, and secrets kept out of every log
and file.

What the library promises: a failed save is logged with its cause and training
goes on; nothing half-written ever becomes a checkpoint that restore would pick;
the next save after the server is back succeeds (and removes the leftovers);
restore that cannot reach storage raises a clear error instead of silently
starting from scratch; credentials are never logged or written.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import JOB_ID, describe, is_done, read_log, run_script, script_cmd, script_env  # noqa: E402
from support.newest import committed, load_as_restart, one_process, reader, save  # noqa: E402
from support.server_fixtures import own_hdfs_server as hdfs_server  # noqa: E402,F401  (fixtures: it stops and restarts them)
from support.server_fixtures import own_s3_server as s3_server  # noqa: E402,F401

from paddle_acp.errors import StorageError  # noqa: E402
from paddle_acp.format.checkpoints import index  # noqa: E402
from paddle_acp.format.commit.fencing import write_job_marker  # noqa: E402
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData  # noqa: E402
from paddle_acp.format.manifest import RangeRecord  # noqa: E402
from paddle_acp.storage import open_storage  # noqa: E402


def snapshot(epoch: int, mb: float = 0.01) -> Snapshot:
    n = max(1, int(mb * (1 << 20) / 4))
    arr = np.random.default_rng(epoch).standard_normal(n).astype("float32")
    prog = ProgramSnapshot("p", "fault test", [TensorData("w", "float32", arr)])
    return Snapshot(RangeRecord("_range_0", epoch, 100), [prog], None, "3.3.1", "pir")


def uncommitted(st, job_id: str = "job") -> list:
    """The range's directories that are no committed checkpoint (leftovers of failed saves)."""
    return [e.name for e in index.entries(st, job_id, "_range_0", uncommitted=True) if not e.committed]


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    return s3_server.client_env()


def wait_for(cond, timeout: float, what: str, proc=None):
    deadline = time.time() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"training exited (code {proc.returncode}) while waiting for {what}")
        if time.time() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


# ---------------------------------------------------------------------------
# HDFS: DataNode down in the middle of a training run with async saves


def test_hdfs_datanode_down_during_training(hdfs_server, tmp_path):
    """Saves fail while the DataNode is down (training goes on, the error is logged
    with its cause, no partial checkpoint is ever visible); after the DataNode is
    back the next save succeeds and removes the leftovers of the failed ones."""
    uri = f"{hdfs_server.uri}/faults/{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    epochs = 16
    args = ("--epochs", epochs, "--steps-per-epoch", 2, "--sleep", 0.3)
    # every save is attempted (busy policy `wait`): under the default `skip` training runs on
    # while a save hangs on the dead DataNode, and would end before the DataNode is back
    env = script_env(uri, "pir", dict(hdfs_server.client_env(), PADDLE_ACP_BUSY_POLICY="wait"))
    with open(tmp_path / "stdout", "w") as so, open(tmp_path / "stderr", "w") as se:
        proc = subprocess.Popen(script_cmd(out, uri, *args), env=env, stdout=so, stderr=se, text=True)
    try:
        wait_for(lambda: len(read_log(out)) >= 2, 120, "epoch 1", proc)
        hdfs_server.stop_datanode(kill=True)  # a crash, not a clean shutdown
        down_at = len(read_log(out))
        wait_for(lambda: len(read_log(out)) >= down_at + 3, 120, "3 epochs with the DataNode down", proc)
        # training is frozen while the DataNode restarts: on a loaded machine that takes longer than the
        # epochs left (the test once ended before it was back); the restart itself is not under test
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            hdfs_server.start_datanode()
            back_at = len(read_log(out))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert back_at < epochs - 1, "training ended before the DataNode was back: make it longer"
        proc.wait(180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        hdfs_server.start_datanode()
    stderr = (tmp_path / "stderr").read_text()
    stdout = (tmp_path / "stdout").read_text()
    info = f"--- stdout ---\n{stdout}\n--- stderr (tail) ---\n{stderr[-6000:]}"
    assert proc.returncode == 0 and is_done(out), info
    assert len(read_log(out)) == epochs, info  # every epoch trained once: no restart
    errors = [ln for ln in stderr.splitlines()
              if re.search(r"checkpoint save failed \(\d+ so far\); training goes on and the next save retries", ln)]
    assert errors, info
    # the library's line names the operation and the file on HDFS ...
    assert all("failed: " in ln and f"{uri}/{JOB_ID}/range/_range_0/ckpt-" in ln for ln in errors), errors
    # ... and the HDFS client (libhdfs' JVM) logged the cause: no DataNode to write to
    assert "replicated to 0 nodes" in stderr or "datanodes" in stderr.lower(), info

    st = open_storage(uri)
    latest = load_as_restart(reader(st, JOB_ID, "_range_0"))
    assert latest.manifest.range.epoch_no == epochs - 1, "the saves after the DataNode came back failed"
    names = committed(st, JOB_ID)
    assert names, "no committed checkpoint"
    for name in names:
        one_process(st, JOB_ID).verify(name)  # every visible checkpoint is complete and verifies
    assert uncommitted(st, JOB_ID) == [], "leftovers of the failed saves were not cleaned up"
    # (The metrics file lives on the same storage: its appends fail too while the
    # DataNode is down, with a warning. Whether they work again right after it is
    # back depends on HDFS lease recovery of a block the crash left open: not checked.)


# ---------------------------------------------------------------------------
# S3: the server dies in the middle of a large upload


@pytest.mark.long  # on demand (bash ci/test.sh --long): ~12 s; .ci/run's step 1c kills and restarts S3 during training every time
def test_s3_down_during_save_then_back(s3_server, s3_env):
    st = open_storage(f"s3://{s3_server.bucket}/faults/{uuid.uuid4().hex[:8]}")
    ck = one_process(st, "job", "_range_0", keep=2)
    assert save(ck, snapshot(0)).name == "ckpt-e0"

    big = snapshot(1, mb=256)
    result = {}

    def save_big():
        try:
            result["saved"] = ck.save(big, "replicated")
        except BaseException as exc:  # noqa: BLE001 - what the saver thread would see
            result["error"] = exc

    def stored() -> int:  # the bytes the server's volumes hold: they grow as an upload's parts arrive
        return sum(p.stat().st_size for p in (s3_server.workdir / "data").rglob("*.dat"))

    before = stored()
    t = threading.Thread(target=save_big)
    t.start()
    try:
        # stop the server once 8 MB of the 256 MB checkpoint arrived: in the middle of its upload (the listing
        # shows the checkpoint's prefix only once its first object is whole: waiting for that, the upload
        # had sometimes ended before the server stopped, and the test skipped)
        wait_for(lambda: stored() > before + (8 << 20) or not t.is_alive(), 60, "the upload of checkpoint 1")
        s3_server.stop(kill=True)
        t.join(120)
        assert not t.is_alive(), "the save hangs with the server down"
    finally:
        s3_server.start()
    if "saved" in result:
        pytest.skip("the 256 MB upload finished before the server was stopped (machine too fast?)")
    err = result["error"]
    assert isinstance(err, StorageError), repr(err)
    assert "s3://" in str(err) and s3_server.secret_key not in str(err)

    # after the restart: a half-written checkpoint is invisible to restore. (S3 lists a checkpoint's
    # prefix only once its first object is complete, so the server may stop after the data upload:
    # then the failure came after the part's manifest, or its global.json, written last, and
    # checkpoint ckpt-e1 is whole, or its part is an uncommitted leftover.)
    fresh = reader(open_storage(st.uri), "job", "_range_0")
    names = committed(fresh.storage, "job")
    assert names in (["ckpt-e0"], ["ckpt-e0", "ckpt-e1"]), names
    latest = load_as_restart(fresh)  # verifies every checksum
    assert latest.name == names[-1] and latest.manifest.range.epoch_no == len(names) - 1
    # ... and the next save (the next epoch) succeeds, and its retention removes the leftover of
    # the failed one (an abandoned position older than the newest commit)
    assert save(ck, snapshot(2)).name == "ckpt-e2"
    assert committed(st, "job") == names[-1:] + ["ckpt-e2"] and uncommitted(st) == []
    assert load_as_restart(ck).manifest.range.epoch_no == 2


def test_s3_save_and_restore_while_server_is_down(s3_server, s3_env):
    st = open_storage(f"s3://{s3_server.bucket}/faults/{uuid.uuid4().hex[:8]}")
    ck = one_process(st, "job", "_range_0")
    save(ck, snapshot(0))
    s3_server.stop()
    try:
        t0 = time.time()
        with pytest.raises(StorageError) as save_err:
            ck.save(snapshot(1), "replicated")
        with pytest.raises(StorageError) as load_err:  # not None: that would mean "start from scratch"
            load_as_restart(reader(open_storage(st.uri), "job", "_range_0"))
        assert time.time() - t0 < 60
    finally:
        s3_server.start()
    for e in (save_err.value, load_err.value):
        assert st.uri in str(e), str(e)
    assert committed(st, "job") == ["ckpt-e0"]
    res = save(ck, snapshot(1))  # the failed position again, once the server is back
    assert res.name == "ckpt-e1" and res.committed is True
    assert committed(st, "job") == ["ckpt-e0", "ckpt-e1"] and load_as_restart(ck).manifest.range.epoch_no == 1


def test_restore_with_s3_unreachable_fails_clearly(s3_server, s3_env, tmp_path):
    """The training script itself, restarted while S3 is down, with checkpoints
    already there: it must stop with a clear error, not train from scratch."""
    uri = f"s3://{s3_server.bucket}/faults/{uuid.uuid4().hex[:8]}"
    save(one_process(open_storage(uri), JOB_ID, "_range_0"), snapshot(0))
    s3_server.stop()
    try:
        out = tmp_path / "out"
        proc = run_script(out, uri, "pir", "--epochs", 3, env=s3_server.client_env(), timeout=180)
    finally:
        s3_server.start()
    assert proc.returncode != 0, describe(proc)
    assert read_log(out) == [], "trained although the checkpoints could not be read:\n" + describe(proc)
    assert "StorageError" in proc.stderr or "ConfigError" in proc.stderr, describe(proc)
    assert uri in proc.stderr, describe(proc)


# ---------------------------------------------------------------------------
# credentials


@pytest.mark.parametrize("wrong", ["secret", "access"])
def test_wrong_s3_credentials_clear_error(s3_server, s3_env, monkeypatch, wrong):
    if wrong == "secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-key-42")
        want = "AWS_SECRET_ACCESS_KEY"
    else:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody-here")
        want = "AWS_ACCESS_KEY_ID"
    st = open_storage(f"s3://{s3_server.bucket}/faults/creds")
    ck = one_process(st, "job", "_range_0")
    for attempt in (lambda: write_job_marker(st, "job"), lambda: ck.save(snapshot(0), "replicated"),
                    lambda: load_as_restart(ck)):
        with pytest.raises(StorageError) as err:
            attempt()
        msg = str(err.value)
        assert want in msg and ("credentials" in msg or "key" in msg), msg
        assert "not-the-secret-key-42" not in msg and s3_server.secret_key not in msg


def _every_operation(st):
    """Each storage operation once, on an existing file "f" (and a missing "m")."""
    return {
        "size": lambda: st.size("f"), "stat": lambda: st.stat("f"), "exists": lambda: st.exists("f"),
        "kind": lambda: st.kind("m"), "listdir": lambda: st.listdir(""), "read_bytes": lambda: st.read_bytes("f"),
        "open_input": lambda: st.open_input("f"), "write_bytes": lambda: st.write_bytes("w", b"1"),
        "write_image": lambda: st.write_image("w", bytearray(4096), 10), "makedirs": lambda: st.makedirs("d"),
        "append_bytes": lambda: st.append_bytes("f", b"1"), "create_exclusive": lambda: st.create_exclusive("c", b"1"),
        "rename": lambda: st.rename("f", "g"), "delete_file": lambda: st.delete_file("f"),
        "delete_dir": lambda: st.delete_dir("d"),
    }


def test_every_s3_failure_is_a_storage_error(s3_server, s3_env, monkeypatch):
    """With a secret key the server refuses, every operation fails as a StorageError (never a raw
    client error: ``size`` once let pyarrow's through) that names the cause, never the secret."""
    uri = f"s3://{s3_server.bucket}/faults/ops-{uuid.uuid4().hex[:8]}"
    open_storage(uri).write_bytes("f", b"x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-key-42")
    st = open_storage(uri)
    for name, op in _every_operation(st).items():
        with pytest.raises(StorageError) as err:
            op()
        msg = str(err.value)
        cause = "cannot append" if name == "append_bytes" else "AWS_SECRET_ACCESS_KEY"  # S3 never appends
        assert cause in msg.replace("not possible to append", "cannot append") and st.uri in msg, (name, msg)
        assert "not-the-secret-key-42" not in msg and s3_server.secret_key not in msg, (name, msg)


def test_every_local_failure_is_a_storage_error(tmp_path):
    """On a local disk, operations below a file (ENOTDIR) fail as StorageError, or report the
    path missing where that is the contract (stat, exists, listdir, size, deletes)."""
    st = open_storage(str(tmp_path))
    st.write_bytes("f", b"x")
    below = st.sub("f")  # every path of this storage lies below a file
    missing = {"size": FileNotFoundError, "stat": ("missing", 0), "exists": False, "kind": "missing",
               "listdir": [], "delete_file": None, "delete_dir": None}
    for name, op in _every_operation(below).items():
        if name in missing:
            want = missing[name]
            if want is FileNotFoundError:
                with pytest.raises(FileNotFoundError):
                    op()
            else:
                assert op() == want, name
            continue
        with pytest.raises(StorageError, match="Not a directory|not a directory") as err:
            op()
        assert str(tmp_path) in str(err.value), (name, err.value)
    assert st.read_bytes("f") == b"x"


def test_wrong_s3_credentials_in_training_run(s3_server, tmp_path):
    uri = f"s3://{s3_server.bucket}/faults/{uuid.uuid4().hex[:8]}"
    env = dict(s3_server.client_env(), AWS_SECRET_ACCESS_KEY="not-the-secret-key-42")
    proc = run_script(tmp_path / "out", uri, "pir", "--epochs", 2, env=env, timeout=180)
    assert proc.returncode != 0, describe(proc)
    assert "AWS_SECRET_ACCESS_KEY" in proc.stderr, describe(proc)
    assert "not-the-secret-key-42" not in proc.stdout + proc.stderr
    assert read_log(tmp_path / "out") == []


def test_wrong_s3_credentials_in_uri_not_echoed(s3_server, tmp_path):
    uri = (f"s3://{s3_server.access_key}:not-the-secret-key-42@{s3_server.bucket}/faults/uri-creds"
           f"?endpoint_override={s3_server.endpoint}&scheme=http&region={s3_server.region}")
    env = {k: None for k in s3_server.client_env()}
    proc = run_script(tmp_path / "out", uri, "pir", "--epochs", 2, env=env, timeout=180)
    assert proc.returncode != 0, describe(proc)
    assert "secret key is wrong" in proc.stderr or "S3 denied access" in proc.stderr, describe(proc)
    assert "not-the-secret-key-42" not in proc.stdout + proc.stderr


def _all_stored_bytes(st, path=""):
    """(relative path, bytes) of every file under ``path``."""
    for e in st.listdir(path):
        rel = f"{path}/{e.name}" if path else e.name
        if e.is_dir:
            yield from _all_stored_bytes(st, rel)
        else:
            yield rel, st.read_bytes(rel)


@pytest.mark.parametrize("where", ["env", "uri"])
def test_secrets_never_logged_or_stored(s3_server, tmp_path, where):
    """A training run must not put the secret key into its output (at DEBUG level),
    the checkpoint files, the metrics or the job marker."""
    prefix = f"faults/secret-{uuid.uuid4().hex[:8]}"
    env = s3_server.client_env()
    secret = s3_server.secret_key
    if where == "env":
        uri = f"s3://{s3_server.bucket}/{prefix}"
    else:  # credentials and endpoint in the URI, as pyarrow accepts them
        uri = (f"s3://{s3_server.access_key}:{secret}@{s3_server.bucket}/{prefix}"
               f"?endpoint_override={s3_server.endpoint}&scheme=http&region={s3_server.region}")
        env = {k: None for k in env}
    proc = run_script(tmp_path / "out", uri, "legacy", "--epochs", 2,
                      env=dict(env, PADDLE_ACP_LOG_LEVEL="DEBUG"), timeout=180)
    assert proc.returncode == 0, describe(proc)
    assert secret not in proc.stdout and secret not in proc.stderr, describe(proc)
    st = s3_server.filesystem()
    from paddle_acp.storage import S3Storage

    stored = dict(_all_stored_bytes(S3Storage(st, f"{s3_server.bucket}/{prefix}", "s3://x")))
    assert any(p.endswith("manifest.json") for p in stored) and any("metrics" in p for p in stored), sorted(stored)
    leaks = [p for p, data in stored.items() if secret.encode() in data]
    assert leaks == [], f"the secret key is stored in {leaks}"
    for p, data in stored.items():
        if p.endswith(".json"):
            json.loads(data)  # sanity: we looked at real manifests / job markers


@pytest.mark.parametrize("client", ["pyarrow", "hdfs-native", "cli"])
def test_hdfs_namenode_in_safe_mode_is_a_storage_error(hdfs_server, client, monkeypatch):
    """A NameNode in safe mode (as right after it restarts) refuses writes: every HDFS client's refusal
    reaches the caller as a StorageError naming the cause (hdfs-native's RuntimeError escaped raw and
    ended a training process without a clear error: found by kill_anywhere --server-faults)."""
    from paddle_acp.errors import StorageError
    from paddle_acp.storage import open_storage

    if client == "hdfs-native":
        pytest.importorskip("hdfs_native", reason="hdfs-native not installed (pip install paddle-acp[hdfs])")
    monkeypatch.setenv("PADDLE_ACP_HDFS_CLIENT", client)
    st = open_storage(f"{hdfs_server.uri}/safemode/{uuid.uuid4().hex[:8]}")
    hdfs_server.hadoop("dfsadmin", "-safemode", "enter")
    try:
        with pytest.raises(StorageError, match="(?i)safe ?mode"):
            st.makedirs("job/writers")
            st.write_bytes("job/writers/gen-0", b"x")
    finally:
        hdfs_server.hadoop("dfsadmin", "-safemode", "leave")
    st.makedirs("job/writers")  # the same storage object works once the NameNode leaves safe mode
    st.write_bytes("job/writers/gen-0", b"x")
    assert st.read_bytes("job/writers/gen-0") == b"x"
