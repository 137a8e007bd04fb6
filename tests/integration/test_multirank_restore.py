"""A rank's restore reads the global manifest and only the parts it loads (issue 28 item 4): its
storage calls are the same at any world size (counted by a pass-through wrapper around a real local
storage, tests/support/counting.py; Paddle-free), and a part it loads that is damaged on a real
backend (local disk, HDFS, S3) is refused by that rank alone, which marks the copy bad and stops."""

import copy
import os
import sys
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import backend_storage, hdfs_server, s3_server  # noqa: F401  (pytest fixtures)
from support.counting import counting, total

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unit", "format"))  # tests/unit/format/test_multirank.py
from test_multirank import JOB, RANGE, snapshot

from paddle_acp.errors import CorruptCheckpointError, RestartRequiredError, StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.commit.fencing import Fence, write_job_marker
from paddle_acp.format.layout import bad_mark, position_name
from paddle_acp.storage import open_storage

MAX_RESTART_CALLS = 20  # the target per rank
RDIR = f"{JOB}/range/{RANGE}"


def save_all(st, world, epoch, mode="per-rank"):
    """Every rank writes its part of ``epoch`` (ranks 1.. first), then rank 0 commits."""
    for r in list(range(1, world)) + [0]:
        res = GlobalCheckpointer(st, JOB, RANGE, r, world, 3, 60.0).save(
            snapshot(r, epoch, tensors=mode == "per-rank" or r == 0), mode)
    assert res.committed is True


def restart(st, rank, world, mode):
    """Rank ``rank``'s restart in a job of ``world`` ranks: its fence, the checkpoint it resumes from
    (found, verified, loaded) and the clean-up of what is newer; (checkpoint name, rank held, gck)."""
    if rank == 0:
        write_job_marker(st, JOB)
    fence = Fence.take(st, JOB, rank)
    gck = GlobalCheckpointer(st, JOB, RANGE, rank, world, 3, 5.0, fence)
    loaded = load_newest(PartReader(st, JOB, RANGE), gck, mode)
    assert loaded is not None
    gck.resume_from(loaded)
    gck.start.discard_newer(loaded.position_key)
    held = int(loaded.arrays[("fp-shared", "rank")][0])
    loaded.close()
    return loaded.name, held, gck


@pytest.mark.parametrize("mode", ["per-rank", "replicated"])
def test_a_ranks_restart_costs_the_same_storage_calls_at_any_world_size(tmp_path, mode):
    got = {}
    for world in (4, 16, 64):
        st = open_storage(str(tmp_path / f"w{world}"))
        for e in (0, 1):
            save_all(st, world, e, mode)
        for rank in (0, 1, world - 1):
            counted = counting(st)
            name, held, _g = restart(counted, rank, world, mode)
            assert (name, held) == ("ckpt-e1", rank if mode == "per-rank" else 0)
            got[(world, rank)] = (total(counted), dict(counted.calls))
    for which in (lambda w: 0, lambda w: 1, lambda w: w - 1):
        per_world = {w: got[(w, which(w))] for w in (4, 16, 64)}
        assert len({n for n, _calls in per_world.values()}) == 1, per_world  # flat: no call per other rank
        assert per_world[64][0] <= MAX_RESTART_CALLS, per_world


def _truncate(st, path):
    st.write_bytes(path, st.read_bytes(path)[:-3])


def _extend(st, path):
    st.write_bytes(path, st.read_bytes(path) + b"\0")


def _remove(st, path):
    st.delete_file(path)


def _directory(st, path):
    st.delete_file(path)
    st.makedirs(path)
    st.write_bytes(f"{path}/x", b"x")


@pytest.mark.parametrize("damage, says", [(_truncate, "(short read|has 125 bytes, manifest says 128)"),
                                          (_extend, "(is larger than the 128 bytes|has 129 bytes, manifest says 128)"),
                                          (_remove, "is missing"), (_directory, "tensors.bin: the tensors.bin is a directory")])
