"""A named pipe (or another non-regular file) where a small file should be, on a local disk: every read and write
opens without blocking and refuses it with a StorageError naming it, so a restart falls back and the tools answer,
as for an unreadable file; nothing waits forever, nothing is deleted.

The checkpoints are written by the format layer's own writer (no Paddle)."""
from __future__ import annotations

import os
import threading
import zlib

import numpy as np
import pytest
from support.newest import load_as_restart, one_process, save

from paddle_acp import cli
from paddle_acp.errors import StorageError
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.storage import open_storage

JOB, RANGE = "jobF", "_range_0"
LIMIT_S = 20.0


def _bounded(fn, fifo):
    """fn() in a thread; a hang opens the pipe's other end (freeing it) and fails the test."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(LIMIT_S)
    if t.is_alive():
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # the blocked open returns; the read sees EOF at close
        os.close(fd)
        t.join(5)
        pytest.fail(f"blocked on the named pipe {fifo} for {LIMIT_S} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _fifo(path):
    if os.path.lexists(path):
        os.remove(path)
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("op", ["read_bytes", "open_input", "append_bytes", "write_bytes"])
def test_every_local_read_and_write_refuses_a_named_pipe_at_once(tmp_path, op):
    st = open_storage(str(tmp_path))
    fifo = _fifo(tmp_path / "global.json")
    calls = {"read_bytes": lambda: st.read_bytes("global.json", limit=100),
             "open_input": lambda: st.open_input("global.json").close(),
             "append_bytes": lambda: st.append_bytes("global.json", b"x\n"),
             "write_bytes": lambda: st.write_bytes("global.json", b"{}")}
    with pytest.raises(StorageError, match=r"global\.json.*named pipe|global\.json failed"):
        _bounded(calls[op], fifo)
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # left as it is, never written into


def test_a_directory_is_refused_and_regular_files_still_read_and_write(tmp_path):
    st = open_storage(str(tmp_path))
    os.mkdir(tmp_path / "d")
    with pytest.raises(StorageError, match="directory, not a regular file"):
        st.read_bytes("d")
    st.write_bytes("f", b"abc")
    st.append_bytes("f", b"def")
    st.append_bytes("g", b"new")
    assert st.read_bytes("f") == b"abcdef" and st.read_bytes("g") == b"new"
    assert st.read_bytes("f", limit=2) == b"abc"  # limit + 1: more than the limit
    with st.open_input("f") as f:
        assert f.size() == 6 and f.read(2) == b"ab"
        f.seek(4)
        buf = bytearray(2)
        assert f.readinto(buf) == 2 and bytes(buf) == b"ef"


def _snapshot(epoch):
    ts = [TensorData("w", "float32", np.full(4, epoch, dtype="float32"))]
    return Snapshot(RangeRecord(RANGE, epoch, 3, None), [ProgramSnapshot("fp", "pir: t", ts, None)], None, "3.3.1",
                    "pir")


def _three(root):
    ck = one_process(open_storage(str(root)), JOB, RANGE, keep=0)
    for e in range(3):
        save(ck, _snapshot(e))
    return ck


def _place(root, case):
    pos = root / JOB / "range" / RANGE / "ckpt-e2"
    if case == "mark":  # a rank's verdict naming the CRC32 of ckpt-e2's global.json: its reason is read
        crc = zlib.crc32((pos / "global.json").read_bytes()) & 0xFFFFFFFF
        return pos / f"bad-rank-0-{crc:08x}"
    os.makedirs(root / JOB / "metrics", exist_ok=True)
    return {"global": pos / "global.json", "manifest": pos / "rank-0" / "manifest.json",
            "data": pos / "rank-0" / "tensors.bin", "job": root / JOB / "job.json",
            "metrics": root / JOB / "metrics" / "trainer-0.jsonl"}[case]


@pytest.mark.parametrize("case", ["global", "manifest", "data", "mark"])
def test_a_restart_falls_back_past_a_named_pipe(tmp_path, case):
    ck = _three(tmp_path)
    fifo = _fifo(_place(tmp_path, case))
    loaded = _bounded(lambda: load_as_restart(ck), fifo)
    assert loaded is not None and loaded.manifest.range.epoch_no == 1
    loaded.close()
    assert os.path.exists(fifo)


@pytest.mark.parametrize("case", ["global", "manifest", "mark", "job", "metrics"])
def test_the_tools_answer_with_a_named_pipe_in_place(tmp_path, case, capsys):
    _three(tmp_path)
    fifo = _fifo(_place(tmp_path, case))
    pos = tmp_path / JOB / "range" / RANGE / "ckpt-e2"
    for args in (["ls", tmp_path], ["ls", tmp_path, "--verify", "--json"], ["verify", tmp_path],
                 ["gc", tmp_path, "--keep", "1", "--dry-run"], ["inspect", pos], ["stats", tmp_path, "--job", JOB]):
        def tool(args=args):
            try:
                return cli.main([str(a) for a in args])
            except SystemExit as exc:
                return exc.code
        rc = _bounded(tool, fifo)
        out, err = capsys.readouterr()
        assert rc in (0, 1, 2), (args, rc)
        assert "Traceback" not in err, err
        if rc == 2:  # one clear line
            assert err.startswith("paddle-acp: error: ") and len(err.strip().splitlines()) == 1, (args, err)
    assert os.path.exists(fifo)
