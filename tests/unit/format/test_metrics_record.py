"""The metrics record (format/metrics_record.py): one type the writers build, the file stores and the
reader parses.

* The lines the writers build are the lines the library wrote before the record type existed, byte for
  byte (golden lines): files written by earlier versions and read by tools that read the JSON stay valid.
* Property: every record the writers can build, and every valid line, round-trips through its JSON line.
* Property: a line with a field of the wrong type, out of range, an unknown event or no time is rejected
  with a MetricsRecordError naming the field; ``paddle-acp stats`` skips and counts it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.format import metrics_record as mr
from paddle_acp.format.checkpoints.metrics_log import MetricsLog
from paddle_acp.format.metrics_record import EVENTS, MetricsRecord, MetricsRecordError, SaveBegun
from paddle_acp.storage import open_storage
from paddle_acp.tools import metrics as tool_metrics

T, PID = 1764633600.123456, 4242

# The writers' lines as the dict literals of runtime/persist.py and runtime/range.py wrote them
# (json.dumps(..., sort_keys=True)) before the record type, paired with the constructor call that
# builds each now.
BEGUN = SaveBegun(range="_range_0", epoch=2, step=None, stall_s=0.0012345678, waited_s=0.0, policy="skip",
                  time=T, pid=PID)
GOLDEN = [
    ('{"event": "start", "pid": 4242, "policy": "skip", "range": "_range_0", "restore_source": null, '
     '"restored": null, "time": 1764633600.123456}',
     MetricsRecord.start(range="_range_0", restored=None, policy="skip", restore_source=None, time=T, pid=PID)),
    ('{"event": "start", "pid": 4242, "policy": "queue", "range": "_range_0", "restore_source": "cache", '
     '"restored": 7, "time": 1764633600.123456}',
     MetricsRecord.start(range="_range_0", restored=7, policy="queue", restore_source="cache", time=T, pid=PID)),
    ('{"epoch": 3, "event": "skipped", "pid": 4242, "policy": "skip", "range": "_range_0", "stall_s": 0.000123, '
     '"step": null, "time": 1764633600.123456}',
     MetricsRecord.skipped(range="_range_0", epoch=3, step=None, stall_s=0.0001234, policy="skip", time=T, pid=PID)),
    ('{"bytes": 4096000, "epoch": 2, "event": "saved", "number": 5, "ok": true, "persist_s": 0.5, "pid": 4242, '
     '"policy": "skip", "range": "_range_0", "stall_s": 0.001235, "step": null, "throughput_mb_s": 8.192, '
     '"time": 1764633600.123456, "waited_s": 0.0}',
     BEGUN.saved(number=5, nbytes=4096000, persist_s=0.5)),
    ('{"bytes": 10, "epoch": 2, "event": "saved", "number": 6, "ok": true, "persist_s": 0.0, "pid": 4242, '
     '"policy": "queue", "queued": true, "range": "_range_0", "skipped_before": 3, "stall_s": 0.25, "step": 9, '
     '"streamed": {"budget": null, "buffer": 8388608, "chunk": 4194304, "chunks": 3}, '
     '"throughput_mb_s": 0.0, "time": 1764633600.123456, "waited_s": 0.1}',
     dataclasses.replace(BEGUN, step=9, policy="queue", queued=True, skipped_before=3, waited_s=0.1)
     .with_stream(0.25, budget=None, buffer=8388608, chunk=4194304, chunks=3)
     .saved(number=6, nbytes=10, persist_s=0.0)),
    ('{"epoch": 2, "error": "disk full", "event": "failed", "ok": false, "persist_s": 1.5, "pid": 4242, '
     '"policy": "skip", "range": "_range_0", "stall_s": 0.001235, "step": null, "time": 1764633600.123456, '
     '"waited_s": 0.0}',
     BEGUN.failed(error=OSError("disk full"), persist_s=1.5)),
    ('{"bytes": 100, "committed": null, "epoch": 2, "event": "saved", "name": "ckpt-e2", "ok": true, '
     '"parts_wait_s": 0.0, "persist_s": 0.75, "pid": 4242, "policy": "skip", "range": "_range_0", "rank": 1, '
     '"stall_s": 0.001235, "step": null, "time": 1764633600.123456, "waited_s": 0.0}',
     BEGUN.part(name="ckpt-e2", nbytes=100, persist_s=0.75, rank=1, committed=None, parts_wait_s=0.0)),
    ('{"bytes": 100, "committed": true, "epoch": 2, "event": "saved", "name": "ckpt-e2", "ok": true, '
     '"parts_wait_s": 0.4, "persist_s": 0.75, "pid": 4242, "policy": "skip", "range": "_range_0", "rank": 0, '
     '"stall_s": 0.001235, "step": null, "time": 1764633600.123456, "waited_s": 0.0}',
     BEGUN.part(name="ckpt-e2", nbytes=100, persist_s=0.75, rank=0, committed=True, parts_wait_s=0.4)),
    ('{"bytes": 100, "committed": false, "epoch": 2, "error": "fenced", "event": "failed", "name": "ckpt-e2", '
     '"ok": false, "parts_wait_s": 0.4, "persist_s": 0.75, "pid": 4242, "policy": "skip", "range": "_range_0", '
     '"rank": 0, "stall_s": 0.001235, "step": null, "time": 1764633600.123456, "waited_s": 0.0}',
     BEGUN.part(name="ckpt-e2", nbytes=100, persist_s=0.75, rank=0, committed=True, parts_wait_s=0.4,
                error=RuntimeError("fenced"))),
]


@pytest.mark.parametrize("line,built", GOLDEN, ids=[f"{i}-{json.loads(g)['event']}" for i, (g, _) in enumerate(GOLDEN)])
def test_writers_build_the_lines_of_before_and_read_them_back(line, built):
    assert built.to_line() == line
    parsed = MetricsRecord.from_line(line)
    assert parsed == built and parsed.to_line() == line


def test_every_field_is_documented_once():
    """The field table, the dataclass and the module docstring agree: every field has a type and a meaning,
    the module docstring names every field and every event, and the parser knows the type of each."""
    docs = {f.name: f.metadata["doc"] for f in dataclasses.fields(MetricsRecord) if not f.metadata.get("internal")}
    names = list(docs)
    assert set(mr._TYPES) == set(names)
    for name, doc in docs.items():
        assert doc.split(":", 1)[0].split(" (")[0] in ("str", "int", "float", "bool", "object", "str or null",
                                                       "int or null", "bool or null"), (name, doc)
        assert len(doc.split(":", 1)[1].strip()) > 10, (name, doc)
        assert f"``{name}``" in mr.__doc__, name
    for event in EVENTS:
        assert f"``{event}``" in mr.__doc__, event
    assert set(mr.BOUNDS) <= set(names)


# -- property: round trips -----------------------------------------------------------------------
texts = st.text(max_size=30)
times = st.floats(min_value=0, max_value=mr.TIME_MAX)
secs = st.floats(min_value=0, max_value=1e6)
counts = st.integers(0, 1 << 40)
begun = st.builds(SaveBegun, range=texts, epoch=st.integers(-1, 1 << 40), step=st.none() | counts, stall_s=secs,
                  waited_s=secs, policy=st.sampled_from(["skip", "queue", "wait"]), queued=st.booleans(),
                  skipped_before=st.integers(0, 1000), time=times, pid=st.integers(0, 1 << 31))
streamed = st.tuples(secs, st.none() | counts, counts, counts, counts)
errors = texts.map(RuntimeError)
written = st.one_of(
    st.builds(MetricsRecord.start, range=texts, restored=st.none() | counts, policy=texts,
              restore_source=st.none() | st.sampled_from(["local", "remote", "cache"]), time=times,
              pid=st.integers(0, 1 << 31)),
    st.builds(MetricsRecord.skipped, range=texts, epoch=counts, step=st.none() | counts, stall_s=secs, policy=texts,
              time=times, pid=st.integers(0, 1 << 31)),
    # a save no faster than 1 PB/s (throughput_mb_s <= 1e9: the reader's bound): 512 MiB in 1 us at most
    st.builds(lambda b, s, n, nb, p: (b.with_stream(*s) if s else b).saved(number=n, nbytes=nb, persist_s=p),
              begun, st.none() | streamed, counts, st.integers(0, 1 << 29),
              st.just(0.0) | st.floats(min_value=1e-6, max_value=1e6)),
    st.builds(lambda b, e, p: b.failed(error=e, persist_s=p), begun, errors, secs),
    st.builds(lambda b, s, nb, p, r, c, w, e: (b.with_stream(*s) if s else b).part(
        name="ckpt-e1", nbytes=nb, persist_s=p, rank=r, committed=c, parts_wait_s=w, error=e),
        begun, st.none() | streamed, counts, secs, st.integers(0, 1024), st.none() | st.booleans(), secs,
        st.none() | errors),
)


@settings(max_examples=300, deadline=None)
@given(written)
def test_any_written_record_round_trips_through_its_line(rec):
    line = rec.to_line()
    assert "\n" not in line
    back = MetricsRecord.from_line(line)
    assert back == rec and back.to_line() == line
    keys = set(json.loads(line))
    assert {"event", "time", "pid", "range"} <= keys and rec.event in EVENTS
    if rec.event in ("saved", "failed", "skipped"):
        assert "step" in keys  # null or not, as before


# valid lines as anyone may write them: any subset of fields, nulls, keys this version does not know
json_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | texts
VALUES = {
    "event": st.sampled_from(EVENTS), "range": texts, "restore_source": texts, "policy": texts, "name": texts,
    "error": st.text(max_size=80), "queued": st.booleans(), "ok": st.booleans(), "committed": st.booleans(),
    "streamed": st.fixed_dictionaries({"budget": st.none() | counts, "buffer": counts, "chunk": counts,
                                       "chunks": counts}),
}
for _name, (_lo, _hi) in mr.BOUNDS.items():
    VALUES[_name] = (st.integers(int(_lo), int(_hi)) if mr._TYPES[_name] is int
                     else st.floats(min_value=_lo, max_value=_hi) | st.integers(int(_lo), int(min(_hi, 1e6))))
valid_objects = st.fixed_dictionaries(
    {"time": VALUES["time"]},
    optional={**{k: v | st.none() for k, v in VALUES.items() if k != "time"},
              "x_future_field": json_scalars, "trainer_note": st.lists(json_scalars, max_size=3)},
)


@settings(max_examples=300, deadline=None)
@given(valid_objects)
def test_any_valid_line_round_trips(obj):
    line = json.dumps(obj, sort_keys=True)
    rec = MetricsRecord.from_line(line)
    back = rec.to_dict()
    # what the reader fills in: the event of a line from before events, a range, text cut to length
    want = dict(obj)
    if want.get("event") is None:
        want["event"] = "failed" if obj.get("ok") is False else "saved"
    if want.get("range") is None:
        want["range"] = "-"
    want["range"] = want["range"][:mr.RANGE_MAX_CHARS]
    if want.get("error") is not None:
        want["error"] = want["error"][:mr.ERROR_MAX_CHARS]
    assert back == want
    assert MetricsRecord.from_line(rec.to_line()) == rec


# -- property: malformed lines --------------------------------------------------------------------
WRONG = {  # per declared type: values of another type
    int: st.sampled_from([1.5, "7", True, [1], {"a": 1}]),
    float: st.sampled_from(["0.1", True, False, [0.1], {}]),
    str: st.sampled_from([7, 1.5, True, [], {"x": "y"}]),
    bool: st.sampled_from([0, 1, "true", "false", [], 1.0]),
    dict: st.sampled_from([[], 5, "x", {"budget": None}, {"budget": 1, "buffer": -1, "chunk": 1, "chunks": 1},
                           {"budget": 1, "buffer": 1, "chunk": 1, "chunks": 1, "more": 1}]),
}
checked = sorted(k for k in mr._TYPES if k not in ("range", "error"))  # free text is kept, as text


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(checked), st.data())
def test_a_field_of_the_wrong_type_is_rejected_naming_it(field, data):
    obj = dict(json.loads(GOLDEN[3][0]))
    kind = mr._TYPES[field]
    if field == "event":
        bad = data.draw(st.sampled_from([5, True, "exploded", "SAVED", ""]))
    elif field in mr.BOUNDS:
        lo, hi = mr.BOUNDS[field]
        bad = data.draw(WRONG[kind] | st.sampled_from([lo - 1, hi * 2, float("inf"), float("nan"), 10 ** 400]))
    else:
        bad = data.draw(WRONG[kind])
    obj[field] = bad
    line = json.dumps(obj)
    with pytest.raises(MetricsRecordError, match=f"field '{field}[.']"):
        MetricsRecord.from_line(line)


@pytest.mark.parametrize("line,message", [
    ('{"event": "saved"}', "field 'time' is missing"),
    ('{"time": null}', "field 'time' is null"),
    ('{"time": 1, "event": "exploded"}', 'field \'event\' is "exploded": not one of saved, failed, skipped, start'),
    ("[1, 2]", "a JSON array, not an object"),
    ("null", "a JSON null, not an object"),
    ('{"time": 1', "not JSON"),
    ("[" * 100000 + "]" * 100000, "not a metrics record"),
    ('{"time": 1, "step": 1e400}', "field 'step' is"),
    ('{"time": 1, "streamed": {"budget": 1, "buffer": "x", "chunk": 1, "chunks": 1}}', "field 'streamed.buffer'"),
])
def test_malformed_lines_get_a_clear_error(line, message):
    with pytest.raises(MetricsRecordError) as e:
        MetricsRecord.from_line(line)
    assert message in str(e.value)


def test_the_reader_skips_and_counts_invalid_lines_with_their_reason(tmp_path, caplog):
    """Through the file: MetricsLog writes records, a hand edit adds lines of wrong types; stats' reader
    returns the records, counts the others and logs (at debug level) why each was skipped."""
    storage = open_storage(str(tmp_path))
    log = MetricsLog(storage, "job", 3)
    for _line, rec in GOLDEN:
        log.add(rec)
    log.flush()
    path = os.path.join(str(tmp_path), "job", "metrics", "trainer-3.jsonl")
    with open(path) as f:
        assert f.read().splitlines() == [g for g, _ in GOLDEN]
    with open(path, "a") as f:
        f.write('{"time": 1, "ok": "yes"}\n{"time": 2, "event": "boom"}\n\n{"time": 3, "policy": 7}\n')
    with caplog.at_level(logging.DEBUG, logger="paddle_acp"):
        recs, bad = tool_metrics.read_metrics(storage, "job")
    assert bad == 3 and len(recs) == len(GOLDEN) and all(r["trainer"] == 3 for r in recs)
    assert [{k: v for k, v in r.items() if k != "trainer"} for r in recs] == [json.loads(g) for g, _ in GOLDEN]
    reasons = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert any("line 10 skipped: field 'ok'" in m for m in reasons), reasons
    assert any("line 11 skipped: field 'event'" in m for m in reasons), reasons
    assert any("line 13 skipped: field 'policy'" in m for m in reasons), reasons
