"""One storage contract, every backend: local disk, HDFS through each of its three
clients (pyarrow/libhdfs, hdfs-native, the ``hadoop fs`` command line) and S3.

The HDFS and S3 backends run against REAL servers started by the tests
(tests/support/servers.py, module-scoped); they skip with the reason when a server cannot
be prepared here, and fail instead with PADDLE_ACP_REQUIRE_SERVERS=1.

Large objects are 300 MB, except through the ``hadoop fs`` command line: that
client stages every file through local disk (a local copy each way on top of the
transfer), so 300 MB would cost several more seconds of the suite's time budget
without exercising anything new: 50 MB already spans several storage write
pieces, many HDFS packets and the -put/-get staging.
"""
from __future__ import annotations

import os
import threading
import uuid

import numpy as np
import pyarrow.fs as pafs  # noqa: E402
import pytest
from support.newest import committed, load_as_restart, one_process, reader, save
from support.server_fixtures import hdfs_server, s3_server  # noqa: E402,F401  (fixtures)

from paddle_acp.errors import StorageError  # noqa: E402
from paddle_acp.format.checkpoints import index  # noqa: E402
from paddle_acp.format.commit import atomic  # noqa: E402
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData  # noqa: E402
from paddle_acp.format.layout import GLOBAL_NAME, position_number  # noqa: E402
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME, RangeRecord  # noqa: E402
from paddle_acp.storage import (  # noqa: E402
    MANIFEST_LAST,
    RENAME,
    HdfsStorage,
    LocalStorage,
    S3Storage,
    Storage,
    open_storage,
)

BACKENDS = ["local", "hdfs-pyarrow", "hdfs-native", "hdfs-cli", "s3"]
MB = 1 << 20
LARGE = {"hdfs-cli": 50 * MB}
LARGE_DEFAULT = 300 * MB


class Backend:
    """Storages of one backend for one test: fresh roots under a per-test directory.

    The backend itself is opened once per module (through ``open_storage``, as a
    training process would: its connection, its JVM, its metadata cache), so a
    test costs no extra connect; ``fresh()`` opens a new one, like another process.
    """

    def __init__(self, kind: str, base: Storage, tag: str, open_uri: str, open_kwargs: dict):
        self.kind = kind
        self.base = base
        self.tag = tag
        self.open_uri = open_uri
        self.open_kwargs = open_kwargs

    def storage(self, name: str = "") -> Storage:
        sub = f"{self.tag}/{name}" if name else self.tag
        return self.base.sub(sub)

    def fresh(self, name: str = "") -> Storage:
        sub = f"{self.tag}/{name}" if name else self.tag
        return open_storage(f"{self.open_uri}/{sub}", **self.open_kwargs)


@pytest.fixture(scope="module")
def _opened():
    return {}


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path_factory, monkeypatch, _opened):
    kind = request.param
    tag = uuid.uuid4().hex[:8]
    if kind == "local":
        uri, kwargs = str(tmp_path_factory.mktemp("local") / "root"), {}
    elif kind.startswith("hdfs"):
        client = kind.split("-", 1)[1]
        if client == "native":
            pytest.importorskip("hdfs_native", reason="hdfs-native not installed (pip install paddle-acp[hdfs])")
            client = "hdfs-native"
        srv = request.getfixturevalue("hdfs_server")
        monkeypatch.setenv("PADDLE_ACP_HDFS_CLIENT", client)
        uri = f"{srv.uri}/contract-{uuid.uuid4().hex[:8]}/{kind}"  # the server is the session's: a path of its own
        kwargs = {"hadoop_home": str(srv.hadoop_home), "cache_dir": str(tmp_path_factory.mktemp("fscache"))}
    else:
        srv = request.getfixturevalue("s3_server")
        for k, v in srv.client_env().items():
            monkeypatch.setenv(k, v)
        uri, kwargs = f"s3://{srv.bucket}/contract-{uuid.uuid4().hex[:8]}", {}
    if kind not in _opened:
        _opened[kind] = (open_storage(uri, **kwargs), uri, kwargs)
    base, uri, kwargs = _opened[kind]
    return Backend(kind, base, tag, uri, kwargs)


@pytest.fixture(scope="module")
def large_blob():
    return np.random.default_rng(7).integers(0, 256, LARGE_DEFAULT, dtype=np.uint8)


