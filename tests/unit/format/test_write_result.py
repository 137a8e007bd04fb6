"""The writer returns what it wrote (a WriteResult); a Snapshot holds the checkpoint's content only.

On every real backend (a local disk: rename commit; HDFS and S3: data and manifest written at once),
for each of the writer's three data sources (the tensors' own arrays, a laid-out image, a stream
of chunks): the result's data size is the data file's size, its manifest bytes are the committed
manifest file's, its checksums are the manifest's, and the snapshot is left exactly as it was.
A save's runtime facts (stall, waits, buffer, durable, queued, skips, rank 0's wait for the parts)
are not the snapshot's: the format layer takes rank 0's wait as an argument.
"""

import dataclasses
import time
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import backend_kind, backend_storage, hdfs_server, s3_server  # noqa: F401  (fixtures)

from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.commit import atomic
from paddle_acp.format.engine.arena import Arena, alloc_buffer
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData, copy_into
from paddle_acp.format.engine.stream import PAGE, ChunkStream
from paddle_acp.format.engine.writer import WriteResult, write_checkpoint
from paddle_acp.format.layout import DATA_NAME, MANIFEST_NAME, layout
from paddle_acp.format.manifest import Manifest, RangeRecord
from paddle_acp.storage import open_storage

# what a save decides at run time, no longer fields of the snapshot (issue 26)
MOVED = {"stall_seconds", "waited_seconds", "buffer", "durable", "queued", "skipped_before", "part_wait", "manifest"}
EXAMPLES = {"local": 25, "hdfs": 6, "s3": 10}


def programs(sizes, seed):
    rng = np.random.default_rng(seed)
    ts = [TensorData(f"t{i}", "uint8", rng.integers(0, 256, n, dtype=np.uint8)) for i, n in enumerate(sizes)]
    ts.append(TensorData("step", "int64", np.array([seed], dtype="int64")))
    return [ProgramSnapshot("fp-a", "test", ts, {"last_epoch": seed})]


def make(sizes, seed, source):
    progs = programs(sizes, seed)
    size = layout(progs)
    image = stream = None
    if source == "image":
        image = Arena().ensure(size)
        copy_into(progs, image)
    elif source == "stream":
        stream = ChunkStream([t for p in progs for t in p.tensors], size, alloc_buffer(2 * PAGE), PAGE)
    return Snapshot(RangeRecord("_range_0", seed, 10), progs, None, "3.3.1", "pir",
                    extra={"loader_state": {"seed": seed}}, image=image, data_size=size, stream=stream)


def state(snap):
    """Everything a snapshot holds, compared after the write (the arrays' bytes and where they point)."""
    tensors = [(t.name, t.dtype, t.offset, t.array.tobytes(), t.array.ctypes.data) for p in snap.programs
               for t in p.tensors]
    return (dataclasses.astuple(snap.range), snap.rng, repr(snap.extra), snap.data_size, snap.mode, snap.share,
            None if snap.image is None else snap.image.ctypes.data, snap.stream, tensors)


def test_the_snapshot_holds_content_only():
    names = {f.name for f in dataclasses.fields(Snapshot)}
    assert names == {"range", "programs", "rng", "paddle_version", "ir", "extra", "image", "data_size", "mode",
                     "share", "stream"}
    assert not names & MOVED
    snap = make([10, 0, 5000], 1, "views")
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.data_size = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.manifest = b"{}"  # type: ignore[attr-defined]


def test_a_snapshot_is_laid_out_when_it_is_made():
    progs = programs([7, 4097, 0, 1], 3)
    snap = Snapshot(RangeRecord("_range_0", 0, 1), progs, None)
    offsets = [t.offset for t in progs[0].tensors]
    assert snap.data_size == layout(programs([7, 4097, 0, 1], 3)) > 0
    assert offsets == sorted(offsets) and offsets[0] == 0 and -1 not in offsets
    again = dataclasses.replace(snap, extra={"x": 1})  # a given data size is kept, the tensors not laid out again
    assert again.data_size == snap.data_size and [t.offset for t in progs[0].tensors] == offsets


@pytest.mark.parametrize("source", ["views", "image", "stream"])
def test_the_write_result_is_what_was_written(backend_storage, source):
    kind = backend_kind(backend_storage)

    @settings(max_examples=EXAMPLES[kind], deadline=None, suppress_health_check=list(HealthCheck))
    @given(sizes=st.lists(st.integers(0, 3 * PAGE + 17), min_size=0, max_size=5), seed=st.integers(0, 1 << 20))
    def check(sizes, seed):
        storage = backend_storage.sub(uuid.uuid4().hex[:12])
        snap = make(sizes, seed, source)
        before = state(snap)
        pending = atomic.begin(storage, "job/range/_range_0", 4)
        if snap.stream is not None:
            snap.stream.start()
        res = write_checkpoint(pending, snap, 4)
        if snap.stream is not None:
            snap.stream.join()
        assert isinstance(res, WriteResult)
        assert res.number == 4 and res.path == "job/range/_range_0/ckpt-4"
        assert res.data_size == snap.data_size == storage.stat(f"{res.path}/{DATA_NAME}")[1]
        raw = storage.read_bytes(f"{res.path}/{MANIFEST_NAME}")
        assert res.manifest == raw
        m = Manifest.loads(raw, data_file_size=res.data_size)
        assert m.number == 4 and m.data_size == res.data_size
        assert res.checksums == tuple(t.checksum for p in m.programs for t in p.tensors)
        assert len(res.checksums) == len(sizes) + 1
        assert state(snap) == before  # nothing written into the snapshot
        with pytest.raises(dataclasses.FrozenInstanceError):
            res.data_size = 0  # type: ignore[misc]

    check()


def test_a_part_is_written_without_touching_the_snapshot_and_rank_0_waits_as_told(tmp_path):
    """GlobalCheckpointer records the part's ownership in the part's manifest, not in the caller's
    snapshot; rank 0's wait for the parts is an argument of the save (a preemption save's shorter
    wait), not a field of the snapshot."""
    g = GlobalCheckpointer(open_storage(str(tmp_path)), "job", "_range_0", 0, 2, 3, part_timeout=300.0)
    g.poll_interval = 0.01
    snap = make([100, 3], 2, "image")
    before = state(snap)
    t0 = time.monotonic()
    res = g.save(snap, "per-rank", wait=True, part_wait=0.3)  # rank 1 never writes its part
    waited = time.monotonic() - t0
    assert res.committed is False and res.nbytes == snap.data_size
    # about the 0.3 s it was told (its deadline is set a moment before the wait is timed: 0.2998 s once), never
    # the 300 s part timeout
    assert 0.25 <= res.waited < 30 and waited < 60, f"rank 0 waited {res.waited:.3f} s for the parts, not the 0.3 s it was told"
    assert state(snap) == before and "part" not in snap.extra
    g.committer.wait_all()
