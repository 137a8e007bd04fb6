"""The adapter functions that keep Paddle's internals out of the runtime and compat layers.

paddle_acp/adapter/executor.py (the Executor.run patch point, Paddle's own auto-checkpoint call, an
executor's place) and the program helpers of paddle_acp/adapter/programs.py that replace direct reads of
Paddle's internals in runtime/ and compat/ (tests/integration/test_layers.py lists where they are still read directly):
each gives what the direct read gives, on real Paddle objects of both IRs.
"""
import os
import sys

import paddle
import pytest

import paddle_acp  # noqa: F401  # installs the Executor.run hook
from paddle_acp.adapter import executor as adapter_executor
from paddle_acp.adapter.programs import auto_checkpoint_name, is_distributed, is_program, persistable_predicate
from paddle_acp.runtime import hook

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from support import models  # noqa: E402
from support.models import IRS, ir_mode  # noqa: E402

paddle.enable_static()


def test_the_hook_is_the_run_of_paddles_executor_class():
    from paddle.base.executor import Executor

    run = adapter_executor.executor_run()
    assert run is Executor.run is paddle.static.Executor.run
    assert hook.installed() and run.__paddle_acp_original__ is not run  # the hook's patch, over Paddle's run


def test_set_executor_run_replaces_and_restores_run():
    from paddle.base.executor import Executor

    patched = adapter_executor.executor_run()
    calls = []

    def run(self, *args, **kwargs):
        calls.append(args)
        return "ran"

    adapter_executor.set_executor_run(run)
    try:
        assert Executor.run is run
        assert paddle.static.Executor(paddle.CPUPlace()).run("p") == "ran" and calls == [("p",)]
    finally:
        adapter_executor.set_executor_run(patched)
    assert Executor.run is patched


def test_paddles_own_auto_checkpoint_call_reaches_the_hook_module():
    import paddle.base.executor as executor_mod

    if hasattr(executor_mod, "acp"):
        assert executor_mod.acp is hook
        assert executor_mod.acp._auto_checkpoint is hook.paddle_auto_checkpoint


def test_executor_place_is_the_executors_place():
    place = paddle.CPUPlace()
    exe = paddle.static.Executor(place)
    assert adapter_executor.executor_place(exe) is getattr(exe, "place", None)
    assert str(adapter_executor.executor_place(exe)) == str(place)
    assert adapter_executor.executor_place(object()) is None


@pytest.mark.parametrize("ir", IRS)
def test_is_program_tells_programs_from_other_objects(ir):
    with ir_mode(ir):
        main, startup, _ = models.build("sgd")
        programs = [main, startup] + ([paddle.static.CompiledProgram(main)] if ir == "legacy" else [])
        for obj in programs:
            assert is_program(obj), obj
        for obj in ["not a program", None, 3, object()]:
            assert not is_program(obj), obj


@pytest.mark.parametrize("ir", IRS)
def test_is_distributed_and_auto_checkpoint_name_read_paddles_marks(ir):
    with ir_mode(ir):
        main, _, _ = models.build("sgd")
    assert is_distributed(main) is bool(getattr(main, "_is_distributed", False)) is False
    assert auto_checkpoint_name(main) is getattr(main, "_auto_checkpoint_name", None)
    try:
        main._is_distributed = True
    except AttributeError:
        pytest.skip(f"a {type(main).__name__} takes no new attributes")
    main._auto_checkpoint_name = "__paddle_checkpoint__0"
    try:
        assert is_distributed(main) is True
        assert auto_checkpoint_name(main) == "__paddle_checkpoint__0"
    finally:
        main._is_distributed = False
        del main._auto_checkpoint_name


def test_persistable_predicate_is_paddles():
    assert persistable_predicate() is paddle.static.io.is_persistable
