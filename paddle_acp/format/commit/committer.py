"""Rank 0's commits of checkpoints of several ranks, on a thread of their own, in position order.

After its own part, rank 0's saver hands the rest (wait for the parts, ``global.json``, retention:
:mod:`~paddle_acp.format.commit.part_commit`) to the :class:`Committer`, so neither the saver nor the training
thread waits for another rank. A commit is decided when ``global.json`` is in place or the position abandoned;
its :meth:`PendingCommit.then` work (retention) runs after, before the next commit. Each commit has a deadline
(``PADDLE_ACP_PART_TIMEOUT``); a later one with an earlier deadline (a preemption save) brings earlier ones'
forward. :meth:`Committer.cancel` (Ctrl-C) abandons every pending commit, never half-committed. The thread is not
a daemon (a normal exit lets commits finish, bounded by their deadlines) and exits when idle.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Deque, List, Optional

from paddle_acp.threads import lower_thread_priority

logger = logging.getLogger("paddle_acp")


class PendingCommit:
    """One position's commit: handed over, then decided (``committed`` True or False, or ``error``)."""

    def __init__(self, name: str, deadline: float, run: Callable[["PendingCommit"], bool]):
        self.name = name
        self.deadline = deadline  # time.monotonic(); brought forward by a later, more urgent commit
        self.cancel = threading.Event()  # set by Committer.cancel: abandon at once
        self.cancel_reason = ""
        self.started = time.monotonic()
        self.waited = 0.0  # seconds spent waiting for the other parts (set by the commit)
        self.committed: Optional[bool] = None
        self.decided_at: Optional[float] = None  # time.perf_counter() when decided (before the ``then`` work)
        self.error: Optional[BaseException] = None
        self._run = run
        self._done = threading.Event()
        self._settled = threading.Event()  # decided and its ``then`` work done
        self._lock = threading.Lock()
        self._callbacks: List[Callable[["PendingCommit"], None]] = []
        self._then: List[Callable[[], None]] = []

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, fn: Callable[["PendingCommit"], None]) -> None:
        """Call ``fn(self)`` once decided (at once when it is already; else on the committer's thread)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def then(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the committer's thread after this commit is decided and its callbacks ran, before
        :meth:`wait` returns: housekeeping (retention) outside the commit's timing (``decided_at``)."""
        self._then.append(fn)

    def wait(self) -> bool:
        """Block until decided and its ``then`` work done; True when committed. Raises the commit's error."""
        self._settled.wait()
        if self.error is not None:
            raise self.error
        return bool(self.committed)

    def _finish(self, committed: Optional[bool], error: Optional[BaseException]) -> None:
        with self._lock:
            self.committed, self.error = committed, error
            self.decided_at = time.perf_counter()
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception as exc:  # a metrics line or a log line: never the commit's outcome
                logger.warning("after the commit of checkpoint %s: %s", self.name, exc)

    def run(self) -> None:
        try:
            try:
                committed = self._run(self)
            except BaseException as exc:  # handed to whoever waits for it (or to the done callbacks)
                self._finish(False, exc)
                return
            self._finish(committed, None)
            then, self._then = self._then, []
            for fn in then:
                try:
                    fn()
                except Exception as exc:  # housekeeping after a decided commit: never its outcome
                    logger.warning("after the commit of checkpoint %s: %s", self.name, exc)
        finally:
            self._settled.set()


class Committer:
    """Runs :class:`PendingCommit` objects one at a time on one non-daemon thread (see the module docstring)."""

    def __init__(self, name: str = "paddle-acp-committer") -> None:
        self._name = name
        self._lock = threading.RLock()  # also taken by signal handlers (cancel, hurry) on the main thread
        self._queue: Deque[PendingCommit] = collections.deque()
        self._current: Optional[PendingCommit] = None
        self._thread: Optional[threading.Thread] = None

    def submit(self, name: str, timeout: float, run: Callable[[PendingCommit], bool]) -> PendingCommit:
        """Hand over the commit of position ``name`` (``run`` decides it), due within ``timeout`` seconds."""
        p = PendingCommit(name, time.monotonic() + timeout, run)
        with self._lock:
            for q in self._pending():
                q.deadline = min(q.deadline, p.deadline)
            self._queue.append(p)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=False)
                self._thread.start()
        return p

    def _pending(self) -> List[PendingCommit]:
        return ([self._current] if self._current is not None else []) + list(self._queue)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._pending())

    def _loop(self) -> None:
        lower_thread_priority()
        while True:
            with self._lock:
                if not self._queue:
                    self._current = None
                    self._thread = None
                    return
                p = self._current = self._queue.popleft()
            p.run()

    def cancel(self, reason: str) -> int:
        """Abandon every commit waiting or queued now, at once (``reason``: for the log line); returns how many."""
        with self._lock:
            pending = self._pending()
        for p in pending:
            if not p.done:
                p.cancel_reason = reason
                p.cancel.set()
        return len(pending)

    def hurry(self, seconds: float) -> None:
        """Bring every pending commit's deadline to at most ``seconds`` from now (a preemption signal came)."""
        deadline = time.monotonic() + seconds
        with self._lock:
            for p in self._pending():
                p.deadline = min(p.deadline, deadline)

    def wait_all(self) -> None:
        """Block until every commit handed over is decided (each is bounded by its deadline)."""
        while True:
            with self._lock:
                t = self._thread
            if t is None:
                return
            t.join(1.0)
