"""DataLoader workers: recognises, in a forked child, that the fork is Paddle's ``DataLoader`` starting a worker.

``paddle.io.DataLoader(num_workers>0)`` starts its workers in
``_DataLoaderIterMultiProcess._init_workers`` (``paddle.io.dataloader.dataloader_iter``, Paddle 2.6 to
3.3) through ``multiprocessing.Process(...).start()``: with the ``fork`` start method (Linux's default
before Python 3.14) the child is forked while that method is on the forking thread's stack, which the
child inherits. :func:`forking_loader_worker`, called from an ``os.register_at_fork`` child hook, reads
that stack; it imports nothing (a forked child must not take locks another thread of the parent held).
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
