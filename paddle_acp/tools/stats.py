"""``paddle-acp stats``: a summary of a job's save metrics (blocked time, skipped saves, persist time, throughput,
failures, restarts), overall and per range. ``--plot`` draws them over wall time (needs matplotlib, imported only
then): per save the training thread's blocked time and the write's time, log axes; failures, skips, restarts marked."""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

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


def _median_and(xs: List[float], median_key: str, key: str,
                 extreme: Callable[[List[float]], float]) -> Dict[str, Optional[float]]:
    """``xs``'s median and ``extreme`` (max or min) under those keys; None of both without values."""
    return {median_key: statistics.median(xs) if xs else None, key: extreme(xs) if xs else None}


def summarize_metrics(records: List[Record], now: Optional[float] = None) -> Dict[str, Any]:
    """Overall and per range: saves, failures, skips, restarts, the training thread's blocked time per save
    (and of it the wait for the previous save), persist time, throughput, bytes, time since the last save."""
    now = time.time() if now is None else now

    def vals(key: str, recs: List[Record]) -> List[float]:
        return [r[key] for r in recs if is_num(r.get(key))]

    def block(all_recs: List[Record]) -> Dict[str, Any]:
        recs = saves_of(all_recs)
        skipped = [r for r in all_recs if r["event"] == "skipped"]
        stall, persist = vals("stall_s", recs), vals("persist_s", recs)
        waited = vals("waited_s", recs)
        thr = [r["throughput_mb_s"] for r in recs if is_num(r.get("throughput_mb_s")) and is_num(r.get("bytes"))
               and r["bytes"] >= THROUGHPUT_MIN_BYTES]
        ok = [r for r in recs if r["event"] == "saved"]
        failed = [r for r in recs if r["event"] == "failed"]
        worst = max((r for r in recs if is_num(r.get("stall_s"))), key=lambda r: r["stall_s"], default=None)
        last = recs[-1]["time"] if recs else None
        return {
            "count": len(recs), "ok": len(ok), "failed": len(failed), "skipped": len(skipped),
            "restarts": len(restarts_of(all_recs)), "unrecorded": unrecorded_of(all_recs),
            **_median_and(stall, "stall_median_s", "stall_worst_s", max),
            "stall_worst_at": ({"range": worst.get("range"), "number": worst.get("number"), "time": worst["time"]}
                               if worst else None),
            **_median_and(waited, "waited_median_s", "waited_worst_s", max),
            "waited_saves": sum(1 for w in waited if w > 0), "waited_total_s": sum(waited),
            # the busy policies the skips were made under (auto: waiting would have passed the range's budget)
            "skip_policies": sorted({str(r.get("policy")) for r in skipped}),
            **_median_and(persist, "persist_median_s", "persist_worst_s", max),
            **_median_and(thr, "throughput_median_mb_s", "throughput_min_mb_s", min),
            "total_bytes": int(sum(vals("bytes", ok))), "first_save": recs[0]["time"] if recs else None,
            "last_failure": ({"time": failed[-1]["time"], "range": failed[-1].get("range"),
                              "error": failed[-1].get("error")} if failed else None),
            "last_save": last, "since_last_save_s": (now - last) if last is not None else None,
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
    res = StatsResult(storage.uri, name, where, bad, summarize_metrics(records), plot)
    if plot:
        res.plot_legend = plot_metrics(records, res.summary, plot, f"paddle-acp saves of job {name}")
    return res


def time_axis(span: float) -> Tuple[str, float]:
    """(unit name, seconds per unit) for an elapsed-time axis of ``span`` seconds."""
    if span < 180:
        return "seconds", 1.0
    if span < 3 * 3600:
        return "minutes", 60.0
    if span < 3 * 86400:
        return "hours", 3600.0
    return "days", 86400.0


def plot_metrics(records: List[Dict[str, Any]], summary: Dict[str, Any], path: str, title: str) -> List[str]:
    """Draw the saves to ``path`` (``summary``: :func:`summarize_metrics` of the same records); returns the
    legend's labels, in order."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker as mticker
        import matplotlib.transforms as mtransforms
    except ImportError:
        raise ToolError(
            "--plot needs matplotlib, which is not installed here: `pip install matplotlib` "
            "(or `pip install '.[plot]'` in a paddle-acp checkout), or leave out --plot for the text summary"
        ) from None
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise ToolError(f"cannot write the plot to {path!r}: directory {d!r} does not exist")
    t0: float = records[0]["time"]
    span = max(records[-1]["time"] - t0, 1.0)
    unit, per = time_axis(span)

    def x(r: Record) -> float:
        t: float = r["time"]
        return (t - t0) / per

    floor = 1e-4  # log axes: 0.1 ms stands for "no time at all"

    def y(r: Record, key: str) -> Optional[float]:
        v = r.get(key)
        return max(float(v), floor) if v is not None and is_num(v) else None

    s = summary
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5))
    saved = [r for r in records if r["event"] == "saved"]
    failed = [r for r in records if r["event"] == "failed"]
    skipped = [r for r in records if r["event"] == "skipped"]
    restarts = restarts_of(records)
    # one line per process and range: lines never join across a restart
    segments: Dict[Tuple[Any, Any, str], List[Dict[str, Any]]] = {}
    for r in saved:
        segments.setdefault((r.get("trainer"), r.get("pid"), r["range"]), []).append(r)
    ranges = sorted({r["range"] for r in saved}, key=natural_key)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {name: colors[i % len(colors)] for i, name in enumerate(ranges)}
    labelled = set()
    for (_tr, _pid, name), recs in segments.items():
        # the range's own name (`_range_0`); a label starting with '_' would hide it, this one does not
        label = None if name in labelled else f"saved, range {name}"
        labelled.add(name)
        for ax, key in ((ax1, "stall_s"), (ax2, "persist_s")):
            pts = [(x(r), y(r, key)) for r in recs if y(r, key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, lw=0.8,
                        color=color[name], label=label if ax is ax1 else None)
    for ax, key in ((ax1, "stall_s"), (ax2, "persist_s")):
        pts = [(x(r), y(r, key) or floor) for r in failed]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "x", color="red", ms=9, mew=2,
                    label=f"failed save ({len(failed)})" if ax is ax1 else None)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(mticker.NullLocator())
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _pos: fmt_seconds(v)))
        ax.grid(True, which="major", alpha=0.3)
        for i, r in enumerate(restarts):
            ax.axvline(x(r), color="0.3", ls="--", lw=1,
                       label=(f"restart ({len(restarts)})" if i == 0 and ax is ax1 else None))
    if skipped:
        trans = mtransforms.blended_transform_factory(ax1.transData, ax1.transAxes)
        ax1.plot([x(r) for r in skipped], [0.03] * len(skipped), "|", color="darkorange", ms=12, mew=1.5,
                 transform=trans, label=f"skipped save ({len(skipped)}): previous one still being written")
    ax1.set_ylabel("training thread blocked per save")
    ax2.set_ylabel("write + commit time per save")
    ax2.set_xlabel(f"{unit} since {fmt_time(t0)}")
    ax2.set_xlim(left=min(0.0, ax2.get_xlim()[0]))
    parts = [f"{s['count']} saves"]
    if s["failed"]:
        parts.append(f"{s['failed']} failed")
    if s["skipped"]:
        parts.append(f"{s['skipped']} skipped")
    if restarts:
        parts.append(f"{len(restarts)} restart(s)")
    ax1.set_title(title + "\n" + ", ".join(p for p in parts if p), fontsize=11)
    legend = ax1.legend(loc="upper left", fontsize="small", framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [t.get_text() for t in legend.get_texts()]


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
        heads = ["RANGE", "SAVES", "FAILED", "SKIPPED", "MEDIAN BLOCKED", "WORST BLOCKED", "BYTES", "LAST SAVE"]
        lines += ["", table(heads, trows, right=(1, 2, 3, 4, 5, 6), indent="  ")]
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
        "Summarize the metrics the saves write (JOB/metrics/trainer-*.jsonl).",
        job_help="job id (optional when there is one job)")
    p.add_argument("--plot", metavar="PNG", help="draw the saves over wall time, with failed and skipped saves "
                   "and restarts marked (needs matplotlib: pip install matplotlib)")
    return p


def main(args: argparse.Namespace) -> int:
    output(stats(args.uri, args.job, args.plot), args.json, to_json, render)
    return 0
