"""One writer's checkpoints on real local storage (a one-process job, rank 0 of 1; an earlier release's ``ckpt-N``): round trips, corruption, fallback, retention."""

import dataclasses
import json
import os
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import backend_kind, backend_storage, flip_byte, hdfs_server, s3_server  # noqa: F401  (fixtures)
from support.newest import committed, load_as_restart, one_process, reader, recommit, save, write_numbered

from paddle_acp.errors import CorruptCheckpointError, NoUsableCheckpointError, StorageError, UnknownFormatError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.layout import GLOBAL_NAME, position_number
from paddle_acp.format.manifest import DATA_NAME, DTYPES, MANIFEST_NAME, RangeRecord, seal
from paddle_acp.storage import open_storage


def make_snapshot(epoch, seed=0, sizes=(3, 100, 1)):
    rng = np.random.default_rng(seed + 1000 * epoch)
    tensors = [TensorData(f"w{i}", "float32", rng.standard_normal(n).astype("float32")) for i, n in enumerate(sizes)]
    tensors.append(TensorData("step", "int64", np.array([epoch], dtype="int64")))
    prog = ProgramSnapshot("abc123", "test program", tensors, {"last_epoch": epoch, "last_lr": 0.1})
    return Snapshot(RangeRecord("_range_0", epoch, 10), [prog], None, "3.3.1", "pir")


def ckpt(tmp_path, keep=3):
    """A one-process job's writer over ``tmp_path`` (rank 0 of 1)."""
    return one_process(open_storage(str(tmp_path)), keep=keep)


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


def rdir(tmp_path):
    return tmp_path / "job" / "range" / "_range_0"


def ckdir(tmp_path, n):
    """An earlier release's numbered checkpoint ``ckpt-N`` (its manifest and data in it)."""
    return rdir(tmp_path) / f"ckpt-{n}"


def cdir(tmp_path, e):
    """Today's checkpoint of epoch ``e``: ``ckpt-e{e}`` (its commit, global.json, and its one part)."""
    return rdir(tmp_path) / f"ckpt-e{e}"


def pdir(tmp_path, e):
    """The directory holding ``ckpt-e{e}``'s manifest and data: its rank-0 part."""
    return cdir(tmp_path, e) / "rank-0"


def names(tmp_path):
    return committed(open_storage(str(tmp_path)), "job", "_range_0")


def test_round_trip_and_layout(tmp_path):
    c = ckpt(tmp_path)
    snap = make_snapshot(0)
    written = save(c, snap)
    assert written.name == "ckpt-e0" and written.committed is True and written.nbytes > 0
    assert sorted(os.listdir(rdir(tmp_path))) == ["ckpt-e0"]
    assert sorted(os.listdir(cdir(tmp_path, 0))) == sorted([GLOBAL_NAME, "rank-0"])
    assert sorted(os.listdir(pdir(tmp_path, 0))) == sorted([DATA_NAME, MANIFEST_NAME])
    assert os.path.getsize(pdir(tmp_path, 0) / DATA_NAME) == written.nbytes
    loaded = load_as_restart(c)
    assert loaded.name == "ckpt-e0" and loaded.manifest.number == position_number(0, None)
    assert_loads(loaded, snap)


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
    save(c, snap)
    loaded = load_as_restart(c)
    assert loaded.name == "ckpt-e2"
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


@pytest.mark.parametrize("layout", ["position", "numbered"])
@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corruption_detected_and_falls_back(tmp_path, case, layout, caplog):
    """Today's ``ckpt-e1`` (its part's manifest re-committed after an edit, so that the edit itself is what a
    restart reads) and an earlier release's ``ckpt-1``: the reader names what is wrong, and a restart falls
    back to the checkpoint before it."""
    corrupt, message = CORRUPTIONS[case]
    storage = open_storage(str(tmp_path))
    first, second = make_snapshot(0), make_snapshot(1)
    if layout == "position":
        c = ckpt(tmp_path)
        save(c, first)
        save(c, second)
        corrupt(pdir(tmp_path, 1))
        if (pdir(tmp_path, 1) / MANIFEST_NAME).exists():
            recommit(cdir(tmp_path, 1))
        number, base, label, older = position_number(1, None), "job/range/_range_0/ckpt-e1/rank-0", "ckpt-e1", "ckpt-e0"
    else:
        write_numbered(storage, 0, first)
        write_numbered(storage, 1, second)
        corrupt(ckdir(tmp_path, 1))
        number, base, label, older = 1, None, "1", "ckpt-0"
    if message is not None:
        with pytest.raises(CorruptCheckpointError, match=message):
            reader(storage).load(number, base=base)
    loaded = load_as_restart(reader(storage))
    assert loaded is not None and loaded.name == older
    assert loaded.manifest.number == (position_number(0, None) if layout == "position" else 0)
    assert_loads(loaded, first)
    if case != "missing manifest" or layout == "position":  # (a ckpt-N without its manifest is not committed)
        assert f"skipping checkpoint {label} " in caplog.text


