"""Smoke runs of the benchmarks (tiny sizes) so that they cannot rot. No timing is asserted."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.long  # on demand: bash ci/test.sh --long
def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench", "local_costs.py"), "--quick", "--ir", "pir", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    res = doc["results"][0]
    for key in ("stall_vs_paddle", "stall_vs_paddle_durable", "stall_vs_bare_memcpy", "stall_vs_raw_write",
                "sync_save_throughput_vs_raw", "restore_throughput_vs_raw_read", "restore_vs_read_plus_memcpy",
                "hook_overhead", "hook_us_per_call", "end_to_end_overhead"):
        assert isinstance(res[key], float) and res[key] == res[key], key
    assert len(res["end_to_end_rounds"]) == 2  # --quick: two paired rounds (the default is 5)
    sizes = doc["scaling"]["sizes"]
    assert len(sizes) == 2 and sizes[0]["gb"] < sizes[1]["gb"]
    for key in ("stall_s_per_gb", "sync_save_s_per_gb", "restore_s_per_gb"):
        assert isinstance(doc["scaling"][key], float)
    assert doc["command"].startswith("python") and doc["date"]
    # the table: each figure beside its target
    assert "5. end to end, checkpoint every epoch vs off (median)" in p.stdout and "<= +3%" in p.stdout
    assert "1. stall / Paddle's save made durable (+fsync)" in p.stdout and "6. slope, s per GB" in p.stdout


def test_bench_storage_quick_local(tmp_path):
    out = tmp_path / "bench_storage.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench", "storage_backends.py"), "--quick", "--backends", "local", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert json.loads(out.read_text())


def test_bench_ranks_smoke_local(tmp_path):
    """ci/bench/calls_per_rank.py with tiny world sizes on a local disk (no server): the figures it reports exist,
    and a rank's restart costs the same calls at both sizes."""
    out = tmp_path / "bench_ranks.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench", "calls_per_rank.py"), "--backends", "local", "--worlds", "2,5",
                        "--checkpoints", "2", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    local = doc["backends"]["local"]
    assert [r["world"] for r in local["per_world"]] == [2, 5]
    for r in local["per_world"]:
        assert all(ck["committed"] is True for ck in r["checkpoints"])
        assert r["restart"]["chosen"] == ["ckpt-e1"] and r["restart"]["own_state"] is True
    assert local["summary"]["restart_calls_max_rank"]["slope_per_extra_rank"] == 0.0
    assert "slope of checkpoint_calls_per_rank" in p.stdout and doc["command"].startswith("python ci/bench/calls_per_rank.py")


@pytest.mark.long  # on demand: bash ci/test.sh --long
def test_bench_sim_quick(tmp_path):
    """ci/bench/sim_training.py (the simulated remote store): both figures at tiny sizes; each says it is simulated."""
    out = tmp_path / "bench_sim.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench", "sim_training.py"), "--quick", "--ranks", "1,2",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["storage"]["simulated"] is True and "simulated remote store" in doc["storage"]["description"]
    assert [r["ranks"] for r in doc["results"]] == [1, 2]
    for r in doc["results"]:
        assert len(r["rounds"]) == 2 and isinstance(r["overhead"], float)
        assert all(x["with_s"] > 0 and x["without_s"] > 0 for x in r["rounds"])
    assert "W=2: end to end" in p.stdout and "simulated remote store" in p.stdout
    out2 = tmp_path / "persist.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench", "sim_training.py"), "--quick", "--ranks", "1,2", "--persist",
                        "--state", "replicated", "--client-mbps", "20", "--json", str(out2)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(out2.read_text())
    # every committed checkpoint of each world size has rank 0's persist time
    assert [len(r["persist_s"]) for r in doc["results"]] == [4, 4]
    assert doc["persist_ratio_largest_vs_smallest_world"] > 0 and "persist time W=2 / W=1" in p.stdout


def test_a_benchmarks_run_is_added_to_its_one_results_file_and_the_others_kept(tmp_path, monkeypatch):
    """ci/bench/results_io.py: each benchmark has one results file, ci/bench/results/<bench>.json; a run goes in
    under its key with every run already there kept; ``--json FILE`` without a key writes the run alone."""
    sys.path.insert(0, os.path.join(ROOT, "ci", "bench"))
    try:
        import results_io
    finally:
        sys.path.remove(os.path.join(ROOT, "ci", "bench"))
    assert results_io.results_file("ci/bench/calls_per_rank.py") == os.path.join(
        ROOT, "ci", "bench", "results", "calls_per_rank.json")
    # every benchmark that records its runs has its file (the runs before issue 43 under their old files' names)
    for name, old in [("local_costs", "bench_results"), ("storage_backends", "bench_cache_results"),
                      ("calls_per_rank", "bench_ranks_coord_results"), ("restore", "bench_restore_results"),
                      ("ranks_training_hdfs", "bench_agree_coord_results"), ("sim_training", "bench_spread_results"),
                      ("range_open_hdfs", "bench_open_results")]:
        with open(results_io.results_file(name)) as f:
            assert old in json.load(f), (name, old)
    monkeypatch.setattr(results_io, "RESULTS", str(tmp_path / "results"))
    own = results_io.results_file("x.py")
    assert results_io.write({"a": 1}, "x.py", key="old") == f"{own} [old]"
    where = results_io.write({"b": 2}, "x.py")
    assert where.startswith(f"{own} [run-")
    with open(own) as f:
        runs = json.load(f)
    assert runs["old"] == {"a": 1} and list(runs.values())[1] == {"b": 2} and len(runs) == 2
    alone = tmp_path / "alone.json"
    assert results_io.write({"c": 3}, "x.py", str(alone)) == str(alone)
    assert json.loads(alone.read_text()) == {"c": 3}
    results_io.write({"d": 4}, "x.py", str(alone), key="k")  # a key given: added to that file, its content kept
    assert json.loads(alone.read_text()) == {"c": 3, "k": {"d": 4}}
    with open(own) as f:
        assert json.load(f) == runs
