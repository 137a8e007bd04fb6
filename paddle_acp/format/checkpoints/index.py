"""Index: the checkpoints of one range in both layouts, in the order a restart tries them.

One read-only answer to "which checkpoint does a restart load", shared by the restart
(:func:`paddle_acp.format.checkpoints.restart.load_newest`) and the tools (``ls``, ``verify``, ``inspect``, ``gc``):
:func:`entries` and :func:`restart_candidates` list them, :func:`first_usable` tries them with the caller's check,
:func:`no_usable_error` stops a restart that finds none usable (never a silent start from scratch, never a
deletion), and :func:`newer_format` tells a checkpoint of an unknown newer format (never deleted or withdrawn).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Generic, List, Optional, Sequence, Tuple, TypeVar

from paddle_acp.errors import (
    CheckpointError,
    CorruptCheckpointError,
    NoUsableCheckpointError,
    StorageError,
    UnknownFormatError,
)
from paddle_acp.format.commit import atomic
from paddle_acp.format.engine import reader
from paddle_acp.format.global_manifest import GLOBAL_FORMAT, GLOBAL_VERSION, MAX_GLOBAL_SIZE
from paddle_acp.format.layout import (
    FINAL_RE,
    GLOBAL_NAME,
    MANIFEST_NAME,
    TMP_RE,
    parse_name,
    position_key,
    range_dir,
    rank_part,
)
from paddle_acp.format.manifest import FORMAT, MAX_MANIFEST_SIZE, TENSOR_CHECKSUMS
from paddle_acp.format.untrusted_json import check_newer_version, parse_json
from paddle_acp.storage.base import Entry as StorageEntry
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

SINGLE, GLOBAL = "single", "global"  # the two layouts
NEWER_FORMAT, CORRUPT, UNREADABLE, MISFIT = "newer format", "corrupt", "unreadable", "does not fit"
MAX_LISTED = 8  # checkpoints an error message names one by one
MAX_REASON = 300  # characters of each one's reason

T = TypeVar("T")


def check_no_links(storage: Storage, job_id: str, range_name: str) -> None:
    """Refuse a job whose ``range`` directory or range directory is a symbolic link: writes, retention and
    restores would act on whatever it points to (remote stores have no links)."""
    if not storage.has_symlinks:
        return
    for path in (f"{job_id}/range", range_dir(job_id, range_name)):
        if storage.kind(path) == "link":
            raise StorageError(
                f"{storage.uri}/{path} is a symbolic link: paddle-acp never follows links inside a job "
                "directory (another job's checkpoints could be read or deleted through it); "
                "replace it with a real directory"
            )


@dataclasses.dataclass(frozen=True)
class Entry:
    """One checkpoint directory of a range."""

    name: str  # ckpt-N or ckpt-e<E>[-s<S>] (or a leftover ckpt-N.tmp-<id>)
    layout: str  # SINGLE | GLOBAL
    number: int  # SINGLE: N; GLOBAL: -1 (its part manifests record the position as a number)
    key: Tuple[int, int]  # the restart order (see :func:`entries`)
    committed: bool
    path: str  # relative to the storage root

    @property
    def label(self) -> str:
        """How the logs name it: the number of a ``ckpt-N``, the name of a checkpoint of several ranks."""
        return str(self.number) if self.layout == SINGLE else self.name


def global_committed(storage: Storage, path: str) -> bool:
    """Whether the checkpoint of several ranks at ``path`` has its ``global.json``; True when that cannot be looked
    up (e.g. permission denied): never taken for a leftover to delete, and its readers say why it is not used."""
    try:
        return storage.exists(f"{path}/{GLOBAL_NAME}")
    except StorageError as exc:
        logger.debug("cannot check %s: %s", path, exc)
        return True


def entries(storage: Storage, job_id: str, range_name: str, uncommitted: bool = False,
            listing: Optional[List[StorageEntry]] = None, committed_now: Sequence[str] = ()) -> List[Entry]:
    """The committed checkpoints of a range (with ``uncommitted``, also leftovers and abandoned ones), newest first
    in restart order: by number, or by training position (a ``ckpt-N``'s from its manifest; unreadable: last) once
    a committed checkpoint of several ranks exists; at one position several ranks first, then the higher number.
    Verifies nothing. ``committed_now``: checkpoints whose ``global.json`` the caller just wrote (not looked up)."""
    parent = range_dir(job_id, range_name)
    listing = storage.listdir(parent) if listing is None else listing
    out: List[Entry] = []
    for e in listing:
        pos = parse_name(e.name)
        if pos is not None and not e.is_dir:
            atomic.foreign(storage, parent, e)  # a file or a link under a position's name: never read nor deleted
        elif pos is not None:
            committed = e.name in committed_now or global_committed(storage, f"{parent}/{e.name}")
            if committed or uncommitted:
                out.append(Entry(e.name, GLOBAL, -1, position_key(*pos), committed, f"{parent}/{e.name}"))
    by_position = any(g.committed for g in out)
    for d in atomic.scan(storage, parent, listing):
        if not d.committed and not uncommitted:
            continue
        path = f"{parent}/{d.name}"
        key = (-1, d.number)
        if by_position:
            key = (-2, d.number)
            if d.committed:
                try:
                    m = reader.read_manifest(storage, path, d.number, range_name)
                    key = position_key(m.range.epoch_no, m.range.step)
                except (CorruptCheckpointError, StorageError) as exc:
                    logger.debug("position of %s unknown: %s", path, exc)
        out.append(Entry(d.name, SINGLE, d.number, key, d.committed, path))
    out.sort(key=lambda e: (e.key, e.committed, e.layout == GLOBAL, e.number, e.name), reverse=True)
    return out


class NotCommitted(Exception):
    """A checkpoint of several ranks listed by :func:`restart_candidates` without a look inside
    has no ``global.json``: it is not committed, and a restart passes over it without a word."""


def restart_candidates(storage: Storage, job_id: str, range_name: str) -> Tuple[List[Entry], bool]:
    """What a restart tries, in :func:`entries` order (uncommitted included), and whether they were listed without
    a look inside: with checkpoints of several ranks only, one listing takes each as committed (loading one
    without ``global.json`` raises :class:`NotCommitted`); otherwise :func:`entries` looks into each."""
    listing = storage.listdir(range_dir(job_id, range_name))
    if any(FINAL_RE.fullmatch(e.name) or TMP_RE.fullmatch(e.name) for e in listing):
        return entries(storage, job_id, range_name, uncommitted=True, listing=listing), False
    parent = range_dir(job_id, range_name)
    out = []
    for e in listing:
        pos = parse_name(e.name)
        if pos is not None and not e.is_dir:
            atomic.foreign(storage, parent, e)  # a file or a link under a position's name: never read nor deleted
        elif pos is not None:
            out.append(Entry(e.name, GLOBAL, -1, position_key(*pos), True, f"{parent}/{e.name}"))
    out.sort(key=lambda e: (e.key, e.name), reverse=True)
    return out, True


@dataclasses.dataclass
class Rejection:
    """A committed checkpoint a restart does not load, and why."""

    entry: Entry
    kind: str  # NEWER_FORMAT | CORRUPT | UNREADABLE | MISFIT
    error: BaseException

    @property
    def reason(self) -> str:
        text = str(self.error)
        return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


@dataclasses.dataclass
class Search(Generic[T]):
    """What :func:`first_usable` found: the first checkpoint that passed (None: none did), and the
    committed checkpoints before it that did not, newest first."""

    found: Optional[T]
    entry: Optional[Entry]
    rejected: List[Rejection]

    def of_kind(self, kind: str) -> List[Rejection]:
        return [r for r in self.rejected if r.kind == kind]


def newer_in_the_way(search: "Search[T]") -> List[Rejection]:
    """The checkpoints of a newer format (of the global layout) a restart passed over: when it found an older one to
    load (or starts afresh) it would train their positions again and cannot replace them, so it stops instead."""
    return [r for r in search.of_kind(NEWER_FORMAT) if r.entry.layout == GLOBAL]


def first_usable(candidates: Sequence[Entry], load: Callable[[Entry], T], check: Optional[Callable[[T], None]] = None,
                 where: str = "", fatal: Optional[Callable[[Entry, StorageError], Optional[BaseException]]] = None,
                 log: bool = True) -> Search[T]:
    """The first committed checkpoint of ``candidates`` that ``load`` returns without CorruptCheckpointError or
    StorageError (:class:`NotCommitted`: passed over) and ``check`` does not reject with CheckpointError. Each
    rejection is logged unless ``log`` is False (``where``: the range's location); ``fatal(entry, exc)`` may turn a
    read error into an exception raised at once. Other exceptions of ``load`` propagate."""
    rejected: List[Rejection] = []
    for e in candidates:
        if not e.committed:
            continue
        try:
            value = load(e)
        except NotCommitted:
            continue
        except UnknownFormatError as exc:
            _reject(rejected, e, NEWER_FORMAT, exc, where, log)
            continue
        except CorruptCheckpointError as exc:
            _reject(rejected, e, CORRUPT, exc, where, log)
            continue
        except StorageError as exc:
            stop = fatal(e, exc) if fatal is not None else None
            if stop is not None:
                raise stop from exc
            _reject(rejected, e, UNREADABLE, exc, where, log)
            continue
        if check is not None:
            try:
                check(value)
            except CheckpointError as exc:
                close = getattr(value, "close", None)
                if close is not None:
                    close()
                _reject(rejected, e, MISFIT, exc, where, log)
                continue
        return Search(value, e, rejected)
    return Search(None, None, rejected)


def _reject(rejected: List[Rejection], e: Entry, kind: str, exc: BaseException, where: str, log: bool) -> None:
    rejected.append(Rejection(e, kind, exc))
    if not log:
        return
    if kind == UNREADABLE:
        logger.warning("skipping checkpoint %s of %s, it cannot be read: %s", e.label, where, exc)
    elif kind == NEWER_FORMAT:
        logger.warning("skipping checkpoint %s of %s, written in a newer format (it is kept): %s", e.label, where, exc)
    else:
        logger.warning("skipping checkpoint %s of %s: %s", e.label, where, exc)


def describe(rejected: Sequence[Rejection]) -> str:
    """Each rejected checkpoint and why, bounded: the first :data:`MAX_LISTED` one by one, then a count."""
    parts = [f"{r.entry.name} ({r.kind}: {r.reason})" for r in rejected[:MAX_LISTED]]
    if len(rejected) > MAX_LISTED:
        parts.append(f"and {len(rejected) - MAX_LISTED} more")
    return "; ".join(parts)


def no_usable_error(where: str, job_id: str, rejected: Sequence[Rejection], who: str = "") -> NoUsableCheckpointError:
    """The error of a restart that finds committed checkpoints but none it can use: it names each
    one and why, and the ways out. Nothing is deleted (the caller deletes nothing either)."""
    newer = [r.entry.name for r in rejected if r.kind == NEWER_FORMAT]
    outs = []
    if newer:
        outs.append("resume with the newer paddle-acp that wrote the checkpoints of a newer format")
    if len(newer) < len(rejected):
        outs.append("fix the storage or restore the checkpoints from a copy")
    outs.append("or start from scratch on purpose: set PADDLE_ACP_START_FRESH=1 (the corrupt checkpoints named "
                "ckpt-e<E>[-s<S>] are then withdrawn and deleted, as the fresh run trains their positions again; an "
                "earlier release's ckpt-N is kept, and those of a newer format are never deleted) or use a new "
                "PADDLE_JOB_ID")
    msg = (f"{who}none of the {len(rejected)} committed checkpoint(s) of {where} (job {job_id}) can be restored: "
           f"{describe(rejected)}. Training does not start from scratch on its own and nothing was deleted: "
           + "; ".join(outs) + ".")
    return NoUsableCheckpointError(msg, [(r.entry.name, r.reason) for r in rejected], newer)


def newer_format(storage: Storage, path: str) -> Optional[str]:
    """Why committed checkpoint ``path`` (either layout) is of a format version this paddle-acp does not know, or
    None (known, or corrupt). StorageError when its commit file or rank 0's manifest cannot be read now, which the
    caller must not take for "known" (it would delete what it could not read)."""
    name = path.rsplit("/", 1)[-1]
    docs: List[Tuple[str, int, str, int, str]] = []
    if parse_name(name) is not None:
        docs.append((f"{path}/{GLOBAL_NAME}", MAX_GLOBAL_SIZE, GLOBAL_FORMAT, GLOBAL_VERSION, "global manifest"))
        docs.append((f"{path}/{rank_part(0)}/{MANIFEST_NAME}", MAX_MANIFEST_SIZE, FORMAT, max(TENSOR_CHECKSUMS), "manifest"))
    else:
        docs.append((f"{path}/{MANIFEST_NAME}", MAX_MANIFEST_SIZE, FORMAT, max(TENSOR_CHECKSUMS), "manifest"))
    for file, limit, fmt, known, what in docs:
        try:
            d = parse_json(storage.read_bytes(file, limit=limit), what, limit)
            check_newer_version(d, fmt, known, what)
        except UnknownFormatError as exc:
            return f"{file}: {exc}"
        except (FileNotFoundError, CorruptCheckpointError) as exc:
            logger.debug("format of %s not known: %s", file, exc)
    return None
