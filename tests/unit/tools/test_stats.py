"""`paddle-acp stats` on hostile metrics files, and the metrics records it reads.

The metrics file is written by the library but lives on shared storage: anyone can
edit it. Whatever a line holds, stats skips what it cannot use, counts it, and never
fails with a traceback; records the library writes round-trip through the reader.
"""
from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_acp import cli
from paddle_acp.format.checkpoints.metrics_log import MetricsLog
from paddle_acp.format.metrics_record import MetricsRecord
from paddle_acp.storage import open_storage
from paddle_acp.tools import metrics, stats

JOB = "jobS"


def write_lines(root, lines, job=JOB):
    os.makedirs(os.path.join(root, job, "metrics"), exist_ok=True)
    with open(os.path.join(root, job, "job.json"), "w") as f:
        json.dump({"format": "paddle-acp/job", "version": 1, "job_id": job, "created": time.time()}, f)
    with open(os.path.join(root, job, "metrics", "trainer-0.jsonl"), "w", encoding="utf-8", errors="surrogatepass") as f:
        for line in lines:
            f.write(line + "\n")


def good(i, now, **kw):
    rec = {"event": "saved", "time": now - 100 + i, "pid": 7, "range": "_range_0", "number": i, "epoch": i,
           "step": None, "bytes": 4096, "stall_s": 0.001, "waited_s": 0.0, "persist_s": 0.05,
           "throughput_mb_s": 0.08, "ok": True, "policy": "skip"}
    rec.update(kw)
    return json.dumps(rec)


HOSTILE = [
    '{"time": 1e300, "range": "_range_0", "stall_s": 0.1}',  # issue 19 item 7
    '{"time": 1e400}',  # inf
    '{"time": NaN}',
    '{"time": -5}',
    '{"time": ' + "9" * 400 + "}",  # an int too large for a float
    '{"time": 1700000000, "stall_s": 1e300}',
    '{"time": 1700000000, "bytes": -1}',
    '{"time": 1700000000, "number": "7"}',
    '{"time": 1700000000, "event": "exploded"}',
    '{"time": true}',
    "[1, 2, 3]",
    '"just a string"',
    "null",
    "[" * 100000 + "]" * 100000,  # nested deeper than the parser's recursion limit
    "{" * 50000,
    "\udcff\udcfe not utf-8",
    '{"time": 1700000000',  # torn
]


