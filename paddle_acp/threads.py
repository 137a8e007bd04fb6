"""Background threads: the lower CPU priority every paddle-acp helper thread runs at (below every layer)."""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger("paddle_acp")

BACKGROUND_NICE = 10  # added to the nice value of background (save, checksum, prefault) threads


def lower_thread_priority() -> None:
    """Lower the calling thread's CPU priority (Linux: per-thread nice): checkpoint work yields to training."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE))
    except (AttributeError, OSError) as exc:  # not Linux, or not permitted: run at normal priority
        logger.debug("could not lower the priority of %s: %s", threading.current_thread().name, exc)
