"""The restore path: verify every checksum first, then read straight into the scope's tensors.

Tests taking ``backend_storage`` run on every real backend (local disk, HDFS, S3: tests/support.py).
A restore lands in a lent buffer (the runtime's snapshot arena: local files read once into it,
remote ones by ranged reads in parallel), or without one is verified through rotating buffers
(local) or into a spool file (remote) and read again from there.

The checkpoints are a one-process job's, as the runtime writes them (``ckpt-e{E}/rank-0`` committed by
``global.json``); version 1 manifests only ever were an earlier release's numbered ``ckpt-N``."""

import os
import uuid

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import backend_kind, backend_storage, flip_byte, hdfs_server, s3_server  # noqa: F401  (fixtures)
from support.newest import load_as_restart, one_process, reader, save, write_numbered

from paddle_acp.adapter.tensors import tensor_view, write_program
from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.engine import reader as ckmod
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.layout import position_number
from paddle_acp.format.manifest import DATA_NAME, RangeRecord
from paddle_acp.storage import open_storage


def snapshot(epoch, arrays):
    tensors = [TensorData(name, str(a.dtype), a) for name, a in arrays.items()]
    return Snapshot(RangeRecord("_range_0", epoch, 10), [ProgramSnapshot("k", "", tensors)], None)


def position(n):
    """Checkpoint ``ckpt-e{n}`` (epoch ``n``'s end), relative to the storage root."""
    return f"job/range/_range_0/ckpt-e{n}"


def part(n):
    """The directory of ``ckpt-e{n}``'s manifest and data file (a one-process job: its rank-0 part)."""
    return f"{position(n)}/rank-0"


def data_file(root, n):
    return os.path.join(str(root), part(n), DATA_NAME)


def data_path(n):
    """The data file of checkpoint ``ckpt-e{n}``, relative to the storage root."""
    return f"{part(n)}/{DATA_NAME}"


def job_saves(st_, *snaps):
    """A one-process job saves ``snaps`` (distinct epochs), each committed; the reader of its range."""
    g = one_process(st_)
    for s in snaps:
        save(g, s)
    return reader(st_)


def load(ck, n, landing=None):
    """Read and verify ``ckpt-e{n}`` (its part) completely, as a restore does."""
    return ck.load(position_number(n, None), base=part(n), landing=landing)


def read_manifest(ck, n):
    return ckmod.read_manifest(ck.storage, part(n), position_number(n, None), ck.range_name)


def recommit(st_, n):
    """Re-seal ``ckpt-e{n}``'s global.json over its part's manifest as it now is (the CRC32 and size it
    records), as a crafted checkpoint would be: the reader itself must then refuse what the manifest says."""
    import json
    import zlib

    from paddle_acp.format.layout import GLOBAL_NAME
    from paddle_acp.format.manifest import MANIFEST_NAME, seal

    raw = st_.read_bytes(f"{part(n)}/{MANIFEST_NAME}")
    g = json.loads(st_.read_bytes(f"{position(n)}/{GLOBAL_NAME}"))
    g.pop("checksum")
    g["parts"][0].update(manifest_crc32=zlib.crc32(raw) & 0xFFFFFFFF, manifest_size=len(raw))
    st_.write_bytes(f"{position(n)}/{GLOBAL_NAME}", seal(g))


def restart(st_, landing=None):
    """What a restart of the one-process job loads, its part landing in ``landing`` (the runtime's
    snapshot arena, lent to the restart as :meth:`paddle_acp.runtime.restore.Restorer.load_newest` does)."""
    numbered, g = reader(st_), one_process(st_)
    numbered.landing = g.landing = landing
    return load_newest(numbered, g, None)


# Examples of the property below per backend: a remote save and load cost tens of round trips.
EXAMPLES = {"local": 60, "hdfs": 12, "s3": 20}


