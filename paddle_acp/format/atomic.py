"""Atomic commit: a checkpoint directory becomes visible whole or not at all.

Where the storage renames directories atomically (local disks, HDFS) a
checkpoint is written under ``ckpt-N.tmp-<id>`` and renamed to ``ckpt-N``. On
object stores (S3) it is written in place and its manifest, written last, is
the commit marker. Either way readers accept only ``ckpt-N`` holding a
manifest; everything else is a leftover of an interrupted save, removed by the
writer before its next save.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Callable, List, Optional, Set, Tuple

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.format.layout import FINAL_RE, MANIFEST_NAME, TMP_RE, final_name, parse_final, tmp_name
from paddle_acp.format.manifest import MAX_NUMBER
from paddle_acp.storage.base import Entry, Storage

logger = logging.getLogger("paddle_acp")

_logged_foreign: Set[Tuple[str, str]] = set()


@dataclasses.dataclass(frozen=True)
class DirEntry:
    name: str
    number: int
    committed: bool  # a final name holding a manifest (or one that could not be looked into)


def _foreign(storage: Storage, parent: str, e: Entry) -> None:
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
    """The checkpoint directories (committed or not) of ``parent``, oldest first.

    Only real directories with canonical names count: a file, a symbolic link
    or an absurd number under a checkpoint's name is foreign (logged once, never
    read, never deleted)."""
    out = []
    for e in storage.listdir(parent) if listing is None else listing:
        m = FINAL_RE.fullmatch(e.name)
        t = None if m else TMP_RE.fullmatch(e.name)
        if not (m or t):
            continue
        if not e.is_dir:
            _foreign(storage, parent, e)
            continue
        if m:
            out.append(DirEntry(e.name, int(m.group(1)), _committed(storage, f"{parent}/{e.name}")))
        elif t:
            out.append(DirEntry(e.name, int(t.group(1)), False))
    return sorted(out, key=lambda d: (d.number, d.name))


def next_number(entries: List[DirEntry], listing: Optional[List[Entry]] = None) -> int:
    """One past every number in ``entries`` and every ``ckpt-N`` name of ``listing``
    (a stray file named ``ckpt-N`` must not make the commit of ``ckpt-N`` fail)."""
    used = [e.number for e in entries]
    for e in listing or ():
        n = parse_final(e.name)
        if n is not None:
            used.append(n)
    number = max(used, default=-1) + 1
    if number > MAX_NUMBER:
        raise CheckpointError(
            f"checkpoint numbers are exhausted: ckpt-{number - 1} exists and numbers have at most 15 digits; "
            "remove that entry (or start a new job with a new PADDLE_JOB_ID)"
        )
    return number


def remove_leftovers(storage: Storage, parent: str, entries: List[DirEntry]) -> List[DirEntry]:
    """Delete the uncommitted entries; returns those that could not be deleted (logged)."""
    stuck = []
    for e in entries:
        if not e.committed:
            logger.info("removing leftover of an interrupted save: %s/%s", parent, e.name)
            try:
                storage.delete_dir(f"{parent}/{e.name}")
            except StorageError as exc:  # it keeps its name; checkpoints go on past it
                logger.warning("could not remove %s/%s: %s", parent, e.name, exc)
                stuck.append(e)
    return stuck


class Pending:
    """A checkpoint directory being written; ``commit`` makes it visible."""

    def __init__(self, storage: Storage, parent: str, number: int, name: Optional[str] = None):
        self.storage = storage
        self.parent = parent
        self.number = number
        name = name or final_name(number)
        self.final = f"{parent}/{name}"
        if storage.atomic_rename:
            self.path = f"{parent}/{tmp_name(name, uuid.uuid4().hex[:12])}"
            storage.makedirs(self.path)
        else:
            # object stores: no directory object is needed (a key's prefix is its directory),
            # and each one would cost a request per checkpoint
            self.path = self.final

    def commit(self, manifest: bytes, before: Optional[Callable[[], None]] = None) -> None:
        """Write the manifest (after the data), then make the checkpoint visible; ``before``
        runs (and may raise, e.g. a fenced writer) right before the step that makes it visible."""
        if before is not None and not self.storage.atomic_rename:
            before()  # the manifest is the commit
        self.write_manifest(manifest)
        self.publish(before if self.storage.atomic_rename else None)

    def write_manifest(self, manifest: bytes) -> None:
        """Where a rename commits, the manifest may be written before or while the data is;
        on object stores it is the commit and must come last (use ``commit``)."""
        self.storage.write_bytes(f"{self.path}/{MANIFEST_NAME}", manifest)

    def publish(self, before: Optional[Callable[[], None]] = None) -> None:
        """Rename the written directory into place (a no-op on object stores: the manifest committed it)."""
        st = self.storage
        if st.atomic_rename:
            st.sync_dir(self.path)
            if before is not None:
                before()
            st.rename(self.path, self.final)

    def abort(self) -> None:
        self.storage.delete_dir(self.path)


def begin(storage: Storage, parent: str, number: int) -> Pending:
    return Pending(storage, parent, number)
