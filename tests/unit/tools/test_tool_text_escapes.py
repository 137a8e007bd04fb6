"""Texts read from storage (a manifest's Paddle version, IR, program label, variable names, directory names) are
printed by the tools' text output with their control characters escaped: a newline cannot forge a line (``restart
loads it yes``), an ANSI escape cannot colour or move the terminal. ``--json`` is escaped by JSON itself.

Checkpoints are written by the format layer's own writer (no Paddle)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.newest import one_process, save

from paddle_acp import cli
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.storage import open_storage
from paddle_acp.tools.render import clean

JOB, RANGE = "jobT", "_range_0"
FORGED = "3.3.1\nrestart loads it    yes (FORGED LINE)\x1b[31m\r\u202e"
# any control character but the newlines that separate the output's own lines
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _write(root, epochs=2):
    ck = one_process(open_storage(str(root)), JOB, RANGE, keep=0)
    for e in range(epochs):
        ts = [TensorData("w\n\x1b[2Jx", "float32", np.full(4, e, dtype="float32"))]
        save(ck, Snapshot(RangeRecord(RANGE, e, 3, None),
                          [ProgramSnapshot("fp", "pir: t\nrestart loads it yes\x1b[0m", ts, None)],
                          None, FORGED, "pir\n\x1b[1m"))


@pytest.mark.parametrize("args", [["inspect", "{root}", "--job", JOB], ["ls", "{root}"], ["ls", "{root}", "--verify"],
                                  ["verify", "{root}"]])
def test_no_text_from_a_manifest_forges_a_line_or_reaches_the_terminal_raw(tmp_path, capsys, args):
    _write(tmp_path)
    rc = cli.main([a.format(root=tmp_path) for a in args])
    out = capsys.readouterr().out
    assert rc in (0, 1)
    assert not CONTROL.search(out), out
    assert not [ln for ln in out.splitlines() if "FORGED" in ln and not ln.startswith("made with")], out
    if args[0] == "inspect":
        assert [ln for ln in out.splitlines() if ln.startswith("restart loads it")] == ["restart loads it  yes"]
        assert "Paddle 3.3.1\\x0arestart loads it    yes (FORGED LINE)\\x1b[31m\\x0d\\u202e, IR pir\\x0a\\x1b[1m" in out


@given(st.text())
def test_clean_leaves_one_line_without_control_characters(text):
    got = clean(text)
    assert "\n" not in got and not CONTROL.search(got)
    if not CONTROL.search(text) and "\n" not in text:
        assert got == text
