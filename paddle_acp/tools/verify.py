"""``paddle-acp verify``: read every committed checkpoint and check its manifest and every checksum.

Fails (exit status 1) when the checkpoint a restart would try first is bad, when a range has checkpoint directories but
none valid, or when nothing is valid at all."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Dict, List, Optional

from paddle_acp.errors import StorageError
from paddle_acp.tools.discovery import ToolError, list_ranges, open_root, select_jobs, uri_join
from paddle_acp.tools.ls import epoch_cell
from paddle_acp.tools.render import clean, output, root_command, table
from paddle_acp.tools.scan import NEWER, CkptInfo, restart_outcome, scan_range


@dataclasses.dataclass
class VerifyResult:
    uri: str
    checked: int  # committed checkpoints read
    valid: int
    ranges: Dict[str, Dict[str, List[CkptInfo]]]  # job -> range -> checkpoints, newest first
    failures: List[str]  # each a reason the exit status is 1
    bad_older: List[str]  # bad checkpoints a restart would not try first

    @property
    def ok(self) -> bool:
        return not self.failures


def verify(uri: str, job: Optional[str] = None) -> VerifyResult:
    storage = open_root(uri)
    jobs = select_jobs(storage, job)
    res = VerifyResult(storage.uri, 0, 0, {}, [], [])
    for j in jobs:
        res.ranges[j] = {}
        for r in list_ranges(storage, j):
            try:
                infos = scan_range(storage, j, r, verify=True)
            except StorageError as exc:
                raise ToolError(f"cannot read job {j!r} range {r!r} under {storage.uri!r}: {exc}") from exc
            res.ranges[j][r] = infos
            committed = [i for i in infos if i.committed]
            res.checked += len(committed)
            res.valid += sum(1 for i in committed if i.valid)
            if committed and not committed[0].valid:
                newest = committed[0]
                fallback = None if any(i.stops for i in infos) else next((i for i in committed if i.valid), None)
                then = f"fall back to {fallback.name}" if fallback else restart_outcome(infos, True)
                res.failures.append(f"{uri_join(storage.uri, newest.path)} is bad ({newest.reason}): "
                                    f"a restart of job {j!r} range {r!r} {'would ' if fallback else ''}{then}")
            elif infos and not any(i.valid for i in committed):
                res.failures.append(
                    f"job {j!r} range {r!r} has {len(infos)} checkpoint director{'y' if len(infos) == 1 else 'ies'} "
                    "but no committed checkpoint: a restart would START FROM SCRATCH"
                )
            for i in committed[1:]:
                if not i.valid:
                    res.bad_older.append(f"{uri_join(storage.uri, i.path)} is bad ({i.reason})")
    if res.valid == 0 and not res.failures:
        which = f"job {job!r}" if job else f"{len(jobs)} job(s)"
        res.failures.append(f"no valid checkpoint in {which} under {storage.uri}: a restart would START FROM SCRATCH")
    return res


def _rows(res: VerifyResult) -> List[List[str]]:
    rows = []
    for j, ranges in res.ranges.items():
        for r, infos in ranges.items():
            for i in infos:
                bad = "NEWER FORMAT (kept)" if i.status == NEWER else "BAD"
                status = ("ok" if i.valid else f"{bad}: {i.reason}") if i.committed else f"ignored: {i.reason}"
                rows.append([j, r, i.name, epoch_cell(i.manifest), "*" if i.restart else "", status])
    return rows


def to_json(res: VerifyResult) -> Dict[str, Any]:
    keys = ["job", "range", "checkpoint", "epoch", "restart", "status"]
    return {"uri": res.uri, "ok": res.ok, "failures": res.failures, "bad_older": res.bad_older,
            "checked": res.checked, "rows": [dict(zip(keys, r)) for r in _rows(res)]}


def render(res: VerifyResult) -> str:
    lines = [f"verifying {res.uri}"]
    rows = _rows(res)
    if rows:
        lines.append(table(["JOB", "RANGE", "CHECKPOINT", "EPOCH", "", "STATUS"], rows, right=(3,)))
    lines += [f"warning: older checkpoint {clean(w)}" for w in res.bad_older]
    if res.failures:
        lines += [f"FAILED: {clean(f)}" for f in res.failures]
    else:
        lines.append(f"OK: {res.checked} checkpoint(s) verified; every checkpoint a restart loads (*) is intact")
    return "\n".join(lines)


def register(sub: Any) -> argparse.ArgumentParser:
    return root_command(
        sub, "verify", "check every checkpoint's checksums (exit 1 if a restart would not load a range's newest)",
        "Read every committed checkpoint and check its manifest and checksums. Exit status 1 when the newest committed "
        "checkpoint of a range (the one a restart tries first) is bad, when a range has checkpoint directories but no "
        "committed one, or when no checkpoint is valid at all.")


def main(args: argparse.Namespace) -> int:
    res = output(verify(args.uri, args.job), args.json, to_json, render)
    return 0 if res.ok else 1
