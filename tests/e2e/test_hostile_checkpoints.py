"""Hostile checkpoints and stray entries (issue 19, part A), end to end.

Each case crafts the newest checkpoint of a real training run the way an
attacker (or a confused operator) would: the manifest edited with its checksum
recomputed, a symbolic link, a stray file or directory, an unreadable
checkpoint. Then the real training script is restarted against it: it must
resume from the previous valid checkpoint, bit for bit (or, where only the live
program can tell, stop with a clear CheckpointError naming what differs), and
the six operator tools must answer with a clear one-line error or a report,
never a traceback.

Cost: one 3-epoch base run (~2 s) and one restart (~2 s) per case.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest
from support.e2e import JOB_ID, SCRIPT, load_result, read_log, run_script, script_env
from support.newest import recommit
from support.script_range import EPOCHS, RANGE, as_unprivileged, base_run, cdir, copy_base, pdir, rdir, train

from paddle_acp import cli
from paddle_acp.format.layout import GLOBAL_NAME
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME, seal


def read_doc(root, n):
    with open(os.path.join(pdir(root, n), MANIFEST_NAME)) as f:
        doc = json.load(f)
    doc.pop("checksum")
    return doc


def write_doc(root, n, doc):
    with open(os.path.join(pdir(root, n), MANIFEST_NAME), "wb") as f:
        f.write(seal(doc))
    recommit(cdir(root, n))


def write_text_sealed(root, n, text):
    """Write a manifest given as canonical JSON text (too deep or too odd for json.dumps),
    with the checksum an attacker computes over that text."""
    raw = text[:-1] + ',"checksum":%d}' % (zlib.crc32(text.encode()) & 0xFFFFFFFF)
    with open(os.path.join(pdir(root, n), MANIFEST_NAME), "w") as f:
        f.write(raw)
    recommit(cdir(root, n))


def canonical(doc):
    return json.dumps(doc, sort_keys=True, allow_nan=False, separators=(",", ":"))


def edit(fn):
    def go(root):
        doc = read_doc(root, 2)
        fn(doc)
        write_doc(root, 2, doc)
    return go


def tensor(doc, name):
    return next(t for t in doc["programs"][0]["tensors"] if t["name"] == name)


# -- the crafted cases ------------------------------------------------------------
def nested(root):
    doc = read_doc(root, 2)
    doc["extra"] = {"x": "PLACEHOLDER"}
    write_text_sealed(root, 2, canonical(doc).replace('"PLACEHOLDER"', "[" * 100000 + "]" * 100000))


def created_huge(root):
    doc = read_doc(root, 2)
    doc["created"] = 10**400
    write_doc(root, 2, doc)


def shape_absurd(doc):
    t = tensor(doc, "m0_fc1.b")
    t.update(shape=[0, 10**30], nbytes=0, crc32c=0)


def rng_seed(doc):
    doc["rng"]["paddle"][0][1] = 2**70


def python_index(doc):
    doc["rng"]["python"][1][624] = 10**6


def numpy_gauss(doc):
    doc["rng"]["numpy"][4] = "x"


def extra_generator(doc):
    doc["rng"]["paddle"].append([0] + doc["rng"]["paddle"][0][1:])


def lr_garbage(doc):
    doc["programs"][0]["lr_scheduler"] = {"last_epoch": "x", "garbage": [1, 2]}


def big_manifest(root):
    doc = read_doc(root, 2)
    doc["extra"] = {"pad": ["y" * 1000] * 6000}  # 6 MB for 8 KB of tensors
    write_doc(root, 2, doc)


def symlink_to_other_job(root):
    other = os.path.join(root, "other", "range", RANGE)
    os.makedirs(other)
    shutil.copytree(cdir(root, 2), os.path.join(other, "ckpt-e2"))
    shutil.rmtree(cdir(root, 2))
    os.symlink(os.path.join(other, "ckpt-e2"), cdir(root, 2))


def manifest_is_a_directory(root):
    os.remove(os.path.join(pdir(root, 2), MANIFEST_NAME))
    os.mkdir(os.path.join(pdir(root, 2), MANIFEST_NAME))


def data_is_a_symlink(root):
    data = os.path.join(pdir(root, 2), DATA_NAME)
    shutil.copy(data, os.path.join(root, "elsewhere.bin"))
    os.remove(data)
    os.symlink(os.path.join(root, "elsewhere.bin"), data)


# Each crafted manifest comes with a global.json re-sealed over it (recommit), so that the crafted
# manifest itself is what a restart and the tools read.
# name -> (craft, expected): "fallback" resumes from ckpt-e1 (epoch 2 trained again, bit-identical)
# and the tools report ckpt-e2 as bad; "fallback-foreign": the same, but ckpt-e2 is not a checkpoint
# to the tools (a link: ignored); "restored-warned": ckpt-e2 is restored (the job was finished), with
# one warning naming what of it does not fit this process; ("error", regex): only the live program can tell, and there
# is no fallback: the restart stops with that CheckpointError.
CASES = {
    "nested 100000 deep": (nested, "fallback"),
    "created 10**400": (created_huge, "fallback"),
    "created 1e300": (edit(lambda d: d.update(created=1e300)), "fallback"),
    "shape [0, 10**30]": (edit(shape_absurd), "fallback"),
    "RNG seed 2**70": (edit(rng_seed), "fallback"),
    "Python RNG index 10**6": (edit(python_index), "fallback"),
    "NumPy gauss 'x'": (edit(numpy_gauss), "fallback"),
    "Python gauss_next 10**400": (edit(lambda d: d["rng"]["python"].__setitem__(2, 10**400)), "fallback"),
    "an extra generator": (edit(extra_generator), "restored-warned"),
    # the part's range says another epoch than its position (a restart would resume at it): epochs trained twice
    "range epoch -1 at ckpt-e2": (edit(lambda d: d["range"].update(epoch_no=-1)), "fallback"),
    "range epoch 7 at ckpt-e2": (edit(lambda d: d["range"].update(epoch_no=7)), "fallback"),
    "range step 3 at ckpt-e2": (edit(lambda d: d["range"].update(step=3)), "fallback"),
    "garbage LR scheduler state": (edit(lr_garbage), "fallback"),
    "6 MB manifest for 8 KB of data": (big_manifest, "fallback"),
    "ckpt-e2 a symlink to another job's": (symlink_to_other_job, "fallback-foreign"),
    "manifest.json a directory": (manifest_is_a_directory, "fallback"),
    "tensors.bin a symlink": (data_is_a_symlink, "fallback"),
    "a tensor dropped": (edit(lambda d: d["programs"][0]["tensors"].remove(tensor(d, "m0_fc1.b"))),
                         ("error", r"missing from it: m0_fc1\.b")),
    "a tensor renamed": (edit(lambda d: tensor(d, "m0_fc2.w").update(name="m0_fc9.w")),
                         ("error", r"missing from it: m0_fc2\.w.*not variables of this program: m0_fc9\.w")),
    "a shape swapped": (edit(lambda d: tensor(d, "m0_fc1.w").update(shape=[32, 16])),
                        ("error", r"m0_fc1\.w is float32\[16, 32\] here, float32\[32, 16\] in the checkpoint")),
    "a dtype swapped": (edit(lambda d: tensor(d, "m0_fc1.w").update(dtype="int32")),
                        ("error", r"m0_fc1\.w is float32\[16, 32\] here, int32\[16, 32\] in the checkpoint")),
    "LR scheduler keys of another scheduler": (
        edit(lambda d: d["programs"][0]["lr_scheduler"].update(milestones=[1, 2])),
        ("error", r"LR scheduler state has other keys.*milestones")),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A real 3-epoch run, a checkpoint per epoch (ckpt-e0..e2): the uninterrupted reference."""
    return base_run(tmp_path_factory.mktemp("hostile"))


