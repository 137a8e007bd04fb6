"""Coordination through storage alone: rank 0's decisions are small files beside the range's checkpoints.

The fallback where a job has no store (or ``PADDLE_ACP_COORDINATION=storage``): a decision is the file
``{range_dir}/{key}`` (the save plan: ``plan.json``), replaced by each post; arrivals are not counted (rank 0's
commit polls the listing, :mod:`paddle_acp.format.commit.part_commit`), and there is no store to lose.
"""

from __future__ import annotations

from typing import Optional

from paddle_acp.runtime.coord.base import Coordinator
from paddle_acp.storage.base import Storage


class StorageCoordinator(Coordinator):
    kind = "storage"

    def __init__(self, storage: Storage, range_dir: str) -> None:
        self.storage = storage
        self.dir = range_dir
        self._dir_made = False

    def post(self, key: str, value: bytes) -> None:
        """One small write (a reader that meets it half-written reads again: the caller validates)."""
        if not self._dir_made:
            self.storage.makedirs(self.dir)
            self._dir_made = True
        self.storage.write_bytes(f"{self.dir}/{key}", value)

    def latest(self, key: str, limit: int) -> Optional[bytes]:
        try:
            return self.storage.read_bytes(f"{self.dir}/{key}", limit=limit)
        except FileNotFoundError:
            return None
