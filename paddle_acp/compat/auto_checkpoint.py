"""Drop-in for ``paddle.base.incubate.checkpoint.auto_checkpoint``, fixed for Paddle 3.x.

``python -m paddle_acp run`` makes Paddle's module names (``paddle.base.incubate.checkpoint.auto_checkpoint`` and
``paddle.incubate.checkpoint.auto_checkpoint``) resolve here, so scripts written for Paddle's API run unchanged: the
names and their meaning are Paddle's, the work paddle-acp's. Differences: a missing or invalid variable raises
:class:`paddle_acp.errors.ConfigError` instead of ``sys.exit(1)``; programs reach the range through paddle-acp's
``Executor.run`` hook (:func:`_auto_checkpoint` only forwards when it is not installed). Paddle's module globals keep
Paddle's meaning; replacing ``generator`` (Paddle's tests' ``_reset_generator()``) is an in-process restart, as
:func:`paddle_acp.simulate_restart`. Parts: :mod:`.acp_checker`, :mod:`.acp_status`, :mod:`.acp_range`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Dict, Iterator, Optional, Union

from paddle_acp import config as _config
from paddle_acp.adapter.programs import is_distributed, is_program, program_info, unwrap
from paddle_acp.compat.acp_checker import AutoCheckpointChecker
from paddle_acp.compat.acp_range import TrainEpochRange, _get_train_epoch_range
from paddle_acp.compat.acp_status import ExeTrainStatus
from paddle_acp.compat.checkpoint_saver import CheckpointSaver, PaddleModel, SerializableBase
from paddle_acp.errors import AcpError
from paddle_acp.runtime import api as _runtime
from paddle_acp.runtime.api import CONST_CHECKPOINT, CONST_MEMORYINIT, active_range
from paddle_acp.runtime.save_decision import WAIT
from paddle_acp.runtime.state import STATE, check_main_thread

__all__ = [
    "train_epoch_range",
    "TrainEpochRange",
    "AutoCheckpointChecker",
    "ExeTrainStatus",
    "CheckpointSaver",
    "PaddleModel",
    "SerializableBase",
    "CONST_CHECKPOINT",
    "CONST_MEMORYINIT",
    "CONST_ACP_TYPE",
    "CONST_DACP_TYPE",
]

logger = logging.getLogger("paddle_acp")

# -- Paddle's module globals ---------------------------------------------------------
g_checker: Optional[AutoCheckpointChecker] = None
CONST_DACP_TYPE = "dacp"  # Paddle's data-loader checkpoints (never set by paddle-acp)
CONST_ACP_TYPE = "acp"  # checkpoints by epoch range
g_acp_type: Optional[str] = None
# Paddle's per-program-name cache: kept assignable for Paddle's tests, not consulted.
g_program_attr: Dict[str, bool] = {}


class _RangeNames:
    """Paddle's default range-name generator (``generator("_range_")``); tests replace it."""

    def __call__(self, key: str = "_range_") -> str:
        return STATE.next_range_name()


generator = _RangeNames()
_seen_generator = generator
_paddle_logger: Optional[logging.Logger] = None


def _get_logger(log_level: Union[int, str], name: str = "auto_checkpoint") -> logging.Logger:
    """Paddle's logger for its auto-checkpoint code and tests (the same logger on every call, as Paddle's)."""
    global _paddle_logger
    if _paddle_logger is not None:
        return _paddle_logger
    log = logging.getLogger(name)
    log.setLevel(log_level)
    log.propagate = False
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"))
    log.addHandler(handler)
    _paddle_logger = log
    return log


def _thread_checker() -> None:
    """Paddle's check that auto-checkpointing runs on the main thread (a CheckpointError here)."""
    check_main_thread("auto checkpoint")


def _restart_if_reset() -> None:
    """Paddle's in-process restart: a replaced ``generator`` starts the process's ranges afresh."""
    global _seen_generator
    if generator is not _seen_generator:
        _seen_generator = generator
        if STATE.active is None:
            logger.info("auto_checkpoint.generator was replaced: ranges restart from _range_0 "
                        "(an in-process restart, as Paddle's _reset_generator() means it)")
            STATE.reset()


def train_epoch_range(max_epoch_num: int, save_checkpoint_inter: Optional[float] = None) -> Iterator[int]:
    """Paddle's ``train_epoch_range``: paddle-acp's loop, with Paddle's module globals kept. Every due checkpoint
    is taken (Paddle saved synchronously) unless ``PADDLE_ACP_BUSY_POLICY`` chooses otherwise."""
    global g_acp_type
    _restart_if_reset()
    if _config.from_env().active:
        g_acp_type = CONST_ACP_TYPE
    every_due_save = not _config.busy_policy_chosen()
    epochs = _runtime.train_epoch_range(max_epoch_num, save_checkpoint_inter)
    try:
        for i in epochs:
            r = active_range()
            if every_due_save and r is not None and r.schedule.busy_policy != WAIT:
                r.schedule.set_busy_policy(WAIT)  # (after the range's start line, which named the default)
                logger.info("range %s: Paddle's train_epoch_range takes every due checkpoint: one due while the "
                            "previous one is still being written waits for it (PADDLE_ACP_BUSY_POLICY=wait; set "
                            "PADDLE_ACP_BUSY_POLICY to choose another)", r.name)
            yield i
    finally:
        epochs.close()  # leaving the loop early closes paddle-acp's too


# -- the environment ------------------------------------------------------------------
def _get_checker() -> AutoCheckpointChecker:
    """The process's checker, read once (assign ``g_checker`` to replace it, as Paddle's tests do)."""
    global g_checker
    if g_checker is None:
        g_checker = AutoCheckpointChecker()
    return g_checker


def __getattr__(name: str) -> Optional[TrainEpochRange]:  # Paddle's module global, kept live
    if name == "g_train_epoch_range":
        return _get_train_epoch_range()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- programs ----------------------------------------------------------------------
def _check_program_oprole(program: Any) -> bool:  # Paddle's programs are untyped: Any
    """True when ``program`` has backward and optimizer ops (PIR and legacy IR)."""
    try:
        info = program_info(program)
    except AcpError:
        raise  # e.g. a PIR program on Paddle 2.6: refused with its reason, never silently skipped
    except Exception as exc:
        logger.debug("cannot analyse %r: %s", type(program), exc)
        return False
    return info.has_backward and info.has_optimizer


def _can_auto_checkpoint(prog: Any) -> bool:
    """Whether ``prog`` would be checkpointed now: a non-distributed training program while a range is active."""
    if active_range() is None or not is_program(prog):
        return False
    program = unwrap(prog)
    if is_distributed(program):
        return False
    return _check_program_oprole(program)


def _auto_checkpoint(exe: Any, program: Any) -> None:
    """Paddle's executor hook: registers ``program`` with the active range unless paddle-acp's hook did."""
    from paddle_acp.runtime import hook

    return hook.paddle_auto_checkpoint(exe, program)


def _get_valid_program(prog: Any) -> Any:
    """The Program inside ``prog`` (a CompiledProgram's own Program), as Paddle's helper."""
    return unwrap(prog)


def _get_running_key(exe_name: str, program_name: str) -> str:
    """Paddle's key of an (executor, program) pair."""
    return f"{exe_name}_{program_name}"


def _normal_yield(max_epoch_num: int) -> Iterator[int]:
    """Paddle's plain epoch loop (what ``train_epoch_range`` is when checkpointing is off)."""
    end = sys.maxsize if max_epoch_num < 0 else max_epoch_num
    yield from range(0, end)
