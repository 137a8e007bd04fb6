"""Atomic commit: a checkpoint directory becomes visible whole or not at all.

:class:`RenameCommit` (local disks, HDFS) writes under ``ckpt-N.tmp-g<G>-<id>`` and renames it to ``ckpt-N``;
:class:`ManifestLastCommit` (object stores) writes in place, its manifest (written last) being the commit
(:func:`strategy_for`). Readers accept only ``ckpt-N`` holding a manifest; the rest is a leftover (:func:`scan`).
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import uuid
from typing import Callable, List, Optional, Set, Tuple

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.format.layout import FINAL_RE, MANIFEST_NAME, TMP_RE, final_name, tmp_generation, tmp_name
from paddle_acp.storage.base import MANIFEST_LAST, RENAME, Entry, Storage

logger = logging.getLogger("paddle_acp")

_logged_foreign: Set[Tuple[str, str]] = set()


@dataclasses.dataclass(frozen=True)
class DirEntry:
    name: str
    number: int
    committed: bool  # a final name holding a manifest (or one that could not be looked into)
    generation: int = -1  # a temporary name's writer generation (-1: none in the name)


def foreign(storage: Storage, parent: str, e: Entry) -> None:
    """Log once that ``e``, under a checkpoint's name, is no checkpoint (a file or a symbolic link)."""
    key = (storage.uri, f"{parent}/{e.name}")
    if key in _logged_foreign:
        return
    _logged_foreign.add(key)
    what = "a symbolic link" if e.is_link else "not a directory"
    logger.warning(
        "ignoring %s/%s/%s: %s, so not a checkpoint written by paddle-acp (links are never followed); "
        "checkpoints go on past it", storage.uri, parent, e.name, what,
    )


def _committed(storage: Storage, path: str) -> bool:
    try:
        return storage.kind(f"{path}/{MANIFEST_NAME}") != "missing"
    except StorageError as exc:  # cannot look inside: never a leftover to delete; readers say why
        logger.debug("cannot check %s: %s", path, exc)
        return True


def scan(storage: Storage, parent: str, listing: Optional[List[Entry]] = None) -> List[DirEntry]:
    """The checkpoint directories (committed or not) of ``parent``, oldest first; a file, link or absurd number
    under a checkpoint's name is foreign (logged once, never read, never deleted)."""
    out = []
    for e in storage.listdir(parent) if listing is None else listing:
        m = FINAL_RE.fullmatch(e.name)
        t = None if m else TMP_RE.fullmatch(e.name)
        if not (m or t):
            continue
        if not e.is_dir:
            foreign(storage, parent, e)
            continue
        if m:
            out.append(DirEntry(e.name, int(m.group(1)), _committed(storage, f"{parent}/{e.name}")))
        elif t:
            out.append(DirEntry(e.name, int(t.group(1)), False, tmp_generation(t)))
    return sorted(out, key=lambda d: (d.number, d.name))


# -- commit strategies ------------------------------------------------------------------------
class CommitStrategy(abc.ABC):
    """How what a writer wrote becomes visible whole or not at all; ``before`` (e.g. the fence check) runs
    right before the one step that makes it visible, and may raise to stop it."""

    name: str = ""
    #: written under its final name: a reader may see it mid-write (only its commit file, written last, commits)
    in_place: bool = False

    @abc.abstractmethod
    def path_for(self, final: str, generation: Optional[int] = None) -> str:
        """Where to write the directory that becomes ``final`` (``generation``: the writer's). No I/O, so a
        write interrupted at any moment knows what to remove."""

    @abc.abstractmethod
    def prepare(self, storage: Storage, path: str) -> None:
        """Make what the files of ``path`` need before they are written (a directory, where the storage needs one)."""

    @abc.abstractmethod
    def commit(self, storage: Storage, path: str, final: str, commit_file: str, body: bytes,
               before: Optional[Callable[[], None]] = None) -> None:
        """Write ``body`` as ``commit_file`` of the written directory ``path`` and make it ``final``."""

    @abc.abstractmethod
    def commit_file_early(self, storage: Storage, path: str, commit_file: str, body: bytes) -> bool:
        """Write the commit file now, before (or while) the data is written, where that does not
        commit anything yet; False (nothing written) where the commit file is the commit."""

    @abc.abstractmethod
    def publish(self, storage: Storage, path: str, final: str, before: Optional[Callable[[], None]] = None) -> None:
        """Make ``path``, whose commit file is already written (:meth:`commit_file_early`), ``final``."""

    @abc.abstractmethod
    def write_file(self, storage: Storage, path: str, body: bytes, before: Optional[Callable[[], None]] = None) -> None:
        """Write one small file so that readers see all of it or nothing (``global.json``)."""


class RenameCommit(CommitStrategy):
    """Local disks, HDFS: write under ``<final>.tmp-<id>``, make it durable, rename it into place."""

    name = RENAME

    def path_for(self, final: str, generation: Optional[int] = None) -> str:
        parent, _, base = final.rpartition("/")
        return f"{parent}/{tmp_name(base, uuid.uuid4().hex[:12], generation)}"

    def prepare(self, storage: Storage, path: str) -> None:
        if not storage.creates_parents:  # (HDFS: its first file's creation makes it, and its parent too)
            storage.makedirs(path)

    def commit(self, storage: Storage, path: str, final: str, commit_file: str, body: bytes,
               before: Optional[Callable[[], None]] = None) -> None:
        self.commit_file_early(storage, path, commit_file, body)
        self.publish(storage, path, final, before)

    def commit_file_early(self, storage: Storage, path: str, commit_file: str, body: bytes) -> bool:
        storage.write_bytes(f"{path}/{commit_file}", body)  # invisible until the rename
        return True

    def publish(self, storage: Storage, path: str, final: str, before: Optional[Callable[[], None]] = None) -> None:
        storage.sync_dir(path)
        if before is not None:
            before()
        storage.rename(path, final)

    def write_file(self, storage: Storage, path: str, body: bytes, before: Optional[Callable[[], None]] = None) -> None:
        _write_file(storage, path, body, before)