def test_a_damaged_part_on_a_real_backend_is_refused_by_its_rank_alone_which_marks_it(backend_storage, damage, says):
    """Rank 1's data file of ckpt-e1 is damaged: its size is checked as it is read (no stat first on
    remote stores). Rank 0 never reads it and resumes from ckpt-e1; rank 1 marks the copy and stops;
    rank 0 stops at its base check; the restart resumes both ranks from ckpt-e0, their own state."""
    st = backend_storage
    for e in (0, 1):
        save_all(st, 2, e)
    crc = zlib.crc32(st.read_bytes(f"{RDIR}/ckpt-e1/global.json"))
    damage(st, f"{RDIR}/ckpt-e1/rank-1/tensors.bin")
    name, held, g0 = restart(st, 0, 2, "per-rank")
    assert (name, held) == ("ckpt-e1", 0)
    with pytest.raises(RestartRequiredError, match=f"rank 1: its part of checkpoint .*{says}.*does not fall back alone"):
        restart(st, 1, 2, "per-rank")
    assert [e.name for e in st.listdir(f"{RDIR}/ckpt-e1") if e.name.startswith("bad-")] == [bad_mark(1, crc)]
    with pytest.raises(RestartRequiredError, match="marked bad at restore by rank.s. 1"):
        g0.check_base()
    for r in (0, 1):
        assert restart(st, r, 2, "per-rank")[:2] == ("ckpt-e0", r)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(positions=st.dictionaries(st.tuples(st.integers(0, 30), st.one_of(st.none(), st.integers(0, 40))), st.booleans(),
                                 max_size=8))
def test_a_restart_listed_with_one_call_tries_the_checkpoints_the_full_listing_tries(tmp_path_factory, positions):
    """restart_candidates (one listing; a checkpoint found uncommitted when its global.json is missing)
    tries the committed checkpoints of several ranks in the order index.entries (an exists per
    directory) gives them, and passes over exactly the uncommitted ones."""
    st_ = open_storage(str(tmp_path_factory.mktemp("cand")))
    parent = f"{JOB}/range/{RANGE}"
    st_.makedirs(parent)
    for (epoch, step), committed in positions.items():
        name = position_name(epoch, step)
        st_.makedirs(f"{parent}/{name}/rank-0")
        if committed:
            st_.write_bytes(f"{parent}/{name}/global.json", b"{}")
    full = [e.name for e in index.entries(st_, JOB, RANGE)]
    listed, lazy = index.restart_candidates(st_, JOB, RANGE)
    assert lazy
    tried = []

    def load(e):
        if not st_.exists(f"{e.path}/global.json"):
            raise index.NotCommitted(e.path)
        tried.append(e.name)
        raise CorruptCheckpointError("try the next")
    search = index.first_usable(listed, load, log=False)
    assert tried == full and [r.entry.name for r in search.rejected] == full


def _deleting_after_open(storage, suffix, action):
    """A copy of ``storage`` (same backend, same connection) that runs ``action()`` once, right after
    it opened a file whose path ends with ``suffix`` and before anything of it is read: the
    interleaving of two ranks' restarts forced, on the real backend."""
    base = type(storage)
    done = []

    def open_input(self, path):
        f = base.open_input(self, path)
        if path.endswith(suffix) and not done:
            done.append(path)
            action()
        return f
    st_ = copy.copy(storage)
    st_.__class__ = type(f"AfterOpen{base.__name__}", (base,), {"open_input": open_input})
    return st_, done


@pytest.mark.parametrize("backend_storage", ["hdfs", "s3"], indirect=True)  # (a local file unlinked after its open still reads)
def test_a_global_manifest_withdrawn_while_another_rank_reads_it_is_passed_over(backend_storage):
    """The CI failure of 2026-12-02: ckpt-e1 is marked bad; at the restart rank 0 resumes from
    ckpt-e0 and withdraws ckpt-e1's global manifest just after rank 1 listed it and opened it (an
    object store opens with one request and reads with another: the read found no such key).
    Rank 1 once stopped there ("cannot be read ... does not fall back alone"); a global manifest
    deleted under its reader reads as missing, so rank 1 passes over ckpt-e1 as rank 0 did and
    both resume from ckpt-e0."""
    st = backend_storage
    for e in (0, 1):
        save_all(st, 2, e)
    _truncate(st, f"{RDIR}/ckpt-e1/rank-1/tensors.bin")
    with pytest.raises(RestartRequiredError):
        restart(st, 1, 2, "per-rank")  # rank 1 marks its copy bad
    first = []
    hooked, opened = _deleting_after_open(st, "ckpt-e1/global.json", lambda: first.append(restart(st, 0, 2, "per-rank")))
    assert restart(hooked, 1, 2, "per-rank")[:2] == ("ckpt-e0", 1)
    assert opened and [f[:2] for f in first] == [("ckpt-e0", 0)]
    assert not st.exists(f"{RDIR}/ckpt-e1/global.json")  # withdrawn by rank 0 while rank 1 had it open


