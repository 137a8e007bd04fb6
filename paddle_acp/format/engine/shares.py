"""Spread writes of replicated state: which rank writes which tensor, and reading the shares back.

With ``PADDLE_ACP_REPLICATED_WRITERS=all`` (or a number) a data-parallel job (replicated
state) does not leave every tensor to rank 0: the *share writers*, ranks 0..S-1 with
S = min(world size, cap), each write a *share* into their own part; the ranks from S on
write a part with no tensors (as every rank but 0 does under ``one``), so a restore opens S
data files, not one per rank. The split (:func:`split`) is a pure function of the tensor
metadata every rank holds alike: the tensors, sorted by size (largest first) then by program
key and name, go one by one to the writer with the fewest bytes so far (lowest rank on a
tie), so every rank computes the same assignment and the writers' bytes differ by at most
one tensor. It needs only names, dtypes, shapes and sizes (:data:`Item`), so a rank takes
views of (on a GPU: copies to the host) only its own share.

What records who holds what: each part's manifest lists the tensors of its share (its
programs, each with the LR scheduler state, and only the share's tensors) and carries
``extra.part.share = {"writers": "all", "share_writers": S, "items": N, "digest": D}``: the
number of share writers, the number of tensors of the whole state and a CRC32 of their
canonical list (program key, name, dtype, shape), the same in every part; the global manifest
(version 4, ``"writers": "all"``, ``"share_writers": S``) says the checkpoint is spread and
which parts hold shares. :func:`check_cover` validates this untrusted record when rank 0
commits and whenever a checkpoint is read: the shares are disjoint, each part lists the
same programs, the parts from S on hold no tensors, and together the shares are exactly the
N tensors whose list has digest D.
:func:`merge` joins the verified parts into one :class:`LoadedCheckpoint` whose tensors are
read from the part that holds them.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from paddle_acp.config.values import MAX_WORLD
from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.engine.loaded import Key, LoadedCheckpoint, ReadItem
from paddle_acp.format.engine.snapshot import ProgramSnapshot
from paddle_acp.format.manifest import Manifest, ProgramRecord, TensorRecord

WRITERS_ALL = "all"
WRITERS_ONE = "one"
MAX_ITEMS = 1_000_000 * 1024  # tensors of a whole state (a part lists at most 1,000,000)

Item = Tuple[str, str, str, Tuple[int, ...], int]  # (program key, tensor name, dtype, shape, bytes)


def digest(items: Sequence[Item]) -> int:
    """CRC32 of the canonical list of ``items`` (sorted by program key and name; sizes left out)."""
    canon = sorted([k, n, d, list(s)] for k, n, d, s, _b in items)
    return zlib.crc32(json.dumps(canon, separators=(",", ":")).encode("utf-8")) & 0xFFFFFFFF


def split(items: Sequence[Item], world: int) -> Dict[Tuple[str, str], int]:
    """(program key, tensor name) -> the rank that writes it: largest first, to the least-loaded rank."""
    loads = [0] * world
    out: Dict[Tuple[str, str], int] = {}
    for key, name, _d, _s, nbytes in sorted(items, key=lambda i: (-i[4], i[0], i[1])):
        k = min(range(world), key=lambda r: (loads[r], r))
        out[(key, name)] = k
        loads[k] += nbytes
    return out


def _snapshot_items(programs: Sequence[ProgramSnapshot]) -> List[Item]:
    return [(p.key, t.name, t.dtype, tuple(int(x) for x in t.array.shape), int(t.array.nbytes))
            for p in programs for t in p.tensors]


def share_writers(world: int, cap: int) -> int:
    """How many ranks write shares: ranks 0..min(world, cap)-1."""
    if cap < 1 or world < 1:
        raise ValueError(f"share writers of world size {world} with cap {cap}")
    return min(world, cap)


def record(items: Sequence[Item], writers: int) -> Dict[str, Any]:
    """The share record every part of a spread checkpoint carries (``extra.part.share``)."""
    return {"writers": WRITERS_ALL, "share_writers": writers, "items": len(items), "digest": digest(items)}


def owned(items: Sequence[Item], rank: int, writers: int) -> Set[Tuple[str, str]]:
    """The (program key, name) of ``rank``'s share of ``items`` (none for a rank from ``writers`` on)."""
    if rank >= writers:
        return set()
    return {kn for kn, r in split(items, writers).items() if r == rank}


