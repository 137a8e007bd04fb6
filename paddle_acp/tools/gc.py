"""``paddle-acp gc``: retention by hand. Keeps the newest K committed checkpoints of every range and
always the newest valid one (the one a restart loads, every checksum read); deletes the older ones and
the leftovers of interrupted saves untouched for ``--leftover-age`` seconds (a save may be writing them).
A range without a valid checkpoint loses nothing; a checkpoint of a newer format is never deleted (nor
counted). The decision is the writer's own (:func:`~paddle_acp.format.commit.retention.preserve`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.errors import CheckpointError, StorageError
from paddle_acp.format.commit import retention
from paddle_acp.format.commit.fencing import check_deletable
from paddle_acp.format.commit.retention import delete_checkpoint, preserve
from paddle_acp.storage.base import Storage, scrub
from paddle_acp.tools.discovery import ToolError, list_ranges, open_root, select_jobs
from paddle_acp.tools.render import fmt_duration, human_bytes, output, plural, root_command, table
from paddle_acp.tools.scan import CORRUPT, NEWER, CkptInfo, restart_checkpoint, scan_range

KEEP, DELETE, SKIP = "keep", "delete", "skip"


@dataclasses.dataclass
class GcAction:
    job: str
    range: str
    info: CkptInfo
    action: str  # keep | delete | skip
    why: str


@dataclasses.dataclass
class GcResult:
    uri: str
    keep: int
    dry_run: bool
    plan: List[GcAction]
    deleted: List[GcAction]  # empty on a dry run
    errors: List[str]

    @property
    def to_remove(self) -> List[GcAction]:
        return [a for a in self.plan if a.action == DELETE]


def plan_gc(storage: Storage, jobs: List[str], keep: int, leftover_age: float) -> List[GcAction]:
    """What ``gc`` keeps and deletes; reads (and verifies) but changes nothing."""
    now = time.time()
    plan: List[GcAction] = []

    def old_leftover(i: CkptInfo) -> bool:  # (one modified within ``leftover_age``: a save may be writing it)
        return not i.committed and (i.mtime is None or now - i.mtime >= leftover_age)

    for job in jobs:
        for r in list_ranges(storage, job):
            infos = scan_range(storage, job, r)
            newest_valid = restart_checkpoint(storage, job, r, infos)
            reasons = preserve(infos, keep, lambda i: i.committed, lambda i: i.status != NEWER, old_leftover,
                               newest_valid)
            plan += [GcAction(job, r, i, DELETE if why in retention.GONE else SKIP if why == retention.PENDING
                              else KEEP, _why(i, why, keep, now, newest_valid)) for i, why in zip(infos, reasons)]
    return plan


def _why(i: CkptInfo, why: str, keep: int, now: float, restart: Optional[CkptInfo]) -> str:
    """The words for :func:`preserve`'s reason ``why`` about ``i``."""
    corrupt = f" (CORRUPT: {i.reason})" if i.status == CORRUPT else ""
    if why == retention.PENDING:
        return f"{i.reason}, but modified {fmt_duration(now - (i.mtime or now))} ago: may be a save in progress"
    if why == retention.NEWEST:
        return f"among the newest {keep}" + (", a restart loads it" if i is restart else corrupt)
    return {
        retention.STALE: i.reason,
        retention.FOREIGN: f"of a newer format: this paddle-acp never deletes it ({i.reason})",
        retention.NO_RESTART: "no checkpoint here that a restart loads: nothing deleted",
        retention.RESTART: "newest valid checkpoint (a restart loads it)",
        retention.OLDER: f"older than the newest {keep}{corrupt}",
    }[why]


def _delete(storage: Storage, info: CkptInfo) -> None:
    """The commit file first (a half-deleted checkpoint never looks committed); only inside the job's own
    range directory, never through a symbolic link (the storage refuses)."""
    if not info.path.startswith(f"{info.job}/range/{info.range}/"):  # pragma: no cover - the scan builds it so
        raise ToolError(f"refusing to delete {info.path!r}: not inside range {info.range!r} of job {info.job!r}")
    delete_checkpoint(storage, info.path, info.committed)


