"""Reading a job's save metrics (``JOB/metrics/trainer-<i>.jsonl``, written by
:class:`paddle_acp.format.metrics.MetricsLog`): the one reader. Every line is untrusted: a torn,
malformed or out-of-range line is skipped and counted, never an error."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.format.layout import parse_name, position_number
from paddle_acp.storage.base import Storage

METRICS_DIR = "metrics"
_METRICS_RE = re.compile(r"trainer-(0|[1-9][0-9]{0,8})\.jsonl", re.ASCII)  # fullmatch

METRIC_FIELDS = ("event", "time", "pid", "range", "number", "epoch", "step", "bytes", "stall_s", "waited_s",
                 "persist_s", "throughput_mb_s", "ok", "policy")
EVENTS = ("saved", "failed", "skipped", "start")
# Numeric fields and the range a real record keeps them in; a line outside it is skipped
# (a hand-edited or corrupted file must never make the tool fail).
TIME_MAX = 32503680000.0  # year 3000
_BOUNDS = {"time": (0.0, TIME_MAX), "stall_s": (0.0, 1e7), "waited_s": (0.0, 1e7), "persist_s": (0.0, 1e7),
           "throughput_mb_s": (0.0, 1e9), "bytes": (0, 1 << 60), "number": (0, 10 ** 18), "epoch": (-1, 1 << 62),
           "step": (0, 1 << 62), "pid": (0, 1 << 31), "skipped_before": (0, 1 << 62)}

Record = Dict[str, Any]


def is_num(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def clean_record(rec: Any) -> Optional[Record]:
    """A metrics record with its fields checked, or None when it is unusable.

    Every numeric field present must be a finite number within a real record's range
    (``null`` stands for absent); ``event`` is one of :data:`EVENTS` (records written
    before events existed are ``saved`` or, with ``ok: false``, ``failed``).
    """
    if not isinstance(rec, dict):
        return None
    for key, (lo, hi) in _BOUNDS.items():
        v = rec.get(key)
        if v is None and key != "time":
            continue
        if v is None or not is_num(v) or not lo <= v <= hi:
            return None
    event = rec.get("event")
    if event is None:
        event = "failed" if rec.get("ok", True) is False else "saved"
    if event not in EVENTS:
        return None
    out = dict(rec)
    out["event"] = event
    out["range"] = str(rec.get("range"))[:200] if rec.get("range") is not None else "-"
    if rec.get("error") is not None:
        out["error"] = str(rec["error"])[:500]
    return out


def read_metrics(storage: Storage, job: str) -> Tuple[List[Record], int]:
    """The records of a job's metrics files, oldest first, and how many lines were unusable.

    Files: ``JOB/metrics/trainer-<i>.jsonl``, one JSON object per line: saves
    (``event`` saved/failed: ``time, pid, range, number, epoch, step, bytes, stall_s,
    waited_s, persist_s, throughput_mb_s, ok``), skipped saves (``event: skipped``) and
    process starts (``event: start``); each record gets a ``trainer`` field. A torn,
    malformed or out-of-range line is skipped and counted.
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
        for line in raw.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                rec = clean_record(json.loads(line))
            except (ValueError, RecursionError):
                rec = None
            if rec is None:
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
                # one writer's numbers follow each other; positions of several ranks do not: at least one
                lost += m - prev if m < 1 << 32 else 1
                last[key] = m
    return lost


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
