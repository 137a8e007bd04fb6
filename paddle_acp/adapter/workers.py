"""DataLoader workers: recognises, in a forked child, that the fork is Paddle's ``DataLoader`` starting a worker.

Paddle (2.6 to 3.3) forks its workers from ``_DataLoaderIterMultiProcess._init_workers``, which the child
inherits on its stack. :func:`forking_loader_worker` (an ``os.register_at_fork`` child hook) reads that stack and
imports nothing: a forked child must not take locks another thread of the parent held.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Optional

#: the method of Paddle's multi-process loader iterator that forks its workers
_STARTS_WORKERS = "_init_workers"
_DEPTH = 40  # frames looked at above the hook (multiprocessing's start is ~6 deep)


def forking_loader_worker() -> bool:
    """Whether the fork that is returning in this (child) process is a Paddle DataLoader starting a worker."""
    frame: Optional[FrameType] = sys._getframe(1)
    for _ in range(_DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_name == _STARTS_WORKERS and str(frame.f_globals.get("__name__", "")).startswith("paddle."):
            return True
        frame = frame.f_back
    return False
