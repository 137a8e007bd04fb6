"""Same verdict on every rank: the marks that condemn one copy of a checkpoint of several ranks,
and the identity of each part.

Ranks read different bytes (their own parts, node-local copies), so they can judge one checkpoint differently. A
rank that rejects data the others may accept never falls back alone: it writes a mark next to ``global.json`` and
stops (:class:`RestartRequiredError`); at the restart every rank reads the marks (:func:`marks`, in
:meth:`~paddle_acp.format.checkpoints.multirank.GlobalCheckpointer.load`, before any part) and falls back alike.
Ranks that accepted the copy stop too: each checks its base's marks at its first save, rank 0 before every commit
(:func:`base_condemned`).

A mark ``bad-rank-<k>-<crc>`` (:func:`~paddle_acp.format.layout.bad_mark`) names the CRC32 of the ``global.json``
it condemns; only a mark of the current ``global.json`` counts, and rank 0 removes old marks before committing a
position again (:func:`remove_marks`). Its content (:class:`Mark`, at most :data:`MAX_MARK_SIZE` bytes) says why,
for people; the name alone is the verdict.

:func:`check_part` holds each part's recorded identity (``extra["part"]``: rank, world size, mode) against the
global manifest, so parts moved or swapped between ranks (even with a resealed ``global.json``) are refused alike.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, List, Optional

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, RestartRequiredError, StorageError
from paddle_acp.format.global_manifest import GlobalManifest
from paddle_acp.format.layout import bad_mark, parse_bad_mark
from paddle_acp.format.manifest import Manifest
from paddle_acp.format.untrusted_json import _fail, _get, check_text, parse_json
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

MARK_FORMAT = "paddle-acp/bad-mark"
MARK_VERSION = 1
MAX_MARK_SIZE = 4096
MAX_REASON = 1000  # characters of the reason a mark keeps


@dataclasses.dataclass
class Mark:
    """Rank ``rank``'s verdict on checkpoint ``checkpoint``: the copy whose ``global.json`` has
    CRC32 ``global_crc32`` is bad, because of ``reason``."""

    checkpoint: str
    rank: int
    global_crc32: int
    reason: str

    @property
    def name(self) -> str:
        return bad_mark(self.rank, self.global_crc32)

    def dumps(self) -> bytes:
        reason = self.reason[:MAX_REASON].encode("utf-8", "replace").decode("utf-8")  # no lone surrogates
        while True:  # at most MAX_MARK_SIZE bytes, whatever the reason's characters
            raw = json.dumps({"format": MARK_FORMAT, "version": MARK_VERSION, "checkpoint": self.checkpoint,
                              "rank": self.rank, "global_crc32": self.global_crc32, "reason": reason},
                             sort_keys=True).encode("ascii")
            if len(raw) <= MAX_MARK_SIZE:
                return raw
            reason = reason[: len(reason) // 2]

    @classmethod
    def loads(cls, raw: bytes, name: Optional[str] = None) -> "Mark":
        """A mark's content (untrusted: size-capped, every field checked; ``name``: the file's
        name, which must be the one the content names). CorruptCheckpointError otherwise."""
        d = parse_json(raw, "mark", max_size=MAX_MARK_SIZE)
        if not isinstance(d, dict) or d.get("format") != MARK_FORMAT or d.get("version") != MARK_VERSION:
            raise _fail(f"mark: not a {MARK_FORMAT} document of version {MARK_VERSION}")
        checkpoint = check_text(_get(d, "checkpoint", str, "mark"), "mark.checkpoint", 200, empty=False)
        rank = _get(d, "rank", int, "mark")
        crc = _get(d, "global_crc32", int, "mark")
        reason = check_text(_get(d, "reason", str, "mark"), "mark.reason", MAX_REASON)
        if not 0 <= rank < 10**6 or not 0 <= crc < 2**32:
            raise _fail("mark: rank or global_crc32 out of range")
        mark = cls(checkpoint, rank, crc, reason)
        if name is not None and mark.name != name:
            raise _fail(f"mark {name!r} holds the content of {mark.name!r}")
        return mark


def marks(storage: Storage, ckdir: str, global_crc32: Optional[int], listing: Optional[List[Any]] = None) -> List[int]:
    """The ranks whose marks in ``ckdir`` condemn the copy whose ``global.json`` has CRC32
    ``global_crc32`` (marks of other copies, and foreign names, do not count)."""
    if global_crc32 is None:
        return []
    entries = storage.listdir(ckdir) if listing is None else listing
    return sorted({p[0] for p in (parse_bad_mark(e.name) for e in entries if not e.is_dir)
                   if p is not None and p[1] == global_crc32})


def check_marks(storage: Storage, ckdir: str, g: GlobalManifest) -> None:
    """CorruptCheckpointError when a rank's mark condemns the copy of ``g`` in ``ckdir``."""
    bad = marks(storage, ckdir, g.crc32)
    if bad and g.crc32 is not None:
        raise CorruptCheckpointError(f"{ckdir}: marked bad at restore by rank(s) {', '.join(map(str, bad))} "
                                     f"({reason_of(storage, ckdir, bad[0], g.crc32)})")