def test_backend_is_the_one_asked_for(backend):
    """The class and client the URI's scheme (and PADDLE_ACP_HDFS_CLIENT) ask for, with the
    capabilities callers rely on instead of asking which backend it is."""
    st = backend.fresh()
    fs = st.fs
    if backend.kind == "local":
        assert type(st) is LocalStorage and isinstance(fs, pafs.LocalFileSystem)
        assert st.local_path("a/b") == os.path.join(st.root, "a", "b") and os.path.isabs(st.root)
        assert st.has_symlinks and not st.overlap_writes and st.direct_io == hasattr(os, "O_DIRECT")
    elif backend.kind.startswith("hdfs"):
        assert type(st) is HdfsStorage and st.client == backend.kind.split("-", 1)[1].replace("native", "hdfs-native")
        if backend.kind == "hdfs-pyarrow":
            assert isinstance(fs, pafs.HadoopFileSystem)
        elif backend.kind == "hdfs-native":
            assert isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, pafs.FSSpecHandler)  # (a subclass)
        else:
            from paddle_acp.storage.hadoop_cli import HadoopCliHandler

            assert isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, HadoopCliHandler)
    else:
        assert type(st) is S3Storage and isinstance(fs, pafs.S3FileSystem)
    if backend.kind != "local":
        assert st.local_path("a") is None and not st.has_symlinks and not st.direct_io and st.overlap_writes
    assert st.commit_style == (MANIFEST_LAST if backend.kind == "s3" else RENAME)
    assert st.creates_parents == (backend.kind in ("hdfs-pyarrow", "hdfs-native"))  # what the rename commit relies on
    assert "secret" not in st.uri and "?" not in st.uri


def test_write_read_exists_size_overwrite(backend):
    st = backend.storage()
    st.makedirs("d")
    assert not st.exists("d/a.bin")
    st.write_bytes("d/a.bin", b"first version, longer")
    st.write_buffers("d/b.bin", [b"ab", memoryview(b"cdef"), bytearray(b""), np.arange(3, dtype=np.uint8)])
    st.write_bytes("d/a.bin", b"second")  # overwrite: replaced, not appended, not padded
    assert st.read_bytes("d/a.bin") == b"second"
    assert st.read_bytes("d/b.bin") == b"abcdef\x00\x01\x02"
    assert st.exists("d/a.bin") and st.exists("d") and st.size("d/b.bin") == 9
    with st.open_input("d/b.bin") as f:
        assert f.read_at(3, 2) == b"cde"
    with pytest.raises(FileNotFoundError):
        st.read_bytes("d/missing.bin")
    with pytest.raises(FileNotFoundError):
        st.size("d/missing.bin")
    with pytest.raises(StorageError):
        st.full("../escape")


def test_list_makedirs_and_missing(backend):
    st = backend.storage()
    assert st.listdir("") == [] and st.listdir("no/such/dir") == []
    st.makedirs("x/deep/er")
    st.makedirs("x/deep/er")  # exists already: fine
    st.write_bytes("x/f1", b"12345")
    st.write_bytes("x/deep/f2", b"")
    got = st.listdir("x")
    assert [(e.name, e.is_dir) for e in got] == [("deep", True), ("f1", False)]
    assert got[1].size == 5
    assert [(e.name, e.is_dir, e.size) for e in st.listdir("x/deep")] == [("er", True, 0), ("f2", False, 0)]
    assert st.listdir("x/deep/er") == []
    assert all(e.mtime is None or e.mtime > 1e9 for e in got)
    if backend.kind != "s3":  # (an S3 prefix has no time) gc's leftover age and the commit's re-reads rely on it
        assert all(e.mtime is not None for e in got), got
    try:  # a file is no directory: never listed as its own child (HDFS's getListing of a file returns the file)
        assert st.listdir("x/f1") == []
    except StorageError:
        pass  # (the HDFS clients refuse it)
    with pytest.raises((FileNotFoundError, StorageError)):
        st.read_bytes("x/deep")  # nor a directory a file to read


