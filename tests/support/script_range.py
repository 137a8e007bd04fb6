"""The range of a one-process ``tests/scripts/train_script.py`` job that the restart tests damage: its directories
(job :data:`support.e2e.JOB_ID`, range ``_range_0``), the base run they copy, a flipped byte, a run as a process that
file permissions apply to.

A test module keeps its own module-scoped ``base`` fixture (``base_run`` in a directory of its own) and starts each
test from ``copy_base`` of it.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from paddle_acp.format.layout import GLOBAL_NAME
from support.e2e import JOB_ID, SCRIPT, load_result, read_log, run_script, script_env

RANGE = "_range_0"
EPOCHS = 3
SYNC = {"PADDLE_ACP_ASYNC": "0"}  # saves written before the epoch goes on: a restart sees every one


def rdir(root):
    """The range directory under the checkpoint root ``root``."""
    return os.path.join(str(root), JOB_ID, "range", RANGE)


def cdir(root, n):
    """Checkpoint ``n``'s directory: ``ckpt-e{n}`` for an epoch number (a one-process job: one part, ``rank-0``,
    committed by ``global.json``), or the entry of that name (``"ckpt-7"``, ``"fresh-1"``)."""
    return os.path.join(rdir(root), n if isinstance(n, str) else f"ckpt-e{n}")


def pdir(root, n):
    """The directory holding checkpoint ``n``'s manifest and data: its rank-0 part."""
    return os.path.join(cdir(root, n), "rank-0")


def flip(path, offset=100):
    """Invert the byte at ``offset`` of the file ``path`` in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def base_run(d):
    """A real ``EPOCHS``-epoch run in directory ``d``, a checkpoint per epoch (ckpt-e0..e2, one part each): the
    uninterrupted reference. ``{"root", "out", "reference"}`` (``reference``: its ``load_result``)."""
    root, out = str(d / "ckpt"), str(d / "out")
    p = run_script(out, root, "pir", "--epochs", EPOCHS, env=SYNC)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(os.listdir(rdir(root))) == [f"ckpt-e{n}" for n in range(EPOCHS)]
    assert all(sorted(os.listdir(cdir(root, n))) == [GLOBAL_NAME, "rank-0"] for n in range(EPOCHS))
    return {"root": root, "out": out, "reference": load_result(out)}


def copy_base(base, tmp_path, keep_losses=None):
    """A copy of the base run under ``tmp_path`` as if killed before it ended (no ``done``); with ``keep_losses``,
    killed after that many epochs were logged (the rest of ``losses.jsonl`` dropped). ``(root, out)``."""
    root, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    shutil.copytree(base["root"], root, symlinks=True)
    shutil.copytree(base["out"], out)
    os.remove(os.path.join(out, "done"))
    if keep_losses is not None:
        entries = read_log(out)
        with open(os.path.join(out, "losses.jsonl"), "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in entries[:keep_losses])
    return root, out


def as_unprivileged():
    """``(prefix, owner)``: a command prefix under which file permissions apply to this process, and the uid to give
    the files it must not read. Nothing (and None) for an ordinary user; for root a user namespace (``unshare -r``),
    where files of an unmapped owner (uid 12345) are not root's (CAP_DAC_OVERRIDE does not reach them). Skips the
    test where root has no user namespaces."""
    if os.geteuid() != 0:
        return [], None
    probe = subprocess.run(["unshare", "-r", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if probe.returncode != 0:
        pytest.skip(f"running as root without user namespaces (unshare -r: {probe.stderr.decode().strip()})")
    return ["unshare", "-r"], 12345


def train(root, out, epochs, env=None, prefix=(), args=()):
    """Run the training script for ``epochs`` epochs (then ``args``) with its checkpoints under ``root``, saving
    synchronously, ``env`` over that, the command behind ``prefix`` (e.g. ``as_unprivileged``'s): CompletedProcess."""
    cmd = list(prefix) + [sys.executable, SCRIPT, "--out", str(out), "--epochs", str(epochs)] + [str(a) for a in args]
    return subprocess.run(cmd, env=script_env(root, "pir", {**SYNC, **(env or {})}), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=300)
