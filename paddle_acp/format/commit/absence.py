"""A rank's word on storage that it has no part at a position: the ``absent-rank-<k>`` file.

A rank whose part cannot be written (never when fenced: a newer process of that rank speaks for it) writes this
small JSON document, whole or not at all, best effort (:func:`declare`): rank, generation, base (the checkpoint
its incarnation resumed from) and a reason without secrets. Rank 0 abandons the position at once on one that
counts (:func:`counts`: the rank's live generation, rank 0's base); an earlier incarnation's never abandons a new
checkpoint, and rank 0 removes those before it commits. Abandoned positions go by retention and ``paddle-acp gc``.
The content is untrusted input: size-capped, every field checked (:meth:`Absence.loads`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Optional

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format.commit.atomic import CommitStrategy
from paddle_acp.format.layout import absent_mark, parse_name
from paddle_acp.format.untrusted_json import _fail, _get, check_text, parse_json
from paddle_acp.storage.base import Storage, redact, scrub

logger = logging.getLogger("paddle_acp")

FORMAT = "paddle-acp/absent"
VERSION = 1
MAX_ABSENT_SIZE = 4096
MAX_REASON = 500  # characters of the reason kept
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def clean_reason(text: object) -> str:
    """One line of at most :data:`MAX_REASON` characters, URIs redacted and registered secrets scrubbed."""
    one = " | ".join(line.strip() for line in str(text).splitlines() if line.strip())
    one = scrub(_URI_RE.sub(lambda m: redact(m.group(0)), one))
    return one[:MAX_REASON].encode("utf-8", "replace").decode("utf-8")


@dataclasses.dataclass
class Absence:
    """Rank ``rank`` (generation ``generation``, resumed from ``base``) has no part in ``checkpoint``."""

    checkpoint: str
    rank: int
    generation: int  # -1: written without a fence
    base: Optional[str]
    reason: str

    @property
    def name(self) -> str:
        return absent_mark(self.rank)

    def dumps(self) -> bytes:
        reason = clean_reason(self.reason)
        while True:  # at most MAX_ABSENT_SIZE bytes, whatever the reason's characters
            raw = json.dumps({"format": FORMAT, "version": VERSION, "checkpoint": self.checkpoint, "rank": self.rank,
                              "generation": self.generation, "base": self.base, "reason": reason},
                             sort_keys=True).encode("ascii")
            if len(raw) <= MAX_ABSENT_SIZE:
                return raw
            reason = reason[: len(reason) // 2]

    @classmethod
    def loads(cls, raw: bytes, name: Optional[str] = None) -> "Absence":
        """An absence's content (untrusted: size-capped, every field checked; ``name``: the file's name,
        which must be the one the content names). CorruptCheckpointError otherwise."""
        d = parse_json(raw, "absence", max_size=MAX_ABSENT_SIZE)
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
            raise _fail(f"absence: not a {FORMAT} document of version {VERSION}")
        checkpoint = check_text(_get(d, "checkpoint", str, "absence"), "absence.checkpoint", 200, empty=False)
        rank = _get(d, "rank", int, "absence")
        gen = _get(d, "generation", int, "absence")
        base = _get(d, "base", str, "absence", optional=True)
        if base is not None:
            check_text(base, "absence.base", 200, empty=False)
        reason = check_text(_get(d, "reason", str, "absence"), "absence.reason", MAX_REASON)
        if parse_name(checkpoint) is None:
            raise _fail(f"absence: {checkpoint!r} is not the name of a position")
        if not 0 <= rank < 10**6 or not -1 <= gen < 10**18:
            raise _fail("absence: rank or generation out of range")
        got = cls(checkpoint, rank, gen, base, reason)
        if name is not None and got.name != name:
            raise _fail(f"absence {name!r} holds the content of {got.name!r}")
        return got


def declare(storage: Storage, strategy: CommitStrategy, ckdir: str, absence: Absence) -> Optional[str]:
    """Write ``absence`` into ``ckdir``, best effort: its path, or None when the storage refused (said at DEBUG)."""
    path = f"{ckdir}/{absence.name}"
    try:
        storage.makedirs(ckdir)
        strategy.write_file(storage, path, absence.dumps())
    except (StorageError, OSError) as exc:
        logger.debug("could not write %s (rank %d has no part there): %s", path, absence.rank, exc)
        return None
    return path


def read(storage: Storage, ckdir: str, rank: int) -> Optional[Absence]:
    """Rank ``rank``'s absence in ``ckdir``; None when there is none or it is not valid (said at DEBUG)."""
    name = absent_mark(rank)
    try:
        return Absence.loads(storage.read_bytes(f"{ckdir}/{name}", limit=MAX_ABSENT_SIZE), name)
    except FileNotFoundError:
        return None
    except CorruptCheckpointError as exc:
        logger.debug("ignoring %s/%s: %s", ckdir, name, exc)
        return None


def counts(a: Absence, checkpoint: str, base: Optional[str], live_generation: int) -> bool:
    """Whether ``a`` abandons ``checkpoint`` for an incarnation that resumed from ``base``: written for
    that position, from that base, by the live (newest) generation of its rank."""
    return a.checkpoint == checkpoint and a.base == base and a.generation >= live_generation
