"""Spread writes of replicated state: which rank writes which bytes, and reading the shares back.

With ``PADDLE_ACP_REPLICATED_WRITERS=all`` (or a number) the *share writers*, ranks 0..S-1 (S = min(world size, cap)),
each write a *share* of a data-parallel job's state into their own part; the other ranks' parts hold no tensors.
:func:`split` is a pure function of metadata every rank holds alike: the tensors' bytes, in canonical order (program
key, name), cut into S equal ranges; a tensor crossing a boundary is written as *pieces* (records with
``piece = [start, stop)``: a version-3 manifest, refused by older builds). Shares cut by whole tensor (older builds)
read the same way.

Each part's manifest lists its share's records and carries ``extra.part.share = {"writers": "all", "share_writers": S,
"items": N, "digest": D}`` (N tensors in all, D a CRC32 of their canonical list); the global manifest is version 4 with
``"writers": "all"``. :func:`check_cover` validates this untrusted record at commit and at every read: the same record
and programs in every part, no tensors from rank S on, every tensor's records tiling its bytes exactly once with one
dtype and shape, N tensors of digest D. :func:`merge` joins the verified parts into one :class:`LoadedCheckpoint`."""

from __future__ import annotations

import bisect
import dataclasses
import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from paddle_acp.config.values import MAX_WORLD
from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.engine.loaded import Key, LoadedCheckpoint, ReadItem
from paddle_acp.format.engine.stager import HOST, Stager
from paddle_acp.format.manifest import DTYPES, Manifest, ProgramRecord, TensorRecord, align

WRITERS_ALL = "all"
WRITERS_ONE = "one"
MAX_ITEMS = 1_000_000 * 1024  # tensors of a whole state (a part lists at most 1,000,000)

Item = Tuple[str, str, str, Tuple[int, ...], int]  # (program key, tensor name, dtype, shape, bytes)


def digest(items: Sequence[Item]) -> int:
    """CRC32 of the canonical list of ``items`` (sorted by program key and name; sizes left out)."""
    canon = sorted([k, n, d, list(s)] for k, n, d, s, _b in items)
    return zlib.crc32(json.dumps(canon, separators=(",", ":")).encode("utf-8")) & 0xFFFFFFFF


Piece = Optional[Tuple[int, int]]  # bytes [start, stop) of a tensor; None: the whole tensor