def test_libhdfs_lists_in_one_call_alike_pyarrow(request):
    """On libhdfs (the pyarrow client) a listing is libhdfs's own hdfsListDirectory (one getListing RPC; pyarrow's
    looks the directory up twice first): in use, and listing exactly what pyarrow's listing lists (names, kinds,
    sizes, times; missing, empty, a file refused, names with spaces and beyond ASCII)."""
    srv = request.getfixturevalue("hdfs_server")
    mp = pytest.MonkeyPatch()
    mp.setenv("PADDLE_ACP_HDFS_CLIENT", "pyarrow")
    try:
        st = open_storage(f"{srv.uri}/lister-{uuid.uuid4().hex[:8]}")
    finally:
        mp.undo()
    assert type(st) is HdfsStorage and st._libhdfs is not None
    st.makedirs("d/sub dir/x")
    for name, data in (("f1", b"12345"), ("sub dir/\u00e9t\u00e9 \u4e2d", b"ab"), ("empty", b"")):
        st.write_bytes(f"d/{name}", data)
    for path in ("", "d", "d/sub dir", "d/sub dir/x", "no/such"):
        assert st.listdir(path) == super(HdfsStorage, st).listdir(path), path
    assert [(e.name, e.is_dir, e.size) for e in st.listdir("d")] == [
        ("empty", False, 0), ("f1", False, 5), ("sub dir", True, 0)]
    with pytest.raises(StorageError, match="listing"):
        st.listdir("d/f1")
    # a look-up is libhdfs's hdfsExists (one RPC; pyarrow's makes two), agreeing with pyarrow's
    for path in ("d", "d/f1", "d/empty", "d/sub dir/\u00e9t\u00e9 \u4e2d", "d/sub dir/x", "no/such", "d/f1/below"):
        assert st.exists(path) is super(HdfsStorage, st).exists(path), path
    # create_exclusive drops its stage directory with hdfsDelete (one RPC): nothing of it is left
    assert st.create_exclusive("d/gen-1", b"") is True
    assert st.create_exclusive("d/gen-1", b"x") is False
    assert [e.name for e in st.listdir("d") if e.name.startswith(".tmp")] == []
    assert st.read_bytes("d/gen-1") == b""


def test_listing_a_directory_while_others_create_it(backend):
    """A job's ranks start at once: rank 0 lists its generation records' directory while the other ranks
    create their own below it. A listing made while the directory comes into being is empty or lists it,
    never an error (pyarrow's libhdfs said "No such file or directory" despite allow_not_found)."""
    import threading

    st = backend.storage()
    errors: list = []
    # The listing goes on until every rank's directory is made (at least 5 listings). On S3 (weed) the
    # concurrent makedirs of one new prefix are served ~1 s apart, so a trial lasts ~2 s and lists the
    # prefix some dozens of times while it comes into being: 6 trials there (20 took 45 s in CI).
    trials = 6 if backend.kind == "s3" else 20
    listings = []
    for trial in range(trials):
        root = f"race-{trial}/writers"
        go = threading.Event()
        made: list = []

        def make(k: int, root: str = root, go: threading.Event = go, made: list = made) -> None:
            go.wait()
            try:
                st.makedirs(f"{root}/rank-{k}")
            finally:
                made.append(k)

        def listing(root: str = root, go: threading.Event = go, made: list = made) -> None:
            go.wait()
            n = 0
            while n < 5 or len(made) < 4:
                n += 1
                try:
                    names = {e.name for e in st.listdir(root)}
                except Exception as exc:  # the defect: an error instead of what is there
                    errors.append(exc)
                    return
                assert names <= {f"rank-{k}" for k in range(1, 5)}, names
            listings.append(n)

        threads = [threading.Thread(target=make, args=(k,)) for k in range(1, 5)] + [threading.Thread(target=listing)]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
        assert not errors, errors[:3]
        assert len(listings) == trial + 1, listings  # the listing thread did not die of anything else
        assert {e.name for e in st.listdir(root)} == {f"rank-{k}" for k in range(1, 5)}  # every rank's was made


def test_delete_file_and_dir(backend):
    st = backend.storage()
    st.makedirs("t/sub")
    st.write_bytes("t/sub/a", b"a")
    st.write_bytes("t/sub/b", b"b")
    st.write_bytes("t/keep", b"k")
    st.delete_file("t/sub/a")
    assert not st.exists("t/sub/a") and st.exists("t/sub/b")
    st.delete_file("t/sub/a")  # missing: no error
    st.delete_dir("t/sub")  # recursive
    assert not st.exists("t/sub") and not st.exists("t/sub/b")
    st.delete_dir("t/sub")  # missing: no error
    assert [e.name for e in st.listdir("t")] == ["keep"]
    # a nested tree whose top file went first (a checkpoint's deletion: global.json, then the position with its
    # rank-0/): nothing of it is listed after (SeaweedFS's S3 kept the emptied folders when deleted by prefix)
    st.makedirs("t/pos/rank-0/deep")
    for f in ("t/pos/global.json", "t/pos/rank-0/manifest.json", "t/pos/rank-0/deep/x"):
        st.write_bytes(f, b"x")
    st.delete_file("t/pos/global.json")
    st.delete_dir("t/pos")
    assert [e.name for e in st.listdir("t")] == ["keep"] and not st.exists("t/pos")


