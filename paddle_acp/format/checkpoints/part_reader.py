"""PartReader: reads one checkpoint directory written by one writer (its manifest and data file).

Such a directory is a rank's part (``ckpt-e{E}[-s{S}]/rank-R``) or an earlier release's ``ckpt-N`` (read-only).
The reading is :mod:`~paddle_acp.format.engine.reader`'s; this adds the range's place, the node-local cache and
the host-memory budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from paddle_acp.format.checkpoints import index
from paddle_acp.format.engine import reader
from paddle_acp.format.engine.reader import Landing, LoadedCheckpoint
from paddle_acp.format.layout import final_name, range_dir
from paddle_acp.storage.base import Storage

if TYPE_CHECKING:
    from paddle_acp.format.checkpoints.cache import RangeCache


class PartReader:
    """Reads the one-writer checkpoints of one range: a rank's part, an earlier release's ``ckpt-N``."""

    def __init__(self, storage: Storage, job_id: str, range_name: str, cache: Optional["RangeCache"] = None,
                 memory_budget: Optional[int] = None) -> None:
        """``cache``: this range's node-local copies (``PADDLE_ACP_LOCAL_CACHE``); ``memory_budget``:
        ``PADDLE_ACP_HOST_MEMORY`` in bytes (a larger restore is neither mapped nor held in memory)."""
        self.storage = storage
        self.job_id = job_id
        self.range_name = range_name
        self.dir = range_dir(job_id, range_name)
        self.memory_budget = memory_budget
        self.landing: Optional[Landing] = None  # where a restore lands (the runtime's snapshot arena), while it loads
        self.cache = cache

    def check_no_links(self) -> None:
        """Refuse a linked ``range`` or range directory (:func:`paddle_acp.format.checkpoints.index.check_no_links`)."""
        index.check_no_links(self.storage, self.job_id, self.range_name)

    def base(self, number: int) -> str:
        """The directory of committed checkpoint ``number``."""
        return f"{self.dir}/{final_name(number)}"

    def load(self, number: int, base: Optional[str] = None, raw: Optional[bytes] = None,
             landing: Optional[Landing] = None) -> LoadedCheckpoint:
        """Read and verify checkpoint ``number`` completely (:func:`reader.load`; CorruptCheckpointError), from the
        local copy when it is this very checkpoint (:meth:`paddle_acp.format.checkpoints.cache.RangeCache.load`).
        ``landing`` (else :attr:`landing`): the buffer read into."""
        landing = landing if landing is not None else self.landing
        if self.cache is not None and base is None:
            _m, raw = reader.read_manifest_raw(self.storage, self.base(number), number, self.range_name, raw)
            cached = self.cache.load(final_name(number), number, raw, memory_budget=self.memory_budget, landing=landing)
            if cached is not None:
                cached.path = self.base(number)
                return cached
        return reader.load(self.storage, base or self.base(number), number, self.range_name, raw, self.memory_budget,
                           landing)

