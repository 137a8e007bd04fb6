"""``paddle-acp stats``: a summary of a job's save metrics (blocked time, skipped saves, persist time,
throughput, failures, restarts), overall and per range; ``--plot`` draws them (:mod:`.plot`)."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any, Dict, List, Optional

from paddle_acp.config import AUTO_WAIT_FREE_S, AUTO_WAIT_SHARE
from paddle_acp.format.checkpoints.metrics_log import FLUSH_INTERVAL
from paddle_acp.tools.discovery import ToolError, open_root, single_job, uri_join
from paddle_acp.tools.metrics import METRICS_DIR, Record, is_num, read_metrics, restarts_of, saves_of, unrecorded_of
from paddle_acp.tools.render import (
    fmt_duration,
    fmt_seconds,
    fmt_time,
    human_bytes,
    natural_key,
    output,
    root_command,
    table,
)

THROUGHPUT_MIN_BYTES = 64 << 20  # below this a checkpoint's time is its fixed cost, not bandwidth


def summarize_metrics(records: List[Record], now: Optional[float] = None) -> Dict[str, Any]:
    """Saves, failures, skipped saves, restarts; the time the training thread was blocked per
    save (median/worst, and of it waiting for the previous save), persist time, throughput,
    total bytes, time since the last save."""
    now = time.time() if now is None else now

    def vals(key: str, recs: List[Record]) -> List[float]:
        return [r[key] for r in recs if is_num(r.get(key))]

    def block(all_recs: List[Record]) -> Dict[str, Any]:
        recs = saves_of(all_recs)
        skipped = [r for r in all_recs if r["event"] == "skipped"]
        stall, persist = vals("stall_s", recs), vals("persist_s", recs)
        waited = vals("waited_s", recs)
        # throughput only of checkpoints large enough for it to mean something
        thr = [r["throughput_mb_s"] for r in recs if is_num(r.get("throughput_mb_s")) and is_num(r.get("bytes"))
               and r["bytes"] >= THROUGHPUT_MIN_BYTES]
        ok = [r for r in recs if r["event"] == "saved"]
        failed = [r for r in recs if r["event"] == "failed"]
        worst = max((r for r in recs if is_num(r.get("stall_s"))), key=lambda r: r["stall_s"], default=None)
        last = recs[-1]["time"] if recs else None
        return {
            "count": len(recs),
            "ok": len(ok),
            "failed": len(failed),
            "skipped": len(skipped),
            "restarts": len(restarts_of(all_recs)),
            "unrecorded": unrecorded_of(all_recs),
            "stall_median_s": statistics.median(stall) if stall else None,
            "stall_worst_s": max(stall) if stall else None,
            "stall_worst_at": {"range": worst.get("range"), "number": worst.get("number"), "time": worst["time"]} if worst else None,
            "waited_median_s": statistics.median(waited) if waited else None,
            "waited_worst_s": max(waited) if waited else None,
            "waited_saves": sum(1 for w in waited if w > 0),
            "waited_total_s": sum(waited),
            # the busy policies the skips were made under (auto: waiting would have passed the range's budget)
            "skip_policies": sorted({str(r.get("policy")) for r in skipped}),
            "persist_median_s": statistics.median(persist) if persist else None,
            "persist_worst_s": max(persist) if persist else None,
            "throughput_median_mb_s": statistics.median(thr) if thr else None,
            "throughput_min_mb_s": min(thr) if thr else None,
            "total_bytes": int(sum(vals("bytes", ok))),
            "first_save": recs[0]["time"] if recs else None,
            "last_failure": (
                {"time": failed[-1]["time"], "range": failed[-1].get("range"), "error": failed[-1].get("error")}
                if failed else None
            ),
            "last_save": last,
            "since_last_save_s": (now - last) if last is not None else None,
        }

    out = block(records)
    ranges = sorted({r["range"] for r in records if r["event"] != "start"}, key=natural_key)
    out["ranges"] = {name: block([r for r in records if r["range"] == name]) for name in ranges}
    return out


@dataclasses.dataclass
class StatsResult:
    uri: str
    job: str
    where: str  # the metrics files, as a URI pattern
    records: List[Record]
    skipped_lines: int
    summary: Dict[str, Any]
    plot: Optional[str]  # the image written, if any
    plot_legend: List[str] = dataclasses.field(default_factory=list)  # its legend's labels


def stats(uri: str, job: Optional[str] = None, plot: Optional[str] = None) -> StatsResult:
    storage = open_root(uri)
    name = single_job(storage, job)
    records, bad = read_metrics(storage, name)
    where = uri_join(storage.uri, f"{name}/{METRICS_DIR}/trainer-*.jsonl")
    if not saves_of(records) and not any(r["event"] == "skipped" for r in records):
        extra = f" ({bad} unusable line(s) skipped)" if bad else ""
        raise ToolError(f"job {name!r} under {storage.uri!r} has no save metrics ({where} is missing or empty){extra}")
    res = StatsResult(storage.uri, name, where, records, bad, summarize_metrics(records), plot)
    if plot:
        from paddle_acp.tools.plot import plot_metrics

        res.plot_legend = plot_metrics(records, res.summary, plot, f"paddle-acp saves of job {name}")
    return res


def to_json(res: StatsResult) -> Dict[str, Any]:
    return dict(res.summary, uri=res.uri, job=res.job, skipped_lines=res.skipped_lines, plot=res.plot)


def render(res: StatsResult) -> str:
    s = res.summary
    failed = f", {s['failed']} FAILED" if s["failed"] else ""
    why = "the previous checkpoint was still being written"
    if s["skip_policies"] == ["auto"]:
        why += (f" and waiting for it would have taken the range's waits past {AUTO_WAIT_SHARE:.0%} of its time "
                f"beyond its first {AUTO_WAIT_FREE_S:g} s; PADDLE_ACP_BUSY_POLICY=auto")
    elif s["skip_policies"]:
        why += f"; PADDLE_ACP_BUSY_POLICY={'/'.join(s['skip_policies'])}"
    skipped = f", {s['skipped']} skipped ({why})" if s["skipped"] else ""
    restarts = f", {s['restarts']} restart(s)" if s["restarts"] else ""
    lines = [f"job {res.job} at {res.uri}: {s['count']} save(s){failed}{skipped}{restarts}"]
    w = s["stall_worst_at"]
    if w and w.get("number") is not None:
        worst_where = f" (ckpt-{w['number']} of {w['range']}, {fmt_time(w['time'])})"
    else:
        worst_where = f" ({w['range']}, {fmt_time(w['time'])})" if w else ""
    waited = "-"
    if s["waited_median_s"] is not None:
        waited = (f"{s['waited_saves']} save(s) waited for the previous one, worst {fmt_seconds(s['waited_worst_s'])}, "
                  f"in all {fmt_seconds(s['waited_total_s'])}"
                  if s["waited_saves"] else "no save waited for the previous one")
    thr = "-" if s["throughput_median_mb_s"] is None else (
        f"median {s['throughput_median_mb_s']:.1f} MB/s, slowest {s['throughput_min_mb_s']:.1f} MB/s")
    if s["throughput_median_mb_s"] is None and s["count"]:
        thr = f"- (no checkpoint of {human_bytes(THROUGHPUT_MIN_BYTES)} or more: smaller ones measure fixed cost)"
    rows = [
        ("blocked", f"median {fmt_seconds(s['stall_median_s'])}, worst {fmt_seconds(s['stall_worst_s'])}{worst_where}"
                    "  (training thread, per save)"),
        ("waited", waited),
        ("persist", f"median {fmt_seconds(s['persist_median_s'])}, worst {fmt_seconds(s['persist_worst_s'])}"),
        ("throughput", thr),
        ("total written", human_bytes(s["total_bytes"])),
        ("first save", fmt_time(s["first_save"])),
        ("last save", f"{fmt_time(s['last_save'])} ({fmt_duration(s['since_last_save_s'])} ago)"
                      if s["last_save"] is not None else "-"),
    ]
    if s["last_failure"]:
        f = s["last_failure"]
        rows.append(("last failure", f"{fmt_time(f['time'])} in {f['range']}: {f['error'] or 'no error recorded'}"))
    wk = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(wk)}  {v}" for k, v in rows]
    if s["ranges"]:
        trows = [[name, b["count"], b["failed"], b["skipped"], fmt_seconds(b["stall_median_s"]),
                  fmt_seconds(b["stall_worst_s"]), human_bytes(b["total_bytes"]), fmt_time(b["last_save"])]
                 for name, b in s["ranges"].items()]
        lines += ["", table(["RANGE", "SAVES", "FAILED", "SKIPPED", "MEDIAN BLOCKED", "WORST BLOCKED", "BYTES", "LAST SAVE"],
                            trows, right=(1, 2, 3, 4, 5, 6), indent="  ")]
    if s["unrecorded"]:
        lines.append(
            f"\nnote: a kill may have lost up to {s['unrecorded']} save record(s) (not counted above): checkpoints "
            "a killed process committed before a restart resumed from them, whose metrics lines died with it "
            f"(on storage other than a local disk metrics are written in batches, at most {FLUSH_INTERVAL:g} s apart)"
        )
    if res.skipped_lines:
        lines.append(f"\nnote: {res.skipped_lines} unreadable or out-of-range line(s) in {res.where} were skipped")
    if res.plot:
        lines.append(f"\nplot written to {res.plot}")
    return "\n".join(lines)


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = root_command(
        sub, "stats", "summarize the save metrics of a job (blocked time, skipped saves, persist time)",
        "Summarize the metrics the saves write (JOB/metrics/trainer-*.jsonl).", job_help="job id (optional when there is one job)")
    p.add_argument("--plot", metavar="PNG", help="draw the saves over wall time, with failed and skipped saves "
                   "and restarts marked (needs matplotlib: pip install matplotlib)")
    return p


def main(args: argparse.Namespace) -> int:
    output(stats(args.uri, args.job, args.plot), args.json, to_json, render)
    return 0
