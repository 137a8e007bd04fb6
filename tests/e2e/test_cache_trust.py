"""A node-local cache copy is restored from only when nobody but the job's user could have written it.

CRC32C is no defence against edits: a copy whose tensor bytes were changed with the checksum
kept (done here for real: the change is compensated in four bytes of the same tensor) passed
every check, and the restart said "every checksum verified" and resumed with forged weights,
whatever the cache directory's owner and mode. Now (ssh StrictModes style) the cache root, every
directory down to the copy and its files must be owned by this user (or root), not writable by
group or others, and no symlink; otherwise the remote is read, with one log line naming why, and
the resume is bit-identical. Real S3 server, real training processes killed with SIGKILL.
"""
from __future__ import annotations

import json
import os
import signal
import struct
import sys
import uuid

import crc32c
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import JOB_ID, compare_results, describe, is_done, load_result, run_script  # noqa: E402
from support.server_fixtures import s3_server  # noqa: E402,F401  (fixture)

from paddle_acp.config import s3_from_env  # noqa: E402
from paddle_acp.format.checkpoints.cache_key import cache_key  # noqa: E402
from paddle_acp.format.checkpoints.cache_trust import harden, untrusted  # noqa: E402
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME  # noqa: E402

EPOCHS, KILL_AT = 4, 2
ARGS = ("--epochs", EPOCHS, "--steps-per-epoch", 3, "--hidden", 64)
CACHE_LOG = "from the local cache"
REMOTE_LOG = "not the local cache"
OTHER_UID = 12345


# -- a forgery the checksums cannot see ---------------------------------------------------------
def _solve(columns, target):
    """x (32 bits) with XOR of columns[i] for the set bits i == target (GF(2) elimination)."""
    rows = [(c, 1 << i) for i, c in enumerate(columns)]
    basis = {}
    for vec, comb in rows:
        for bit in range(31, -1, -1):
            if not vec >> bit & 1:
                continue
            if bit in basis:
                vec, comb = vec ^ basis[bit][0], comb ^ basis[bit][1]
            else:
                basis[bit] = (vec, comb)
                break
    x = 0
    for bit in range(31, -1, -1):
        if target >> bit & 1:
            if bit not in basis:
                return None
            target ^= basis[bit][0]
            x ^= basis[bit][1]
    return x


