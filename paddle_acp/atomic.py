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
import re
import uuid
from typing import Callable, List, Optional

from .manifest import MANIFEST_NAME
from .storage import Storage

logger = logging.getLogger("paddle_acp")

_FINAL_RE = re.compile(r"^ckpt-(\d{1,18})$")
_TMP_RE = re.compile(r"^ckpt-(\d{1,18})\.tmp-[0-9a-f]{1,32}$")


def final_name(number: int) -> str:
    return f"ckpt-{number}"


@dataclasses.dataclass(frozen=True)
class DirEntry:
    name: str
    number: int
    committed: bool  # a final name holding a manifest


def scan(storage: Storage, parent: str) -> List[DirEntry]:
    out = []
    for e in storage.listdir(parent):
        if not e.is_dir:
            continue
        m = _FINAL_RE.match(e.name)
        if m:
            committed = storage.exists(f"{parent}/{e.name}/{MANIFEST_NAME}")
            out.append(DirEntry(e.name, int(m.group(1)), committed))
            continue
        m = _TMP_RE.match(e.name)
        if m:
            out.append(DirEntry(e.name, int(m.group(1)), False))
    return sorted(out, key=lambda d: (d.number, d.name))


def next_number(entries: List[DirEntry]) -> int:
    return max((e.number for e in entries), default=-1) + 1


def remove_leftovers(storage: Storage, parent: str, entries: List[DirEntry]) -> None:
    for e in entries:
        if not e.committed:
            logger.info("removing leftover of an interrupted save: %s/%s", parent, e.name)
            storage.delete_dir(f"{parent}/{e.name}")


class Pending:
    """A checkpoint directory being written; ``commit`` makes it visible."""

    def __init__(self, storage: Storage, parent: str, number: int, name: Optional[str] = None):
        self.storage = storage
        self.parent = parent
        self.number = number
        name = name or final_name(number)
        self.final = f"{parent}/{name}"
        if storage.atomic_rename:
            self.path = f"{parent}/{name}.tmp-{uuid.uuid4().hex[:12]}"
        else:
            self.path = self.final
        storage.makedirs(self.path)

    def commit(self, manifest: bytes, before: Optional[Callable[[], None]] = None) -> None:
        """Write the manifest and make the directory visible; ``before`` runs (and may
        raise, e.g. a fenced writer) right before the step that makes it visible."""
        st = self.storage
        if before is not None and not st.atomic_rename:
            before()
        st.write_bytes(f"{self.path}/{MANIFEST_NAME}", manifest)
        if st.atomic_rename:
            st.sync_dir(self.path)
            if before is not None:
                before()
            st.rename(self.path, self.final)

    def abort(self) -> None:
        self.storage.delete_dir(self.path)


def begin(storage: Storage, parent: str, number: int) -> Pending:
    return Pending(storage, parent, number)