def test_checksums_span_read_chunks(backend_storage):
    """Tensors larger than the verification chunk are checksummed across chunks; any flipped
    byte anywhere in any tensor is found; intact files load bit-identically (local files:
    mapped, or read into buffers where mapping is not possible; remote files: read once)."""
    kind = type(backend_storage).__name__
    local = backend_storage.local_path("") is not None

    @settings(max_examples=EXAMPLES[backend_kind(backend_storage)], deadline=None)
    @given(
        sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=6),
        chunk_pages=st.integers(1, 3),
        flip=st.one_of(st.none(), st.tuples(st.integers(0, 5), st.floats(0, 1, exclude_max=True))),
        mapped=st.booleans() if local else st.just(False),
        landed=st.booleans(),
    )
    def check(sizes, chunk_pages, flip, mapped, landed):
        st_ = backend_storage.sub(uuid.uuid4().hex[:12])
        rng = np.random.default_rng(len(sizes) * 7919 + sum(sizes))
        arrays = {f"t{i}": rng.integers(0, 2**31, n, dtype=np.int64).astype(np.float32) for i, n in enumerate(sizes)}
        ck = job_saves(st_, snapshot(0, arrays))
        target = None
        if flip is not None:
            nonempty = [n for n, a in arrays.items() if a.nbytes]
            if nonempty:
                name = nonempty[flip[0] % len(nonempty)]
                rec = next(t for t in read_manifest(ck, 0).programs[0].tensors if t.name == name)
                target = rec.offset + int(flip[1] * rec.nbytes)
                flip_byte(st_, data_path(0), target)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ckmod, "_VERIFY_CHUNK", 4096 * chunk_pages)
            if not mapped:
                mp.setattr(ckmod, "_map_file", lambda fd, size: None)
            if landed:  # small ranged reads on remote stores: chunks and connections in every mix
                mp.setattr(ckmod, "_READ_CHUNK", 4096 * chunk_pages)
            lender = Lender() if landed else None
            if target is not None:
                with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
                    load(ck, 0, landing=lender)
                assert lender is None or lender.back == lender.lent  # refused: the buffer is given back
                return
            loaded = load(ck, 0, landing=lender)
        for name, a in arrays.items():
            got = loaded.arrays[("k", name)]
            assert got.tobytes() == a.tobytes(), (kind, name)
        loaded.close()
        if lender is not None:  # remote files land in it, local ones are read from the page cache at the copy
            assert lender.back == lender.lent == (1 if sum(sizes) and not local else 0)
        if not local:
            st_.delete_dir("")

    check()


class Lender:
    """A landing (what the runtime's snapshot buffers lend a restore): counts the buffers lent and given back."""

    def __init__(self):
        self.lent = self.back = 0
        self.bufs = []

    def __call__(self, size):
        self.lent += 1
        buf = np.full(size + 4096, 0xEE, np.uint8)
        self.bufs.append(buf)

        def give_back():
            self.back += 1

        return buf, give_back


def mapped_paths():
    with open("/proc/self/maps") as f:
        return f.read()


def test_restore_lands_remote_files_in_the_lent_buffer_and_maps_nothing(backend_storage):
    """A remote data file is read once, straight into the lent buffer, and the tensors handed out are that
    buffer's bytes; it is given back once every tensor is handed out. A local one is not lent anything
    (it is read from the page cache into the tensors at the copy). Nothing maps the data file."""
    local = backend_storage.local_path("") is not None
    w = np.arange(1 << 20, dtype=np.float32)
    ck = job_saves(backend_storage.sub(uuid.uuid4().hex[:12]), snapshot(0, {"w": w, "b": np.ones(3, np.float64)}))
    lender = Lender()
    loaded = load(ck, 0, landing=lender)
    assert loaded.source == ("local" if local else "remote")
    assert DATA_NAME not in mapped_paths()
    got = loaded.arrays[("k", "w")]
    assert got.tobytes() == w.tobytes()
    assert lender.lent == (0 if local else 1) and (local or np.shares_memory(got, lender.bufs[0]))
    del loaded.arrays[("k", "w")]
    assert lender.back == 0  # "b" is still pending
    del loaded.arrays[("k", "b")]
    assert lender.lent == lender.back
    loaded.close()
    assert lender.lent == lender.back  # given back once


def test_remote_restore_reads_on_the_storages_connections(backend_storage, monkeypatch):
    """A remote file is read by ranged reads on at most ``Storage.ranged_readers`` connections in parallel
    (HDFS: 2, where 4 were slower against one DataNode on 2 cores; issue 44), plus the one that checks
    its end; the bytes land intact in the lent buffer (its range populated before each read)."""
    if backend_storage.local_path("") is not None:
        pytest.skip("a local file is read from the page cache, not by ranged reads")
    monkeypatch.setattr(ckmod, "_READ_CHUNK", 1 << 20)  # 8 ranged reads of the 8 MB file below
    opened = []
    real_open = ckmod._open_remote

    def counted(storage, path):
        opened.append(path)
        return real_open(storage, path)

    monkeypatch.setattr(ckmod, "_open_remote", counted)
    w = np.arange(2 << 20, dtype=np.float32)
    ck = job_saves(backend_storage.sub(uuid.uuid4().hex[:12]), snapshot(0, {"w": w}))
    lender = Lender()
    loaded = load(ck, 0, landing=lender)
    assert lender.lent == 1 and loaded.arrays[("k", "w")].tobytes() == w.tobytes()
    readers = {"hdfs": 2, "s3": 4}[backend_kind(backend_storage)]
    assert backend_storage.ranged_readers == readers
    assert 2 <= len(opened) <= readers + 1, opened  # parallel reads, at most the storage's connections + the end check
    loaded.close()


