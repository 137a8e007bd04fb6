"""Saver: persist snapshots synchronously or on one background thread.

At most one snapshot is in flight. ``wait`` blocks until it is committed and
reports (logs, counts) a failure on the calling (training) thread.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Callable, Optional

logger = logging.getLogger("paddle_acp")

BACKGROUND_NICE = 10  # added to the nice value of background (save, checksum, prefault) threads


def lower_thread_priority() -> None:
    """Lower the calling thread's CPU priority (Linux: per-thread nice), so that background
    checkpoint work yields the cores to training instead of competing with it."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except (AttributeError, OSError) as exc:  # not Linux, or not permitted: run at normal priority
        logger.debug("could not lower the priority of %s: %s", threading.current_thread().name, exc)


@dataclasses.dataclass
class SaveStats:
    saves: int = 0
    failures: int = 0
    waits: int = 0
    wait_seconds: float = 0.0
    last_error: Optional[BaseException] = None


class Saver:
    def __init__(self, persist: Callable[[object], None], async_save: bool, name: str = "paddle-acp-saver"):
        self._persist = persist
        self.async_save = async_save
        self._name = name
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._interrupt: Optional[BaseException] = None
        self.stats = SaveStats()

    def _run(self, snap) -> None:
        if self.async_save:  # on the background thread (sync saves run on the caller's)
            lower_thread_priority()
        try:
            self._persist(snap)
        except Exception as exc:  # reported on the training thread by wait()
            self._error = exc
        except BaseException as exc:
            # KeyboardInterrupt (Ctrl-C) or SystemExit: the checkpointer has removed the partial
            # checkpoint; the last committed one is intact. On the training thread (synchronous and
            # preemption saves) it propagates and stops the process; a background thread hands it
            # to wait(), which raises it on the training thread.
            self.stats.failures += 1
            self.stats.last_error = exc
            logger.warning("checkpoint save interrupted by %s; its partial files were removed, the last "
                           "committed checkpoint is intact", type(exc).__name__)
            if not self.async_save or threading.current_thread() is threading.main_thread():
                raise
            self._interrupt = exc

    def _report(self) -> None:
        exc, self._error = self._error, None
        if exc is not None:
            self.stats.failures += 1
            self.stats.last_error = exc
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

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> float:
        """Block until the in-flight save (if any) finished; returns seconds waited."""
        waited = 0.0
        t = self._thread
        if t is not None:
            if t.is_alive():
                start = time.perf_counter()
                t.join()
                waited = time.perf_counter() - start
                self.stats.waits += 1
                self.stats.wait_seconds += waited
                logger.info("waited %.3f s for the previous checkpoint to be written", waited)
            self._thread = None
        self._report()
        return waited

    def submit(self, snap) -> None:
        """Persist ``snap`` (call ``wait`` first: the snapshot buffers are reused)."""
        self.wait()
        self.stats.saves += 1
        if not self.async_save:
            self._run(snap)
            self._report()
            return
        # Not a daemon: a normal interpreter exit waits for the save to commit.
        self._thread = threading.Thread(target=self._run, args=(snap,), name=self._name, daemon=False)
        self._thread.start()
