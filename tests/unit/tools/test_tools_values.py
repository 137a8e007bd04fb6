"""What ``paddle-acp ls`` says of a range's progress (finished or not) and what ``paddle-acp inspect``
shows of the values a checkpoint saved besides its tensors (the script's objects, the loader's state):
bounded, with credentials redacted.

The checkpoints are written by the format layer's own writer (a one-process job's
:class:`~paddle_acp.format.checkpoints.multirank.GlobalCheckpointer`: ``ckpt-e{E}[-s{S}]/rank-0`` and its
``global.json``), manifests and all, as a training process writes them; the script's objects in the
serialized form the runtime writes (``format/objstate``). No Paddle: the tools never import it.
"""
from __future__ import annotations

import json
import random
import shutil

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.newest import one_process
from support.newest import save as save_one

from paddle_acp import cli
from paddle_acp.format import objstate
from paddle_acp.format.engine.snapshot import ProgramSnapshot, Snapshot, TensorData
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.secrets import register_secret
from paddle_acp.storage import open_storage
from paddle_acp.tools.values import WIDTH, preview

JOB, RANGE = "jobV", "_range_0"


def snapshot(epoch, max_epoch_num, step=None, extra=None, range_name=RANGE):
    ts = [TensorData("w", "float32", np.full(4, epoch, dtype="float32"))]
    return Snapshot(RangeRecord(range_name, epoch, max_epoch_num, step), [ProgramSnapshot("fp", "pir: t", ts, None)],
                    None, "3.3.1", "pir", extra=extra or {})


def save(root, *snaps, range_name=RANGE):
    ck = one_process(open_storage(str(root)), JOB, range_name, keep=0)  # keeps every checkpoint
    for s in snaps:
        save_one(ck, s)


def ls_json(root, capsys):
    assert cli.main(["ls", str(root), "--json"]) == 0
    return {r["range"]: r for r in json.loads(capsys.readouterr().out)["jobs"][0]["ranges"]}


def ls_text(root, capsys, *args):
    assert cli.main(["ls", str(root), *args]) == 0
    return capsys.readouterr().out


# -- ls: finished or not --------------------------------------------------------------------------------
def test_ls_says_a_range_is_finished_when_its_last_epoch_is_the_checkpoint_a_restart_loads(tmp_path, capsys):
    save(tmp_path, snapshot(0, 3), snapshot(1, 3), snapshot(2, 3))
    out = ls_text(tmp_path, capsys)
    assert f"range {RANGE}: a restart loads ckpt-e2" in out, out
    assert ("FINISHED: every epoch done (0..2, max_epoch_num 3); a rerun with the same max_epoch_num trains nothing"
            in out), out
    r = ls_json(tmp_path, capsys)[RANGE]
    assert r["finished"] is True and r["max_epoch_num"] == 3

    # the last checkpoint gone: the restart loads epoch 1's, the range is not finished
    shutil.rmtree(tmp_path / JOB / "range" / RANGE / "ckpt-e2")
    out = ls_text(tmp_path, capsys)
    assert "not finished: epochs 0..1 done (max_epoch_num 3); a restart trains epoch 2 next" in out, out
    assert "FINISHED" not in out
    assert ls_json(tmp_path, capsys)[RANGE]["finished"] is False


def test_ls_finished_follows_the_checkpoint_a_restart_loads_not_the_newest(tmp_path, capsys):
    """The last epoch's checkpoint is corrupt: ``ls --verify`` sees the restart load the one before, not finished."""
    save(tmp_path, snapshot(0, 2), snapshot(1, 2))
    data = tmp_path / JOB / "range" / RANGE / "ckpt-e1" / "rank-0" / "tensors.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert "FINISHED" in ls_text(tmp_path, capsys)  # data not read: the restart loads ckpt-e1 if it verifies
    out = ls_text(tmp_path, capsys, "--verify")
    assert "a restart loads ckpt-e0" in out and "not finished: epochs 0..0 done (max_epoch_num 2)" in out, out


def test_ls_progress_of_mid_epoch_unbounded_and_empty_ranges(tmp_path, capsys):
    save(tmp_path, snapshot(0, 5), snapshot(4, 5, step=3))  # the last epoch, but mid-way through it
    save(tmp_path, snapshot(9, -1, range_name="_range_1"), range_name="_range_1")  # no last epoch
    (tmp_path / JOB / "range" / "_range_2").mkdir()  # opened, nothing committed yet
    out = ls_text(tmp_path, capsys)
    assert "not finished: in epoch 4 after step 3 (max_epoch_num 5); a restart goes on from there" in out, out
    assert "not finished: epochs 0..9 done (max_epoch_num -1, no last epoch); a restart trains epoch 10 next" in out
    assert "no checkpoint yet: a restart starts from epoch 0" in out, out
    got = ls_json(tmp_path, capsys)
    assert [got[r]["finished"] for r in ("_range_0", "_range_1", "_range_2")] == [False, False, None]


# -- inspect: the saved values --------------------------------------------------------------------------
def objects_section():
    """An ``objects`` section as the runtime writes it (format/objstate.py), of real objects' states."""
    gen = np.random.default_rng(5)
    gen.random(3)
    state = {
        "step": ("state_dict", {"value": 7}),
        "cfg": ("dict", {"password": "hunter2-pw", "endpoint": "s3://AKIAXYZ:topsecret9@bucket/p?secret_key=zzz999",
                         "lr": 0.1, "note": "token s3cr3t-value here", "tags": list(range(50))}),
        "big": ("ndarray", np.arange(10000, dtype="float64")),
    }
    return {"version": objstate.VERSION,
            "rng": {"module_global:rng": {"kind": "numpy.Generator", "value": objstate.encode(gen.bit_generator.state)},
                    "main:r": {"kind": "random.Random", "value": objstate.encode(random.Random(3).getstate())}},
            "state": {n: {"kind": k, "value": objstate.encode(v)} for n, (k, v) in state.items()}}


