"""Ctrl-C while rank 0 waits for other ranks' parts: the waits end at once, then Python's own handler runs.

:func:`watch` installs, once, on the main thread and only where SIGINT has Python's default handler, a handler
that cancels every watched committer's commits (abandoned, never half-committed) and then calls Python's handler.
A preemption signal brings the pending commits' deadlines forward to a preemption save's wait (:func:`preempted`).
"""

from __future__ import annotations

import logging
import signal
import threading
import weakref
from types import FrameType
from typing import Optional

from paddle_acp.format.checkpoints.multirank import PREEMPT_PART_WAIT
from paddle_acp.format.commit.committer import Committer

logger = logging.getLogger("paddle_acp")

_committers: "weakref.WeakSet[Committer]" = weakref.WeakSet()


def on_sigint(signum: int, frame: Optional[FrameType]) -> None:
    cancelled = sum(c.cancel("interrupted (SIGINT)") for c in list(_committers))
    if cancelled:
        logger.warning("interrupted: %d checkpoint commit(s) waiting for other ranks' parts abandoned; the last "
                       "committed checkpoint is intact", cancelled)
    signal.default_int_handler(signum, frame)


def watch(committer: Committer) -> None:
    """Cancel ``committer``'s commits when SIGINT comes (call on the main thread; idempotent)."""
    _committers.add(committer)
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, on_sigint)
    except (ValueError, OSError) as exc:  # not the main interpreter, or no signals here
        logger.debug("could not watch SIGINT: %s", exc)


def preempted() -> None:
    """A preemption signal came (called in its handler): pending commits wait at most a preemption save's wait."""
    for c in list(_committers):
        c.hurry(PREEMPT_PART_WAIT)
