"""Writer generation records planted or left on storage: none may make a newer writer invisible (fencing.py).

A record newest_generation() would not parse (19+ digits, leading zeros, a directory) is skipped; a generation
above MAX_GENERATION is never taken (Fence.take refuses with an error naming the record), so an older writer is
always fenced by the next one, on a real local disk and on a real HDFS."""
from __future__ import annotations

import os
import tempfile
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.server_fixtures import hdfs_server  # noqa: F401  (fixture)

from paddle_acp.errors import StorageError
from paddle_acp.format.commit.fencing import MAX_GENERATION, Fence, FencedError, newest_generation
from paddle_acp.storage import open_storage


def _fenced(old: Fence) -> bool:
    for quick in (True, False):
        try:
            old.check("commit", quick=quick)
            return False
        except FencedError:
            old.fenced_by = None  # look again (the quick path too)
    return True


def _newer_fences_older(storage, job="job", rank=0):
    """Two writers, one after the other: the second sees itself newest and fences the first, or a take refuses."""
    try:
        a = Fence.take(storage, job, rank)
        b = Fence.take(storage, job, rank)
    except StorageError as exc:
        assert "a record may name no generation above" in str(exc) and "PADDLE_JOB_ID" in str(exc)
        return None
    assert a.generation < b.generation <= MAX_GENERATION
    assert newest_generation(storage, job, rank) == b.generation
    assert _fenced(a)
    b.check("commit", quick=True)
    b.check("delete")
    return a, b


@pytest.fixture(params=["local", "hdfs"])
def storage(request, tmp_path):
    if request.param == "local":
        return open_storage(str(tmp_path / "root"))
    srv = request.getfixturevalue("hdfs_server")
    return open_storage(f"{srv.uri}/fence-{uuid.uuid4().hex[:8]}", hadoop_home=str(srv.hadoop_home),
                        cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("rank", [0, 1])
def test_the_largest_generation_planted_refuses_the_next_writer(storage, rank):
    """A planted empty gen-999999999999999999 (18 digits: parsed): the next generation would be 10**18, which no
    listing parses, so the take refuses, naming the record and what to do; nothing is taken."""
    wdir = "job/writers" if rank == 0 else f"job/writers/rank-{rank}"
    storage.makedirs(wdir)
    storage.write_bytes(f"{wdir}/gen-{MAX_GENERATION}", b"")
    with pytest.raises(StorageError, match=f"gen-{MAX_GENERATION} is taken .* new PADDLE_JOB_ID"):
        Fence.take(storage, "job", rank)
    assert newest_generation(storage, "job", rank) == MAX_GENERATION
    assert not storage.exists(f"{wdir}/gen-{MAX_GENERATION + 1}")


def test_the_last_generation_can_be_taken_and_then_no_other(storage):
    storage.makedirs("job/writers")
    storage.write_bytes(f"job/writers/gen-{MAX_GENERATION - 1}", b"")
    a = Fence.take(storage, "job")
    assert a.generation == MAX_GENERATION
    with pytest.raises(StorageError, match="new PADDLE_JOB_ID"):
        Fence.take(storage, "job")
    a.check("commit", quick=True)  # the writer that holds it goes on, unfenced
    a.check("delete")


def test_an_ignored_name_in_the_way_never_takes_a_writer_past_the_limit(storage):
    """The next free name is past the limit because the last one is a directory (ignored by the listing)."""
    storage.makedirs("job/writers")
    storage.write_bytes(f"job/writers/gen-{MAX_GENERATION - 1}", b"")
    storage.makedirs(f"job/writers/gen-{MAX_GENERATION}")
    with pytest.raises(StorageError, match="a record may name no generation above"):
        Fence.take(storage, "job")


_NAMES = st.one_of(
    st.integers(0, 10**22).map(lambda n: f"gen-{n}"),
    st.integers(MAX_GENERATION - 3, MAX_GENERATION + 3).map(lambda n: f"gen-{n}"),
    st.tuples(st.integers(0, 3), st.integers(0, 50)).map(lambda t: "gen-" + "0" * t[0] + str(t[1])),
    st.text("gen-0123456789+ x", min_size=1, max_size=24),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(planted=st.lists(st.tuples(_NAMES, st.sampled_from(["file", "dir"])), max_size=6))
def test_no_planted_record_makes_a_newer_writer_invisible(planted):
    """Any names, files or directories, under writers/: the later of two writers fences the earlier (quick and
    full checks), or a take refuses with a clear error; never an invisible generation."""
    with tempfile.TemporaryDirectory() as tmp:
        wdir = os.path.join(tmp, "job", "writers")
        os.makedirs(wdir)
        for name, kind in planted:
            if name in (".", "..") or os.path.lexists(os.path.join(wdir, name)):
                continue
            if kind == "dir":
                os.makedirs(os.path.join(wdir, name))
            else:
                open(os.path.join(wdir, name), "wb").close()
        _newer_fences_older(open_storage(os.path.join(tmp)))


def test_a_record_planted_ahead_never_hides_the_next_writer_from_a_quick_check(storage):
    """gen-7 planted (or copied in) while generation 0 writes: the next writer takes 8 and records gen-1 too, so the
    older writer's quick check (one look-up of gen-<its generation + 1>) sees it is superseded."""
    a = Fence.take(storage, "job")
    storage.write_bytes("job/writers/gen-7", b"")
    b = Fence.take(storage, "job")
    assert (a.generation, b.generation) == (0, 8) and storage.exists("job/writers/gen-1")
    with pytest.raises(FencedError, match="fenced by generation 8"):
        a.check("commit", quick=True)
    b.check("commit", quick=True)


@settings(max_examples=40, deadline=None)
@given(gens=st.lists(st.integers(0, 300), max_size=8), at=st.integers(0, 300))
def test_any_older_generation_sees_a_newer_writer_in_its_quick_check(gens, at):
    """A writer of any recorded generation, whatever records lie around it: after a new writer took its generation,
    the quick check of the older one fails."""
    with tempfile.TemporaryDirectory() as tmp:
        storage = open_storage(tmp)
        storage.makedirs("job/writers")
        for g in set(gens) | {at}:
            storage.write_bytes(f"job/writers/gen-{g}", b"")
        old = Fence(storage, "job", at)
        Fence.take(storage, "job")
        assert _fenced(old)