@pytest.mark.parametrize("layout", ["position", "numbered"])
def test_no_valid_checkpoint_is_an_error_not_a_fresh_start(tmp_path, layout):
    storage = open_storage(str(tmp_path))
    if layout == "position":
        c = ckpt(tmp_path)
        save(c, make_snapshot(0))
        save(c, make_snapshot(1))
        dirs = [pdir(tmp_path, 0), pdir(tmp_path, 1)]
        n0, n1 = "ckpt-e0", "ckpt-e1"
    else:
        write_numbered(storage, 0, make_snapshot(0))
        write_numbered(storage, 1, make_snapshot(1))
        dirs = [ckdir(tmp_path, 0), ckdir(tmp_path, 1)]
        n0, n1 = "ckpt-0", "ckpt-1"
    for d in dirs:
        _corrupt_flip(d)
    with pytest.raises(NoUsableCheckpointError, match=n1 + r" \(corrupt: .*checksum mismatch.*" + n0 + r" \(corrupt: ") as err:
        load_as_restart(reader(storage))
    assert "PADDLE_ACP_START_FRESH=1" in str(err.value) and "PADDLE_JOB_ID" in str(err.value)
    assert [name for name, _ in err.value.rejected] == [n1, n0] and err.value.newer_format == []
    assert all(d.exists() and (d / DATA_NAME).exists() and (d / MANIFEST_NAME).exists() for d in dirs)
    assert names(tmp_path) == [n0, n1]  # nothing deleted, nothing withdrawn
    assert load_as_restart(ckpt(tmp_path / "empty")) is None  # no checkpoint at all: from scratch


def test_the_error_of_many_unusable_checkpoints_is_bounded(tmp_path):
    c = ckpt(tmp_path, keep=0)
    for n in range(20):
        save(c, make_snapshot(n))
        _corrupt_flip(pdir(tmp_path, n))
    with pytest.raises(NoUsableCheckpointError) as err:
        load_as_restart(c)
    msg = str(err.value)
    assert "none of the 20 committed checkpoint(s)" in msg and "and 12 more" in msg
    assert "ckpt-e19 (corrupt: " in msg and "ckpt-e12 (corrupt: " in msg and "ckpt-e11 (" not in msg
    assert len(msg) < 8 * 300 + 1000 and len(err.value.rejected) == 20


def test_a_newer_format_is_skipped_and_never_deleted(tmp_path):
    """A part manifest of a newer format version (a newer paddle-acp wrote it, and committed it): UnknownFormatError,
    not loaded; retention never deletes it."""
    c = ckpt(tmp_path, keep=1)
    save(c, make_snapshot(0))
    path = pdir(tmp_path, 0) / MANIFEST_NAME
    doc = json.loads(path.read_bytes())
    doc["version"] = 99
    doc["checksum"] = 12345  # a newer format may checksum otherwise: the version is read first
    path.write_text(json.dumps(doc))
    recommit(cdir(tmp_path, 0))  # its global.json records this manifest
    with pytest.raises(UnknownFormatError, match="format version 99 is newer"):
        reader(c.storage).load(position_number(0, None), base="job/range/_range_0/ckpt-e0/rank-0")
    with pytest.raises(UnknownFormatError, match="format version 99 is newer"):
        c.load("ckpt-e0", None)
    with pytest.raises(NoUsableCheckpointError) as err:
        load_as_restart(c)
    assert err.value.newer_format == ["ckpt-e0"] and "newer paddle-acp" in str(err.value)
    c2 = ckpt(tmp_path, keep=1)
    save(c2, make_snapshot(1))
    save(c2, make_snapshot(2))
    assert sorted(p.name for p in rdir(tmp_path).iterdir()) == ["ckpt-e0", "ckpt-e2"]
    assert path.read_text() == json.dumps(doc)
    assert load_as_restart(c2).name == "ckpt-e2"
    assert c2.apply_retention(1) == [] and (cdir(tmp_path, 0) / GLOBAL_NAME).exists() and path.exists()