def run_tools(root, capsys):
    """The six tools in this process: (command, exit status, stdout, stderr) each.
    An exception escaping cli.main would be the traceback a user sees."""
    res = []
    commands = [
        ["ls", root],
        ["ls", root, "--verify", "--json"],
        ["inspect", cdir(root, 2)],
        ["inspect", root, "--job", JOB_ID],
        ["verify", root, "--job", JOB_ID],
        ["gc", root, "--keep", "1", "--dry-run", "--job", JOB_ID],
        ["export", cdir(root, 2), "--to", os.path.join(root, "..", "export")],
        ["stats", root, "--job", JOB_ID],
    ]
    for args in commands:
        capsys.readouterr()
        rc = cli.main(args)
        out, err = capsys.readouterr()
        assert "Traceback" not in err, (args, err)
        assert rc in (0, 1, 2), (args, rc)
        if rc == 2:
            assert len(err.strip().splitlines()) == 1 and err.startswith("paddle-acp: error: "), (args, err)
        res.append((args[0], rc, out, err))
    return res


@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_newest_checkpoint(base, tmp_path, capsys, case):
    craft, expected = CASES[case]
    root, out = copy_base(base, tmp_path)
    # the run trained epochs 0-2; keep only what the first two epochs logged, as if killed after ckpt-e1
    # had been written and ckpt-e2 replaced by the crafted one
    entries = read_log(out)
    with open(os.path.join(out, "losses.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries[:2])
    craft(root)

    tools = run_tools(root, capsys)
    by = {}
    for name, rc, stdout, err in tools:
        by.setdefault(name, []).append((rc, stdout, err))
    if expected in ("fallback", "fallback-foreign"):
        ls_rc, ls_out, _ = by["ls"][0]
        assert ls_rc == 0 and re.search(r"a restart loads ckpt-e1\b", ls_out), ls_out
        verify_rc, verify_out, _ = by["verify"][0]
        if expected == "fallback":
            assert verify_rc == 1 and "fall back to ckpt-e1" in verify_out, verify_out
        else:
            assert verify_rc == 0 and "ckpt-e2" not in verify_out, verify_out
        ins_rc, ins_out, ins_err = by["inspect"][1]  # the one a restart loads
        assert ins_rc == 0 and re.search(r"^checkpoint\s+\S+/ckpt-e1$", ins_out, re.M), (ins_out, ins_err)
        assert re.search(r"^epoch\s+1 ", ins_out, re.M), ins_out
        assert re.search(r"^restart loads it\s+yes$", ins_out, re.M), ins_out
        rc, ins_out, ins_err = by["inspect"][0]  # the crafted one: refused, or shown as not loaded
        assert rc == 2 or re.search(r"^restart loads it\s+no \(a restart loads ckpt-e1\)$", ins_out, re.M), (ins_out, ins_err)

    # an error case trains on (5 epochs) so that the program runs and meets its checkpoint
    fallback = isinstance(expected, str)
    epochs = EPOCHS if fallback else EPOCHS + 2
    p = run_script(out, root, "pir", "--epochs", epochs, env={"PADDLE_ACP_ASYNC": "0", "PADDLE_ACP_MAX_TO_KEEP": "1"})
    if expected == "restored-warned":
        assert p.returncode == 0, p.stderr[-3000:]
        assert len(re.findall(r"Ignored from the checkpoint: device 0", p.stderr)) == 1, p.stderr[-3000:]
        _, params = load_result(out)
        for n in base["reference"][1]:
            assert np.array_equal(params[n], base["reference"][1][n]), n
    elif fallback:
        assert p.returncode == 0, p.stderr[-3000:]
        assert "resumed at epoch 2" in p.stdout, p.stdout
        said = r"ignoring .*/ckpt-e2: a symbolic link" if expected == "fallback-foreign" else r"skipping checkpoint ckpt-e2 of .*: "
        assert len(re.findall(said, p.stderr)) == 1, p.stderr[-3000:]  # one warning naming it and the cause
        losses, params = load_result(out)
        ref_losses, ref_params = base["reference"]
        assert sorted(losses) == sorted(ref_losses)
        for k in ref_losses:
            assert {a: b for a, b in losses[k].items() if a != "pid"} == {a: b for a, b in ref_losses[k].items() if a != "pid"}
        for n in ref_params:
            assert np.array_equal(params[n], ref_params[n]), n
    else:
        _, pattern = expected
        assert p.returncode != 0, p.stdout
        last = p.stderr.strip().splitlines()[-1]
        # names the crafted checkpoint, ckpt-e2 (by its path; "checkpoint <number> (<path>)" today)
        assert re.match(r"paddle_acp\.errors\.CheckpointError: checkpoint (\d+ \()?\S*\bckpt-e2\)? cannot restore ", last), last
        assert re.search(pattern, last), last
        assert "Nothing was restored" in last and "PADDLE_JOB_ID" in last
    if case == "ckpt-e2 a symlink to another job's":
        # retention (max_to_keep 1) ran after the new save: nothing deleted through the link
        other = os.path.join(root, "other", "range", RANGE, "ckpt-e2")
        assert os.path.isfile(os.path.join(other, GLOBAL_NAME))
        assert os.path.isfile(os.path.join(other, "rank-0", MANIFEST_NAME))
        assert os.path.isfile(os.path.join(other, "rank-0", DATA_NAME))
        assert os.path.islink(cdir(root, 2))


# -- stray entries (item 9) -------------------------------------------------------
# the old layout's names (ckpt-N, still listed and restored) and the one-part layout's (ckpt-eE)
STRAYS = ["dir ckpt-999999999999999999", "file ckpt-3", "dir ckpt-0007", "link ckpt-3",
          "dir ckpt-e9999999999999", "dir ckpt-e0007"]


@pytest.mark.parametrize("stray", STRAYS)
def test_a_stray_entry_never_stops_checkpointing(base, tmp_path, capsys, stray):
    """A stray entry under a checkpoint's name is foreign: saves go on past it, every later
    save is visible, and a restart resumes from the newest."""
    root, out = copy_base(base, tmp_path)
    kind, name = stray.split()
    path = os.path.join(rdir(root), name)
    if kind == "dir":
        os.mkdir(path)
    elif kind == "file":
        with open(path, "w") as f:
            f.write("not a checkpoint\n")
    else:  # to another job's checkpoint
        os.makedirs(os.path.join(root, "other"))
        shutil.copytree(cdir(root, 0), os.path.join(root, "other", "ckpt-e0"))
        os.symlink(os.path.join(root, "other", "ckpt-e0"), path)
    p = run_script(out, root, "pir", "--epochs", EPOCHS + 3, env={"PADDLE_ACP_ASYNC": "0", "PADDLE_ACP_MAX_TO_KEEP": "2"})
    assert p.returncode == 0 and "resumed at epoch 3" in p.stdout, p.stderr[-3000:]
    assert "save failed" not in p.stderr, p.stderr[-3000:]
    names = sorted(os.listdir(rdir(root)))
    # epochs 3..5 saved as ckpt-e3..e5, the newest 2 kept
    assert names == sorted(["ckpt-e4", "ckpt-e5", name]), names  # the stray is left alone
    if kind == "link":  # nothing written, nothing deleted through the link
        assert sorted(os.listdir(os.path.join(root, "other", "ckpt-e0"))) == [GLOBAL_NAME, "rank-0"]
        assert sorted(os.listdir(os.path.join(root, "other", "ckpt-e0", "rank-0"))) == sorted([DATA_NAME, MANIFEST_NAME])
    # a restart resumes from the newest save: nothing left to train
    p = run_script(out, root, "pir", "--epochs", EPOCHS + 3, env={"PADDLE_ACP_ASYNC": "0"})
    assert p.returncode == 0 and "range 0: nothing left to train" in p.stdout, p.stdout + p.stderr[-2000:]
    assert cli.main(["verify", root]) == 0
    assert cli.main(["gc", root, "--keep", "1"]) == 0
    assert os.path.lexists(path), "gc deleted a foreign entry"
    capsys.readouterr()


# -- unreadable checkpoints (item 10) ---------------------------------------------
def test_an_unreadable_checkpoint_is_skipped_not_fatal(base, tmp_path):
    """ckpt-e2 unreadable: the restart skips it and resumes from ckpt-e1; epoch 2's save cannot go where
    the unreadable directory is (one-part checkpoints are named by position), the next one goes on past it."""
    root, out = copy_base(base, tmp_path)
    prefix, owner = as_unprivileged()
    target = cdir(root, 2)
    if owner is not None:
        os.chown(target, owner, owner)
    os.chmod(target, 0)
    try:
        p = train(root, out, EPOCHS + 1, prefix=prefix)
        assert p.returncode == 0 and "resumed at epoch 2" in p.stdout, p.stdout + p.stderr[-3000:]
        assert re.search(r"skipping checkpoint ckpt-e2 of .*Permission denied", p.stderr), p.stderr[-3000:]
        assert re.search(r"saved checkpoint ckpt-e3 \(epoch 3\)", p.stderr), p.stderr[-3000:]
        assert "FINAL checkpoint" not in p.stderr, p.stderr[-3000:]
        # the tools report it and go on with the rest of the root
        env = script_env(root, "pir", {"PADDLE_ACP_ASYNC": "0"})
        tools = [sys.executable, "-m", "paddle_acp"]
        for args, want in ((["ls", root], 0), (["verify", root], 0), (["gc", root, "--keep", "1", "--dry-run"], 0)):
            t = subprocess.run(prefix + tools + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=120)
            assert t.returncode == want and "Traceback" not in t.stderr, (args, t.stdout, t.stderr)
            assert re.search(r"ckpt-e2 .*(CORRUPT: |BAD: |keep ).*Permission denied", t.stdout), (args, t.stdout)
            assert "ckpt-e3" in t.stdout, t.stdout  # the save of this run, listed past the unreadable one
    finally:
        os.chmod(target, 0o755)


def test_no_checkpoint_readable_is_an_error_not_a_fresh_start(base, tmp_path):
    root, out = copy_base(base, tmp_path)
    prefix, owner = as_unprivileged()
    for n in range(3):
        if owner is not None:
            os.chown(cdir(root, n), owner, owner)
        os.chmod(cdir(root, n), 0)
    try:
        p = train(root, out, EPOCHS, prefix=prefix)
        assert p.returncode != 0, p.stdout
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith("paddle_acp.errors.StorageError: no checkpoint of ") and "could not be read" in last, last
    finally:
        for n in range(3):
            os.chmod(cdir(root, n), 0o755)


# -- item 20: inspect reads what a restart reads -----------------------------------
def test_inspect_does_not_promise_a_corrupt_checkpoint(base, tmp_path, capsys):
    root, _ = copy_base(base, tmp_path)
    data = os.path.join(pdir(root, 2), DATA_NAME)
    with open(data, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    capsys.readouterr()
    assert cli.main(["inspect", cdir(root, 2)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^restart loads it\s+no \(a restart loads ckpt-e1\)$", out, re.M), out
    assert re.search(r"^data\s+tensors\.bin .*CORRUPT \(.*checksum mismatch", out, re.M), out
    assert cli.main(["inspect", cdir(root, 1), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["restart"] is True and doc["data_status"] == "verified"


# -- item 11: verify fails when nothing valid exists; item 12: job ids ------------------
def test_verify_fails_when_no_valid_checkpoint_exists(base, tmp_path, capsys):
    root, _ = copy_base(base, tmp_path)
    for n in range(3):  # as after a disk-full run: parts written, no global manifest committed
        os.remove(os.path.join(cdir(root, n), GLOBAL_NAME))
    capsys.readouterr()
    assert cli.main(["verify", root]) == 1
    out = capsys.readouterr().out
    assert "START FROM SCRATCH" in out and "OK:" not in out, out
    shutil.rmtree(rdir(root))
    assert cli.main(["verify", root, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


@pytest.mark.parametrize("job", ["job\n", "job\r", "jo\u0431", "-x" + "y" * 300])
def test_job_ids_are_matched_in_full(job, tmp_path, capsys):
    from paddle_acp import config
    from paddle_acp.errors import ConfigError

    with pytest.raises(ConfigError, match="not a valid job id"):
        config.validate_job_id(job)
    with pytest.raises(ConfigError, match="not a valid job id"):
        config.from_env({"PADDLE_ACP_CHECKPOINT_URI": str(tmp_path), "PADDLE_JOB_ID": job})
    os.makedirs(tmp_path / "real" / "range")
    assert cli.main(["ls", str(tmp_path), f"--job={job}"]) == 2
    assert "is not a valid job id" in capsys.readouterr().err


# -- item 11: a full disk ------------------------------------------------------------
# One checkpoint of the script with --hidden 2048 is ~471 KB (443 KB of tensors).
BIG = ["--hidden", "2048"]


def run_on_small_disk(tmp_path, size_kb, cmd, env):
    """Run ``cmd`` with its checkpoint root on a tmpfs of ``size_kb`` KB (a mount namespace of
    its own), then copy the root out; returns (CompletedProcess, copied root)."""
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (unshare -rm: {probe.stderr.decode().strip()})")
    disk, copy = str(tmp_path / "disk"), str(tmp_path / "copy")
    os.makedirs(disk)
    script = (f'mount -t tmpfs -o size={size_kb}k tmpfs "{disk}" || exit 99; "$@"; rc=$?; '
              f'cp -a "{disk}" "{copy}"; exit $rc')
    p = subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh"] + cmd, env={**env, "PADDLE_ACP_CHECKPOINT_URI": disk},
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode != 99, p.stderr
    return p, copy


def committed(root):
    """The committed checkpoints' epochs, oldest first: one-part checkpoints ``ckpt-eE`` with their global.json
    (and their part's manifest)."""
    d = rdir(root)
    return sorted(int(n[6:]) for n in os.listdir(d) if re.fullmatch(r"ckpt-e\d+", n)
                  and os.path.isfile(os.path.join(d, n, GLOBAL_NAME))
                  and os.path.isfile(os.path.join(d, n, "rank-0", MANIFEST_NAME)))


def test_a_full_disk_makes_space_by_deleting_the_oldest(tmp_path, capsys):
    """Room for 3 checkpoints (max_to_keep 3) but not for a 4th being written: the oldest is
    deleted to make space, every save commits, and the job ends with its final checkpoint."""
    out = str(tmp_path / "out")
    env = script_env(None, "pir", {"PADDLE_ACP_ASYNC": "0", "PADDLE_ACP_SAVE_INTERVAL": "0", "PADDLE_JOB_ID": JOB_ID})
    cmd = [sys.executable, SCRIPT, "--out", out, "--epochs", "6"] + BIG
    p, root = run_on_small_disk(tmp_path, 1700, cmd, env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "save failed" not in p.stderr, p.stderr[-3000:]
    made = re.findall(r"storage full while writing checkpoint ckpt-e(\d+) of .*: deleting the oldest checkpoint "
                      r"ckpt-e(\d+) to make space \(the newest valid one, ckpt-e(\d+), is kept\)", p.stderr)
    assert len(made) >= 3, p.stderr[-3000:]
    for writing, deleted, kept in made:  # the oldest deleted, the newest valid (the one before) kept
        assert int(deleted) < int(kept) == int(writing) - 1, made
    assert committed(root) == [3, 4, 5], committed(root)
    capsys.readouterr()
    assert cli.main(["verify", root]) == 0


def test_a_final_save_that_cannot_fit_is_an_error_and_the_newest_valid_is_kept(tmp_path, capsys):
    """Room for one checkpoint only: the newest valid one is never deleted to make space, so
    the later saves fail; the job says so at its end and `paddle-acp run` exits with 1."""
    out = str(tmp_path / "out")
    env = script_env(None, "pir", {"PADDLE_ACP_ASYNC": "0"})
    cmd = [sys.executable, "-m", "paddle_acp", "run", "--interval", "0", "--job-id", JOB_ID, "--checkpoint",
           str(tmp_path / "disk"), SCRIPT,
           "--out", out, "--epochs", "3", "--api", "paddle"] + BIG
    p, root = run_on_small_disk(tmp_path, 800, cmd, env)
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("paddle-acp: error: range _range_0 of job e2e: the FINAL checkpoint (epoch 2) was NOT saved"), last
    assert "a restart resumes from checkpoint ckpt-e0" in last and "No space left on device" in last, last
    assert committed(root) == [0]
    capsys.readouterr()
    assert cli.main(["verify", root]) == 0  # ckpt-e0 intact


def test_storage_never_deletes_through_a_link(tmp_path):
    """Deletes below a job directory refuse to go through (or remove) a symbolic link; the
    listing reports links as links, whatever they point to."""
    from paddle_acp.errors import StorageError
    from paddle_acp.storage import open_storage

    victim = tmp_path / "other" / "ckpt-2"
    victim.mkdir(parents=True)
    (victim / MANIFEST_NAME).write_text("{}")
    rd = tmp_path / "job" / "range" / RANGE
    rd.mkdir(parents=True)
    os.symlink(victim, rd / "ckpt-2")
    os.symlink(tmp_path / "nowhere", rd / "ckpt-5")
    st = open_storage(str(tmp_path))
    entries = {e.name: e for e in st.listdir(f"job/range/{RANGE}")}
    assert entries["ckpt-2"].is_link and not entries["ckpt-2"].is_dir
    assert entries["ckpt-5"].is_link  # a dangling link is listed too
    for call in (lambda: st.delete_file(f"job/range/{RANGE}/ckpt-2/{MANIFEST_NAME}"),
                 lambda: st.delete_dir(f"job/range/{RANGE}/ckpt-2")):
        with pytest.raises(StorageError, match="is a symbolic link"):
            call()
    assert (victim / MANIFEST_NAME).exists() and os.path.islink(rd / "ckpt-2")
    # a job directory itself may be a link the operator made
    os.symlink(tmp_path / "job", tmp_path / "job2")
    (tmp_path / "job" / "range" / RANGE / "ckpt-1.tmp-ab").mkdir()
    st.delete_dir(f"job2/range/{RANGE}/ckpt-1.tmp-ab")
    assert not (tmp_path / "job" / "range" / RANGE / "ckpt-1.tmp-ab").exists()
