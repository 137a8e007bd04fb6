"""The checkpoints of a range in restart order, each with its status, and the one a restart loads (decided by
:mod:`paddle_acp.format.checkpoints.index`, the restart's own code), in both layouts (one writer's ``ckpt-<N>/``,
several ranks' ``ckpt-e<E>[-s<S>]/``). Links and non-directories are never checkpoints."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, StorageError, UnknownFormatError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.engine import reader
from paddle_acp.format.layout import range_dir
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Storage
from paddle_acp.tools.discovery import short_reason, uri_join
from paddle_acp.tools.reading import progress_line, verify_checkpoint

OK, VERIFIED, CORRUPT, NEWER, UNCOMMITTED = "ok", "verified", "corrupt", "newer-format", "uncommitted"


@dataclasses.dataclass
class CkptInfo:
    """What the tools know about one checkpoint directory."""

    job: str
    range: str
    name: str
    number: int
    committed: bool
    path: str  # relative to the storage root
    bytes: int = 0
    mtime: Optional[float] = None
    manifest: Optional[Manifest] = None
    status: str = UNCOMMITTED  # OK, VERIFIED, CORRUPT, NEWER (never deleted) or UNCOMMITTED
    reason: str = ""
    restart: bool = False
    stops: bool = False  # of a newer format where the restart would train again: it stops (index.newer_in_the_way)
    position: Optional[Tuple[int, int]] = None  # checkpoints of several ranks: (epoch, step) order
    entry: Optional[index.Entry] = None  # where the restart order puts it

    @property
    def valid(self) -> bool:
        return self.status in (OK, VERIFIED)

    @property
    def multirank(self) -> bool:
        return self.position is not None

    def to_json(self) -> Dict[str, Any]:
        m = self.manifest
        r = m.range if m is not None else None
        return {"name": self.name, "number": self.number, "path": self.path, "committed": self.committed,
                "status": self.status, "valid": self.valid, "reason": self.reason or None, "restart": self.restart,
                "bytes": self.bytes, "created": m.created if m is not None else self.mtime,
                "epoch": r.epoch_no if r else None, "step": r.step if r else None,
                "max_epoch_num": r.max_epoch_num if r else None,
                "paddle_version": m.paddle_version if m is not None else None, "ir": m.ir if m is not None else None}


def dir_stats(storage: Storage, path: str) -> Tuple[int, Optional[float]]:
    """(total bytes of its files, newest mtime) of one checkpoint directory."""
    size, newest = 0, None
    for e in storage.listdir(path):
        if not e.is_dir:
            size += e.size
        if e.mtime is not None:
            newest = e.mtime if newest is None else max(newest, e.mtime)
    return size, newest


def scan_range(storage: Storage, job: str, range_name: str, verify: bool = False) -> List[CkptInfo]:
    """Every checkpoint directory of a range, with its status, in the order a restart tries them.

    Without ``verify`` a committed checkpoint is "ok" when its manifest is valid and its data file has the size the
    manifest gives; with ``verify`` every checksum is checked ("verified"). The first valid one is marked ``restart``
    (without ``verify``: the one a restart loads if its data verifies, which :func:`restart_checkpoint` reads)."""
    index.check_no_links(storage, job, range_name)
    listing = storage.listdir(range_dir(job, range_name))
    mtimes = {e.name: e.mtime for e in listing}
    infos: List[CkptInfo] = []
    for e in index.entries(storage, job, range_name, uncommitted=True, listing=listing):
        info_of = _single_info if e.layout == index.SINGLE else _global_info
        infos.append(info_of(storage, job, range_name, e, verify, mtimes))
    _mark(infos, lambda i: i if i.valid else _refuse(i))
    return infos


def _refuse(i: CkptInfo) -> CkptInfo:
    raise (UnknownFormatError if i.status == NEWER else CorruptCheckpointError)(i.reason)


def _mark(infos: List[CkptInfo], check: Callable[[CkptInfo], CkptInfo]) -> Optional[CkptInfo]:
    """Mark (``restart``) the first checkpoint of ``infos`` that ``check`` passes, by the restart's own search, unless
    the restart stops there: newer-format checkpoints after it (marked ``stops``; then None)."""
    by_entry = {id(i.entry): i for i in infos if i.entry is not None}
    cands = [i.entry for i in infos if i.entry is not None]
    search = index.first_usable(cands, lambda e: check(by_entry[id(e)]), log=False)
    stops = {id(r.entry) for r in index.newer_in_the_way(search)} if search.found is not None else set()
    for i in infos:
        i.stops = id(i.entry) in stops
        i.restart = not stops and i is search.found
    return None if stops else search.found


def _failed(info: CkptInfo, exc: Exception, unreadable: str = "cannot be read: ") -> None:
    """Mark ``info`` of a newer format or corrupt, by ``exc`` (``unreadable`` prefixes a StorageError's reason)."""
    reason = short_reason(exc, info.path)
    if isinstance(exc, UnknownFormatError):
        info.status, info.reason = NEWER, reason
    else:
        info.status, info.reason = CORRUPT, (unreadable + reason if isinstance(exc, StorageError) else reason)


def _single_info(storage: Storage, job: str, range_name: str, e: index.Entry, verify: bool,
                 mtimes: Dict[str, Optional[float]]) -> CkptInfo:
    info = CkptInfo(job, range_name, e.name, e.number, e.committed, e.path, entry=e)
    newest = None
    try:
        info.bytes, newest = dir_stats(storage, e.path)
    except StorageError as exc:  # this checkpoint only: the others are still listed
        if e.committed:
            _failed(info, exc)
    info.mtime = newest if newest is not None else mtimes.get(e.name)
    if e.committed and info.status != CORRUPT:
        try:
            if verify:
                info.manifest = verify_checkpoint(storage, job, range_name, e.number)
                info.status = VERIFIED
            else:  # the manifest and the data file's size, as a restore checks them first
                info.manifest, _ = reader.check_header(storage, e.path, e.number, range_name)
                info.status = OK
        except (CorruptCheckpointError, StorageError) as exc:
            _failed(info, exc)
            if info.status == CORRUPT and not isinstance(exc, StorageError):  # the manifest may be valid: shown
                info.manifest = _manifest_if_valid(storage, e.path, e.number, range_name)
    elif not e.committed:
        info.reason = "leftover of an interrupted save" if ".tmp-" in e.name else "no manifest (not committed)"
    return info


def _manifest_if_valid(storage: Storage, path: str, number: int, range_name: str) -> Optional[Manifest]:
    """The manifest of a corrupt checkpoint when the manifest itself is valid (the data is what is not)."""
    try:
        return reader.read_manifest(storage, path, number, range_name)
    except (CorruptCheckpointError, StorageError):
        return None


def _global_info(storage: Storage, job: str, range_name: str, e: index.Entry, verify: bool,
                 mtimes: Dict[str, Optional[float]]) -> CkptInfo:
    """A checkpoint of several ranks: "ok" when the global manifest and every part's manifest verify (and
    the data files have their sizes); with ``verify`` every part's checksums are read too."""
    from paddle_acp.format.checkpoints.global_reader import GlobalReader

    info = CkptInfo(job, range_name, e.name, 0, e.committed, e.path, entry=e, position=e.key)
    newest = mtimes.get(e.name)
    try:
        for d in storage.listdir(e.path):
            if d.is_dir:
                n, t = dir_stats(storage, f"{e.path}/{d.name}")
                info.bytes += n
                newest = t if t is not None and (newest is None or t > newest) else newest
    except StorageError as exc:  # this checkpoint only
        _failed(info, exc)
    info.mtime = newest
    if e.committed and info.status != CORRUPT:
        try:
            gm, raws = GlobalReader(storage, job, range_name).check_global(e.name)
            info.number = gm.number
            info.manifest = Manifest.loads(raws[0])
            info.status = OK
            info.reason = "1 rank" if gm.world_size == 1 else f"{gm.world_size} ranks, {gm.mode}"
            if verify:
                verify_global(storage, job, range_name, e.name)
                info.status = VERIFIED
        except (CorruptCheckpointError, CheckpointError, StorageError) as exc:  # CheckpointError: parts swapped
            _failed(info, exc)
    elif not e.committed:
        info.reason = "no global manifest (not committed, or abandoned)"
    return info


def restart_checkpoint(storage: Storage, job: str, range_name: str, infos: List[CkptInfo],
                       quiet: bool = False) -> Optional[CkptInfo]:
    """The checkpoint a restart loads, found as a restart finds it: the first committed one whose data
    verifies (those that fail are marked). None: a restart finds nothing to load."""

    def check(i: CkptInfo) -> CkptInfo:
        if not i.valid:
            _refuse(i)
        if i.status != VERIFIED:
            try:
                if i.multirank:
                    verify_global(storage, job, range_name, i.name, quiet=quiet)
                else:
                    verify_checkpoint(storage, job, range_name, i.number, quiet=quiet)
            except (CorruptCheckpointError, CheckpointError, StorageError) as exc:  # CheckpointError: parts swapped
                _failed(i, exc, unreadable="")
                if i.status == NEWER:
                    raise
                raise CorruptCheckpointError(i.reason) from exc
            i.status = VERIFIED
        return i

    return _mark(infos, check)


def restart_outcome(infos: List[CkptInfo], checked: bool) -> str:
    """What a restart of this range does, in words (``checked``: the data of the one it loads was read)."""
    pick = next((i for i in infos if i.restart), None)
    committed = [i for i in infos if i.committed]
    stops = [i.name for i in infos if i.stops]
    if stops:
        return (f"STOPS with CheckpointError: {', '.join(stops)}, of a newer format, hold positions it would train "
                "again and cannot replace; resume with the newer paddle-acp that wrote them, or use a new "
                "PADDLE_JOB_ID (nothing is deleted)")
    if pick is not None:
        return f"loads {pick.name}" if checked else f"loads {pick.name} if its data verifies (data not checked)"
    if not committed:
        return "starts from scratch (no committed checkpoint)"
    newer = sum(1 for i in committed if i.status == NEWER)
    return (f"STOPS with NoUsableCheckpointError: none of the {len(committed)} committed checkpoint(s) can be restored"
            + (f" ({newer} of a newer format: resume with a newer paddle-acp)" if newer else "")
            + "; nothing is deleted, PADDLE_ACP_START_FRESH=1 or a new PADDLE_JOB_ID starts from scratch")


def verify_global(storage: Storage, job: str, range_name: str, name: str, quiet: bool = False) -> None:
    """Every checksum of every part of a checkpoint of several ranks (a progress line per part);
    CorruptCheckpointError otherwise."""
    from paddle_acp.format.checkpoints.global_reader import GlobalReader

    g = GlobalReader(storage, job, range_name)
    gm, raws = g.check_global(name)
    for rank in sorted(raws):
        pdir = g.part_dir(name, rank)
        with progress_line(f"verifying {uri_join(storage.uri, pdir)}", quiet) as progress:
            reader.verify(storage, pdir, gm.number, range_name, raws[rank], progress)
