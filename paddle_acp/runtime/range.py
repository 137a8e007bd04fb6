"""The epoch range: one ``train_epoch_range`` loop, composed of the collaborators that own its parts.

:meth:`EpochRange.open` does all the I/O (:mod:`~paddle_acp.runtime.opening`, then the checkpoint it resumes
from); the constructor does none. Its parts: :class:`~paddle_acp.runtime.restore.Restorer`,
:class:`~paddle_acp.runtime.steps.Position` and :class:`~paddle_acp.runtime.steps.ResumableSteps`,
:class:`~paddle_acp.runtime.schedule.SaveSchedule`, :class:`~paddle_acp.runtime.buffers.SnapshotBuffers` and
:class:`~paddle_acp.runtime.persist.Persister`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Dict, Iterator, Optional

from paddle_acp import config as _config
from paddle_acp.adapter import rng as rng_state
from paddle_acp.adapter.executor import executor_place
from paddle_acp.adapter.programs import is_distributed, program_info, unwrap
from paddle_acp.errors import AcpError, CheckpointError
from paddle_acp.format.checkpoints.metrics_log import MetricsLog
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.engine.stager import HostStager, Stager
from paddle_acp.format.layout import range_dir
from paddle_acp.format.metrics_record import MetricsRecord
from paddle_acp.runtime import interrupt, preemption
from paddle_acp.runtime.agree import Agreement
from paddle_acp.runtime.buffers import SnapshotBuffers
from paddle_acp.runtime.check_kill import KillPoint
from paddle_acp.runtime.coord import open_coordinator
from paddle_acp.runtime.digests import EpochDigests
from paddle_acp.runtime.objects import ScriptState
from paddle_acp.runtime.opening import LoopSettings, Opened, check_range_args, open_io, open_storage_for
from paddle_acp.runtime.persist import Persister
from paddle_acp.runtime.registry import Registry
from paddle_acp.runtime.restore import Restorer
from paddle_acp.runtime.schedule import SaveSchedule
from paddle_acp.runtime.state import STATE, check_main_thread
from paddle_acp.runtime.steps import Position, ResumableSteps
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

_NOTHING_OPENED = Opened()  # a range built without open(): no fence, no cache, no memory budget
_static: Any = None


def _paddle_static() -> Any:
    global _static
    if _static is None:
        import paddle.static

        _static = paddle.static
    return _static


class EpochRange:
    """The state of one active ``train_epoch_range`` loop (``paddle_acp.active_range()``)."""

    @classmethod
    def open(cls, max_epoch_num: int, name: str, cfg: _config.CheckpointConfig,
             save_checkpoint_inter: Optional[float] = None, script: Optional[ScriptState] = None) -> "EpochRange":
        """Open a range: validate the arguments, do its I/O (:func:`open_io`), load the checkpoint it resumes from."""
        max_epoch_num = check_range_args(max_epoch_num, save_checkpoint_inter)
        storage = open_storage_for(cfg)
        settings = LoopSettings.from_env()
        r = cls(max_epoch_num, name, cfg, storage, save_checkpoint_inter, script, open_io(name, cfg, storage), settings)
        r._start()
        return r

    def __init__(self, max_epoch_num: int, name: str, cfg: _config.CheckpointConfig, storage: Storage,
                 save_checkpoint_inter: Optional[float] = None, script: Optional[ScriptState] = None,
                 opened: Opened = _NOTHING_OPENED, settings: Optional[LoopSettings] = None) -> None:
        """No I/O here (:meth:`open` does it). ``script``: the script's objects saved with each checkpoint."""
        max_epoch_num = check_range_args(max_epoch_num, save_checkpoint_inter)
        settings = settings if settings is not None else LoopSettings.from_env()
        self.max_epoch_num = max_epoch_num
        self.name = name
        self.cfg = cfg
        if save_checkpoint_inter is None:
            save_interval = cfg.save_interval
        else:
            save_interval = _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
        self.registry = Registry()
        self.storage = storage
        self.several_ranks = cfg.multi_rank
        self.is_writer = self.several_ranks or cfg.trainer_id == 0
        self.fence = opened.fence
        # reads the numbered checkpoints ckpt-N of earlier releases (nothing writes them any more)
        self.numbered = PartReader(storage, cfg.job_id, name, cache=opened.cache, memory_budget=opened.memory_budget)
        # a one-process job is a job of world size 1; a trainer > 0 without PADDLE_TRAINERS_NUM writes nothing
        self.global_checkpointer = GlobalCheckpointer(
            storage, cfg.job_id, name, cfg.trainer_id if self.several_ranks else 0, cfg.world_size or 1,
            cfg.max_to_keep, cfg.part_timeout, fence=opened.fence, cache=opened.rank_cache,
            memory_budget=opened.memory_budget)
        self.script = script if script is not None else ScriptState(name, {}, {})
        self.position = Position()
        # every copy between the scope's tensors and checkpoint bytes, both ways, goes through this one stager
        self.stager: Stager = HostStager()
        self.restorer = Restorer(name, cfg, self.numbered, self.global_checkpointer, self.release_hook,
                                 self.stager)
        # several ranks: rank 0's save plan decides the due points (runtime.agree), through the coordinator
        agreement = None
        if self.several_ranks:
            coord = open_coordinator(cfg, storage, range_dir(cfg.job_id, name), name)
            self.global_checkpointer.arrivals = coord
            self.global_checkpointer.announce()  # its generation, to the job's store (not waited for)
            agreement = Agreement(storage, range_dir(cfg.job_id, name), name, cfg.trainer_id, cfg.busy_policy,
                                  save_interval, fence=opened.fence, coord=coord)
        self.schedule = SaveSchedule(save_interval, cfg.busy_policy, agreement, synchronous=not cfg.async_save)
        self.metrics = MetricsLog(storage, cfg.job_id, cfg.trainer_id)
        self.persister = Persister(name, max_epoch_num, cfg, storage, self.registry, self.position, self.script,
                                   self.global_checkpointer, self.metrics, self.schedule,
                                   SnapshotBuffers(name, cfg.host_memory, self.stager))
        self.exit_on_preempt = settings.exit_on_preempt
        self.watcher = preemption.PreemptionWatcher(settings.preempt_signals, self._preempt_point,
                                                    interrupt.preempted)
        self.resumable_steps = ResumableSteps(name, self.position, self.restorer, self.script, self.watcher,
                                              self.is_writer, self.persister.due_by_time, self._save_at_step,
                                              self._preempt)
        self._seen_program: Any = None  # the last registered (program, scope) run
        self._seen_scope: Any = None
        self.inherited: Optional[EpochRange] = None  # an ended range that still holds unrestored state
        self.failed = False  # registering a program raised (e.g. the model changed since the checkpoint)
        # ``paddle-acp check``: the range ends after this many epochs; per-epoch digests
        self._check_epochs = settings.check_epochs
        self.digests = EpochDigests.for_range(settings.check_digests, cfg.trainer_id)
        kill = settings.check_kill_at
        if self.digests is not None and kill is not None and kill[0] == name:  # runtime.check_kill
            self.digests.kill = KillPoint(kill[1], kill[2], self.position, self._committed, self.digests.note)

    def _start(self) -> None:
        """The range's I/O before its first epoch: the checkpoint to resume from, the ranks' save plan."""
        self.restorer.load_newest(self.persister.landing)  # lands in the snapshot arena the first save needs
        self.position.epoch_no = self.restorer.resume_epoch
        self.schedule.start(self.global_checkpointer.base)  # rank 0: a fresh plan, before any step
        if self.is_writer:  # written with the first save's metrics: marks a (re)start in `paddle-acp stats`
            loaded = self.restorer.loaded
            self.metrics.add(MetricsRecord.start(
                range=self.name, restored=self.restorer.restored_number, policy=self.schedule.busy_policy,
                restore_source=loaded.source if loaded is not None else None))

    @property
    def epoch_no(self) -> int:
        """The current epoch (-1 before the first)."""
        return self.position.epoch_no

    @property
    def step(self) -> Optional[int]:
        """Batches done in the current epoch (``resumable`` loops only), else None."""
        return self.position.step

    @property
    def save_interval(self) -> float:
        """Seconds between checkpoints (0: every epoch)."""
        return self.schedule.interval

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

    def get(self) -> int:
        return self.position.epoch_no

    def epochs(self) -> Iterator[int]:
        check_main_thread("train_epoch_range")
        end = sys.maxsize if self.max_epoch_num < 0 else self.max_epoch_num
        if self._check_epochs is not None and self._check_epochs < end:
            logger.info("range %s: ends after epoch %d (PADDLE_ACP_CHECK_EPOCHS, set by paddle-acp check)",
                        self.name, self._check_epochs - 1)
            end = self._check_epochs
        pos = self.position
        start = pos.epoch_no + 1
        self.restorer.resume_rng(start, self.script)
        self._log_plan(start, end)
        self.schedule.restart_clock(partial=self.restorer.resume_step is not None)
        self.watcher.install()
        try:
            for i in range(start, end):
                pos.epoch_no = i
                pos.step = None
                mid_epoch = self.restorer.resume_step is not None
                if not mid_epoch:
                    pos.epoch_start_rng = rng_state.capture()
                    pos.epoch_start_objects = self.script.capture()
                else:  # a mid-epoch resume replays the epoch from its start
                    pos.epoch_start_rng = self.restorer.resume_extra.get("epoch_start_rng")
                    pos.epoch_start_objects = self.restorer.resume_extra.get("epoch_start_objects")
                if self.digests is not None:
                    self.digests.start_epoch(self.name, i, mid_epoch)
                try:
                    yield i
                except GeneratorExit:  # the loop was left (break, return, an exception)
                    if self.digests is not None:  # paddle-acp check: the state where it was left
                        self.digests.end_epoch(self, i, mid_epoch, left=True)
                    raise
                if self.restorer.resume_step is not None:
                    raise CheckpointError(
                        f"range {self.name}: the checkpoint was taken at step {self.restorer.resume_step} of epoch {i}, "
                        "but this epoch did not iterate its data through paddle_acp.resumable(...)"
                    )
                pos.step = None
                if self.digests is not None:
                    self.digests.end_epoch(self, i, mid_epoch)
                self._end_of_epoch(last=(i == end - 1))
        finally:
            self.watcher.uninstall()

    def steps(self, iterable: Any, save_every_steps: Optional[int] = None) -> Iterator[Any]:
        """Iterate one epoch's batches with step-level checkpoints and mid-epoch resume (``resumable``)."""
        return self.resumable_steps.steps(iterable, save_every_steps)

    def _log_plan(self, start: int, end: int) -> None:
        """Say at the start when and where checkpoints will be taken."""
        where = f"{self.storage.uri.rstrip('/')}/{self.numbered.dir}"
        if not self.is_writer:
            logger.info("range %s of job %s: trainer %d restores from %s; only trainer 0 writes checkpoints",
                        self.name, self.cfg.job_id, self.cfg.trainer_id, where)
            return
        if start >= end:
            return
        interval = self.schedule.interval
        if interval == 0:
            when = "at the end of every epoch"
        elif self.several_ranks:
            when = (f"at an epoch end about {interval:g} s after the previous checkpoint, as rank 0's clock "
                    "says (the second epoch end after it said so, on every rank alike; save_checkpoint_inter / "
                    "PADDLE_ACP_SAVE_INTERVAL; 0 = every epoch)")
        else:
            when = (f"at the end of the first epoch ending {interval:g} s or more after the previous "
                    "checkpoint (save_checkpoint_inter / PADDLE_ACP_SAVE_INTERVAL; 0 = every epoch)")
        last = "" if self.max_epoch_num < 0 else f" and after the last epoch ({end - 1})"
        busy = self.schedule.policy.describe() if self.persister.saver.async_save else (
            "synchronous saves (PADDLE_ACP_ASYNC=0): training waits for each")
        if not self.watcher.signals:
            busy += "; preemption saves are off (PADDLE_ACP_PREEMPT_SIGNALS is empty: no signal triggers a save)"
        logger.info("range %s of job %s: checkpoints go to %s %s%s; %s", self.name, self.cfg.job_id, where, when, last,
                    busy)

    def _end_of_epoch(self, last: bool) -> None:
        if self.fence is not None:  # superseded (an earlier save said so): FencedError, not epochs trained unsaved
            self.fence.stop(f"at the end of epoch {self.position.epoch_no} of range {self.name}")
        if self.watcher.received is not None:
            self._preempt()
        if not self.is_writer:
            return
        if last:
            self.persister.save(final=True)
            self.persister.final_submitted()
        elif self.persister.interval_due():
            self.persister.save(agreed=self.schedule.interval > 0)

    def _committed(self) -> None:
        """Block until every checkpoint taken so far is committed (rank 0 of several: globally)."""
        self.persister.saver.wait(for_previous=False)
        if self.is_writer and self.cfg.trainer_id == 0:
            self.global_checkpointer.committer.wait_all()

    def _save_at_step(self, rng: Optional[Dict[str, Any]], objects: Optional[Dict[str, Any]]) -> None:
        if self.fence is not None:
            self.fence.stop(f"at {self.position.at()} of range {self.name}")
        self.persister.save(rng=rng, objects=objects)
        if self.digests is not None:
            self.digests.note({"kind": "save", "epoch": self.position.epoch_no, "step": self.position.step})

    def _preempt_point(self) -> str:
        """Where a preemption signal received now is acted on (called in the signal handler)."""
        if self.position.step is not None:
            return "the next batch boundary (paddle_acp.resumable)"
        return (f"the end of epoch {self.position.epoch_no} (this epoch's batches do not go through "
                "paddle_acp.resumable, so not before)")

    def _preempt(self, rng: Optional[Dict[str, Any]] = None, objects: Optional[Dict[str, Any]] = None) -> None:
        signum = self.watcher.received
        assert signum is not None
        if self.is_writer:
            self.persister.save(sync=True, preempt=True, rng=rng, objects=objects)
        logger.warning("range %s: preempted by signal %d at epoch %d%s", self.name, signum, self.position.epoch_no,
                       f" step {self.position.step}" if self.position.step is not None else "")
        if self.exit_on_preempt:
            raise preemption.Preempted(signum)
        self.watcher.clear()

    def close(self) -> None:
        """Wait for the last save and free the snapshot buffers (see :meth:`Persister.close`)."""
        self.persister.close()

    def on_run(self, exe: Any, program: Any, scope: Any) -> None:
        """Called by the hook before every Executor.run while this range is active."""
        try:
            self._on_run(exe, program, scope)
        except AcpError:
            self.failed = True  # the error is the user's; nothing more is restored at the loop's end
            raise

    def _on_run(self, exe: Any, program: Any, scope: Any) -> None:
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
        if is_distributed(inner):
            return  # parameter-server programs: their state lives on the servers (as in Paddle)
        info = program_info(inner)
        if not info.is_training:
            return
        check_main_thread("checkpointing")
        place = executor_place(exe)
        entry, is_new = self.registry.add(info, inner, scope, place)
        if not is_new:
            return
        logger.info("range %s: registered training program %s (%s)", self.name, entry.key, info.label)
        if self.several_ranks and self.restorer.loaded is not None:
            self.restorer.check_topology(self.registry)
        if not (self.restorer.loaded is not None and self.restorer.restore_entry(entry)):
            prev = self.inherited
            if prev is not None and prev.restorer.holds(entry.key):
                # an earlier, finished range restored it and this one has no checkpoint: continue from its state
                prev.restorer.restore_entry(entry)
        self.persister.prepare_buffers()  # after the restore's copy (its arena back), never beside it

    def release_hook(self) -> None:
        """Every restored program has its state back: an ended range is no longer fed programs."""
        if STATE.hooked is self and STATE.active is not self:
            STATE.hooked = None

    def write_unrestored_into_global_scope(self) -> None:
        """See :meth:`Restorer.write_unrestored_into_global_scope`."""
        self.restorer.write_unrestored_into_global_scope()

