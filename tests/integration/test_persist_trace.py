"""ci/bench/persist_trace.py: rank 0's persist split into its steps from a simulated store's call trace."""
import json
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "ci", "bench"))
import persist_trace  # noqa: E402

P = "job/range/_range_0/ckpt-e0"


def _write(d, rank, rows):
    with open(d / f"trace-{rank}-{100 + rank}.jsonl", "w") as f:
        for op, path, t0, t1, thread in rows:
            f.write(json.dumps({"op": op, "path": path, "t0": t0, "t1": t1, "thread": thread}) + "\n")


def test_split_names_each_step_of_rank0s_persist(tmp_path):
    s, c = "paddle-acp-saver", "paddle-acp-committer"
    _write(tmp_path, 0, [
        ("exists", f"{P}/rank-0", 10.0, 10.002, s),
        ("write_image", f"{P}/rank-0.tmp-g0-a/tensors.bin", 10.01, 11.0, "paddle-acp-data"),
        ("rename", f"{P}/rank-0.tmp-g0-a", 11.0, 11.002, s),
        ("listdir", P, 11.003, 11.005, c),
        ("open_input", f"{P}/rank-0/manifest.json", 11.005, 11.007, c),
        ("listdir", P, 11.2, 11.202, c),
        ("open_input", f"{P}/rank-1/manifest.json", 11.202, 11.204, c),
        ("rename", f"{P}/global.json.tmp-x", 11.21, 11.212, c),
        ("delete_dir", "job/range/_range_0/ckpt-e-1", 11.22, 11.3, c),
    ])
    _write(tmp_path, 1, [
        ("write_image", f"{P}/rank-1.tmp-g0-b/tensors.bin", 10.1, 11.1, "paddle-acp-data"),
        ("rename", f"{P}/rank-1.tmp-g0-b", 11.1, 11.102, s),
    ])
    ((name, lines),) = persist_trace.split(persist_trace.load(str(tmp_path)))
    assert name == "ckpt-e0"
    text = "\n".join(lines)
    assert "rank 1: upload  +0.100 ..  +1.100 (1.000 s), landed  +1.102, noticed by rank 0  +1.202 (+0.100 s)" in text
    assert "global.json renamed  +1.212; 5 calls on the committer (2 listings of the position)" in text
    assert "then on the committer (retention): 1 calls" in text
