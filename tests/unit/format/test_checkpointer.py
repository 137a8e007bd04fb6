"""Checkpointer on real local storage: round trips, corruption, fallback, retention."""

import dataclasses
import json
import os
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import backend_kind, backend_storage, flip_byte, hdfs_server, s3_server  # noqa: F401  (fixtures)
from support.newest import load_as_restart

from paddle_acp.errors import CorruptCheckpointError, NoUsableCheckpointError, StorageError, UnknownFormatError
from paddle_acp.format.checkpoints.checkpointer import Checkpointer
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.manifest import DATA_NAME, DTYPES, MANIFEST_NAME, RangeRecord, seal
from paddle_acp.storage import open_storage


def make_snapshot(epoch, seed=0, sizes=(3, 100, 1)):
    rng = np.random.default_rng(seed + 1000 * epoch)
    tensors = [TensorData(f"w{i}", "float32", rng.standard_normal(n).astype("float32")) for i, n in enumerate(sizes)]
    tensors.append(TensorData("step", "int64", np.array([epoch], dtype="int64")))
    prog = ProgramSnapshot("abc123", "test program", tensors, {"last_epoch": epoch, "last_lr": 0.1})
    return Snapshot(RangeRecord("_range_0", epoch, 10), [prog], None, "3.3.1", "pir")


def ckpt(tmp_path, keep=3):
    return Checkpointer(open_storage(str(tmp_path)), "job", "_range_0", keep)


def values(loaded):
    return {name: arr.copy() for (key, name), arr in loaded.arrays.items()}


def expected(snap):
    return {t.name: t.array for t in snap.programs[0].tensors}


def assert_loads(loaded, snap):
    got = values(loaded)
    want = expected(snap)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])
    assert loaded.manifest.range.epoch_no == snap.range.epoch_no


def ckdir(tmp_path, n):
    return tmp_path / "job" / "range" / "_range_0" / f"ckpt-{n}"


