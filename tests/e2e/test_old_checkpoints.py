"""Checkpoints written by the last release (1276c34) restore exactly with today's code, and its tools handle them.

The fixtures are built once per session from the release's own code (tests/support/old_fixtures.py): the
one-process layout on PIR and legacy IR, mid-epoch checkpoints with the script's own state (a Value, a
Counter, a NumPy Generator, a random.Random), and the global layout of 2-rank jobs (per-rank state,
global format version 3; replicated state written by every rank, version 4, or by rank 0 alone,
version 3). For each: a restart resumes at
the checkpoint's epoch and step and, after its first step, holds the old process's state bit for bit
(persistables, LR scheduler, Paddle's, NumPy's and Python's RNGs, the script's objects); ``ls``,
``verify``, ``export``, ``gc`` (dry and real) work on it; a byte flipped in its newest checkpoint is
refused by ``verify`` and by a restart, which falls back to the checkpoint before and trains back to
the same state.
"""
import hashlib
import json
import os
import pickle
import shutil

import pytest
from support import old_fixtures as old

from paddle_acp import cli

LONG = [pytest.param(n, marks=pytest.mark.long) for n in old.LONG]
ALL = list(old.DEFAULT) + LONG


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The default fixtures, built at once (a session's first use)."""
    return old.build(old.DEFAULT, str(tmp_path_factory.mktemp("old_fixtures")))


@pytest.fixture(scope="session")
def built_long(tmp_path_factory):
    return old.build(old.LONG, str(tmp_path_factory.mktemp("old_fixtures_long")))


@pytest.fixture
def fixture(request, built):
    name = request.param
    made = built if name in old.DEFAULT else request.getfixturevalue("built_long")
    return old.SPECS[name], made[name]


def copy_root(fx, tmp_path):
    dst = str(tmp_path / "ckpt")
    shutil.copytree(fx["ckpt"], dst)
    return dst


def cli_json(capsys, *argv):
    """(exit status, parsed JSON output) of ``paddle-acp <argv> --json`` run in-process."""
    capsys.readouterr()
    rc = cli.main([str(a) for a in argv] + ["--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def checkpoints(capsys, root):
    """The range's checkpoints as ``paddle-acp ls --json`` lists them, newest first, and its restart name."""
    rc, listing = cli_json(capsys, "ls", root)
    assert rc == 0, listing
    (job,) = listing["jobs"]
    (rng,) = job["ranges"]
    assert job["job"] == old.JOB_ID and rng["range"] == old.RANGE
    return rng["checkpoints"], rng["restart_name"]


def resume_point(ck):
    """(epoch, step) a restart from the ``ls`` row ``ck`` trains first."""
    return (ck["epoch"] + 1, 0) if ck["step"] is None else (ck["epoch"], ck["step"])


def stop_point(spec):
    e, _, s = spec.stop.partition(":")
    return int(e), int(s or 0)


def assert_state(path, want_path, what):
    diffs = old.state_diffs(old.load_state(path), old.load_state(want_path))
    assert not diffs, f"{what} differs from the old process's state: {diffs}"


def tree(root):
    out = {}
    for d, _, files in os.walk(root):
        for n in files:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), root)] = hashlib.sha1(f.read()).hexdigest()
    return out


