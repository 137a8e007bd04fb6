"""Pytest fixtures that start REAL HDFS / S3 servers on 127.0.0.1 (support/servers.py).

Use from a test module::

    from support.server_fixtures import hdfs_server, s3_server  # noqa: F401 (pytest fixtures)

Both fixtures are module-scoped. If a server cannot be fetched/built/started the
test is skipped with the reason, or fails when PADDLE_ACP_REQUIRE_SERVERS=1.

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


@pytest.fixture(scope="module")
def hdfs_server():
    """A started ``servers.HDFSServer``; its client_env() is applied to os.environ."""
    srv = _start(servers.HDFSServer())
    old = srv.apply_client_env()
    try:
        yield srv
    finally:
        _discard(srv)
        _restore_env(old)


@pytest.fixture(scope="module")
def s3_server():
    """A started ``servers.S3Server`` (bucket ``srv.bucket`` exists)."""
    srv = _start(servers.S3Server())
    try:
        yield srv
    finally:
        _discard(srv)
