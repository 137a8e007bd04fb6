"""Reading a job's save metrics (``JOB/metrics/trainer-<i>.jsonl``, written by
:class:`paddle_acp.format.checkpoints.metrics_log.MetricsLog`): the one reader. Every line is untrusted: a torn,
malformed or out-of-range line is skipped and counted, never an error."""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, List, Tuple

from paddle_acp.format.layout import NO_STEP, parse_name, position_number
from paddle_acp.format.metrics_record import EVENTS, TIME_MAX, MetricsRecord, MetricsRecordError, is_num
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

METRICS_DIR = "metrics"
_METRICS_RE = re.compile(r"trainer-(0|[1-9][0-9]{0,8})\.jsonl", re.ASCII)  # fullmatch

__all__ = ["EVENTS", "TIME_MAX", "METRICS_DIR", "Record", "is_num", "read_metrics", "saves_of", "unrecorded_of",
           "restarts_of"]

Record = Dict[str, Any]  # a record read back: MetricsRecord.to_dict() and the reader's ``trainer``


def read_metrics(storage: Storage, job: str) -> Tuple[List[Record], int]:
    """The records of a job's metrics files, oldest first, each with its ``trainer`` field, and how many
    lines were unusable (each reason logged at debug level)."""
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
    """At most how many save records a kill lost: a restart's ``start`` record names the checkpoint it
    restored; when no ``saved`` record of the same trainer and range names it (or, for one writer's
    consecutive numbers, those after the last recorded one), the killed process's buffered lines died
    with it. An upper bound: a number may also have been skipped (past a leftover of a failed save)."""
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
    """At most how many checkpoints were committed after ``prev`` (-1: none recorded) up to ``m`` (numbers or
    :func:`~paddle_acp.format.layout.position_number`): one writer's ``ckpt-N`` follow each other, epoch-end
    positions come at most one per epoch, mid-epoch positions do not follow each other (count one)."""
    if m < 1 << 32:
        return m - prev
    if m & NO_STEP == NO_STEP and (prev < 0 or (prev >= 1 << 32 and prev & NO_STEP == NO_STEP)):
        return (m >> 32) - (prev >> 32 if prev >= 0 else 0)
    return 1


def restarts_of(records: List[Record]) -> List[Record]:
    """The first record of every process after the first one (a restart)."""
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
