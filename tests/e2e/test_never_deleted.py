"""What a restart, the writer's retention and ``paddle-acp gc`` never delete (issue s55, attacker A's items
2-5), with real training restarts of ``tests/scripts/train_script.py``:

* a checkpoint whose data cannot be read is kept, newer than the one resumed from or not, and this run's save at
  its position fails with an error (never skipped without a word);
* a corrupt checkpoint the restart passed over never takes a place of the newest K: the checkpoints this run
  commits stay, and the next restart loads them;
* nothing is deleted in a job directory whose marker names another job, nor through a job directory's link;
* ``PADDLE_ACP_START_FRESH=1`` says what becomes of the corrupt checkpoints.

Cost: one 3-epoch base run (~2 s) and a restart or two (~2 s each) per test.
"""
import json
import os
import re
import shutil

import pytest
from support.e2e import JOB_ID, tree_files
from support.script_range import EPOCHS, as_unprivileged, base_run, cdir, copy_base, flip, pdir, rdir, train

from paddle_acp import cli
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME, seal

OTHER_JOB = json.dumps({"format": "paddle-acp/job", "version": 1, "job_id": "someone-else", "created": 1.0})


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A real 3-epoch run, a checkpoint per epoch (ckpt-e0..e2)."""
    return base_run(tmp_path_factory.mktemp("never_deleted"))


# -- item 3: a checkpoint whose data cannot be read is never withdrawn ------------------------------------
@pytest.mark.parametrize("kill", [False, True])
def test_a_checkpoint_whose_data_cannot_be_read_is_kept(base, tmp_path, kill):
    """ckpt-e2's tensors.bin unreadable (its global.json and manifest are not): the restart falls back to
    ckpt-e1 and keeps ckpt-e2 as it is; the save of epoch 2 fails with an error naming why, the next one
    commits. Killed during epoch 2 instead, ckpt-e2 is still whole; readable again, a restart loads it."""
    root, out = copy_base(base, tmp_path, keep_losses=2)
    prefix, owner = as_unprivileged()
    data = os.path.join(pdir(root, 2), DATA_NAME)
    with open(data, "rb") as f:
        original = f.read()
    if owner is not None:
        os.chown(data, owner, owner)
    os.chmod(data, 0)
    before = tree_files(cdir(root, 2))
    try:
        p = train(root, out, EPOCHS + 1, {"PADDLE_ACP_MAX_TO_KEEP": "5"}, prefix) if not kill else train(
            root, out, EPOCHS + 1, prefix=prefix, args=("--kill-at-epoch", "2"))
        assert "resumed at epoch 2" in p.stdout, p.stdout + p.stderr[-3000:]
        assert re.search(r"skipping checkpoint ckpt-e2 of .*Permission denied", p.stderr), p.stderr[-3000:]
        assert "withdrawing checkpoint ckpt-e2" not in p.stderr, p.stderr[-3000:]
        assert re.search(r"keeping checkpoint ckpt-e2 although it is newer than the one resumed from: the restart "
                         r"could not read it", p.stderr), p.stderr[-3000:]
        if not kill:
            assert p.returncode == 0, p.stderr[-3000:]
            assert re.search(r"save failed .*checkpoint ckpt-e2 of \S+ is not written: the position holds a committed "
                             r"checkpoint that is kept: this job's restart could not read it", p.stderr), p.stderr[-3000:]
            assert not re.search(r"saved checkpoint ckpt-e2\b", p.stderr), p.stderr[-3000:]
            assert re.search(r"saved checkpoint ckpt-e3 \(epoch 3\)", p.stderr), p.stderr[-3000:]
        else:
            assert p.returncode != 0
        # the unreadable file is the one that was there, untouched
        assert tree_files(cdir(root, 2)) == before
        assert os.stat(data).st_mode & 0o777 == 0
        if owner is not None:
            assert os.stat(data).st_uid == owner
    finally:
        os.chmod(data, 0o644)
    with open(data, "rb") as f:
        assert f.read() == original
    if kill:  # readable again: the restart loads ckpt-e2 (epoch 3 is what is left)
        p = train(root, out, EPOCHS + 1)
        assert p.returncode == 0 and "resumed at epoch 3" in p.stdout, p.stdout + p.stderr[-3000:]


# -- item 2: a corrupt checkpoint the restart passed over never counts toward the K kept ------------------
def _old_layout_corrupt(root, number, epoch):
    """An earlier release's ckpt-N (the old layout) at a later position than the newest one-part checkpoint, one
    byte of its data damaged."""
    old = os.path.join(rdir(root), f"ckpt-{number}")
    shutil.copytree(pdir(root, 2), old)
    with open(os.path.join(old, MANIFEST_NAME)) as f:
        doc = json.load(f)
    doc.pop("checksum")
    doc["number"], doc["range"]["epoch_no"] = number, epoch
    doc["extra"].pop("part", None)
    with open(os.path.join(old, MANIFEST_NAME), "wb") as f:
        f.write(seal(doc))
    flip(os.path.join(old, DATA_NAME))


@pytest.mark.parametrize("keep", [None, "1"])
def test_a_corrupt_checkpoint_ahead_never_takes_the_place_of_this_runs_commits(base, tmp_path, keep):
    """Corrupt ckpt-7..9 at epochs 5..7 (ahead of everything): the restart resumes from ckpt-e2, and the
    writer's retention keeps the newest checkpoints this run commits (K of them, default 3), never counting the
    corrupt ones: the next restart loads this run's last save."""
    root, out = copy_base(base, tmp_path, keep_losses=3)
    for number, epoch in ((7, 5), (8, 6), (9, 7)):
        _old_layout_corrupt(root, number, epoch)
    env = {} if keep is None else {"PADDLE_ACP_MAX_TO_KEEP": keep}
    p = train(root, out, 5, env)
    assert p.returncode == 0 and "resumed at epoch 3" in p.stdout, p.stdout + p.stderr[-3000:]
    names = sorted(os.listdir(rdir(root)))
    kept = ["ckpt-e4"] if keep == "1" else ["ckpt-e2", "ckpt-e3", "ckpt-e4"]
    assert names == sorted(["ckpt-7", "ckpt-8", "ckpt-9"] + kept), names
    p = train(root, out, 5, env)
    assert p.returncode == 0 and "range 0: nothing left to train" in p.stdout, p.stdout + p.stderr[-3000:]