def test_round_trip_and_layout(tmp_path):
    c = ckpt(tmp_path)
    snap = make_snapshot(0)
    written = c.save(snap)
    number, nbytes = written.number, written.data_size
    assert number == 0 and nbytes > 0
    assert sorted(os.listdir(ckdir(tmp_path, 0))) == sorted([DATA_NAME, MANIFEST_NAME])
    assert_loads(load_as_restart(c), snap)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_round_trip_any_dtype_and_shape(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("rt")
    tensors = []
    for i in range(data.draw(st.integers(0, 5))):
        dt = data.draw(st.sampled_from(sorted(DTYPES)))
        shape = data.draw(st.lists(st.integers(0, 5), max_size=3))
        raw = data.draw(st.binary(min_size=int(np.prod(shape)) * DTYPES[dt].itemsize, max_size=int(np.prod(shape)) * DTYPES[dt].itemsize))
        arr = np.frombuffer(raw, dtype=DTYPES[dt]).reshape(shape).copy() if dt != "bool" else (np.frombuffer(raw, dtype=np.uint8) % 2).astype(bool).reshape(shape)
        tensors.append(TensorData(f"t{i}", dt, arr))
    snap = Snapshot(RangeRecord("_range_0", 2, 3), [ProgramSnapshot("k", "", tensors)], None)
    c = ckpt(tmp)
    c.save(snap)
    loaded = load_as_restart(c)
    for t in tensors:
        got = loaded.arrays[("k", t.name)]
        assert got.shape == t.array.shape and got.tobytes() == t.array.tobytes()


def _corrupt_truncate(d):
    p = d / DATA_NAME
    p.write_bytes(p.read_bytes()[:-10])


def _corrupt_flip(d):
    p = d / DATA_NAME
    b = bytearray(p.read_bytes())
    b[70] = (b[70] + 1) % 256  # inside w1's bytes; never undone by a second call
    p.write_bytes(bytes(b))


def _corrupt_missing_data(d):
    (d / DATA_NAME).unlink()


def _corrupt_missing_manifest(d):
    (d / MANIFEST_NAME).unlink()


def _corrupt_truncated_manifest(d):
    p = d / MANIFEST_NAME
    p.write_bytes(p.read_bytes()[:50])


def _edit_manifest(fn, resealed=True):
    def go(d):
        p = d / MANIFEST_NAME
        doc = json.loads(p.read_text())
        fn(doc)
        p.write_bytes(seal(doc) if resealed else json.dumps(doc).encode())
    return go


CORRUPTIONS = {
    "truncated tensor file": (_corrupt_truncate, "has .* bytes"),
    "flipped byte": (_corrupt_flip, "checksum mismatch"),
    "missing tensor file": (_corrupt_missing_data, "missing"),
    "missing manifest": (_corrupt_missing_manifest, None),
    "truncated manifest": (_corrupt_truncated_manifest, "not valid JSON"),
    "path escape": (_edit_manifest(lambda d: d.update(files={"../../x": d["files"][DATA_NAME]})), "files must list"),
    "absolute path": (_edit_manifest(lambda d: d.update(files={"/tmp/x": d["files"][DATA_NAME]})), "files must list"),
    "wrong dtype": (_edit_manifest(lambda d: d["programs"][0]["tensors"][0].update(dtype="float64")), "does not match"),
    "wrong shape": (_edit_manifest(lambda d: d["programs"][0]["tensors"][1].update(shape=[5, 5])), "does not match"),
    "same-size reshape, checksum kept": (_edit_manifest(lambda d: d["programs"][0]["tensors"][1].update(shape=[10, 10]), resealed=False), "checksum mismatch"),
    "same-size dtype swap, checksum kept": (_edit_manifest(lambda d: d["programs"][0]["tensors"][0].update(dtype="int32"), resealed=False), "checksum mismatch"),
    "unknown dtype": (_edit_manifest(lambda d: d["programs"][0]["tensors"][0].update(dtype="pyobject")), "allowed dtype"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_detected_and_falls_back(tmp_path, case, caplog):
    corrupt, message = CORRUPTIONS[case]
    c = ckpt(tmp_path)
    first, second = make_snapshot(0), make_snapshot(1)
    c.save(first)
    c.save(second)
    corrupt(ckdir(tmp_path, 1))
    if message is not None:
        with pytest.raises(CorruptCheckpointError, match=message):
            c.load(1)
    loaded = load_as_restart(c)
    assert loaded is not None and loaded.manifest.number == 0
    assert_loads(loaded, first)
    if case != "missing manifest":
        assert "skipping checkpoint 1" in caplog.text


def test_no_valid_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    c = ckpt(tmp_path)
    c.save(make_snapshot(0))
    c.save(make_snapshot(1))
    for n in (0, 1):
        _corrupt_flip(ckdir(tmp_path, n))
    with pytest.raises(NoUsableCheckpointError, match=r"ckpt-1 \(corrupt: .*checksum mismatch.*ckpt-0 \(corrupt: ") as err:
        load_as_restart(c)
    assert "PADDLE_ACP_START_FRESH=1" in str(err.value) and "PADDLE_JOB_ID" in str(err.value)
    assert [name for name, _ in err.value.rejected] == ["ckpt-1", "ckpt-0"] and err.value.newer_format == []
    assert ckdir(tmp_path, 0).exists() and ckdir(tmp_path, 1).exists()
    assert load_as_restart(ckpt(tmp_path / "empty")) is None  # no checkpoint at all: from scratch


def test_the_error_of_many_unusable_checkpoints_is_bounded(tmp_path):
    c = ckpt(tmp_path, keep=0)
    for n in range(20):
        c.save(make_snapshot(n))
        _corrupt_flip(ckdir(tmp_path, n))
    with pytest.raises(NoUsableCheckpointError) as err:
        load_as_restart(c)
    msg = str(err.value)
    assert "none of the 20 committed checkpoint(s)" in msg and "and 12 more" in msg
    assert "ckpt-19 (corrupt: " in msg and "ckpt-12 (corrupt: " in msg and "ckpt-11 (" not in msg
    assert len(msg) < 8 * 300 + 1000 and len(err.value.rejected) == 20


def test_a_newer_format_is_skipped_and_never_deleted(tmp_path):
    """A manifest of a newer format version (a newer paddle-acp wrote it): UnknownFormatError, not
    loaded; retention and making space never delete it."""
    c = ckpt(tmp_path, keep=1)
    c.save(make_snapshot(0))
    path = ckdir(tmp_path, 0) / MANIFEST_NAME
    doc = json.loads(path.read_bytes())
    doc["version"] = 99
    doc["checksum"] = 12345  # a newer format may checksum otherwise: the version is read first
    path.write_text(json.dumps(doc))
    with pytest.raises(UnknownFormatError, match="format version 99 is newer"):
        c.load(0)
    with pytest.raises(NoUsableCheckpointError) as err:
        load_as_restart(c)
    assert err.value.newer_format == ["ckpt-0"] and "newer paddle-acp" in str(err.value)
    c2 = ckpt(tmp_path, keep=1)
    c2.save(make_snapshot(1))
    c2.save(make_snapshot(2))
    assert sorted(p.name for p in ckdir(tmp_path, 0).parent.iterdir()) == ["ckpt-0", "ckpt-2"]
    assert load_as_restart(c2).manifest.number == 2
    assert c2.apply_retention(1) == [] and ckdir(tmp_path, 0).exists()


class UnreadableManifests:
    """Real local storage on which reading the manifests under ``prefix`` fails for now (a storage error,
    as a permission or a flaky server gives), everything else working."""

    def __init__(self, inner, prefix):
        self.inner, self.prefix, self.failing = inner, prefix, True

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name == "read_bytes":
            def read_bytes(path, *a, **k):
                if self.failing and path.startswith(self.prefix) and path.endswith(MANIFEST_NAME):
                    raise StorageError(f"injected: cannot read {path} now")
                return attr(path, *a, **k)
            return read_bytes
        return attr


def test_retention_never_deletes_a_checkpoint_it_cannot_read(tmp_path):
    """Retention looks inside a checkpoint before deleting it (a newer format is never deleted); one
    whose manifest cannot be read now is kept, and deleted by a later save once it can be read."""
    ckpt(tmp_path, keep=1).save(make_snapshot(0))
    storage = UnreadableManifests(open_storage(str(tmp_path)), "job/range/_range_0/ckpt-0")
    c = Checkpointer(storage, "job", "_range_0", 1)
    c.save(make_snapshot(1))
    assert ckdir(tmp_path, 0).exists() and c.committed_numbers() == [0, 1]
    storage.failing = False
    c.save(make_snapshot(2))
    assert c.committed_numbers() == [2]


def test_leftover_temporary_directory_ignored_then_cleaned(tmp_path):
    c = ckpt(tmp_path)
    c.save(make_snapshot(0))
    leftover = tmp_path / "job" / "range" / "_range_0" / "ckpt-1.tmp-deadbeef"
    leftover.mkdir()
    (leftover / DATA_NAME).write_bytes(b"partial")
    uncommitted = ckdir(tmp_path, 2)
    uncommitted.mkdir()
    assert load_as_restart(c).manifest.number == 0
    number = c.save(make_snapshot(1)).number
    assert number == 3
    assert not leftover.exists() and not uncommitted.exists()
    assert load_as_restart(c).manifest.number == 3


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_retention_keeps_exactly_k(tmp_path, keep):
    c = ckpt(tmp_path, keep)
    for e in range(6):
        c.save(make_snapshot(e))
        assert len(c.committed_numbers()) == min(e + 1, keep)
    assert c.committed_numbers() == list(range(6 - keep, 6))


def test_retention_zero_keeps_all(tmp_path):
    c = ckpt(tmp_path, 0)
    for e in range(5):
        c.save(make_snapshot(e))
    assert c.committed_numbers() == [0, 1, 2, 3, 4]


class CrashingStorage:
    """Real local storage that fails after ``budget`` mutating operations."""

    def __init__(self, inner, budget):
        self.inner, self.budget = inner, budget

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name in ("makedirs", "write_bytes", "write_buffers", "rename", "delete_dir", "delete_file"):
            def wrapped(*a, **k):
                if self.budget <= 0:
                    raise StorageError("injected crash")
                self.budget -= 1
                return attr(*a, **k)
            return wrapped
        return attr


ops = st.lists(
    st.one_of(
        st.tuples(st.just("save")),
        st.tuples(st.just("crash"), st.integers(0, 6)),
        st.tuples(st.just("corrupt"), st.sampled_from(["flip", "truncate", "manifest"])),
        st.tuples(st.just("restore")),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops, st.integers(1, 3))
def test_restore_returns_newest_intact_committed_state(tmp_path_factory, program, keep):
    tmp = tmp_path_factory.mktemp("prop")
    storage = open_storage(str(tmp))
    c = Checkpointer(storage, "job", "_range_0", keep)
    intact = {}  # number -> epoch of checkpoints that are committed and uncorrupted
    epoch = 0
    for op in program:
        if op[0] == "save":
            n = c.save(make_snapshot(epoch)).number
            intact[n] = epoch
            epoch += 1
        elif op[0] == "crash":
            crashing = Checkpointer(CrashingStorage(storage, op[1]), "job", "_range_0", keep)
            try:
                n = crashing.save(make_snapshot(epoch)).number
                intact[n] = epoch
                epoch += 1
            except StorageError:
                pass
        elif op[0] == "corrupt":
            committed = c.committed_numbers()
            if committed:
                d = ckdir(tmp, committed[-1])
                {"flip": _corrupt_flip, "truncate": _corrupt_truncate, "manifest": _corrupt_truncated_manifest}[op[1]](d)
                intact.pop(committed[-1], None)
        else:
            on_disk = set(c.committed_numbers())
            live = {n: e for n, e in intact.items() if n in on_disk}
            if not on_disk:  # no checkpoint at all: from scratch
                assert load_as_restart(c) is None
            elif not live:  # checkpoints, none usable: an error naming each, nothing deleted
                with pytest.raises(NoUsableCheckpointError) as err:
                    load_as_restart(c)
                assert sorted(name for name, _ in err.value.rejected) == sorted(f"ckpt-{n}" for n in on_disk)
                assert set(c.committed_numbers()) == on_disk
            else:
                loaded = load_as_restart(c)
                newest = max(live)
                assert loaded is not None and loaded.manifest.number == newest
                assert_loads(loaded, make_snapshot(live[newest]))


def test_a_manifest_restarts_would_reject_is_never_written(tmp_path):
    """The writer checks its manifest as a reader will: state the reader refuses (a loader state
    nested too deep, an integer beyond 64 bits) fails the save loudly instead of being written and
    silently skipped by every later restart."""
    from paddle_acp.errors import CheckpointError

    c = ckpt(tmp_path)
    c.save(make_snapshot(0))
    deep = 1
    for _ in range(40):
        deep = [deep]
    for bad in ({"loader_state": deep}, {"loader_state": 2**70}):
        snap = dataclasses.replace(make_snapshot(1), extra=bad)
        with pytest.raises(CheckpointError, match="could not read it back"):
            c.save(snap)
    assert c.committed_numbers() == [0]
    assert not [n for n in os.listdir(ckdir(tmp_path, 0).parent) if ".tmp-" in n]  # aborted, nothing left


# -- the one reader: verify and read_tensors (what every tool uses) -------------------------
# Examples per backend: a remote save and read cost tens of round trips.
READER_EXAMPLES = {"local": 40, "hdfs": 10, "s3": 15}


def test_verify_and_read_tensors_on_every_path(backend_storage):
    """reader.verify and reader.read_tensors read the data file once, in chunks, on every path
    (local: mapped or read into buffers; HDFS and S3: the remote store's stream): they return
    exactly the tensors asked for, report every byte of the file, and refuse a checkpoint with one
    flipped bit."""
    from paddle_acp.format.engine import reader

    local = backend_storage.local_path("") is not None

    @settings(max_examples=READER_EXAMPLES[backend_kind(backend_storage)], deadline=None)
    @given(sizes=st.lists(st.integers(0, 3000), min_size=0, max_size=6), chunk_pages=st.integers(1, 3),
           mapped=st.booleans() if local else st.just(False), pick=st.integers(0, 63),
           flip=st.none() | st.tuples(st.integers(0, 5), st.floats(0, 0.999)))
    def check(sizes, chunk_pages, mapped, pick, flip):
        st_ = backend_storage.sub(uuid.uuid4().hex[:12])
        rng = np.random.default_rng(len(sizes) * 31 + sum(sizes))
        arrays = {f"t{i}": rng.integers(0, 2**31, n, dtype=np.int64) for i, n in enumerate(sizes)}
        c = Checkpointer(st_, "job", "_range_0")
        c.save(Snapshot(RangeRecord("_range_0", 0, 1), [ProgramSnapshot("k", "", [TensorData(n, "int64", a) for n, a in arrays.items()])], None))
        base = c.base(0)
        want = {("k", n) for i, n in enumerate(arrays) if pick >> i & 1}
        target = None
        if flip is not None:
            nonempty = [n for n, a in arrays.items() if a.nbytes]
            if nonempty:
                name = nonempty[flip[0] % len(nonempty)]
                rec = next(t for t in c.read_manifest(0).programs[0].tensors if t.name == name)
                target = rec.offset + int(flip[1] * rec.nbytes)
                flip_byte(st_, f"{base}/{DATA_NAME}", target, 0x01)
        seen = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reader, "_VERIFY_CHUNK", 4096 * chunk_pages)
            mp.setattr(reader, "_READ_CHUNK", 4096 * chunk_pages)
            if not mapped:
                mp.setattr(reader, "_map_file", lambda fd, size: None)
            if target is not None:
                with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
                    reader.verify(st_, base, 0, "_range_0")
                with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
                    reader.read_tensors(st_, base, 0, "_range_0", want)
                return
            m = reader.verify(st_, base, 0, "_range_0", progress=lambda n, total: seen.append((n, total)))
            m2, got = reader.read_tensors(st_, base, 0, "_range_0", want)
        assert m.data_size == m2.data_size == sum(n for n, _ in seen)
        assert all(total == m.data_size for _, total in seen)
        assert set(got) == want
        for (_k, name), arr in got.items():
            assert arr.dtype == arrays[name].dtype and arr.tobytes() == arrays[name].tobytes()
        if not local:
            st_.delete_dir("")

    check()


def test_reader_checks_the_header_before_any_data(tmp_path):
    """check_header refuses a data file of the wrong size without reading it; verify and read_tensors
    refuse it the same way (nothing unverified is handed on)."""
    from paddle_acp.format.engine import reader

    c = ckpt(tmp_path)
    c.save(make_snapshot(0))
    st_ = c.storage
    m, data_path = reader.check_header(st_, c.base(0), 0, "_range_0")
    assert data_path.endswith(DATA_NAME) and m.number == 0
    with open(ckdir(tmp_path, 0) / DATA_NAME, "ab") as f:
        f.write(b"x")
    for call in (lambda: reader.check_header(st_, c.base(0), 0, "_range_0"),
                 lambda: reader.verify(st_, c.base(0), 0, "_range_0"),
                 lambda: reader.read_tensors(st_, c.base(0), 0, "_range_0", {("abc123", "w0")})):
        with pytest.raises(CorruptCheckpointError, match="bytes, manifest says"):
            call()
    with pytest.raises(CorruptCheckpointError, match="manifest belongs to range"):
        reader.read_manifest(st_, c.base(0), 0, "_range_1")


# -- the one deletion (which to delete: tests/unit/format/test_preservation.py) ----------------------------------------
def test_delete_checkpoint_removes_the_commit_file_first(tmp_path):
    """Both layouts: the commit file (manifest.json of ckpt-N, global.json of ckpt-e<E>) goes
    first. A directory that cannot be removed after that is an uncommitted leftover, not a checkpoint."""
    from paddle_acp.format.commit import atomic
    from paddle_acp.format.commit.retention import commit_file, delete_checkpoint

    assert commit_file("job/range/r/ckpt-3") == MANIFEST_NAME
    assert commit_file("job/range/r/ckpt-e3-s7") == "global.json"
    c = ckpt(tmp_path)
    c.save(make_snapshot(0))
    c.save(make_snapshot(1))
    delete_checkpoint(c.storage, c.base(0))
    assert not ckdir(tmp_path, 0).exists() and c.committed_numbers() == [1]

    class StuckDir(type(c.storage)):  # the directory's removal fails (a crash right after the commit file went)
        def delete_dir(self, path):
            raise StorageError(f"cannot remove {path}")

    stuck = open_storage(str(tmp_path))
    stuck.__class__ = StuckDir
    with pytest.raises(StorageError):
        delete_checkpoint(stuck, c.base(1))
    assert ckdir(tmp_path, 1).exists() and not (ckdir(tmp_path, 1) / MANIFEST_NAME).exists()
    assert [e.committed for e in atomic.scan(c.storage, c.dir)] == [False]  # a leftover, never read
    assert load_as_restart(c) is None


# -- commit strategies ----------------------------------------------------------------------------
def test_commit_strategy_follows_the_storage_or_the_option(tmp_path):
    from paddle_acp.errors import CheckpointError
    from paddle_acp.format.commit import atomic

    st_ = open_storage(str(tmp_path))
    assert isinstance(atomic.strategy_for(st_), atomic.RenameCommit)  # a local disk renames atomically
    assert isinstance(atomic.strategy_for(st_, "manifest-last"), atomic.ManifestLastCommit)  # works anywhere
    with pytest.raises(CheckpointError, match="unknown commit style"):
        atomic.strategy_for(st_, "copy")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(style=st.sampled_from(["rename", "manifest-last"]), sizes=st.lists(st.integers(0, 500), max_size=4),
       fenced=st.booleans())
def test_both_commit_strategies_write_the_same_checkpoint(tmp_path_factory, style, sizes, fenced):
    """A checkpoint committed either way reads back the same; where it is written (a temporary
    directory or in place) is the strategy's, and a fence check that fails commits nothing."""
    from paddle_acp.errors import CheckpointError
    from paddle_acp.format.commit import atomic

    root = tmp_path_factory.mktemp("commit")
    st_ = open_storage(str(root))
    strategy = atomic.strategy_for(st_, style)
    c = Checkpointer(st_, "job", "_range_0", commit=strategy)
    snap = make_snapshot(0, sizes=tuple(sizes))
    if fenced:
        class Refused(CheckpointError):
            pass

        class Fence:  # the writer was fenced by a newer one just before its commit
            fenced_by = None
            generation = 0

            def check(self, what, quick=False):  # (quick: the commit's look-up of the next generation)
                raise Refused(what)

        c.fence = Fence()
        with pytest.raises(Refused, match="commit checkpoint 0"):
            c.save(snap)
        assert c.committed_numbers() == [] and load_as_restart(c) is None
        return
    pending = atomic.begin(st_, c.dir, 7, strategy)
    assert (pending.path == pending.final) == strategy.in_place == (style == "manifest-last")
    pending.abort()
    number = c.save(snap).number
    assert_loads(load_as_restart(c), snap)
    assert sorted(os.listdir(ckdir(root, number))) == sorted([DATA_NAME, MANIFEST_NAME])


_SAVER = """
import sys, numpy as np
from paddle_acp.format.commit import atomic
from paddle_acp.format.checkpoints.checkpointer import Checkpointer
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.storage import open_storage

st = open_storage(sys.argv[1])
c = Checkpointer(st, "job", "_range_0", 2, commit=atomic.strategy_for(st, sys.argv[2]))
for epoch in range(10**6):
    w = np.full(1 << 18, epoch, dtype=np.int64)  # 2 MB: a kill often lands inside a write
    c.save(Snapshot(RangeRecord("_range_0", epoch, 10**6), [ProgramSnapshot("k", "", [TensorData("w", "int64", w)])], None))
    print(epoch, flush=True)
"""


@pytest.mark.parametrize("style", ["rename", "manifest-last"])
def test_a_writer_killed_anywhere_leaves_only_whole_checkpoints(tmp_path, style):
    """SIGKILL a real process saving in a loop, at a random point after its first commit: every
    checkpoint that looks committed verifies, and the next writer goes on past the leftovers."""
    import random
    import signal
    import subprocess
    import sys
    import time

    rnd = random.Random(f"{style}-kill")
    for rnd_i in range(3):
        root = tmp_path / f"r{rnd_i}"
        p = subprocess.Popen([sys.executable, "-c", _SAVER, str(root), style], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
        try:
            for _ in range(1 + rnd.randrange(6)):  # this many commits seen, then the kill somewhere in the next save
                assert p.stdout.readline(), "the saver died"
            time.sleep(rnd.random() * 0.05)
            p.send_signal(signal.SIGKILL)
        finally:
            p.kill()
            p.wait()
        c = Checkpointer(open_storage(str(root)), "job", "_range_0", 2)
        numbers = c.committed_numbers()
        assert numbers
        for n in numbers:
            loaded = c.load(n)
            assert loaded.arrays[("k", "w")][0] == loaded.manifest.range.epoch_no
            loaded.close()
        n = c.save(make_snapshot(99)).number
        assert n > max(numbers) and load_as_restart(c).manifest.range.epoch_no == 99


def test_a_ctrl_c_right_after_the_save_made_its_directory_leaves_nothing(tmp_path):
    """A KeyboardInterrupt lands at any bytecode: here the moment the save's temporary directory was made
    (what `tests/e2e/test_user_facing.py`'s Ctrl-C test once caught in CI: the directory was made before the
    block that removes it on any exception was entered, and stayed). Nothing of that save stays; the
    checkpoint before it is intact and the next save goes on."""
    c = ckpt(tmp_path)
    c.save(make_snapshot(0))
    real = type(c.storage).makedirs
    calls = []

    def makedirs(self, path):
        real(self, path)
        if ".tmp-" in path and not calls:
            calls.append(path)
            raise KeyboardInterrupt
    c.storage.makedirs = makedirs.__get__(c.storage)
    with pytest.raises(KeyboardInterrupt):
        c.save(make_snapshot(1))
    assert calls and not c.storage.exists(calls[0])
    assert sorted(os.listdir(tmp_path / "job" / "range" / "_range_0")) == ["ckpt-0"]
    assert c.save(make_snapshot(1)).number == 1


def test_a_ctrl_c_during_an_overlapped_write_waits_for_one_piece_of_the_data_not_all(tmp_path, monkeypatch):
    """Where the manifest is written beside the data (HDFS: ``overlap_writes``), a Ctrl-C on the
    training thread while the manifest is written used to wait for the data thread to write the whole
    state (on a remote store, seconds per GB) before the save was given up. The data thread now stops
    at its next piece; nothing of the save stays and the next save goes on."""
    import threading
    import time

    monkeypatch.setattr("paddle_acp.storage.base.WRITE_CHUNK", 4096)  # the data's pieces
    c = ckpt(tmp_path)
    c.save(make_snapshot(0))
    st_ = c.storage
    st_.overlap_writes = True
    pieces = []
    first = threading.Event()
    real_open, real_write_bytes = st_.open_output, st_.write_bytes

    class Counting:
        def __init__(self, out):
            self.out = out

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.out.__exit__(*exc)

        def write(self, b):
            time.sleep(0.005)  # a remote store: each piece takes a while
            pieces.append(len(b))
            first.set()
            return self.out.write(b)

    def open_output(path):
        out = real_open(path)
        return Counting(out.__enter__()) if path.endswith(DATA_NAME) else out

    def write_bytes(path, data):
        if path.endswith(MANIFEST_NAME) and ".tmp-" in path:
            assert first.wait(30)
            raise KeyboardInterrupt
        return real_write_bytes(path, data)

    st_.open_output, st_.write_bytes = open_output, write_bytes
    snap = make_snapshot(1, sizes=(3, 250_000, 1))  # ~1 MB: ~245 pieces of 4 KB
    total = -(-snap.data_size // 4096)
    with pytest.raises(KeyboardInterrupt):
        c.save(snap)
    n = len(pieces)
    time.sleep(0.2)  # the data thread wrote no piece after the save was given up
    assert n == len(pieces) and n < total // 4, (n, total)
    st_.open_output, st_.write_bytes = real_open, real_write_bytes
    assert sorted(os.listdir(tmp_path / "job" / "range" / "_range_0")) == ["ckpt-0"]
    assert c.save(make_snapshot(1)).number == 1
