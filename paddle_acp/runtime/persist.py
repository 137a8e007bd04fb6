"""Saving: take a range's snapshot and persist it (the save and persist orchestration).

:meth:`PersistMixin.save` decides what a due save does (the busy policy), copies the
registered programs' state into the snapshot arena and hands the :class:`Snapshot` (the content),
in a :class:`~paddle_acp.runtime.saver.SaveTicket` (what was decided about this save), to the
:class:`~paddle_acp.runtime.saver.Saver`, which calls :meth:`PersistMixin._persist` on its
thread: the checkpointer writes it (one writer, or this rank's part of a global checkpoint)
and the metrics log records the outcome. :meth:`PersistMixin.close` waits for the last save
and frees the arena.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from paddle_acp.adapter import rng as rng_state
from paddle_acp.adapter.fleet import decide_mode
from paddle_acp.config import writer_cap
from paddle_acp.errors import AcpError, StorageError
from paddle_acp.format import shares
from paddle_acp.format.arena import Arena
from paddle_acp.format.checkpointer import Checkpointer
from paddle_acp.format.fencing import FencedError
from paddle_acp.format.layout import layout
from paddle_acp.format.manifest import RangeRecord, align
from paddle_acp.format.metrics import MetricsLog
from paddle_acp.format.metrics_record import MetricsRecord, SaveBegun
from paddle_acp.format.multirank import PREEMPT_PART_WAIT, GlobalCheckpointer
from paddle_acp.format.snapshot import Snapshot, copy_into
from paddle_acp.format.stream import ChunkStream, chunk_size
from paddle_acp.runtime import budget as host_budget
from paddle_acp.runtime import interrupt
from paddle_acp.runtime.agree import Agreement, agreed_action
from paddle_acp.runtime.objects import ScriptState
from paddle_acp.runtime.registry import Registry
from paddle_acp.runtime.saver import QUEUE, SKIP, Saver, SaveTicket, busy_action
from paddle_acp.runtime.state import STATE, check_main_thread
from paddle_acp.storage.base import redact
from paddle_acp.threads import lower_thread_priority

logger = logging.getLogger("paddle_acp")

# The ``queue`` busy policy allocates its second snapshot buffer only when the host keeps
# at least this much memory available after it.
QUEUE_HEADROOM = 1 << 30


def mem_available() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class PersistMixin:
    """The saving part of :class:`paddle_acp.runtime.range.EpochRange`: what it reads and
    writes of the range is declared here."""

    name: str
    cfg: Any
    epoch_no: int
    max_epoch_num: int
    step: Optional[int]
    storage: Any
    registry: Registry
    checkpointer: Checkpointer
    gcheckpointer: GlobalCheckpointer
    metrics: MetricsLog
    saver: Saver
    multi: bool
    rank: int
    is_writer: bool
    busy_policy: str
    _arena: Arena
    _arena2: Arena
    _queue_ok: Optional[bool]
    _skip_streak: int
    _arena_thread: Optional[threading.Thread]
    _budget: Optional[host_budget.Budget]
    _state_size: int
    _stream_logged: bool
    _closed: bool
    _mode_logged: Optional[str]
    _final_submitted: bool
    _last_persist_error: Optional[BaseException]
    _last_save: float
    agreement: Optional[Agreement]
    _base_checked: bool
    script: ScriptState

    if TYPE_CHECKING:  # defined by the other parts of EpochRange
        def _step_extra(self) -> dict: ...

    def save(self, sync: bool = False, preempt: bool = False, rng: Optional[dict] = None, final: bool = False,
             objects: Optional[dict] = None, agreed: bool = False) -> None:
        """Checkpoint now (at an epoch end, or mid-epoch when ``self.step`` is set); ``rng``,
        ``objects``: the RNG states and the script's objects to record, when they were captured
        earlier than now.

        ``sync`` (preemption) and ``final`` (the range's last epoch) saves are durable:
        they wait for the checkpoint in flight and are committed before this returns
        (``final`` when the range closes). Any other save that comes due while the
        previous checkpoint is still being written follows the busy policy
        (``PADDLE_ACP_BUSY_POLICY``, see :func:`paddle_acp.runtime.saver.busy_action`); with
        several ranks rank 0's save plan decides it alike on every rank (:mod:`~paddle_acp.runtime.agree`;
        ``agreed``: the plan took this point already).
        """
        check_main_thread("checkpointing")
        if self.multi and not self._base_checked:
            self._check_base()
        if self.multi and self.rank == 0:
            interrupt.watch(self.gcheckpointer.committer)  # Ctrl-C ends rank 0's waits for parts at once
        t0 = time.perf_counter()
        extra = self._step_extra()
        objects = objects if objects is not None else self.script.capture()  # raises before anything is written
        if objects is not None:
            extra["objects"] = objects
        durable = sync or final or not self.saver.async_save
        if self.agreement is not None and not durable and not agreed:
            agreed = self._agreed_point("due")
            if not agreed:
                self._skip(t0)
                self.agreement.point_done()
                return
        action = self._busy_decision(durable=durable, agreed=agreed)
        if action == SKIP:
            self._skip(t0)
            return
        waited = self.saver.wait() if action != QUEUE else 0.0
        irs = sorted({e.info.ir for e in self.registry.entries})
        import paddle

        self._join_arena()
        mode = None
        share = None
        only = None  # the (program key, name) of the tensors this rank writes; None: all
        if self.multi:
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
                only = set()
        programs = [e.views(only) for e in self.registry.entries]
        size = layout(programs)
        image = None
        buffer = 0
        if action == QUEUE:
            inflight = self.saver.inflight  # it may finish meanwhile; the other buffer stays free
            buffer = 1 if inflight is None or inflight.buffer == 0 else 0
        stream = None
        if size and ((self.saver.async_save and not sync) or self.storage.direct_io):
            # async: training goes on while the saver writes, so copy into the reused arena;
            # local disks: the aligned copy lets the write bypass the page cache (O_DIRECT),
            # which costs far less CPU and time than a buffered write of the views
            arena = self._arena_size(size)
            if arena < size:  # over the host-memory budget: streamed through the arena in chunks
                buf = self._arena.ensure(arena)[:arena]
                stream = ChunkStream([t for p in programs for t in p.tensors], size, buf, chunk_size(arena))
            else:
                image = (self._arena2 if buffer else self._arena).ensure(size)
                copy_into(programs, image)
        snap = Snapshot(
            range=RangeRecord(self.name, self.epoch_no, self.max_epoch_num, self.step),
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
        self._skip_streak = 0
        if self.agreement is not None:  # (before the saver may end it)
            self.agreement.persist_started()
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
        self._last_save = time.monotonic()
        if self.agreement is not None:
            self.agreement.point_done()

    def _check_base(self) -> None:
        """At this rank's first save, on the training thread: stop (RestartRequiredError) when a rank marked the
        checkpoint this incarnation resumed from bad; a storage error is logged and the next save checks again."""
        try:
            self.gcheckpointer.check_base()
        except StorageError as exc:
            logger.warning("range %s: could not check the marks of checkpoint %s: %s", self.name,
                           self.gcheckpointer.base, exc)
            return
        self._base_checked = True

    def _busy_decision(self, durable: bool, agreed: bool = False) -> str:
        """What a save due now does (``saver.busy_action`` with this range's state; ``agreed``: the ranks'
        save plan took this point, so it is not skipped)."""
        busy = self.saver.busy
        queue_free = busy and self.busy_policy == QUEUE and self.saver.queue_free
        if agreed and not durable:
            return agreed_action(True, busy, self.busy_policy, queue_free, queue_free and self._queue_fits())
        return busy_action(self.busy_policy, busy, durable, queue_free, queue_free and self._queue_fits())

    def _agreed_point(self, kind: str) -> bool:
        """Several ranks: this rank's next due point of ``kind``; whether the save plan takes it."""
        assert self.agreement is not None
        at = f"epoch {self.epoch_no}" + ("" if self.step is None else f" step {self.step}")
        return self.agreement.point(kind, self.saver.busy, at)[1]

    def _queue_fits(self) -> bool:
        """Whether the ``queue`` policy's second buffer (the size of the first) fits in host
        memory and in the host-memory budget; decided once per range, with one log line when it does not."""
        b = self._budget.nbytes if self._budget is not None else None
        if self._queue_ok is None and b is not None and 2 * self._state_size > b and (
                self.cfg.host_memory is not None or self._state_size > b):
            self._queue_ok = False
            logger.warning(
                "range %s: PADDLE_ACP_BUSY_POLICY=queue: a second snapshot buffer of %d bytes does not fit the "
                "host-memory budget (%d bytes: %s); saves that come due while the previous checkpoint is being "
                "written are skipped instead", self.name, self._state_size, b, self._budget.source if self._budget else "")
        if self._queue_ok is None:
            need = self._arena.nbytes
            avail = mem_available()
            self._queue_ok = avail is None or self._arena2.nbytes >= need or avail - need >= QUEUE_HEADROOM
            if not self._queue_ok:
                logger.warning(
                    "range %s: PADDLE_ACP_BUSY_POLICY=queue: a second snapshot buffer of %d bytes would leave less "
                    "than %d MiB of host memory available (MemAvailable %d bytes); saves that come due while the "
                    "previous checkpoint is being written are skipped instead",
                    self.name, need, QUEUE_HEADROOM >> 20, avail,
                )
        return self._queue_ok

    def _skip(self, t0: float) -> None:
        """Do not take this checkpoint: the previous one is still being written."""
        self.saver.stats.skipped += 1
        self._skip_streak += 1
        at = f"epoch {self.epoch_no}" + ("" if self.step is None else f" step {self.step}")
        if self._skip_streak == 1 and self.agreement is not None:
            logger.info(
                "range %s: checkpoint at %s skipped by the ranks' save plan (rank 0 takes every n-th due point "
                "while a checkpoint takes longer than a due point to write; PADDLE_ACP_BUSY_POLICY=%s); further "
                "skips in a row are not logged", self.name, at, self.busy_policy)
        elif self._skip_streak == 1:
            logger.info(
                "range %s: checkpoint at %s skipped: the previous checkpoint is still being written "
                "(PADDLE_ACP_BUSY_POLICY=%s); the next due one is taken (further skips in a row are not logged)",
                self.name, at, self.busy_policy,
            )
        self.metrics.add(MetricsRecord.skipped(range=self.name, epoch=self.epoch_no, step=self.step,
                                               stall_s=time.perf_counter() - t0, policy=self.busy_policy))

    def _persist(self, ticket: SaveTicket) -> None:
        t0 = time.perf_counter()
        snap = ticket.snap
        record = SaveBegun(range=self.name, epoch=snap.range.epoch_no, step=snap.range.step,
                           stall_s=ticket.stall_seconds, waited_s=ticket.waited_seconds, policy=self.busy_policy,
                           queued=bool(ticket.queued), skipped_before=ticket.skipped_before or 0)
        try:
            if self.multi:
                self._persist_part(ticket, record, t0)
                return
            try:
                number, nbytes = self.checkpointer.save(snap)
            except BaseException as exc:
                self._record_failure(record, exc, t0)
                raise
        finally:
            if snap.stream is not None:  # a save that failed before its data was written frees the copy
                snap.stream.abort("the checkpoint was not written")
        self._last_persist_error = None
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

    def _streamed_record(self, ticket: SaveTicket, record: SaveBegun) -> tuple[SaveBegun, float]:
        """The metrics record and stall of a saved snapshot. A streamed one's ended when its last chunk
        was copied, during the write: the metrics record gets it, and the stream's figures."""
        stream = ticket.snap.stream
        if stream is None:
            return record, ticket.stall_seconds
        stall = stream.stall_seconds()
        return record.with_stream(stall, budget=self._budget.nbytes if self._budget else None,
                                  buffer=stream.slots * stream.chunk, chunk=stream.chunk,
                                  chunks=stream.nchunks), stall

    def _persist_part(self, ticket: SaveTicket, record: SaveBegun, t0: float) -> None:
        """This rank's part; rank 0's commit goes on on the committer's thread (a durable save, or a
        synchronous saver, waits for it): the metrics record and log line come when it is decided."""
        snap = ticket.snap
        try:
            assert snap.mode is not None  # decided by save() for every save of several ranks
            res = self.gcheckpointer.save(snap, snap.mode, wait=ticket.durable or not self.saver.async_save,
                                          part_wait=ticket.part_wait)
        except BaseException as exc:
            if self.agreement is not None:
                self.agreement.persist_ended()
            self._record_failure(record, exc, t0)
            raise
        self._last_persist_error = None
        record, stall = self._streamed_record(ticket, record)
        at = f"epoch {snap.range.epoch_no}" + ("" if snap.range.step is None else f" step {snap.range.step}")
        done = (res.name, res.nbytes, at, stall, t0, snap.mode, ticket.durable)
        if res.pending is not None and res.committed is None:  # decided later, on the committer's thread
            res.pending.add_done_callback(lambda p: self._part_done(record, done, p.committed, p.waited, p.error))
            return
        self._part_done(record, done, res.committed, res.waited, None)

    def _part_done(self, record: SaveBegun, done: tuple, committed: Optional[bool], waited: float,
                   error: Optional[BaseException]) -> None:
        """The metrics record and log line of a part written (rank 0: of its commit, once decided)."""
        name, nbytes, at, stall, t0, mode, durable = done
        if self.agreement is not None:  # rank 0: the persist time its save plan is sized by, until the
            self.agreement.persist_ended()  # global commit (every rank's part written), not its own part alone
        dt = time.perf_counter() - t0
        if error is not None:  # the commit failed (storage, fenced, or the base was condemned)
            committed = False
            self.saver.interrupt(error)
        self.metrics.add(record.part(name=name, nbytes=nbytes, persist_s=dt, rank=self.rank, committed=committed,
                                     parts_wait_s=waited, error=error))
        if durable:
            self.metrics.flush()
        else:
            self.metrics.flush_due()
        if committed is None:
            logger.info("range %s: rank %d wrote its part of checkpoint %s (%s): %d bytes, stall %.3f s, persist %.3f s",
                        self.name, self.rank, name, at, nbytes, stall, dt)
        elif committed:
            logger.info("range %s: saved global checkpoint %s (%s, %d ranks, %s): %d bytes of rank 0, stall %.3f s, "
                        "persist %.3f s (%.3f s waiting for the other parts)", self.name, name, at,
                        self.cfg.world_size, mode, nbytes, stall, dt, waited)

    def close(self) -> None:
        """Wait for the save in flight (and a queued one) to commit, then free the snapshot arena: an ended range
        saves no more. Freed here, not when the garbage collector gets to the range: left
        to the collector, a 1.2 GB arena cost the next range's first epoch 1-3 s."""
        try:
            self.saver.wait(for_previous=False)  # the final save (its own line says when it committed)
            if self.multi and self.rank == 0:  # rank 0's commits still waiting for parts (bounded by their deadlines)
                self.gcheckpointer.committer.wait_all()
                self.saver.wait(for_previous=False)  # a commit's error that ends training
            if self.is_writer:
                self.metrics.flush()
            if self._final_submitted and self._last_persist_error is not None:
                self._final_save_failed(self._last_persist_error)
        finally:
            self._closed = True
            self._join_arena()
            self._arena.release()
            self._arena2.release()

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
            f"range {self.name} of job {self.cfg.job_id}: the FINAL checkpoint (epoch {self.epoch_no}) was NOT saved "
            f"({error}); a restart {then} and trains the remaining epochs again. "
            f"Fix the storage at {redact(self.cfg.uri)} (space, permissions)"
        )
        STATE.final_save_failures.append(msg)
        logger.error("%s", msg)


    def _follower(self) -> bool:
        """A rank other than 0 whose tensors are replicated and written by other ranks (rank 0, or the
        share writers when this rank is not one of them): its part holds no tensors."""
        if not self.multi or self.rank == 0 or decide_mode(self.cfg.rank_state, self.registry.entries)[0] != "replicated":
            return False
        return writer_cap(self.cfg.replicated_writers) is None or self.rank >= self._share_writers()

    def _spread(self, mode: Optional[str]) -> bool:
        """The ranks write shares of the replicated state (PADDLE_ACP_REPLICATED_WRITERS=all or N, format/shares.py)."""
        return self.multi and mode == "replicated" and writer_cap(self.cfg.replicated_writers) is not None

    def _share_writers(self) -> int:
        """Spread writes: how many ranks write shares (ranks 0..n-1)."""
        cap = writer_cap(self.cfg.replicated_writers)
        return shares.share_writers(self.gcheckpointer.world_size, cap if cap is not None else 1)


    def _prepare_arena(self) -> None:
        """Allocate and fault in the snapshot arena in the background, so the first save
        does not pay for it on the training thread."""
        if self._closed or not self.is_writer or not (self.saver.async_save or self.storage.direct_io) or self._follower():
            return
        size = sum(e.nbytes() for e in self.registry.entries)  # metadata only: nothing is copied
        if self._spread(decide_mode(self.cfg.rank_state, self.registry.entries)[0]):  # this rank's share of it
            items = [i for e in self.registry.entries for i in e.items()]
            mine = shares.owned(items, self.rank, self._share_writers())
            size = sum(align(i[4]) for i in items if (i[0], i[1]) in mine)
        self._state_size = size
        if self._budget is None:  # decided once, at the first registration
            self._budget = host_budget.decide(self.cfg.host_memory)
        arena = self._arena_size(size)
        if arena < size and not self._stream_logged:
            self._stream_logged = True
            logger.warning(
                "range %s: the state (%d bytes) is larger than the host-memory budget for checkpoints (%d bytes: "
                "%s): each save streams it through that buffer in chunks of %d bytes, and training waits while "
                "most of each checkpoint is written (the stall grows from one copy to about the write time). "
                "Set PADDLE_ACP_HOST_MEMORY to the memory you can spare (e.g. 8GiB or 30%%) for shorter stalls.",
                self.name, size, self._budget.nbytes, self._budget.source, chunk_size(arena),
            )
        self._join_arena()

        def prefault():
            lower_thread_priority()
            self._arena.ensure(arena)

        self._arena_thread = threading.Thread(target=prefault, name="paddle-acp-arena", daemon=True)
        self._arena_thread.start()

    def _arena_size(self, size: int) -> int:
        """The snapshot buffer for a state of ``size`` bytes: all of it when it fits the budget,
        else the budget's whole chunks (at least two)."""
        b = self._budget.nbytes if self._budget is not None else None
        if b is None or size <= b:
            return size
        chunk = chunk_size(b)
        return max(2, b // chunk) * chunk

    def _join_arena(self) -> None:
        t, self._arena_thread = self._arena_thread, None
        if t is not None:
            t.join()

