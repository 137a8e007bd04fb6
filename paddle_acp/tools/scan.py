"""The checkpoints of a range, newest first, each with its status, and the one a restart loads.

Both layouts: one writer (``ckpt-<N>/`` with ``manifest.json`` and ``tensors.bin``) and several ranks
(``ckpt-e<E>[-s<S>]/`` with ``rank-<k>/`` parts and ``global.json``, see
:mod:`paddle_acp.format.multirank`). Links and non-directories are never checkpoints.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, StorageError
from paddle_acp.format import atomic, reader
from paddle_acp.format.checkpointer import Checkpointer
from paddle_acp.format.layout import position_key, range_dir
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Storage
from paddle_acp.tools.discovery import short_reason
from paddle_acp.tools.reading import verify_checkpoint

OK, VERIFIED, CORRUPT, UNCOMMITTED = "ok", "verified", "corrupt", "uncommitted"


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
    status: str = UNCOMMITTED  # ok | verified | corrupt | uncommitted
    reason: str = ""
    restart: bool = False
    position: Optional[Tuple[int, int]] = None  # checkpoints of several ranks: (epoch, step) order
    ranks: Optional[List[int]] = None  # checkpoints of several ranks: the parts' ranks (committed ones)

    @property
    def valid(self) -> bool:
        return self.status in (OK, VERIFIED)

    @property
    def multirank(self) -> bool:
        return self.position is not None

    def to_json(self) -> Dict[str, Any]:
        m = self.manifest
        return {
            "name": self.name,
            "number": self.number,
            "path": self.path,
            "committed": self.committed,
            "status": self.status,
            "valid": self.valid,
            "reason": self.reason or None,
            "restart": self.restart,
            "bytes": self.bytes,
            "created": m.created if m is not None else self.mtime,
            "epoch": m.range.epoch_no if m is not None else None,
            "step": m.range.step if m is not None else None,
            "max_epoch_num": m.range.max_epoch_num if m is not None else None,
            "paddle_version": m.paddle_version if m is not None else None,
            "ir": m.ir if m is not None else None,
        }


def dir_stats(storage: Storage, path: str) -> Tuple[int, Dict[str, int], Optional[float]]:
    """(total bytes, file name -> size, newest mtime) of one checkpoint directory."""
    files: Dict[str, int] = {}
    newest: Optional[float] = None
    for e in storage.listdir(path):
        if not e.is_dir:
            files[e.name] = e.size
        if e.mtime is not None:
            newest = e.mtime if newest is None else max(newest, e.mtime)
    return sum(files.values()), files, newest


def scan_range(
    storage: Storage, job: str, range_name: str, verify: bool = False, quiet_progress: bool = False
) -> List[CkptInfo]:
    """Every checkpoint directory of a range, newest first, with its status.

    Without ``verify`` a committed checkpoint is "ok" when its manifest is valid
    and its data file has the size the manifest gives (no data is read); with
    ``verify`` every checksum is checked ("verified"). The newest valid one is
    marked ``restart``: it is the one a restart loads (restarts skip corrupt
    checkpoints).
    """
    parent = range_dir(job, range_name)
    Checkpointer(storage, job, range_name).check_no_links()
    listing = storage.listdir(parent)
    mtimes = {e.name: e.mtime for e in listing}
    infos: List[CkptInfo] = []
    for d in atomic.scan(storage, parent, listing):
        path = f"{parent}/{d.name}"
        info = CkptInfo(job, range_name, d.name, d.number, d.committed, path)
        try:
            info.bytes, _files, newest = dir_stats(storage, path)
        except StorageError as exc:  # this checkpoint only: the others are still listed
            newest = None
            if d.committed:
                info.status, info.reason = CORRUPT, f"cannot be read: {short_reason(exc, path)}"
        info.mtime = newest if newest is not None else mtimes.get(d.name)
        if d.committed and info.status != CORRUPT:
            try:
                if verify:
                    info.manifest = verify_checkpoint(storage, job, range_name, d.number, quiet=quiet_progress)
                    info.status = VERIFIED
                else:  # the manifest and the data file's size, as a restore checks them first
                    info.manifest, _ = reader.check_header(storage, path, d.number, range_name)
                    info.status = OK
            except CorruptCheckpointError as exc:
                info.status, info.reason = CORRUPT, short_reason(exc, path)
                info.manifest = _manifest_if_valid(storage, path, d.number, range_name)  # shown where it is
            except StorageError as exc:
                info.status, info.reason = CORRUPT, f"cannot be read: {short_reason(exc, path)}"
        elif not d.committed:
            info.reason = "leftover of an interrupted save" if ".tmp-" in d.name else "no manifest (not committed)"
        infos.append(info)
    glob = _scan_global(storage, job, range_name, verify, mtimes)
    if glob:  # both layouts: order by training position, as a restart does
        def pos(i: CkptInfo) -> Tuple[int, int]:
            m = i.manifest
            if i.position is not None:
                return i.position
            if m is None:
                return (-2, i.number)
            return (m.range.epoch_no, m.range.step if m.range.step is not None else (1 << 32) - 1)

        infos += glob
        infos.sort(key=lambda i: (pos(i), i.committed), reverse=True)
    else:
        infos.sort(key=lambda i: (i.number, i.committed), reverse=True)
    for i in infos:
        if i.committed and i.valid:
            i.restart = True
            break
    return infos


def _manifest_if_valid(storage: Storage, path: str, number: int, range_name: str) -> Optional[Manifest]:
    """The manifest of a corrupt checkpoint when the manifest itself is valid (the data is what is not)."""
    try:
        return reader.read_manifest(storage, path, number, range_name)
    except (CorruptCheckpointError, StorageError):
        return None


def _scan_global(storage: Storage, job: str, range_name: str, verify: bool,
                 mtimes: Dict[str, Optional[float]]) -> List[CkptInfo]:
    """The checkpoints of a job of several ranks (``ckpt-e<E>[-s<S>]/``, per-rank parts, ``global.json``):
    "ok" when the global manifest and every part's manifest verify (and the data files have their
    sizes); with ``verify`` every part's checksums are read too."""
    from paddle_acp.format.multirank import GlobalCheckpointer

    out = []
    gck = GlobalCheckpointer(storage, job, range_name, 0, 1)
    for g in gck.scan():
        path = f"{range_dir(job, range_name)}/{g.name}"
        info = CkptInfo(job, range_name, g.name, 0, g.committed, path)
        info.position = position_key(g.epoch_no, g.step)
        info.bytes, newest = 0, mtimes.get(g.name)
        try:
            for e in storage.listdir(path):
                if e.is_dir:
                    n, _files, t = dir_stats(storage, f"{path}/{e.name}")
                    info.bytes += n
                    newest = t if t is not None and (newest is None or t > newest) else newest
        except StorageError as exc:  # this checkpoint only
            info.status, info.reason = CORRUPT, f"cannot be read: {short_reason(exc, path)}"
        info.mtime = newest
        if g.committed and info.status != CORRUPT:
            try:
                gm, raws = gck.check_global(g.name)
                info.number = gm.number
                info.manifest = Manifest.loads(raws[0])
                info.ranks = sorted(raws)
                info.status = OK
                info.reason = f"{gm.world_size} ranks, {gm.mode}"
                if verify:
                    gck.verify(g.name)
                    info.status = VERIFIED
            except (CorruptCheckpointError, CheckpointError) as exc:  # CheckpointError: parts moved or swapped
                info.status, info.reason = CORRUPT, short_reason(exc, path)
            except StorageError as exc:
                info.status, info.reason = CORRUPT, f"cannot be read: {short_reason(exc, path)}"
        elif not g.committed:
            info.reason = "no global manifest (not committed, or abandoned)"
        out.append(info)
    return out


