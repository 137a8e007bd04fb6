"""Saver: persist snapshots synchronously or on one background thread.

At most one snapshot is being written, and at most one more may wait behind it
(``enqueue``; the ``queue`` busy policy). ``wait`` blocks until both are
committed and reports (logs, counts) failures on the calling (training) thread.
What a save that comes due while the saver is busy does is decided by the save-decision policy
(:mod:`~paddle_acp.runtime.save_decision`). The saver queues and writes save tickets (:class:`SaveTicket`):
a snapshot (the checkpoint's content) with what the runtime decided about its save.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Callable, List, Optional, Tuple

from paddle_acp.errors import RestartRequiredError
from paddle_acp.format.commit.fencing import FencedError
from paddle_acp.format.engine.snapshot import Snapshot
from paddle_acp.threads import lower_thread_priority

logger = logging.getLogger("paddle_acp")


@dataclasses.dataclass
class SaveTicket:
    """One save as the runtime decided it, beside the :class:`~paddle_acp.format.engine.snapshot.Snapshot`
    it writes (which holds the checkpoint's content only): the saver queues and writes tickets,
    and the save's metrics record is made of them. None of it is in the checkpoint's files."""

    snap: Snapshot
    buffer: int = 0  # which of the range's snapshot buffers holds ``snap.image`` (0, or 1 when queued)
    durable: bool = False  # the final save of a range or a preemption save: its metrics are written at once
    queued: bool = False  # it waited in the second buffer behind the previous checkpoint
    skipped_before: int = 0  # saves skipped since the previous one was taken
    part_wait: Optional[float] = None  # several ranks: rank 0's wait for the parts (None: the configured timeout)
    waited_seconds: float = 0.0  # of ``stall_seconds``: waiting for the previous save
    stall_seconds: float = 0.0  # training-thread time spent taking the snapshot (set once it is taken)


@dataclasses.dataclass
class SaveStats:
    saves: int = 0
    failures: int = 0
    skipped: int = 0
    queued: int = 0


class Saver:
    def __init__(self, persist: Callable[[SaveTicket], None], async_save: bool, name: str = "paddle-acp-saver"):
        self._persist = persist
        self.async_save = async_save
        self._name = name
        self._thread: Optional[threading.Thread] = None
        self._errors: List[Exception] = []  # the background saves' failures, raised by wait()
        self._lock = threading.Lock()
        self._inflight: Optional[SaveTicket] = None  # the save being written (background thread)
        self._queued: Optional[SaveTicket] = None  # the save waiting behind it
        self._interrupt: Optional[BaseException] = None
        self.stats = SaveStats()

    def _run(self, ticket: SaveTicket) -> None:
        try:
            self._persist(ticket)
        except RestartRequiredError as exc:
            # the ranks would go on from different checkpoints: not a failed save that the next one
            # retries, but the end of training, on the training thread (as an interrupt is)
            self.stats.failures += 1
            if not self.async_save or threading.current_thread() is threading.main_thread():
                raise
            self._interrupt = exc
        except Exception as exc:  # reported on the training thread by wait()
            self._errors.append(exc)
        except BaseException as exc:
            # KeyboardInterrupt (Ctrl-C) or SystemExit: the checkpointer has removed the partial
            # checkpoint; the last committed one is intact. On the training thread (synchronous and
            # preemption saves) it propagates and stops the process; a background thread hands it
            # to wait(), which raises it on the training thread.
            self.stats.failures += 1
            logger.warning("checkpoint save interrupted by %s; its partial files were removed, the last "
                           "committed checkpoint is intact", type(exc).__name__)
            if not self.async_save or threading.current_thread() is threading.main_thread():
                raise
            self._interrupt = exc

    def _loop(self, ticket: Optional[SaveTicket]) -> None:
        lower_thread_priority()
        while ticket is not None:
            self._run(ticket)
            with self._lock:
                ticket, self._queued = self._queued, None
                self._inflight = ticket

    def _report(self) -> None:
        errors, self._errors = self._errors, []
        for exc in errors:
            self.stats.failures += 1
            if isinstance(exc, FencedError):  # the fence said so once, at ERROR; this writer saves no more
                logger.debug("checkpoint save refused: %s", exc)
                continue
            # One line with the cause per failure; the traceback once (later ones at DEBUG), so a
            # storage outage does not print a screenful every epoch.
            cause = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
            first = self.stats.failures == 1
            logger.error("checkpoint save failed (%d so far); training goes on and the next save retries: %s: %s%s",
                         self.stats.failures, type(exc).__name__, cause,
                         "" if first else " (traceback at DEBUG level: PADDLE_ACP_LOG_LEVEL=DEBUG)",
                         exc_info=exc if first else None)
            if not first and logger.isEnabledFor(logging.DEBUG):
                logger.debug("traceback of the failed save", exc_info=exc)
        interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt

    def interrupt(self, exc: BaseException) -> None:
        """Hand ``exc`` (raised on another thread: a commit's error) to the training thread: a
        RestartRequiredError is raised by the next :meth:`wait`, any other is reported there."""
        if isinstance(exc, RestartRequiredError) or not isinstance(exc, Exception):
            self.stats.failures += 1
            self._interrupt = exc
        else:
            self._errors.append(exc)

    @property
    def busy(self) -> bool:
        """A checkpoint is being written (or waits to be)."""
        with self._lock:
            return self._inflight is not None

    @property
    def queue_free(self) -> bool:
        with self._lock:
            return self._queued is None

    @property
    def inflight(self) -> Optional[SaveTicket]:
        """The save being written now, or None (its snapshot's buffers must not be reused)."""
        with self._lock:
            return self._inflight

    def enqueue(self, ticket: SaveTicket) -> None:
        """Write ``ticket``'s snapshot after the checkpoint in flight (the save decision said QUEUE); when
        that one finished meanwhile, write it now. Its buffers must differ from the in-flight one's."""
        with self._lock:
            if self._inflight is not None and self._queued is None:
                self._queued = ticket
                self.stats.saves += 1
                self.stats.queued += 1
                return
        self.submit(ticket)

    def wait(self, for_previous: bool = True) -> float:
        """Block until the saves in flight and queued (if any) are committed; returns seconds waited.

        ``for_previous``: a due save waits for the previous checkpoint (said in one log line); else the
        caller waits for its own save (a synchronous or final one), which logs its own line."""
        waited = 0.0
        t = self._thread
        if t is not None:
            if self.busy:
                start = time.perf_counter()
                t.join()
                waited = time.perf_counter() - start
                if for_previous:
                    logger.info("waited %.3f s for the previous checkpoint to be written", waited)
            else:
                t.join()  # done with its last snapshot: at most leaving its loop
            self._thread = None
        self._report()
        return waited

    def wait_idle(self, timeout: float) -> Tuple[bool, float]:
        """Wait at most ``timeout`` seconds for the checkpoint in flight (the ``auto`` policy):
        (whether the saver is idle now, seconds waited). Failures are reported by the next :meth:`wait`."""
        t = self._thread
        if t is None or not self.busy:
            return True, 0.0
        start = time.perf_counter()
        t.join(max(0.0, timeout))
        waited = time.perf_counter() - start
        return not t.is_alive(), waited

    def submit(self, ticket: SaveTicket) -> None:
        """Persist ``ticket``'s snapshot (call ``wait`` first: the snapshot buffers are reused)."""
        self.wait()
        self.stats.saves += 1
        if not self.async_save:
            self._run(ticket)
            self._report()
            return
        self._inflight = ticket
        # Not a daemon: a normal interpreter exit waits for the save to commit.
        self._thread = threading.Thread(target=self._loop, args=(ticket,), name=self._name, daemon=False)
        self._thread.start()