class UnreadableManifests:
    """Real local storage on which reading the manifests under ``prefix`` (a part's and the commit's,
    global.json) fails for now (a storage error, as a permission or a flaky server gives), everything
    else working."""

    def __init__(self, inner, prefix):
        self.inner, self.prefix, self.failing = inner, prefix, True

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name == "read_bytes":
            def read_bytes(path, *a, **k):
                if self.failing and path.startswith(self.prefix) and path.endswith((MANIFEST_NAME, GLOBAL_NAME)):
                    raise StorageError(f"injected: cannot read {path} now")
                return attr(path, *a, **k)
            return read_bytes
        return attr


def test_retention_never_deletes_a_checkpoint_it_cannot_read(tmp_path):
    """Retention looks inside a checkpoint before deleting it (a newer format is never deleted); one
    whose manifests cannot be read now is kept, and deleted by a later save once they can be read."""
    save(ckpt(tmp_path, keep=1), make_snapshot(0))
    storage = UnreadableManifests(open_storage(str(tmp_path)), "job/range/_range_0/ckpt-e0/")
    c = one_process(storage, keep=1)
    save(c, make_snapshot(1))
    assert (cdir(tmp_path, 0) / GLOBAL_NAME).exists() and names(tmp_path) == ["ckpt-e0", "ckpt-e1"]
    storage.failing = False
    save(c, make_snapshot(2))
    assert names(tmp_path) == ["ckpt-e2"] and sorted(os.listdir(rdir(tmp_path))) == ["ckpt-e2"]


def test_leftovers_of_interrupted_saves_are_ignored_then_cleaned(tmp_path):
    """What saves that did not finish left (a part being written, a position whose commit never came) is
    never read; the next save at that position removes it, retention after a newer commit the rest."""
    c = ckpt(tmp_path)
    save(c, make_snapshot(0))
    leftover = cdir(tmp_path, 1) / "rank-0.tmp-deadbeef"  # a part being written (renamed into place once whole)
    leftover.mkdir(parents=True)
    (leftover / DATA_NAME).write_bytes(b"partial")
    uncommitted = cdir(tmp_path, 2)  # a whole part, its position never committed (no global.json)
    uncommitted.mkdir()
    (uncommitted / "rank-0").mkdir()
    for f in (DATA_NAME, MANIFEST_NAME):
        (uncommitted / "rank-0" / f).write_bytes((pdir(tmp_path, 0) / f).read_bytes())
    here = cdir(tmp_path, 3) / "rank-0.tmp-g0-cafe"  # at the position the next save writes
    here.mkdir(parents=True)
    (here / MANIFEST_NAME).write_bytes(b"{")
    assert load_as_restart(c).name == "ckpt-e0"
    assert names(tmp_path) == ["ckpt-e0"]
    assert save(ckpt(tmp_path), make_snapshot(3)).name == "ckpt-e3"
    assert not leftover.exists() and not uncommitted.exists() and not here.exists()
    assert sorted(os.listdir(rdir(tmp_path))) == ["ckpt-e0", "ckpt-e3"]
    assert sorted(os.listdir(cdir(tmp_path, 3))) == sorted([GLOBAL_NAME, "rank-0"])
    loaded = load_as_restart(c)
    assert loaded.name == "ckpt-e3"
    assert_loads(loaded, make_snapshot(3))


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_retention_keeps_exactly_k(tmp_path, keep):
    c = ckpt(tmp_path, keep)
    for e in range(6):
        save(c, make_snapshot(e))
        assert len(names(tmp_path)) == min(e + 1, keep)
    assert names(tmp_path) == [f"ckpt-e{e}" for e in range(6 - keep, 6)]
    assert sorted(os.listdir(rdir(tmp_path))) == sorted(f"ckpt-e{e}" for e in range(6 - keep, 6))


