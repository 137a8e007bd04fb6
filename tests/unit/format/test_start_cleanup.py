"""StartCleanup on its own (format/checkpoints/cleanup.py): the restart's verdicts and the start's clean-up,
with the checkpointer's listing, part removal and newer-format guard as plain callables."""

import pytest

from paddle_acp.errors import StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.cleanup import StartCleanup
from paddle_acp.format.checkpoints.global_reader import GlobalEntry
from paddle_acp.format.commit.fencing import write_job_marker
from paddle_acp.format.layout import GLOBAL_NAME, parse_name, position_key, range_dir
from paddle_acp.storage import open_storage

JOB, RANGE = "job", "_range_0"
DIR = range_dir(JOB, RANGE)


def _entry(name):
    return index.Entry(name, index.GLOBAL, -1, position_key(*parse_name(name)), True, f"{DIR}/{name}")


def _start(tmp_path, names, rank=0):
    """A rank's StartCleanup over committed checkpoints ``names`` (each a global.json on local storage);
    (it, the names ``scan`` was called for, the positions whose part was removed)."""
    st = open_storage(str(tmp_path))
    write_job_marker(st, JOB)
    for n in names:
        st.makedirs(f"{DIR}/{n}")
        st.write_bytes(f"{DIR}/{n}/{GLOBAL_NAME}", b"{}")
    scanned, removed = [], []

    def scan():
        scanned.append(True)
        return [GlobalEntry(n, *parse_name(n), st.exists(f"{DIR}/{n}/{GLOBAL_NAME}")) for n in names]
    return StartCleanup(st, JOB, RANGE, DIR, rank, None, scan, removed.append, lambda g: True), scanned, removed


def test_the_restarts_verdicts_outlive_the_start_and_a_save_replacing_a_position_clears_its_own(tmp_path):
    names = ["ckpt-e0", "ckpt-e1", "ckpt-e2"]
    start, scanned, removed = _start(tmp_path, names)
    start.remember_listing([_entry(n) for n in names], rejected=[
        index.Rejection(_entry("ckpt-e1"), index.CORRUPT, ValueError("bad crc")),
        index.Rejection(_entry("ckpt-e2"), index.UNREADABLE, OSError("denied"))])
    start.discard_newer(position_key(0, None))
    assert scanned == []  # the restart's listing, not a new one
    assert removed == ["ckpt-e1"]  # proven bad: withdrawn, this rank's part removed
    assert not (tmp_path / DIR / "ckpt-e1" / GLOBAL_NAME).exists()
    assert (tmp_path / DIR / "ckpt-e2" / GLOBAL_NAME).exists()  # could not be read: kept, never written over
    with pytest.raises(StorageError, match="ckpt-e2 .*is not written.*could not read it"):
        start.check_writable("ckpt-e2")
    start.check_writable("ckpt-e3")
    assert start.known_clear("ckpt-e3") and start.known_clear("ckpt-e1")
    assert not start.known_clear("ckpt-e2") and not start.known_clear("ckpt-e0")
    # retention's view: both still passed over after the clean-up, until a save of this incarnation commits one
    assert start.restart_rejected("ckpt-e1") and start.restart_rejected("ckpt-e2")
    start.replaced("ckpt-e1")
    assert not start.restart_rejected("ckpt-e1") and start.restart_rejected("ckpt-e2")


def test_without_the_restarts_listing_the_start_lists_and_the_caller_vouches(tmp_path):
    names = ["ckpt-e0", "ckpt-e1"]
    start, scanned, removed = _start(tmp_path, names, rank=1)
    assert not start.known_clear("ckpt-e1")  # nothing made sure of before the clean-up
    start.discard_newer(None)  # a fresh start: every position is trained again
    assert scanned == [True] and removed == names
    assert (tmp_path / DIR / "ckpt-e1" / GLOBAL_NAME).exists()  # only rank 0 withdraws
    assert start.known_clear("ckpt-e0") and not start.restart_rejected("ckpt-e0")
    start.remember_listing([_entry(n) for n in names])  # a listing is used once: the next clean-up lists again
    start.discard_newer(None)
    start.discard_newer(None)
    assert scanned == [True, True]
