"""Operator tools (``paddle-acp ls / inspect / verify / gc / export / stats``) on real checkpoints.

The checkpoints come from a real training run (``tests/scripts/train_script.py``,
4 epochs, PIR) in a subprocess; the commands run as ``python -m paddle_acp ...``
subprocesses and the tests assert on what they print. Error paths and the
remote (S3/HDFS) round run in-process through :func:`paddle_acp.cli.main`.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.newest import load_as_restart, part_dir, reader, write_numbered

from paddle_acp import cli, config, tools
from paddle_acp.errors import ConfigError, StorageError
from paddle_acp.format.manifest import Manifest
from paddle_acp.format.metrics_record import MetricsRecord
from paddle_acp.storage import open_storage
from paddle_acp.tools import refs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "tests", "scripts", "train_script.py")
LOADER = os.path.join(REPO, "tests", "scripts", "tools_load_export.py")
JOB, RANGE = "job1", "_range_0"
EPOCHS = 4


def child_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PADDLE_ACP_", "PADDLE_EDL_", "AWS_"))
           and k not in ("PADDLE_JOB_ID", "PADDLE_TRAINER_ID", "PADDLE_RUNNING_ENV", "FLAGS_enable_pir_api")}
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["GLOG_minloglevel"] = "2"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def describe(p):
    return f"cmd: {' '.join(map(str, p.args))}\nrc: {p.returncode}\n--- stdout ---\n{p.stdout}\n--- stderr ---\n{p.stderr[-3000:]}"


def cli_many(*commands, env=None):
    """Run several ``python -m paddle_acp ...`` commands concurrently; CompletedProcess each."""
    procs = []
    for args in commands:
        if args[0] == "!":  # a raw command line
            cmd = list(args[1:])
        else:
            cmd = [sys.executable, "-m", "paddle_acp", *map(str, args)]
        procs.append((cmd, subprocess.Popen(cmd, cwd=REPO, env=env or child_env(), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)))
    out = []
    for cmd, p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr))
    return out


def run_cli(*args, env=None):
    return cli_many(args, env=env)[0]


def tree_state(root):
    """relative path -> (size, mtime_ns, sha1) of every file and directory under root."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.stat(p)
            digest = None
            if n in files:
                with open(p, "rb") as f:
                    digest = hashlib.sha1(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_size if digest else 0, st.st_mtime_ns, digest)
    return out


def ckpt_dirs(root):
    return sorted(os.listdir(os.path.join(root, JOB, "range", RANGE)))


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def ckpt_path(root, epoch):
    """The checkpoint of the end of epoch ``epoch`` (a one-process job's one-part global checkpoint)."""
    return os.path.join(root, JOB, "range", RANGE, f"ckpt-e{epoch}")


def data_path(root, epoch, fname="tensors.bin"):
    """``fname`` (tensors.bin, manifest.json) of that checkpoint: in its rank-0 part."""
    return os.path.join(part_dir(os.path.join(root, JOB, "range", RANGE), f"ckpt-e{epoch}"), fname)


def read_manifest(root, epoch):
    with open(data_path(root, epoch, "manifest.json"), "rb") as f:
        return Manifest.loads(f.read())


def tensor_offset(root, epoch, name):
    m = read_manifest(root, epoch)
    return next(t.offset for p in m.programs for t in p.tensors if t.name == name)