def test_restore_without_landing_maps_nothing(tmp_path):
    """Without a buffer to land in (over the budget, or a rank that keeps no snapshot buffer) the file
    is verified through small buffers and read again from it at the copy: still nothing mapped."""
    job_saves(open_storage(str(tmp_path)), snapshot(0, {"w": np.arange(1 << 20, dtype=np.float32)}))
    lender = Lender()
    loaded = load(reader(open_storage(str(tmp_path)), memory_budget=1 << 20), 0, landing=lender)
    assert lender.lent == 0 and DATA_NAME not in mapped_paths()  # (a FileSource never maps its file)
    assert loaded.arrays[("k", "w")].tobytes() == np.arange(1 << 20, dtype=np.float32).tobytes()
    loaded.close()


def test_restore_checksums_run_at_normal_priority(tmp_path):
    """Training waits for a restore's checksums: its CRC thread runs at the process's priority, not at
    the background threads' lower one."""
    import threading

    ck = job_saves(open_storage(str(tmp_path)), snapshot(0, {"w": np.arange(1 << 16, dtype=np.float32)}))
    load(ck, 0, landing=Lender()).close()
    threads = [t for t in threading.enumerate() if t.name.startswith("paddle-acp-crc-restore")]
    assert threads, [t.name for t in threading.enumerate()]
    me = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert all(os.getpriority(os.PRIO_PROCESS, t.native_id) == me for t in threads)


def test_restore_checksums_run_on_two_threads_in_parallel(tmp_path, monkeypatch):
    """A warm restore's time was mostly its checksums on one thread (issue 44): the verification's chunks
    are checksummed on two threads at once, and a tensor across chunks still verifies (and a flipped
    byte in it is still found)."""
    import itertools
    import threading

    import paddle_acp.format.manifest as manifest

    real = manifest._CHECKSUM_FUNCTIONS["crc32c"]
    met, calls = threading.Barrier(2, timeout=30), itertools.count()

    def meeting(buf, value):  # the real checksum; its first two calls wait for each other: two threads at once
        if next(calls) < 2:
            met.wait()  # on one thread: BrokenBarrierError after the timeout, raised by the load
        return real(buf, value)

    arrays = {f"t{i}": np.arange(i, i + 30000, dtype=np.float32) for i in range(4)}
    ck = job_saves(open_storage(str(tmp_path)), snapshot(0, arrays))
    monkeypatch.setitem(manifest._CHECKSUM_FUNCTIONS, "crc32c", meeting)
    monkeypatch.setattr(ckmod, "_VERIFY_CHUNK", 4096 * 3)  # every tensor spans chunks
    loaded = load(ck, 0)
    assert next(calls) > 2
    for name, a in arrays.items():
        assert loaded.arrays[("k", name)].tobytes() == a.tobytes()
    loaded.close()
    flip_byte(ck.storage, data_path(0), 4096 * 3 + 5)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        load(ck, 0)