@pytest.mark.parametrize("backend_storage", ["s3"], indirect=True)
def test_a_file_deleted_under_its_reader_reads_as_missing_only_while_its_directory_stays(backend_storage):
    """On S3 (the open and the read are separate requests): a file deleted after its open reads as
    missing (FileNotFoundError) while its directory holds other files; when the directory went with
    it (what libhdfs also reports for a NameNode that does not answer) the read error stays a
    StorageError: doubt never turns a failed read into "not there"."""
    st = backend_storage
    for d in ("a", "b"):
        st.write_bytes(f"{d}/global.json", b"{}")
    st.write_bytes("a/other", b"x")
    hooked, _ = _deleting_after_open(st, "a/global.json", lambda: st.delete_file("a/global.json"))
    with pytest.raises(FileNotFoundError, match=f"{st.uri}/a/global.json was deleted while it was read"):
        hooked.read_bytes("a/global.json")
    hooked, _ = _deleting_after_open(st, "b/global.json", lambda: st.delete_dir("b"))
    with pytest.raises(StorageError, match="reading .*b/global.json failed"):
        hooked.read_bytes("b/global.json")


class _CountedFile:
    """A data file opened through the storage, its bytes read counted per path (pass-through)."""

    def __init__(self, f, got, path):
        self._f, self._got, self._path = f, got, path

    def read(self, nbytes=None):
        b = self._f.read() if nbytes is None else self._f.read(nbytes)
        self._got[self._path] += len(b)
        return b

    def readinto(self, buf):
        n = self._f.readinto(buf)
        self._got[self._path] += n
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def reads_counted(storage):
    """A copy of ``storage`` whose files opened for reading count their bytes read per path (a Counter);
    a local disk's files are read through the storage too (no OS path), as a remote store's are."""
    import collections

    base = type(storage)
    got = collections.Counter()

    class Counted(base):
        def open_input(self, path):
            return _CountedFile(base.open_input(self, path), got, path)

        def local_path(self, path):
            return None

    st = copy.copy(storage)
    st.__class__ = Counted
    return st, got


@pytest.mark.parametrize("layout", ["per-rank", "replicated", "spread"])
@pytest.mark.parametrize("landed", [False, True])
def test_each_rank_reads_only_the_data_it_restores_and_each_byte_once(tmp_path, layout, landed):
    """Issue 44 item 4: a rank's restore reads its own part (per-rank state), rank 0's part (replicated state
    written by one rank) or every share once (spread writes), each data file once and whole, and no other
    rank's data; with a snapshot buffer to land in (ranged reads in parallel) or without (a spool)."""
    from test_restore_path import Lender
    from test_shares import save_all as save_spread

    world = 4
    if layout == "spread":
        save_spread(tmp_path, world, 1)
    else:
        st = open_storage(str(tmp_path))
        for e in (0, 1):
            save_all(st, world, e, layout)
    mode = "per-rank" if layout == "per-rank" else "replicated"
    for rank in range(world):
        st, got = reads_counted(open_storage(str(tmp_path)))
        ck = PartReader(st, JOB, RANGE)
        g = GlobalCheckpointer(st, JOB, RANGE, rank, world, 3, 5.0)
        ck.landing = g.landing = Lender() if landed else None
        loaded = load_newest(ck, g, mode)
        assert loaded is not None and loaded.name == "ckpt-e1"
        arrays = {k: a.copy() for k, a in loaded.arrays.items()}
        loaded.close()
        assert arrays
        holders = {"per-rank": [rank], "replicated": [0], "spread": list(range(world))}[layout]
        want = {f"{RDIR}/ckpt-e1/rank-{k}/tensors.bin" for k in holders}
        data = {p: n for p, n in got.items() if p.endswith("/tensors.bin")}
        assert set(data) == want, (rank, got)
        for p, n in data.items():
            assert n == (tmp_path / p).stat().st_size, (rank, p, n)  # every byte once
