"""``paddle-acp check``'s verdict: compare the per-epoch digests of its runs, name what differs.

The records are those :mod:`paddle_acp.runtime.digests` writes (one JSON object a line). A run's
view of an epoch is its last ``epoch`` record for that (range, epoch): after a kill, the restarted
process's. Tensors and fetched values decide the verdict; the script's numbers (``scalars``) and the
objects holding state paddle-acp does not capture (``uncaptured``) explain it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional, Tuple

RESUMES_EXACTLY, NOT_DETERMINISTIC, RESUMES_DIFFERENTLY = "resumes_exactly", "not_deterministic", "resumes_differently"
EXIT_STATUS = {RESUMES_EXACTLY: 0, NOT_DETERMINISTIC: 1, RESUMES_DIFFERENTLY: 2}
_SHOWN = 8  # differing tensors named in the text report (all of them in --json)

Key = Tuple[str, int]  # (range, epoch)


def read_records(path: str) -> List[Dict[str, Any]]:
    """The digest records of one run, in order (a torn last line, from a kill, is dropped)."""
    out: List[Dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return out
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("range"), str) and isinstance(rec.get("epoch"), int):
            out.append(rec)
    return out


def epochs_of(records: List[Dict[str, Any]]) -> Dict[Key, Dict[str, Any]]:
    """(range, epoch) -> the last ``epoch`` record of it, in the order epochs first ended."""
    out: Dict[Key, Dict[str, Any]] = {}
    for rec in records:
        if rec.get("kind") == "epoch":
            out[(rec["range"], rec["epoch"])] = rec
    return out


@dataclasses.dataclass
class Difference:
    range: str
    epoch: int
    tensors: List[str]  # persistables whose digests differ (or exist in one run only)
    fetched: List[str]  # fetched values whose digests differ
    missing: Optional[str] = None  # the epoch ended in one run only: which

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def _diff_maps(a: Dict[str, str], b: Dict[str, str]) -> List[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def first_difference(ref: Dict[Key, Dict[str, Any]], other: Dict[Key, Dict[str, Any]],
                     ref_name: str, other_name: str) -> Optional[Difference]:
    """The first epoch (in the reference's order) whose tensors or fetched values differ."""
    for key, a in ref.items():
        b = other.get(key)
        if b is None:
            return Difference(key[0], key[1], [], [], missing=f"epoch {key[1]} of range {key[0]} never ended in the {other_name} run")
        tensors = _diff_maps(a.get("tensors") or {}, b.get("tensors") or {})
        fetched: List[str] = []
        if not (a.get("resumed_mid_epoch") or b.get("resumed_mid_epoch")):  # a mid-epoch resume fetched a part only
            fetched = _diff_maps(a.get("fetched") or {}, b.get("fetched") or {})
        if tensors or fetched:
            return Difference(key[0], key[1], tensors, fetched)
    for key in other:
        if key not in ref:
            return Difference(key[0], key[1], [], [], missing=f"epoch {key[1]} of range {key[0]} ended only in the {other_name} run")
    return None


def differing_scalars(ref: Dict[Key, Dict[str, Any]], repeat: Dict[Key, Dict[str, Any]],
                      killed: Dict[Key, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The script's numbers that are the same in both uninterrupted runs but not after the restart:
    state (a counter, an accumulator) that paddle-acp does not restore."""
    out: Dict[str, Dict[str, Any]] = {}
    for key, a in ref.items():
        b, c = repeat.get(key), killed.get(key)
        if b is None or c is None:
            continue
        sa, sb, sc = a.get("scalars") or {}, b.get("scalars") or {}, c.get("scalars") or {}
        for name, value in sa.items():
            if name in out or sb.get(name) != value or sc.get(name) == value:
                continue
            out[name] = {"name": name, "type": type(value).__name__, "epoch": key[1], "range": key[0],
                         "expected": value, "after_restart": sc.get(name)}
    return list(out.values())


def uncaptured_objects(*runs: Dict[Key, Dict[str, Any]]) -> List[Dict[str, str]]:
    """Objects of the script's globals (and of the frame opening a range) holding state paddle-acp
    does not capture, by name, as the runtime described them."""
    seen: Dict[str, str] = {}
    for run in runs:
        for rec in run.values():
            for name, what in (rec.get("uncaptured") or {}).items():
                seen.setdefault(name, what)
    return [{"name": n, "type": seen[n]} for n in sorted(seen)]


@dataclasses.dataclass
class CheckResult:
    command: List[str]
    epochs: int
    verdict: str
    runs: List[Dict[str, Any]]
    difference: Optional[Difference]
    scalars: List[Dict[str, Any]]
    uncaptured: List[Dict[str, str]]
    compared_epochs: int

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]


def to_json(res: CheckResult) -> Dict[str, Any]:
    return {
        "verdict": res.verdict, "exit_status": res.exit_status, "command": res.command, "epochs": res.epochs,
        "compared_epochs": res.compared_epochs, "runs": res.runs,
        "first_difference": res.difference.to_json() if res.difference is not None else None,
        "state_not_captured": {"scalars": res.scalars, "objects": res.uncaptured},
    }


def _names(names: List[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _where(d: Difference) -> List[str]:
    lines = [f"  first difference: epoch {d.epoch} of range {d.range}"]
    if d.missing:
        lines.append(f"    {d.missing}")
    if d.tensors:
        lines.append(f"    tensors: {_names(d.tensors)}")
    if d.fetched:
        lines.append(f"    fetched values: {_names(d.fetched)}")
    return lines


def render(res: CheckResult) -> str:
    lines: List[str] = []
    killed = res.runs[-1] if res.runs else {}
    if res.verdict == RESUMES_EXACTLY:
        lines.append(f"resumes exactly: {res.compared_epochs} epoch ends identical in all three runs "
                     f"(killed in epoch {killed.get('killed_in_epoch')}, resumed at epoch {killed.get('resumed_at_epoch')})")
    elif res.verdict == NOT_DETERMINISTIC:
        lines.append("not deterministic even without a kill: two uninterrupted runs differ")
        if res.difference is not None:
            lines += _where(res.difference)
        lines.append("  usual causes: an unseeded RNG (seed paddle, numpy and random at the start), nondeterministic "
                     "ops (atomics on GPU), data order that changes between runs (unseeded shuffling, several workers)")
    else:
        lines.append(f"resumes differently: after a kill in epoch {killed.get('killed_in_epoch')} and a restart "
                     f"(resumed at epoch {killed.get('resumed_at_epoch')}), training differs from the uninterrupted runs")
        if res.difference is not None:
            lines += _where(res.difference)
    if res.verdict != RESUMES_EXACTLY or res.uncaptured:
        if res.scalars:
            lines.append("  numbers in the script not restored by the restart (state paddle-acp does not capture):")
            for s in res.scalars:
                lines.append(f"    {s['name']} ({s['type']}): {s['expected']!r} at the end of epoch {s['epoch']} "
                             f"uninterrupted, {s['after_restart']!r} after the restart")
        if res.uncaptured:
            lines.append("  objects in the script holding state paddle-acp does not capture:")
            for o in res.uncaptured:
                lines.append(f"    {o['name']}: {o['type']}")
    for r in res.runs:
        lines.append(f"  run {r['name']}: {r['seconds']:.1f} s, exit status {r['returncode']}")
    return "\n".join(lines)