def test_inspect_shows_the_saved_objects_values_bounded_and_redacted(tmp_path, capsys):
    register_secret("s3cr3t-value")  # as open_storage registers a URI's credentials
    section = objects_section()
    save(tmp_path, snapshot(0, 3, extra={"objects": section}),
         snapshot(1, 3, step=2, extra={"objects": section, "epoch_start_objects": section,
                                       "loader_state": {"offset": 2, "auth_token": "tok-abc123"}}))
    assert cli.main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for secret in ("hunter2-pw", "topsecret9", "AKIAXYZ", "zzz999", "s3cr3t-value", "tok-abc123"):
        assert secret not in out, (secret, out)
    assert "script state (restored into the script's objects at a restart)" in out, out
    assert "script state at the start of epoch 1 (a mid-epoch restart replays the epoch from it)" in out, out
    rows = {(line.split()[0], line.split()[1]): line for line in out.splitlines() if line.startswith("  ")}
    assert "{'value': 7}" in rows[("state", "step")], out
    cfg = rows[("state", "cfg")]
    assert "'password': ***" in cfg and "'s3://bucket/p'" in cfg and "'lr': 0.1" in cfg, cfg
    assert "numpy.Generator" in rows[("RNG", "module_global:rng")] and "'PCG64'" in rows[("RNG", "module_global:rng")]
    assert "array(float64, shape [10000]: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, …])" in rows[("state", "big")]
    assert "random.Random" in rows[("RNG", "main:r")] and "… 625 items" in rows[("RNG", "main:r")], out
    assert "'auth_token': ***" in out and "'offset': 2" in out, out
    assert all(len(line) <= WIDTH + 60 for line in out.splitlines()), max(out.splitlines(), key=len)

    assert cli.main(["inspect", str(tmp_path), "--json"]) == 0
    raw = capsys.readouterr().out
    assert not any(s in raw for s in ("hunter2-pw", "topsecret9", "s3cr3t-value", "tok-abc123")), raw
    extra = json.loads(raw)["extra"]
    assert [o["name"] for o in extra["objects"]["state"]] == ["big", "cfg", "step"]  # by name
    assert [(o["name"], o["kind"]) for o in extra["objects"]["rng"]] == [("main:r", "random.Random"),
                                                                          ("module_global:rng", "numpy.Generator")]
    assert extra["objects"]["state"][2]["value"] == "{'value': 7}"
    assert extra["epoch_start_objects"] == extra["objects"]
    assert extra["loader_state"] == "{'auth_token': ***, 'offset': 2}"

    # a checkpoint without such values shows none (and says nothing of them)
    assert cli.main(["inspect", str(tmp_path / JOB / "range" / RANGE / "ckpt-e0")]) == 0
    out = capsys.readouterr().out
    assert "script state (restored" in out and "script state at the start" not in out and "loader_state" not in out


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 200), 2 ** 200) | st.floats(allow_nan=False) | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=40) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=30), inner, max_size=40),
    max_leaves=100,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # same result under load
@given(values, st.integers(20, 400))
def test_preview_is_one_bounded_line_of_any_saved_value(value, width):
    """Property: whatever a manifest holds (decoded from its encoded form), its preview is one line of at
    most ``width`` characters, and a value under a credential-like key never appears in it."""
    decoded = objstate.decode(objstate.encode(value))
    text = preview(decoded, width)
    assert len(text) <= width and "\n" not in text
    secret = "Zq9-credential-Zq9"
    assert secret not in preview({"password": secret, "x": [value, {"api_key": [secret]}]}, width)


def test_inspect_hides_values_saved_under_a_credential_name_and_uris_with_a_quote(tmp_path, capsys):
    """``state={"db_password": acp.Value(..)}``: the object's own name is a credential's; a password holding a quote
    (the URI runs to white space, not to the quote); user:pass@host without a scheme."""
    state = {"db_password": ("state_dict", {"value": "ValPwLeak111"}), "api_token": ("dict", {"v": "DictTokLeak222"}),
             "api_key": ("ndarray", np.arange(3)),  # numeric: shown (an RNG's key array)
             "conf": ("dict", {"dsn": "s3://AKID:pa'ssQuoteLeak333@bucket/x", "etcd": "root:NoSchemeLeak555@h:2379",
                               "url": "see http://u:p/w'dLeak444@host/p"})}
    section = {"version": objstate.VERSION, "rng": {},
               "state": {n: {"kind": k, "value": objstate.encode(v)} for n, (k, v) in state.items()}}
    save(tmp_path, snapshot(0, 3, extra={"objects": section, "db_password": "TopLeak666"}))
    for args in ([], ["--json"]):
        assert cli.main(["inspect", str(tmp_path), *args]) == 0
        out = capsys.readouterr().out
        for leak in ("ValPwLeak111", "DictTokLeak222", "QuoteLeak333", "Leak444", "NoSchemeLeak555", "TopLeak666"):
            assert leak not in out, (leak, out)
        assert "s3://bucket/x" in out and "***@h:2379" in out and "http://host/p" in out, out
        assert "[0, 1, 2]" in out, out
