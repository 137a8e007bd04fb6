"""The restart's own choice of checkpoint, and the committed checkpoints, for tests that read a one-process
job's range (either layout: an earlier release's ``ckpt-N``, today's one-part ``ckpt-e{E}[-s{S}]/rank-0``)."""

from __future__ import annotations

import os
from typing import List, Optional

from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.checkpointer import Checkpointer
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.engine.loaded import LoadedCheckpoint
from paddle_acp.storage import Storage


def load_as_restart(ck: Checkpointer) -> Optional[LoadedCheckpoint]:
    """What a restart of a one-process job over ``ck``'s range loads: the newest checkpoint that
    verifies (:func:`paddle_acp.format.checkpoints.restart.load_newest`, the runtime's path)."""
    return load_newest(ck, GlobalCheckpointer(ck.storage, ck.job_id, ck.range_name, 0, 1), None)


def committed(storage: Storage, job_id: str, range_name: str = "_range_0") -> List[str]:
    """The names of the range's committed checkpoints, oldest first (the restart's order, reversed)."""
    return [e.name for e in reversed(index.entries(storage, job_id, range_name))]


def part_dir(range_dir: "str | os.PathLike[str]", name: str) -> str:
    """The local directory holding ``name``'s ``manifest.json`` and ``tensors.bin`` (one process: its rank-0
    part; an earlier release's ``ckpt-N``: the checkpoint itself)."""
    d = os.path.join(os.fspath(range_dir), name)
    return d if os.path.exists(os.path.join(d, "manifest.json")) else os.path.join(d, "rank-0")
