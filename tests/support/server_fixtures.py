"""Pytest fixtures that start REAL HDFS / S3 servers on 127.0.0.1 (support/servers.py).

Use from a test module::

    from support.server_fixtures import hdfs_server, s3_server  # noqa: F401 (pytest fixtures)

Both fixtures hand every module the same server, started once for the whole session (each
HDFS start costs ~4-5 s, each S3 start ~1.5-4 s; ~20 modules use them) and stopped at its end
(tests/conftest.py's pytest_sessionfinish, :func:`discard_shared`). Such a module never stops,
restarts or pauses the server, and every test writes under its own unique path (a uuid, or a
module's own prefix with a uuid per test). A module that stops, kills, restarts or pauses its
server takes its own instead, module-scoped as before::

    from support.server_fixtures import own_hdfs_server as hdfs_server  # noqa: F401 (pytest fixture)

If a server cannot be fetched/built/started the test is skipped with the reason, or fails when
PADDLE_ACP_REQUIRE_SERVERS=1 (a shared server that failed to start is not tried again: every
module that asks for it is skipped, or fails, with the same reason).

``hdfs_server`` also puts its ``client_env()`` into ``os.environ`` for the module
(JAVA_HOME, CLASSPATH, ARROW_LIBHDFS_DIR, ...): libhdfs reads them when the JVM
starts inside this process, i.e. on the first ``pyarrow.fs.HadoopFileSystem``
connect. That JVM keeps its first CLASSPATH for the life of the process, which is
harmless as long as clients pass host/port explicitly (``srv.host``, ``srv.port``).
``s3_server`` does NOT touch os.environ (use ``srv.filesystem()`` or
``srv.client_env()`` for subprocesses).
"""
from __future__ import annotations

import os

import pytest

from support import servers


def _start(srv):
    err = None
    try:
        srv.start()
    except servers.ServerUnavailable as e:
        err = e
    if err is not None:
        srv.cleanup()
        servers.require_or_skip(err)  # skips, or fails with PADDLE_ACP_REQUIRE_SERVERS=1
    return srv


def _discard(srv):
    """Stop a fixture's server for good: SIGKILL (its data goes with its work dir, so the graceful stop,
    ~2 s for weed, up to 15 s for a JVM, buys nothing), then remove the work dir."""
    if isinstance(srv, servers.HDFSServer):
        srv.stop_datanode(kill=True)
        srv.stop_namenode(kill=True)
    elif isinstance(srv, servers.S3Server):
        srv.stop(kill=True)
    srv.cleanup()


def _restore_env(old):
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_SHARED: dict = {}  # server class -> the session's started server, or the ServerUnavailable it failed with


def _shared(cls):
    """The session's one server of ``cls``: started on first use; a start that failed fails alike again."""
    got = _SHARED.get(cls)
    if got is None:
        srv = cls()
        try:
            got = srv.start()
        except servers.ServerUnavailable as e:
            srv.cleanup()
            got = e
        _SHARED[cls] = got
    if isinstance(got, servers.ServerUnavailable):
        servers.require_or_skip(got)  # skips, or fails with PADDLE_ACP_REQUIRE_SERVERS=1
    procs = (got._nn, got._dn) if isinstance(got, servers.HDFSServer) else (got._proc,)
    if any(p is None or p.poll() is not None for p in procs):  # a test broke the rule above: never hand out a dead one
        pytest.fail(f"the shared {cls.__name__} is not running: a module that stops its server must use own_*_server")
    return got


def discard_shared() -> None:
    """Stop the session's shared servers (tests/conftest.py, at the session's end)."""
    for srv in _SHARED.values():
        if not isinstance(srv, servers.ServerUnavailable):
            _discard(srv)
    _SHARED.clear()


@pytest.fixture(scope="module")
def hdfs_server():
    """The session's ``servers.HDFSServer``; its client_env() is applied to os.environ for the module."""
    srv = _shared(servers.HDFSServer)
    old = srv.apply_client_env()
    try:
        yield srv
    finally:
        _restore_env(old)


@pytest.fixture(scope="module")
def s3_server():
    """The session's ``servers.S3Server`` (bucket ``srv.bucket`` exists)."""
    yield _shared(servers.S3Server)


@pytest.fixture(scope="module")
def own_hdfs_server():
    """This module's own started ``servers.HDFSServer`` (it may stop, kill or restart it); its client_env()
    is applied to os.environ for the module."""
    srv = _start(servers.HDFSServer())
    old = srv.apply_client_env()
    try:
        yield srv
    finally:
        _discard(srv)
        _restore_env(old)


@pytest.fixture(scope="module")
def own_s3_server():
    """This module's own started ``servers.S3Server`` (it may stop, kill or restart it)."""
    srv = _start(servers.S3Server())
    try:
        yield srv
    finally:
        _discard(srv)
