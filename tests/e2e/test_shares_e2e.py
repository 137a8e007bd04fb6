"""Spread writes of replicated state with real processes: a data-parallel job of 2 ranks whose
ranks each write a share of the tensors (the default, PADDLE_ACP_REPLICATED_WRITERS=all) is
SIGKILLed mid-epoch and resumes bit-identical; a damaged share stops every rank, and the restart
falls back alike."""
import json
import os
import signal
import subprocess
import sys
import time

from support.e2e import REPO, committed_positions, compare_results, is_done, load_result, read_log, script_env

RANK_SCRIPT = os.path.join(REPO, "tests", "scripts", "rank_train.py")
ARGS = ["--kind", "dp", "--epochs", 6, "--steps-per-epoch", 3, "--hidden", 64]


def cmd(tmp, r, outs="out", barrier=True, no_acp=False):
    c = [sys.executable, RANK_SCRIPT, "--out", str(tmp / outs / f"r{r}")] + [str(a) for a in ARGS]
    if barrier:
        c += ["--barrier", str(tmp / "barrier")]
    if no_acp:
        c.append("--no-acp")
    return c


def env_of(r, world, gen, extra=None):
    return {"PADDLE_TRAINER_ID": r, "PADDLE_TRAINERS_NUM": world, "ACP_TEST_GEN": gen, "PADDLE_ACP_PART_TIMEOUT": 60,
            **(extra or {})}