# -- fixtures -----------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real training run with checkpoints every epoch: keeps ckpt-e1..e3 (max_to_keep 3), each a one-part
    global checkpoint (ckpt-eE/rank-0/ + global.json)."""
    base = tmp_path_factory.mktemp("tools")
    root, out = str(base / "ckpt"), str(base / "out")
    env = child_env(PADDLE_ACP_CHECKPOINT_URI=root, PADDLE_JOB_ID=JOB, PADDLE_ACP_ASYNC=0,
                    PADDLE_ACP_SAVE_INTERVAL=0)
    p = subprocess.run([sys.executable, TRAIN, "--out", out, "--epochs", str(EPOCHS)], cwd=REPO, env={**env},
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, describe(p)
    assert ckpt_dirs(root) == ["ckpt-e1", "ckpt-e2", "ckpt-e3"], ckpt_dirs(root)
    for e in (1, 2, 3):
        assert sorted(os.listdir(ckpt_path(root, e))) == ["global.json", "rank-0"], e
        assert sorted(os.listdir(os.path.dirname(data_path(root, e)))) == ["manifest.json", "tensors.bin"], e
    return {"root": root, "out": out}


@pytest.fixture
def root_copy(trained, tmp_path):
    """A private copy of the trained storage root, for tests that damage or prune it."""
    dst = str(tmp_path / "ckpt")
    shutil.copytree(trained["root"], dst)
    return dst


@pytest.fixture(scope="module")
def readonly(trained):
    """Every read-only command on the pristine checkpoints, run concurrently; the tree must not change."""
    root = trained["root"]
    before = tree_state(root)
    names = ["ls", "ls_json", "inspect", "verify", "stats", "ls_missing"]
    procs = cli_many(
        ("ls", root),
        ("ls", root, "--job", JOB, "--json"),
        ("inspect", ckpt_path(root, 3)),
        ("verify", root),
        ("stats", root, "--job", JOB),
        ("ls", os.path.join(root, "no-such-dir")),
    )
    res = dict(zip(names, procs))
    res["before"], res["after"] = before, tree_state(root)
    return res


# -- ls -----------------------------------------------------------------------
def test_ls_lists_newest_first_and_marks_the_restart_checkpoint(readonly, trained):
    p = readonly["ls"]
    assert p.returncode == 0, describe(p)
    lines = p.stdout.splitlines()
    assert any(f"job {JOB}" in line for line in lines), p.stdout
    assert f"range {RANGE}: a restart loads ckpt-e3" in p.stdout, p.stdout
    rows = [line.split() for line in lines if "ckpt-" in line and "restart loads" not in line]
    assert [r[1] if r[0] == "*" else r[0] for r in rows] == ["ckpt-e3", "ckpt-e2", "ckpt-e1"], p.stdout
    marked = [r for r in rows if r[0] == "*"]
    assert len(marked) == 1 and marked[0][1] == "ckpt-e3", p.stdout
    # epoch column and status (a checkpoint of one process: one rank)
    assert marked[0][2] == "3" and marked[0][-3:] == ["ok", "(1", "rank)"], p.stdout
    assert all(r[-3:] == ["ok", "(1", "rank)"] for r in rows), p.stdout
    assert "CHECKPOINT" in p.stdout and "EPOCH" in p.stdout and "SIZE" in p.stdout and "CREATED" in p.stdout
    # the run trained all its epochs: a rerun trains nothing, and ls says so (tests/unit/tools/test_tools_values.py: the rest)
    assert f"FINISHED: every epoch done (0..{EPOCHS - 1}, max_epoch_num {EPOCHS})" in p.stdout, p.stdout


def test_ls_json(readonly, trained):
    p = readonly["ls_json"]
    assert p.returncode == 0, describe(p)
    doc = json.loads(p.stdout)
    (job,) = doc["jobs"]
    assert job["job"] == JOB
    (rng,) = job["ranges"]
    assert rng["range"] == RANGE and rng["restart_name"] == "ckpt-e3" and rng["finished"] is True
    assert rng["max_epoch_num"] == EPOCHS and rng["data_checked"] is False
    cks = rng["checkpoints"]
    assert [c["name"] for c in cks] == ["ckpt-e3", "ckpt-e2", "ckpt-e1"]
    assert rng["restart"] == cks[0]["number"]  # the restart's checkpoint, by the listing's number
    assert [c["epoch"] for c in cks] == [3, 2, 1] and [c["step"] for c in cks] == [None, None, None]
    assert [c["path"] for c in cks] == [f"{JOB}/range/{RANGE}/ckpt-e{e}" for e in (3, 2, 1)]
    assert [c["restart"] for c in cks] == [True, False, False]
    assert all(c["committed"] and c["valid"] and c["status"] == "ok" for c in cks)
    for c in cks:  # the size of its part (rank-0: manifest.json + tensors.bin; global.json is not counted)
        part = part_dir(os.path.join(trained["root"], JOB, "range", RANGE), c["name"])
        files = os.listdir(part)
        assert part.endswith(os.path.join(c["path"], "rank-0")) and sorted(files) == ["manifest.json", "tensors.bin"]
        assert c["bytes"] == sum(os.path.getsize(os.path.join(part, f)) for f in files)
        assert abs(c["created"] - time.time()) < 3600


def test_read_only_commands_change_nothing(readonly):
    assert readonly["before"] == readonly["after"]


def test_parser_has_all_commands():
    text = cli.build_parser().format_help()
    for cmd in ("run", "ls", "inspect", "verify", "gc", "export", "stats"):
        assert cmd in text, text


def test_wrong_uri_is_a_clear_error(readonly, trained):
    p = readonly["ls_missing"]
    assert p.returncode == 2, describe(p)
    assert "paddle-acp: error:" in p.stderr and "no-such-dir" in p.stderr and "does not exist" in p.stderr
    assert "Traceback" not in p.stderr


# -- inspect ------------------------------------------------------------------
def test_inspect_shows_variables_scheduler_rng_and_versions(readonly, trained):
    p = readonly["inspect"]
    assert p.returncode == 0, describe(p)
    out = p.stdout
    import paddle

    assert f"Paddle {paddle.__version__}, IR pir" in out, out
    assert "RNG saved" in out and "yes (Paddle: 1 generator(s), NumPy: yes, Python: yes)" in out, out
    assert "epoch             3 (max_epoch_num 4), end of epoch" in out, out
    assert "restart loads it  yes" in out, out
    # the RandomState the script holds in its loop's function, captured: its saved state, shortened
    assert "script state (restored into the script's objects at a restart)" in out, out
    ers = next(line for line in out.splitlines() if "local:ers" in line)
    assert ers.split()[:3] == ["RNG", "local:ers", "numpy.RandomState"], ers
    assert "'bit_generator': 'MT19937'" in ers and "'key': array(uint32, shape [624]: [" in ers and len(ers) < 200, ers
    # StepDecay(step_size=2, gamma=0.5) after 4 scheduler steps
    assert "LR scheduler: last_epoch=4, last_lr=0.0025" in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  m0_") or line.startswith("  learning_rate")}
    assert rows["m0_fc1.w"][1:] == ["param", "float32", "[16,", "32]", "2048"], rows["m0_fc1.w"]
    assert rows["m0_fc2.b"][1:] == ["param", "float32", "[1]", "4"]
    assert rows["m0_fc1.w_moment1_0"][1] == "optimizer"
    assert rows["learning_rate_0"][1:3] == ["learning", "rate"]
    assert len(rows) == 21
    assert "4 parameters, 17 optimizer variables" in out


def test_inspect_by_job_range_number_json(trained, capsys):
    # --number picks an earlier release's ckpt-N; today's checkpoint of a one-process job is named by its
    # position (ckpt-e2), given by its path
    assert cli.main(["inspect", ckpt_path(trained["root"], 2), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint"] == ckpt_path(trained["root"], 2) and doc["job"] == JOB
    assert doc["range"]["epoch_no"] == 2 and doc["range"]["name"] == RANGE and doc["range"]["step"] is None
    assert doc["part"] == {"rank": 0, "ranks": [0], "world_size": 1, "mode": "replicated"}
    assert doc["restart"] is False and doc["data_status"] == "ok"
    assert doc["rng"]["saved"] is True and doc["ir"] == "pir"
    (prog,) = doc["programs"]
    assert prog["lr_scheduler"] == {"last_epoch": 3, "last_lr": 0.005}
    kinds = {t["name"]: t["kind"] for t in prog["tensors"]}
    assert sorted(n for n, k in kinds.items() if k == "param") == ["m0_fc1.b", "m0_fc1.w", "m0_fc2.b", "m0_fc2.w"]
    # the storage root with --job/--range: the checkpoint a restart loads
    assert cli.main(["inspect", trained["root"], "--job", JOB, "--range", RANGE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint"] == ckpt_path(trained["root"], 3) and doc["range"]["epoch_no"] == 3
    assert doc["range"]["name"] == RANGE and doc["restart"] is True
    # a number names no checkpoint of today's layout: the error lists the range's checkpoints
    assert cli.main(["inspect", trained["root"], "--job", JOB, "--range", RANGE, "--number", "2"]) == 2
    e = capsys.readouterr().err
    assert "ckpt-2 does not exist" in e and "ckpt-e3, ckpt-e2, ckpt-e1" in e, e


# -- verify -------------------------------------------------------------------
def test_verify_ok(readonly):
    p = readonly["verify"]
    assert p.returncode == 0, describe(p)
    assert "OK: 3 checkpoint(s) verified" in p.stdout
    assert p.stdout.count(" ok") >= 3


def test_verify_detects_a_flipped_byte_and_gc_keeps_the_newest_valid(root_copy, capsys):
    root = root_copy
    flip_byte(data_path(root, 3), tensor_offset(root, 3, "m0_fc1.w") + 100)
    flip_byte(data_path(root, 1), tensor_offset(root, 1, "m0_fc2.w") + 4)
    verify = run_cli("verify", root)
    assert verify.returncode == 1, describe(verify)
    bad = [line for line in verify.stdout.splitlines() if "BAD" in line]
    assert len(bad) == 2 and "ckpt-e3" in bad[0] and "ckpt-e1" in bad[1], verify.stdout
    assert "checksum mismatch in tensor 'm0_fc1.w'" in bad[0]
    failed = [line for line in verify.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and "ckpt-e3" in failed[0] and "fall back to ckpt-e2" in failed[0], verify.stdout
    assert "warning: older checkpoint" in verify.stdout and "ckpt-e1" in verify.stdout

    assert cli.main(["ls", root, "--verify", "--json"]) == 0
    (rng,) = json.loads(capsys.readouterr().out)["jobs"][0]["ranges"]
    assert rng["restart_name"] == "ckpt-e2" and rng["data_checked"] is True
    assert [(c["name"], c["status"]) for c in rng["checkpoints"]] == [
        ("ckpt-e3", "corrupt"), ("ckpt-e2", "verified"), ("ckpt-e1", "corrupt")]
    assert rng["restart"] == rng["checkpoints"][1]["number"]

    # gc --keep 1 keeps ckpt-e3 (the newest) AND ckpt-e2 (the newest valid one)
    assert cli.main(["gc", root, "--keep", "1"]) == 0
    out = capsys.readouterr().out
    assert ckpt_dirs(root) == ["ckpt-e2", "ckpt-e3"], out
    assert "newest valid checkpoint" in out
    loaded = load_as_restart(reader(open_storage(root), JOB, RANGE))
    assert loaded is not None and loaded.name == "ckpt-e2" and loaded.manifest.range.epoch_no == 2


def test_verify_exit_0_when_only_an_older_checkpoint_is_bad(root_copy, capsys):
    flip_byte(data_path(root_copy, 2), 1)
    assert cli.main(["verify", root_copy, "--job", JOB]) == 0
    out = capsys.readouterr().out
    assert "BAD" in out and "ckpt-e2" in out and "warning: older checkpoint" in out and "OK:" in out


# -- gc -----------------------------------------------------------------------
def test_gc_dry_run_changes_nothing_then_keep_1(root_copy):
    root = root_copy
    rdir = os.path.join(root, JOB, "range", RANGE)
    past = time.time() - 7200
    # a leftover of an interrupted save of an earlier release (ckpt-N.tmp-<id>), two hours old
    old = os.path.join(rdir, "ckpt-4.tmp-0123456789ab")
    os.makedirs(old)
    with open(os.path.join(old, "tensors.bin"), "wb") as f:
        f.write(b"x" * 100)
    os.utime(os.path.join(old, "tensors.bin"), (past, past))
    os.utime(old, (past, past))
    # today's: the part of a save never committed (no global.json), two hours old
    abandoned = os.path.join(rdir, "ckpt-e4")
    shutil.copytree(os.path.join(ckpt_path(root, 3), "rank-0"), os.path.join(abandoned, "rank-0"))
    for d in (os.path.join(abandoned, "rank-0"), abandoned):
        for f in os.listdir(d):
            os.utime(os.path.join(d, f), (past, past))
        os.utime(d, (past, past))
    fresh = os.path.join(rdir, "ckpt-5.tmp-abcdef012345")  # a save that may be in progress
    os.makedirs(fresh)
    before = tree_state(root)

    dry = run_cli("gc", root, "--keep", 1, "--dry-run")
    assert dry.returncode == 0, describe(dry)
    assert tree_state(root) == before
    assert "dry run" in dry.stdout and "nothing was changed" in dry.stdout
    actions = {line.split()[2]: line for line in dry.stdout.splitlines() if line.startswith(JOB)}
    assert sorted(actions) == ["ckpt-4.tmp-0123456789ab", "ckpt-5.tmp-abcdef012345", "ckpt-e1", "ckpt-e2", "ckpt-e3",
                               "ckpt-e4"], dry.stdout
    assert "would delete" in actions["ckpt-e1"] and "would delete" in actions["ckpt-e2"]
    assert "keep" in actions["ckpt-e3"]
    assert "would delete" in actions["ckpt-4.tmp-0123456789ab"]
    assert "would delete" in actions["ckpt-e4"] and "not committed" in actions["ckpt-e4"]
    assert "skip" in actions["ckpt-5.tmp-abcdef012345"] and "in progress" in actions["ckpt-5.tmp-abcdef012345"]

    gc = run_cli("gc", root, "--keep", 1)
    assert gc.returncode == 0, describe(gc)
    assert ckpt_dirs(root) == ["ckpt-5.tmp-abcdef012345", "ckpt-e3"], gc.stdout
    assert "deleted 4 directories" in gc.stdout
    loaded = load_as_restart(reader(open_storage(root), JOB, RANGE))
    assert loaded is not None and loaded.name == "ckpt-e3" and loaded.manifest.range.epoch_no == 3


def test_gc_keep_must_be_positive(trained, capsys):
    assert cli.main(["gc", trained["root"], "--keep", "0"]) == 2
    assert "--keep must be at least 1" in capsys.readouterr().err


# -- export -------------------------------------------------------------------
def test_export_loads_into_a_fresh_program_with_plain_paddle(trained, tmp_path):
    root = trained["root"]
    m = read_manifest(root, 3)
    key = m.programs[0].key
    dest = str(tmp_path / "export")
    p = run_cli("export", ckpt_path(root, 3), "--program", key, "--to", dest, "--optimizer-state")
    assert p.returncode == 0, describe(p)
    assert sorted(os.listdir(dest)) == ["model.export.json", "model.pdopt", "model.pdparams"]
    info = json.load(open(os.path.join(dest, "model.export.json")))
    assert info["program"] == key and info["lr_scheduler"] == {"last_epoch": 4, "last_lr": 0.0025}

    ld = subprocess.run([sys.executable, LOADER, "--prefix", os.path.join(dest, "model"), "--out", str(tmp_path),
                         "--static-load"], cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        text=True, timeout=120)
    assert ld.returncode == 0, describe(ld)

    ck = load_as_restart(reader(open_storage(root), JOB, RANGE))  # the newest, ckpt-e3, verified
    assert ck is not None and ck.name == "ckpt-e3" and ck.manifest.programs[0].key == key
    saved = {name: arr for (k, name), arr in ck.arrays.items() if k == key}
    with np.load(os.path.join(trained["out"], "final.npz")) as z:
        final = {n: z[n] for n in z.files}
    params = ["m0_fc1.b", "m0_fc1.w", "m0_fc2.b", "m0_fc2.w"]
    assert sorted(final) == params
    with np.load(str(tmp_path / "set_program_state.npz")) as z:
        for n in params:
            assert np.array_equal(z[n], saved[n]), n
            assert np.array_equal(z[n], final[n]), n  # the parameters the training ended with
    with np.load(str(tmp_path / "static_load.npz")) as z:
        assert sorted(saved) == sorted(n for n in z.files if n in saved)
        for n, arr in saved.items():  # parameters AND optimizer state
            assert z[n].dtype == arr.dtype and np.array_equal(z[n], arr), n


def test_export_refuses_a_corrupt_checkpoint(root_copy, tmp_path, capsys):
    flip_byte(data_path(root_copy, 3), tensor_offset(root_copy, 3, "m0_fc2.b"))
    assert cli.main(["export", ckpt_path(root_copy, 3), "--to", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "ckpt-e3" in err and "corrupt" in err and "m0_fc2.b" in err
    assert not os.path.exists(str(tmp_path / "x" / "model.pdparams"))


def test_export_refuses_an_earlier_export_unless_overwrite(trained, tmp_path, capsys):
    dest = str(tmp_path / "x")
    assert cli.main(["export", ckpt_path(trained["root"], 1), "--to", dest, "--optimizer-state"]) == 0
    assert cli.main(["export", ckpt_path(trained["root"], 3), "--to", dest]) == 2
    err = capsys.readouterr().err
    assert "model.pdparams" in err and "model.pdopt" in err and "--overwrite" in err
    with open(os.path.join(dest, "model.export.json")) as f:
        assert json.load(f)["range"]["epoch_no"] == 1  # untouched
    # --overwrite: exactly this export's files, no epoch-1 optimizer state beside epoch-3 parameters
    assert cli.main(["export", ckpt_path(trained["root"], 3), "--to", dest, "--overwrite"]) == 0
    assert sorted(os.listdir(dest)) == ["model.export.json", "model.pdparams"]
    with open(os.path.join(dest, "model.export.json")) as f:
        assert json.load(f)["range"]["epoch_no"] == 3


def test_export_refuses_a_directory_inside_a_job(root_copy, tmp_path, capsys):
    os.symlink(os.path.join(root_copy, JOB), str(tmp_path / "link"))
    for to in (ckpt_path(root_copy, 3), str(tmp_path / "link" / "x")):  # a committed checkpoint; through a link
        assert cli.main(["export", ckpt_path(root_copy, 3), "--to", to]) == 2
        assert "inside job directory" in capsys.readouterr().err
        assert not os.path.exists(os.path.join(to, "model.pdparams"))
    assert cli.main(["export", ckpt_path(root_copy, 3), "--to", os.path.join(root_copy, "exports")]) == 0


# -- errors -------------------------------------------------------------------
def test_clear_errors(trained, root_copy, tmp_path, capsys):
    root = trained["root"]

    def err(*argv):
        rc = cli.main([str(a) for a in argv])
        e = capsys.readouterr().err
        assert rc == 2, (argv, e)
        assert e.startswith("paddle-acp: error:"), e
        return e

    e = err("ls", root, "--job", "nope")
    assert "job 'nope' not found" in e and "jobs there: job1" in e and root in e
    assert "does not exist" in err("verify", str(tmp_path / "missing"))
    assert "does not exist" in err("gc", str(tmp_path / "missing"), "--keep", 1)
    assert "unsupported scheme" in err("ls", "nosuch://bucket/x")
    assert "ckpt-e9 does not exist" in err("inspect", ckpt_path(root, 9))
    e = err("inspect", root, "--job", JOB, "--range", "_range_7")
    assert "range '_range_7' not found" in e and RANGE in e
    assert "looks like a job directory" in err("ls", os.path.join(root, JOB))
    # an unreadable (damaged) manifest
    with open(data_path(root_copy, 3, "manifest.json"), "r+b") as f:
        f.seek(20)
        f.write(b"#")
    e = err("inspect", ckpt_path(root_copy, 3))
    assert "cannot read checkpoint" in e and "ckpt-e3" in e and "manifest" in e
    # ... which ls reports and a restart would skip
    assert cli.main(["ls", root_copy, "--json"]) == 0
    (rng,) = json.loads(capsys.readouterr().out)["jobs"][0]["ranges"]
    assert rng["restart_name"] == "ckpt-e2"
    assert rng["checkpoints"][0]["name"] == "ckpt-e3" and rng["checkpoints"][0]["status"] == "corrupt"
    shutil.rmtree(os.path.join(root_copy, JOB, "metrics"), ignore_errors=True)
    e = err("stats", root_copy, "--job", JOB)
    assert "no save metrics" in e and "trainer-*.jsonl" in e


# -- stats --------------------------------------------------------------------
def write_metrics(root, job="jobS", records=()):
    os.makedirs(os.path.join(root, job, "metrics"))
    with open(os.path.join(root, job, "job.json"), "w") as f:
        json.dump({"format": "paddle-acp/job", "version": 1, "job_id": job, "created": time.time() - 600}, f)
    with open(os.path.join(root, job, "metrics", "trainer-0.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write('{"time": 17')  # a torn last line (the trainer died while appending)


def synthetic_records(now):
    stalls = [0.010, 0.020, 0.300, 0.015, 0.025]
    return [
        {"time": now - 500 + 100 * i, "range": "_range_0", "number": i, "epoch": i, "step": None,
         "bytes": 1_000_000 * (i + 1), "stall_s": s, "persist_s": 0.5 + i, "throughput_mb_s": 2.0 * (i + 1),
         "ok": i != 3, **({"error": "disk full"} if i == 3 else {})}
        for i, s in enumerate(stalls)
    ]


def test_stats_of_the_training_run(readonly, trained):
    p = readonly["stats"]
    assert p.returncode == 0, describe(p)
    assert f"job {JOB} at {trained['root']}: {EPOCHS} save(s)" in p.stdout, p.stdout
    for what in ("blocked        median", "(training thread, per save)", "persist        median",
                 "throughput     - (no checkpoint of 64.0 MiB or more", "waited", "total written",
                 "last save", " ago)", "RANGE", "SKIPPED", RANGE):
        assert what in p.stdout, (what, p.stdout)


def test_the_training_runs_metrics_lines_are_records_byte_for_byte(trained):
    """Every line the library wrote in a real training run is a valid MetricsRecord (the reader's
    checks never reject what the writers write) and serializes back to the same bytes; one start
    record, one saved record per epoch with the fields of the save of a part (a one-process job's
    checkpoint is a one-part global checkpoint: rank 0 writes its part and commits it)."""
    with open(os.path.join(trained["root"], JOB, "metrics", "trainer-0.jsonl")) as f:
        lines = f.read().splitlines()
    recs = [MetricsRecord.from_line(line) for line in lines]
    assert [r.to_line() for r in recs] == lines
    assert [r.event for r in recs] == ["start"] + ["saved"] * EPOCHS, lines
    for e, r in enumerate(recs[1:]):
        doc = json.loads(r.to_line())
        assert set(doc) == {
            "event", "time", "pid", "range", "epoch", "step", "stall_s", "waited_s", "policy", "ok", "name",
            "rank", "committed", "bytes", "persist_s", "parts_wait_s"}, r
        assert (doc["name"], doc["epoch"], doc["step"], doc["rank"], doc["committed"], doc["ok"]) == (
            f"ckpt-e{e}", e, None, 0, True, True), r
        assert doc["range"] == RANGE and doc["bytes"] > 0


def test_stats_on_a_metrics_file(tmp_path, capsys):
    root = str(tmp_path / "m")
    now = time.time()
    write_metrics(root, records=synthetic_records(now))
    assert cli.main(["stats", root, "--job", "jobS"]) == 0
    out = capsys.readouterr().out
    assert "5 save(s), 1 FAILED" in out, out
    assert "median 20.0 ms, worst 300.0 ms (ckpt-2 of _range_0" in out, out
    assert "total written  10.5 MiB" in out, out  # the ok saves: 1+2+3+5 MB
    assert "ago)" in out and "1 unreadable or out-of-range line(s)" in out
    assert "throughput     - (no checkpoint of 64.0 MiB or more: smaller ones measure fixed cost)" in out, out
    assert "last failure" in out and "disk full" in out
    assert cli.main(["stats", root, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["count"] == 5 and doc["failed"] == 1 and doc["skipped_lines"] == 1
    assert doc["stall_median_s"] == pytest.approx(0.020) and doc["stall_worst_s"] == pytest.approx(0.300)
    assert doc["total_bytes"] == 11_000_000
    assert doc["throughput_median_mb_s"] is None  # tiny checkpoints: their time is fixed cost, not bandwidth
    assert doc["skipped"] == 0 and doc["restarts"] == 0
    assert 95 < doc["since_last_save_s"] < 3600

    png = str(tmp_path / "stats.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert cli.main(["stats", root, "--plot", png]) == 2
        e = capsys.readouterr().err
        assert "--plot needs matplotlib" in e and "pip install matplotlib" in e
        assert not os.path.exists(png)
    else:
        assert cli.main(["stats", root, "--plot", png]) == 0
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_read_and_summarize_metrics(tmp_path):
    root = str(tmp_path / "m")
    now = time.time()
    write_metrics(root, records=synthetic_records(now))
    recs, bad = tools.read_metrics(open_storage(root), "jobS")
    assert len(recs) == 5 and bad == 1 and all(r["trainer"] == 0 for r in recs)
    s = tools.summarize_metrics(recs, now=now)
    assert s["last_save"] == pytest.approx(now - 100) and s["since_last_save_s"] == pytest.approx(100)
    assert s["ranges"]["_range_0"]["count"] == 5


# -- progress and helpers -----------------------------------------------------
class FakeTTY:
    def __init__(self, tty):
        self.tty, self.text = tty, ""

    def isatty(self):
        return self.tty

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_progress_only_on_a_terminal(monkeypatch):
    monkeypatch.delenv("PADDLE_ACP_PROGRESS", raising=False)
    for tty in (True, False):
        s = FakeTTY(tty)
        with tools.Progress("verifying x", 2 << 20, stream=s) as p:
            p.update(1 << 20)
            p.update(1 << 20)
        assert ("100%" in s.text) is tty, s.text
    s = FakeTTY(False)
    monkeypatch.setenv("PADDLE_ACP_PROGRESS", "1")
    with tools.Progress("x", 10, stream=s) as p:
        p.update(10)
    assert "100%" in s.text


def test_verify_shows_progress_when_forced(trained, monkeypatch, capsys):
    monkeypatch.setenv("PADDLE_ACP_PROGRESS", "1")
    assert cli.main(["verify", trained["root"]]) == 0
    err = capsys.readouterr().err
    assert "verifying" in err and "ckpt-e3" in err and "100%" in err
    monkeypatch.delenv("PADDLE_ACP_PROGRESS")
    assert cli.main(["verify", trained["root"]]) == 0  # stderr is not a terminal here
    assert capsys.readouterr().err == ""


def test_tensor_kinds_follow_paddle_naming():
    names = ["w", "b", "w_moment1_0", "w_beta1_pow_acc_0", "b_velocity_0", "learning_rate_0",
             "batch_norm_0.w_1", "batch_norm_0.w_0", "batch_norm_0.w_0_velocity_0", "emb", "@LR_DECAY_COUNTER@"]
    kinds = tools.tensor_kinds(names)
    assert [n for n in names if kinds[n] == "param"] == ["w", "b", "batch_norm_0.w_1", "batch_norm_0.w_0", "emb"]
    assert kinds["learning_rate_0"] == "lr" and kinds["@LR_DECAY_COUNTER@"] == "lr"
    # where paddle.static.save puts the learning rate: .pdparams under PIR, .pdopt under the legacy IR
    assert tools.export_split(names, "pir")["learning_rate_0"] == "pdparams"
    assert tools.export_split(names, "legacy")["learning_rate_0"] == "pdopt"
    assert tools.export_split(names, "legacy")["w"] == "pdparams"


def test_checkpoint_references():
    with pytest.raises(tools.ToolError, match="does not exist"):
        tools.resolve_checkpoint("/definitely/not/here/job/range/_range_0/ckpt-1")
    m = refs.REF_RE.match("/a/b/job1/range/_range_0/ckpt-12/")
    assert m and (m.group("root"), m.group("job"), m.group("range"), m.group("n")) == ("/a/b", "job1", "_range_0", "12")
    assert tools.uri_join("s3://bkt/p?endpoint_override=x", "j/range") == "s3://bkt/p/j/range?endpoint_override=x"


# -- remote storage (real S3 / HDFS servers, skipped where they cannot run) -----
try:
    from support.server_fixtures import hdfs_server, s3_server  # noqa: F401  (pytest fixtures)
except Exception as exc:  # tests/support/servers.py missing or broken: the remote tests skip
    _SERVERS_ERROR = str(exc)

    @pytest.fixture(scope="module")
    def s3_server():
        pytest.skip(f"server fixtures unavailable: {_SERVERS_ERROR}")

    @pytest.fixture(scope="module")
    def hdfs_server():
        pytest.skip(f"server fixtures unavailable: {_SERVERS_ERROR}")


def _remote_files(fs, base):
    import pyarrow.fs as pafs

    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted((i.path[len(base):], i.size) for i in infos if i.type == pafs.FileType.File)


def _remote_round(uri, fs, base, trained, tmp_path, capsys):
    """Every command against a copy of the trained tree on remote storage, in-process."""
    import pyarrow.fs as pafs

    pafs.copy_files(trained["root"], base, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    ck3 = f"{uri}/{JOB}/range/{RANGE}/ckpt-e3"

    assert cli.main(["ls", uri, "--json"]) == 0
    (rng,) = json.loads(capsys.readouterr().out)["jobs"][0]["ranges"]
    assert rng["restart_name"] == "ckpt-e3" and [c["name"] for c in rng["checkpoints"]] == ["ckpt-e3", "ckpt-e2", "ckpt-e1"]
    assert all(c["status"] == "ok" and c["committed"] for c in rng["checkpoints"])
    assert cli.main(["verify", uri]) == 0
    assert "OK: 3 checkpoint(s) verified" in capsys.readouterr().out
    assert cli.main(["inspect", ck3]) == 0
    out = capsys.readouterr().out
    assert "m0_fc1.w" in out and "LR scheduler: last_epoch=4" in out
    assert cli.main(["stats", uri, "--job", JOB]) == 0
    assert f"{EPOCHS} save(s)" in capsys.readouterr().out
    dest = str(tmp_path / "export")
    assert cli.main(["export", ck3, "--to", dest]) == 0
    capsys.readouterr()
    import pickle

    with open(os.path.join(dest, "model.pdparams"), "rb") as f:
        exported = pickle.load(f)
    with np.load(os.path.join(trained["out"], "final.npz")) as z:
        for n in z.files:
            assert np.array_equal(exported[n], z[n]), n
    assert cli.main(["ls", uri, "--job", "nope"]) == 2
    assert "job 'nope' not found" in capsys.readouterr().err

    before = _remote_files(fs, base)
    assert cli.main(["gc", uri, "--keep", "1", "--dry-run"]) == 0
    assert _remote_files(fs, base) == before
    assert cli.main(["gc", uri, "--keep", "1"]) == 0
    capsys.readouterr()
    left = {p.split("/")[4] for p, _ in _remote_files(fs, base) if "/range/" in p}
    assert left == {"ckpt-e3"}, left

    # a flipped byte in the only checkpoint: verify fails, naming it
    data = f"{base}/{JOB}/range/{RANGE}/ckpt-e3/rank-0/tensors.bin"
    with fs.open_input_file(data) as f:
        raw = bytearray(f.read())
    raw[tensor_offset(trained["root"], 3, "m0_fc1.b")] ^= 0xFF
    with fs.open_output_stream(data) as f:
        f.write(bytes(raw))
    assert cli.main(["verify", uri]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "ckpt-e3" in out and "STOPS with NoUsableCheckpointError" in out, out
    assert "START FROM SCRATCH" not in out  # a restart no longer starts from scratch when checkpoints exist


def test_remote_s3(s3_server, trained, tmp_path, capsys, monkeypatch):
    for k, v in s3_server.client_env().items():
        monkeypatch.setenv(k, v)
    fs = s3_server.filesystem()
    prefix = f"tools-{os.getpid()}-{int(time.time())}"
    _remote_round(f"s3://{s3_server.bucket}/{prefix}", fs, f"{s3_server.bucket}/{prefix}", trained, tmp_path, capsys)


def test_remote_hdfs(hdfs_server, trained, tmp_path, capsys):
    fs = hdfs_server.filesystem()
    base = f"/tools-{os.getpid()}-{int(time.time())}"
    _remote_round(f"hdfs://{hdfs_server.host}:{hdfs_server.port}{base}", fs, base, trained, tmp_path, capsys)


# -- the console script never imports Paddle for the tools ------------------------------------------
def console_script():
    path = os.path.join(os.path.dirname(sys.executable), "paddle-acp")
    assert os.path.exists(path), f"no paddle-acp console script next to {sys.executable} (pip install -e .)"
    return path


def imported_modules(stderr):
    """The module names of ``PYTHONPROFILEIMPORTTIME`` lines ("import time: self | cumulative | name")."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_the_tools_and_every_help_never_import_paddle(trained, tmp_path):
    root = trained["root"]
    commands = [["--help"], ["ls", "--help"], ["run", "--help"], ["stats", "--help"], ["ls", root],
                ["ls", root, "--json", "--verify"], ["inspect", ckpt_path(root, 3)], ["verify", root],
                ["gc", root, "--keep", "1", "--dry-run"], ["stats", root], ["export", ckpt_path(root, 3), "--to", str(tmp_path)]]
    procs = cli_many(*[("!", console_script(), *c) for c in commands], env=child_env(PYTHONPROFILEIMPORTTIME=1))
    for c, p in zip(commands, procs):
        assert p.returncode == 0, describe(p)
        mods = imported_modules(p.stderr)
        assert "paddle_acp.cli" in mods, describe(p)  # the import profile was read
        assert not [m for m in mods if m == "paddle" or m.startswith("paddle.")], c
    assert "ckpt-e3" in procs[4].stdout and os.path.exists(tmp_path / "model.pdparams")
    # the same tools through the package (`python -m paddle_acp`) gate as `import paddle_acp` does
    p = run_cli("ls", root, env=child_env(PYTHONPROFILEIMPORTTIME=1))
    assert p.returncode == 0 and "paddle" in imported_modules(p.stderr), describe(p)


