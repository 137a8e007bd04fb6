"""Multi-rank jobs with real processes: per-rank state, world-size changes, mode
detection on programs built with Paddle's own parallel APIs, two writers of one job."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.e2e import (
    REPO,
    committed_positions,
    compare_results,
    is_done,
    load_result,
    read_log,
    run_script,
    script_env,
)
from support.launch import popen_ranks

DETECT_SCRIPT = os.path.join(REPO, "tests", "scripts", "detect_modes.py")


def start_job(tmp, world, *args, ckpt=None, gen="g0", env=None, outs="out", barrier=True, no_acp=False):
    procs = popen_ranks(tmp / outs, world, args, ckpt, gen, env={"PADDLE_ACP_PART_TIMEOUT": 60, **(env or {})},
                        barrier=tmp / "barrier" if barrier else None, no_acp=no_acp,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        results.append((p.returncode, out))
    return results


def events(out):
    path = os.path.join(str(out), "events.jsonl")
    with open(path) as f:
        return [json.loads(x) for x in f.read().splitlines() if x.strip()]


def test_world_size_change_on_a_per_rank_checkpoint_fails_clearly_on_every_rank(tmp_path):
    ckpt = tmp_path / "ckpt"
    env = {"PADDLE_ACP_RANK_STATE": "per-rank"}
    res = start_job(tmp_path, 2, "--kind", "tp", "--epochs", 2, ckpt=ckpt, env=env)
    assert all(rc == 0 for rc, _ in res), res
    res = start_job(tmp_path, 3, "--kind", "tp", "--epochs", 4, ckpt=ckpt, env=env, gen="g1", outs="out3")
    for r, (rc, out) in enumerate(res):
        assert rc != 0, out
        assert "CheckpointError" in out and f"rank {r}: checkpoint ckpt-e1" in out, out[-3000:]
        assert "world size 2, per-rank" in out and "world size 3, per-rank" in out, out[-3000:]
        assert "PADDLE_TRAINERS_NUM=2" in out and "PADDLE_JOB_ID" in out
        assert not (tmp_path / "out3" / f"r{r}" / "losses.jsonl").exists()  # not one step trained


@pytest.mark.parametrize("writers", ["all", "one"])
def test_replicated_checkpoint_resumes_at_another_world_size(tmp_path, writers):
    """Data parallel (auto: replicated): 2 ranks train 3 epochs; the job goes on with 1 and
    with 3 ranks and ends bit-identical to an uninterrupted run of one rank. ``writers``: each
    rank writes its share of the tensors (every rank then reads both shares), or rank 0 all."""
    env = {"PADDLE_ACP_REPLICATED_WRITERS": writers}
    ref = start_job(tmp_path, 1, "--kind", "dp", "--epochs", 6, outs="ref", barrier=False, no_acp=True)
    assert ref[0][0] == 0, ref
    reference = load_result(tmp_path / "ref" / "r0")
    for world_after in (1, 3):
        ckpt, outs = tmp_path / f"ckpt{world_after}", f"out{world_after}"
        res = start_job(tmp_path, 2, "--kind", "dp", "--epochs", 3, ckpt=ckpt, outs=outs, gen=f"a{world_after}", env=env)
        assert all(rc == 0 for rc, _ in res), res
        ckdir = ckpt / "e2e" / "range" / "_range_0" / "ckpt-e2"
        assert json.loads((ckdir / "global.json").read_bytes())["version"] == (4 if writers == "all" else 3)
        # one copy of the tensors: rank 0's alone (one writer), or a share on each rank
        sizes = [(ckdir / f"rank-{k}" / "tensors.bin").stat().st_size for k in (0, 1)]
        assert (sizes[1] == 0) if writers == "one" else min(sizes) > 0, sizes
        for r in range(2):
            os.remove(tmp_path / outs / f"r{r}" / "done")
        res = start_job(tmp_path, world_after, "--kind", "dp", "--epochs", 6, ckpt=ckpt, outs=outs, gen=f"b{world_after}",
                        env=env)
        assert all(rc == 0 for rc, _ in res), res
        for r in range(world_after):
            starts = events(tmp_path / outs / f"r{r}")
            assert starts[-1]["restored"] == "ckpt-e2" and starts[-1]["epoch"] == 3, starts
            losses, params = load_result(tmp_path / outs / f"r{r}")
            want = {k: v for k, v in reference[0].items() if r < 2 or k[1] >= 3}
            assert not compare_results(({k: v for k, v in losses.items()}, params), (want, reference[1])), r


def test_tensor_parallel_like_ranks_each_resume_their_own_state(tmp_path):
    """Same program, names and shapes on both ranks, values and data their own: rank 1 is
    killed inside epoch 3; after a restart of both, each ends bit-identical to its own
    uninterrupted run, and both resumed from the same checkpoint."""
    args = ["--kind", "tp", "--epochs", 6, "--steps-per-epoch", 3]
    ref = start_job(tmp_path, 2, *args, outs="ref", barrier=False, no_acp=True)
    assert all(rc == 0 for rc, _ in ref), ref
    refs = [load_result(tmp_path / "ref" / f"r{r}") for r in (0, 1)]
    assert compare_results(refs[0], refs[1]), "the two ranks must hold different state"
    ckpt = tmp_path / "ckpt"
    env = {"PADDLE_ACP_RANK_STATE": "per-rank"}
    # first start: both ranks train; rank 1 dies at the start of epoch 3 (its peers are then stopped)
    procs = popen_ranks(tmp_path / "out", 2, args, ckpt, "k0", env=env, barrier=tmp_path / "barrier",
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    rng_dir = ckpt / "e2e" / "range" / "_range_0"
    deadline = time.monotonic() + 200
    while (len(read_log(tmp_path / "out" / "r1")) < 3 or not committed_positions(rng_dir)) \
            and time.monotonic() < deadline:
        time.sleep(0.01)  # inside epoch 3 (or later), with a global checkpoint committed
    for p in (procs[1], procs[0]):
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert committed_positions(rng_dir), "no global checkpoint was committed within 200 s (liveness, not a wrong resume)"
    newest = committed_positions(rng_dir)[-1]
    res = start_job(tmp_path, 2, *args, ckpt=ckpt, env=env, gen="k1")
    assert all(rc == 0 for rc, _ in res), res
    restored = [events(tmp_path / "out" / f"r{r}")[-1] for r in (0, 1)]
    assert restored[0]["restored"] == restored[1]["restored"] == newest, (newest, restored)  # the newest committed
    assert restored[0]["epoch"] == restored[1]["epoch"] >= 1, restored
    for r in (0, 1):
        assert is_done(tmp_path / "out" / f"r{r}")
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), refs[r]), r


def test_pipeline_like_ranks_with_different_programs_resume(tmp_path):
    """Rank k's program differs (other layers): with auto mode and PADDLE_ACP_RANK_STATE unset
    the job would be replicated, so per-rank is set; each stage resumes its own layers."""
    args = ["--kind", "pp", "--epochs", 4]
    ref = start_job(tmp_path, 2, *args, outs="ref", barrier=False, no_acp=True)
    assert all(rc == 0 for rc, _ in ref), ref
    refs = [load_result(tmp_path / "ref" / f"r{r}") for r in (0, 1)]
    ckpt = tmp_path / "ckpt"
    env = {"PADDLE_ACP_RANK_STATE": "per-rank"}
    res = start_job(tmp_path, 2, "--kind", "pp", "--epochs", 2, ckpt=ckpt, env=env)
    assert all(rc == 0 for rc, _ in res), res
    g = json.loads((ckpt / "e2e" / "range" / "_range_0" / "ckpt-e1" / "global.json").read_text())
    assert g["topology"] == {"world_size": 2, "mode": "per-rank"}
    assert g["parts"][0]["programs"] != g["parts"][1]["programs"]  # per-rank fingerprints
    for r in (0, 1):
        os.remove(tmp_path / "out" / f"r{r}" / "done")
    res = start_job(tmp_path, 2, *args, ckpt=ckpt, env=env, gen="g1")
    assert all(rc == 0 for rc, _ in res), res
    for r in (0, 1):
        assert events(tmp_path / "out" / f"r{r}")[-1]["restored"] == "ckpt-e1"
        assert not compare_results(load_result(tmp_path / "out" / f"r{r}"), refs[r]), r


@pytest.mark.parametrize("ir", ["pir", "legacy"])
def test_auto_mode_detects_parallel_programs_built_with_paddles_own_apis(ir):
    env = script_env(None, ir, {"PADDLE_TRAINER_ID": 0, "PADDLE_TRAINERS_NUM": 2,
                                "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6170,127.0.0.1:6171",
                                "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:6170"})
    p = subprocess.run([sys.executable, DETECT_SCRIPT], env=env, cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["plain"]["mode"] == "replicated" and got["plain"]["ops"] == []
    tp = got["tensor_parallel"]
    assert tp["mode"] == "per-rank" and tp["training"]
    assert {"c_identity", "mp_allreduce_sum"} <= {o.replace("pd_op.", "").rstrip("_") for o in tp["ops"]}
    if ir == "legacy":  # paddle.distributed.split builds only under legacy IR in 3.3.1
        assert {"c_split", "c_concat"} <= {o for o in got["split_linear"]["ops"]}, got
        assert {"c_embedding"} <= set(got["split_embedding"]["ops"]), got
        assert got["split_linear"]["mode"] == got["split_embedding"]["mode"] == "per-rank"
    assert got["fleet_hybrid"]["mode"] == "per-rank" and got["fleet_hybrid"]["degrees"]["mp_degree"] == 2
    assert got["explicit_replicated"]["mode"] == "replicated"


def test_two_writers_of_one_job_the_older_is_fenced(tmp_path):
    """A zombie trainer 0 (started first, still running: 3000 epochs, killed by the test) and a
    new one of the same job (200 epochs): the new one takes a newer generation; the zombie
    commits nothing after that (and stops), and the newest checkpoint never goes backwards."""
    ckpt, out_z, out_n = tmp_path / "ckpt", tmp_path / "zombie", tmp_path / "new"
    cmd = [sys.executable, os.path.join(REPO, "tests", "scripts", "train_script.py"), "--out", str(out_z),
           "--epochs", 3000, "--steps-per-epoch", 1, "--sleep", 0.15]
    zombie = subprocess.Popen([str(c) for c in cmd], env=script_env(ckpt, "pir"), cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(read_log(out_z)) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        new = run_script(out_n, ckpt, "pir", "--epochs", 200, "--steps-per-epoch", 1)
        assert new.returncode == 0, new.stderr[-3000:]
        done_at = len(read_log(out_z))
        deadline = time.monotonic() + 60
        while zombie.poll() is None and len(read_log(out_z)) < done_at + 5 and time.monotonic() < deadline:
            time.sleep(0.01)  # the zombie trains until its fenced save stops it (FencedError at its next epoch end)
    finally:
        if zombie.poll() is None:  # (stopped by its FencedError: its group is gone)
            os.killpg(zombie.pid, signal.SIGKILL)
        zombie_out = zombie.communicate()[0]
    assert "this writer (generation 0) is fenced" in zombie_out and "(generation 1)" in zombie_out, zombie_out[-3000:]
    rdir = ckpt / "e2e" / "range" / "_range_0"
    manifests = [json.loads((p / "rank-0" / "manifest.json").read_text()) for p in rdir.iterdir()
                 if (p / "global.json").exists()]
    newest = max(manifests, key=lambda m: m["range"]["epoch_no"])
    assert newest["range"]["epoch_no"] == 199, "the newest checkpoint went backwards"
    assert [p.name for p in ckpt.iterdir()] == ["e2e"]
