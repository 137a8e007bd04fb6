"""TicketWriter: owns persisting save tickets on the saver's thread and recording what became of each.

It has the checkpointer write this rank's part of a global checkpoint (a one-process job is one of world size 1),
whose commit rank 0 decides on its committer's thread, then records the outcome: the metrics record, the log line,
and the error of the last save that ended (reported when the range closes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional, Tuple

from paddle_acp import config as _config
from paddle_acp.format.checkpoints.metrics_log import MetricsLog
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.metrics_record import SaveBegun
from paddle_acp.runtime.buffers import SnapshotBuffers
from paddle_acp.runtime.saver import Saver, SaveTicket
from paddle_acp.runtime.schedule import SaveSchedule

logger = logging.getLogger("paddle_acp")


@dataclasses.dataclass(eq=False)
class TicketWriter:
    """Writes one range's save tickets on its saver's thread (its saver, its outcomes, its last error)."""

    name: str
    cfg: _config.CheckpointConfig
    global_checkpointer: GlobalCheckpointer  # every rank writes its part, rank 0 commits (one process: rank 0 of 1)
    metrics: MetricsLog
    schedule: SaveSchedule
    buffers: SnapshotBuffers
    last_error: Optional[BaseException] = None  # of the last save that ended

    def __post_init__(self) -> None:
        self.saver = Saver(self._persist, self.cfg.async_save)

    def _persist(self, ticket: SaveTicket) -> None:
        t0 = time.perf_counter()
        snap = ticket.snap
        record = SaveBegun(range=self.name, epoch=snap.range.epoch_no, step=snap.range.step,
                           stall_s=ticket.stall_seconds, waited_s=ticket.waited_seconds,
                           policy=self.schedule.busy_policy, queued=bool(ticket.queued),
                           skipped_before=ticket.skipped_before or 0)
        self._persist_part(ticket, record, t0)

    def _flush(self, durable: bool) -> None:
        """A durable save's metrics are written at once; the others' when due."""
        if durable:
            self.metrics.flush()
        else:
            self.metrics.flush_due()

    def _record_failure(self, record: SaveBegun, exc: BaseException, t0: float) -> None:
        self.last_error = exc
        self.metrics.add(record.failed(error=exc, persist_s=time.perf_counter() - t0))
        self.metrics.flush_due()

    def _streamed_record(self, ticket: SaveTicket, record: SaveBegun) -> Tuple[SaveBegun, float]:
        """The metrics record and stall of a saved snapshot (a streamed one's: until its last chunk was copied)."""
        stream = ticket.snap.stream
        if stream is None:
            return record, ticket.stall_seconds
        stall = stream.stall_seconds()
        return record.with_stream(stall, budget=self.buffers.budget_nbytes,
                                  buffer=stream.slots * stream.chunk, chunk=stream.chunk,
                                  chunks=stream.nchunks), stall

    def _persist_part(self, ticket: SaveTicket, record: SaveBegun, t0: float) -> None:
        """This rank's part; rank 0's commit is decided on the committer's thread (durable saves wait for it)."""
        snap = ticket.snap
        try:
            assert snap.mode is not None  # decided by Persister.save() for every save
            res = self.global_checkpointer.save(snap, snap.mode, wait=ticket.durable or not self.saver.async_save,
                                                part_wait=ticket.part_wait)
        except BaseException as exc:
            self.schedule.persist_ended()
            self._record_failure(record, exc, t0)
            raise
        finally:
            if snap.stream is not None:  # a save that failed before its data was written frees the copy
                snap.stream.abort("the checkpoint was not written")
        self.last_error = None
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
        """The metrics record and log line of a part written (rank 0: once its commit is decided, at
        ``decided_at`` when that was earlier: the persist time the plan is sized by excludes retention)."""
        self.schedule.persist_ended()
        dt = (time.perf_counter() if decided_at is None else decided_at) - done.t0
        if error is not None:  # the commit failed (storage, fenced, or the base was condemned)
            committed = False
            self.saver.interrupt(error)
        self.metrics.add(record.part(name=done.name, nbytes=done.nbytes, persist_s=dt, rank=self.cfg.trainer_id,
                                     committed=committed, parts_wait_s=waited, error=error))
        self._flush(done.durable)
        if committed is None:
            logger.info("range %s: rank %d wrote its part of checkpoint %s (%s): %d bytes, stall %.3f s, persist %.3f s",
                        self.name, self.cfg.trainer_id, done.name, done.at, done.nbytes, done.stall, dt)
        elif committed and not self.cfg.multi_rank:  # one process: a job of world size 1
            mbps = done.nbytes / dt / 1e6 if dt > 0 else 0.0
            logger.info("range %s: saved checkpoint %s (%s): %d bytes, stall %.3f s, persist %.3f s, %.1f MB/s",
                        self.name, done.name, done.at, done.nbytes, done.stall, dt, mbps)
        elif committed:
            logger.info("range %s: saved global checkpoint %s (%s, %d ranks, %s): %d bytes of rank 0, stall %.3f s, "
                        "persist %.3f s (%.3f s waiting for the other parts)", self.name, done.name, done.at,
                        self.cfg.world_size, done.mode, done.nbytes, done.stall, dt, waited)


class _PartWritten:
    """A part written by this rank, until its commit is decided (the metrics record and log line)."""

    def __init__(self, name: str, nbytes: int, at: str, stall: float, t0: float, mode: Optional[str],
                 durable: bool) -> None:
        self.name, self.nbytes, self.at, self.stall, self.t0, self.mode, self.durable = (
            name, nbytes, at, stall, t0, mode, durable)
