"""paddle_acp.compat.auto_checkpoint: Paddle's auto_checkpoint surface, in-process.

Paddle's own scenarios (its tests test_auto_checkpoint*.py) run here in one
process under both IRs, with ``paddle_acp.simulate_restart()`` standing for
the restart; ``test_compat_scenarios.py`` runs the same scenarios as real
two-process restarts. Legacy IR is entered with ``paddle.pir_utils.OldIrGuard``
and trains through ``CompiledProgram`` + ``DataLoader.from_generator``.
"""
import contextlib
import json
import os
import sys

import numpy as np
import paddle
import pytest

import paddle_acp
from paddle_acp.compat import auto_checkpoint as acp
from paddle_acp.errors import CheckpointError, ConfigError
from paddle_acp.runtime import api, hook

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import compat_scenarios as cs  # noqa: E402

pytestmark = pytest.mark.usefixtures("static_mode")

from support.paddle_compat import IRS, legacy_ir_guard  # noqa: E402  (the IRs this Paddle supports)

_STRIP_PREFIXES = ("PADDLE_ACP_", "PADDLE_EDL_")
_STRIP_NAMES = ("PADDLE_JOB_ID", "PADDLE_TRAINER_ID", "PADDLE_RUNNING_ENV", "PADDLE_RUNNING_PLATFORM")


def paddlecloud_env(ckpt_dir, job_id="compat"):
    """Paddle's tests' PaddleCloud environment, checkpointing to a local directory."""
    return {
        "PADDLE_RUNNING_ENV": "PADDLE_EDL_AUTO_CHECKPOINT",
        "PADDLE_TRAINER_ID": "0",
        "PADDLE_RUNNING_PLATFORM": "PADDLE_CLOUD",
        "PADDLE_JOB_ID": job_id,
        "PADDLE_EDL_HDFS_HOME": "/nonexistent",
        "PADDLE_EDL_HDFS_NAME": "",
        "PADDLE_EDL_HDFS_UGI": "",
        "PADDLE_EDL_HDFS_CHECKPOINT_PATH": str(ckpt_dir),
        "PADDLE_EDL_ONLY_FOR_CE_TEST": "1",
        "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "0",
        "PADDLE_ACP_ASYNC": "0",
    }


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(_STRIP_PREFIXES) or k in _STRIP_NAMES:
            monkeypatch.delenv(k)
    paddle_acp.simulate_restart()
    monkeypatch.setattr(acp, "g_checker", None)
    yield monkeypatch
    paddle_acp.simulate_restart()


@pytest.fixture
def cloud_env(clean_env, tmp_path):
    ckpt = tmp_path / "ckpt"
    for k, v in paddlecloud_env(ckpt).items():
        clean_env.setenv(k, v)
    return ckpt


def ir_guard(ir):
    return legacy_ir_guard() if ir == "legacy" else contextlib.nullcontext()


def run_process(name, ir, restart):
    """One "process": fresh names, fresh scope, fresh programs; returns the scenario's result."""
    with ir_guard(ir), paddle.utils.unique_name.guard(), paddle.static.scope_guard(paddle.static.Scope()):
        assert cs.in_pir() == (ir == "pir")
        return cs.run_scenario(acp, name, restart=restart)


def restart_pair(name, ir):
    """The first run (with its ``break``), a simulated restart, the second run (no ``break``)."""
    first = run_process(name, ir, restart=False)
    paddle_acp.simulate_restart()
    second = run_process(name, ir, restart=True)
    return first, second


def assert_same_losses(first, second):
    common = set(first["losses"]) & set(second["losses"])
    assert common, (first["epochs"], second["epochs"])
    for e in sorted(common):
        assert first["losses"][e] == second["losses"][e], "epoch %s trained differently after the restart" % e


def build(ir, optimizer=True, prefix="u_"):
    """(main, startup) of a small net; ``optimizer=False`` gives a forward-only program."""
    with ir_guard(ir), paddle.utils.unique_name.guard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data(prefix + "x", [-1, 4], "float32")
            loss = paddle.mean(paddle.static.nn.fc(x, 2, weight_attr=paddle.ParamAttr(name=prefix + "w"),
                                                   bias_attr=paddle.ParamAttr(name=prefix + "b")))
            if optimizer:
                paddle.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss


