"""Ranks that decide their saves together (issue 28 item 1), with real processes.

Two data-parallel ranks (tests/scripts/rank_train.py: a file barrier at every epoch keeps them in
lockstep, as gradient collectives would). Rank 1's wall clock is skewed (its ``time.time`` shifted
before anything imports it): interval checkpoints are still committed, on rank 0's clock alone,
and no orphan part is left. On the real HDFS with epochs far shorter than a persist, the default
policy (``auto``; with several ranks rank 0's save plan, as under ``skip``) skips the same positions on both ranks, commits at least every K due points, and
a kill of both ranks resumes bit-identically.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import pytest
from support.e2e import JOB_ID, compare_results, is_done, load_result, read_log
from support.launch import popen_ranks
from support.server_fixtures import hdfs_server  # noqa: F401  (fixture)

from paddle_acp import tools
from paddle_acp.format.layout import GLOBAL_NAME, parse_name, range_dir
from paddle_acp.runtime.agree import MAX_STRIDE
from paddle_acp.storage import open_storage


def popen_job(tmp, world, args, ckpt, gen, outs="out", env=None, skews=None, no_acp=False, barrier=True,
              only=None, **popen):
    """The ranks of a job (``only``: that rank alone)."""
    return popen_ranks(tmp / outs, world, args, ckpt, gen, env={"PADDLE_ACP_PART_TIMEOUT": 60, **(env or {})},
                       barrier=tmp / "barrier" if barrier else None,
                       rank_args={r: ["--clock-skew", s] for r, s in (skews or {}).items() if s}, no_acp=no_acp,
                       ranks=None if only is None else [only], **popen)


def run_job(*a, **kw):
    procs = popen_job(*a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    return [(p.returncode, out) for p in procs for out in [p.communicate(timeout=600)[0]]]


def reference(tmp, args):
    """The uninterrupted run without paddle-acp; its ``--sleep`` (which paces the epochs for the saves'
    timing, and changes no number) is left out."""
    args = list(args)
    if "--sleep" in args:
        del args[args.index("--sleep"):args.index("--sleep") + 2]
    res = run_job(tmp, 1, args, None, "ref", outs="ref", no_acp=True, barrier=False)
    assert res[0][0] == 0, res
    return load_result(tmp / "ref" / "r0")


def metrics(uri):
    recs, bad = tools.read_metrics(open_storage(uri), JOB_ID)
    assert bad == 0
    return recs


def check_no_orphans(uri):
    """Every position left in the range is a committed global checkpoint: no abandoned parts."""
    st = open_storage(uri)
    d = range_dir(JOB_ID, "_range_0")
    left = [e.name for e in st.listdir(d) if e.is_dir and parse_name(e.name) is not None]
    assert left, "no checkpoint at all"
    orphans = [n for n in left if not st.exists(f"{d}/{n}/{GLOBAL_NAME}")]
    assert not orphans, f"abandoned positions left behind: {orphans} (of {left})"


def test_interval_saves_agree_under_clock_skew(tmp_path):
    """save_checkpoint_inter=2 s, rank 1's clock 1 s ahead, epochs of ~0.25 s: before, the ranks
    each picked the first epoch of their own wall-clock bucket, 4 epochs apart, and every interval
    checkpoint was abandoned. Now rank 0's clock alone decides: both ranks save the same epochs,
    several interval checkpoints are committed, none is abandoned, the result is bit-identical."""
    args = ["--kind", "dp", "--epochs", 36, "--steps-per-epoch", 1, "--sleep", 0.25, "--inter", 2]
    ref = reference(tmp_path, args)
    ckpt = tmp_path / "ckpt"
    res = run_job(tmp_path, 2, args, ckpt, "s0", skews={1: 1.0})
    assert all(rc == 0 for rc, _ in res), [o[-3000:] for _, o in res]
    recs = metrics(str(ckpt))
    saved = {r: sorted(x["epoch"] for x in recs if x["event"] == "saved" and x["trainer"] == r) for r in (0, 1)}
    assert saved[0] == saved[1], saved
    committed = [x["epoch"] for x in recs if x["trainer"] == 0 and x.get("committed") is True and x["epoch"] != 35]
    assert len(committed) >= 2, (committed, saved)
    assert not [x for x in recs if x["event"] == "failed" or x.get("committed") is False], recs
    assert "abandoned" not in res[0][1], res[0][1][-3000:]
    check_no_orphans(str(ckpt))
    for r in (0, 1):
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r


@pytest.fixture
def hdfs(hdfs_server):
    return f"{hdfs_server.uri}/agree/{uuid.uuid4().hex[:8]}", hdfs_server.client_env()


# one step per epoch, ~4 MB of replicated state: an epoch takes milliseconds, a persist to HDFS far longer
BUSY_ARGS = ["--kind", "dp", "--epochs", 40, "--steps-per-epoch", 1, "--hidden", 20000]


@pytest.mark.long  # on demand: bash ci/test.sh --long
def test_busy_skip_on_hdfs_the_ranks_skip_the_same_positions(hdfs, tmp_path):
    uri, env = hdfs
    ref = reference(tmp_path, BUSY_ARGS)
    res = run_job(tmp_path, 2, BUSY_ARGS, uri, "b0", env=env)
    assert all(rc == 0 for rc, _ in res), [o[-3000:] for _, o in res]
    recs = metrics(uri)
    per = {}
    for r in (0, 1):
        mine = [x for x in recs if x["trainer"] == r and x["event"] in ("saved", "skipped")]
        per[r] = {x["epoch"]: x["event"] for x in mine}
        assert sorted(per[r]) == list(range(40)), mine  # every epoch end saved or skipped, once
    assert per[0] == per[1], per  # the same decisions on both ranks
    skipped = [e for e, ev in per[0].items() if ev == "skipped"]
    assert skipped, "no save was skipped although every epoch is shorter than a persist to HDFS"
    assert all(x["policy"] == "auto" for x in recs if x["event"] in ("saved", "skipped"))
    committed = sorted(x["epoch"] for x in recs if x["trainer"] == 0 and x.get("committed") is True)
    assert committed[-1] == 39
    assert not [x for x in recs if x["event"] == "failed" or x.get("committed") is False], recs
    gaps = [b - a for a, b in zip([-1] + committed, committed)]
    assert max(gaps) <= MAX_STRIDE, committed  # a checkpoint at least every K due points
    check_no_orphans(uri)
    for r in (0, 1):
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r


def test_kill_and_resume_with_skipped_saves_on_hdfs(hdfs, tmp_path):
    """Both ranks killed (rank 1 first) in epoch 25 of 40, while saves are being skipped; after a
    restart each rank ends bit-identical to an uninterrupted run, both resumed from one checkpoint."""
    uri, env = hdfs
    ref = reference(tmp_path, BUSY_ARGS)
    procs = popen_job(tmp_path, 2, BUSY_ARGS, uri, "k0", env=env, stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(read_log(tmp_path / "out" / "r1")) < 25 and time.monotonic() < deadline:
        time.sleep(0.005)
    for p in (procs[1], procs[0]):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert not is_done(tmp_path / "out" / "r0")
    res = run_job(tmp_path, 2, BUSY_ARGS, uri, "k1", env=env)
    assert all(rc == 0 for rc, _ in res), [o[-3000:] for _, o in res]
    starts = []
    for r in (0, 1):
        with open(tmp_path / "out" / f"r{r}" / "events.jsonl") as f:
            starts.append([json.loads(x) for x in f.read().splitlines() if x.strip()][-1])
        assert is_done(tmp_path / "out" / f"r{r}")
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r
    assert starts[0]["restored"] == starts[1]["restored"], starts
    check_no_orphans(uri)
