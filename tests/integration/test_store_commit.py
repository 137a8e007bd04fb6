"""Rank 0's commit on the store path (issue 43): the parts' manifests and the ranks' generations come from the
job's store, so a checkpoint's commit reads no part manifest and looks no generation up on storage per rank;
a part whose writer the store cannot vouch for is still judged on storage, and a superseded one never commits.

W simulated ranks in one process write their parts through GlobalCheckpointer on a real local store, counted
call by call (tests/unit/format/test_commit_cost.py's Counting); the ranks coordinate through one real Paddle TCP store hosted
in this process (as ci/bench/calls_per_rank.py --coordination store does)."""

import logging
import os
import sys
import time

import pytest
from support.coord import free_port

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unit", "format"))  # tests/unit/format/test_commit_cost.py
from test_commit_cost import CKDIR, JOB, RANGE, Counting, snapshot

from paddle_acp.adapter.store import StoreEndpoint
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.commit.fencing import Fence
from paddle_acp.format.global_manifest import GlobalManifest
from paddle_acp.format.layout import GLOBAL_NAME
from paddle_acp.runtime.coord.store import StoreCoordinator, StoreLink
from paddle_acp.storage import open_storage

pytest.importorskip("paddle")


def store_coordinator():
    """One real TCP store hosted here (world size 1: no rendezvous), shared by every simulated rank."""
    link = StoreLink(StoreEndpoint("127.0.0.1", free_port(), "MASTER_ADDR"), 0, 1, open_timeout=60)
    return StoreCoordinator(link, f"{JOB}/{RANGE}")


def rank(st, r, world, coord, fence=None):
    g = GlobalCheckpointer(st, JOB, RANGE, r, world, 3, 120.0, fence or Fence.take(st, JOB, r))
    g.poll_interval = 0.002
    g.arrivals = coord
    return g


def manifest_reads(counting):
    return [p for name, p in counting.log if name in ("read_bytes", "open_input") and str(p).endswith("manifest.json")]


def generation_lookups(counting):
    return [p for name, p in counting.log if name in ("exists", "listdir") and "/writers/rank-" in str(p)]


@pytest.mark.parametrize("coordination", ["store", "storage"])
def test_the_commit_reads_no_manifest_and_looks_no_generation_up_per_rank_on_the_store_path(tmp_path, coordination):
    world = 8
    st = open_storage(str(tmp_path))
    coord = store_coordinator() if coordination == "store" else None
    gs = [rank(st, r, world, coord) for r in range(world)]
    for g in gs[1:]:
        g.save(snapshot(g.rank), "per-rank")
    counting = Counting(open_storage(str(tmp_path)))
    res = rank(counting, 0, world, coord, gs[0].fence).save(snapshot(0), "per-rank")
    assert res.committed is True
    if coordination == "store":
        assert manifest_reads(counting) == [], counting.log
        assert generation_lookups(counting) == [], counting.log
    else:  # the fallback as before: each other rank's manifest read and its generation looked up (its own: neither)
        assert len(manifest_reads(counting)) == world - 1, counting.log
        assert len(generation_lookups(counting)) >= world - 1, counting.log
    # what the store carried is what storage holds: every part verifies against the global record
    g = GlobalCheckpointer(st, JOB, RANGE, 0, world)
    gm = g.verify("ckpt-e0")
    assert [p.rank for p in gm.parts] == list(range(world))


def test_a_part_of_a_superseded_process_is_refused_when_the_store_knows_a_newer_generation(tmp_path, caplog):
    """Rank 1's first process (generation 0) writes its part and counts it in; a newer process of rank 1
    (generation 1) then opens its range on the same store (no part of its own yet). Rank 0 gets the old part's manifest from the store, but the store shows
    generation 1 posted: the part is judged on storage, found superseded and never committed."""
    st = open_storage(str(tmp_path))
    coord = store_coordinator()
    r0 = rank(st, 0, 2, coord)
    old = rank(st, 1, 2, coord)
    old.save(snapshot(1), "per-rank")
    new = rank(st, 1, 2, coord)  # Fence.take: generation 1 on storage
    assert new.fence.generation == 1
    new.announce()  # as the range's open does: its generation, posted to the store (before any part of its own)
    counting = Counting(open_storage(str(tmp_path)))
    r0 = rank(counting, 0, 2, coord, r0.fence)
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        res = r0.save(snapshot(0), "per-rank", part_wait=1.5)
    assert res.committed is False
    assert not (tmp_path / CKDIR / GLOBAL_NAME).exists()
    assert manifest_reads(counting) == [], counting.log  # the old part's manifest came from the store
    assert "written by generation 0 of that rank, whose newest generation is 1" in caplog.text, caplog.text
    # the live process writes its part of the same position: it commits
    new.save(snapshot(1), "per-rank")
    res = r0.save(snapshot(0), "per-rank")
    assert res.committed is True
    gm = GlobalManifest.loads((tmp_path / CKDIR / GLOBAL_NAME).read_bytes())
    assert GlobalCheckpointer(st, JOB, RANGE, 0, 2).verify("ckpt-e0").crc32 == gm.crc32