# -- the scenarios, in-process ----------------------------------------------------
@pytest.mark.parametrize("ir", IRS)
def test_full_range_saves_every_epoch_and_restart_has_nothing_left(cloud_env, ir):
    first, second = restart_pair("full", ir)
    assert first["epochs"] == [0, 1, 2]
    assert first["restored_from"] == [acp.CONST_MEMORYINIT] * 3
    assert first["n_status"] == [1, 1, 1]
    assert first["none_before"] and first["none_after"] and first["range_is_stable"]
    assert first["range_name"] == "_range_0"
    # paddle-acp saves the last epoch too (Paddle did not, so its restart re-ran [2]).
    assert second["epochs"] == []
    assert second["none_after"]


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("break_at,expected", [(0, [0, 1, 2]), (1, [1, 2]), (2, [2])])
def test_break_leaves_epoch_unsaved_and_restart_resumes_there(cloud_env, ir, break_at, expected):
    name = "break%d" % break_at
    first, second = restart_pair(name, ir)
    assert first["epochs"] == list(range(break_at + 1))
    assert first["none_after"], "the range must be gone after break"
    assert second["epochs"] == expected
    resumed = acp.CONST_CHECKPOINT if break_at > 0 else acp.CONST_MEMORYINIT
    assert second["restored_from"] == [resumed] * len(expected)
    assert second["status_restored"] == [[resumed]] * len(expected)
    assert second["range_name"] == first["range_name"] == "_range_0"
    assert_same_losses(first, second)
    if break_at == 2:
        assert second["final"] == first["final"]


@pytest.mark.parametrize("ir", IRS)
def test_one_executor_two_programs_both_registered_and_restored(cloud_env, ir):
    first, second = restart_pair("multi", ir)
    assert first["n_status"] == [2, 2, 2]
    assert first["status_restored"] == [[acp.CONST_MEMORYINIT] * 2] * 3
    assert second["epochs"] == [2]
    assert second["n_status"] == [2]
    assert second["status_restored"] == [[acp.CONST_CHECKPOINT] * 2]
    assert second["can_auto_checkpoint"] == [[True, True]]
    # Both programs resumed from their saved state: epoch 2 is bit-identical for each.
    assert len(second["losses"]["2"]) == 2
    assert_same_losses(first, second)
    assert second["final"] == first["final"]


@pytest.mark.parametrize("ir", IRS)
def test_without_running_env_the_range_is_plain(clean_env, tmp_path, ir):
    env = paddlecloud_env(tmp_path / "ckpt")
    env.pop("PADDLE_RUNNING_ENV")
    for k, v in env.items():
        clean_env.setenv(k, v)
    first, second = restart_pair("plain", ir)
    for res in (first, second):
        assert res["epochs"] == [0, 1, 2]
        assert res["restored_from"] == [] and res["n_status"] == []  # _get_train_epoch_range() was None
        assert res["can_auto_checkpoint"] == [[False]] * 3
        assert res["checker_valid"] is False
    assert_same_losses(first, second)
    assert not (tmp_path / "ckpt").exists(), "no state may be created"


def test_restart_of_finished_range_restores_parameters(cloud_env):
    """A finished job restarted trains nothing, yet code after the loop sees the trained state."""
    first, second = restart_pair("full", "pir")
    assert second["final"] == first["final"]


# -- AutoCheckpointChecker ------------------------------------------------------------
def test_checker_reads_paddlecloud_env(cloud_env):
    c = acp.AutoCheckpointChecker()
    assert c.valid()
    assert c.run_env == "PADDLE_EDL_AUTO_CHECKPOINT"
    assert c.platform == "PADDLE_CLOUD"
    assert c.job_id == "compat"
    assert c.trainer_id == 0
    assert c.hdfs_home == "/nonexistent"
    assert c.hdfs_checkpoint_path == str(cloud_env)
    assert c.ce_test == 1
    assert c.save_checkpoint_inter == 0 and isinstance(c.save_checkpoint_inter, int)
    assert c.get_job_path() == "%s/compat" % cloud_env
    assert c.get_range_checkpoint_path("_range_0") == "%s/compat/range/_range_0" % cloud_env
    assert c.get_exe_checkpoint_path("k") == "%s/compat/exe/k" % cloud_env
    assert acp._get_checker() is acp._get_checker()