def test_retention_zero_keeps_all(tmp_path):
    c = ckpt(tmp_path, 0)
    for e in range(5):
        save(c, make_snapshot(e))
    assert names(tmp_path) == [f"ckpt-e{e}" for e in range(5)]


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
        st.tuples(st.just("crash"), st.integers(0, 10)),  # (a one-part save commits after 6 operations; then retention)
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
    c = one_process(storage, keep=keep)
    intact = {}  # name -> epoch of checkpoints that are committed and uncorrupted
    epoch = 0  # the next position saved (a save that did not commit is tried again at the same position)
    for op in program:
        if op[0] == "save":
            res = save(c, make_snapshot(epoch))
            assert res.name == f"ckpt-e{epoch}"
            intact[res.name] = epoch
            epoch += 1
        elif op[0] == "crash":
            crashing = one_process(CrashingStorage(storage, op[1]), keep=keep)
            try:
                res = crashing.save(make_snapshot(epoch), "replicated")
            except StorageError:
                continue
            if res.committed:
                intact[res.name] = epoch
                epoch += 1
        elif op[0] == "corrupt":
            on_disk = committed(storage, "job")
            if on_disk:
                d = pdir(tmp, int(on_disk[-1][len("ckpt-e"):]))
                {"flip": _corrupt_flip, "truncate": _corrupt_truncate, "manifest": _corrupt_truncated_manifest}[op[1]](d)
                intact.pop(on_disk[-1], None)
        else:
            on_disk = set(committed(storage, "job"))
            live = {n: e for n, e in intact.items() if n in on_disk}
            if not on_disk:  # no checkpoint at all: from scratch
                assert load_as_restart(c) is None
            elif not live:  # checkpoints, none usable: an error naming each, nothing deleted
                with pytest.raises(NoUsableCheckpointError) as err:
                    load_as_restart(c)
                assert sorted(name for name, _ in err.value.rejected) == sorted(on_disk)
                assert set(committed(storage, "job")) == on_disk
            else:
                loaded = load_as_restart(c)
                newest = max(live, key=live.get)
                assert loaded is not None and loaded.name == newest
                assert loaded.manifest.number == position_number(live[newest], None)
                assert_loads(loaded, make_snapshot(live[newest]))


def test_a_manifest_restarts_would_reject_is_never_written(tmp_path):
    """The writer checks its manifest as a reader will: state the reader refuses (a loader state
    nested too deep, an integer beyond 64 bits) fails the save loudly instead of being written and
    silently skipped by every later restart."""
    from paddle_acp.errors import CheckpointError

    c = ckpt(tmp_path)
    save(c, make_snapshot(0))
    deep = 1
    for _ in range(40):
        deep = [deep]
    for bad in ({"loader_state": deep}, {"loader_state": 2**70}):
        snap = dataclasses.replace(make_snapshot(1), extra=bad)
        with pytest.raises(CheckpointError, match="could not read it back"):
            c.save(snap, "replicated")
    assert names(tmp_path) == ["ckpt-e0"]
    left = [os.path.relpath(os.path.join(d, f), rdir(tmp_path)) for d, ds, fs in os.walk(rdir(tmp_path)) for f in ds + fs]
    assert not [n for n in left if ".tmp-" in n]  # aborted, nothing left
    assert not (cdir(tmp_path, 1) / GLOBAL_NAME).exists() and not (cdir(tmp_path, 1) / "rank-0").exists()
    assert save(c, make_snapshot(1)).name == "ckpt-e1" and load_as_restart(c).name == "ckpt-e1"


# -- the one reader: verify and read_tensors (what every tool uses) -------------------------
# Examples per backend: a remote save and read cost tens of round trips.
READER_EXAMPLES = {"local": 40, "hdfs": 10, "s3": 15}