def test_a_ranks_absence_travels_through_the_store_and_abandons_the_position_at_once(tmp_path):
    """Rank 1 cannot write its part (it declares its absence): on the store path no absence file is written,
    and rank 0 still abandons the position at once (not after its wait for the parts); nothing is committed."""
    st = open_storage(str(tmp_path))
    coord = store_coordinator()
    r0, r1 = rank(st, 0, 3, coord), rank(st, 1, 3, coord)
    where = r1.declare_absent("ckpt-e0", "disk full at hdfs://user:secret@nn/x")
    assert where is not None and "store" in where, where
    t0 = time.monotonic()
    res = r0.save(snapshot(0), "per-rank", part_wait=30)  # rank 2 never writes: only the absence ends the wait
    assert res.committed is False
    assert time.monotonic() - t0 < 10
    left = [p.name for p in (tmp_path / CKDIR).iterdir()] if (tmp_path / CKDIR).exists() else []
    assert not any(n.startswith("absent") for n in left), left
    assert not (tmp_path / CKDIR / GLOBAL_NAME).exists()


class _RoundHook:
    """Rank 0's storage, counted; each listing of the range (the commit's look for ranks gone quiet, once every
    LATER_PARTS_EVERY seconds) first lets one more rank write its part and count in: the ranks keep arriving
    between those rounds, deterministically, however loaded the machine is."""

    def __init__(self, counting, range_dir, pending):
        self._counting, self._range_dir, self.pending, self.rounds = counting, range_dir, pending, 0

    def __getattr__(self, name):
        return getattr(self._counting, name)

    def listdir(self, path, *a, **kw):
        if path.rstrip("/") == self._range_dir:
            self.rounds += 1
            if self.pending:
                g = self.pending.pop(0)
                g.save(snapshot(g.rank), "per-rank")
        return self._counting.listdir(path, *a, **kw)


def test_parts_arriving_slowly_through_the_store_are_never_read_from_storage(tmp_path, monkeypatch):
    """The store's count keeps moving while rank 0 waits over several of its later rounds (at W = 64 on HDFS
    the parts take seconds): rank 0 reads no part from storage; it takes them all from the store once every
    rank counted in (it read each from storage at every later round before: 63 reads per checkpoint at W = 64)."""
    from paddle_acp.format.commit import part_commit

    monkeypatch.setattr(part_commit, "LATER_PARTS_EVERY", 0.05)
    world = 6
    st = open_storage(str(tmp_path))
    coord = store_coordinator()
    r0 = rank(st, 0, world, coord)
    others = [rank(st, r, world, coord) for r in range(1, world)]
    others[0].save(snapshot(1), "per-rank")  # one part there before rank 0 starts
    counting = Counting(open_storage(str(tmp_path)))
    hook = _RoundHook(counting, f"{JOB}/range/{RANGE}", others[1:])
    res = rank(hook, 0, world, coord, r0.fence).save(snapshot(0), "per-rank")
    assert res.committed is True
    assert not hook.pending and hook.rounds >= world - 2, hook.rounds  # each later rank arrived between two rounds
    assert manifest_reads(counting) == [], counting.log
    assert generation_lookups(counting) == [], counting.log
    assert [p.rank for p in GlobalCheckpointer(st, JOB, RANGE, 0, world).verify("ckpt-e0").parts] == list(range(world))


class _DiesBeforeCountingIn:
    """A rank's coordinator whose process dies after its part is on storage, before it counts in: its
    generation reaches the store (at its open), its arrival never does."""

    def __init__(self, inner):
        self._inner = inner
        self.kind = inner.kind

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def arrive(self, key, note=None, rank=0):
        if key.startswith("g/"):
            self._inner.arrive(key, note, rank)