def restart_checkpoint(storage: Storage, job: str, range_name: str, infos: List[CkptInfo],
                       quiet: bool = False) -> Optional[CkptInfo]:
    """The checkpoint a restart loads, as a restart finds it: the newest committed one
    whose data verifies (every checksum read); those that fail are marked corrupt."""
    for i in infos:  # newest first
        if not i.committed or not i.valid:
            continue
        if i.status != VERIFIED:
            try:
                if i.multirank:  # a checkpoint of several ranks: every part
                    verify_global(storage, job, range_name, i.name)
                else:
                    verify_checkpoint(storage, job, range_name, i.number, quiet=quiet)
            except (CorruptCheckpointError, CheckpointError, StorageError) as exc:
                i.status, i.reason, i.restart = CORRUPT, short_reason(exc, i.path), False
                continue
            i.status = VERIFIED
        for j in infos:
            j.restart = j is i
        return i
    for j in infos:
        j.restart = False
    return None


def verify_global(storage: Storage, job: str, range_name: str, name: str) -> None:
    """Every part of a checkpoint of several ranks, every checksum; CorruptCheckpointError otherwise."""
    from paddle_acp.format.multirank import GlobalCheckpointer

    GlobalCheckpointer(storage, job, range_name, 0, 1).verify(name)
