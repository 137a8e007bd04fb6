"""``paddle-acp check``'s verdict: compare the per-epoch digests of its runs, name what differs.

A run's view of an epoch is its last ``epoch`` record for that (range, epoch): after a kill, the restarted process's.
Tensors and fetched values decide whether training differs, per rank; the script's numbers that the restart reset and
the objects holding state paddle-acp does not capture make the verdict *state not restored* (a longer run may train
differently), never *resumes exactly*; the report says how to capture each."""

from __future__ import annotations

import dataclasses
import glob
import json
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.secrets import redact_command

RESUMES_EXACTLY, NOT_DETERMINISTIC, RESUMES_DIFFERENTLY = "resumes_exactly", "not_deterministic", "resumes_differently"
STATE_NOT_RESTORED = "state_not_restored"
EXIT_STATUS = {RESUMES_EXACTLY: 0, NOT_DETERMINISTIC: 1, RESUMES_DIFFERENTLY: 2, STATE_NOT_RESTORED: 4}
_SHOWN = 8  # differing tensors named in the text report (all of them in --json)

Key = Tuple[str, int]  # (range, epoch)
Epochs = Dict[Key, Dict[str, Any]]
RankEpochs = Dict[int, Epochs]  # rank -> its epochs


def read_records(path: str) -> List[Dict[str, Any]]:
    """The digest records of one file, in order (a torn last line, from a kill, is dropped)."""
    out: List[Dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:  # an empty or torn line
            continue
        if isinstance(rec, dict) and isinstance(rec.get("range"), str) and isinstance(rec.get("epoch"), int):
            out.append(rec)
    return out


def read_ranks(path: str) -> Dict[int, List[Dict[str, Any]]]:
    """rank -> the records of one run: rank 0's in ``path``, rank k's in ``path.rank<k>``."""
    out: Dict[int, List[Dict[str, Any]]] = {}
    for p in [path] + sorted(glob.glob(glob.escape(path) + ".rank*")):
        suffix = p[len(path) + len(".rank"):] if p != path else "0"
        if not suffix.isdigit():
            continue
        recs = read_records(p)
        if recs:
            out[int(suffix)] = recs
    return out


def epochs_of(records: List[Dict[str, Any]]) -> Epochs:
    """(range, epoch) -> the last ``epoch`` record of it, in the order epochs first ended."""
    out: Epochs = {}
    for rec in records:
        if rec.get("kind") == "epoch":
            out[(rec["range"], rec["epoch"])] = rec
    return out


def rank_epochs(by_rank: Dict[int, List[Dict[str, Any]]]) -> RankEpochs:
    return {rank: epochs_of(recs) for rank, recs in sorted(by_rank.items())}


@dataclasses.dataclass
class Difference:
    range: str
    epoch: int
    tensors: List[str]  # persistables whose digests differ (or exist in one run only)
    fetched: List[str]  # fetched values whose digests differ
    missing: Optional[str] = None  # the epoch ended in one run only: which
    rank: int = 0


def _diff_maps(a: Dict[str, str], b: Dict[str, str]) -> List[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def first_difference(ref: Epochs, other: Epochs, ref_name: str, other_name: str) -> Optional[Difference]:
    """The first epoch (in the reference's order) whose tensors or fetched values differ."""
    for key, a in ref.items():
        b = other.get(key)
        if b is None:
            return Difference(key[0], key[1], [], [],
                              missing=f"epoch {key[1]} of range {key[0]} never ended in the {other_name} run")
        if bool(a.get("left_early")) != bool(b.get("left_early")):
            left_in = ref_name if a.get("left_early") else other_name
            return Difference(key[0], key[1], [], [], missing=f"the loop was left inside epoch {key[1]} of range "
                              f"{key[0]} (break, return or an exception) in the {left_in} run only")
        tensors = _diff_maps(a.get("tensors") or {}, b.get("tensors") or {})
        fetched: List[str] = []
        if not (a.get("resumed_mid_epoch") or b.get("resumed_mid_epoch")):  # a mid-epoch resume fetched a part only
            fetched = _diff_maps(a.get("fetched") or {}, b.get("fetched") or {})
        if tensors or fetched:
            return Difference(key[0], key[1], tensors, fetched)
    for key in other:
        if key not in ref:
            return Difference(key[0], key[1], [], [],
                              missing=f"epoch {key[1]} of range {key[0]} ended only in the {other_name} run")
    return None


def first_rank_difference(ref: RankEpochs, other: RankEpochs, ref_name: str, other_name: str) -> Optional[Difference]:
    """:func:`first_difference` of every rank against the same rank (lowest rank first)."""
    for rank in sorted(set(ref) | set(other)):
        if rank not in other or rank not in ref:
            where = other_name if rank not in other else ref_name
            return Difference("", 0, [], [], missing=f"rank {rank} wrote no digests in the {where} run", rank=rank)
        d = first_difference(ref[rank], other[rank], ref_name, other_name)
        if d is not None:
            d.rank = rank
            return d
    return None


def _fix_number(name: str, value: Any) -> str:
    short = name.split("().", 1)[-1]  # a local's name without its function; an attribute keeps its object
    holder = "acp.Counter(0)" if isinstance(value, int) else f"acp.Value({value!r})"
    where = (f"train_epoch_range(..., state={{{short!r}: {short}}})" if "()." in name
             else f"acp.track({short!r}, {short}) before the loop (or train_epoch_range(..., state={{{short!r}: {short}}}))")
    return f"hold it in {holder} ({short} += 1 keeps working) and save it with {where}"


def fix_for_object(kind: str) -> str:
    """How to make an object's state part of every checkpoint (the report's advice, by kind)."""
    if kind.startswith("counter"):
        return "use acp.Counter() instead (saved with acp.track(name, obj) or train_epoch_range(state=...))"
    if kind.startswith("RNG object"):
        return ("draw from a seeded np.random.default_rng(seed) or random.Random(seed), which every checkpoint "
                "saves without code")
    return ("iterate the data through acp.resumable(...) (its position is checkpointed), create it anew in every "
            "epoch, or save its state with train_epoch_range(state=...) (an object with state_dict()/set_state_dict())")


def differing_scalars(ref: RankEpochs, repeat: RankEpochs, killed: RankEpochs) -> List[Dict[str, Any]]:
    """Script numbers equal in both uninterrupted runs, not after the restart: state paddle-acp does not restore."""
    out: Dict[Tuple[int, str], Dict[str, Any]] = {}
    for rank, epochs in ref.items():
        for key, a in epochs.items():
            b, c = repeat.get(rank, {}).get(key), killed.get(rank, {}).get(key)
            if b is None or c is None:
                continue
            sa, sb, sc = a.get("scalars") or {}, b.get("scalars") or {}, c.get("scalars") or {}
            for name, value in sa.items():
                if (rank, name) in out or sb.get(name) != value or sc.get(name) == value:
                    continue
                out[(rank, name)] = {"name": name, "type": type(value).__name__, "epoch": key[1], "range": key[0],
                                     "rank": rank, "expected": value, "after_restart": sc.get(name),
                                     "fix": _fix_number(name, value)}
    return list(out.values())


def uncaptured_objects(*runs: RankEpochs) -> List[Dict[str, Any]]:
    """Objects of the script holding state paddle-acp does not capture, as the runtime described them."""
    seen: Dict[str, str] = {}
    for run in runs:
        for epochs in run.values():
            for rec in epochs.values():
                for name, what in (rec.get("uncaptured") or {}).items():
                    seen.setdefault(name, what)
    return [{"name": n, "type": seen[n], "fix": fix_for_object(seen[n])} for n in sorted(seen)]


@dataclasses.dataclass
class CheckResult:
    command: List[str]  # as run; the JSON report shows it redacted
    epochs: int
    verdict: str
    runs: List[Dict[str, Any]]
    difference: Optional[Difference]
    scalars: List[Dict[str, Any]]
    uncaptured: List[Dict[str, Any]]
    compared_epochs: int
    kills: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # every kill made, in order
    notes: List[str] = dataclasses.field(default_factory=list)  # what check changed of the command

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]


def to_json(res: CheckResult) -> Dict[str, Any]:
    return {
        "verdict": res.verdict, "exit_status": res.exit_status, "command": redact_command(res.command), "epochs": res.epochs,
        "compared_epochs": res.compared_epochs, "runs": res.runs, "kills": res.kills, "notes": res.notes,
        "first_difference": dataclasses.asdict(res.difference) if res.difference is not None else None,
        "state_not_captured": {"scalars": res.scalars, "objects": res.uncaptured},
    }


def point_text(p: Dict[str, Any]) -> str:
    """``epoch 2 of range _range_0`` or ``epoch 1, batch 3 of range _range_0``."""
    step = p.get("step")
    return f"epoch {p['epoch']}" + ("" if step is None else f", batch {step}") + f" of range {p['range']}"


def _kill_text(k: Dict[str, Any]) -> str:
    resumed = k.get("resumed_at_epoch")
    return f"{point_text(k)} (resumed at epoch {resumed if resumed is not None else '?'})"


def _names(names: List[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _where(d: Difference, ranks: bool) -> List[str]:
    rank = f" on rank {d.rank}" if ranks or d.rank else ""
    lines = [f"  first difference: epoch {d.epoch} of range {d.range}{rank}" if d.range else f"  first difference{rank}"]
    if d.missing:
        lines.append(f"    {d.missing}")
    if d.tensors:
        lines.append(f"    tensors: {_names(d.tensors)}")
    if d.fetched:
        lines.append(f"    fetched values: {_names(d.fetched)}")
    return lines


def _findings(res: CheckResult) -> List[str]:
    lines: List[str] = []
    if res.scalars:
        lines.append("  numbers in the script that the restart reset (state paddle-acp does not capture):")
        for s in res.scalars:
            rank = f" on rank {s['rank']}" if s.get("rank") else ""
            lines.append(f"    {s['name']} ({s['type']}){rank}: {s['expected']!r} at the end of epoch {s['epoch']} "
                         f"uninterrupted, {s['after_restart']!r} after the restart")
            lines.append(f"      fix: {s['fix']}")
    if res.uncaptured:
        lines.append("  objects in the script holding state paddle-acp does not capture:")
        for o in res.uncaptured:
            lines.append(f"    {o['name']}: {o['type']}")
            lines.append(f"      fix: {o['fix']}")
    return lines


def render(res: CheckResult) -> str:
    lines: List[str] = []
    kills = "; ".join(_kill_text(k) for k in res.kills)
    ranks = any(r.get("ranks", 1) > 1 for r in res.runs)
    if res.verdict == RESUMES_EXACTLY:
        lines.append(f"resumes exactly: {res.compared_epochs} epoch ends identical in every run, after a SIGKILL at "
                     f"each of: {kills}")
    elif res.verdict == STATE_NOT_RESTORED:
        lines.append(f"state not restored: the {res.compared_epochs} epoch ends compared are identical after a SIGKILL "
                     f"at each of: {kills}; but the restart reset state of the script that paddle-acp does not "
                     "capture, so a longer run (a milestone, a schedule, early stopping) may train differently")
    elif res.verdict == NOT_DETERMINISTIC:
        lines.append("not deterministic even without a kill: two uninterrupted runs differ")
        if res.difference is not None:
            lines += _where(res.difference, ranks)
        lines.append("  usual causes: an unseeded RNG (seed paddle, numpy and random at the start), nondeterministic "
                     "ops (atomics on GPU), data order that changes between runs (unseeded shuffling, several workers)")
    else:
        last = res.kills[-1] if res.kills else {}
        lines.append(f"resumes differently: after a SIGKILL at {_kill_text(last) if last else '?'} and a restart, "
                     "training differs from the uninterrupted runs")
        if res.difference is not None:
            lines += _where(res.difference, ranks)
    lines += _findings(res)
    for note in res.notes:
        lines.append(f"  note: {note}")
    for r in res.runs:
        lines.append(f"  run {r['name']}: {r['seconds']:.1f} s, exit status {r['returncode']}")
    return "\n".join(lines)