def test_verify_and_read_tensors_on_every_path(backend_storage):
    """reader.verify and reader.read_tensors read the data file once, in chunks, on every path
    (local: mapped or read into buffers; HDFS and S3: the remote store's stream): they return
    exactly the tensors asked for, report every byte of the file, and refuse a checkpoint with one
    flipped bit."""
    from paddle_acp.format.engine import reader as engine_reader

    local = backend_storage.local_path("") is not None

    @settings(max_examples=READER_EXAMPLES[backend_kind(backend_storage)], deadline=None)
    @given(sizes=st.lists(st.integers(0, 3000), min_size=0, max_size=6), chunk_pages=st.integers(1, 3),
           mapped=st.booleans() if local else st.just(False), pick=st.integers(0, 63),
           flip=st.none() | st.tuples(st.integers(0, 5), st.floats(0, 0.999)))
    def check(sizes, chunk_pages, mapped, pick, flip):
        st_ = backend_storage.sub(uuid.uuid4().hex[:12])
        rng = np.random.default_rng(len(sizes) * 31 + sum(sizes))
        arrays = {f"t{i}": rng.integers(0, 2**31, n, dtype=np.int64) for i, n in enumerate(sizes)}
        write_numbered(st_, 0, Snapshot(RangeRecord("_range_0", 0, 1), [ProgramSnapshot("k", "", [TensorData(n, "int64", a) for n, a in arrays.items()])], None))
        c = reader(st_)
        base = c.base(0)
        want = {("k", n) for i, n in enumerate(arrays) if pick >> i & 1}
        target = None
        if flip is not None:
            nonempty = [n for n, a in arrays.items() if a.nbytes]
            if nonempty:
                name = nonempty[flip[0] % len(nonempty)]
                rec = next(t for t in engine_reader.read_manifest(st_, base, 0, "_range_0").programs[0].tensors if t.name == name)
                target = rec.offset + int(flip[1] * rec.nbytes)
                flip_byte(st_, f"{base}/{DATA_NAME}", target, 0x01)
        seen = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine_reader, "_VERIFY_CHUNK", 4096 * chunk_pages)
            mp.setattr(engine_reader, "_READ_CHUNK", 4096 * chunk_pages)
            if not mapped:
                mp.setattr(engine_reader, "_map_file", lambda fd, size: None)
            if target is not None:
                with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
                    engine_reader.verify(st_, base, 0, "_range_0")
                with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
                    engine_reader.read_tensors(st_, base, 0, "_range_0", want)
                return
            m = engine_reader.verify(st_, base, 0, "_range_0", progress=lambda n, total: seen.append((n, total)))
            m2, got = engine_reader.read_tensors(st_, base, 0, "_range_0", want)
        assert m.data_size == m2.data_size == sum(n for n, _ in seen)
        assert all(total == m.data_size for _, total in seen)
        assert set(got) == want
        for (_k, name), arr in got.items():
            assert arr.dtype == arrays[name].dtype and arr.tobytes() == arrays[name].tobytes()
        if not local:
            st_.delete_dir("")

    check()


@pytest.mark.parametrize("layout", ["position", "numbered"])
def test_reader_checks_the_header_before_any_data(tmp_path, layout):
    """check_header refuses a data file of the wrong size without reading it; verify and read_tensors
    refuse it the same way (nothing unverified is handed on). Today's part and an earlier release's ckpt-N alike."""
    from paddle_acp.format.engine import reader as engine_reader

    st_ = open_storage(str(tmp_path))
    if layout == "position":
        save(ckpt(tmp_path), make_snapshot(0))
        number, base, data = position_number(0, None), "job/range/_range_0/ckpt-e0/rank-0", pdir(tmp_path, 0) / DATA_NAME
    else:
        write_numbered(st_, 0, make_snapshot(0))
        number, base, data = 0, reader(st_).base(0), ckdir(tmp_path, 0) / DATA_NAME
    m, data_path = engine_reader.check_header(st_, base, number, "_range_0")
    assert data_path.endswith(DATA_NAME) and m.number == number
    with open(data, "ab") as f:
        f.write(b"x")
    for call in (lambda: engine_reader.check_header(st_, base, number, "_range_0"),
                 lambda: engine_reader.verify(st_, base, number, "_range_0"),
                 lambda: engine_reader.read_tensors(st_, base, number, "_range_0", {("abc123", "w0")}),
                 lambda: reader(st_).load(number, base=base)):
        with pytest.raises(CorruptCheckpointError, match="bytes, manifest says"):
            call()
    with pytest.raises(CorruptCheckpointError, match="manifest belongs to range"):
        engine_reader.read_manifest(st_, base, number, "_range_1")