def test_a_part_on_storage_whose_rank_never_counted_in_commits_once_the_count_stands_still(tmp_path, monkeypatch):
    """The store's count stops one short (rank 2 died between its part and its arrival): rank 0 reads the parts
    it lacks from storage once the count stood still over one of its later rounds, and commits; only that
    rank's manifest is read from storage."""
    from paddle_acp.format.commit import part_commit

    monkeypatch.setattr(part_commit, "LATER_PARTS_EVERY", 0.05)
    world = 3
    st = open_storage(str(tmp_path))
    coord = store_coordinator()
    r0 = rank(st, 0, world, coord)
    rank(st, 1, world, coord).save(snapshot(1), "per-rank")
    rank(st, 2, world, _DiesBeforeCountingIn(coord)).save(snapshot(2), "per-rank")
    counting = Counting(open_storage(str(tmp_path)))
    t0 = time.monotonic()
    res = rank(counting, 0, world, coord, r0.fence).save(snapshot(0), "per-rank", part_wait=30)
    assert res.committed is True
    assert time.monotonic() - t0 < 10
    assert [p for p in manifest_reads(counting)] == [f"{CKDIR}/rank-2/manifest.json"], counting.log
    assert [p.rank for p in GlobalCheckpointer(st, JOB, RANGE, 0, world).verify("ckpt-e0").parts] == list(range(world))


def test_the_store_client_sends_each_request_at_once(tmp_path):
    """Paddle's store client writes a request in several pieces without TCP_NODELAY, so each call waited for the
    server's delayed ACK (44 ms per add, 88 per get on loopback; ci/bench/store_calls.py): the link's connection
    to a store of ours has TCP_NODELAY set, and only its own (a socket the process had before is left as it was)."""
    import socket

    from paddle_acp.adapter.store import _sockets_to, open_store

    port = free_port()
    other = socket.create_server(("127.0.0.1", 0))
    mine = socket.create_connection(other.getsockname())  # a connection of the process's own, before the store's
    try:
        store = open_store(StoreEndpoint("127.0.0.1", port, "MASTER_ADDR"), 0, 1, 30)
        store.add("k", 1)
        fds = _sockets_to(port)
        assert fds, "no connection to the store found"
        for fd in fds:
            with socket.socket(fileno=os.dup(fd)) as sk:
                assert sk.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert mine.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    finally:
        mine.close()
        other.close()


def announced(g):
    """``g``'s generation, posted to the store as the range's open does (not waited for there: here until seen)."""
    from paddle_acp.format.commit import arrivals
    g.announce()
    t0 = time.monotonic()
    while not arrivals.vouches(g.arrivals, g.fence.rank, g.fence.generation):
        assert time.monotonic() - t0 < 30, "the store never showed the posted generation"
        time.sleep(0.01)
    return g


def test_a_ranks_part_needs_no_fence_lookup_on_the_store_path_and_a_superseded_rank_is_still_fenced(tmp_path, monkeypatch):
    """On the store path a rank's part is renamed into place on the store's word that its generation is the newest
    (no look-up on storage); once a newer process of that rank posted its generation, the old one's next part looks
    on storage, is fenced and renames nothing; and the store's word is taken only for VOUCHED_FOR seconds."""
    from paddle_acp.format.commit import fencing
    from paddle_acp.format.commit.fencing import FencedError
    st = open_storage(str(tmp_path))
    coord = store_coordinator()
    rank(st, 0, 2, coord)
    counting = Counting(open_storage(str(tmp_path)))
    old = announced(rank(counting, 1, 2, coord))
    counting.log.clear()  # (the fence's take listed its records)
    old.save(snapshot(1), "per-rank")
    assert generation_lookups(counting) == [], counting.log
    monkeypatch.setattr(fencing, "VOUCHED_FOR", 0.0)  # the store's word has run out: storage is asked
    old.save(snapshot(1, epoch=1), "per-rank")
    assert generation_lookups(counting) == [f"{JOB}/writers/rank-1/gen-1"], counting.log
    monkeypatch.undo()
    announced(rank(st, 1, 2, coord))  # a newer process of rank 1 (generation 1)
    with pytest.raises(FencedError):
        old.save(snapshot(1, epoch=2), "per-rank")
    assert not (tmp_path / CKDIR.replace("ckpt-e0", "ckpt-e2") / "rank-1").exists()