def run_job(tmp, world, ckpt, gen, outs="out", extra=None):
    procs = [subprocess.Popen(cmd(tmp, r, outs), env=script_env(ckpt, "pir", env_of(r, world, gen, extra)), cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    return [(p.wait(timeout=300), p.stdout.read()) for p in procs]


def starts(out):
    with open(os.path.join(str(out), "events.jsonl")) as f:
        return [json.loads(x) for x in f.read().splitlines() if x.strip()]


def tail(res):
    return "\n".join(f"--- rank {r} (rc {rc})\n{out[-2500:]}" for r, (rc, out) in enumerate(res))


def reference(tmp):
    p = subprocess.run(cmd(tmp, 0, "ref", barrier=False, no_acp=True), env=script_env(None, "pir", env_of(0, 1, "ref")),
                       cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    return load_result(tmp / "ref" / "r0")


def shares_of(ckpt, name):
    d = ckpt / "e2e" / "range" / "_range_0" / name
    return json.loads((d / "global.json").read_bytes()), [(d / f"rank-{k}" / "tensors.bin").stat().st_size for k in (0, 1)]


def test_spread_writes_kill_and_resume_bit_identical(tmp_path):
    ref = reference(tmp_path)
    ckpt = tmp_path / "ckpt"
    procs = [subprocess.Popen(cmd(tmp_path, r), env=script_env(ckpt, "pir", env_of(r, 2, "k0")), cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True) for r in (0, 1)]
    rng_dir = ckpt / "e2e" / "range" / "_range_0"
    deadline = time.monotonic() + 200
    while (len(read_log(tmp_path / "out" / "r1")) < 3 or not committed_positions(rng_dir)) and time.monotonic() < deadline:
        time.sleep(0.01)  # inside epoch 3 (or later), with a global checkpoint committed
    for p in (procs[1], procs[0]):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert committed_positions(rng_dir), "no global checkpoint was committed within 200 s (liveness, not a wrong resume)"
    newest = committed_positions(rng_dir)[-1]
    g, sizes = shares_of(ckpt, newest)
    assert g["version"] == 4 and g["writers"] == "all" and all(s > 0 for s in sizes), (g, sizes)  # both wrote a share
    parts = [json.loads((rng_dir / newest / f"rank-{k}" / "manifest.json").read_bytes()) for k in (0, 1)]
    held = [sum(t["nbytes"] for p in d["programs"] for t in p["tensors"]) for d in parts]
    assert abs(held[0] - held[1]) <= 1, held  # equal byte ranges of the real program's state (pieces where cut)
    res = run_job(tmp_path, 2, ckpt, "k1")
    assert all(rc == 0 for rc, _ in res), tail(res)
    restored = [starts(tmp_path / "out" / f"r{r}")[-1] for r in (0, 1)]
    assert restored[0]["restored"] == restored[1]["restored"] == newest, (newest, restored)  # the newest committed
    for r in (0, 1):
        assert is_done(tmp_path / "out" / f"r{r}")
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r


def test_a_damaged_share_stops_every_rank_and_the_restart_falls_back_alike(tmp_path):
    ref = reference(tmp_path)
    ckpt = tmp_path / "ckpt"
    res = run_job(tmp_path, 2, ckpt, "a", extra={"PADDLE_ACP_MAX_TO_KEEP": 0})
    assert all(rc == 0 for rc, _ in res), tail(res)
    _g, sizes = shares_of(ckpt, "ckpt-e3")
    data = ckpt / "e2e" / "range" / "_range_0" / "ckpt-e3" / "rank-1" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data.write_bytes(bytes(raw))
    # the positions after ckpt-e3 withdrawn by hand: the job resumes from ckpt-e3 (as after a kill in epoch 4)
    for e in (4, 5):
        os.remove(ckpt / "e2e" / "range" / "_range_0" / f"ckpt-e{e}" / "global.json")
    for r in (0, 1):
        os.remove(tmp_path / "out" / f"r{r}" / "done")
    # rank 0 starts first (rank 1 not yet): it reads rank 1's share, rejects it, marks the copy bad and stops
    # rather than fall back alone (a rank that starts later sees the mark; see test_multirank_verdict.py)
    p0 = subprocess.run(cmd(tmp_path, 0), env=script_env(ckpt, "pir", env_of(0, 2, "b")), cwd=REPO,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p0.returncode != 0 and "RestartRequiredError: rank 0: rank 1's share of checkpoint" in p0.stdout, p0.stdout[-3000:]
    assert "does not fall back alone" in p0.stdout and not (tmp_path / "barrier" / "b").exists(), p0.stdout[-3000:]
    marks = [p.name for p in data.parent.parent.iterdir() if p.name.startswith("bad-")]
    assert marks, tail(res)
    res = run_job(tmp_path, 2, ckpt, "c")
    assert all(rc == 0 for rc, _ in res), tail(res)
    for r in (0, 1):
        assert starts(tmp_path / "out" / f"r{r}")[-1]["restored"] == "ckpt-e2", tail(res)
        assert is_done(tmp_path / "out" / f"r{r}")
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r


def test_capped_share_writers_kill_and_resume_at_another_cap_bit_identical(tmp_path):
    """3 ranks with PADDLE_ACP_REPLICATED_WRITERS=2: ranks 0 and 1 write the shares (selected from the
    tensors' metadata before any view is taken), rank 2 a part with no tensors; SIGKILLed mid-run, the
    job resumes with the default (every rank of 3 writes) bit-identical."""
    ref = reference(tmp_path)
    ckpt = tmp_path / "ckpt"
    capped = {"PADDLE_ACP_REPLICATED_WRITERS": 2}
    procs = [subprocess.Popen(cmd(tmp_path, r), env=script_env(ckpt, "pir", env_of(r, 3, "k0", capped)), cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for r in range(3)]
    rng_dir = ckpt / "e2e" / "range" / "_range_0"
    deadline = time.monotonic() + 250
    while (len(read_log(tmp_path / "out" / "r2")) < 3 or not committed_positions(rng_dir)) and time.monotonic() < deadline:
        time.sleep(0.01)  # inside epoch 3 (or later), with a global checkpoint committed
    for p in reversed(procs):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert committed_positions(rng_dir), "no global checkpoint was committed within 250 s (liveness, not a wrong resume)"
    d = rng_dir / committed_positions(rng_dir)[-1]
    g = json.loads((d / "global.json").read_bytes())
    sizes = [(d / f"rank-{k}" / "tensors.bin").stat().st_size for k in range(3)]
    assert g["version"] == 4 and g["share_writers"] == 2 and sizes[0] > 0 and sizes[1] > 0 and sizes[2] == 0, (g, sizes)
    res = run_job(tmp_path, 3, ckpt, "k1")
    assert all(rc == 0 for rc, _ in res), tail(res)
    restored = [starts(tmp_path / "out" / f"r{r}")[-1] for r in range(3)]
    assert len({x["restored"] for x in restored}) == 1 and restored[0]["restored"] is not None, restored
    writers = {json.loads((p / "global.json").read_bytes())["share_writers"]
               for p in rng_dir.iterdir() if (p / "global.json").exists()}
    assert 3 in writers, writers  # the restarted job's checkpoints: every rank of 3 wrote a share
    for r in range(3):
        assert is_done(tmp_path / "out" / f"r{r}")
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), ref), r
