"""The early connection (paddle_acp/runtime/early.py): an HDFS location opened in the background from the
package's import, handed to the first range that opens it.

The hand-over cases run on a backend registered for a test scheme and marked slow to open (its opener waits
for the test's signal, so every order of "range opens" and "connection done" is forced, not timed); the
real cases run fresh processes against the real HDFS: the range trains on the storage the import opened, a
NameNode that does not answer gives the range the open's own error once (never a second wait), and
``PADDLE_ACP_CONNECT_EARLY=0`` connects at the range's open as before.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from support.server_fixtures import hdfs_server  # noqa: F401  (fixture)

from paddle_acp import config as _config
from paddle_acp.errors import ConfigError, StorageError
from paddle_acp.runtime import early
from paddle_acp.storage import schemes
from paddle_acp.storage.local import LocalStorage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def slow_scheme(tmp_path, monkeypatch):
    """A ``slowtest://`` backend (a local directory) whose opener blocks until ``gate`` is set."""
    gate = threading.Event()
    calls = []

    def opener(uri, parsed, options):
        calls.append(uri)
        assert gate.wait(60), "the test never let the open finish"
        if parsed.netloc == "broken":
            raise StorageError(f"cannot reach {uri}: refused")
        if parsed.netloc == "odd":
            raise ValueError("a client's own exception")
        return LocalStorage(str(tmp_path / parsed.netloc), uri)

    schemes.register_backend("slowtest", opener)
    monkeypatch.setattr(schemes, "SLOW_TO_OPEN", schemes.SLOW_TO_OPEN | {"slowtest"})
    monkeypatch.delenv("PADDLE_ACP_CONNECT_EARLY", raising=False)
    early.forget()
    yield gate, calls
    gate.set()
    early.forget()
    schemes._BACKENDS.pop("slowtest", None)


def cfg_for(monkeypatch, uri):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", uri)
    return _config.from_env()


def test_the_first_range_of_the_location_gets_the_connection_made_meanwhile(slow_scheme, monkeypatch):
    gate, calls = slow_scheme
    cfg = cfg_for(monkeypatch, "slowtest://a/ckpt")
    assert early.start()
    assert not early.start()  # one per process
    got = []
    taker = threading.Thread(target=lambda: got.append(early.take(cfg)))
    taker.start()
    taker.join(0.3)
    assert taker.is_alive()  # the range waits for the connection in flight
    gate.set()
    taker.join(30)
    assert isinstance(got[0], LocalStorage) and got[0].uri == "slowtest://a/ckpt"
    assert calls == ["slowtest://a/ckpt"]  # opened once
    assert early.take(cfg) is None  # taken once: a second range opens its own


def test_another_location_or_other_settings_get_none_after_the_connection_ends(slow_scheme, monkeypatch):
    gate, calls = slow_scheme
    cfg_for(monkeypatch, "slowtest://a/ckpt")
    assert early.start()
    other = cfg_for(monkeypatch, "slowtest://b/ckpt")
    got = []
    taker = threading.Thread(target=lambda: got.append(early.take(other)))
    taker.start()
    taker.join(0.3)
    assert taker.is_alive()  # waited for even unused: the JVM's signal handlers come before the range's
    gate.set()
    taker.join(30)
    assert got == [None]
    early.forget()
    cfg_for(monkeypatch, "slowtest://a/ckpt")
    monkeypatch.setenv("PADDLE_ACP_CONNECT_TIMEOUT", "7")
    assert early.start()
    monkeypatch.setenv("PADDLE_ACP_CONNECT_TIMEOUT", "8")
    assert early.take(_config.from_env()) is None  # a setting changed since: not the range's storage


def test_a_failed_open_is_the_ranges_error_and_an_unexpected_one_a_retry(slow_scheme, monkeypatch):
    gate, calls = slow_scheme
    gate.set()
    cfg = cfg_for(monkeypatch, "slowtest://broken/ckpt")
    assert early.start()
    with pytest.raises(StorageError, match="cannot reach slowtest://broken/ckpt"):
        early.take(cfg)
    assert early.take(cfg) is None
    cfg = cfg_for(monkeypatch, "slowtest://odd/ckpt")
    assert early.start()
    assert early.take(cfg) is None  # the range opens it itself and reports its own error


def test_nothing_starts_off_unset_local_or_badly_configured(slow_scheme, monkeypatch, tmp_path):
    monkeypatch.setenv("PADDLE_ACP_CONNECT_EARLY", "0")
    cfg_for(monkeypatch, "slowtest://a/ckpt")
    assert not early.start()
    monkeypatch.setenv("PADDLE_ACP_CONNECT_EARLY", "maybe")
    assert not early.start()  # the range reports the bad value
    with pytest.raises(ConfigError, match="PADDLE_ACP_CONNECT_EARLY='maybe'"):
        _config.connect_early_from_env()
    monkeypatch.delenv("PADDLE_ACP_CONNECT_EARLY")
    cfg_for(monkeypatch, str(tmp_path / "local"))
    assert not early.start()  # a local directory opens at once
    monkeypatch.delenv("PADDLE_ACP_CHECKPOINT_URI")
    assert not early.start()