def test_checker_paths_name_where_the_checkpoints_go(cloud_env, monkeypatch, tmp_path):
    """PADDLE_ACP_CHECKPOINT_URI beside PaddleCloud's variables: the checkpoints go there, and the checker's paths
    say so (they named PaddleCloud's path, where nothing is written); its other fields stay PaddleCloud's."""
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path / "other"))
    c = acp.AutoCheckpointChecker()
    assert c.get_job_path() == "%s/other/compat" % tmp_path
    assert c.get_range_checkpoint_path("_range_0") == "%s/other/compat/range/_range_0" % tmp_path
    assert c.hdfs_checkpoint_path == str(cloud_env)


def test_checker_str_labels_match_values(cloud_env, monkeypatch):
    monkeypatch.setenv("PADDLE_EDL_HDFS_NAME", "hdfs://nn:9000")
    monkeypatch.setenv("PADDLE_EDL_HDFS_UGI", "alice,secret")
    c = acp.AutoCheckpointChecker()
    fields = dict(part.split(":", 1) for part in str(c).split(" "))
    assert fields == {
        "run_env": "PADDLE_EDL_AUTO_CHECKPOINT", "platform": "PADDLE_CLOUD", "job_id": "compat",
        "hdfs_home": "/nonexistent", "hdfs_name": "hdfs://nn:9000", "hdfs_ugi": "alice,***",
        "hdfs_checkpoint_path": str(cloud_env), "trainer_id": "0", "ce_test": "1",
    }
    assert "secret" not in str(c) and c.hdfs_ugi == "alice,secret"


@pytest.mark.parametrize("var", ["PADDLE_JOB_ID", "PADDLE_TRAINER_ID", "PADDLE_EDL_HDFS_CHECKPOINT_PATH"])
def test_checker_missing_variable_raises_config_error(cloud_env, monkeypatch, var):
    monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match=var):
        acp.AutoCheckpointChecker()


def test_checker_without_running_env_is_invalid(clean_env):
    c = acp.AutoCheckpointChecker()
    assert not c.valid()
    assert (c.run_env, c.job_id, c.trainer_id, c.hdfs_checkpoint_path, c.ce_test) == (None,) * 5
    assert c.save_checkpoint_inter == 900


def test_checker_with_acp_uri_is_valid(clean_env, tmp_path):
    clean_env.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    clean_env.setenv("PADDLE_JOB_ID", "j")
    c = acp.AutoCheckpointChecker()
    assert c.valid() and c.job_id == "j" and c.run_env is None
    assert c.get_range_checkpoint_path("_range_1") == "%s/j/range/_range_1" % tmp_path


# -- ExeTrainStatus ---------------------------------------------------------------------
def test_exe_train_status_json_round_trip(tmp_path):
    t = acp.ExeTrainStatus()
    t._epoch_no, t._key, t._hash_key = 3, "k", "k"
    t._checkpoint_path, t._checkpoint_no = "/x/ckpt-2", 2
    t._exe_name, t._program_name, t._restored_from = "exe", "prog", acp.CONST_CHECKPOINT
    t.serialize(str(tmp_path))
    assert "restored_from" not in json.loads((tmp_path / "exe_train_status").read_text())
    u = acp.ExeTrainStatus()
    assert u != t
    u.deserialize(str(tmp_path))
    assert u == t and not (u != t)
    assert u._restored_from is None
    assert json.loads(str(t))["restored_from"] == acp.CONST_CHECKPOINT
    assert (t == object()) is False
    # And through CheckpointSaver, as Paddle stored it.
    from paddle.distributed.fleet.utils.fs import LocalFS

    saver = acp.CheckpointSaver(LocalFS())
    saver.save_checkpoint(str(tmp_path / "st"), [t])
    v = acp.ExeTrainStatus()
    saver.load_checkpoint(str(tmp_path / "st"), [v], trainer_id=0)
    assert v == t


def test_exe_train_status_rejects_incomplete_json():
    with pytest.raises(CheckpointError, match="epoch_no"):
        acp.ExeTrainStatus()._deserialize("{}")


# -- programs ---------------------------------------------------------------------------
@pytest.mark.parametrize("ir", IRS)
def test_check_program_oprole(ir):
    main, startup, _ = build(ir)
    fwd, _, _ = build(ir, optimizer=False)
    assert acp._check_program_oprole(main)
    assert not acp._check_program_oprole(startup)
    assert not acp._check_program_oprole(fwd)
    assert not acp._check_program_oprole(object())
    if ir == "legacy":
        assert not acp._check_program_oprole(main.clone(for_test=True))


