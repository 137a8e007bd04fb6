"""``paddle-acp ls``: jobs, ranges and checkpoints under a storage root, newest first; ``*`` marks the
checkpoint a restart would load, and each range says whether it is finished: whether that checkpoint was
taken at the end of its last epoch (its manifest's range record is what the restart resumes from, so a
rerun with the same ``max_epoch_num`` trains no epoch; a negative one never ends)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, List, Optional

from paddle_acp.format.manifest import Manifest
from paddle_acp.tools.discovery import list_ranges, open_root, read_job_marker, select_jobs
from paddle_acp.tools.render import clean, fmt_time, human_bytes, output, root_command, table
from paddle_acp.tools.scan import CORRUPT, NEWER, CkptInfo, restart_outcome, scan_range


@dataclasses.dataclass
class RangeListing:
    range: str
    checkpoints: List[CkptInfo]  # newest first

    @property
    def restart(self) -> Optional[CkptInfo]:
        return next((i for i in self.checkpoints if i.restart), None)

    @property
    def finished(self) -> Optional[bool]:
        """Whether the range ran all its epochs (in the checkpoint a restart loads); None: it has none."""
        pick = self.restart
        if pick is None or pick.manifest is None:
            return None
        r = pick.manifest.range
        return r.step is None and r.max_epoch_num >= 0 and r.epoch_no >= r.max_epoch_num - 1


def progress_text(r: RangeListing) -> str:
    """Where the range stands, by the checkpoint a restart loads."""
    pick = r.restart
    if pick is None or pick.manifest is None:
        return "no checkpoint yet: a restart starts from epoch 0" if not any(i.committed for i in r.checkpoints) \
            else "unknown (no checkpoint a restart can load)"
    rec = pick.manifest.range
    of = f"max_epoch_num {rec.max_epoch_num}" + (", no last epoch" if rec.max_epoch_num < 0 else "")
    if r.finished:
        return (f"FINISHED: every epoch done (0..{rec.epoch_no}, {of}); a rerun with the same max_epoch_num "
                "trains nothing")
    if rec.step is not None:
        return f"not finished: in epoch {rec.epoch_no} after step {rec.step} ({of}); a restart goes on from there"
    return f"not finished: epochs 0..{rec.epoch_no} done ({of}); a restart trains epoch {rec.epoch_no + 1} next"


@dataclasses.dataclass
class JobListing:
    job: str
    created: Optional[float]
    ranges: List[RangeListing]


@dataclasses.dataclass
class LsResult:
    uri: str
    verified: bool
    jobs: List[JobListing]


def ls(uri: str, job: Optional[str] = None, verify: bool = False) -> LsResult:
    storage = open_root(uri)
    jobs = []
    for name in select_jobs(storage, job):
        marker = read_job_marker(storage, name)
        ranges = [RangeListing(r, scan_range(storage, name, r, verify=verify)) for r in list_ranges(storage, name)]
        jobs.append(JobListing(name, marker.get("created"), ranges))
    return LsResult(storage.uri, verify, jobs)


def _range_json(r: RangeListing, verified: bool) -> Dict[str, Any]:
    pick = r.restart
    m = pick.manifest if pick else None
    return {"range": r.range, "restart": pick.number if pick else None, "finished": r.finished,
            "max_epoch_num": m.range.max_epoch_num if m else None, "restart_name": pick.name if pick else None,
            "restart_outcome": restart_outcome(r.checkpoints, verified), "data_checked": verified,
            "checkpoints": [i.to_json() for i in r.checkpoints]}


def to_json(res: LsResult) -> Dict[str, Any]:
    jobs = [{"job": j.job, "created": j.created, "ranges": [_range_json(r, bool(res.verified)) for r in j.ranges]}
            for j in res.jobs]
    return {"uri": res.uri, "verified": bool(res.verified), "jobs": jobs}


def epoch_cell(m: Optional[Manifest]) -> str:
    return "-" if m is None else str(m.range.epoch_no)


def step_cell(m: Optional[Manifest]) -> str:
    return "-" if m is None or m.range.step is None else str(m.range.step)


def status_cell(i: CkptInfo) -> str:
    if i.valid:
        return i.status + (f" ({i.reason})" if i.multirank and i.reason else "")
    if i.status == CORRUPT:
        return f"CORRUPT: {i.reason}"
    if i.status == NEWER:
        return f"NEWER FORMAT (kept; a newer paddle-acp reads it): {i.reason}"
    return f"uncommitted ({i.reason})"


def render(res: LsResult) -> str:
    lines = [f"storage {res.uri}"]
    for j in res.jobs:
        n_ck = sum(1 for r in j.ranges for i in r.checkpoints if i.committed)
        created = f", created {fmt_time(j.created)}" if j.created else ""
        lines += ["", f"job {j.job}: {len(j.ranges)} range(s), {n_ck} checkpoint(s){created}"]
        if not j.ranges:
            lines.append("  (no checkpoints yet)")
        for r in j.ranges:
            lines.append(f"  range {clean(r.range)}: a restart {clean(restart_outcome(r.checkpoints, res.verified))}")
            lines.append(f"    {clean(progress_text(r))}")
            rows = []
            for i in r.checkpoints:
                m = i.manifest
                rows.append(["*" if i.restart else "", i.name, epoch_cell(m), step_cell(m), human_bytes(i.bytes),
                             fmt_time(m.created if m is not None else i.mtime), status_cell(i)])
            if rows:
                lines.append(table(["", "CHECKPOINT", "EPOCH", "STEP", "SIZE", "CREATED", "STATUS"], rows,
                                   right=(2, 3, 4), indent="    "))
            else:
                lines.append("    (no checkpoints)")
    lines.append("")
    if res.verified:
        lines.append("* = the checkpoint a restart loads (every checksum verified)")
    else:
        lines.append("* = the checkpoint a restart loads if its data verifies: data NOT checked (checksums not read; "
                     "`paddle-acp ls --verify` or `paddle-acp verify` reads them, and a restart skips a corrupt one)")
    return "\n".join(lines)


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = root_command(
        sub, "ls", "list jobs, ranges and checkpoints (newest first) under a storage root",
        "List jobs, ranges and checkpoints under a storage root, newest first, and mark (*) the checkpoint a restart "
        "would load.", uri_help="storage root (the PADDLE_ACP_CHECKPOINT_URI of the job)")
    p.add_argument("--verify", action="store_true", help="also read the data and check every checksum (slower)")
    return p


def main(args: argparse.Namespace) -> int:
    output(ls(args.uri, args.job, verify=args.verify), args.json, to_json, render)
    return 0