# -- item 5: every deletion passes check_deletable --------------------------------------------------------
def test_gc_deletes_nothing_where_the_job_marker_names_another_job(base, tmp_path, capsys):
    root, _ = copy_base(base, tmp_path, keep_losses=2)
    with open(os.path.join(root, JOB_ID, "job.json"), "w") as f:
        f.write(OTHER_JOB)
    before = tree_files(rdir(root))
    capsys.readouterr()
    assert cli.main(["gc", root, "--keep", "1"]) == 2
    out, err = capsys.readouterr()
    assert tree_files(rdir(root)) == before
    assert re.search(r"^paddle-acp: error: nothing deleted in range _range_0 of job e2e: refusing to delete .*names "
                     r"another job \('someone-else'\)$", err.strip()), err
    assert re.search(r"ckpt-e0 +keep .*not deleted: refusing", out), out
    assert cli.main(["gc", root, "--keep", "1", "--dry-run"]) == 2  # the dry run says so too
    assert "would delete" not in capsys.readouterr().out


def test_gc_never_deletes_through_a_job_directorys_link(base, tmp_path, capsys):
    """ROOT/linkjob a link to another root's job directory: gc deletes nothing there."""
    victim = str(tmp_path / "victim")
    shutil.copytree(base["root"], victim)
    os.makedirs(tmp_path / "root")
    os.symlink(os.path.join(victim, JOB_ID), tmp_path / "root" / "linkjob")
    before = tree_files(victim)
    capsys.readouterr()
    assert cli.main(["gc", str(tmp_path / "root"), "--keep", "1"]) == 2
    err = capsys.readouterr().err
    assert "nothing deleted in range _range_0 of job linkjob" in err and "is a symlink" in err, err
    assert tree_files(victim) == before