# -- the one deletion (which to delete: tests/unit/format/test_preservation.py) ----------------------------------------
@pytest.mark.parametrize("layout", ["position", "numbered"])
def test_delete_checkpoint_removes_the_commit_file_first(tmp_path, layout):
    """Both layouts: the commit file (manifest.json of ckpt-N, global.json of ckpt-e<E>) goes
    first. A directory that cannot be removed after that is an uncommitted leftover, not a checkpoint."""
    from paddle_acp.format.commit.retention import commit_file, delete_checkpoint

    assert commit_file("job/range/r/ckpt-3") == MANIFEST_NAME
    assert commit_file("job/range/r/ckpt-e3-s7") == GLOBAL_NAME
    storage = open_storage(str(tmp_path))
    if layout == "position":
        c = ckpt(tmp_path)
        save(c, make_snapshot(0))
        save(c, make_snapshot(1))
        dirs, commit = [cdir(tmp_path, 0), cdir(tmp_path, 1)], GLOBAL_NAME
    else:
        write_numbered(storage, 0, make_snapshot(0))
        write_numbered(storage, 1, make_snapshot(1))
        dirs, commit = [ckdir(tmp_path, 0), ckdir(tmp_path, 1)], MANIFEST_NAME
    paths = [f"job/range/_range_0/{d.name}" for d in dirs]
    delete_checkpoint(storage, paths[0])
    assert not dirs[0].exists() and names(tmp_path) == [dirs[1].name]

    class StuckDir(type(storage)):  # the directory's removal fails (a crash right after the commit file went)
        def delete_dir(self, path):
            raise StorageError(f"cannot remove {path}")

    stuck = open_storage(str(tmp_path))
    stuck.__class__ = StuckDir
    with pytest.raises(StorageError):
        delete_checkpoint(stuck, paths[1])
    assert dirs[1].exists() and not (dirs[1] / commit).exists()
    assert [(e.name, e.committed) for e in index.entries(storage, "job", "_range_0", uncommitted=True)] == [(dirs[1].name, False)]  # a leftover, never read
    assert names(tmp_path) == [] and load_as_restart(reader(storage)) is None


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
    """A checkpoint committed either way reads back the same (the engine's ckpt-N and today's one-part
    position, its part and its global.json committed that way); where it is written (a temporary
    directory or in place) is the strategy's, and a fence check that fails commits nothing."""
    from paddle_acp.errors import CheckpointError
    from paddle_acp.format.commit import atomic

    root = tmp_path_factory.mktemp("commit")
    st_ = open_storage(str(root))
    strategy = atomic.strategy_for(st_, style)
    c = one_process(st_)
    c.commit_strategy = strategy
    snap = make_snapshot(0, sizes=tuple(sizes))
    if fenced:
        class Refused(CheckpointError):
            pass

        class Fence:  # the writer was fenced by a newer one just before its commit
            fenced_by = None
            generation = 0

            def check(self, what, quick=False, vouch=None):  # (quick: the commit's look-up of the next generation)
                raise Refused(what)

        c.fence = Fence()
        with pytest.raises(Refused, match="commit checkpoint ckpt-e0"):
            c.save(snap, "replicated")
        assert names(root) == [] and load_as_restart(c) is None
        assert not (cdir(root, 0) / GLOBAL_NAME).exists() and not (pdir(root, 0) / MANIFEST_NAME).exists()
        return
    pending = atomic.begin(st_, c.dir, 7, strategy)
    assert (pending.path == pending.final) == strategy.in_place == (style == "manifest-last")
    pending.abort()
    assert not os.listdir(rdir(root))
    write_numbered(st_, 0, snap, job_id="earlier", strategy=strategy)
    assert_loads(load_as_restart(reader(st_, "earlier")), snap)
    assert sorted(os.listdir(root / "earlier" / "range" / "_range_0" / "ckpt-0")) == sorted([DATA_NAME, MANIFEST_NAME])
    assert save(c, snap).committed is True
    assert_loads(load_as_restart(c), snap)
    assert sorted(os.listdir(cdir(root, 0))) == sorted([GLOBAL_NAME, "rank-0"])
    assert sorted(os.listdir(pdir(root, 0))) == sorted([DATA_NAME, MANIFEST_NAME])


