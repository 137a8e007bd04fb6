"""The CI storage servers (tests/support/servers.py) are real and usable through pyarrow.

HDFS: Hadoop 2.7.3 NameNode + DataNode; clients: pyarrow.fs.HadoopFileSystem
(libhdfs + in-process JVM), hdfs-native (optional), the bin/hadoop CLI launcher.
S3: SeaweedFS `weed mini`; client: pyarrow.fs.S3FileSystem.
Skipped when the servers can't be prepared, unless PADDLE_ACP_REQUIRE_SERVERS=1.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.server_fixtures import own_hdfs_server as hdfs_server  # noqa: E402,F401  (fixtures: it stops and restarts them)
from support.server_fixtures import own_s3_server as s3_server  # noqa: E402,F401

pafs = pytest.importorskip("pyarrow.fs")

BIG = 50 * 1024 * 1024


@pytest.fixture(scope="module")
def big_blob():
    # incompressible, deterministic-length; not all-zero so corruption would show
    return os.urandom(BIG)


def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def _write_chunks(stream, data: bytes, chunk: int = 8 << 20) -> None:
    mv = memoryview(data)
    for i in range(0, len(data), chunk):
        stream.write(mv[i:i + chunk])


def _names(fs, base):
    return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(base)))


# ---------------------------------------------------------------------------
# HDFS


@pytest.fixture(scope="module")
def hdfs_fs(hdfs_server):
    # client_env() is already in os.environ (fixture), so the libhdfs JVM finds
    # JAVA_HOME/CLASSPATH/ARROW_LIBHDFS_DIR when it starts here.
    return pafs.HadoopFileSystem(hdfs_server.host, hdfs_server.port, replication=1)


def test_hdfs_client_env(hdfs_server):
    env = hdfs_server.client_env()
    for k in ("JAVA_HOME", "ARROW_LIBHDFS_DIR", "CLASSPATH", "HADOOP_HOME", "LD_LIBRARY_PATH"):
        assert env[k], k
    assert os.path.exists(os.path.join(env["ARROW_LIBHDFS_DIR"], "libhdfs.so"))
    assert "*" not in env["CLASSPATH"]  # libhdfs does not expand wildcards
    assert all(os.path.exists(p) for p in env["CLASSPATH"].split(os.pathsep))
    assert hdfs_server.uri == f"hdfs://127.0.0.1:{hdfs_server.port}"
    st = hdfs_server.namenode_state()
    assert st["FSState"] == "Operational" and st["NumLiveDataNodes"] == 1


def test_hdfs_pyarrow_roundtrip(hdfs_fs):
    fs = hdfs_fs
    base = "/t/pyarrow"
    fs.create_dir(base)
    with fs.open_output_stream(f"{base}/a.bin") as f:
        f.write(b"hello hdfs")
    with fs.open_input_stream(f"{base}/a.bin") as f:
        assert f.read() == b"hello hdfs"
    assert _names(fs, base) == ["a.bin"]
    fs.move(f"{base}/a.bin", f"{base}/b.bin")
    assert _names(fs, base) == ["b.bin"]
    assert fs.get_file_info(f"{base}/a.bin").type == pafs.FileType.NotFound
    fs.delete_file(f"{base}/b.bin")
    assert _names(fs, base) == []
    fs.delete_dir(base)
    assert fs.get_file_info(base).type == pafs.FileType.NotFound


def test_hdfs_pyarrow_50mb(hdfs_fs, big_blob):
    fs = hdfs_fs
    path = "/t/big/pyarrow.bin"
    fs.create_dir("/t/big")
    with fs.open_output_stream(path) as f:
        _write_chunks(f, big_blob)
    assert fs.get_file_info(path).size == BIG
    with fs.open_input_file(path) as f:
        assert f.read_at(16, BIG - 16) == big_blob[-16:]
        f.seek(0)
        assert _sha(f.read()) == _sha(big_blob)
    fs.move(path, "/t/big/moved.bin")
    assert _names(fs, "/t/big") == ["moved.bin"]
    fs.delete_dir("/t/big")


def test_hdfs_native(hdfs_server, hdfs_fs, big_blob):
    hn = pytest.importorskip("hdfs_native", reason="hdfs-native not installed (optional)")
    c = hn.Client(hdfs_server.uri)
    c.mkdirs("/t/native", create_parent=True)
    with c.create("/t/native/small") as f:
        f.write(b"from hdfs-native")
    with c.create("/t/native/big") as f:
        _write_chunks(f, big_blob)
    with c.read("/t/native/small") as f:
        assert f.read() == b"from hdfs-native"
    with c.read("/t/native/big") as f:
        assert _sha(f.read()) == _sha(big_blob)
    assert sorted(s.path.rsplit("/", 1)[-1] for s in c.list_status("/t/native")) == ["big", "small"]
    c.rename("/t/native/small", "/t/native/small2")
    # the same namespace through libhdfs
    with hdfs_fs.open_input_stream("/t/native/small2") as f:
        assert f.read() == b"from hdfs-native"
    assert hdfs_fs.get_file_info("/t/native/big").size == BIG
    assert c.delete("/t/native", recursive=True)
    assert hdfs_fs.get_file_info("/t/native").type == pafs.FileType.NotFound


def test_hadoop_cli(hdfs_server, hdfs_fs, tmp_path):
    hadoop = os.path.join(hdfs_server.client_env()["HADOOP_HOME"], "bin", "hadoop")
    assert os.access(hadoop, os.X_OK)
    assert b"Hadoop 2.7.3" in hdfs_server.hadoop("version").stdout
    local = tmp_path / "cli.txt"
    local.write_bytes(b"via hadoop fs\n")
    hdfs_server.hadoop("fs", "-mkdir", "-p", "/t/cli")
    # explicit -D like Paddle's HDFSClient passes
    hdfs_server.hadoop("fs", f"-Dfs.default.name={hdfs_server.uri}", "-put", str(local), "/t/cli/x.txt")
    assert hdfs_server.hadoop("fs", "-cat", "/t/cli/x.txt").stdout == b"via hadoop fs\n"
    ls = hdfs_server.hadoop("fs", "-ls", f"{hdfs_server.uri}/t/cli").stdout.decode()
    assert "/t/cli/x.txt" in ls
    r = hdfs_server.hadoop("fs", "-test", "-e", "/t/cli/nope", check=False)
    assert r.returncode == 1
    with hdfs_fs.open_input_stream("/t/cli/x.txt") as f:
        assert f.read() == b"via hadoop fs\n"
    hdfs_server.hadoop("fs", "-rm", "-r", "/t/cli")
    assert hdfs_fs.get_file_info("/t/cli").type == pafs.FileType.NotFound


def test_hdfs_restart_keeps_data_and_port(hdfs_server, hdfs_fs):
    port = hdfs_server.port
    with hdfs_fs.open_output_stream("/t/persist.bin") as f:
        f.write(b"survives restart")
    hdfs_server.restart()
    assert hdfs_server.port == port
    fs = pafs.HadoopFileSystem(hdfs_server.host, hdfs_server.port, replication=1)
    # Like a real NameNode restart, the first RPC of a process that talked to the old
    # NameNode may fail on the stale IPC connection (EOFException): clients must retry.
    try:
        fs.get_file_info("/")
    except OSError:
        pass
    with fs.open_input_stream("/t/persist.bin") as f:
        assert f.read() == b"survives restart"
    # DataNode alone down then up (fault tests)
    hdfs_server.stop_datanode()
    assert hdfs_server.datanode_pid is None
    hdfs_server.start_datanode()
    with fs.open_input_stream("/t/persist.bin") as f:
        assert f.read() == b"survives restart"
    fs.delete_file("/t/persist.bin")


# ---------------------------------------------------------------------------
# S3


@pytest.fixture(scope="module")
def s3_fs(s3_server):
    return s3_server.filesystem()


def test_s3_roundtrip(s3_server, s3_fs):
    fs, b = s3_fs, s3_server.bucket
    assert fs.get_file_info(b).type == pafs.FileType.Directory
    with fs.open_output_stream(f"{b}/rt/a.bin") as f:
        f.write(b"hello s3")
    with fs.open_input_stream(f"{b}/rt/a.bin") as f:
        assert f.read() == b"hello s3"
    assert _names(fs, f"{b}/rt") == ["a.bin"]
    fs.move(f"{b}/rt/a.bin", f"{b}/rt/b.bin")  # copy + delete on S3
    assert _names(fs, f"{b}/rt") == ["b.bin"]
    fs.delete_file(f"{b}/rt/b.bin")
    assert fs.get_file_info(f"{b}/rt/b.bin").type == pafs.FileType.NotFound
    fs.delete_dir_contents(f"{b}/rt", missing_dir_ok=True)


def test_s3_multipart_50mb(s3_server, s3_fs, big_blob):
    fs, key = s3_fs, f"{s3_server.bucket}/big/blob.bin"
    with fs.open_output_stream(key) as f:  # > part size: multipart upload
        _write_chunks(f, big_blob)
    assert fs.get_file_info(key).size == BIG
    with fs.open_input_file(key) as f:
        assert f.read_at(1024, 20 << 20) == big_blob[20 << 20:(20 << 20) + 1024]  # range read
        assert _sha(f.read()) == _sha(big_blob)
    fs.delete_file(key)


@pytest.mark.parametrize("bad", ["secret", "access"])
def test_s3_wrong_credentials_refused(s3_server, bad):
    kw = {"secret_key": "wrong-secret-key"} if bad == "secret" else {"access_key": "nobody"}
    fs = s3_server.filesystem(**kw)
    with pytest.raises(OSError):
        with fs.open_output_stream(f"{s3_server.bucket}/denied.bin") as f:
            f.write(b"x")
    with pytest.raises(OSError):
        fs.get_file_info(pafs.FileSelector(s3_server.bucket))


def test_s3_client_env_subprocess(s3_server, s3_fs):
    """client_env() configures a fresh process's credentials/region; pyarrow 26 does not
    read AWS_ENDPOINT_URL itself, so the endpoint is passed from it explicitly."""
    with s3_fs.open_output_stream(f"{s3_server.bucket}/env/x") as f:
        f.write(b"env ok")
    code = (
        "import os, sys, pyarrow.fs as f;"
        "fs = f.S3FileSystem(endpoint_override=os.environ['AWS_ENDPOINT_URL'].split('://')[1], scheme='http');"
        f"sys.stdout.write(fs.open_input_stream('{s3_server.bucket}/env/x').read().decode())"
    )
    env = dict(os.environ, **s3_server.client_env())
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "env ok"


@pytest.mark.long  # ~21 s; .ci/run's step 1c restarts the S3 server on its port and data in every fault trial
def test_s3_restart_keeps_data_and_port(s3_server, s3_fs):
    key, port = f"{s3_server.bucket}/persist.bin", s3_server.port
    with s3_fs.open_output_stream(key) as f:
        f.write(b"survives restart")
    s3_server.restart()
    assert s3_server.port == port
    with s3_server.filesystem().open_input_stream(key) as f:
        assert f.read() == b"survives restart"
    s3_server.filesystem().delete_file(key)
