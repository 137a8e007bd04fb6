"""Preemption: turn SIGTERM (and optionally other signals) into a save at the next safe point.

The handler only records the signal; the training thread saves at the next step or epoch boundary and then
raises :class:`Preempted` (``SystemExit`` with status 128 + signal number) unless told to continue. Children
forked meanwhile are handled by :mod:`~paddle_acp.runtime.shield`.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Callable, Dict, List, Optional

from paddle_acp.runtime import interrupt, shield

logger = logging.getLogger("paddle_acp")


class Preempted(SystemExit):
    """Raised at a safe point after a preemption signal, once the checkpoint is committed."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def _python_sigint(signum: int, handler: object) -> bool:
    """Whether ``handler`` is Python's own SIGINT handler (or paddle-acp's wrapper of it): it raises
    KeyboardInterrupt, which would stop the process before the save that SIGINT, named in
    PADDLE_ACP_PREEMPT_SIGNALS, asks for. A script's own SIGINT handler is still called."""
    return signum == signal.SIGINT and (handler is signal.default_int_handler or handler is interrupt.on_sigint)


class PreemptionWatcher:
    """Installs the handlers for the life of a range; chains to the previous handlers (but for Python's
    KeyboardInterrupt when SIGINT is a preemption signal)."""

    def __init__(self, signals: List[int], where: Optional[Callable[[], str]] = None,
                 on_signal: Optional[Callable[[], None]] = None):
        self.signals = signals
        self._where = where  # where the save will happen (said when a signal comes)
        self._on_signal = on_signal  # called (in the handler) when the first signal comes
        self.received: Optional[int] = None
        self._previous: Dict[int, signal._HANDLER] = {}  # signal -> the handler before ours

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        first = self.received is None
        self.received = signum if first else self.received
        if first:
            where = self._where() if self._where is not None else "the end of the epoch"
            logger.warning("received %s: checkpointing at %s", signal.Signals(signum).name, where)
            if self._on_signal is not None:
                self._on_signal()
        prev = self._previous.get(signum)
        if callable(prev) and not _python_sigint(signum, prev):
            prev(signum, frame)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        shield.engage(dict(self._previous))

    def uninstall(self) -> None:
        shield.release()
        for sig, prev in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
        self._previous.clear()

    def clear(self) -> None:
        self.received = None
