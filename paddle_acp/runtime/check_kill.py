"""``paddle-acp check``'s kill point: the process SIGKILLs itself where the check asked.

``PADDLE_ACP_CHECK_KILL_AT`` (``EPOCH[:STEP]@RANGE``) names the point: after the first Executor.run of epoch EPOCH
of range RANGE (with STEP: of batch STEP of it). There the range waits until every checkpoint it took is committed,
appends a ``kill`` record to the digests and SIGKILLs its own process: the same training position on any load.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
from typing import TYPE_CHECKING, Callable, Dict, Optional

if TYPE_CHECKING:
    from paddle_acp.runtime.steps import Position

logger = logging.getLogger("paddle_acp")


@dataclasses.dataclass(eq=False)
class KillPoint:
    """Where a process run by ``paddle-acp check`` kills itself."""

    epoch: int
    step: Optional[int]
    position: Position
    wait_commits: Callable[[], object]  # block until the range's saves are committed
    note: Callable[[Dict[str, object]], None]  # append a record to the digests

    def _step(self, runs_in_epoch: int) -> int:
        return self.position.step if self.position.step is not None else runs_in_epoch - 1

    def reached(self, runs_in_epoch: int) -> bool:
        """Whether the run that just ended (the ``runs_in_epoch``-th of its epoch) is at the point."""
        if self.position.epoch_no != self.epoch:
            return False
        return self.step is None or self._step(runs_in_epoch) >= self.step

    def after_run(self, runs_in_epoch: int) -> None:
        """Called after every Executor.run of the range: kill the process at the point."""
        if not self.reached(runs_in_epoch):
            return
        self.wait_commits()
        step = self._step(runs_in_epoch)
        self.note({"kind": "kill", "epoch": self.epoch, "step": step, "asked_step": self.step})
        logger.warning("paddle-acp check: SIGKILL at epoch %d, batch %d (PADDLE_ACP_CHECK_KILL_AT)", self.epoch, step)
        for h in logging.getLogger("paddle_acp").handlers:
            h.flush()
        os.kill(os.getpid(), signal.SIGKILL)