def own_share(programs: Sequence[ProgramSnapshot], rank: int, world: int,
              writers: Optional[int] = None) -> Tuple[List[ProgramSnapshot], Dict[str, Any]]:
    """This rank's share of the replicated state ``programs`` (every program, only the share's tensors)
    and the record its part carries (``extra.part.share``); ``writers``: the share writers (default: all
    ``world`` ranks). The runtime selects the share from metadata before it takes views (:func:`owned`)."""
    n = world if writers is None else share_writers(world, writers)
    items = _snapshot_items(programs)
    mine_keys = owned(items, rank, n)
    mine = [ProgramSnapshot(p.key, p.label, [t for t in p.tensors if (p.key, t.name) in mine_keys], p.lr_scheduler)
            for p in programs]
    return mine, record(items, n)


def share_nbytes(sizes: Sequence[Tuple[str, str, int]], rank: int, world: int) -> int:
    """The bytes of ``rank``'s share of tensors given as (program key, name, bytes) among ``world`` writers."""
    mine = owned([(k, n, "", (), b) for k, n, b in sizes], rank, world)
    return sum(b for k, n, b in sizes if (k, n) in mine)


def part_share(m: Manifest) -> Optional[Dict[str, Any]]:
    """The ``extra.part.share`` record of a part's manifest, checked (CorruptCheckpointError), or None."""
    part = m.extra.get("part") if isinstance(m.extra, dict) else None
    share = part.get("share") if isinstance(part, dict) else None
    if share is None:
        return None
    if (not isinstance(share, dict) or set(share) != {"writers", "share_writers", "items", "digest"}
            or share["writers"] != WRITERS_ALL
            or not all(isinstance(share[k], int) and not isinstance(share[k], bool)
                       for k in ("share_writers", "items", "digest"))
            or not 1 <= share["share_writers"] <= MAX_WORLD
            or not 0 <= share["items"] <= MAX_ITEMS or not 0 <= share["digest"] < 2**32):
        raise CorruptCheckpointError(f"invalid manifest: extra.part.share {str(share)[:200]} is not a share record")
    return share


def check_cover(manifests: Mapping[int, Manifest], where: str, complete: bool = True) -> Dict[str, Any]:
    """The parts' shares are one spread state: every part (``manifests``: rank -> manifest, every rank
    of the checkpoint; not ``complete``: at least the share writers', what a restore reads, so a rank's
    restore costs the same at any world size) has the same share record and lists the same programs, the parts from rank
    ``share_writers`` on hold no tensors, no tensor is in two parts, and together they are the recorded
    tensors (count and digest). Returns the share record; CorruptCheckpointError naming what is wrong."""
    records = {k: part_share(m) for k, m in sorted(manifests.items())}
    share = records.get(0) if records else None
    if share is None or any(r != share for r in records.values()):
        raise CorruptCheckpointError(f"{where}: the parts do not agree on the share of replicated tensors each holds "
                                     f"({', '.join(f'rank {k}: {r}' for k, r in records.items())[:400]}; "
                                     "PADDLE_ACP_REPLICATED_WRITERS or the state differs between the ranks, or a part "
                                     "was altered)")
    ranks = sorted(manifests)
    if (not set(range(share["share_writers"])) <= set(ranks)) if not complete else (
            share["share_writers"] > len(manifests) or ranks != list(range(len(manifests)))):
        raise CorruptCheckpointError(f"{where}: the parts record {share['share_writers']} share writers, but the "
                                     f"checkpoint has the parts of ranks {sorted(manifests)[:20]}")
    keys = [p.key for p in manifests[0].programs]
    seen: Dict[Tuple[str, str], int] = {}
    items: List[Item] = []
    for k, m in sorted(manifests.items()):
        if [p.key for p in m.programs] != keys:
            raise CorruptCheckpointError(f"{where}: the part of rank {k} lists other programs than rank 0's")
        if k >= share["share_writers"] and any(p.tensors for p in m.programs):
            raise CorruptCheckpointError(f"{where}: the part of rank {k} holds tensors, but only the parts of ranks "
                                         f"0..{share['share_writers'] - 1} hold shares")
        for p in m.programs:
            for t in p.tensors:
                if (p.key, t.name) in seen:
                    raise CorruptCheckpointError(f"{where}: tensor {t.name!r} of program {p.key} is in the parts of "
                                                 f"ranks {seen[(p.key, t.name)]} and {k}")
                seen[(p.key, t.name)] = k
                items.append((p.key, t.name, t.dtype, tuple(t.shape), t.nbytes))
    if len(items) != share["items"] or digest(items) != share["digest"]:
        raise CorruptCheckpointError(f"{where}: the parts' shares hold {len(items)} tensors that are not the "
                                     f"{share['items']} the parts record (a share is missing or altered)")
    return share