def reason_of(storage: Storage, ckdir: str, rank: int, global_crc32: int) -> str:
    """What rank ``rank``'s mark says (for messages; a mark counts by its name alone)."""
    name = bad_mark(rank, global_crc32)
    try:
        return Mark.loads(storage.read_bytes(f"{ckdir}/{name}", limit=MAX_MARK_SIZE), name).reason
    except (CorruptCheckpointError, StorageError, FileNotFoundError) as exc:
        return f"the mark's content cannot be read: {str(exc)[:200]}"


def write_mark(storage: Storage, ckdir: str, g: GlobalManifest, rank: int, reason: str) -> Optional[str]:
    """Mark the copy of ``g`` in ``ckdir`` bad; returns the mark's path, or None when it could not be written."""
    assert g.crc32 is not None, "a mark names a global manifest read from storage"
    mark = Mark(g.name, rank, g.crc32, reason)
    path = f"{ckdir}/{mark.name}"
    try:
        storage.write_bytes(path, mark.dumps())
    except StorageError as exc:
        logger.error("could not mark checkpoint %s bad (%s): %s", ckdir, path, exc)
        return None
    return path


def remove_marks(storage: Storage, ckdir: str, listing: Optional[List[Any]] = None) -> None:
    """Remove every mark in ``ckdir`` (``listing``: its entries, when just listed): the position is
    being committed again, and what they condemned (an earlier ``global.json``) is gone. Foreign names stay."""
    for e in storage.listdir(ckdir) if listing is None else listing:
        if not e.is_dir and parse_bad_mark(e.name) is not None:
            storage.delete_file(f"{ckdir}/{e.name}")
            logger.info("removed %s/%s: a verdict on an earlier copy of this position", ckdir, e.name)


def rejected(rank: int, ckdir: str, g: GlobalManifest, whose: str, exc: BaseException,
             storage: Storage) -> RestartRequiredError:
    """Rank ``rank`` rejected ``whose`` data of the checkpoint in ``ckdir`` (``exc``) while other ranks may
    accept it: mark the copy bad and return the error that stops this rank."""
    path = write_mark(storage, ckdir, g, rank, str(exc))
    marked = (f"The checkpoint is now marked bad ({path.rsplit('/', 1)[-1]})" if path is not None else
              "It could not be marked bad (see the error above): if the other ranks go on from it, "
              "remove the checkpoint by hand")
    return RestartRequiredError(
        f"rank {rank}: {whose} of checkpoint {ckdir} failed verification ({exc}), while the other ranks may resume "
        f"from it (their own part, or another copy). This rank does not fall back alone. {marked}: restart the job, "
        "and every rank falls back alike to the previous global checkpoint."
    )


def base_condemned(rank: int, ckdir: str, ranks: List[int], storage: Storage, crc: int) -> RestartRequiredError:
    """The error of a rank whose base (the checkpoint it resumed from, in ``ckdir``) was marked bad by ``ranks``."""
    why = reason_of(storage, ckdir, ranks[0], crc)
    return RestartRequiredError(
        f"rank {rank}: checkpoint {ckdir}, which this job resumed from, was marked bad at restore by rank(s) "
        f"{', '.join(map(str, ranks))} ({why}): those ranks did not resume from it, and the job's ranks would go on "
        "from different states. This rank stops and commits nothing more: restart the job, and every rank falls "
        "back alike to the previous global checkpoint."
    )


def check_part(ckdir: str, g: GlobalManifest, rank: int, m: Manifest) -> None:
    """Check that part manifest ``m``, listed by ``g`` as rank ``rank``'s, records that rank and ``g``'s world
    size and mode; CheckpointError otherwise (parts moved or swapped: no rank may resume another's state)."""
    part = m.extra.get("part") if isinstance(m.extra, dict) else None
    want = (rank, g.world_size, g.mode)
    got = (part.get("rank"), part.get("world_size"), part.get("mode")) if isinstance(part, dict) else None
    if got == want and all(type(a) is type(b) for a, b in zip(got, want)):
        return
    has = ("records no part identity" if got is None else
           f"records rank {got[0]!r} of world size {got[1]!r}, mode {got[2]!r}")
    raise CheckpointError(
        f"checkpoint {ckdir}: the part in rank-{rank}/ {has}, but the global manifest lists it as rank {rank} of "
        f"world size {g.world_size}, mode {g.mode!r}: parts moved or swapped between ranks, and a rank would resume "
        f"another rank's state. Nothing was loaded. Put each rank's part back where it was written, or remove "
        f"{ckdir} to resume from the previous checkpoint."
    )
