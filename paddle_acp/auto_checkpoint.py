"""Drop-in for ``paddle.base.incubate.checkpoint.auto_checkpoint``, fixed for Paddle 3.x.

``python -m paddle_acp run`` makes Paddle's module names resolve here, so
scripts written for Paddle's API run unchanged.
"""

from __future__ import annotations

from .epoch_range import CONST_CHECKPOINT, CONST_MEMORYINIT, TrainEpochRange, active_range, train_epoch_range
from .programs import is_training_program

__all__ = [
    "train_epoch_range",
    "TrainEpochRange",
    "CONST_CHECKPOINT",
    "CONST_MEMORYINIT",
]


def _get_train_epoch_range():
    """The active range, or None."""
    return active_range()


def _can_auto_checkpoint(program) -> bool:
    return active_range() is not None and is_training_program(program)


def _auto_checkpoint(exe, program) -> None:
    """Kept for Paddle's executor, which still calls it; the Executor.run hook does the work."""
    return None
