"""The epoch range: one ``train_epoch_range`` loop, its epochs and the programs it feeds on.

:class:`EpochRange` is opened by :meth:`EpochRange.open` (the storage, the job marker and
writer fence, the checkpoint it resumes from: all I/O happens there, the constructor does
none) and iterated by :meth:`EpochRange.epochs`. Its parts live beside it:
:mod:`~paddle_acp.runtime.steps` (mid-epoch steps), :mod:`~paddle_acp.runtime.persist`
(saving) and :mod:`~paddle_acp.runtime.restore` (restoring).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, Iterator, Optional

from paddle_acp import config as _config
from paddle_acp.adapter import rng as rng_state
from paddle_acp.adapter.programs import program_info, unwrap
from paddle_acp.errors import AcpError, CheckpointError, ConfigError
from paddle_acp.format.arena import Arena
from paddle_acp.format.checkpointer import Checkpointer
from paddle_acp.format.fencing import Fence
from paddle_acp.format.metrics import MetricsLog
from paddle_acp.format.metrics_record import MetricsRecord
from paddle_acp.format.multirank import GlobalCheckpointer
from paddle_acp.runtime import budget as host_budget
from paddle_acp.runtime import interrupt, preemption
from paddle_acp.runtime.agree import Agreement
from paddle_acp.runtime.digests import EpochDigests
from paddle_acp.runtime.objects import ScriptState
from paddle_acp.runtime.persist import PersistMixin
from paddle_acp.runtime.registry import Registry
from paddle_acp.runtime.restore import Restorer
from paddle_acp.runtime.saver import Saver
from paddle_acp.runtime.state import STATE, check_main_thread
from paddle_acp.runtime.steps import StepsMixin
from paddle_acp.storage.base import redact
from paddle_acp.storage.registry import open_storage

logger = logging.getLogger("paddle_acp")

_static = None


def _paddle_static():
    global _static
    if _static is None:
        import paddle.static

        _static = paddle.static
    return _static


def open_storage_for(cfg: _config.CheckpointConfig):
    if cfg.uri is None:
        raise ConfigError(f"checkpointing is off: {cfg.inactive_reason}")
    return open_storage(cfg.uri, cfg.storage)


class EpochRange(StepsMixin, PersistMixin):
    """The state of one active ``train_epoch_range`` loop (``paddle_acp.active_range()``)."""

    @classmethod
    def open(cls, max_epoch_num: int, name: str, cfg: _config.CheckpointConfig,
             save_checkpoint_inter=None) -> "EpochRange":
        """Open a range: validate the arguments, open the storage, write the job marker (trainer 0)
        and take the writer fence (every rank that writes), load the checkpoint it resumes from."""
        check_range_args(max_epoch_num, save_checkpoint_inter)
        storage = open_storage_for(cfg)
        r = cls(max_epoch_num, name, cfg, storage, save_checkpoint_inter)
        r._open()
        return r

    def __init__(self, max_epoch_num: int, name: str, cfg: _config.CheckpointConfig, storage,
                 save_checkpoint_inter=None):
        """No I/O here: :meth:`open` builds a range and opens it."""
        check_range_args(max_epoch_num, save_checkpoint_inter)
        self.max_epoch_num = max_epoch_num
        self.name = name
        self.cfg = cfg
        if save_checkpoint_inter is None:
            self.save_interval = cfg.save_interval
        else:
            self.save_interval = _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
        self.epoch_no = -1
        self.registry = Registry()
        self.storage = storage
        # several ranks (PADDLE_TRAINERS_NUM > 1): every rank writes its part, rank 0 commits
        self.multi = cfg.multi_rank
        self.rank = cfg.trainer_id
        self.fence: Optional[Fence] = None
        self.checkpointer = Checkpointer(self.storage, cfg.job_id, name, cfg.max_to_keep, single_writer=cfg.trainer_id == 0)
        self.gcheckpointer = GlobalCheckpointer(
            self.storage, cfg.job_id, name, cfg.trainer_id, cfg.world_size or 1, cfg.max_to_keep, cfg.part_timeout
        )
        self.restorer = Restorer(name, cfg, self.checkpointer, self.gcheckpointer, self.release_hook)
        self.mode: Optional[str] = None  # decided at each save (multi-rank)
        self._mode_logged: Optional[str] = None
        self.saver = Saver(self._persist, cfg.async_save)
        self._arena = Arena()
        self._arena2 = Arena()  # the ``queue`` policy's second buffer, allocated when first needed
        self._queue_ok: Optional[bool] = None  # whether that buffer fits in host memory (decided once)
        self._skip_streak = 0
        self._arena_thread: Optional[threading.Thread] = None
        # PADDLE_ACP_HOST_MEMORY, or the memory available at the first registration: the bound of
        # the snapshot buffers; a state larger than it is saved through it in chunks
        self._budget: Optional[host_budget.Budget] = None
        self._state_size = 0  # the registered programs' state, from the tensors' metadata
        self._stream_logged = False
        self._closed = False  # ended: no more saves, the arena is freed
        self._seen_program: Any = None  # the last registered (program, scope) run
        self._seen_scope: Any = None
        self.metrics = MetricsLog(self.storage, cfg.job_id, cfg.trainer_id)
        self._last_save = time.monotonic()
        self._base_checked = False  # the marks of the checkpoint resumed from, checked at the first save
        self.is_writer = self.multi or cfg.trainer_id == 0
        self.step: Optional[int] = None  # batches done in the current epoch (resumable loops only)
        self._epoch_start_rng: Optional[dict] = None
        self._epoch_start_objects: Optional[dict] = None
        # the script's own objects saved with each checkpoint (set by train_epoch_range)
        self.script = ScriptState(name, {}, {})
        self._loader_state = None
        self.inherited: Optional[EpochRange] = None  # an ended range that still holds unrestored state
        self._final_submitted = False  # the save after the last epoch was submitted
        self._last_persist_error: Optional[BaseException] = None  # of the last save that ended
        self.failed = False  # registering a program raised (e.g. the model changed since the checkpoint)
        self.exit_on_preempt = _config.exit_on_preempt_from_env()
        self.watcher = preemption.PreemptionWatcher(_config.preempt_signals_from_env(), self._preempt_point,
                                                    interrupt.preempted)
        self.busy_policy = cfg.busy_policy
        # several ranks take the same checkpoints: rank 0's save plan decides their due points (runtime.agree)
        self.agreement = Agreement(storage, self.gcheckpointer.dir, name, cfg.trainer_id, cfg.busy_policy,
                                   self.save_interval) if self.multi else None
        # ``paddle-acp check``: the range ends after this many epochs; per-epoch digests go to a file
        self._check_epochs = _config.check_epochs_from_env()
        self.digests = EpochDigests.for_range(_config.check_digests_from_env())

    def _open(self) -> None:
        """The range's I/O before its first epoch: job marker and fence, the checkpoint to resume from.
        Every rank that writes takes its own fence (a generation of its rank) before anything it deletes."""
        cfg = self.cfg
        if self.is_writer:
            marker = (self.storage.uri, cfg.job_id)
            try:
                if cfg.trainer_id == 0 and marker not in STATE.marked_jobs:  # once per process, not per range
                    self.checkpointer.write_job_marker()
                    STATE.marked_jobs.add(marker)
                self.fence = STATE.fence_for(self.storage, cfg.job_id, cfg.trainer_id)
            except AcpError as exc:
                raise ConfigError(
                    f"checkpoint location {redact(cfg.uri)!r} (from {cfg.source}) is not reachable or not writable: {exc}"
                ) from exc
            self.checkpointer.fence = self.gcheckpointer.fence = self.fence
        if cfg.trainer_id > 0 and cfg.world_size is None:
            logger.warning(
                "PADDLE_TRAINER_ID=%d but PADDLE_TRAINERS_NUM is not set: this trainer restores trainer 0's state "
                "and writes nothing. Set PADDLE_TRAINERS_NUM (paddle.distributed.launch does) for per-rank state.",
                cfg.trainer_id,
            )
        cache = STATE.local_cache(cfg, self.storage)
        if cache is not None:  # local copies of remote checkpoints: written by the writer, read by restore
            self.checkpointer.cache = cache.for_range(cfg.job_id, self.name)
            self.gcheckpointer.cache = cache.for_range(cfg.job_id, self.name, cfg.trainer_id)
        # a restore larger than the budget is neither mapped (local) nor held in memory (remote)
        self.checkpointer.memory_budget = self.gcheckpointer.memory_budget = host_budget.decide(cfg.host_memory).nbytes
        self.restorer.load_newest()
        self.epoch_no = self.restorer.resume_epoch
        if self.agreement is not None:  # rank 0: a fresh save plan, before any training step
            self.agreement.fence = self.fence
            self.agreement.start(self.gcheckpointer.base)
        if self.is_writer:  # written with the first save's metrics: marks a (re)start in `paddle-acp stats`
            self.metrics.add(MetricsRecord.start(
                range=self.name, restored=self.restorer.restored_number, policy=self.busy_policy,
                restore_source=self.restorer.loaded.source if self.restorer.loaded is not None else None))

    # -- the loop ------------------------------------------------------------
    def epochs(self) -> Iterator[int]:
        check_main_thread("train_epoch_range")
        end = sys.maxsize if self.max_epoch_num < 0 else self.max_epoch_num
        if self._check_epochs is not None and self._check_epochs < end:
            logger.info("range %s: ends after epoch %d (PADDLE_ACP_CHECK_EPOCHS, set by paddle-acp check)",
                        self.name, self._check_epochs - 1)
            end = self._check_epochs
        start = self.epoch_no + 1
        self.restorer.resume_rng(start, self.script)
        self._log_plan(start, end)
        self._last_save = time.monotonic()
        if self.agreement is not None:
            self.agreement.restart_clock()
        self.watcher.install()
        try:
            for i in range(start, end):
                self.epoch_no = i
                self.step = None
                mid_epoch = self.restorer.resume_step is not None
                if not mid_epoch:
                    self._epoch_start_rng = rng_state.capture()
                    self._epoch_start_objects = self.script.capture()
                else:  # a mid-epoch resume replays the epoch from its start
                    self._epoch_start_rng = self.restorer.resume_extra.get("epoch_start_rng")
                    self._epoch_start_objects = self.restorer.resume_extra.get("epoch_start_objects")
                if self.digests is not None:
                    self.digests.start_epoch(self.name, i, mid_epoch)
                yield i
                if self.restorer.resume_step is not None:
                    raise CheckpointError(
                        f"range {self.name}: the checkpoint was taken at step {self.restorer.resume_step} of epoch {i}, "
                        "but this epoch did not iterate its data through paddle_acp.resumable(...)"
                    )
                self.step = None
                if self.digests is not None:
                    self.digests.end_epoch(self, i, mid_epoch)
                self._end_of_epoch(last=(i == end - 1))
        finally:
            self.watcher.uninstall()

    def _log_plan(self, start: int, end: int) -> None:
        """Say at the start when and where checkpoints will be taken (a short run with the default
        interval of 900 s checkpoints only after its last epoch: a kill before that loses it all)."""
        where = f"{self.storage.uri.rstrip('/')}/{self.checkpointer.dir}"
        if not self.is_writer:
            logger.info("range %s of job %s: trainer %d restores from %s; only trainer 0 writes checkpoints",
                        self.name, self.cfg.job_id, self.cfg.trainer_id, where)
            return
        if start >= end:
            return
        if self.save_interval == 0:
            when = "at the end of every epoch"
        elif self.multi:
            when = (f"at an epoch end about {self.save_interval:g} s after the previous checkpoint, as rank 0's clock "
                    "says (the second epoch end after it said so, on every rank alike; save_checkpoint_inter / "
                    "PADDLE_ACP_SAVE_INTERVAL; 0 = every epoch)")
        else:
            when = (f"at the end of the first epoch ending {self.save_interval:g} s or more after the previous "
                    "checkpoint (save_checkpoint_inter / PADDLE_ACP_SAVE_INTERVAL; 0 = every epoch)")
        last = "" if self.max_epoch_num < 0 else f" and after the last epoch ({end - 1})"
        logger.info("range %s of job %s: checkpoints go to %s %s%s", self.name, self.cfg.job_id, where, when, last)

    def _end_of_epoch(self, last: bool) -> None:
        if self.watcher.received is not None:
            self._preempt()
        if not self.is_writer:
            return
        if last:
            self.save(final=True)
            self._final_submitted = True
        elif self._save_due():
            self.save(agreed=self.save_interval > 0)

    def _save_due(self) -> bool:
        """Whether ``save_checkpoint_inter`` seconds have passed. Several ranks: whether rank 0's
        save plan takes this epoch end (rank 0's clock alone decides, :mod:`~paddle_acp.runtime.agree`)."""
        if self.save_interval <= 0:
            return True
        if self.agreement is not None:
            return self._agreed_point("interval")
        return time.monotonic() - self._last_save >= self.save_interval

    def _preempt_point(self) -> str:
        """Where a preemption signal received now is acted on (called in the signal handler)."""
        if self.step is not None:
            return "the next batch boundary (paddle_acp.resumable)"
        return (f"the end of epoch {self.epoch_no} (this epoch's batches do not go through paddle_acp.resumable, "
                "so not before)")

    def _preempt(self, rng: Optional[dict] = None, objects: Optional[dict] = None) -> None:
        signum = self.watcher.received
        if self.is_writer:
            self.save(sync=True, preempt=True, rng=rng, objects=objects)
        logger.warning("range %s: preempted by signal %d at epoch %d%s", self.name, signum, self.epoch_no,
                       f" step {self.step}" if self.step is not None else "")
        if self.exit_on_preempt:
            raise preemption.Preempted(signum)
        self.watcher.clear()

    # -- hook entry point ----------------------------------------------------
    def on_run(self, exe, program, scope) -> None:
        """Called by the hook before every Executor.run while this range is active."""
        try:
            self._on_run(exe, program, scope)
        except AcpError:
            self.failed = True  # the error is the user's; nothing more is restored at the loop's end
            raise

    def _on_run(self, exe, program, scope) -> None:
        if program is None:
            program = _paddle_static().default_main_program()
        if scope is None:
            scope = _paddle_static().global_scope()
        if program is self._seen_program and scope is self._seen_scope:
            return  # the same registered program as last time: the common case, kept cheap
        inner = unwrap(program)
        if self.registry.lookup(inner, scope) is not None:
            self._seen_program, self._seen_scope = program, scope
            return
        if getattr(inner, "_is_distributed", False):
            return  # parameter-server programs: their state lives on the servers (as in Paddle)
        info = program_info(inner)
        if not info.is_training:
            return
        check_main_thread("checkpointing")
        place = getattr(exe, "place", None)
        entry, is_new = self.registry.add(info, inner, scope, place)
        if not is_new:
            return
        logger.info("range %s: registered training program %s (%s)", self.name, entry.key, info.label)
        if self.multi and self.restorer.loaded is not None:
            self.restorer.check_topology(self.registry)
        self._prepare_arena()
        if self.restorer.loaded is not None and self.restorer.restore_entry(entry):
            return
        prev = self.inherited
        if prev is not None and prev.restorer.holds(entry.key):
            # first run after an earlier, finished range restored from a checkpoint and this
            # range has none yet: the program continues from the state that range ended with
            prev.restorer.restore_entry(entry)

    def release_hook(self) -> None:
        """Every restored program has its state back: an ended range is no longer fed programs."""
        if STATE.hooked is self and STATE.active is not self:
            STATE.hooked = None

    @property
    def restored_from(self) -> str:
        """``CONST_CHECKPOINT`` when the range resumed from a checkpoint, else ``CONST_MEMORYINIT``."""
        return self.restorer.restored_from

    @property
    def restored_number(self) -> Optional[int]:
        """The number of the checkpoint the range resumed from, or None."""
        return self.restorer.restored_number

    @property
    def has_unrestored_state(self) -> bool:
        """The checkpoint this range resumed from still holds tensors no program took back yet."""
        return self.restorer.has_unrestored_state

    def write_unrestored_into_global_scope(self) -> None:
        """See :meth:`Restorer.write_unrestored_into_global_scope`."""
        self.restorer.write_unrestored_into_global_scope()

    def get(self) -> int:
        return self.epoch_no


def check_range_args(max_epoch_num, save_checkpoint_inter) -> None:
    """ConfigError for a ``train_epoch_range`` argument that is not what it must be."""
    if isinstance(max_epoch_num, bool) or not isinstance(max_epoch_num, int):
        raise ConfigError(f"max_epoch_num={max_epoch_num!r} must be an integer")
    if save_checkpoint_inter is not None:
        _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