def test_truncated_file_or_manifest_past_the_end_is_refused_on_every_backend(backend_storage):
    """A data file shorter than its manifest says, or a manifest whose tensor lies past the end of the
    file: refused before anything is handed out, with and without a buffer to land in; the buffer is
    given back; the previous checkpoint is used instead."""
    from paddle_acp.format.manifest import MANIFEST_NAME, Manifest

    st_ = backend_storage.sub(uuid.uuid4().hex[:12])
    old = {"w": np.full(5000, 1.0, np.float32)}
    ck = job_saves(st_, snapshot(0, old), snapshot(1, {"w": np.full(5000, 2.0, np.float32)}),
               snapshot(2, {"w": np.full(5000, 3.0, np.float32)}))
    data = st_.read_bytes(data_path(1))
    st_.write_bytes(data_path(1), data[:len(data) // 2])  # truncated
    mpath = f"{part(2)}/{MANIFEST_NAME}"
    m = Manifest.loads(st_.read_bytes(mpath))
    m.programs[0].tensors[0].offset += 4096  # past the end of the data file
    st_.write_bytes(mpath, m.dumps())
    recommit(st_, 2)  # global.json records the part's manifest as it now is: the reader, not the commit, refuses it
    for landed in (False, True):
        lender = ck.landing = Lender() if landed else None
        for n in (1, 2):
            with pytest.raises(CorruptCheckpointError):
                load(ck, n)
        loaded = restart(st_, lender)
        assert loaded.name == "ckpt-e0" and loaded.manifest.range.epoch_no == 0
        assert loaded.arrays[("k", "w")].tobytes() == old["w"].tobytes()
        loaded.close()
        assert lender is None or lender.back == lender.lent


def test_file_truncated_after_verification_is_an_error_not_a_crash(static_mode, tmp_path):
    """A mapped file that shrinks would fault (SIGBUS) when copied: it is refused with a clear error."""
    ck = job_saves(open_storage(str(tmp_path)), snapshot(0, {"w": np.arange(1 << 20, dtype=np.float32)}))
    loaded = load(ck, 0)
    os.truncate(data_file(tmp_path, 0), 4096)
    scope = scope_with({"w": np.zeros(1 << 20, np.float32)})
    with pytest.raises(CorruptCheckpointError, match="shrank"):
        write_program(loaded, "k", scope, paddle.CPUPlace())
    loaded.close()


def test_file_shrinking_during_verification_is_corrupt(tmp_path):
    """Pages past the end of a mapped file cannot be populated (EFAULT): a corrupt checkpoint, not a crash."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        from paddle_acp.format.engine import chunks

        mapping = chunks.map_file(fd, 1 << 20)
        assert mapping is not None
        chunks.populate(mapping, 0, 8192, "f.bin")
        os.truncate(path, 4096)
        with pytest.raises(CorruptCheckpointError, match="short read at byte 8192"):
            chunks.populate(mapping, 8192, 8192, "f.bin")
        mapping.close()
    finally:
        os.close(fd)


def scope_with(arrays):
    scope = paddle.static.Scope()
    for name, a in arrays.items():
        scope.var(name).get_tensor().set(a, paddle.CPUPlace())
    return scope


def scope_values(scope, names):
    return {n: np.array(scope.find_var(n).get_tensor()) for n in names}


def test_write_program_fills_scope_tensors_in_place(static_mode, backend_storage):
    saved = {
        "w": np.arange(3 << 20, dtype=np.float32),  # 12 MB: several read chunks, two threads
        "b": np.full(7, 3.5, np.float32),
        "step": np.array([41], np.int64),
        "lr": np.array([0.25], np.float32),  # the scope holds it with another shape: replaced
        "new": np.ones((2, 3), np.float64),  # not in the scope yet: created
    }
    ck = job_saves(backend_storage, snapshot(0, saved))
    scope = scope_with({"w": np.zeros(3 << 20, np.float32), "b": np.zeros(7, np.float32), "step": np.zeros(1, np.int64), "lr": np.zeros((), np.float32)})
    ptr_w = scope.find_var("w").get_tensor()._ptr()
    loaded = load_as_restart(ck)
    # retention or `paddle-acp gc` may delete the checkpoint before the program first runs
    backend_storage.delete_dir(position(0))
    assert write_program(loaded, "k", scope, paddle.CPUPlace()) == len(saved)
    got = scope_values(scope, saved)
    for n, a in saved.items():
        assert got[n].dtype == a.dtype and got[n].shape == a.shape and got[n].tobytes() == a.tobytes(), n
    assert scope.find_var("w").get_tensor()._ptr() == ptr_w  # read in place, no reallocation
    assert len(loaded.arrays) == 0  # handed out: the file (or image) is released
    assert write_program(loaded, "k", scope, paddle.CPUPlace()) == 0


def test_write_program_without_consume_keeps_pending(static_mode, tmp_path):
    saved = {"w": np.arange(10, dtype=np.float32)}
    ck = job_saves(open_storage(str(tmp_path)), snapshot(0, saved))
    loaded = load_as_restart(ck)
    s1, s2 = scope_with({"w": np.zeros(10, np.float32)}), paddle.static.Scope()
    assert write_program(loaded, "k", s1, paddle.CPUPlace(), consume=False) == 1
    assert write_program(loaded, "k", s2, paddle.CPUPlace()) == 1
    for s in (s1, s2):
        assert np.array_equal(np.array(s.find_var("w").get_tensor()), saved["w"])


def test_corrupt_newest_never_touches_the_scope(static_mode, tmp_path):
    """The newest checkpoint is corrupt in its last tensor: nothing of it reaches the scope;
    the older one is restored whole."""
    old = {"a": np.full(5000, 1.0, np.float32), "z": np.full(5000, 1.0, np.float32)}
    new = {"a": np.full(5000, 2.0, np.float32), "z": np.full(5000, 2.0, np.float32)}
    ck = job_saves(open_storage(str(tmp_path)), snapshot(0, old), snapshot(1, new))
    z = next(t for t in read_manifest(ck, 1).programs[0].tensors if t.name == "z")
    with open(data_file(tmp_path, 1), "r+b") as f:
        f.seek(z.offset + z.nbytes - 4)  # the last bytes of the last tensor
        f.write(b"\xff" * 4)
    scope = scope_with({"a": np.zeros(5000, np.float32), "z": np.zeros(5000, np.float32)})
    with pytest.raises(CorruptCheckpointError):
        load(ck, 1)
    assert all(not v.any() for v in scope_values(scope, ["a", "z"]).values())
    loaded = load_as_restart(ck)
    assert loaded.name == "ckpt-e0" and loaded.manifest.range.epoch_no == 0
    write_program(loaded, "k", scope, paddle.CPUPlace())
    got = scope_values(scope, ["a", "z"])
    assert np.array_equal(got["a"], old["a"]) and np.array_equal(got["z"], old["z"])


def test_tensor_view_matches_after_restore(static_mode, tmp_path):
    """A bf16-like uint16 payload and an int8 tensor round-trip into existing scope tensors."""
    saved = {"q": np.arange(-100, 100, dtype=np.int8), "m": np.arange(1000, dtype=np.uint16).astype(np.uint8)}
    ck = job_saves(open_storage(str(tmp_path)), snapshot(0, saved))
    scope = scope_with({k: np.zeros_like(v) for k, v in saved.items()})
    write_program(load_as_restart(ck), "k", scope, paddle.CPUPlace())
    for n, a in saved.items():
        _dt, view = tensor_view(scope.find_var(n).get_tensor())
        assert view.tobytes() == a.tobytes()


def numbered_data_path(n):
    """The data file of an earlier release's numbered checkpoint ``ckpt-{n}``, relative to the storage root."""
    return f"job/range/_range_0/ckpt-{n}/{DATA_NAME}"


def rewrite_as_version_1(st_, n):
    """Turn ``ckpt-{n}`` into what paddle-acp wrote before CRC32C (an earlier release's numbered checkpoint):
    manifest version 1, zlib CRC32 per tensor."""
    import zlib

    from paddle_acp.format.manifest import MANIFEST_NAME, Manifest

    mpath = f"{os.path.dirname(numbered_data_path(n))}/{MANIFEST_NAME}"
    m = Manifest.loads(st_.read_bytes(mpath))
    data = st_.read_bytes(numbered_data_path(n))
    for p in m.programs:
        for t in p.tensors:
            t.checksum = zlib.crc32(data[t.offset:t.offset + t.nbytes])
    m.version = 1
    raw = m.dumps()
    assert b'"crc32":' in raw and b'"crc32c"' not in raw and b'"version": 1' in raw
    st_.write_bytes(mpath, raw)


def test_version_1_checkpoints_still_restore_and_verify(backend_storage):
    """Checkpoints written before the switch to CRC32C (an earlier release's numbered ``ckpt-N``) load,
    verify, and still catch corruption."""
    from paddle_acp.tools import verify_checkpoint

    rng = np.random.default_rng(5)
    arrays = {"w": rng.standard_normal((300, 7)).astype(np.float32), "b": np.arange(9, dtype=np.int64), "e": np.zeros(0, np.float32)}
    st_ = backend_storage
    write_numbered(st_, 0, snapshot(0, arrays))
    ck = reader(st_)
    rewrite_as_version_1(st_, 0)
    assert ckmod.read_manifest(st_, ck.base(0), 0, "_range_0").version == 1
    assert verify_checkpoint(st_, "job", "_range_0", 0, quiet=True).version == 1
    loaded = ck.load(0)
    for name, a in arrays.items():
        assert loaded.arrays[("k", name)].tobytes() == a.tobytes()
    loaded.close()
    loaded = load_as_restart(ck)  # the restart's path too
    assert loaded.name == "ckpt-0" and loaded.manifest.version == 1
    assert all(loaded.arrays[("k", name)].tobytes() == a.tobytes() for name, a in arrays.items())
    loaded.close()
    flip_byte(st_, numbered_data_path(0), 100, 1)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch in tensor 'w'"):
        ck.load(0)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch in tensor 'w'"):
        verify_checkpoint(st_, "job", "_range_0", 0, quiet=True)