def test_hostile_lines_are_skipped_and_counted(tmp_path, capsys):
    root = str(tmp_path / "m")
    now = time.time()
    write_lines(root, [good(0, now)] + HOSTILE + [good(1, now, event="failed", ok=False, error="x" * 5000),
                                                  json.dumps({"event": "skipped", "time": now - 50, "pid": 7,
                                                              "range": "_range_0", "epoch": 5, "step": None,
                                                              "stall_s": 0.0001})])
    recs, bad = metrics.read_metrics(open_storage(root), JOB)
    assert bad == len(HOSTILE)
    assert [r["event"] for r in recs] == ["saved", "failed", "skipped"] or sorted(r["event"] for r in recs) == [
        "failed", "saved", "skipped"]
    assert cli.main(["stats", root, "--job", JOB]) == 0
    out = capsys.readouterr().out
    assert "2 save(s), 1 FAILED, 1 skipped" in out, out
    assert f"{len(HOSTILE)} unreadable or out-of-range line(s)" in out, out
    assert cli.main(["stats", root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["skipped_lines"] == len(HOSTILE) and doc["skipped"] == 1 and doc["failed"] == 1
    assert len(doc["last_failure"]["error"]) <= 500


def test_only_hostile_lines_is_a_clear_error(tmp_path, capsys):
    root = str(tmp_path / "m")
    write_lines(root, HOSTILE)
    assert cli.main(["stats", root, "--job", JOB]) == 2
    err = capsys.readouterr().err
    assert "has no save metrics" in err and f"{len(HOSTILE)} unusable line(s) skipped" in err
    assert "Traceback" not in err


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
FIELDS = ["event", "time", "pid", "range", "number", "epoch", "step", "bytes", "stall_s", "waited_s", "persist_s",
          "throughput_mb_s", "ok", "error", "policy", "queued", "skipped_before", "restored"]
records = st.dictionaries(st.sampled_from(FIELDS), json_values | st.sampled_from(["saved", "failed", "skipped", "start"])
                          | st.floats(min_value=0, max_value=2e9), max_size=len(FIELDS))
lines = st.one_of(records.map(lambda r: json.dumps(r)), json_values.map(json.dumps), st.text(max_size=60))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines, min_size=1, max_size=12))
def test_any_metrics_file_gives_a_summary_or_a_clear_error(tmp_path_factory, capsys, data):
    """Property: whatever the lines, stats exits 0 (something usable) or 2 (a ToolError),
    and read_metrics accounts for every non-blank line as a record or a skipped one."""
    root = str(tmp_path_factory.mktemp("prop"))
    data = [d.replace("\n", " ").replace("\r", " ") for d in data]
    write_lines(root, data)
    recs, bad = metrics.read_metrics(open_storage(root), JOB)
    assert len(recs) + bad == sum(1 for d in "\n".join(data).splitlines() if d.strip())
    for r in recs:
        assert r["event"] in metrics.EVENTS and metrics.is_num(r["time"]) and 0 <= r["time"] <= metrics.TIME_MAX
    rc = cli.main(["stats", root, "--job", JOB])
    captured = capsys.readouterr()
    assert rc in (0, 2), captured
    assert "Traceback" not in captured.err
    if rc == 0:
        assert cli.main(["stats", root, "--job", JOB, "--json"]) == 0
        json.loads(capsys.readouterr().out)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({
    "event": st.sampled_from(["saved", "failed", "skipped", "start"]),
    "time": st.floats(min_value=1.6e9, max_value=2e9),
    "pid": st.integers(1, 1 << 22),
    "range": st.sampled_from(["_range_0", "_range_1"]),
    "epoch": st.integers(0, 10 ** 6),
    "step": st.none() | st.integers(0, 10 ** 6),
    "stall_s": st.floats(0, 100),
    "waited_s": st.floats(0, 100),
    "persist_s": st.floats(0, 1000),
    "number": st.integers(0, 10 ** 9),
    "bytes": st.integers(0, 1 << 40),
}), min_size=1, max_size=20))
def test_records_written_by_the_library_round_trip(tmp_path_factory, recs):
    """Property: what MetricsLog writes (in batches) the reader returns unchanged, in time order."""
    root = str(tmp_path_factory.mktemp("rt"))
    st_ = open_storage(root)
    log = MetricsLog(st_, JOB, 0, flush_interval=3600)
    for i, r in enumerate(recs):
        log.add(MetricsRecord.from_dict(r))
        if i % 3 == 0:
            log.flush_due()  # the first flushes, the others wait for the interval
    log.flush()
    got, bad = metrics.read_metrics(st_, JOB)
    assert bad == 0
    assert [{k: v for k, v in g.items() if k != "trainer"} for g in got] == sorted(recs, key=lambda r: r["time"])


def test_plot_marks_restarts_failures_and_skips(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    root = str(tmp_path / "m")
    now = time.time()
    lines = []
    for pid, base in ((11, now - 3000), (12, now - 1500)):
        lines.append(json.dumps({"event": "start", "time": base, "pid": pid, "range": "_range_0", "restored": None}))
        for i in range(10):
            lines.append(good(i, base + 100 + 60 * i, pid=pid, time=base + 100 + 60 * i))
            lines.append(json.dumps({"event": "skipped", "time": base + 130 + 60 * i, "pid": pid,
                                     "range": "_range_0", "epoch": i, "step": None, "stall_s": 0.0001}))
    lines.append(good(99, now, pid=12, time=now - 10, event="failed", ok=False, error="disk full"))
    write_lines(root, lines)
    png = str(tmp_path / "p.png")
    assert cli.main(["stats", root, "--job", JOB, "--plot", png]) == 0
    out = capsys.readouterr().out
    assert "1 restart(s)" in out and "20 skipped" in out and "1 FAILED" in out, out
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert stats.time_axis(50) == ("seconds", 1.0) and stats.time_axis(3000)[0] == "minutes"
    assert stats.time_axis(20000)[0] == "hours" and stats.time_axis(10 ** 6)[0] == "days"


def test_plot_legend_names_each_range_as_the_tools_do(tmp_path):
    """The legend says `_range_0` (the name ls, inspect and the metrics use), not `range_0`, for every range."""
    pytest.importorskip("matplotlib")
    from paddle_acp.tools.stats import stats

    root = str(tmp_path / "m")
    now = time.time()
    write_lines(root, [good(i, now, range=f"_range_{i % 2}") for i in range(6)])
    res = stats(root, JOB, str(tmp_path / "p.png"))
    assert "saved, range _range_0" in res.plot_legend and "saved, range _range_1" in res.plot_legend, res.plot_legend
    assert not any(label.endswith(" range_0") for label in res.plot_legend), res.plot_legend