def forge(copy_dir):
    """Change the largest float32 tensor of the copy (its first element +1.0) keeping its CRC32C:
    four bytes of a later element compensate. Returns the tensor's name."""
    with open(os.path.join(copy_dir, MANIFEST_NAME)) as f:
        doc = json.load(f)
    tensors = [t for p in doc["programs"] for t in p["tensors"] if t["dtype"] == "float32" and t["nbytes"] >= 64]
    t = max(tensors, key=lambda t: t["nbytes"])
    path = os.path.join(copy_dir, DATA_NAME)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    off, n = t["offset"], t["nbytes"]
    body = bytearray(data[off:off + n])
    want = crc32c.crc32c(bytes(body))
    first = struct.unpack_from("<f", body, 0)[0]
    struct.pack_into("<f", body, 0, first + 1.0)
    for at in range(4, n - 3, 4):  # a compensating element that stays a small finite float
        trial = bytearray(body)
        trial[at:at + 4] = b"\0\0\0\0"
        base = crc32c.crc32c(bytes(trial))
        cols = []
        for i in range(32):
            probe = bytearray(trial)
            probe[at + i // 8] ^= 1 << (i % 8)
            cols.append(crc32c.crc32c(bytes(probe)) ^ base)
        x = _solve(cols, base ^ want)
        if x is None:
            continue
        struct.pack_into("<I", trial, at, x)
        v = struct.unpack_from("<f", trial, at)[0]
        if np.isfinite(v) and abs(v) < 4:
            assert crc32c.crc32c(bytes(trial)) == want == t["crc32c"]
            data[off:off + n] = trial
            with open(path, "r+b") as f:
                f.write(data)
            return t["name"]
    raise AssertionError("no compensating element found")


# -- end to end -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    proc = run_script(out, None, "pir", *ARGS)
    assert proc.returncode == 0 and is_done(out), describe(proc)
    return load_result(out)


def _chown(path, uid):
    os.chown(path, uid, -1, follow_symlinks=False)


SCENARIOS = {
    # the cache root group-writable: a group member could have replaced the copy
    "root g+w": (lambda root, copy: os.chmod(root, 0o770), "is writable by group (mode 0770)"),
    # a directory on the way writable by everyone (the range's: above the rank-0 directory holding the copy)
    "range dir o+w": (lambda root, copy: os.chmod(os.path.dirname(os.path.dirname(copy)), 0o757),
                      "is writable by others (mode 0757)"),
    # the copy's data file belongs to another user
    "data chown": (lambda root, copy: _chown(os.path.join(copy, DATA_NAME), OTHER_UID),
                   f"tensors.bin is owned by uid {OTHER_UID}"),
    # the copy's directory belongs to another user
    "copy dir chown": (lambda root, copy: _chown(copy, OTHER_UID), f"is owned by uid {OTHER_UID}"),
}


def _run_killed(s3, tmp_path):
    uri = f"s3://{s3.bucket}/trust/{uuid.uuid4().hex[:8]}"
    cache = tmp_path / "cache"
    # synchronous saves: the checkpoint of epoch KILL_AT-1 (remote and copy) is committed before the kill
    env = dict(s3.client_env(), PADDLE_ACP_LOCAL_CACHE=str(cache), PADDLE_ACP_ASYNC="0")
    out = tmp_path / "out"
    p1 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", KILL_AT, env=env)
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    # one process is a job of one rank: its copies are rank 0's, in the range's rank-0 directory
    copy = os.path.join(str(cache), cache_key(uri, s3_from_env(env).endpoint), JOB_ID, "range", "_range_0", "rank-0",
                        f"ckpt-e{KILL_AT - 1}")
    assert os.path.isfile(os.path.join(copy, MANIFEST_NAME)), os.listdir(str(cache))
    return uri, env, out, str(cache), copy


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_copy_others_could_have_written_is_not_used(scenario, s3_server, reference, tmp_path):  # noqa: F811
    uri, env, out, cache, copy = _run_killed(s3_server, tmp_path)
    forge(copy)  # what a writer other than this user could have done; the checksums still match
    change, why = SCENARIOS[scenario]
    change(cache, copy)
    p2 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", KILL_AT, env=env)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    assert f"resumed at epoch {KILL_AT}" in p2.stdout, describe(p2)
    remote = [ln for ln in p2.stderr.splitlines() if REMOTE_LOG in ln]
    assert len(remote) == 1 and why in remote[0] and "could have been written by another user" in remote[0], \
        describe(p2)
    assert CACHE_LOG not in p2.stderr, describe(p2)
    assert not compare_results(load_result(out), reference), compare_results(load_result(out), reference)


def test_a_copy_only_this_user_can_write_is_used(s3_server, reference, tmp_path):  # noqa: F811
    """The trusted case: root-owned (the tests run as root), written with a group-writable umask
    (the writer takes the group and other write bits off what it creates), read from the cache."""
    old = os.umask(0o002)
    try:
        uri, env, out, cache, copy = _run_killed(s3_server, tmp_path)
    finally:
        os.umask(old)
    assert not os.stat(os.path.join(copy, DATA_NAME)).st_mode & 0o022
    p2 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", KILL_AT, env=env)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    used = [ln for ln in p2.stderr.splitlines() if CACHE_LOG in ln]
    assert len(used) == 1 and f"checkpoint ckpt-e{KILL_AT - 1} (part of rank 0) of " in used[0], describe(p2)
    assert REMOTE_LOG not in p2.stderr, describe(p2)
    assert not compare_results(load_result(out), reference), compare_results(load_result(out), reference)


# -- the check itself -------------------------------------------------------------------------------
def test_untrusted_names_the_first_path_that_fails(tmp_path):
    root = tmp_path / "cache"
    copy = root / "key" / "job" / "ckpt-1"
    copy.mkdir(parents=True)
    for name in (DATA_NAME, MANIFEST_NAME):
        (copy / name).write_bytes(b"x")
    os.chmod(root, 0o700)
    harden(str(root), "key/job/ckpt-1", (DATA_NAME, MANIFEST_NAME))
    rel = "key/job/ckpt-1"
    assert untrusted(str(root), rel, (DATA_NAME, MANIFEST_NAME)) is None
    # a symlinked root is the user's setting: resolved, then checked
    link = tmp_path / "link"
    link.symlink_to(root)
    assert untrusted(str(link), rel, (DATA_NAME,)) is None
    # a symlink below the root: refused
    (root / "key" / "job").rename(root / "key" / "real")
    (root / "key" / "job").symlink_to(root / "key" / "real")
    assert "is a symbolic link" in untrusted(str(root), rel, (DATA_NAME,))
    (root / "key" / "job").unlink()
    (root / "key" / "real").rename(root / "key" / "job")
    os.symlink("/etc/hostname", copy / "extra")
    assert "is a symbolic link" in untrusted(str(root), rel, ("extra",))
    assert untrusted(str(root), rel, ("missing",)) is None  # an incomplete copy: the verifier's to refuse
    os.chmod(copy / DATA_NAME, 0o646)
    assert untrusted(str(root), rel, (DATA_NAME,)).endswith("tensors.bin is writable by others (mode 0646)")
    assert untrusted(str(root), "key/../x", ()) is not None
