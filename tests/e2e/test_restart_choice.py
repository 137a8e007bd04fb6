"""Which checkpoint a restart loads, and what it does when none can be used (issue 25, items 2 and 7).

Item 2: a range whose checkpoints all fail (a newer format after a downgrade of paddle-acp, a flipped
data byte in every one) stops the restart with NoUsableCheckpointError naming each checkpoint and why,
on every rank, and deletes nothing; ``PADDLE_ACP_START_FRESH=1`` starts from scratch on purpose and
still keeps the checkpoints of a newer format (retention, ``gc``); an empty storage starts from scratch.

Item 7: ``paddle-acp ls``/``verify``/``inspect`` name the checkpoint a real restart then says it resumed
from: both layouts at one position, an uncommitted directory of several ranks next to single-writer
checkpoints, a corrupt newest checkpoint (``ls`` without ``--verify`` says the data was not checked).

Everything runs real training processes (tests/scripts/train_script.py, rank_train.py).
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from support.e2e import JOB_ID, REPO, load_result, read_log, run_script, script_env
from support.newest import recommit
from support.script_range import EPOCHS, SYNC, base_run, cdir, copy_base, flip, pdir, rdir

from paddle_acp import cli
from paddle_acp.format.layout import GLOBAL_NAME
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME, seal

RANK_SCRIPT = os.path.join(REPO, "tests", "scripts", "rank_train.py")


def tree_bytes(path):
    """Every file under ``path`` (relative name -> bytes) and every directory: what a byte compare sees."""
    out = {}
    for d, dirs, files in os.walk(str(path)):
        for n in dirs:
            out[os.path.relpath(os.path.join(d, n), str(path)) + "/"] = None
        for n in files:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), str(path))] = f.read()
    return out


def reseal(path, **changes):
    """Rewrite a manifest (or global.json) with ``changes``, its checksum recomputed (as its writer would)."""
    with open(path) as f:
        doc = json.load(f)
    doc.pop("checksum")
    doc.update(changes)
    with open(path, "wb") as f:
        f.write(seal(doc))


def last_line(stderr):
    return stderr.strip().splitlines()[-1]


def resumed_from(text):
    """The checkpoint directory a training process logged it resumed from (None: it did not resume)."""
    m = re.search(r"resuming at .* from (?:global )?checkpoint \S+ \(([^,)]+)", text)
    return os.path.basename(m.group(1).rstrip("/")) if m else None


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A real 3-epoch run of one process, a checkpoint per epoch (ckpt-e0..e2, one part each)."""
    return base_run(tmp_path_factory.mktemp("choice"))


def newer_format(root):
    """Every checkpoint's part manifest of a newer format (global.json re-sealed over it: the manifest tells)."""
    for n in range(EPOCHS):
        reseal(os.path.join(pdir(root, f"ckpt-e{n}"), MANIFEST_NAME), version=4)
        recommit(cdir(root, f"ckpt-e{n}"))


def flip_every(root):
    """A flipped data byte in every checkpoint of the range (either layout)."""
    for name in os.listdir(rdir(root)):
        d = cdir(root, name)
        flip(os.path.join(d if os.path.exists(os.path.join(d, MANIFEST_NAME)) else pdir(root, name), DATA_NAME))


# -- item 2: none usable -> the restart stops, nothing deleted ------------------------------
@pytest.mark.parametrize("case", ["newer format", "flipped data byte"])
def test_no_usable_checkpoint_stops_the_restart_and_deletes_nothing(base, tmp_path, capsys, case):
    root, out = copy_base(base, tmp_path)
    (newer_format if case == "newer format" else flip_every)(root)
    before, logged = tree_bytes(rdir(root)), read_log(out)
    p = run_script(out, root, "pir", "--epochs", EPOCHS + 2, env={**SYNC, "PADDLE_ACP_MAX_TO_KEEP": "1"})
    assert p.returncode != 0, p.stdout
    last = last_line(p.stderr)
    assert last.startswith("paddle_acp.errors.NoUsableCheckpointError: none of the 3 committed checkpoint(s) of "), last
    why = "newer format: .*format version 4 is newer" if case == "newer format" else r"corrupt: .*checksum mismatch"
    for n in (2, 1, 0):  # each named, newest first, with why
        assert re.search(rf"ckpt-e{n} \({why}", last), last
    assert "PADDLE_ACP_START_FRESH=1" in last and "PADDLE_JOB_ID" in last and "nothing was deleted" in last
    if case == "newer format":
        assert "resume with the newer paddle-acp" in last
    else:
        assert "fix the storage or restore the checkpoints" in last
    assert "STARTING FROM SCRATCH" not in p.stderr
    assert tree_bytes(rdir(root)) == before  # byte for byte: nothing deleted, nothing written
    assert read_log(out) == logged  # not one epoch trained
    # the tools say the same: a restart stops; gc deletes nothing
    capsys.readouterr()
    assert cli.main(["ls", root]) == 0
    text = capsys.readouterr().out
    if case == "newer format":  # the manifests tell
        assert "a restart STOPS with NoUsableCheckpointError" in text and "NEWER FORMAT (kept" in text, text
    else:  # only the data tells: ls without --verify says it did not read it
        assert "a restart loads ckpt-e2 if its data verifies (data not checked)" in text, text
    assert cli.main(["ls", root, "--verify"]) == 0
    assert "a restart STOPS with NoUsableCheckpointError" in capsys.readouterr().out
    assert cli.main(["verify", root]) == 1
    assert "STOPS with NoUsableCheckpointError" in capsys.readouterr().out
    assert cli.main(["gc", root, "--keep", "1"]) == 0
    assert tree_bytes(rdir(root)) == before