def gc(uri: str, keep: int, dry_run: bool = False, job: Optional[str] = None,
       leftover_age: float = 600.0) -> GcResult:
    if keep < 1:
        raise ToolError(f"--keep must be at least 1, got {keep}")
    storage = open_root(uri)
    jobs = select_jobs(storage, job)
    try:
        plan = plan_gc(storage, jobs, keep, leftover_age)
    except StorageError as exc:
        raise ToolError(f"gc of {storage.uri!r} stopped before deleting anything: {exc}") from exc
    res = GcResult(storage.uri, keep, dry_run, plan, [], [])
    refused: Dict[Tuple[str, str], Optional[str]] = {}  # (job, range) -> why nothing is deleted there (None: allowed)
    for a in res.to_remove:
        where = (a.job, a.range)
        if where not in refused:  # the writer's own guard: the job's own directory, no link, its marker names it
            try:
                check_deletable(storage, a.job, f"{a.job}/range/{a.range}")
                refused[where] = None
            except (CheckpointError, StorageError, RecursionError) as exc:  # (a marker too deep to parse)
                refused[where] = str(exc)
                res.errors.append(f"nothing deleted in range {a.range} of job {a.job}: {exc}")
        if refused[where] is not None:
            a.action, a.why = KEEP, f"not deleted: {refused[where]}"
        elif not dry_run:
            try:
                _delete(storage, a.info)
                res.deleted.append(a)
            except StorageError as exc:
                res.errors.append(str(exc))
    return res


def to_json(res: GcResult) -> Dict[str, Any]:
    actions = [{"job": a.job, "range": a.range, "checkpoint": a.info.name, "action": a.action, "why": a.why,
                "bytes": a.info.bytes} for a in res.plan]
    return {"uri": res.uri, "dry_run": bool(res.dry_run), "keep": res.keep, "actions": actions,
            "deleted": [] if res.dry_run else [a.info.path for a in res.deleted],
            "freed_bytes": 0 if res.dry_run else sum(a.info.bytes for a in res.deleted), "errors": res.errors}


def render(res: GcResult) -> str:
    verb = "would delete" if res.dry_run else "delete"
    lines = [f"gc {res.uri} --keep {res.keep}" + (" (dry run: nothing is changed)" if res.dry_run else "")]
    rows = [[a.job, a.range, a.info.name, verb if a.action == DELETE else a.action, human_bytes(a.info.bytes), a.why]
            for a in res.plan]
    if rows:
        lines.append(table(["JOB", "RANGE", "CHECKPOINT", "ACTION", "SIZE", "WHY"], rows, right=(4,)))
    if res.dry_run:
        n, freed = len(res.to_remove), sum(a.info.bytes for a in res.to_remove)
        lines.append(f"dry run: {n} {plural(n, 'directory', 'directories')} ({human_bytes(freed)}) would be deleted; "
                     "nothing was changed")
    else:
        n = len(res.deleted)
        lines.append(f"deleted {n} {plural(n, 'directory', 'directories')}, "
                     f"freed {human_bytes(sum(a.info.bytes for a in res.deleted))}")
    return "\n".join(lines)


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = root_command(
        sub, "gc", "delete old checkpoints and leftovers by hand (keeps the newest valid one)",
        "Keep the newest K committed checkpoints of every range (and always the newest valid one) and delete the "
        "older ones and the leftovers of interrupted saves.")
    p.add_argument("--keep", type=int, required=True, metavar="K", help="committed checkpoints to keep per range (>= 1)")
    p.add_argument("--dry-run", action="store_true", help="only show what would be deleted")
    p.add_argument("--leftover-age", type=float, default=600.0, metavar="SECONDS", help="delete uncommitted "
                   "leftovers only when untouched this long (default 600: a save may be in progress)")
    return p


def main(args: argparse.Namespace) -> int:
    res = output(gc(args.uri, args.keep, args.dry_run, args.job, args.leftover_age), args.json, to_json, render)
    if not args.json:
        for e in res.errors:
            print(f"paddle-acp: error: {scrub(e)}", file=sys.stderr)
    return 2 if res.errors else 0