_SAVER = """
import sys, numpy as np
from paddle_acp.format.commit import atomic
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.storage import open_storage

st = open_storage(sys.argv[1])
g = GlobalCheckpointer(st, "job", "_range_0", 0, 1, 2)  # a one-process job: rank 0 of 1, keeps 2
g.commit_strategy = atomic.strategy_for(st, sys.argv[2])
for epoch in range(10**6):
    w = np.full(1 << 18, epoch, dtype=np.int64)  # 2 MB: a kill often lands inside a write
    res = g.save(Snapshot(RangeRecord("_range_0", epoch, 10**6), [ProgramSnapshot("k", "", [TensorData("w", "int64", w)])], None), "replicated")
    assert res.committed is True, res
    print(epoch, flush=True)
"""


@pytest.mark.parametrize("style", ["rename", "manifest-last"])
def test_a_writer_killed_anywhere_leaves_only_whole_checkpoints(tmp_path, style):
    """SIGKILL a real process saving in a loop, at a random point after its first commit: every
    checkpoint that looks committed verifies, and the next writer, resuming from the newest, goes on
    over the leftovers at the position after it."""
    import random
    import signal
    import subprocess
    import sys
    import time

    from paddle_acp.format.commit import atomic

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
        storage = open_storage(str(root))
        c = one_process(storage, keep=2)
        c.commit_strategy = atomic.strategy_for(storage, style)
        found = committed(storage, "job")
        assert found
        for name in found:
            loaded = c.load(name, None)
            assert loaded.arrays[("k", "w")][0] == loaded.manifest.range.epoch_no
            assert name == f"ckpt-e{loaded.manifest.range.epoch_no}"
            loaded.close()
        newest = load_as_restart(c)
        assert newest.name == found[-1]
        nxt = newest.manifest.range.epoch_no + 1
        newest.close()
        res = save(c, make_snapshot(nxt))
        assert res.name == f"ckpt-e{nxt}" and res.committed is True and res.nbytes > 0  # written, not found committed
        loaded = load_as_restart(c)
        assert loaded.name == f"ckpt-e{nxt}"
        assert_loads(loaded, make_snapshot(nxt))
        assert sorted(os.listdir(pdir(root, nxt))) == sorted([DATA_NAME, MANIFEST_NAME])
        stray = set(os.listdir(cdir(root, nxt))) - {GLOBAL_NAME, "rank-0"}  # (a global.json.tmp-<id> of the killed
        assert all(n.startswith(GLOBAL_NAME + ".tmp-") for n in stray), stray  # commit: never read, goes with the position)


def assert_nothing_of_it_stays(tmp_path, e):
    """Nothing of the interrupted save of epoch ``e`` stays: no part, no temporary part, no commit (at most the
    position's directory, empty: the parts' parent, made with the first one), and the checkpoint before it is
    the one a restart loads."""
    assert sorted(os.listdir(rdir(tmp_path))) in (["ckpt-e0"], ["ckpt-e0", f"ckpt-e{e}"])
    assert not cdir(tmp_path, e).exists() or os.listdir(cdir(tmp_path, e)) == []
    assert names(tmp_path) == ["ckpt-e0"]
    assert [x.name for x in index.entries(open_storage(str(tmp_path)), "job", "_range_0", uncommitted=True)
            if x.committed] == ["ckpt-e0"]
    assert load_as_restart(reader(open_storage(str(tmp_path)))).name == "ckpt-e0"


def test_a_ctrl_c_right_after_the_save_made_its_directory_leaves_nothing(tmp_path):
    """A KeyboardInterrupt lands at any bytecode: here the moment the save's temporary directory was made
    (what `tests/e2e/test_user_facing.py`'s Ctrl-C test once caught in CI: the directory was made before the
    block that removes it on any exception was entered, and stayed). Nothing of that save stays; the
    checkpoint before it is intact and the next save goes on."""
    c = ckpt(tmp_path)
    save(c, make_snapshot(0))
    real = type(c.storage).makedirs
    calls = []

    def makedirs(self, path):
        real(self, path)
        if ".tmp-" in path and not calls:
            calls.append(path)
            raise KeyboardInterrupt
    c.storage.makedirs = makedirs.__get__(c.storage)
    with pytest.raises(KeyboardInterrupt):
        c.save(make_snapshot(1), "replicated")
    assert calls and not c.storage.exists(calls[0])
    assert_nothing_of_it_stays(tmp_path, 1)
    assert save(c, make_snapshot(1)).name == "ckpt-e1" and load_as_restart(c).name == "ckpt-e1"


