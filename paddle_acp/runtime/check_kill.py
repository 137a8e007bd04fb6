"""``paddle-acp check``'s kill point: the process SIGKILLs itself where the check asked.

``PADDLE_ACP_CHECK_KILL_AT`` (``EPOCH[:STEP]@RANGE``, set by the check on the first process of a
killed run only) names the point: inside epoch EPOCH of range RANGE, after the first Executor.run
of that epoch (with STEP: of batch STEP of it, counted from 0: ``paddle_acp.resumable``'s batches, or
the Executor.runs of the epoch where its batches do not go through it). There, the range waits until
every checkpoint it took is committed, appends a ``kill`` record to the digests and SIGKILLs its own
process: the kill lands at the same training position on any machine load, and a checkpoint is
always there to resume from (the check sets the busy policy to ``wait`` so that every due save is
taken).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Callable, Dict, Optional, Protocol

logger = logging.getLogger("paddle_acp")


class _Where(Protocol):
    """The loop's position (:class:`paddle_acp.runtime.steps.Position`)."""

    epoch_no: int
    step: Optional[int]


class KillPoint:
    """Where a process run by ``paddle-acp check`` kills itself (see the module's docstring)."""

    def __init__(self, epoch: int, step: Optional[int], position: _Where,
                 wait_commits: Callable[[], object], note: Callable[[Dict[str, object]], None]) -> None:
        """``wait_commits()``: block until the range's saves in flight are committed; ``note(record)``:
        append a record to the digests (written and flushed before the kill)."""
        self.epoch = epoch
        self.step = step
        self.position = position
        self.wait_commits = wait_commits
        self.note = note

    def reached(self, runs_in_epoch: int) -> bool:
        """Whether the run that just ended (the ``runs_in_epoch``-th of its epoch) is at the point."""
        if self.position.epoch_no != self.epoch:
            return False
        if self.step is None:
            return True
        step = self.position.step if self.position.step is not None else runs_in_epoch - 1
        return step >= self.step

    def after_run(self, runs_in_epoch: int) -> None:
        """Called after every Executor.run of the range: kill the process at the point."""
        if not self.reached(runs_in_epoch):
            return
        self.wait_commits()
        step = self.position.step if self.position.step is not None else runs_in_epoch - 1
        self.note({"kind": "kill", "epoch": self.epoch, "step": step, "asked_step": self.step})
        logger.warning("paddle-acp check: SIGKILL at epoch %d, batch %d (PADDLE_ACP_CHECK_KILL_AT)", self.epoch, step)
        for h in logging.getLogger("paddle_acp").handlers:
            h.flush()
        os.kill(os.getpid(), signal.SIGKILL)