def flip_byte(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("fixture", ALL, indirect=True)
def test_restart_resumes_at_the_checkpoint_with_the_old_process_state(fixture, tmp_path, capsys):
    spec, fx = fixture
    root = copy_root(fx, tmp_path)
    cks, restart = checkpoints(capsys, root)
    assert cks[0]["name"] == restart and resume_point(cks[0]) == stop_point(spec), cks[0]
    out = str(tmp_path / "out")
    old.run(spec, root, out, "new", "--dump-first")
    for rank in range(spec.world):
        got = os.path.join(out, f"r{rank}", "state_first.npz")
        first = old.meta(old.load_state(got))
        assert (first["epoch"], first["step"]) == stop_point(spec), first
        assert_state(got, os.path.join(fx["out"], f"r{rank}", "state_stop.npz"), f"rank {rank}'s first step")
        with open(os.path.join(out, f"r{rank}", "losses.jsonl")) as f:
            epochs = [json.loads(line)["epoch"] for line in f if line.strip()]
        assert epochs == list(range(stop_point(spec)[0], 4)), epochs
        assert os.path.exists(os.path.join(out, f"r{rank}", "done"))


@pytest.mark.parametrize("fixture", ALL, indirect=True)
def test_ls_verify_export_and_gc_handle_old_checkpoints(fixture, tmp_path, capsys):
    spec, fx = fixture
    root = copy_root(fx, tmp_path)
    cks, restart = checkpoints(capsys, root)
    assert len(cks) >= 2 and all(c["valid"] and c["committed"] and c["status"] == "ok" for c in cks), cks
    assert {c["ir"] for c in cks} == {spec.ir}
    rc, verified = cli_json(capsys, "verify", root)
    assert rc == 0 and verified["ok"] and verified["checked"] == len(cks), verified

    ckpt = os.path.join(old.range_dir(root), restart)
    for rank in range(spec.world):
        dest = str(tmp_path / f"export-{rank}")
        rank_args = ["--rank", rank] if spec.world > 1 else []
        rc, exported = cli_json(capsys, "export", ckpt, *rank_args, "--to", dest, "--optimizer-state")
        assert rc == 0, exported
        tensors = {}
        for name in ("model.pdparams", "model.pdopt"):
            with open(os.path.join(dest, name), "rb") as f:
                tensors.update(pickle.load(f))
        saved = old.load_state(os.path.join(fx["out"], f"r{rank}", "state_saved.npz"))
        params = {k[2:]: v for k, v in saved.items() if k.startswith("p/")}
        assert sorted(tensors) == sorted(params)
        for n, v in params.items():
            assert tensors[n].dtype == v.dtype and tensors[n].tobytes() == v.tobytes(), (rank, n)

    before = tree(root)
    rc, dry = cli_json(capsys, "gc", root, "--keep", 1, "--dry-run")
    assert rc == 0 and not dry["deleted"] and tree(root) == before, dry
    assert sorted(a["checkpoint"] for a in dry["actions"] if a["action"] == "delete") == sorted(
        c["name"] for c in cks[1:])
    rc, done = cli_json(capsys, "gc", root, "--keep", 1)
    assert rc == 0 and not done["errors"] and len(done["deleted"]) == len(cks) - 1, done
    left, restart_after = checkpoints(capsys, root)
    assert [c["name"] for c in left] == [restart] == [restart_after]
    rc, verified = cli_json(capsys, "verify", root)
    assert rc == 0 and verified["ok"], verified


@pytest.mark.parametrize("fixture", ALL, indirect=True)
def test_a_flipped_byte_is_refused_and_the_restart_falls_back(fixture, tmp_path, capsys):
    spec, fx = fixture
    root = copy_root(fx, tmp_path)
    cks, restart = checkpoints(capsys, root)
    ckpt = os.path.join(old.range_dir(root), restart)
    data = [os.path.join(ckpt, "tensors.bin")] if spec.world == 1 else [
        os.path.join(ckpt, f"rank-{k}", "tensors.bin") for k in range(spec.world)]
    flip_byte([p for p in data if os.path.getsize(p) > 0][-1])  # the last rank that wrote tensors
    rc, verified = cli_json(capsys, "verify", root)
    assert rc == 1 and not verified["ok"], verified
    rows = {r["checkpoint"]: r for r in verified["rows"]}
    assert rows[restart]["status"].startswith("BAD: ") and rows[cks[1]["name"]]["restart"] == "*", verified
    assert len(verified["failures"]) == 1 and f"fall back to {cks[1]['name']}" in verified["failures"][0], verified

    out = str(tmp_path / "out")
    if spec.world > 1:  # the rank that finds its part bad marks the checkpoint and stops; the launcher stops the job
        failed = old.run_to_first_failure(spec, root, out, "refused", "--dump-first")
        assert any("RestartRequiredError" in log and "restart the job" in log for log in failed.values()), failed
        assert any(n.startswith("bad-rank-") for n in os.listdir(os.path.join(old.range_dir(root), restart)))
    old.run(spec, root, out, "fallback", "--dump-first", "--stop-at", spec.stop)
    for rank in range(spec.world):
        first = old.meta(old.load_state(os.path.join(out, f"r{rank}", "state_first.npz")))
        assert (first["epoch"], first["step"]) == resume_point(cks[1]), (first, cks[1])
        assert_state(os.path.join(out, f"r{rank}", "state_stop.npz"),
                     os.path.join(fx["out"], f"r{rank}", "state_stop.npz"),
                     f"rank {rank}, trained again from {cks[1]['name']} to the old process's stop,")
