"""Persister: owns taking a range's snapshots (when, what, into which buffer) and ending its saves.

:meth:`Persister.save` asks the :class:`~paddle_acp.runtime.schedule.SaveSchedule` what a due save does, copies
the state this rank writes (:class:`~paddle_acp.runtime.rank_writes.RankWrites`) into the
:class:`~paddle_acp.runtime.buffers.SnapshotBuffers` and hands it, in a
:class:`~paddle_acp.runtime.saver.SaveTicket`, to its :class:`~paddle_acp.runtime.ticket_writer.TicketWriter`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional

from paddle_acp import config as _config
from paddle_acp.adapter import rng as rng_state
from paddle_acp.errors import AcpError, StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.metrics_log import MetricsLog
from paddle_acp.format.checkpoints.multirank import PREEMPT_PART_WAIT, GlobalCheckpointer
from paddle_acp.format.engine.loaded import Lent
from paddle_acp.format.engine.snapshot import Snapshot, copy_into
from paddle_acp.format.engine.stream import ChunkStream, chunk_size
from paddle_acp.format.layout import layout
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.format.metrics_record import MetricsRecord
from paddle_acp.runtime import interrupt
from paddle_acp.runtime.buffers import SnapshotBuffers
from paddle_acp.runtime.objects import ScriptState
from paddle_acp.runtime.rank_writes import RankWrites
from paddle_acp.runtime.registry import Registry
from paddle_acp.runtime.save_decision import (
    ARENA,
    ARENA_SKIPS,
    COSTLY,
    EPOCH_END,
    FINAL,
    PLAN,
    PREEMPT,
    QUEUE,
    SKIP,
    STEP,
    Decision,
    SaveContext,
)
from paddle_acp.runtime.saver import SaveTicket
from paddle_acp.runtime.schedule import SaveSchedule
from paddle_acp.runtime.state import STATE, check_main_thread
from paddle_acp.runtime.steps import Position
from paddle_acp.runtime.ticket_writer import TicketWriter
from paddle_acp.storage.base import Storage, redact

logger = logging.getLogger("paddle_acp")


class Persister:
    """Takes one range's checkpoints and persists them (its saver, its failures, its metrics lines)."""

    def __init__(self, name: str, max_epoch_num: int, cfg: _config.CheckpointConfig, storage: Storage, registry: Registry,
                 position: Position, script: ScriptState,
                 global_checkpointer: GlobalCheckpointer, metrics: MetricsLog, schedule: SaveSchedule,
                 buffers: SnapshotBuffers) -> None:
        self.name = name
        self.max_epoch_num = max_epoch_num
        self.cfg = cfg
        self.storage = storage
        self.registry = registry
        self.position = position
        self.script = script
        self.global_checkpointer = global_checkpointer
        self.metrics = metrics
        self.schedule = schedule
        self.buffers = buffers
        self.several_ranks = cfg.multi_rank
        self.rank = cfg.trainer_id
        self.is_writer = self.several_ranks or cfg.trainer_id == 0
        self.writer = TicketWriter(name, cfg, global_checkpointer, metrics, schedule, buffers)
        self.saver = self.writer.saver
        self.writes = RankWrites(name, cfg, registry, global_checkpointer.world_size)
        self._skip_streak = 0
        self._skip_from = ""  # where the current run of skips began
        self._base_checked = False  # the marks of the checkpoint resumed from, checked at the first save
        self._final_submitted = False  # the save after the last epoch was submitted
        self.closed = False  # ended: no more saves, the buffers are freed

    def decide(self, point: str, plan: Optional[bool] = None, ask: bool = True) -> Decision:
        """The policy's decision on a save at ``point`` now (``plan``: the ranks' plan took this point already;
        ``ask``: ask the plan here)."""
        busy, pos = self.saver.busy, self.position
        free = busy and self.schedule.busy_policy == QUEUE and self.saver.queue_free
        ctx = SaveContext(point, busy=busy, plan=plan, step=pos.step, every=pos.every, queue_free=free,
                          queue_fits=free and self.buffers.queue_fits(), arena_left=self.buffers.unpopulated,
                          skips=self._skip_streak)
        return self.schedule.decide(ctx, pos.at() if ask else None)

    def interval_due(self) -> bool:
        """At an epoch end: whether a save is due (several ranks with an interval: as rank 0's save plan says)."""
        return self.decide(EPOCH_END, ask=self.schedule.interval > 0).due

    def due_by_time(self) -> bool:
        """Mid-epoch: whether a save is due by the interval alone and the busy policy would take it now."""
        return self.decide(STEP, ask=False).due

    def save(self, sync: bool = False, preempt: bool = False, rng: Optional[Dict[str, Any]] = None, final: bool = False,
             objects: Optional[Dict[str, Any]] = None, agreed: bool = False) -> None:
        """Checkpoint now (``rng``, ``objects``: captured earlier than now). ``sync`` (preemption) and ``final``
        saves are durable: committed before this returns (``final``: when the range closes); any other follows the
        busy policy (``agreed``: the ranks' plan took this point already)."""
        check_main_thread("checkpointing")
        if self.several_ranks and not self._base_checked:
            self._check_base()
        if self.rank == 0:
            interrupt.watch(self.global_checkpointer.committer)  # Ctrl-C ends rank 0's waits for parts at once
        t0 = time.perf_counter()
        extra = self.position.step_extra()
        objects = objects if objects is not None else self.script.capture()  # raises before anything is written
        if objects is not None:
            extra["objects"] = objects
        point = FINAL if final else PREEMPT if sync else EPOCH_END if self.position.step is None else STEP
        decision, waited = self.decide(point, plan=True if agreed and self.several_ranks else None), 0.0
        if decision.budget is not None:  # auto: wait for the checkpoint in flight within the range's wait budget
            idle, waited = self.saver.wait_idle(decision.budget)
            self.schedule.waited_s += waited
            decision = decision if idle else Decision(SKIP, COSTLY)
        if decision.action == SKIP:
            self._skip(t0, arena=decision.why == ARENA, costly=decision.why == COSTLY)
            if decision.why == PLAN:
                self.schedule.point_done()
            return
        if not decision.due:  # due by the interval alone: it stays due while the busy policy would skip it
            return
        action = decision.action
        waited += self.saver.wait() if action != QUEUE else 0.0
        irs = sorted({e.info.ir for e in self.registry.entries})
        import paddle

        self.buffers.ready()
        mode, only, share = self.writes.choose()  # several ranks: the tensors this rank writes (one writer: all)
        programs = [e.views(only) for e in self.registry.entries]
        size = layout(programs)
        image = None
        buffer = 0
        if action == QUEUE:
            inflight = self.saver.inflight  # it may finish meanwhile; the other buffer stays free
            buffer = 1 if inflight is None or inflight.buffer == 0 else 0
        stream = None
        if size and ((self.saver.async_save and not sync) or self.storage.direct_io):
            # async: training goes on while the saver writes, so copy into the reused buffer; local disks:
            # the aligned copy lets the write bypass the page cache (O_DIRECT), far cheaper than a buffered one
            arena = self.buffers.size_for(size)
            if arena < size:  # over the host-memory budget: streamed through the buffer in chunks
                tensors, buf = [t for p in programs for t in p.tensors], self.buffers.chunks(arena)
                stream = ChunkStream(tensors, size, buf, chunk_size(arena), self.buffers.stager)
            else:
                image = self.buffers.image(buffer, size)
                copy_into(programs, image, self.buffers.stager)
        pos = self.position
        snap = Snapshot(
            range=RangeRecord(self.name, pos.epoch_no, self.max_epoch_num, pos.step),
            programs=programs,
            image=image,
            data_size=size,
            rng=rng if rng is not None else rng_state.capture(),
            paddle_version=paddle.__version__,
            ir="+".join(irs),
            extra=extra,
            mode=mode,
            share=share,
            stream=stream,
        )
        ticket = SaveTicket(snap, buffer=buffer, durable=sync or final, queued=action == QUEUE,
                            skipped_before=self._skip_streak, part_wait=PREEMPT_PART_WAIT if preempt else None,
                            waited_seconds=waited)
        if self._skip_streak:
            logger.info("range %s: checkpoint at %s taken after %d due checkpoint(s) skipped, from %s on", self.name,
                        pos.at(), self._skip_streak, self._skip_from)
        self._skip_streak = 0
        self.schedule.persist_started()  # (before the saver may end it)
        if stream is not None:
            # a copy thread fills the chunks while the saver writes them; training goes on after the last copy
            stream.start(t0)
            try:
                self.saver.submit(ticket)
            finally:
                stream.join()
        ticket.stall_seconds = time.perf_counter() - t0
        if stream is None and action == QUEUE:
            self.saver.enqueue(ticket)
        elif stream is None:
            self.saver.submit(ticket)
        if sync:
            self.saver.wait(for_previous=False)
        self.schedule.saved()
        self.schedule.point_done()

    def final_submitted(self) -> None:
        """The save after the range's last epoch was submitted: :meth:`close` reports its failure."""
        self._final_submitted = True

    def _check_base(self) -> None:
        """At this rank's first save: RestartRequiredError when a rank marked the checkpoint resumed from bad
        (a storage error is logged and the next save checks again)."""
        try:
            self.global_checkpointer.check_base()
        except StorageError as exc:
            logger.warning("range %s: could not check the marks of checkpoint %s: %s", self.name,
                           self.global_checkpointer.base, exc)
            return
        self._base_checked = True

    def _skip(self, t0: float, arena: bool = False, costly: bool = False) -> None:
        """Do not take this checkpoint (``arena``: the snapshot arena is still being populated; ``costly``:
        waiting would pass the ``auto`` budget). The first skip of a run says why; the save ending it, how many."""
        self.saver.stats.skipped += 1
        self._skip_streak += 1
        at = self.position.at()
        if self._skip_streak == 1:
            self._skip_from = at
        policy = self.schedule.busy_policy
        if costly and self._skip_streak == 1:
            logger.info(
                "range %s: checkpoint at %s skipped: the previous checkpoint is still being written and waiting for "
                "it would take the range's waits past %.0f%% of its time beyond its first %g s (PADDLE_ACP_BUSY_POLICY=%s; "
                "waited %.3f s so far); the next due one is taken when it can be", self.name, at,
                100 * _config.AUTO_WAIT_SHARE, _config.AUTO_WAIT_FREE_S, policy, self.schedule.waited_s)
        elif arena:
            logger.info(
                "range %s: checkpoint at %s skipped: the snapshot buffer is still being populated in the background "
                "(PADDLE_ACP_BUSY_POLICY=%s; at most %d due checkpoints in a row are skipped for it, the next one "
                "waits)", self.name, at, policy, ARENA_SKIPS)
        elif self._skip_streak == 1 and self.schedule.agreed:
            logger.info(
                "range %s: checkpoint at %s skipped by the ranks' save plan (rank 0 takes every n-th due point "
                "while a checkpoint takes longer than a due point to write; PADDLE_ACP_BUSY_POLICY=%s); the "
                "checkpoint that ends this run of skips says how many", self.name, at, policy)
        elif self._skip_streak == 1 and not costly:
            logger.info(
                "range %s: checkpoint at %s skipped: the previous checkpoint is still being written "
                "(PADDLE_ACP_BUSY_POLICY=%s); the next due one is taken (the one that ends this run of skips says "
                "how many)", self.name, at, policy,
            )
        self.metrics.add(MetricsRecord.skipped(range=self.name, epoch=self.position.epoch_no, step=self.position.step,
                                               stall_s=time.perf_counter() - t0, policy=policy))

    def close(self) -> None:
        """Wait for the saves in flight and queued to commit, then free the snapshot buffers now (left to the
        garbage collector, a 1.2 GB arena cost the next range's first epoch 1-3 s)."""
        try:
            self.schedule.close()
            self.saver.wait(for_previous=False)  # the final save (its own line says when it committed)
            if self.is_writer and self.rank == 0:  # rank 0's commits still waiting for parts (bounded by their deadlines)
                self.global_checkpointer.committer.wait_all()
                self.saver.wait(for_previous=False)  # a commit's error that ends training
            if self.is_writer:
                self.metrics.flush()
            fence = self.global_checkpointer.fence
            if self._final_submitted and fence is not None:  # the loop ran to its end: raised from it
                fence.stop(f"after the last epoch of range {self.name}")
            if self._final_submitted and self.writer.last_error is not None:
                self._final_save_failed(self.writer.last_error)
        finally:
            self.closed = True
            self.buffers.release()

    def _final_save_failed(self, error: BaseException) -> None:
        """The checkpoint after the last epoch failed: say so once, loudly (``paddle-acp run`` exits 1)."""
        try:
            newest = index.entries(self.storage, self.cfg.job_id, self.name)
        except AcpError:
            newest = []
        then = f"resumes from checkpoint {newest[0].label}" if newest else "starts from scratch"
        msg = (
            f"range {self.name} of job {self.cfg.job_id}: the FINAL checkpoint (epoch {self.position.epoch_no}) was NOT "
            f"saved ({error}); a restart {then} and trains the remaining epochs again. "
            f"Fix the storage at {redact(self.cfg.uri)} (space, permissions)"
        )
        STATE.final_save_failures.append(msg)
        logger.error("%s", msg)

    def landing(self, size: int) -> Optional[Lent]:
        """Where a restore of ``size`` bytes lands: the snapshot arena the first save needs anyway (None: none)."""
        if self.closed or not self.is_writer or not (self.saver.async_save or self.storage.direct_io):
            return None
        return self.buffers.lend(size)

    def prepare_buffers(self) -> None:
        """A program registered: prepare the snapshot buffer for this rank's state in the background."""
        if self.closed or not self.is_writer or not (self.saver.async_save or self.storage.direct_io) or self.writes.follower():
            return
        self.buffers.prepare(self.writes.nbytes())  # metadata only: nothing is copied

