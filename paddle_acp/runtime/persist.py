"""Persister: owns taking a range's snapshots and persisting them on the saver's thread.

:meth:`Persister.save` asks the save-decision policy (:mod:`~paddle_acp.runtime.save_decision`, through the
:class:`~paddle_acp.runtime.schedule.SaveSchedule`) what a due save does (the busy policy, the ranks' save
plan), copies the registered programs' state into the :class:`~paddle_acp.runtime.buffers.SnapshotBuffers` and hands the :class:`Snapshot` (the content),
in a :class:`~paddle_acp.runtime.saver.SaveTicket` (what was decided about this save), to its
:class:`~paddle_acp.runtime.saver.Saver`, which persists it on its thread: the checkpointer writes
it (one writer, or this rank's part of a global checkpoint) and the metrics log records the outcome.
:meth:`Persister.close` waits for the last save, reports a failed final one and frees the buffers.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional, Tuple

from paddle_acp import config as _config
from paddle_acp.adapter import rng as rng_state
from paddle_acp.adapter.fleet import decide_mode
from paddle_acp.config import writer_cap
from paddle_acp.errors import AcpError, StorageError
from paddle_acp.format.checkpoints.checkpointer import Checkpointer
from paddle_acp.format.checkpoints.metrics_log import MetricsLog
from paddle_acp.format.checkpoints.multirank import PREEMPT_PART_WAIT, GlobalCheckpointer
from paddle_acp.format.commit.fencing import FencedError
from paddle_acp.format.engine import shares
from paddle_acp.format.engine.loaded import Lent
from paddle_acp.format.engine.snapshot import Snapshot, copy_into
from paddle_acp.format.engine.stream import ChunkStream, chunk_size
from paddle_acp.format.layout import layout
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.format.metrics_record import MetricsRecord, SaveBegun
from paddle_acp.runtime import interrupt
from paddle_acp.runtime.buffers import SnapshotBuffers
from paddle_acp.runtime.objects import ScriptState
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
from paddle_acp.runtime.saver import Saver, SaveTicket
from paddle_acp.runtime.schedule import SaveSchedule
from paddle_acp.runtime.state import STATE, check_main_thread
from paddle_acp.runtime.steps import Position
from paddle_acp.storage.base import Storage, redact

logger = logging.getLogger("paddle_acp")


class Persister:
    """Takes one range's checkpoints and persists them (its saver, its failures, its metrics lines)."""

    def __init__(self, name: str, max_epoch_num: int, cfg: _config.CheckpointConfig, storage: Storage, registry: Registry,
                 position: Position, script: ScriptState, checkpointer: Checkpointer,
                 global_checkpointer: GlobalCheckpointer, metrics: MetricsLog, schedule: SaveSchedule,
                 buffers: SnapshotBuffers) -> None:
        self.name = name
        self.max_epoch_num = max_epoch_num
        self.cfg = cfg
        self.storage = storage
        self.registry = registry
        self.position = position
        self.script = script
        self.checkpointer = checkpointer
        self.global_checkpointer = global_checkpointer
        self.metrics = metrics
        self.schedule = schedule
        self.buffers = buffers
        # several ranks (PADDLE_TRAINERS_NUM > 1): every rank writes its part, rank 0 commits
        self.several_ranks = cfg.multi_rank
        self.rank = cfg.trainer_id
        self.is_writer = self.several_ranks or cfg.trainer_id == 0
        self.saver = Saver(self._persist, cfg.async_save)
        self._mode_logged: Optional[str] = None
        self._skip_streak = 0
        self._skip_from = ""  # where the current run of skips began
        self._base_checked = False  # the marks of the checkpoint resumed from, checked at the first save
        self._final_submitted = False  # the save after the last epoch was submitted
        self._last_persist_error: Optional[BaseException] = None  # of the last save that ended
        self.closed = False  # ended: no more saves, the buffers are freed

    # -- decisions ---------------------------------------------------------------
    def decide(self, point: str, plan: Optional[bool] = None, ask: bool = True) -> Decision:
        """The save-decision policy's word on a save at ``point`` now, with this saver's and buffers' state
        (:meth:`SaveSchedule.decide`; ``plan``: the ranks' plan took this point already; ``ask``: ask it here)."""
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
        """Mid-epoch: whether a save is due by the interval alone and the busy policy would take it now (else it
        stays due: ``auto``, the wait for the checkpoint in flight is expected to pass the range's budget)."""
        return self.decide(STEP, ask=False).due

    # -- taking a checkpoint -----------------------------------------------------
    def save(self, sync: bool = False, preempt: bool = False, rng: Optional[Dict[str, Any]] = None, final: bool = False,
             objects: Optional[Dict[str, Any]] = None, agreed: bool = False) -> None:
        """Checkpoint now (at an epoch end, or mid-epoch when the position has a step); ``rng``,
        ``objects``: the RNG states and the script's objects to record, when they were captured
        earlier than now.

        ``sync`` (preemption) and ``final`` (the range's last epoch) saves are durable:
        they wait for the checkpoint in flight and are committed before this returns
        (``final`` when the range closes). Any other save that comes due while the
        previous checkpoint is still being written follows the busy policy
        (``PADDLE_ACP_BUSY_POLICY``, see :class:`~paddle_acp.runtime.save_decision.SaveDecisionPolicy`); with
        several ranks rank 0's save plan decides it alike on every rank (:mod:`~paddle_acp.runtime.agree`;
        ``agreed``: the plan took this point already).
        """
        check_main_thread("checkpointing")
        if self.several_ranks and not self._base_checked:
            self._check_base()
        if self.several_ranks and self.rank == 0:
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
        mode = None
        share = None
        only = None  # (program key, name) of the tensors this rank writes -> the piece (None: whole); None: all
        if self.several_ranks:
            mode, why = decide_mode(self.cfg.rank_state, self.registry.entries)
            if mode != self._mode_logged:
                logger.info("range %s: rank %d of %d saves %s state (%s)", self.name, self.rank, self.cfg.world_size, mode, why)
                self._mode_logged = mode
            if self._spread(mode):  # the share writers each write a share of the replicated tensors,
                # chosen from metadata: views of (on a GPU, host copies of) the share alone
                items = [i for e in self.registry.entries for i in e.items()]
                only = shares.owned(items, self.rank, self._share_writers())
                share = shares.record(items, self._share_writers())
            elif mode == "replicated" and self.rank != 0:  # one copy of the tensors: rank 0's
                only = {}
        programs = [e.views(only) for e in self.registry.entries]
        size = layout(programs)
        image = None
        buffer = 0
        if action == QUEUE:
            inflight = self.saver.inflight  # it may finish meanwhile; the other buffer stays free
            buffer = 1 if inflight is None or inflight.buffer == 0 else 0
        stream = None
        if size and ((self.saver.async_save and not sync) or self.storage.direct_io):
            # async: training goes on while the saver writes, so copy into the reused buffer;
            # local disks: the aligned copy lets the write bypass the page cache (O_DIRECT),
            # which costs far less CPU and time than a buffered write of the views
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
            # a copy thread fills the buffer's chunks while the saver writes them; training goes on
            # once the last chunk is copied (a synchronous saver writes it all within submit())
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
        """At this rank's first save, on the training thread: stop (RestartRequiredError) when a rank marked the
        checkpoint this incarnation resumed from bad; a storage error is logged and the next save checks again."""
        try:
            self.global_checkpointer.check_base()
        except StorageError as exc:
            logger.warning("range %s: could not check the marks of checkpoint %s: %s", self.name,
                           self.global_checkpointer.base, exc)
            return
        self._base_checked = True

    def _skip(self, t0: float, arena: bool = False, costly: bool = False) -> None:
        """Do not take this checkpoint: the previous one is still being written (``arena``: the snapshot
        arena is still being populated; ``costly``: auto, waiting for it would pass the range's wait budget).
        The first skip of a run says why; the save that ends the run says how many were skipped."""
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

    # -- on the saver's thread ---------------------------------------------------
    def _persist(self, ticket: SaveTicket) -> None:
        t0 = time.perf_counter()
        snap = ticket.snap
        record = SaveBegun(range=self.name, epoch=snap.range.epoch_no, step=snap.range.step,
                           stall_s=ticket.stall_seconds, waited_s=ticket.waited_seconds,
                           policy=self.schedule.busy_policy, queued=bool(ticket.queued),
                           skipped_before=ticket.skipped_before or 0)
        try:
            if self.several_ranks:
                self._persist_part(ticket, record, t0)
                return
            try:
                written = self.checkpointer.save(snap)
            except BaseException as exc:
                self._record_failure(record, exc, t0)
                raise
            finally:
                self.schedule.persist_took(time.perf_counter() - t0)
        finally:
            if snap.stream is not None:  # a save that failed before its data was written frees the copy
                snap.stream.abort("the checkpoint was not written")
        self._last_persist_error = None
        number, nbytes = written.number, written.data_size
        dt = time.perf_counter() - t0
        mbps = nbytes / dt / 1e6 if dt > 0 else 0.0
        record, stall = self._streamed_record(ticket, record)
        self.metrics.add(record.saved(number=number, nbytes=nbytes, persist_s=dt))
        if ticket.durable:
            self.metrics.flush()
        else:
            self.metrics.flush_due()
        logger.info(
            "range %s: saved checkpoint %d (epoch %d%s): %d bytes, stall %.3f s, persist %.3f s, %.1f MB/s",
            self.name, number, snap.range.epoch_no, "" if snap.range.step is None else f" step {snap.range.step}",
            nbytes, stall, dt, mbps,
        )

    def _record_failure(self, record: SaveBegun, exc: BaseException, t0: float) -> None:
        self._last_persist_error = exc
        self.metrics.add(record.failed(error=exc, persist_s=time.perf_counter() - t0))
        self.metrics.flush_due()

    def _streamed_record(self, ticket: SaveTicket, record: SaveBegun) -> Tuple[SaveBegun, float]:
        """The metrics record and stall of a saved snapshot. A streamed one's ended when its last chunk
        was copied, during the write: the metrics record gets it, and the stream's figures."""
        stream = ticket.snap.stream
        if stream is None:
            return record, ticket.stall_seconds
        stall = stream.stall_seconds()
        return record.with_stream(stall, budget=self.buffers.budget_nbytes,
                                  buffer=stream.slots * stream.chunk, chunk=stream.chunk,
                                  chunks=stream.nchunks), stall

    def _persist_part(self, ticket: SaveTicket, record: SaveBegun, t0: float) -> None:
        """This rank's part; rank 0's commit goes on on the committer's thread (a durable save, or a
        synchronous saver, waits for it): the metrics record and log line come when it is decided."""
        snap = ticket.snap
        try:
            assert snap.mode is not None  # decided by save() for every save of several ranks
            res = self.global_checkpointer.save(snap, snap.mode, wait=ticket.durable or not self.saver.async_save,
                                                part_wait=ticket.part_wait)
        except BaseException as exc:
            self.schedule.persist_ended()
            self._record_failure(record, exc, t0)
            raise
        self._last_persist_error = None
        record, stall = self._streamed_record(ticket, record)
        at = f"epoch {snap.range.epoch_no}" + ("" if snap.range.step is None else f" step {snap.range.step}")
        done = _PartWritten(res.name, res.nbytes, at, stall, t0, snap.mode, ticket.durable)
        if res.pending is not None and res.committed is None:  # decided later, on the committer's thread
            res.pending.add_done_callback(lambda p: self._part_done(record, done, p.committed, p.waited, p.error))
            return
        self._part_done(record, done, res.committed, res.waited, None,
                        res.pending.decided_at if res.pending is not None else None)

    def _part_done(self, record: SaveBegun, done: "_PartWritten", committed: Optional[bool], waited: float,
                   error: Optional[BaseException], decided_at: Optional[float] = None) -> None:
        """The metrics record and log line of a part written (rank 0: of its commit, once decided;
        ``decided_at``: when, if it was earlier than now: a durable save waited for retention too)."""
        # rank 0: the persist time its save plan is sized by, until the global commit (every rank's part
        # written), not its own part alone, nor retention after the commit
        self.schedule.persist_ended()
        dt = (time.perf_counter() if decided_at is None else decided_at) - done.t0
        if error is not None:  # the commit failed (storage, fenced, or the base was condemned)
            committed = False
            self.saver.interrupt(error)
        self.metrics.add(record.part(name=done.name, nbytes=done.nbytes, persist_s=dt, rank=self.rank,
                                     committed=committed, parts_wait_s=waited, error=error))
        if done.durable:
            self.metrics.flush()
        else:
            self.metrics.flush_due()
        if committed is None:
            logger.info("range %s: rank %d wrote its part of checkpoint %s (%s): %d bytes, stall %.3f s, persist %.3f s",
                        self.name, self.rank, done.name, done.at, done.nbytes, done.stall, dt)
        elif committed:
            logger.info("range %s: saved global checkpoint %s (%s, %d ranks, %s): %d bytes of rank 0, stall %.3f s, "
                        "persist %.3f s (%.3f s waiting for the other parts)", self.name, done.name, done.at,
                        self.cfg.world_size, done.mode, done.nbytes, done.stall, dt, waited)

    # -- the end -----------------------------------------------------------------
    def close(self) -> None:
        """Wait for the save in flight (and a queued one) to commit, then free the snapshot buffers: an ended range
        saves no more. Freed here, not when the garbage collector gets to the range: left
        to the collector, a 1.2 GB arena cost the next range's first epoch 1-3 s."""
        try:
            self.schedule.close()
            self.saver.wait(for_previous=False)  # the final save (its own line says when it committed)
            if self.several_ranks and self.rank == 0:  # rank 0's commits still waiting for parts (bounded by their deadlines)
                self.global_checkpointer.committer.wait_all()
                self.saver.wait(for_previous=False)  # a commit's error that ends training
            if self.is_writer:
                self.metrics.flush()
            if self._final_submitted and self._last_persist_error is not None:
                self._final_save_failed(self._last_persist_error)
        finally:
            self.closed = True
            self.buffers.release()

    def _final_save_failed(self, error: BaseException) -> None:
        """The checkpoint after the last epoch failed: say so once, loudly, at the end
        (``paddle-acp run`` also exits with status 1)."""
        if isinstance(error, FencedError):  # not this process's checkpoint any more: the fence said so once
            STATE.final_save_failures.append(f"range {self.name} of job {self.cfg.job_id}: {error}")
            return
        try:
            numbers = self.checkpointer.committed_numbers()
        except AcpError:
            numbers = []
        then = f"resumes from checkpoint {numbers[-1]}" if numbers else "starts from scratch"
        msg = (
            f"range {self.name} of job {self.cfg.job_id}: the FINAL checkpoint (epoch {self.position.epoch_no}) was NOT "
            f"saved ({error}); a restart {then} and trains the remaining epochs again. "
            f"Fix the storage at {redact(self.cfg.uri)} (space, permissions)"
        )
        STATE.final_save_failures.append(msg)
        logger.error("%s", msg)

    # -- what this rank writes ---------------------------------------------------
    def _follower(self) -> bool:
        """A rank other than 0 whose tensors are replicated and written by other ranks (rank 0, or the
        share writers when this rank is not one of them): its part holds no tensors."""
        if not self.several_ranks or self.rank == 0 or decide_mode(self.cfg.rank_state, self.registry.entries)[0] != "replicated":
            return False
        return writer_cap(self.cfg.replicated_writers) is None or self.rank >= self._share_writers()

    def _spread(self, mode: Optional[str]) -> bool:
        """The ranks write shares of the replicated state (PADDLE_ACP_REPLICATED_WRITERS=all or N, format/engine/shares.py)."""
        return self.several_ranks and mode == "replicated" and writer_cap(self.cfg.replicated_writers) is not None

    def _share_writers(self) -> int:
        """Spread writes: how many ranks write shares (ranks 0..n-1)."""
        cap = writer_cap(self.cfg.replicated_writers)
        return shares.share_writers(self.global_checkpointer.world_size, cap if cap is not None else 1)

    def landing(self, size: int) -> Optional[Lent]:
        """Where a restore of ``size`` bytes lands: the snapshot arena this rank's first save needs anyway
        (None where this rank keeps none: it writes nothing, or saves synchronously; or over the budget)."""
        if self.closed or not self.is_writer or not (self.saver.async_save or self.storage.direct_io):
            return None
        return self.buffers.lend(size)

    def prepare_buffers(self) -> None:
        """A program registered: prepare the snapshot buffer for this rank's state (in the background),
        so the first save does not pay for it on the training thread."""
        if self.closed or not self.is_writer or not (self.saver.async_save or self.storage.direct_io) or self._follower():
            return
        size = sum(e.nbytes() for e in self.registry.entries)  # metadata only: nothing is copied
        if self._spread(decide_mode(self.cfg.rank_state, self.registry.entries)[0]):  # this rank's share of it
            items = [i for e in self.registry.entries for i in e.items()]
            size = shares.share_layout_nbytes(items, self.rank, self._share_writers())
        self.buffers.prepare(size)


class _PartWritten:
    """A part written by this rank, until its commit is decided (the metrics record and log line)."""

    def __init__(self, name: str, nbytes: int, at: str, stall: float, t0: float, mode: Optional[str],
                 durable: bool) -> None:
        self.name, self.nbytes, self.at, self.stall, self.t0, self.mode, self.durable = (
            name, nbytes, at, stall, t0, mode, durable)