def test_without_a_usable_paddle_the_tools_work_and_everything_else_refuses(trained, tmp_path):
    fake = tmp_path / "fake" / "paddle"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('libcudart.so.12: cannot open shared object file')\n")
    env = child_env()
    env["PYTHONPATH"] = str(tmp_path / "fake") + os.pathsep + env["PYTHONPATH"]
    why = "Paddle is installed but failed to import: libcudart.so.12: cannot open shared object file"
    ls, verify, run, imp, late = cli_many(
        ("!", console_script(), "ls", trained["root"]),
        ("!", console_script(), "verify", trained["root"]),
        ("!", console_script(), "run", "--checkpoint", str(tmp_path / "ck"), TRAIN, "--out", str(tmp_path / "o")),
        ("!", sys.executable, "-c", "import paddle_acp"),
        # a process that deferred the gate still gets it at the first name that needs Paddle
        ("!", sys.executable, "-c", "import paddle_acp_cli, paddle_acp\ntry:\n    paddle_acp.train_epoch_range\n"
         "except ImportError as e:\n    print(type(e).__name__, e)\n"),
        env=env)
    assert ls.returncode == 0 and "ckpt-e3" in ls.stdout, describe(ls)
    assert verify.returncode == 0 and "OK: 3 checkpoint(s) verified" in verify.stdout, describe(verify)
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1].startswith(f"paddle-acp: error: {why}; paddle-acp supports"), describe(run)
    assert not os.path.exists(tmp_path / "ck")
    assert imp.returncode == 1, describe(imp)
    assert imp.stderr.strip().splitlines()[-1].startswith(f"paddle_acp.errors.UnsupportedPaddleError: {why}"), describe(imp)
    assert late.returncode == 0 and late.stdout.startswith(f"UnsupportedPaddleError {why}"), describe(late)