@pytest.mark.parametrize("where", ["global record", "part manifest"])
def test_a_newest_checkpoint_of_a_newer_format_stops_the_restart_and_the_tools_say_so(base, tmp_path, capsys, where):
    """After a downgrade, ckpt-e2 (newest) of a newer format and ckpt-e0..e1 usable: the restart stops (it would
    train e2's position again and could not replace it); ls, verify, inspect and gc say that, and never that it
    loads ckpt-e1 (the doctor once did: wrongly green)."""
    root, out = copy_base(base, tmp_path)
    if where == "global record":
        reseal(os.path.join(cdir(root, "ckpt-e2"), GLOBAL_NAME), version=99)
    else:
        reseal(os.path.join(pdir(root, "ckpt-e2"), MANIFEST_NAME), version=4)
        recommit(cdir(root, "ckpt-e2"))
    before = tree_bytes(rdir(root))
    p = run_script(out, root, "pir", "--epochs", EPOCHS + 2, env=SYNC)
    assert p.returncode != 0
    last = last_line(p.stderr)
    assert "ckpt-e2" in last and "are of a newer format" in last and "from ckpt-e1" in last, last
    capsys.readouterr()
    for args in (["ls", root], ["ls", root, "--verify"]):
        assert cli.main(args) == 0
        text = capsys.readouterr().out
        assert "a restart STOPS with CheckpointError: ckpt-e2, of a newer format" in text, text
        assert not re.search(r"^ +\* ", text, re.M), text  # no checkpoint marked as the one a restart loads
    assert cli.main(["verify", root]) == 1
    text = capsys.readouterr().out
    assert "STOPS with CheckpointError: ckpt-e2" in text and "fall back" not in text, text
    assert cli.main(["inspect", cdir(root, "ckpt-e1")]) == 0
    assert "no (a restart STOPS with CheckpointError: ckpt-e2" in capsys.readouterr().out
    assert cli.main(["gc", root, "--keep", "1"]) == 0
    assert tree_bytes(rdir(root)) == before  # nothing deleted by the restart or gc


def as_old_layout(root, name, number):
    """Make one-part checkpoint ``name`` an earlier release's single-writer ``ckpt-{number}`` (its part's files
    under the old name, the manifest's number that name's, no part record), in place of ``name``."""
    old = cdir(root, f"ckpt-{number}")
    shutil.copytree(pdir(root, name), old)
    shutil.rmtree(cdir(root, name))
    path = os.path.join(old, MANIFEST_NAME)
    with open(path) as f:
        extra = json.load(f)["extra"]
    extra.pop("part")
    reseal(path, number=number, extra=extra)