def merged_programs(manifests: Mapping[int, Manifest], own: int) -> List[ProgramRecord]:
    """Every program with the tensors of every share (in rank order); LR scheduler state of rank ``own``'s part."""
    out = []
    for i, p in enumerate(manifests[own].programs):
        tensors = [t for _k, m in sorted(manifests.items()) for t in m.programs[i].tensors]
        out.append(ProgramRecord(p.key, p.label, tensors, p.lr_scheduler))
    return out


class SharesSource:
    """Tensors of a spread checkpoint: each read from the verified part that holds it."""

    def __init__(self, parts: Mapping[int, LoadedCheckpoint]):
        self._parts = dict(parts)
        self._where: Dict[Key, LoadedCheckpoint] = {
            (p.key, t.name): ck for ck in self._parts.values() for p in ck.manifest.programs for t in p.tensors}

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        return self._where[(key, rec.name)].read(key, rec)

    def read_into(self, items: Sequence[ReadItem]) -> None:
        groups: Dict[int, List[ReadItem]] = {}
        for item in items:
            groups.setdefault(id(self._where[(item[0], item[1].name)]), []).append(item)
        for group in groups.values():
            self._where[(group[0][0], group[0][1].name)].read_into(group)

    def close(self) -> None:
        for ck in self._parts.values():
            ck.close()


def merge(parts: Mapping[int, LoadedCheckpoint], own: int, path: str) -> LoadedCheckpoint:
    """One LoadedCheckpoint of the verified ``parts`` of a spread checkpoint (rank -> its loaded part):
    rank ``own``'s manifest (its RNG, loader state, LR schedulers) with every share's tensors."""
    m = {k: ck.manifest for k, ck in parts.items()}
    manifest = dataclasses.replace(m[own], programs=merged_programs(m, own),
                                   data_size=sum(x.data_size for x in m.values()))
    loaded = LoadedCheckpoint(path, manifest, SharesSource(parts))
    kinds = {ck.source for ck in parts.values()}
    loaded.source = kinds.pop() if len(kinds) == 1 else "mixed"
    return loaded


MAX_READERS = 8  # shares read at once by one rank


def load_all(load_one: Callable[[int], LoadedCheckpoint], ranks: Sequence[int]) -> Dict[int, LoadedCheckpoint]:
    """Every part of ``ranks`` read and verified by ``load_one(rank)``, up to :data:`MAX_READERS` at once
    (threads: reads and checksums release the GIL). When one fails, the others are closed and
    ``(rank, exception)`` of the first failure (in rank order) is raised as :class:`ShareFailed`."""
    out: Dict[int, LoadedCheckpoint] = {}
    failed: List[Tuple[int, BaseException]] = []
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_READERS, len(ranks))), thread_name_prefix="paddle-acp-share") as pool:
        futures = {k: pool.submit(load_one, k) for k in ranks}
        for k, f in futures.items():
            try:
                out[k] = f.result()
            except BaseException as exc:  # raised below, once every read has ended
                failed.append((k, exc))
    if failed:
        for ck in out.values():
            ck.close()
        raise ShareFailed(*failed[0])
    return out


class ShareFailed(Exception):
    """A share of a spread checkpoint could not be read: ``rank`` and the ``error`` it raised."""

    def __init__(self, rank: int, error: BaseException):
        super().__init__(f"the share of rank {rank}: {error}")
        self.rank = rank
        self.error = error


def commit_writers(own: Optional[Dict[str, Any]], manifests: Mapping[int, Manifest], where: str) -> Tuple[str, int]:
    """Rank 0, before it commits: ("all", share writers) when its part and every other hold shares that
    cover the state (:func:`check_cover`), ("one", 0) when no part holds a share; CorruptCheckpointError
    when the ranks disagree (PADDLE_ACP_REPLICATED_WRITERS set differently, or a different state per rank)."""
    if own is None:
        spread = [k for k, m in sorted(manifests.items()) if _has_share(m)]
        if spread:
            raise CorruptCheckpointError(f"{where}: rank 0 wrote every replicated tensor, but the part(s) of rank(s) "
                                         f"{spread} hold shares (PADDLE_ACP_REPLICATED_WRITERS differs between the ranks)")
        return WRITERS_ONE, 0
    share = check_cover(manifests, where)
    return WRITERS_ALL, int(share["share_writers"])


def _has_share(m: Manifest) -> bool:
    part = m.extra.get("part") if isinstance(m.extra, dict) else None
    return isinstance(part, dict) and part.get("share") is not None