def test_a_restart_withdraws_nothing_where_the_job_marker_names_another_job(base, tmp_path):
    """ckpt-e2 corrupt, the marker naming another job: the restart falls back to ckpt-e1 and withdraws nothing; the
    save at ckpt-e2's position fails with an error (it is not skipped as if committed)."""
    root, out = copy_base(base, tmp_path, keep_losses=2)
    with open(os.path.join(root, JOB_ID, "job.json"), "w") as f:
        f.write(OTHER_JOB)
    flip(os.path.join(pdir(root, 2), DATA_NAME))
    before = {p: open(os.path.join(cdir(root, 2), p), "rb").read() for p in tree_files(cdir(root, 2))
              if os.path.isfile(os.path.join(cdir(root, 2), p))}
    p = train(root, out, EPOCHS + 1, {"PADDLE_ACP_MAX_TO_KEEP": "10"})
    assert "resumed at epoch 2" in p.stdout, p.stdout + p.stderr[-3000:]
    assert "withdrawing checkpoint" not in p.stderr, p.stderr[-3000:]
    assert re.search(r"nothing newer than the checkpoint resumed from is withdrawn or removed: refusing to delete .*"
                     r"names another job", p.stderr), p.stderr[-3000:]
    assert re.search(r"save failed .*checkpoint ckpt-e2 of \S+ is not written: the position holds a committed "
                     r"checkpoint that is kept: may not be withdrawn", p.stderr), p.stderr[-3000:]
    assert not re.search(r"saved checkpoint ckpt-e2\b|ckpt-e2 is already committed", p.stderr), p.stderr[-3000:]
    after = {p: open(os.path.join(cdir(root, 2), p), "rb").read() for p in tree_files(cdir(root, 2))
             if os.path.isfile(os.path.join(cdir(root, 2), p))}
    assert after == before


# -- item 4: PADDLE_ACP_START_FRESH says what becomes of the corrupt checkpoints --------------------------
def test_start_fresh_says_which_corrupt_checkpoints_it_deletes_and_which_it_keeps(base, tmp_path):
    """Every checkpoint corrupt, plus an earlier release's corrupt ckpt-7: the stop's error and the fresh start's
    warning say exactly what becomes of them, and that is what happens (ckpt-eE withdrawn, ckpt-7 kept as is)."""
    root, out = copy_base(base, tmp_path, keep_losses=0)
    _old_layout_corrupt(root, 7, 1)
    for n in range(EPOCHS):
        flip(os.path.join(pdir(root, n), DATA_NAME))
    old7 = {p: open(os.path.join(rdir(root), "ckpt-7", p), "rb").read() for p in os.listdir(os.path.join(rdir(root), "ckpt-7"))}
    env = {"PADDLE_ACP_MAX_TO_KEEP": "10"}
    p = train(root, out, 1, env)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "NoUsableCheckpointError" in last and "kept;" not in last, last
    assert ("PADDLE_ACP_START_FRESH=1 (the corrupt checkpoints named ckpt-e<E>[-s<S>] are then withdrawn and deleted, "
            "as the fresh run trains their positions again; an earlier release's ckpt-N is kept") in last, last
    p = train(root, out, 1, {**env, "PADDLE_ACP_START_FRESH": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    said = re.search(r"STARTING FROM SCRATCH although checkpoints exist .*; the corrupt (.*) are withdrawn and deleted "
                     r"now \(this run trains their positions again and saves there\); (.*) are kept", p.stderr)
    assert said, p.stderr[-3000:]
    assert sorted(said.group(1).split(", ")) == ["ckpt-e0", "ckpt-e1", "ckpt-e2"] and said.group(2) == "ckpt-7", said.group(0)
    assert "they are kept" not in p.stderr
    for n in (1, 2):  # withdrawn and deleted, as said (ckpt-e0 is this run's save)
        assert not os.path.exists(os.path.join(cdir(root, n), "global.json"))
        assert not os.path.exists(pdir(root, n))
    assert os.path.isfile(os.path.join(pdir(root, 0), MANIFEST_NAME))
    assert {p: open(os.path.join(rdir(root), "ckpt-7", p), "rb").read() for p in os.listdir(os.path.join(rdir(root), "ckpt-7"))} == old7