def test_a_bad_log_level_is_a_one_line_error_of_the_console_script(trained):
    p = run_cli("!", console_script(), "ls", trained["root"], env=child_env(PADDLE_ACP_LOG_LEVEL="loud"))
    assert p.returncode == 2, describe(p)
    assert p.stderr.strip() == ("paddle-acp: error: PADDLE_ACP_LOG_LEVEL='loud' is not a log level "
                                "(use one of DEBUG, INFO, WARNING, ERROR, CRITICAL)"), describe(p)


# -- one boolean parser (config) for every boolean variable ----------------------------------------
def _readers(raw):
    """Each boolean variable read through its own entry point: (name, value or the ConfigError)."""
    out = []
    for name, read in (("PADDLE_ACP_ASYNC", lambda env: config.from_env(env).async_save),
                       ("PADDLE_ACP_EXIT_ON_PREEMPT", config.exit_on_preempt_from_env),
                       ("PADDLE_ACP_PROGRESS", config.progress_from_env)):
        env = {"PADDLE_ACP_CHECKPOINT_URI": "/tmp/x", name: raw}
        try:
            out.append((name, read(env)))
        except ConfigError as exc:
            out.append((name, exc))
    return out


@given(st.sampled_from(config.TRUE_WORDS + config.FALSE_WORDS), st.sampled_from(["", " ", "\t"]), st.booleans())
def test_every_boolean_variable_reads_the_same_words(word, pad, upper):
    raw = pad + (word.upper() if upper else word) + pad
    want = word in config.TRUE_WORDS
    assert config.parse_bool(raw, "X", not want) is want
    assert [v for _, v in _readers(raw)] == [want, want, want]