def _write_file(storage: Storage, path: str, body: bytes, before: Optional[Callable[[], None]]) -> None:
    """Write one small file whole or not at all: renamed into place from a temporary name where the storage
    renames; an object store's object is atomic already."""
    if storage.commit_style != RENAME:
        if before is not None:
            before()
        storage.write_bytes(path, body)
        return
    place_file(storage, stage_file(storage, path, body), path, before)


def stage_file(storage: Storage, path: str, body: bytes) -> str:
    """Write ``body`` under a temporary name beside ``path`` (a storage that renames); returns that name."""
    tmp = tmp_name(path, uuid.uuid4().hex[:12])
    storage.write_bytes(tmp, body)
    return tmp


def place_file(storage: Storage, tmp: str, path: str, before: Optional[Callable[[], None]]) -> None:
    """Rename ``tmp`` (:func:`stage_file`) to ``path`` once ``before`` passed; removed when it raises (a fenced
    writer: nothing of this write stays)."""
    if before is not None:
        try:
            before()
        except BaseException:
            try:
                storage.delete_file(tmp)
            except StorageError as exc:
                logger.debug("could not remove %s: %s", tmp, exc)
            raise
    storage.rename(tmp, path)


class ManifestLastCommit(CommitStrategy):
    """Object stores (S3): write in place, the commit file last; its presence is the commit. On a file system
    (chosen by option) the directory is made and the commit file renamed into place."""

    name = MANIFEST_LAST
    in_place = True

    def path_for(self, final: str, generation: Optional[int] = None) -> str:
        return final

    def prepare(self, storage: Storage, path: str) -> None:
        if storage.commit_style == RENAME:  # a file system: files need their directory
            storage.makedirs(path)

    def commit(self, storage: Storage, path: str, final: str, commit_file: str, body: bytes,
               before: Optional[Callable[[], None]] = None) -> None:
        self.write_file(storage, f"{path}/{commit_file}", body, before)

    def commit_file_early(self, storage: Storage, path: str, commit_file: str, body: bytes) -> bool:
        return False  # it is the commit: after the data

    def publish(self, storage: Storage, path: str, final: str, before: Optional[Callable[[], None]] = None) -> None:
        raise CheckpointError(f"{final}: a manifest-last commit is made by its commit file alone (use commit)")

    def write_file(self, storage: Storage, path: str, body: bytes, before: Optional[Callable[[], None]] = None) -> None:
        _write_file(storage, path, body, before)


def strategy_for(storage: Storage, preferred: Optional[str] = None) -> CommitStrategy:
    """The commit strategy of ``storage``: its :attr:`Storage.commit_style`, or ``preferred`` ("rename" or
    "manifest-last"; rename only where the storage renames directories atomically)."""
    style = storage.commit_style if preferred is None else preferred
    if style == RENAME:
        if storage.commit_style != RENAME:
            raise CheckpointError(f"{storage.uri} cannot commit by renaming (its commit style is {storage.commit_style!r})")
        return RenameCommit()
    if style == MANIFEST_LAST:
        return ManifestLastCommit()
    raise CheckpointError(f"unknown commit style {style!r} (expected {RENAME!r} or {MANIFEST_LAST!r})")


class Pending:
    """A checkpoint directory (or a rank's part) being written; ``commit`` makes it visible."""

    def __init__(self, storage: Storage, parent: str, number: int, name: Optional[str] = None,
                 strategy: Optional[CommitStrategy] = None, generation: Optional[int] = None):
        self.storage = storage
        self.parent = parent
        self.number = number
        self.strategy = strategy or strategy_for(storage)
        self.final = f"{parent}/{name or final_name(number)}"
        self.path = self.strategy.path_for(self.final, generation)  # nothing on storage yet: see prepare
        self._prepared = False

    def prepare(self) -> None:
        """Make what the files need, once (called inside the writer's abort block: a Ctrl-C still removes it)."""
        if not self._prepared:
            self.strategy.prepare(self.storage, self.path)
            self._prepared = True

    def commit(self, manifest: bytes, before: Optional[Callable[[], None]] = None) -> None:
        """Write the manifest (after the data), then make the checkpoint visible; ``before`` runs right before."""
        self.strategy.commit(self.storage, self.path, self.final, MANIFEST_NAME, manifest, before)

    def write_manifest_early(self, manifest: bytes) -> bool:
        """Write the manifest before or while the data is written, where that commits nothing
        (then :meth:`publish` commits); False where the manifest is the commit (use :meth:`commit`)."""
        return self.strategy.commit_file_early(self.storage, self.path, MANIFEST_NAME, manifest)

    def publish(self, before: Optional[Callable[[], None]] = None) -> None:
        """Make the checkpoint visible after :meth:`write_manifest_early`."""
        self.strategy.publish(self.storage, self.path, self.final, before)

    def abort(self) -> None:
        self.storage.delete_dir(self.path)


def begin(storage: Storage, parent: str, number: int, strategy: Optional[CommitStrategy] = None,
          generation: Optional[int] = None) -> Pending:
    """A prepared :class:`Pending` (tests and tools; a writer prepares inside its abort block instead)."""
    pending = Pending(storage, parent, number, strategy=strategy, generation=generation)
    pending.prepare()
    return pending
