"""Saver: persist snapshots synchronously or on one background thread.

At most one save ticket (:class:`SaveTicket`: a snapshot and what the runtime decided about its save) is being
written, and at most one more may wait behind it (``enqueue``; the ``queue`` busy policy). ``wait`` blocks until
both are committed and reports failures on the calling (training) thread.
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
    """One save as the runtime decided it, beside the snapshot it writes (none of it is in the checkpoint)."""

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
        except BaseException as exc:
            if isinstance(exc, Exception) and not isinstance(exc, RestartRequiredError):
                self._errors.append(exc)  # reported on the training thread by wait()
                return
            # the ranks would go on from different checkpoints (RestartRequiredError), or KeyboardInterrupt or
            # SystemExit (the partial checkpoint is removed): raised on the training thread
            self.stats.failures += 1
            if not isinstance(exc, Exception):
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
            # one line per failure; the traceback once (later ones at DEBUG)
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
        """Hand a commit's error to the training thread: raised (RestartRequiredError) or reported by :meth:`wait`."""
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
        """Write ``ticket`` after the checkpoint in flight (or now, when that one finished meanwhile)."""
        with self._lock:
            if self._inflight is not None and self._queued is None:
                self._queued = ticket
                self.stats.saves += 1
                self.stats.queued += 1
                return
        self.submit(ticket)

    def wait(self, for_previous: bool = True) -> float:
        """Block until the saves in flight and queued are committed; returns seconds waited (``for_previous``:
        a due save waits for the previous checkpoint, said in a log line)."""
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
        """Wait at most ``timeout`` s for the checkpoint in flight (``auto``): (idle now, seconds waited)."""
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
