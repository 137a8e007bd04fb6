"""Reading a job's save metrics (``JOB/metrics/trainer-<i>.jsonl``, written by
:class:`paddle_acp.format.checkpoints.metrics_log.MetricsLog`): the one reader. Every line is untrusted: a torn,
malformed or out-of-range line is skipped and counted, never an error."""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.format.layout import NO_STEP, parse_name, position_number
from paddle_acp.format.metrics_record import EVENTS, TIME_MAX, MetricsRecord, MetricsRecordError, is_num
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

METRICS_DIR = "metrics"
_METRICS_RE = re.compile(r"trainer-(0|[1-9][0-9]{0,8})\.jsonl", re.ASCII)  # fullmatch

__all__ = ["EVENTS", "TIME_MAX", "METRICS_DIR", "Record", "is_num", "clean_record", "read_metrics", "saves_of",
           "unrecorded_of", "restarts_of"]

Record = Dict[str, Any]  # a record read back: MetricsRecord.to_dict() and the reader's ``trainer``


def clean_record(rec: Any) -> Optional[Record]:
    """A line's JSON object checked as a :class:`~paddle_acp.format.metrics_record.MetricsRecord`
    (its JSON object again, event and range filled in, text cut), or None when it is not one."""
    try:
        return MetricsRecord.from_dict(rec).to_dict()
    except MetricsRecordError:
        return None


def read_metrics(storage: Storage, job: str) -> Tuple[List[Record], int]:
    """The records of a job's metrics files, oldest first, and how many lines were unusable.

    Files: ``JOB/metrics/trainer-<i>.jsonl``, one :class:`~paddle_acp.format.metrics_record.MetricsRecord`
    per line (saves, failed and skipped saves, process starts), each returned as its JSON object with
    a ``trainer`` field. A torn, malformed or out-of-range line is skipped and counted (its reason
    logged at debug level).
    """
    records: List[Record] = []
    bad = 0
    for e in storage.listdir(f"{job}/{METRICS_DIR}"):
        m = _METRICS_RE.fullmatch(e.name)
        if e.is_dir or not m:
            continue
        try:
            raw = storage.read_bytes(f"{job}/{METRICS_DIR}/{e.name}")
        except FileNotFoundError:
            continue
        for i, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = MetricsRecord.from_line(line).to_dict()
            except MetricsRecordError as exc:
                logger.debug("%s/%s/%s line %d skipped: %s", job, METRICS_DIR, e.name, i, exc)
                bad += 1
                continue
            rec["trainer"] = int(m.group(1))
            records.append(rec)
    records.sort(key=lambda r: r["time"])
    return records, bad


def saves_of(records: List[Record]) -> List[Record]:
    return [r for r in records if r["event"] in ("saved", "failed")]


def unrecorded_of(records: List[Record]) -> int:
    """At most how many save records a kill lost: committed checkpoints no ``saved`` line names.

    A restart's ``start`` record names the checkpoint it restored; when that one (and, for the
    consecutive numbers of one writer, those between it and the last recorded one) has no
    ``saved`` record of the same trainer and range before it, the killed process committed them
    but its buffered lines died with it (storage other than a local disk writes them in batches).
    An upper bound: a number may also have been skipped (past a leftover of a failed save).
    """
    last: Dict[Tuple[Any, str], int] = {}
    lost = 0
    for r in records:
        key = (r.get("trainer"), r["range"])
        if r["event"] == "saved":
            n: Any = r.get("number")
            if not is_num(n) and isinstance(r.get("name"), str):  # a checkpoint of several ranks
                pos = parse_name(r["name"])
                n = position_number(*pos) if pos is not None else None
            if is_num(n):
                last[key] = max(last.get(key, -1), int(n))
        elif r["event"] == "start":
            restored: Any = r.get("restored")
            if not is_num(restored) or not 0 <= restored < 1 << 62:
                continue
            m, prev = int(restored), last.get(key, -1)
            if m > prev:
                lost += _committed_after(prev, m)
                last[key] = m
    return lost


def _committed_after(prev: int, m: int) -> int:
    """At most how many checkpoints were committed after ``prev`` (-1: none recorded) up to ``m``, both a
    ``saved`` record's number or position (:func:`~paddle_acp.format.layout.position_number`). One writer's numbers
    (``ckpt-N``) follow each other; positions at the end of an epoch (``ckpt-eE``: every epoch's checkpoint,
    a one-process job's too) at most one per epoch; positions within an epoch do not follow each other: at least one."""
    if m < 1 << 32:
        return m - prev
    if m & NO_STEP == NO_STEP and (prev < 0 or (prev >= 1 << 32 and prev & NO_STEP == NO_STEP)):
        return (m >> 32) - (prev >> 32 if prev >= 0 else 0)
    return 1


def restarts_of(records: List[Record]) -> List[Record]:
    """The first record of every process after the first one (a restart): a ``start``
    record, or for files without them the first record with a new ``pid``."""
    out, seen, prev = [], set(), None
    for r in records:
        pid = (r.get("trainer"), r.get("pid"))
        if r.get("pid") is None:
            continue
        if pid != prev and pid not in seen:
            if prev is not None:
                out.append(r)
            seen.add(pid)
        prev = pid
    return out
