"""Helpers shared by test modules.

Storage backends: ``backend_storage`` is a pytest fixture parametrised over the REAL backends
(a local disk, HDFS and S3 on the servers of support/server_fixtures.py); a test that takes it runs once
per backend, on a fresh empty root. Import it with the server fixtures it needs::

    from support import backend_storage, hdfs_server, s3_server  # noqa: F401 (pytest fixtures)

Each backend is opened once per module (its connection, its JVM), as a training process would;
each test gets ``Storage.sub`` of it.
"""

from __future__ import annotations

import os
import uuid
from typing import Dict, Tuple

import pytest

from paddle_acp.storage import Storage, open_storage
from support.server_fixtures import hdfs_server, s3_server  # noqa: F401  (pytest fixtures, re-exported)

BACKENDS = ("local", "hdfs", "s3")


_OPENED: Dict[Tuple[str, str], Storage] = {}  # (test module, backend) -> the storage opened for it


@pytest.fixture(params=BACKENDS)
def backend_storage(request, tmp_path_factory, monkeypatch) -> Storage:
    """An empty storage on the backend named by the parameter ("local", "hdfs", "s3")."""
    kind = request.param
    key = (request.module.__name__, kind)
    if kind == "s3":
        srv = request.getfixturevalue("s3_server")
        for k, v in srv.client_env().items():  # credentials and endpoint, as a training process has them
            monkeypatch.setenv(k, v)
        uri, kwargs = f"s3://{srv.bucket}/tests-{uuid.uuid4().hex[:8]}", {}
    elif kind == "hdfs":
        srv = request.getfixturevalue("hdfs_server")
        uri = f"{srv.uri}/tests-{uuid.uuid4().hex[:8]}"
        kwargs = {"hadoop_home": str(srv.hadoop_home), "cache_dir": str(tmp_path_factory.mktemp("fscache"))}
    else:
        uri, kwargs = str(tmp_path_factory.mktemp("local")), {}
    if key not in _OPENED:
        _OPENED[key] = open_storage(uri, **kwargs)
    return _OPENED[key].sub(uuid.uuid4().hex[:12])


def backend_kind(st: Storage) -> str:
    """"local", "hdfs" or "s3" for a storage of ``backend_storage``."""
    return type(st).__name__.replace("Storage", "").lower()


def patch_bytes(st: Storage, path: str, offset: int, new: bytes) -> None:
    """Overwrite the bytes of ``path`` at ``offset`` with ``new``, through the storage (every backend)."""
    data = st.read_bytes(path)
    st.write_bytes(path, data[:offset] + new + data[offset + len(new):])


def flip_byte(st: Storage, path: str, offset: int, mask: int = 0x5A) -> None:
    """Flip bits of the byte at ``offset`` of ``path`` (``mask``), through the storage."""
    old = st.read_bytes(path)[offset]
    patch_bytes(st, path, offset, bytes([old ^ mask]))


def local_file(st: Storage, path: str) -> str:
    """The OS path of ``path`` on a local storage (tests that need the file itself: truncate, mmap)."""
    p = st.local_path(path)
    assert p is not None, f"{st!r} is not a local disk"
    return os.fspath(p)
