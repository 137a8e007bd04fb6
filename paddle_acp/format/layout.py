"""Layout: where a checkpoint's pieces are, by name and by byte offset.

Under the storage root::

    {job_id}/job.json                                            the job marker
    {job_id}/range/{range}/ckpt-{N}/tensors.bin                  one process's checkpoint N
    {job_id}/range/{range}/ckpt-{N}/manifest.json                (written last)
    {job_id}/range/{range}/ckpt-{N}.tmp-g{G}-{id}/               being written by generation G (renamed into place)
    {job_id}/range/{range}/ckpt-e{E}[-s{S}]/rank-{k}/...         rank k's part of a checkpoint of several ranks
    {job_id}/range/{range}/ckpt-e{E}[-s{S}]/global.json          its global manifest: the commit
    {job_id}/range/{range}/ckpt-e{E}[-s{S}]/bad-rank-{k}-{crc}   rank k rejected the data of the copy whose
                                                                 global.json has CRC32 {crc} (8 hex digits)
    {job_id}/range/{range}/ckpt-e{E}[-s{S}]/absent-rank-{k}      rank k could not write (or does not take) its
                                                                 part of this position (:mod:`.absence`)

Names are parsed strictly (canonical ASCII decimal, bounded lengths): anything else is foreign and never read or
deleted. Inside ``tensors.bin`` every tensor starts at a multiple of ``manifest.ALIGN``."""

from __future__ import annotations

import re
from typing import Optional, Tuple

from paddle_acp.format.engine.snapshot import layout  # (a snapshot is laid out when it is made)
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME

__all__ = [
    "DATA_NAME", "GLOBAL_NAME", "JOB_MARKER", "MANIFEST_NAME", "absent_mark", "bad_mark", "final_name", "layout",
    "parse_absent_mark", "parse_bad_mark", "parse_final", "parse_name", "position_key", "position_name",
    "position_number", "range_dir", "rank_part", "tmp_name",
]

JOB_MARKER = "job.json"
GLOBAL_NAME = "global.json"

# A name matches in full (\A..\Z: no trailing newline), canonical decimal (ASCII, no leading zero but "0"):
# ckpt-e00, ckpt-e0\n, ckpt-e\u0660 (an Arabic-Indic digit) are foreign.
def canonical(digits: int) -> str:
    """The pattern of a canonical decimal of at most ``digits`` digits, as one group."""
    return r"(0|[1-9][0-9]{0,%d})" % (digits - 1)


_NUM = canonical(15)  # at most manifest.MAX_NUMBER
_POS = canonical(12)
_RANK = canonical(6)
# ``.tmp-g<generation>-<hex>``: the writer's fencing generation (older layouts: ``.tmp-<hex>``)
_TMP = r"\.tmp-(?:g" + canonical(18) + r"-)?[0-9a-f]{1,32}"
FINAL_RE = re.compile(r"\Ackpt-" + _NUM + r"\Z", re.ASCII)
TMP_RE = re.compile(r"\Ackpt-" + _NUM + _TMP + r"\Z", re.ASCII)
# a checkpoint of several ranks: its training position; its parts
POSITION_RE = re.compile(r"\Ackpt-e" + _POS + r"(?:-s" + _POS + r")?\Z", re.ASCII)
PART_RE = re.compile(r"\Arank-" + _RANK + r"\Z", re.ASCII)
PART_TMP_RE = re.compile(r"\Arank-" + _RANK + _TMP + r"\Z", re.ASCII)
# a rank's verdict on one copy of a checkpoint of several ranks: its rank, the CRC32 of the global.json it judged
BAD_RE = re.compile(r"\Abad-rank-" + _RANK + r"-([0-9a-f]{8})\Z", re.ASCII)
# a rank's word that it has no part at this position (its save failed, or it does not take it)
ABSENT_RE = re.compile(r"\Aabsent-rank-" + _RANK + r"\Z", re.ASCII)
NO_STEP = (1 << 32) - 1


def range_dir(job_id: str, range_name: str) -> str:
    """The directory of one range's checkpoints."""
    return f"{job_id}/range/{range_name}"


# -- one process's checkpoints: ckpt-N ----------------------------------------------
def final_name(number: int) -> str:
    return f"ckpt-{number}"


def tmp_name(name: str, token: str, generation: Optional[int] = None) -> str:
    """The name a directory (or part, or file) is written under before its rename; ``generation``: the writer's fencing
    generation (a writer removes only older generations' leftovers)."""
    return f"{name}.tmp-{token}" if generation is None or generation < 0 else f"{name}.tmp-g{generation}-{token}"


def tmp_generation(match: "re.Match[str]") -> int:
    """The writer generation of a TMP_RE / PART_TMP_RE match; -1 for a name without one."""
    g = match.group(2)
    return -1 if g is None else int(g)


def parse_final(name: str) -> Optional[int]:
    """The number of a committed checkpoint's directory name ``ckpt-N``, or None."""
    m = FINAL_RE.fullmatch(name)
    return int(m.group(1)) if m else None


# -- checkpoints of several ranks: ckpt-e<E>[-s<S>]/rank-<k> ---------------------------
def position_name(epoch_no: int, step: Optional[int]) -> str:
    return f"ckpt-e{epoch_no}" if step is None else f"ckpt-e{epoch_no}-s{step}"


def parse_name(name: str) -> Optional[Tuple[int, Optional[int]]]:
    """(epoch, step or None) of a position name ``ckpt-e<E>[-s<S>]``, or None."""
    m = POSITION_RE.fullmatch(name)
    if not m:
        return None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


def position_key(epoch_no: int, step: Optional[int]) -> Tuple[int, int]:
    """Sort key: step S of epoch E comes before the end of epoch E."""
    return (epoch_no, NO_STEP if step is None else step)


def position_number(epoch_no: int, step: Optional[int]) -> int:
    """The checkpoint number recorded in part manifests: the position as one integer."""
    return ((epoch_no + 1) << 32) | (NO_STEP if step is None else step)


def rank_part(rank: int) -> str:
    return f"rank-{rank}"


def parse_part(name: str) -> Optional[int]:
    """The rank of a part's directory name ``rank-<k>``, or None."""
    m = PART_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def bad_mark(rank: int, global_crc32: int) -> str:
    """The name of rank ``rank``'s mark condemning the copy whose ``global.json`` has CRC32 ``global_crc32``."""
    if not 0 <= rank < 10**6 or not 0 <= global_crc32 < 2**32:
        raise ValueError(f"no mark name for rank {rank!r}, CRC32 {global_crc32!r}")
    return f"bad-rank-{rank}-{global_crc32:08x}"


def parse_bad_mark(name: str) -> Optional[Tuple[int, int]]:
    """(rank, CRC32 of the condemned global.json) of a mark's name ``bad-rank-<k>-<crc>``, or None."""
    m = BAD_RE.fullmatch(name)
    return (int(m.group(1)), int(m.group(2), 16)) if m else None


def absent_mark(rank: int) -> str:
    """The name of rank ``rank``'s word that it has no part at a position: ``absent-rank-<k>``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < 10**6:
        raise ValueError(f"no absence name for rank {rank!r}")
    return f"absent-rank-{rank}"


def parse_absent_mark(name: str) -> Optional[int]:
    """The rank of an absence's name ``absent-rank-<k>``, or None."""
    m = ABSENT_RE.fullmatch(name)
    return int(m.group(1)) if m else None