@given(st.text(max_size=12).filter(lambda s: s.strip() and s.strip().lower() not in
                                   config.TRUE_WORDS + config.FALSE_WORDS + ("always", "never", "auto")))
def test_every_boolean_variable_refuses_other_words_naming_itself(raw):
    for name, v in _readers(raw):
        assert isinstance(v, ConfigError) and str(v).startswith(f"{name}={raw!r} is not a boolean (use 1 or 0"), (name, v)


def test_unset_booleans_take_their_defaults():
    assert [v for _, v in _readers("")] == [True, True, None]  # PROGRESS unset: on a terminal only
    assert config.progress_from_env({"PADDLE_ACP_PROGRESS": "Always"}) is True
    assert config.progress_from_env({"PADDLE_ACP_PROGRESS": "never"}) is False


def test_job_directories_follow_the_job_id_rule(tmp_path, capsys):
    """The tools list a directory as a job only when its name is a valid job id (config's rule)."""
    for name in ("ok-job", "a..b", "-dash", "x" * 201):
        os.makedirs(tmp_path / name / "range")
    assert tools.discovery.list_jobs(open_storage(str(tmp_path))) == ["ok-job"]
    for bad in ("a..b", "-dash", "x/y"):
        assert config.is_valid_job_id(bad) is False
        assert cli.main(["ls", str(tmp_path), f"--job={bad}"]) == 2
        assert f"{bad!r} is not a valid job id" in capsys.readouterr().err