def test_a_forked_child_forgets_the_parents_connection(slow_scheme, monkeypatch):
    gate, calls = slow_scheme
    gate.set()
    cfg = cfg_for(monkeypatch, "slowtest://a/ckpt")
    assert early.start()
    pid = os.fork()
    if pid == 0:  # the child: nothing to take
        os._exit(0 if early.take(cfg) is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert isinstance(early.take(cfg), LocalStorage)  # the parent's is still there


SCRIPT = r"""
import json, sys, time
import numpy as np
import paddle
import paddle_acp as acp
from paddle_acp.runtime import early
started = early._started
paddle.enable_static()
main, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, startup):
    x = paddle.static.data("x", [None, 4], "float32")
    loss = paddle.mean(paddle.static.nn.fc(x, 4))
    paddle.optimizer.SGD(0.1).minimize(loss)
exe = paddle.static.Executor(paddle.CPUPlace())
exe.run(startup)
out = {"started": started is not None}
try:
    for epoch in acp.train_epoch_range(2, save_checkpoint_inter=0):
        exe.run(main, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[loss])
        out["same"] = started is not None and acp.active_range().storage is started.storage
except Exception as exc:
    out["error"] = type(exc).__name__
    out["message"] = str(exc)
    out["is_the_opens"] = started is not None and (exc is started.error or exc.__cause__ is started.error)
print(json.dumps(out))
"""


def _without_java_traces(text):
    """stderr without the Java stack frames libhdfs prints for a refused connection (never a failure by
    itself: a failure is the exit status), so that what failed shows within the message."""
    return "\n".join(line for line in text.splitlines() if not line.startswith(("\tat ", "\t... ")))


def run_script(env):
    """The script's JSON line. A run past the hard timeout is a liveness failure (a hang), told apart from a
    wrong result or a failed run (its exit status, its output)."""
    try:
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                             cwd=REPO)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hang: the script still ran after {exc.timeout} s")
    assert out.returncode == 0, (f"the script failed: rc {out.returncode}, stdout {out.stdout[-3000:]!r}\n"
                                 + _without_java_traces(out.stderr)[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def script_env(server, uri, **extra):
    env = dict(os.environ, **server.client_env(), PYTHONPATH=REPO, PADDLE_ACP_CHECKPOINT_URI=uri, **extra)
    env.pop("PADDLE_ACP_CONNECT_EARLY", None)
    env.update(extra)
    return env


def test_a_script_trains_on_the_hdfs_connection_its_import_made(hdfs_server, tmp_path):  # noqa: F811
    seen = run_script(script_env(hdfs_server, f"{hdfs_server.uri}/early/on"))
    assert seen == {"started": True, "same": True}, seen
    seen = run_script(script_env(hdfs_server, f"{hdfs_server.uri}/early/off", PADDLE_ACP_CONNECT_EARLY="0"))
    assert seen == {"started": False, "same": False}, seen


def test_a_namenode_that_does_not_answer_is_reported_once(hdfs_server, tmp_path):  # noqa: F811
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = run_script(script_env(hdfs_server, f"hdfs://127.0.0.1:{port}/early", PADDLE_ACP_CONNECT_TIMEOUT="3"))
    assert seen["started"] and seen["is_the_opens"], seen  # the range raised the import's open error: no second wait
    assert f"127.0.0.1:{port}" in seen["message"], seen


class SilentNameNode:
    """A real socket that accepts connections and never answers (a NameNode hung, or another service)."""

    def __init__(self):
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.held.append(conn)

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


def exit_seconds(env):
    """How long ``import paddle_acp; sys.exit(0)`` takes; a run past 90 s is a hang (the test fails)."""
    import time

    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", "import sys, paddle_acp; sys.exit(0)"], env=env,
                             capture_output=True, text=True, timeout=90, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("the exit still waited after 90 s")
    assert out.returncode == 0, out.stderr[-3000:]
    return time.monotonic() - t0


@pytest.mark.parametrize("client", [None, "hdfs-native"])
def test_exit_never_waits_long_for_a_namenode_that_accepts_and_never_answers(hdfs_server, client):  # noqa: F811
    silent = SilentNameNode()
    try:
        extra = {"PADDLE_ACP_HDFS_CLIENT": client} if client else {}
        env = script_env(hdfs_server, f"hdfs://127.0.0.1:{silent.port}/early", **extra)
        off = exit_seconds(dict(env, PADDLE_ACP_CONNECT_EARLY="0"))
        on = exit_seconds(env)
    finally:
        silent.close()
    # the connection is still being made at exit (30 s would be PADDLE_ACP_CONNECT_TIMEOUT): waited for 1.5 s at
    # most, and nothing else at exit (the JVM, a client's destructor) waits for it; the rest is slack for a loaded CPU
    assert on - off < early.EXIT_WAIT + 4.0, (on, off)
