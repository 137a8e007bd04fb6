"""The runtime's public API: ``train_epoch_range``, ``resumable``, ``active_range``, ``reset`` and the process's range bookkeeping.

Each ``train_epoch_range`` loop is a range named ``_range_0``, ``_range_1``, ... in creation order
(:class:`~paddle_acp.runtime.range.EpochRange`); while one is active, the Executor.run hook feeds it programs.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Generator, Iterable, Iterator, Mapping, Optional

from paddle_acp import config as _config
from paddle_acp.adapter import version as paddle_version
from paddle_acp.errors import AcpError, CheckpointError, ConfigError
from paddle_acp.runtime import early
from paddle_acp.runtime.capture import Site, caller_frame
from paddle_acp.runtime.objects import ScriptState, check_state, tracked
from paddle_acp.runtime.opening import check_range_args
from paddle_acp.runtime.range import EpochRange
from paddle_acp.runtime.restore import CONST_CHECKPOINT, CONST_MEMORYINIT
from paddle_acp.runtime.state import STATE, check_main_thread

__all__ = [
    "CONST_CHECKPOINT",
    "CONST_MEMORYINIT",
    "EpochRange",
    "TrainEpochRange",
    "active_range",
    "final_save_failures",
    "reset",
    "resumable",
    "train_epoch_range",
]

logger = logging.getLogger("paddle_acp")

# the range class under its earlier name (compat.auto_checkpoint.TrainEpochRange is another class)
TrainEpochRange = EpochRange

# one message per range whose final checkpoint failed (``paddle-acp run`` exits 1 when any)
final_save_failures = STATE.final_save_failures


def active_range() -> Optional[EpochRange]:
    """The range whose loop runs now, or None."""
    return STATE.active


def train_epoch_range(max_epoch_num: int, save_checkpoint_inter: Optional[float] = None,
                      state: Optional[Mapping[str, Any]] = None) -> Generator[int, None, None]:
    """Yield epoch numbers; checkpoint the training state at epoch ends and resume after a restart.

    ``save_checkpoint_inter``: seconds between checkpoints (0 = every epoch; ``None``: ``PADDLE_ACP_SAVE_INTERVAL``
    / ``PADDLE_EDL_SAVE_CHECKPOINT_INTER``, default 900); the last epoch is always saved. A negative
    ``max_epoch_num`` means no end. Every checkpoint also holds the script's RNG objects
    (:mod:`paddle_acp.runtime.capture`), the objects of ``state`` (name -> object) and those of
    :func:`paddle_acp.track`, restored in place before a resumed run's first epoch.
    """
    max_epoch_num = check_range_args(max_epoch_num, save_checkpoint_inter)  # alike with checkpointing off
    registered = check_state(state)
    clash = sorted(set(registered) & set(tracked()))
    if clash:
        raise ConfigError(f"state= names {', '.join(map(repr, clash))}, which paddle_acp.track registered already")
    cfg = _config.from_env()
    if not cfg.active:
        if not STATE.logged_inactive:
            logger.info("paddle-acp checkpointing is off: %s", cfg.inactive_reason)
            STATE.logged_inactive = True
        end = sys.maxsize if max_epoch_num < 0 else max_epoch_num
        yield from range(0, end)
        return
    check_main_thread("train_epoch_range")
    paddle_version.refuse_pir_mode()  # Paddle 2.6: legacy IR only
    paddle_version.warn_rng_limit()  # Paddle 2.6: the CPU engine state cannot be carried across processes
    if STATE.active is not None:
        raise CheckpointError(f"train_epoch_range cannot be nested (range {STATE.active.name} is active)")
    frame = caller_frame()
    site = Site(frame) if frame is not None else None
    del frame
    name = STATE.next_range_name()
    script = ScriptState(name, site.found if site is not None else {}, {**tracked(), **registered}, site)
    script.check()
    r = EpochRange.open(max_epoch_num, name, cfg, save_checkpoint_inter, script)
    if r.script:
        logger.info("range %s: every checkpoint also saves %s", r.name, r.script.describe())
    prev = STATE.hooked
    while prev is not None and not prev.has_unrestored_state:
        prev = prev.inherited
    r.inherited = prev
    STATE.active = STATE.hooked = r
    closed = False
    owner = os.getpid()
    try:
        yield from r.epochs()
    except GeneratorExit:  # the loop was left early (break, or an exception in its body)
        closed = True
        raise
    finally:
        if os.getpid() == owner:  # a forked child leaves its parent's range alone: it writes, logs and closes nothing
            _leave(r, closed)


def _leave(r: EpochRange, closed: bool) -> None:
    """The process that opened ``r`` leaves its loop: unrestored state written, then the range closed."""
    STATE.active = None
    try:
        if r.failed or sys.is_finalizing():
            pass  # the range already raised its error; at interpreter exit imports fail
        elif closed:  # an exception raised here would be "ignored" (printed as noise): log it
            if r.epoch_no >= 0:
                logger.info("range %s: the loop was left inside epoch %d (break, return or an exception): "
                            "epoch %d is not saved; a restart trains it again from the last checkpoint before it",
                            r.name, r.epoch_no, r.epoch_no)
            try:
                r.write_unrestored_into_global_scope()
            except AcpError as exc:
                logger.error("%s", exc)
        else:
            r.write_unrestored_into_global_scope()
    finally:
        if r.digests is not None:
            r.digests.release()
        STATE.hooked = r if r.has_unrestored_state else None
        r.script.release()
        if sys.is_finalizing():  # garbage-collected at interpreter exit: imports would fail
            r.persister.closed = True
        else:
            r.close()


def resumable(iterable: Iterable[Any], save_every_steps: Optional[int] = None) -> Iterator[Any]:
    """Iterate an epoch's batches so that checkpoints can be taken, and resumed, mid-epoch.

    Inside a range: checkpoints every ``save_every_steps`` batches (and when the interval passed), saves at the
    next batch after a preemption signal, and after a restart skips the batches done (through the loader's
    ``set_state_dict`` where it has one, else by re-iterating a deterministic loader). Outside: ``iter(iterable)``.
    """
    r = STATE.active
    if r is None:
        return iter(iterable)
    steps: Iterator[Any] = r.steps(iterable, save_every_steps)
    return steps


def reset() -> None:
    """Forget all process state, as a restart would (waits for the active range's save first)."""
    STATE.reset()
    early.forget()

