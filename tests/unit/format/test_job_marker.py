"""The job marker ``{job}/job.json`` read as untrusted input everywhere (fencing.read_job_marker): size and nesting
capped, field types checked. A bad one is a clear error naming it: the writer's retention deletes nothing (one log
line says why), the tools warn and go on; never a RecursionError, a TypeError or gigabytes read.

Checkpoints are written by the format layer's own writer (no Paddle)."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.newest import committed, one_process, save

from paddle_acp import cli
from paddle_acp.errors import CheckpointError, CorruptCheckpointError
from paddle_acp.format.commit.fencing import MAX_JOB_MARKER_SIZE, check_deletable, read_job_marker
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.storage import open_storage

JOB, RANGE = "jobM", "_range_0"
BAD = {
    "deep": b'{"job_id":"jobM","x":' + b"[" * 100000 + b"]" * 100000 + b"}",
    "created-str": json.dumps({"format": "paddle-acp/job", "version": 1, "job_id": JOB, "created": "yesterday"}).encode(),
    "created-list": json.dumps({"format": "paddle-acp/job", "version": 1, "job_id": JOB, "created": [1]}).encode(),
    "created-huge": b'{"job_id":"jobM","created":' + b"9" * 400 + b"}",
    "no-job-id": b'{"created":1.0}',
    "array": b"[1]",
    "bom": b"\xef\xbb\xbf" + json.dumps({"job_id": JOB, "created": 1.0}).encode(),
    "nonutf8": b'{"job_id":"jobM","created":1.0,"x":"\xff\xfe"}',
    "nan": b'{"job_id":"jobM","created":NaN}',
}


def _marker(root, data):
    os.makedirs(os.path.join(root, JOB), exist_ok=True)
    with open(os.path.join(root, JOB, "job.json"), "wb") as f:
        f.write(data)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_marker_is_an_error_naming_it(tmp_path, case):
    _marker(tmp_path, BAD[case])
    st_ = open_storage(str(tmp_path))
    with pytest.raises(CorruptCheckpointError, match=r"jobM/job\.json: invalid job marker"):
        read_job_marker(st_, JOB)
    with pytest.raises(CheckpointError, match=r"job\.json.*retention skipped"):
        check_deletable(st_, JOB, f"{JOB}/range/{RANGE}")


def test_a_huge_sparse_marker_is_refused_unread(tmp_path):
    _marker(tmp_path, b"")
    os.truncate(os.path.join(tmp_path, JOB, "job.json"), 1500 << 20)  # no disk space: a hole
    with pytest.raises(CorruptCheckpointError, match="more than the 65536 allowed"):
        read_job_marker(open_storage(str(tmp_path)), JOB)


def test_the_marker_paddle_acp_writes_reads_back(tmp_path):
    from paddle_acp.format.commit.fencing import write_job_marker
    st_ = open_storage(str(tmp_path))
    assert read_job_marker(st_, JOB) is None
    write_job_marker(st_, JOB)
    doc = read_job_marker(st_, JOB)
    assert doc is not None and doc["job_id"] == JOB and isinstance(doc["created"], float)
    check_deletable(st_, JOB, f"{JOB}/range/{RANGE}")


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                     max_leaves=12)
_DOCS = st.one_of(
    st.binary(max_size=200),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"job_id": _JSON | st.just(JOB)}, optional={"created": _JSON, "format": _JSON})
    .map(lambda v: json.dumps(v).encode()),
    st.integers(1, 5000).map(lambda n: b'{"job_id":"jobM","x":' + b"[" * n + b"]" * n + b"}"),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_DOCS)
def test_any_marker_reads_as_a_checked_document_or_an_error_naming_it(tmp_path, data):
    _marker(tmp_path, data)
    try:
        doc = read_job_marker(open_storage(str(tmp_path)), JOB)
    except CorruptCheckpointError as exc:
        assert "job.json" in str(exc)
        return
    assert isinstance(doc, dict) and isinstance(doc["job_id"], str) and doc["job_id"]
    created = doc.get("created")
    assert created is None or (type(created) in (int, float) and 0 <= created < 1e11)


def _snapshot(epoch):
    ts = [TensorData("w", "float32", np.full(4, epoch, dtype="float32"))]
    return Snapshot(RangeRecord(RANGE, epoch, 5, None), [ProgramSnapshot("fp", "pir: t", ts, None)], None, "3.3.1",
                    "pir")


@pytest.mark.parametrize("case", ["deep", "created-list", "array"])
def test_retention_is_skipped_with_a_log_line_naming_the_marker(tmp_path, case, caplog):
    st_ = open_storage(str(tmp_path))
    ck = one_process(st_, JOB, RANGE, keep=1)
    save(ck, _snapshot(0))
    _marker(tmp_path, BAD[case])
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        save(ck, _snapshot(1))
    assert committed(st_, JOB, RANGE) == ["ckpt-e0", "ckpt-e1"]  # nothing deleted
    assert any("job.json" in r.getMessage() and "retention skipped" in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("case", ["deep", "created-str", "created-list", "created-huge"])
def test_ls_warns_about_a_bad_marker_and_lists_the_job(tmp_path, case, capsys, caplog):
    save(one_process(open_storage(str(tmp_path)), JOB, RANGE, keep=0), _snapshot(0))
    _marker(tmp_path, BAD[case])
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        assert cli.main(["ls", str(tmp_path)]) == 0
        assert f"job {JOB}: 1 range(s), 1 checkpoint(s)" in capsys.readouterr().out
        assert cli.main(["ls", str(tmp_path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["jobs"][0]["created"] is None
    assert any("job.json: invalid job marker" in r.getMessage() for r in caplog.records)


def test_the_size_cap_holds_what_paddle_acp_writes():
    assert MAX_JOB_MARKER_SIZE >= 4096