def test_a_ctrl_c_during_an_overlapped_write_waits_for_one_piece_of_the_data_not_all(tmp_path, monkeypatch):
    """Where the manifest is written beside the data (HDFS: ``overlap_writes``), a Ctrl-C on the
    training thread while the manifest is written used to wait for the data thread to write the whole
    state (on a remote store, seconds per GB) before the save was given up. The data thread now stops
    at its next piece; nothing of the save stays and the next save goes on."""
    import threading
    import time

    monkeypatch.setattr("paddle_acp.storage.base.WRITE_CHUNK", 4096)  # the data's pieces
    c = ckpt(tmp_path)
    save(c, make_snapshot(0))
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
        c.save(snap, "replicated")
    n = len(pieces)
    time.sleep(0.2)  # the data thread wrote no piece after the save was given up
    assert n == len(pieces) and n < total // 4, (n, total)
    st_.open_output, st_.write_bytes = real_open, real_write_bytes
    assert_nothing_of_it_stays(tmp_path, 1)
    assert save(c, make_snapshot(1)).name == "ckpt-e1" and load_as_restart(c).name == "ckpt-e1"


# -- one rank on HDFS: global.json written beside the part ---------------------------------------
class Spy:
    """``inner`` with every call logged as (method, first argument); ``fail_data``: the data file's write fails."""

    def __init__(self, inner, fail_data=False):
        self._inner, self.log, self.fail_data = inner, [], fail_data

    def __getattr__(self, name):
        v = getattr(self._inner, name)
        if not callable(v):
            return v

        def call(*args, **kwargs):
            self.log.append((name, args[0] if args else None))
            if self.fail_data and name in ("write_buffers", "write_image") and str(args[0]).endswith(DATA_NAME):
                raise StorageError("injected: the data file cannot be written")
            return v(*args, **kwargs)
        return call


def every_name(st_, path):
    out = []
    for e in st_.listdir(path):
        out.append(f"{path}/{e.name}")
        if e.is_dir:
            out += every_name(st_, f"{path}/{e.name}")
    return out


def test_one_rank_stages_its_global_json_beside_its_part_where_writes_overlap(backend_storage):
    """Where the storage overlaps writes and renames (HDFS), a one-process job's global.json is written while its
    part's files are, before the part's rename, and renamed into place by the commit; everywhere the checkpoints
    load and nothing temporary is left."""
    spy = Spy(backend_storage)
    c = one_process(spy)
    snaps = [make_snapshot(e) for e in range(2)]
    for s in snaps:
        assert save(c, s).committed is True
    staged = backend_kind(backend_storage) == "hdfs"
    for e in range(2):
        gdir = f"job/range/_range_0/ckpt-e{e}"
        writes = [i for i, (m, p) in enumerate(spy.log) if m == "write_bytes" and str(p).startswith(f"{gdir}/{GLOBAL_NAME}")]
        part_rename = [i for i, (m, p) in enumerate(spy.log) if m == "rename" and str(p).startswith(f"{gdir}/rank-0.tmp")]
        assert len(writes) == 1
        assert bool(part_rename) is (backend_kind(backend_storage) != "s3")  # (S3: written in place, no rename)
        assert (bool(part_rename) and writes[0] < part_rename[0]) is staged, spy.log
    assert_loads(load_as_restart(one_process(backend_storage)), snaps[1])
    assert not [n for n in every_name(backend_storage, "job/range") if ".tmp-" in n]


def test_a_failed_part_write_leaves_no_staged_global_json(backend_storage):
    """The part's data cannot be written: the save fails, the global.json staged for it is removed with its
    part, nothing is committed at that position, and the next save commits."""
    c = one_process(Spy(backend_storage, fail_data=True))
    with pytest.raises(StorageError, match="injected"):
        c.save(make_snapshot(0), "replicated")
    assert not [n for n in every_name(backend_storage, "job/range") if ".tmp-" in n or n.endswith(GLOBAL_NAME)]
    ok = one_process(backend_storage)
    assert save(ok, make_snapshot(1)).committed is True
    assert committed(backend_storage, "job", "_range_0") == ["ckpt-e1"]
