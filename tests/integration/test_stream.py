"""Streamed saves (format/engine/stream.py) and sizing the snapshot buffer without copying.

A streamed save writes a checkpoint's data file through a bounded buffer in chunks: the file must
be byte for byte the image an unbounded save writes (tensors at their offsets, zero padding), with
the same per-tensor checksums, whatever the tensor sizes and the chunk size; a writer that fails
midway must never leave the copy waiting.
"""

import os
import threading
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.format.engine.arena import alloc_buffer
from paddle_acp.format.engine.stream import PAGE, ChunkStream, StreamAborted, chunk_size, write_stream
from paddle_acp.format.manifest import VERSION, align, checksum_function
from paddle_acp.storage import open_storage


def laid_out(sizes, seed):
    rng = np.random.default_rng(seed)
    tensors, off = [], 0
    for n in sizes:
        tensors.append(types.SimpleNamespace(offset=off, array=rng.integers(0, 256, n, dtype=np.uint8)))
        off += align(n)
    image = np.zeros(off, np.uint8)
    for t in tensors:
        image[t.offset:t.offset + t.array.nbytes] = t.array
    return tensors, off, image


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 300_000), min_size=1, max_size=8), st.integers(1, 16), st.integers(2, 4),
       st.integers(0, 2**32 - 1))
def test_streamed_file_is_the_image(tmp_path_factory, sizes, pages, slots, seed):
    tensors, size, image = laid_out(sizes, seed)
    chunk = pages * PAGE
    stream = ChunkStream(tensors, size, alloc_buffer(chunk * slots), chunk)
    root = tmp_path_factory.mktemp("stream")
    stream.start()
    written = write_stream(open_storage(str(root)), "tensors.bin", stream)
    stream.join()
    assert written == size
    with open(root / "tensors.bin", "rb") as f:
        assert f.read() == image.tobytes()
    fn = checksum_function(VERSION)
    assert stream.checksums() == [fn(memoryview(t.array), 0) if t.array.nbytes else 0 for t in tensors]
    assert stream.nchunks == (size + chunk - 1) // chunk


def test_chunk_size():
    assert chunk_size(16 << 20) == 8 << 20
    assert chunk_size(1 << 30) == 64 << 20
    assert chunk_size((32 << 20) + 123) % PAGE == 0


@pytest.mark.parametrize("fail_at", [0, 2])
def test_a_failing_writer_never_leaves_the_copy_waiting(tmp_path, fail_at):
    tensors, size, _image = laid_out([1 << 20] * 6, 1)
    chunk = 64 << 10
    stream = ChunkStream(tensors, size, alloc_buffer(2 * chunk), chunk)
    stream.start()

    def writer():
        for i, _chunk in enumerate(stream.chunks()):
            if i == fail_at:
                raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        writer()
    done = threading.Event()
    threading.Thread(target=lambda: (stream.join(), done.set()), daemon=True).start()
    assert done.wait(30), "the copy still waits for a slot after the writer failed"
    with pytest.raises(StreamAborted):  # what is left cannot be written as a checkpoint
        next(stream.chunks())


def test_a_writer_that_never_starts_is_released_by_abort(tmp_path):
    tensors, size, _image = laid_out([1 << 20] * 4, 2)
    stream = ChunkStream(tensors, size, alloc_buffer(2 * PAGE * 4), PAGE * 4)
    stream.start()
    stream.abort("the storage listing failed")  # what the saver does when the save fails before writing
    stream.join()
    with pytest.raises(StreamAborted, match="listing failed"):
        list(stream.chunks())