# -- checkpoints of several ranks (ckpt-e<E>[-s<S>]/rank-<k>/ + global.json) ---------------------------
def _rank_snapshot(rank, epoch):
    from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
    from paddle_acp.format.manifest import RangeRecord

    ts = [TensorData("w", "float32", np.full(5, 10 * rank + epoch, dtype="float32")),
          TensorData("w_moment1_0", "float32", np.full(5, -rank, dtype="float32"))]
    prog = ProgramSnapshot("fp-shared", "pir: test", ts, {"last_epoch": epoch})
    return Snapshot(RangeRecord(RANGE, epoch, 100, None), [prog], None, "3.3.1", "pir")


def _save_ranks(root, epoch, ranks=(0, 1), world=2):
    """The ranks write their parts of one position; rank 0 (in a thread) commits when all arrived."""
    import threading

    from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer

    def gck(rank):
        g = GlobalCheckpointer(open_storage(str(root)), JOB, RANGE, rank, world, 100, 0.2 if len(ranks) < world else 60.0)
        g.poll_interval = 0.005
        return g

    t = None
    if 0 in ranks:
        t = threading.Thread(target=lambda: gck(0).save(_rank_snapshot(0, epoch), "per-rank"))
        t.start()
    for r in ranks:
        if r:
            gck(r).save(_rank_snapshot(r, epoch), "per-rank")
    if t is not None:
        t.join()