def test_rename(backend):
    """Directory rename is the commit where the storage has it; S3 must say it has not
    (its commits are manifest-last, tested in the round trip), but files still move."""
    st = backend.storage()
    assert (st.commit_style == RENAME) == (backend.kind != "s3")
    if st.commit_style != RENAME:
        st.write_bytes("r/a", b"payload")
        st.rename("r/a", "r/b")
        assert [e.name for e in st.listdir("r")] == ["b"] and st.read_bytes("r/b") == b"payload"
        return
    st.makedirs("r/ckpt-0.tmp-abc")
    st.write_bytes("r/ckpt-0.tmp-abc/data", b"payload")
    st.rename("r/ckpt-0.tmp-abc", "r/ckpt-0")  # a directory, as the commit does
    assert [e.name for e in st.listdir("r")] == ["ckpt-0"]
    assert st.read_bytes("r/ckpt-0/data") == b"payload"
    st.rename("r/ckpt-0/data", "r/ckpt-0/data2")  # a file
    assert [e.name for e in st.listdir("r/ckpt-0")] == ["data2"]


def test_a_storage_that_creates_parents_makes_a_directory_that_renames_as_the_commit(backend):
    """``creates_parents``: the rename commit writes a part's files into a directory it never made
    (atomic.RenameCommit.begin): the first file makes it, two files written at once share it, and it
    renames into place whole."""
    st = backend.storage()
    if not st.creates_parents:
        return
    assert st.kind("p/ckpt-0.tmp-abc") == "missing"
    errors = []

    def write(name):
        try:
            st.write_bytes(f"p/ckpt-0.tmp-abc/{name}", name.encode())
        except Exception as exc:  # asserted below
            errors.append(exc)
    threads = [threading.Thread(target=write, args=(n,)) for n in ("data", "manifest")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and st.kind("p/ckpt-0.tmp-abc") == "dir"
    st.rename("p/ckpt-0.tmp-abc", "p/ckpt-0")
    assert [e.name for e in st.listdir("p")] == ["ckpt-0"]
    assert [(e.name, st.read_bytes(f"p/ckpt-0/{e.name}")) for e in st.listdir("p/ckpt-0")] == [
        ("data", b"data"), ("manifest", b"manifest")]


def test_unicode_and_spaces_in_names(backend):
    st = backend.storage("wörk dir ✓")
    name = "Ünïcødé 名前 dir/file with  spaces ✓.bin"
    st.makedirs("Ünïcødé 名前 dir")
    st.write_bytes(name, "données ✓".encode())
    assert st.exists(name)
    assert st.read_bytes(name).decode() == "données ✓"
    assert [e.name for e in st.listdir("Ünïcødé 名前 dir")] == ["file with  spaces ✓.bin"]
    assert [e.name for e in st.listdir("")] == ["Ünïcødé 名前 dir"]
    if st.commit_style == RENAME:
        st.rename(name, "Ünïcødé 名前 dir/renamed ü.bin")
        assert [e.name for e in st.listdir("Ünïcødé 名前 dir")] == ["renamed ü.bin"]
    st.delete_dir("Ünïcødé 名前 dir")
    assert st.listdir("") == []


def test_a_limited_read_allocates_what_the_file_holds_not_the_limit(backend):
    """``read_bytes(path, limit)`` returns the file (or its first ``limit + 1`` bytes) without allocating the
    limit: a 30 KB manifest read with its 64 MB limit once made a 64 MB object on every read (pyarrow and
    Python's file ``read(n)`` allocate ``n`` first), fresh memory at every poll of rank 0's commit."""
    import tracemalloc

    st = backend.storage()
    st.makedirs("lim")
    small = os.urandom(30_000)
    st.write_bytes("lim/small.bin", small)
    big = os.urandom(3 * MB + 5)
    st.write_bytes("lim/big.bin", big)
    st.write_bytes("lim/empty.bin", b"")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        assert st.read_bytes("lim/small.bin", limit=64 * MB) == small
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * MB, f"reading 30 KB with a 64 MB limit allocated {peak} bytes at its peak"
    assert st.read_bytes("lim/big.bin", limit=64 * MB) == big  # several pieces
    assert st.read_bytes("lim/big.bin") == big
    assert st.read_bytes("lim/big.bin", limit=2 * MB) == big[:2 * MB + 1]  # more than the limit: limit + 1
    assert st.read_bytes("lim/small.bin", limit=len(small)) == small
    assert st.read_bytes("lim/empty.bin", limit=10) == b"" and st.read_bytes("lim/empty.bin") == b""
    st.delete_dir("lim")


def test_large_object(backend, large_blob):
    size = LARGE.get(backend.kind, LARGE_DEFAULT)
    blob = large_blob[:size]
    st = backend.storage()
    st.makedirs("big")
    # one buffer, as the async saver hands over its whole image (libhdfs once turned
    # that into a single Java byte[]: OutOfMemoryError on a 256 MB client heap)
    written = st.write_buffers("big/blob.bin", [blob])
    assert written == size
    assert st.size("big/blob.bin") == size
    back = np.empty(size, dtype=np.uint8)
    with st.open_input("big/blob.bin") as f:
        pos = 0
        while pos < size:
            n = f.readinto(memoryview(back[pos:pos + 32 * MB]))
            assert n > 0, f"short read at {pos}"
            pos += n
        assert f.read_at(16, size - 16) == bytes(blob[-16:])
    assert np.array_equal(back, blob)
    st.delete_dir("big")


def test_write_image(backend):
    """The page-aligned image path the async saver uses (O_DIRECT on local disks)."""
    st = backend.storage()
    st.makedirs("img")
    image = np.zeros(3 * 4096, dtype=np.uint8)
    image[:5000] = np.arange(5000) % 251
    assert st.write_image("img/x.bin", image, 5000) == 5000
    assert st.size("img/x.bin") == 5000
    assert st.read_bytes("img/x.bin") == image[:5000].tobytes()


def test_an_exclusive_creation_never_replaces_a_name_taken_after_it_looked(backend):
    """Two processes take the same writer generation at once (fencing.py): both find the name free, and the
    second one's creation must not replace the first one's record (libhdfs's and the command line's rename replaced
    an existing file, so both took the generation and neither was fenced). The race is made certain here: the
    name is taken before the creation, and every look-up of it says free until the creation has tried."""
    st = backend.storage()
    if backend.kind == "s3":
        return  # an object store has no exclusive creation through pyarrow (documented in Storage.create_exclusive)
    st.makedirs("w")
    st.write_bytes("w/gen-3", b"first")  # the other process's record
    real_exists, real_rename = st.exists, st.rename
    tried = []

    def rename(src, dst):
        tried.append(dst)
        return real_rename(src, dst)

    st.exists = lambda path: real_exists(path) if tried or not path.endswith("gen-3") else False
    st.rename = rename
    try:
        assert st.create_exclusive("w/gen-3", b"second") is False
    finally:
        del st.exists, st.rename
    assert st.read_bytes("w/gen-3") == b"first"
    assert st.create_exclusive("w/gen-4", b"") is True and st.read_bytes("w/gen-4") == b""
    assert [e.name for e in st.listdir("w")] == ["gen-3", "gen-4"]  # nothing of either creation left behind


def test_append_create_exclusive_and_sub(backend):
    """Appending (rewritten by callers where an object store cannot), exclusive creation (the
    writer fence's primitive), and a storage rooted below another sharing its connection."""
    st = backend.storage()
    st.makedirs("a")
    st.write_bytes("a/log", b"one\n")
    if backend.kind == "s3":
        with pytest.raises(StorageError, match="appending to"):
            st.append_bytes("a/log", b"two\n")
    else:
        st.append_bytes("a/log", b"two\n")
        assert st.read_bytes("a/log") == b"one\ntwo\n"
    assert st.create_exclusive("a/gen-0", b"first") is True
    assert st.create_exclusive("a/gen-0", b"second") is False
    assert st.read_bytes("a/gen-0") == b"first"
    assert [e.name for e in st.listdir("a")] == ["gen-0", "log"]  # no temporary name left behind
    below = st.sub("a")
    assert type(below) is type(st) and below.full("log") == st.full("a/log") and below.uri == f"{st.uri}/a"
    assert below.read_bytes("gen-0") == b"first" and st.root != below.root


# -- the checkpointer on top of each backend --------------------------------------


def make_snapshot(epoch: int, range_name: str = "_range_0") -> Snapshot:
    rng = np.random.default_rng(epoch)
    tensors = [
        TensorData("w", "float32", rng.standard_normal((64, 33)).astype("float32")),
        TensorData("b", "float16", rng.standard_normal(7).astype("float16")),
        TensorData("step", "int64", np.array([epoch], dtype="int64")),
        TensorData("empty", "float32", np.zeros((0, 3), dtype="float32")),
    ]
    prog = ProgramSnapshot("prog0", "test program", tensors, {"last_epoch": epoch, "last_lr": 0.01})
    return Snapshot(RangeRecord(range_name, epoch, 10), [prog], None, "3.3.1", "pir")


def assert_same(loaded, snap):
    arrays = {name: arr for (_key, name), arr in loaded.arrays.items()}
    want = {t.name: t.array for t in snap.programs[0].tensors}
    assert sorted(arrays) == sorted(want)
    for k, v in want.items():
        assert arrays[k].dtype == v.dtype and arrays[k].shape == v.shape and arrays[k].tobytes() == v.tobytes(), k
    assert loaded.manifest.range.epoch_no == snap.range.epoch_no
    assert loaded.manifest.program("prog0").lr_scheduler == snap.programs[0].lr_scheduler


def test_checkpointer_round_trip_retention_and_leftovers(backend):
    st = backend.storage()
    ck = one_process(st, "job", "_range_0", keep=1)
    assert load_as_restart(ck) is None and committed(st, "job") == []
    s0, s1 = make_snapshot(0), make_snapshot(1)
    assert save(ck, s0).name == "ckpt-e0"
    assert save(ck, s1).name == "ckpt-e1"
    assert committed(st, "job") == ["ckpt-e1"]  # retention removed checkpoint ckpt-e0 entirely
    assert [e.name for e in st.listdir(ck.dir)] == ["ckpt-e1"]
    assert sorted(e.name for e in st.listdir(f"{ck.dir}/ckpt-e1")) == sorted([GLOBAL_NAME, "rank-0"])
    assert sorted(e.name for e in st.listdir(f"{ck.dir}/ckpt-e1/rank-0")) == [MANIFEST_NAME, DATA_NAME]

    # An interrupted save of epoch 2: on rename-capable storage a temporary part, on S3
    # the part's final name without its manifest (the manifest is the commit), and no
    # global.json either way. Readers ignore it.
    part = "rank-0.tmp-0123abcd" if st.commit_style == RENAME else "rank-0"
    leftover = f"{ck.dir}/ckpt-e2/{part}"
    st.makedirs(leftover)
    st.write_bytes(f"{leftover}/{DATA_NAME}", b"torn half of a checkpoint")
    loaded = load_as_restart(ck)
    assert loaded.name == "ckpt-e1" and loaded.manifest.number == position_number(1, None)
    assert_same(loaded, s1)

    # The next save (a later position) commits and its retention removes the abandoned leftover.
    s3 = make_snapshot(3)
    assert save(ck, s3).name == "ckpt-e3"
    assert [e.name for e in st.listdir(ck.dir)] == ["ckpt-e3"]
    fresh = reader(backend.fresh(), "job", "_range_0")  # a fresh process's view
    assert committed(fresh.storage, "job") == ["ckpt-e3"]
    assert_same(load_as_restart(fresh), s3)
    assert [e.name for e in index.entries(st, "job", "_range_0", uncommitted=True)] == ["ckpt-e3"]


def _rank_snapshot(rank, epoch):
    arr = np.full(5, 10 * rank + epoch, dtype="float32")
    prog = ProgramSnapshot("fp", "t", [TensorData("w", "float32", arr)], None)
    return Snapshot(RangeRecord("_range_0", epoch, 10), [prog], None, "3.3.1", "pir", extra={"loader_state": rank})


def test_global_commit_and_writer_fencing_on_every_backend(backend):
    """Per-rank parts, rank 0's global commit (manifest-last on S3, renames elsewhere), an
    abandoned checkpoint, restore of the newest global one by every rank, and exclusive
    writer generations: the same contract on every backend."""
    import threading

    from paddle_acp.format.checkpoints.multirank import GLOBAL_NAME, GlobalCheckpointer
    from paddle_acp.format.checkpoints.restart import load_newest
    from paddle_acp.format.commit.fencing import Fence, FencedError, create_exclusive

    st = backend.storage()
    st.makedirs("job")
    fences = [Fence.take(st, "job"), Fence.take(backend.fresh(), "job")]
    assert [f.generation for f in fences] == [0, 1]
    assert not create_exclusive(st, "job/writers/gen-1", b"x")

    def gck(rank, fence=None, timeout=30.0):
        g = GlobalCheckpointer(st, "job", "_range_0", rank, 2, 3, timeout, fence)
        g.poll_interval = 0.01
        return g

    def save(epoch, ranks, fence):
        res = {}

        def rank0():
            try:
                res[0] = gck(0, fence, timeout=120.0 if ranks else 0.5).save(_rank_snapshot(0, epoch), "per-rank")
            except FencedError as exc:
                res["error"] = exc

        t = threading.Thread(target=rank0)
        t.start()
        for r in ranks:
            gck(r).save(_rank_snapshot(r, epoch), "per-rank")
        t.join()
        if "error" in res:
            raise res["error"]
        return res[0]

    assert save(0, [1], fences[1]).committed is True
    assert save(1, [], fences[1]).committed is False  # rank 1's part never comes
    assert not st.exists(f"job/range/_range_0/ckpt-e1/{GLOBAL_NAME}")
    with pytest.raises(FencedError):
        save(2, [1], fences[0])  # the older generation commits nothing
    assert not st.exists(f"job/range/_range_0/ckpt-e2/{GLOBAL_NAME}")
    for r in (0, 1):
        loaded = load_newest(reader(st, "job", "_range_0"), gck(r), "per-rank")
        assert loaded.name == "ckpt-e0" and loaded.manifest.extra["loader_state"] == r
        assert [a.tolist() for a in loaded.arrays.values()] == [[10.0 * r] * 5]
        loaded.close()


def test_per_rank_fencing_on_every_backend(backend):
    """Every rank takes its own generations (exclusive on every backend). A superseded rank deletes
    and commits nothing (not its earlier part, not a leftover, not a global manifest); rank 0 never
    commits a part a superseded rank wrote; a newer writer's save in progress is never removed
    as a leftover, and a live writer removes only its own and older generations' leftovers."""
    import threading

    from paddle_acp.format.checkpoints.multirank import GLOBAL_NAME, GlobalCheckpointer
    from paddle_acp.format.commit.fencing import Fence, FencedError, create_exclusive, newest_generation

    st = backend.storage()
    st.makedirs("job")
    old = {r: Fence.take(st, "job", r) for r in (0, 1)}
    assert [old[0].generation, old[1].generation] == [0, 0]
    assert not create_exclusive(st, "job/writers/rank-1/gen-0", b"x")

    def gck(rank, fence, timeout=30.0):
        g = GlobalCheckpointer(st, "job", "_range_0", rank, 2, 3, timeout, fence)
        g.poll_interval = 0.01
        return g

    # the first start's rank 1 writes its part of epoch 0; then every rank starts again
    assert gck(1, old[1]).save(_rank_snapshot(1, 0), "per-rank").committed is None
    new = {r: Fence.take(backend.fresh(), "job", r) for r in (0, 1)}
    assert [new[0].generation, new[1].generation] == [1, 1] and newest_generation(st, "job", 1) == 1
    # the old part names the same position and base: rank 0 still never commits it
    assert gck(0, new[0], timeout=0.5).save(_rank_snapshot(0, 0), "per-rank").committed is False
    assert not st.exists(f"job/range/_range_0/ckpt-e0/{GLOBAL_NAME}")
    res = {}
    t = threading.Thread(target=lambda: res.update(r0=gck(0, new[0], 120.0).save(_rank_snapshot(0, 0), "per-rank")))
    t.start()
    gck(1, new[1]).save(_rank_snapshot(1, 0), "per-rank")  # the live rank 1 replaces the old part
    t.join()
    assert res["r0"].committed is True
    live = gck(0, None)
    live.verify("ckpt-e0")
    # the superseded ranks: cleaning up at start and saving delete and commit nothing
    for r in (0, 1):
        gck(r, old[r]).start.discard_newer(None)
        with pytest.raises(FencedError, match="generation 0 is fenced by generation 1"):
            gck(r, old[r]).save(_rank_snapshot(r, 1), "per-rank")
    live.verify("ckpt-e0")
    assert [g.name for g in live.scan() if g.committed] == ["ckpt-e0"]
    assert not [e.name for e in st.listdir("job/range/_range_0/ckpt-e1") if e.name.startswith("rank-")]

    # one writer of a range (a job of one process: rank 0 of 1): the new one is in the middle of
    # its first save when the old one saves, and when the old one cleans up at its start
    ck_new = one_process(st, "job", "_range_1", fence=new[0])

    def part(name, generation):
        pending = atomic.Pending(st, f"{ck_new.dir}/{name}", 0, name="rank-0", strategy=ck_new.commit_strategy,
                                 generation=generation)
        pending.prepare()
        return pending

    pending = part("ckpt-e0", new[0].generation)
    st.write_bytes(f"{pending.path}/{DATA_NAME}", b"being written")
    with pytest.raises(FencedError):
        one_process(st, "job", "_range_1", fence=old[0]).save(make_snapshot(0, "_range_1"), "replicated")
    one_process(st, "job", "_range_1", fence=old[0]).start.discard_newer(None)  # fenced: removes nothing
    assert st.read_bytes(f"{pending.path}/{DATA_NAME}") == b"being written"
    if ck_new.commit_strategy.name == RENAME:  # temporary names carry the generation
        older = part("ckpt-e3", 0)
        newer = part("ckpt-e3", 5)
        st.write_bytes(f"{newer.path}/{DATA_NAME}", b"a newer writer's")
    ck_new.start.discard_newer(None)  # the live writer's start: its own and older generations' leftovers go
    assert not st.exists(pending.path)
    if ck_new.commit_strategy.name == RENAME:
        names = [e.name for e in st.listdir(f"{ck_new.dir}/ckpt-e3")]
        assert names == [newer.path.rsplit("/", 1)[1]] and not st.exists(older.path), names
        assert st.read_bytes(f"{newer.path}/{DATA_NAME}") == b"a newer writer's"
    res = save(ck_new, make_snapshot(3, "_range_1"))
    assert res.committed is True and committed(st, "job", "_range_1") == [res.name] == ["ckpt-e3"]


# -- paths and URIs: properties of every backend's shared code ------------------------------

def test_paths_stay_below_the_root_and_uris_keep_no_secret(tmp_path):
    """``full`` and ``sub`` never leave the root (absolute paths and '..' are refused); the
    URI a storage shows never holds the user info or query the user gave."""
    from hypothesis import given, settings
    from hypothesis import strategies as hs

    from paddle_acp.storage import redact

    root = open_storage(str(tmp_path / "root"))
    part = hs.text(hs.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=8).filter(
        lambda p: p != ".")

    @settings(max_examples=200, deadline=None)
    @given(parts=hs.lists(part, min_size=1, max_size=5), lead=hs.sampled_from(["", "/"]))
    def check(parts, lead):
        path = lead + "/".join(parts)
        if lead or ".." in parts:
            with pytest.raises(StorageError, match="outside the storage root"):
                root.full(path)
            return
        full = root.full(path)
        assert full.startswith(root.root + "/") and full[len(root.root) + 1:] == path
        below = root.sub(parts[0])
        assert type(below) is LocalStorage and below.root == root.full(parts[0])
        assert below.local_path("/".join(parts[1:]) or ".") == (full if len(parts) > 1 else below.root)

    check()

    secret = hs.text(hs.sampled_from("abcXYZ0123456789+=_-"), min_size=6, max_size=20)

    @settings(max_examples=200, deadline=None)
    @given(user=secret, password=secret, token=secret)
    def check_uri(user, password, token):
        uri = f"s3://{user}:{password}@bucket/prefix?session_token={token}&region=x"
        shown = redact(uri)
        assert shown == "s3://bucket/prefix"
        assert password not in shown and token not in shown

    check_uri()


def test_the_scheme_table_picks_the_class(tmp_path):
    """One table from scheme to backend: plain paths and file:// are local disks, an unknown
    scheme is a ConfigError naming the supported ones (never the URI's secrets), and a backend
    registered for a new scheme serves it."""
    from paddle_acp.errors import ConfigError
    from paddle_acp.storage import register_backend
    from paddle_acp.storage.schemes import _BACKENDS

    assert type(open_storage(str(tmp_path))) is LocalStorage
    assert open_storage(f"file://{tmp_path}").root == str(tmp_path)
    with pytest.raises(ConfigError, match="unsupported scheme 'gs'.*s3://") as err:
        open_storage("gs://user:hunter22@bucket/x")
    assert "hunter22" not in str(err.value)

    def open_scratch(uri, parsed, options):  # a local directory named by another scheme
        return LocalStorage(os.path.join(options.cache_dir, parsed.netloc + parsed.path), uri)

    register_backend("scratch", open_scratch)
    try:
        st = open_storage("scratch://area/sub", cache_dir=str(tmp_path))
        st.makedirs("")
        st.write_bytes("f", b"x")
        assert type(st) is LocalStorage and (tmp_path / "area" / "sub" / "f").read_bytes() == b"x"
        assert st.uri == "scratch://area/sub"
    finally:
        _BACKENDS.pop("scratch")


def test_a_rename_onto_an_existing_directory_never_replaces_it(backend):
    """What a late writer's rename does (format/commit/fencing: a writer stopped between its passing fence check and its
    rename still renames when it resumes): the local disk and hdfs-native refuse it; libhdfs (hdfs-pyarrow) and
    the hadoop CLI move the source *into* the existing directory (HDFS's rename without options); either way the directory's own files stay what they were,
    so a late commit never replaces a newer checkpoint or part."""
    st = backend.storage()
    if st.commit_style != RENAME:
        return  # object stores commit manifest-last, no directory rename (test_rename)
    st.makedirs("r/rank-1")
    st.write_bytes("r/rank-1/manifest.json", b"newer")
    st.makedirs("r/rank-1.tmp-g1-late")
    st.write_bytes("r/rank-1.tmp-g1-late/manifest.json", b"late")
    try:
        st.rename("r/rank-1.tmp-g1-late", "r/rank-1")
    except StorageError:
        pass  # refused: the local disk, the hdfs-native client (rename without overwrite)
    assert st.read_bytes("r/rank-1/manifest.json") == b"newer"
    names = sorted(e.name for e in st.listdir("r/rank-1"))
    assert names in (["manifest.json"], ["manifest.json", "rank-1.tmp-g1-late"]), names