def test_registration_sizes_the_arena_without_copying(tmp_path, monkeypatch):
    """No tensor is viewed or copied at registration; the buffer is sized from metadata alone."""
    import paddle

    import paddle_acp as acp
    from paddle_acp.adapter import tensors as tensors_mod
    from paddle_acp.format.layout import layout
    from paddle_acp.runtime import api

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard("sizing_"):
        x = paddle.static.data("x", [None, 64], "float32")
        h = paddle.static.nn.fc(x, 300, weight_attr=paddle.ParamAttr(name="sz.w"), bias_attr=paddle.ParamAttr(name="sz.b"))
        loss = paddle.mean(h * h)
        paddle.optimizer.Adam(1e-3).minimize(loss)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup, scope=scope)
    viewed = []
    real_view = tensors_mod.tensor_view

    def counting_view(tensor):
        dt, arr = real_view(tensor)
        viewed.append(arr.nbytes)
        return dt, arr

    monkeypatch.setattr(tensors_mod, "tensor_view", counting_view)
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path / "ck"))
    api.reset()
    feed = {"x": np.ones((2, 64), "float32")}
    it = acp.train_epoch_range(2, save_checkpoint_inter=0)
    next(it)
    r = api.active_range()
    exe.run(main, feed=feed, fetch_list=[loss], scope=scope)  # registers the program
    r.persister.buffers.join()
    assert viewed == [], "registration viewed or copied tensors"
    (entry,) = r.registry.entries
    views = entry.views()
    assert entry.nbytes() == layout([views]) > 300 * 64 * 4 * 3
    assert r.persister.buffers.first.nbytes >= entry.nbytes()
    viewed.clear()
    for _ in it:  # the saves view every tensor, as before
        exe.run(main, feed=feed, fetch_list=[loss], scope=scope)
    assert viewed
    api.reset()


@pytest.mark.parametrize("flip,victim", [(None, None), (0, "t0"), (123_456, "t2"), ((9 << 20) + 100_000, "t3")])
def test_spool_verifies_every_tensor_on_its_way(tmp_path, flip, victim):
    """A remote restore over the budget: the reader's one verification loop copies the data file
    into an unlinked local spool file, every tensor checksummed on the way; one flipped byte
    anywhere is refused and leaves no spool behind."""
    from support.newest import one_process, save

    from paddle_acp.errors import CorruptCheckpointError
    from paddle_acp.format.engine import reader
    from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
    from paddle_acp.format.layout import position_number
    from paddle_acp.format.manifest import DATA_NAME, RangeRecord

    rng = np.random.default_rng(7)
    arrays = [rng.integers(0, 256, n, dtype=np.uint8) for n in (100_000, 0, 50_000, 9 << 20, 7)]
    st_ = open_storage(str(tmp_path / "root"))
    ck = one_process(st_)  # a one-process job's checkpoint of epoch 0: its rank-0 part holds the data file
    save(ck, Snapshot(RangeRecord("_range_0", 0, 1),
                      [ProgramSnapshot("k", "", [TensorData(f"t{i}", "uint8", a) for i, a in enumerate(arrays)])], None))
    base, number = f"{ck.dir}/ckpt-e0/rank-0", position_number(0, None)
    data_file = tmp_path / "root" / base / DATA_NAME
    image = data_file.read_bytes()
    m, data_path = reader.check_header(st_, base, number, "_range_0")
    if flip is not None:
        offset = next(t.offset for t in m.programs[0].tensors if t.name == victim)
        raw = bytearray(image)
        raw[offset + flip % max(1, arrays[int(victim[1:])].nbytes)] ^= 1
        data_file.write_bytes(bytes(raw))
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    if flip is not None:
        with pytest.raises(CorruptCheckpointError, match=f"checksum mismatch in tensor '{victim}'"):
            reader._spool_verified(st_, m, data_path, reader._records(m), 1, str(spool_dir))
        assert os.listdir(spool_dir) == []  # the spool is gone
        return
    src = reader._spool_verified(st_, m, data_path, reader._records(m), 1, str(spool_dir))
    try:
        assert os.listdir(spool_dir) == []  # unlinked at once
        assert os.pread(src._fd, len(image) + 1, 0) == image
    finally:
        os.close(src._fd)
    with open(data_file, "ab") as f:  # a data file whose size the manifest does not state
        f.write(b"x" * 4096)
    with pytest.raises(CorruptCheckpointError):
        reader.check_header(st_, base, number, "_range_0")
