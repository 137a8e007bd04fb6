"""The restart's own choice of checkpoint, for tests that read a single-process job's range."""

from __future__ import annotations

from typing import Optional

from paddle_acp.format.checkpoints.checkpointer import Checkpointer
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.engine.loaded import LoadedCheckpoint


def load_as_restart(ck: Checkpointer) -> Optional[LoadedCheckpoint]:
    """What a restart of a one-process job over ``ck``'s range loads: the newest checkpoint that
    verifies (:func:`paddle_acp.format.checkpoints.restart.load_newest`, the runtime's path)."""
    return load_newest(ck, GlobalCheckpointer(ck.storage, ck.job_id, ck.range_name, 0, 1), None)
