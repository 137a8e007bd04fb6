"""Epoch ranges: ``train_epoch_range`` and the per-range state it saves and restores.

Each ``train_epoch_range`` loop in a script is a range named ``_range_0``,
``_range_1``, ... in creation order, with its own epoch counter and
checkpoints. While a range is active, the Executor.run hook hands every
program to :meth:`TrainEpochRange.on_run`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Iterator, Optional

from . import config as _config
from . import rng_state
from .checkpointer import Checkpointer, LoadedCheckpoint, Snapshot
from .errors import AcpError, CheckpointError, ConfigError
from .manifest import RangeRecord
from .programs import program_info, unwrap
from .registry import Registry
from .saver import Saver
from .storage import open_storage

logger = logging.getLogger("paddle_acp")

CONST_CHECKPOINT = "checkpoint"
CONST_MEMORYINIT = "memory_init"

_active: Optional["TrainEpochRange"] = None
_range_counter = 0
_logged_inactive = False


def active_range() -> Optional["TrainEpochRange"]:
    return _active


def _check_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise CheckpointError(
            f"paddle-acp {what} must run on the main thread, not in thread "
            f"{threading.current_thread().name!r}"
        )


def _next_range_name() -> str:
    global _range_counter
    name = f"_range_{_range_counter}"
    _range_counter += 1
    return name


class TrainEpochRange:
    """The state of one active ``train_epoch_range`` loop."""

    def __init__(self, max_epoch_num: int, name: str, cfg: _config.CheckpointConfig, save_checkpoint_inter=None):
        if isinstance(max_epoch_num, bool) or not isinstance(max_epoch_num, int):
            raise ConfigError(f"max_epoch_num={max_epoch_num!r} must be an integer")
        self.max_epoch_num = max_epoch_num
        self.name = name
        self.cfg = cfg
        if save_checkpoint_inter is None:
            self.save_interval = cfg.save_interval
        else:
            self.save_interval = _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
        self.epoch_no = -1
        self.restored_from = CONST_MEMORYINIT
        self.restored_number: Optional[int] = None
        self.registry = Registry()
        self.storage = open_storage(cfg.uri)
        self.checkpointer = Checkpointer(self.storage, cfg.job_id, name, cfg.max_to_keep)
        self.saver = Saver(self._persist, cfg.async_save)
        self._loaded: Optional[LoadedCheckpoint] = None
        self._last_save = time.monotonic()
        self.is_writer = cfg.trainer_id == 0
        if self.is_writer:
            try:
                self.checkpointer.write_job_marker()
            except AcpError as exc:
                raise ConfigError(
                    f"checkpoint location {cfg.uri!r} (from {cfg.source}) is not writable: {exc}"
                ) from exc
        loaded = self.checkpointer.load_latest()
        if loaded is not None:
            self._loaded = loaded
            self.epoch_no = loaded.manifest.range.epoch_no
            self.restored_from = CONST_CHECKPOINT
            self.restored_number = loaded.manifest.number

    # -- the loop ------------------------------------------------------------
    def epochs(self) -> Iterator[int]:
        _check_main_thread("train_epoch_range")
        end = sys.maxsize if self.max_epoch_num < 0 else self.max_epoch_num
        start = self.epoch_no + 1
        if self._loaded is not None:
            m = self._loaded.manifest
            if m.rng is not None:
                rng_state.restore(m.rng)
            logger.info(
                "range %s of job %s: resuming at epoch %d from checkpoint %d (%s)",
                self.name, self.cfg.job_id, start, m.number, self._loaded.path,
            )
        self._last_save = time.monotonic()
        for i in range(start, end):
            self.epoch_no = i
            yield i
            self._end_of_epoch(last=(i == end - 1))

    def _end_of_epoch(self, last: bool) -> None:
        if not self.is_writer:
            return
        if last or time.monotonic() - self._last_save >= self.save_interval:
            self.save()

    # -- hook entry point ----------------------------------------------------
    def on_run(self, exe, program, scope) -> None:
        inner = unwrap(program)
        if self.registry.lookup(inner, scope) is not None:
            return
        info = program_info(inner)
        if not info.is_training:
            return
        _check_main_thread("checkpointing")
        place = getattr(exe, "place", None)
        entry, is_new = self.registry.add(info, inner, scope, place)
        if not is_new:
            return
        logger.info("range %s: registered training program %s (%s)", self.name, entry.key, info.label)
        if self._loaded is None:
            return
        m = self._loaded.manifest
        rec = m.program(entry.key)
        if rec is None:
            saved = {t.name for p in m.programs for t in p.tensors}
            clash = sorted(set(info.persistables) & saved)
            if clash:
                raise CheckpointError(
                    f"training program {entry.key} ({info.label}) does not match any program in checkpoint "
                    f"{m.number} at {self._loaded.path}, yet shares variables with it ({', '.join(clash[:5])}"
                    f"{', ...' if len(clash) > 5 else ''}): the script's model changed since the checkpoint "
                    "was written. Use a new PADDLE_JOB_ID or remove the old checkpoints."
                )
            logger.warning(
                "range %s: training program %s is not in checkpoint %d; it starts from its current state",
                self.name, entry.key, m.number,
            )
            return
        entry.restore(self._loaded.take_program_tensors(entry.key), rec.lr_scheduler)
        logger.info("range %s: restored program %s from checkpoint %d", self.name, entry.key, m.number)

    # -- saving --------------------------------------------------------------
    def save(self) -> None:
        _check_main_thread("checkpointing")
        t0 = time.perf_counter()
        waited = self.saver.wait()
        irs = sorted({e.info.ir for e in self.registry.entries})
        import paddle

        snap = Snapshot(
            range=RangeRecord(self.name, self.epoch_no, self.max_epoch_num),
            programs=[e.capture() for e in self.registry.entries],
            rng=rng_state.capture(),
            paddle_version=paddle.__version__,
            ir="+".join(irs),
        )
        snap.stall_seconds = time.perf_counter() - t0
        snap.waited_seconds = waited
        self.saver.submit(snap)
        self._last_save = time.monotonic()

    def _persist(self, snap: Snapshot) -> None:
        t0 = time.perf_counter()
        number, nbytes = self.checkpointer.save(snap)
        dt = time.perf_counter() - t0
        logger.info(
            "range %s: saved checkpoint %d (epoch %d): %d bytes, stall %.3f s, persist %.3f s, %.1f MB/s",
            self.name, number, snap.range.epoch_no, nbytes, snap.stall_seconds, dt,
            nbytes / dt / 1e6 if dt > 0 else 0.0,
        )

    def close(self) -> None:
        self.saver.wait()

    def get(self) -> int:
        return self.epoch_no


def train_epoch_range(max_epoch_num: int, save_checkpoint_inter=None) -> Iterator[int]:
    """Yield epoch numbers; checkpoint the training state at epoch ends and resume after a restart.

    ``save_checkpoint_inter``: seconds between checkpoints (0 = every epoch);
    ``None`` takes ``PADDLE_ACP_SAVE_INTERVAL`` / ``PADDLE_EDL_SAVE_CHECKPOINT_INTER``
    (default 900). The last epoch is always saved. A negative
    ``max_epoch_num`` means no end.
    """
    global _active, _logged_inactive
    cfg = _config.from_env()
    if not cfg.active:
        if save_checkpoint_inter is not None:
            _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
        if not _logged_inactive:
            logger.info("paddle-acp checkpointing is off: %s", cfg.inactive_reason)
            _logged_inactive = True
        end = sys.maxsize if max_epoch_num < 0 else max_epoch_num
        yield from range(0, end)
        return
    _check_main_thread("train_epoch_range")
    if _active is not None:
        raise CheckpointError(f"train_epoch_range cannot be nested (range {_active.name} is active)")
    r = TrainEpochRange(max_epoch_num, _next_range_name(), cfg, save_checkpoint_inter)
    _active = r
    try:
        yield from r.epochs()
    finally:
        _active = None
        r.close()


def reset() -> None:
    """Forget all process state, as a restart would (waits for a pending save first)."""
    global _active, _range_counter, _logged_inactive
    if _active is not None:
        _active.close()
    _active = None
    _range_counter = 0
    _logged_inactive = False