@pytest.fixture
def ranks_root(tmp_path):
    """ckpt-0 of one writer (epoch 0: an earlier release's numbered checkpoint), ckpt-e1..e3 of two ranks, ckpt-e4 abandoned (rank 1 only), and
    ckpt-e0 a link to a directory outside the job."""
    root = tmp_path / "ranks"
    write_numbered(open_storage(str(root)), 0, _rank_snapshot(0, 0), JOB, RANGE)
    for e in (1, 2, 3):
        _save_ranks(root, e)
    _save_ranks(root, 4, ranks=(1,))
    victim = tmp_path / "victim" / "ckpt-e0"
    victim.mkdir(parents=True)
    (victim / "global.json").write_text("{}")
    os.symlink(victim, root / JOB / "range" / RANGE / "ckpt-e0")
    return root


def test_inspect_and_export_read_one_rank_of_a_checkpoint_of_several_ranks(ranks_root, tmp_path, capsys):
    root = str(ranks_root)
    assert cli.main(["inspect", root]) == 0
    out = capsys.readouterr().out
    assert f"{root}/{JOB}/range/{RANGE}/ckpt-e3" in out and "restart loads it  yes" in out, out
    assert "written by        2 ranks (per-rank); this is the part of rank 0; --rank 1 shows another" in out, out
    assert "every checksum verified" in out and "w_moment1_0  optimizer" in out, out
    assert cli.main(["inspect", f"{root}/{JOB}/range/{RANGE}/ckpt-e2", "--rank", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["part"] == {"rank": 1, "ranks": [0, 1], "world_size": 2, "mode": "per-rank"}
    assert doc["restart"] is False and doc["range"]["epoch_no"] == 2 and doc["data_status"] == "ok"
    assert cli.main(["inspect", f"{root}/{JOB}/range/{RANGE}/ckpt-e2", "--rank", "5"]) == 2
    assert "has no part of rank 5 (it has the parts of ranks 0, 1): choose one with --rank" in capsys.readouterr().err
    assert cli.main(["inspect", f"{root}/{JOB}/range/{RANGE}/ckpt-0", "--rank", "1"]) == 2
    assert "was written by one process" in capsys.readouterr().err
    assert cli.main(["inspect", f"{root}/{JOB}/range/{RANGE}/ckpt-e4"]) == 2  # abandoned: never committed
    assert "ckpt-e4: global.json is missing (checkpoint not committed)" in capsys.readouterr().err

    for rank in (0, 1):
        dest = str(tmp_path / f"export-{rank}")
        assert cli.main(["export", f"{root}/{JOB}/range/{RANGE}/ckpt-e3", "--rank", str(rank), "--to", dest,
                         "--optimizer-state"]) == 0
        capsys.readouterr()
        import pickle

        with open(os.path.join(dest, "model.pdparams"), "rb") as f:
            params = pickle.load(f)
        with open(os.path.join(dest, "model.pdopt"), "rb") as f:
            opt = pickle.load(f)
        assert sorted(params) == ["w"] and np.array_equal(params["w"], np.full(5, 10 * rank + 3, dtype="float32"))
        assert sorted(opt) == ["w_moment1_0"] and np.array_equal(opt["w_moment1_0"], np.full(5, -rank, dtype="float32"))
        with open(os.path.join(dest, "model.export.json")) as f:
            assert json.load(f)["rank"] == rank
    # a damaged part: export refuses, naming it
    data = ranks_root / JOB / "range" / RANGE / "ckpt-e3" / "rank-1" / "tensors.bin"
    flip_byte(str(data), 0)
    assert cli.main(["export", f"{root}/{JOB}/range/{RANGE}/ckpt-e3", "--rank", "1", "--to", str(tmp_path / "x")]) == 2
    assert "it is corrupt (rank-1/tensors.bin: checksum mismatch in tensor 'w'" in capsys.readouterr().err


def test_gc_deletes_checkpoints_of_several_ranks_global_manifest_first_never_through_a_link(ranks_root, tmp_path,
                                                                                          capsys, monkeypatch):
    root = str(ranks_root)
    rdir = ranks_root / JOB / "range" / RANGE
    assert cli.main(["gc", root, "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    actions = {line.split()[2]: line.split()[3] for line in out.splitlines()[2:-1]}
    assert actions == {"ckpt-e4": "skip", "ckpt-e3": "keep", "ckpt-e2": "would", "ckpt-e1": "would", "ckpt-0": "would"}, out

    # a deletion that fails half-way leaves no directory that looks committed
    from paddle_acp.storage.base import Storage

    real = Storage.delete_dir

    def fail_on_e2(self, path):
        if path.endswith("ckpt-e2"):
            raise StorageError("injected: the disk went away")
        return real(self, path)

    monkeypatch.setattr(Storage, "delete_dir", fail_on_e2)
    assert cli.main(["gc", root, "--keep", "1"]) == 2
    capsys.readouterr()
    assert not (rdir / "ckpt-e2" / "global.json").exists() and (rdir / "ckpt-e2" / "rank-0").is_dir()
    monkeypatch.setattr(Storage, "delete_dir", real)
    assert cli.main(["ls", root, "--json"]) == 0
    (rng,) = json.loads(capsys.readouterr().out)["jobs"][0]["ranges"]
    e2 = next(c for c in rng["checkpoints"] if c["name"] == "ckpt-e2")
    assert e2["committed"] is False and e2["reason"] == "no global manifest (not committed, or abandoned)"

    assert cli.main(["gc", root, "--keep", "1", "--leftover-age", "0"]) == 0
    capsys.readouterr()
    assert sorted(os.listdir(rdir)) == ["ckpt-e0", "ckpt-e3"]
    assert os.path.islink(rdir / "ckpt-e0") and (tmp_path / "victim" / "ckpt-e0" / "global.json").exists()
    assert cli.main(["verify", root]) == 0