def split(items: Sequence[Item], writers: int) -> Dict[int, Dict[Tuple[str, str], Piece]]:
    """rank -> {(program key, tensor name): the piece it writes (None: the whole tensor)}."""
    if writers < 1:
        raise ValueError(f"a split among {writers} writers")
    order = sorted(items, key=lambda i: (i[0], i[1]))
    total = sum(i[4] for i in order)
    bounds = [r * total // writers for r in range(writers + 1)]
    out: Dict[int, Dict[Tuple[str, str], Piece]] = {r: {} for r in range(writers)}
    start = 0
    for key, name, _d, _s, nbytes in order:
        stop = start + nbytes
        r = min(bisect.bisect_right(bounds, start) - 1, writers - 1)
        if nbytes == 0:
            out[r][(key, name)] = None
        while r < writers and bounds[r] < stop:
            lo, hi = max(start, bounds[r]), min(stop, bounds[r + 1])
            if hi > lo:
                out[r][(key, name)] = None if (lo, hi) == (start, stop) else (lo - start, hi - start)
            r += 1
        start = stop
    return out


def share_writers(world: int, cap: int) -> int:
    """How many ranks write shares: ranks 0..min(world, cap)-1."""
    if cap < 1 or world < 1:
        raise ValueError(f"share writers of world size {world} with cap {cap}")
    return min(world, cap)


def record(items: Sequence[Item], writers: int) -> Dict[str, Any]:
    """The share record every part of a spread checkpoint carries (``extra.part.share``)."""
    return {"writers": WRITERS_ALL, "share_writers": writers, "items": len(items), "digest": digest(items)}


def owned(items: Sequence[Item], rank: int, writers: int) -> Dict[Tuple[str, str], Piece]:
    """(program key, name) -> the piece of it ``rank`` writes (None: whole); none from rank ``writers`` on."""
    if rank >= writers:
        return {}
    return split(items, writers)[rank]


def share_layout_nbytes(items: Sequence[Item], rank: int, writers: int) -> int:
    """The data file size of ``rank``'s share of ``items`` (each tensor or piece at an aligned offset)."""
    mine = owned(items, rank, writers)
    pieces = ((mine[(i[0], i[1])], i[4]) for i in items if (i[0], i[1]) in mine)
    return sum(align(whole if piece is None else piece[1] - piece[0]) for piece, whole in pieces)


def part_share(m: Manifest) -> Optional[Dict[str, Any]]:
    """The ``extra.part.share`` record of a part's manifest, checked (CorruptCheckpointError), or None."""
    share = _share_of(m)
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
    """The parts' shares form one spread state (module docstring): returns the share record, else CorruptCheckpointError
    naming the fault. ``manifests``: rank -> manifest, every rank's (not ``complete``: at least the share writers')."""
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
    for k, m in sorted(manifests.items()):
        if [p.key for p in m.programs] != keys:
            raise CorruptCheckpointError(f"{where}: the part of rank {k} lists other programs than rank 0's")
        if k >= share["share_writers"] and any(p.tensors for p in m.programs):
            raise CorruptCheckpointError(f"{where}: the part of rank {k} holds tensors, but only the parts of ranks "
                                         f"0..{share['share_writers'] - 1} hold shares")
    items: List[Item] = []
    for (key, name), recs in _held(manifests).items():
        first = recs[0][1]
        end = 0
        for k, t in recs:
            lo, hi = _bytes_held(t)
            if (t.dtype, t.shape) != (first.dtype, first.shape):
                raise CorruptCheckpointError(f"{where}: tensor {name!r} of program {key} is {first.dtype}"
                                             f"{first.shape} in the part of rank {recs[0][0]} and {t.dtype}{t.shape} "
                                             f"in the part of rank {k}")
            if lo != end:
                ranks = sorted({x[0] for x in recs})
                what = "twice" if lo < end else f"without its bytes [{end}, {lo})"
                raise CorruptCheckpointError(f"{where}: tensor {name!r} of program {key} is held {what} by the "
                                             f"parts of ranks {ranks[:20]}")
            end = hi
        if end != first.whole_nbytes:
            raise CorruptCheckpointError(f"{where}: the parts hold bytes [0, {end}) of tensor {name!r} of program "
                                         f"{key}, which has {first.whole_nbytes} (a piece is missing)")
        items.append((key, name, first.dtype, tuple(first.shape), first.whole_nbytes))
    if len(items) != share["items"] or digest(items) != share["digest"]:
        raise CorruptCheckpointError(f"{where}: the parts' shares hold {len(items)} tensors that are not the "
                                     f"{share['items']} the parts record (a share is missing or altered)")
    return share


def merged_programs(manifests: Mapping[int, Manifest], own: int) -> List[ProgramRecord]:
    """Every program with the tensors of every share, in rank order (a tensor written as pieces: once, as a whole record
    whose offset and checksum are not a file's); LR scheduler state of rank ``own``'s part."""
    out = []
    for i, p in enumerate(manifests[own].programs):
        tensors: List[TensorRecord] = []
        joined: Set[str] = set()
        for _k, m in sorted(manifests.items()):
            for t in m.programs[i].tensors:
                if t.piece is None:
                    tensors.append(t)
                elif t.name not in joined:
                    joined.add(t.name)
                    tensors.append(TensorRecord(t.name, t.dtype, list(t.shape), 0, t.whole_nbytes, 0))
        out.append(ProgramRecord(p.key, p.label, tensors, p.lr_scheduler))
    return out


def _held(manifests: Mapping[int, Manifest]) -> Dict[Key, List[Tuple[int, TensorRecord]]]:
    """(program key, name) -> [(rank, its record: whole, or a piece)], pieces in byte order."""
    out: Dict[Key, List[Tuple[int, TensorRecord]]] = {}
    for k, m in sorted(manifests.items()):
        for p in m.programs:
            for t in p.tensors:
                out.setdefault((p.key, t.name), []).append((k, t))
    for recs in out.values():
        recs.sort(key=lambda x: _bytes_held(x[1]))
    return out


def _bytes_held(t: TensorRecord) -> Tuple[int, int]:
    """The byte range of its tensor that record ``t`` holds (the whole tensor: [0, nbytes))."""
    return t.piece if t.piece is not None else (0, t.nbytes)


def _flat_bytes(view: np.ndarray) -> np.ndarray:
    """The bytes of ``view`` as a flat uint8 view (a copy would lose what is written into it)."""
    if not view.flags.c_contiguous:
        raise ValueError("a tensor of a spread checkpoint is read into a C-contiguous array only")
    return view.reshape(-1).view(np.uint8)


class SharesSource:
    """Tensors of a spread checkpoint, each read from the verified part(s) that hold it (or its pieces)."""

    def __init__(self, parts: Mapping[int, LoadedCheckpoint]):
        self._parts = dict(parts)
        self._where = _held({k: ck.manifest for k, ck in self._parts.items()})

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        held = self._where[(key, rec.name)]
        if len(held) == 1 and held[0][1].piece is None:
            k, part_rec = held[0]
            return self._parts[k].read(key, part_rec)
        arr = np.empty(rec.shape, DTYPES[rec.dtype])
        self.read_into([(key, rec, arr)])
        return arr

    def read_into(self, items: Sequence[ReadItem], stager: Stager = HOST) -> None:
        groups: Dict[int, List[ReadItem]] = {}
        for key, rec, view in items:
            for k, part_rec in self._where[(key, rec.name)]:
                if part_rec.piece is None:
                    groups.setdefault(k, []).append((key, part_rec, view))
                else:
                    lo, hi = part_rec.piece
                    groups.setdefault(k, []).append((key, part_rec, _flat_bytes(view)[lo:hi]))
        for k, group in groups.items():
            self._parts[k].read_into(group, stager)

    def close(self) -> None:
        for ck in self._parts.values():
            ck.close()


def merge(parts: Mapping[int, LoadedCheckpoint], own: int, path: str) -> LoadedCheckpoint:
    """A spread checkpoint's verified ``parts`` as one LoadedCheckpoint: rank ``own``'s manifest, all the tensors."""
    m = {k: ck.manifest for k, ck in parts.items()}
    manifest = dataclasses.replace(m[own], programs=merged_programs(m, own),
                                   data_size=sum(x.data_size for x in m.values()))
    loaded = LoadedCheckpoint(path, manifest, SharesSource(parts))
    kinds = {ck.source for ck in parts.values()}
    loaded.source = kinds.pop() if len(kinds) == 1 else "mixed"
    return loaded


def assemble(manifests: Mapping[int, Manifest], arrays: Mapping[int, Mapping[Key, np.ndarray]],
             want: Set[Key]) -> Dict[Key, np.ndarray]:
    """The tensors ``want`` names from the verified parts' arrays (rank -> key -> tensor or piece), pieces joined."""
    out: Dict[Key, np.ndarray] = {}
    for kn, held in _held(manifests).items():
        if kn not in want:
            continue
        if len(held) == 1 and held[0][1].piece is None:
            out[kn] = arrays[held[0][0]][kn]
            continue
        first = held[0][1]
        arr = np.empty(first.shape, DTYPES[first.dtype])
        flat = _flat_bytes(arr)
        for k, rec in held:
            lo, hi = _bytes_held(rec)
            flat[lo:hi] = arrays[k][kn].reshape(-1).view(np.uint8)
        out[kn] = arr
    return out


MAX_READERS = 8  # shares read at once by one rank


def load_all(load_one: Callable[[int], LoadedCheckpoint], ranks: Sequence[int]) -> Dict[int, LoadedCheckpoint]:
    """Every part of ``ranks`` read and verified by ``load_one(rank)``, up to :data:`MAX_READERS` at once. When one
    fails the others are closed and the first failure (in the order of ``ranks``) is raised as :class:`ShareFailed`."""
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
    """Rank 0, before it commits: ("all", share writers) when the parts' shares cover the state, ("one", 0) when no part
    holds a share; CorruptCheckpointError when the ranks disagree."""
    if own is None:
        spread = [k for k, m in sorted(manifests.items()) if _share_of(m) is not None]
        if spread:
            raise CorruptCheckpointError(f"{where}: rank 0 wrote every replicated tensor, but the part(s) of rank(s) "
                                         f"{spread} hold shares (PADDLE_ACP_REPLICATED_WRITERS differs between the ranks)")
        return WRITERS_ONE, 0
    share = check_cover(manifests, where)
    return WRITERS_ALL, int(share["share_writers"])


def _share_of(m: Manifest) -> Any:
    """The ``extra.part.share`` of a part's manifest as written, unchecked (None: none)."""
    part = m.extra.get("part") if isinstance(m.extra, dict) else None
    return part.get("share") if isinstance(part, dict) else None
