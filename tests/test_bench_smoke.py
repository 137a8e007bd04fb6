"""Smoke runs of the benchmarks (tiny sizes) so that they cannot rot. No timing is asserted."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_quick(tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench.py"), "--quick", "--ir", "pir", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())["results"][0]
    for key in ("stall_vs_paddle", "stall_vs_raw_write", "sync_save_throughput_vs_raw",
                "restore_throughput_vs_raw_read", "hook_overhead", "hook_us_per_call", "end_to_end_overhead"):
        assert isinstance(res[key], float) and res[key] == res[key]
    assert "5. end-to-end" in p.stdout


def test_bench_storage_quick_local(tmp_path):
    out = tmp_path / "bench_storage.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "ci", "bench_storage.py"), "--quick", "--backends", "local", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert json.loads(out.read_text())