def test_start_fresh_trains_from_scratch_and_keeps_checkpoints_of_a_newer_format(base, tmp_path, capsys):
    """Checkpoints of a newer format under the earlier release's names (ckpt-N, which one process's saves,
    ckpt-eE, never reuse): a fresh start trains from scratch beside them and never deletes them."""
    root, out = copy_base(base, tmp_path)
    for n in range(EPOCHS):
        as_old_layout(root, f"ckpt-e{n}", n)
        reseal(os.path.join(cdir(root, f"ckpt-{n}"), MANIFEST_NAME), version=4)
    assert sorted(os.listdir(rdir(root))) == ["ckpt-0", "ckpt-1", "ckpt-2"]
    os.remove(os.path.join(out, "losses.jsonl"))
    old = {n: tree_bytes(cdir(root, f"ckpt-{n}")) for n in range(EPOCHS)}
    p = run_script(out, root, "pir", "--epochs", EPOCHS,
                   env={**SYNC, "PADDLE_ACP_MAX_TO_KEEP": "1", "PADDLE_ACP_START_FRESH": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "PADDLE_ACP_START_FRESH is set: STARTING FROM SCRATCH" in p.stderr, p.stderr[-3000:]
    assert resumed_from(p.stderr) is None
    losses, params = load_result(out)
    ref_losses, ref_params = base["reference"]
    assert sorted(losses) == sorted(ref_losses)  # every epoch trained again, from scratch, the same
    for k in ref_losses:
        assert {a: b for a, b in losses[k].items() if a != "pid"} == {a: b for a, b in ref_losses[k].items() if a != "pid"}
    # retention (keep 1) deleted the new run's older checkpoints, never one of a newer format
    assert sorted(os.listdir(rdir(root))) == ["ckpt-0", "ckpt-1", "ckpt-2", "ckpt-e2"]
    assert {n: tree_bytes(cdir(root, f"ckpt-{n}")) for n in range(EPOCHS)} == old
    assert "it is of a newer format" in p.stderr
    capsys.readouterr()
    assert cli.main(["gc", root, "--keep", "1"]) == 0
    assert "of a newer format: this paddle-acp never deletes it" in capsys.readouterr().out
    assert {n: tree_bytes(cdir(root, f"ckpt-{n}")) for n in range(EPOCHS)} == old
    assert sorted(os.listdir(rdir(root))) == ["ckpt-0", "ckpt-1", "ckpt-2", "ckpt-e2"]
    # the next restart resumes from the new run's checkpoint
    p = run_script(out, root, "pir", "--epochs", EPOCHS, env=SYNC)
    assert p.returncode == 0 and resumed_from(p.stderr) == "ckpt-e2", p.stderr[-3000:]


def test_start_fresh_in_place_of_one_part_checkpoints_of_a_newer_format_is_refused(base, tmp_path):
    """One process's checkpoints are named by position: a fresh start would train the positions of
    ckpt-e0..e2 (of a newer format) again and could neither replace them nor save beside them. Refused,
    as for several ranks: nothing trained, nothing deleted, nothing written."""
    root, out = copy_base(base, tmp_path)
    newer_format(root)
    before, logged = tree_bytes(rdir(root)), read_log(out)
    p = run_script(out, root, "pir", "--epochs", EPOCHS + 2,
                   env={**SYNC, "PADDLE_ACP_MAX_TO_KEEP": "1", "PADDLE_ACP_START_FRESH": "1"})
    assert p.returncode != 0, p.stderr[-3000:]
    last = last_line(p.stderr)
    assert "are of a newer format" in last and "new PADDLE_JOB_ID" in last and "Nothing was deleted" in last, last
    assert "saved checkpoint" not in p.stderr, p.stderr[-3000:]
    assert tree_bytes(rdir(root)) == before
    assert read_log(out) == logged  # not one epoch trained


def test_an_empty_storage_starts_from_scratch(tmp_path):
    root, out = tmp_path / "ckpt", tmp_path / "out"
    p = run_script(out, root, "pir", "--epochs", 2, env=SYNC)
    assert p.returncode == 0, p.stderr[-3000:]
    assert [e["epoch"] for e in read_log(out)] == [0, 1]
    assert sorted(os.listdir(rdir(root))) == ["ckpt-e0", "ckpt-e1"]
    assert all(sorted(os.listdir(cdir(root, n))) == [GLOBAL_NAME, "rank-0"] for n in ("ckpt-e0", "ckpt-e1"))


def start_job(tmp, world, *args, ckpt, gen, env=None, outs="out"):
    procs = []
    for r in range(world):
        e = {"PADDLE_TRAINER_ID": r, "PADDLE_TRAINERS_NUM": world, "ACP_TEST_GEN": gen, "PADDLE_ACP_PART_TIMEOUT": 60,
             **(env or {})}
        cmd = [sys.executable, RANK_SCRIPT, "--out", str(tmp / outs / f"r{r}"), "--barrier", str(tmp / "barrier")]
        procs.append(subprocess.Popen(cmd + [str(a) for a in args], env=script_env(ckpt, "pir", e), cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return [(p.returncode, out) for p in procs for out in [p.communicate(timeout=300)[0]]]


def test_two_ranks_with_every_global_manifest_of_a_newer_format_fail_on_every_rank(tmp_path):
    ckpt = tmp_path / "ckpt"
    res = start_job(tmp_path, 2, "--kind", "dp", "--epochs", 2, ckpt=ckpt, gen="g0")
    assert all(rc == 0 for rc, _ in res), res
    names = sorted(n for n in os.listdir(rdir(ckpt)) if n.startswith("ckpt-e"))
    assert names == ["ckpt-e0", "ckpt-e1"]
    for n in names:
        reseal(os.path.join(cdir(ckpt, n), "global.json"), version=99)
    before = tree_bytes(rdir(ckpt))
    res = start_job(tmp_path, 2, "--kind", "dp", "--epochs", 4, ckpt=ckpt, gen="g1", outs="out2")
    for r, (rc, out) in enumerate(res):
        assert rc != 0, out[-3000:]
        assert f"NoUsableCheckpointError: rank {r}: none of the 2 committed checkpoint(s)" in out, out[-3000:]
        assert re.search(r"ckpt-e1 \(newer format: .*version 99 is newer.*ckpt-e0 \(newer format: ", out), out[-3000:]
        assert "withdrawing" not in out
        assert not (tmp_path / "out2" / f"r{r}" / "losses.jsonl").exists()  # not one step trained
    assert tree_bytes(rdir(ckpt)) == before  # nothing withdrawn, no part removed
    # starting fresh in place would train those positions again over checkpoints it cannot replace: refused
    res = start_job(tmp_path, 2, "--kind", "dp", "--epochs", 4, ckpt=ckpt, gen="g2", outs="out3",
                    env={"PADDLE_ACP_START_FRESH": "1"})
    for rc, out in res:
        assert rc != 0 and "are of a newer format" in out and "new PADDLE_JOB_ID" in out, out[-3000:]
    assert tree_bytes(rdir(ckpt)) == before


# -- item 7: the tools name what a restart loads ------------------------------------------------
def tools_pick(root, capsys):
    """What ls (without and with --verify), verify and inspect say a restart loads; and what plain
    ``ls`` says about the data it did not read."""
    def marked(rng):
        return next((c["name"] for c in rng["checkpoints"] if c["restart"]), None)

    capsys.readouterr()
    assert cli.main(["ls", root, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["jobs"][0]["ranges"][0]
    assert cli.main(["ls", root]) == 0
    plain_text = capsys.readouterr().out
    assert cli.main(["ls", root, "--verify", "--json"]) == 0
    verified = json.loads(capsys.readouterr().out)["jobs"][0]["ranges"][0]
    cli.main(["verify", root, "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    starred = [r["checkpoint"] for r in rows if r["restart"] == "*"]
    assert cli.main(["inspect", root, "--job", JOB_ID, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    picks = {"ls": marked(plain), "ls --verify": marked(verified), "verify": starred[0] if len(starred) == 1 else starred,
             "inspect": os.path.basename(doc["checkpoint"]) if doc["restart"] else ("not loaded", doc["checkpoint"])}
    return picks, {"plain": plain, "verified": verified, "text": plain_text}


def assert_says_data_not_checked(notes):
    assert notes["plain"].get("data_checked") is False and notes["verified"].get("data_checked") is True, notes
    assert "data not checked" in notes["text"] and "data NOT checked" in notes["text"], notes["text"]


def test_both_layouts_at_one_position(tmp_path, capsys):
    """Two ranks wrote ckpt-e0..e2; ckpt-e2's data went bad, so one process of an earlier release resumed
    from ckpt-e1 and wrote ckpt-0 at the position of ckpt-e2; then ckpt-e2 was repaired. A restart tries
    the checkpoint of several ranks first at one position; so must the tools. (Today's one process writes
    ckpt-e2 itself: its checkpoint is made in a copy of the range without ckpt-e2 and put in the old
    layout, ckpt-0.)"""
    ckpt = tmp_path / "ckpt"
    res = start_job(tmp_path, 2, "--kind", "dp", "--epochs", 3, ckpt=ckpt, gen="g0")
    assert all(rc == 0 for rc, _ in res), res
    data = os.path.join(cdir(ckpt, "ckpt-e2"), "rank-0", DATA_NAME)
    flip(data)
    one = script_env(ckpt, "pir", {"PADDLE_TRAINER_ID": None, "PADDLE_TRAINERS_NUM": None, **SYNC})
    cmd = [sys.executable, RANK_SCRIPT, "--kind", "dp", "--out", str(tmp_path / "one")]
    side = tmp_path / "side"  # the range without its bad ckpt-e2: where the one process's checkpoint is made
    shutil.copytree(ckpt, side, symlinks=True)
    shutil.rmtree(cdir(side, "ckpt-e2"))
    p = subprocess.run(cmd + ["--epochs", "3"], env={**one, "PADDLE_ACP_CHECKPOINT_URI": str(side)}, cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0 and resumed_from(p.stderr) == "ckpt-e1", p.stderr[-3000:]
    assert sorted(os.listdir(cdir(side, "ckpt-e2"))) == [GLOBAL_NAME, "rank-0"]  # one part: one process
    as_old_layout(side, "ckpt-e2", 0)
    shutil.copytree(cdir(side, "ckpt-0"), cdir(ckpt, "ckpt-0"))
    assert sorted(os.listdir(rdir(ckpt))) == ["ckpt-0", "ckpt-e0", "ckpt-e1", "ckpt-e2", "plan.json"]  # (the ranks' save plan)
    # while ckpt-e2 is bad, the one process's ckpt-0 is what a restart loads
    p = subprocess.run(cmd + ["--epochs", "3"], env=one, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    assert p.returncode == 0 and resumed_from(p.stderr) == "ckpt-0", p.stderr[-3000:]
    flip(data)  # repaired: both ckpt-0 and ckpt-e2 are valid, at the same position (end of epoch 2)
    picks, notes = tools_pick(str(ckpt), capsys)
    p = subprocess.run(cmd + ["--epochs", "3"], env=one, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert resumed_from(p.stderr) == "ckpt-e2"
    assert picks == dict.fromkeys(picks, "ckpt-e2"), picks
    assert_says_data_not_checked(notes)


def test_an_uncommitted_directory_of_several_ranks_changes_nothing(base, tmp_path, capsys):
    """Single-writer checkpoints of an earlier release whose numbers and positions disagree (a fresh start
    after every checkpoint went bad, then the old ckpt-2 repaired), and an uncommitted ``ckpt-e7/rank-0``
    left by an aborted start of several ranks: a restart orders by number (no committed checkpoint of
    several ranks), and so must the tools. (Made from the base run's checkpoints, put in the old layout:
    ckpt-0..2 at epochs 0..2, bad, then the fresh start's ckpt-3, ckpt-4 at epochs 0, 1: the same states,
    training being deterministic.)"""
    root, out = copy_base(base, tmp_path)
    for n in (0, 1):  # the fresh start's (the same state as ckpt-0, ckpt-1), kept aside (not in the range)
        shutil.copytree(pdir(root, f"ckpt-e{n}"), os.path.join(str(tmp_path), f"fresh-{n}", "rank-0"))
    for n in range(EPOCHS):
        as_old_layout(root, f"ckpt-e{n}", n)
    flip_every(root)  # ckpt-0..2 went bad
    for n in (0, 1):
        shutil.move(os.path.join(str(tmp_path), f"fresh-{n}"), cdir(root, f"fresh-{n}"))
        as_old_layout(root, f"fresh-{n}", n + 3)
    assert sorted(os.listdir(rdir(root))) == ["ckpt-0", "ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]
    flip(os.path.join(cdir(root, "ckpt-2"), DATA_NAME))  # repaired: end of epoch 2, while ckpt-4 is epoch 1
    os.makedirs(os.path.join(cdir(root, "ckpt-e7"), "rank-0"))
    shutil.copy(os.path.join(cdir(root, "ckpt-4"), DATA_NAME), os.path.join(cdir(root, "ckpt-e7"), "rank-0", DATA_NAME))
    picks, notes = tools_pick(root, capsys)
    p = run_script(out, root, "pir", "--epochs", 2, env=SYNC)
    assert p.returncode == 0, p.stderr[-3000:]
    assert resumed_from(p.stderr) == "ckpt-4"
    assert picks == dict.fromkeys(picks, "ckpt-4"), picks
    assert_says_data_not_checked(notes)


def test_a_corrupt_newest_checkpoint(base, tmp_path, capsys):
    """A flipped data byte in the newest checkpoint: only reading the data tells. ``ls`` without
    ``--verify`` says it did not; everything that reads the data names the one a restart loads."""
    root, out = copy_base(base, tmp_path)
    flip(os.path.join(pdir(root, "ckpt-e2"), DATA_NAME))
    picks, notes = tools_pick(root, capsys)
    p = run_script(out, root, "pir", "--epochs", EPOCHS, env=SYNC)
    assert p.returncode == 0, p.stderr[-3000:]
    assert resumed_from(p.stderr) == "ckpt-e1"
    assert {k: v for k, v in picks.items() if k != "ls"} == dict.fromkeys(["ls --verify", "verify", "inspect"], "ckpt-e1")
    assert picks["ls"] == "ckpt-e2"  # not read, and it says so
    assert_says_data_not_checked(notes)
    assert re.search(r"a restart loads ckpt-e2 if its data verifies \(data not checked\)", notes["text"]), notes["text"]