@pytest.mark.parametrize("ir", IRS)
def test_can_auto_checkpoint_needs_active_range_and_training_program(cloud_env, ir):
    main, startup, _ = build(ir)
    assert not acp._can_auto_checkpoint(main)  # no active range
    for _ in acp.train_epoch_range(1, 0):
        assert acp._can_auto_checkpoint(main)
        assert not acp._can_auto_checkpoint(startup)
        assert not acp._can_auto_checkpoint("not a program")
        if ir == "legacy":
            with ir_guard(ir):
                assert acp._can_auto_checkpoint(paddle.static.CompiledProgram(main))
                assert not acp._can_auto_checkpoint(main.clone(for_test=True))
                main._is_distributed = True
                try:
                    assert not acp._can_auto_checkpoint(main)
                finally:
                    main._is_distributed = False
    assert not acp._can_auto_checkpoint(main)


@pytest.mark.parametrize("ir", IRS)
def test_auto_checkpoint_is_noop_with_hook_and_registers_without(cloud_env, ir):
    main, startup, loss = build(ir)
    exe = paddle.static.Executor(paddle.CPUPlace())
    assert acp._auto_checkpoint(exe, main) is None  # no range: nothing
    with ir_guard(ir), paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(startup)
        for _ in acp.train_epoch_range(1, 0):
            o = acp._get_train_epoch_range()
            assert acp._auto_checkpoint(exe, main) is None
            assert len(o._exe_status) == 0  # the hook registers on run, not this call
            hook.uninstall()
            try:
                acp._auto_checkpoint(exe, main)
                acp._auto_checkpoint(exe, startup)
                assert len(o._exe_status) == 1
            finally:
                hook.install()
            exe.run(main, feed={"u_x": np.ones((2, 4), "float32")}, fetch_list=[loss])
            assert len(o._exe_status) == 1


@pytest.mark.parametrize("ir", IRS)
def test_range_view_surface(cloud_env, ir):
    main, startup, loss = build(ir)
    exe = paddle.static.Executor(paddle.CPUPlace())
    assert acp._get_train_epoch_range() is None and acp.g_train_epoch_range is None
    seen = []
    with ir_guard(ir), paddle.static.scope_guard(paddle.static.Scope()):
        exe.run(startup)
        for i in acp.train_epoch_range(2, 0):
            o = acp._get_train_epoch_range()
            assert isinstance(o, acp.TrainEpochRange)
            assert o is acp.g_train_epoch_range
            assert o.range is api.active_range() and o.registry is o.range.registry
            assert (o.name, o._name, o.get(), o._epoch_no, o._max_epoch_num) == ("_range_0", "_range_0", i, i, 2)
            exe.run(main, feed={"u_x": np.ones((2, 4), "float32")}, fetch_list=[loss])
            (t,) = o._exe_status.values()
            assert t._program is main and t._epoch_no == i
            assert t._restored_from == acp.CONST_MEMORYINIT
            seen.append((t._checkpoint_no, t._checkpoint_path))
            d = json.loads(o._serialize())
            assert d["name"] == "_range_0" and list(d["exe_status"]) == [t._key]
            assert o._checkpoint_path == os.path.join(str(cloud_env), "compat", "range", "_range_0")
    assert seen[0] == (None, None)
    assert seen[1][0] == 0 and os.path.isdir(seen[1][1])
    with pytest.raises(TypeError):
        acp.TrainEpochRange(3, "x")


def test_module_surface():
    # Paddle's loop: paddle-acp's, keeping Paddle's module globals (g_acp_type, the restart on a new generator)
    assert acp.train_epoch_range.__module__ == "paddle_acp.compat.auto_checkpoint"
    assert (acp.CONST_ACP_TYPE, acp.CONST_DACP_TYPE) == ("acp", "dacp")
    assert acp._get_running_key("exe", "prog") == "exe_prog"
    assert acp._get_logger(20) is acp._get_logger(10) and acp._get_logger(20).name == "auto_checkpoint"
    assert (acp.CONST_CHECKPOINT, acp.CONST_MEMORYINIT) == ("checkpoint", "memory_init")
    from paddle_acp.compat import checkpoint_saver

    assert acp.CheckpointSaver is checkpoint_saver.CheckpointSaver
    assert acp.PaddleModel is checkpoint_saver.PaddleModel
    assert issubclass(acp.ExeTrainStatus, checkpoint_saver.SerializableBase)
    assert list(acp._normal_yield(3)) == [0, 1, 2]
