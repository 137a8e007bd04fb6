"""``paddle-acp stats --plot``: the saves over wall time as an image (needs matplotlib, imported only
here): per save the time the training thread was blocked and the time the write took, on log axes;
failed saves, skipped saves and (re)starts of the training process marked."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.tools.discovery import ToolError
from paddle_acp.tools.metrics import Record, is_num, restarts_of
from paddle_acp.tools.render import fmt_seconds, fmt_time, natural_key


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
    """Saves over wall time, as an image (needs matplotlib): per save the time the training
    thread was blocked and the time the write took; failed saves, skipped saves and
    (re)starts of the training process marked. ``summary``: :func:`paddle_acp.tools.stats.summarize_metrics`
    of the same records. Returns the legend's labels, in order."""
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
        # restarts: a dashed line through both panels
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
