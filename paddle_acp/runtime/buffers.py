"""Snapshot buffers: owns the host memory a range's checkpoints are copied into.

:class:`SnapshotBuffers` holds the two snapshot arenas (the first, populated in the background from when a program
registers; the ``queue`` policy's second, allocated when first needed) and the host-memory budget
(:mod:`~paddle_acp.runtime.budget`). A state larger than the budget is streamed through the first arena in
chunks. A restore lands in the first arena (:meth:`SnapshotBuffers.lend`): the pages the first save needs anyway.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

import numpy as np

from paddle_acp.config import HostMemory
from paddle_acp.format.engine.arena import Arena
from paddle_acp.format.engine.loaded import Lent
from paddle_acp.format.engine.stager import Stager
from paddle_acp.format.engine.stream import chunk_size
from paddle_acp.runtime import budget as host_budget
from paddle_acp.threads import lower_thread_priority

logger = logging.getLogger("paddle_acp")

# The ``queue`` busy policy's second snapshot buffer must leave at least this much memory available.
QUEUE_HEADROOM = 1 << 30


class SnapshotBuffers:
    """The snapshot arenas of one range and the host-memory budget that bounds them."""

    def __init__(self, range_name: str, host_memory: HostMemory | None, stager: Stager) -> None:
        """``host_memory``: ``PADDLE_ACP_HOST_MEMORY`` (None: adaptive); ``stager``: copies into these buffers."""
        self.range_name = range_name
        self.stager = stager
        self.host_memory = host_memory
        self.first = Arena()
        self.second = Arena()  # the ``queue`` policy's second buffer, allocated when first needed
        self._queue_ok: bool | None = None  # whether that buffer fits in host memory (decided once)
        self._prefault: list[threading.Thread] = []  # populating the first arena
        self._whole = False  # the background thread allocates the first arena whole (no chunked population)
        self.budget: host_budget.Budget | None = None  # decided at the first registration
        self.state_size = 0  # the registered programs' state, from the tensors' metadata
        self.first_size = 0  # the first arena's size for it
        self._stream_logged = False
        self._released = False

    @property
    def budget_nbytes(self) -> int | None:
        """The host-memory budget in bytes, None before the first registration."""
        return self.budget.nbytes if self.budget is not None else None

    def lend(self, size: int) -> Optional[Lent]:
        """The first arena, mapped (not populated) for ``size`` bytes, lent to a restore to land in; None over the
        budget. Given back, it is the first arena again unless a save mapped another meanwhile or the range ended."""
        if self.budget is None:
            self.budget = host_budget.decide(self.host_memory)
        if size <= 0 or self._released or not self.budget.fits(size):
            return None
        arena, self.first = self.first, Arena()
        if arena.start(size):
            arena.cancel()  # no population: the read fills every page it needs
        else:
            arena.ensure(size)
        buf = arena.buf
        assert buf is not None

        def give_back() -> None:
            if not self._released and self.first.buf is None:
                self.first = arena
            else:
                arena.release()

        return buf, give_back

    def prepare(self, size: int) -> None:
        """A program registered; the state is ``size`` bytes: map the first arena and populate it in the
        background (the first save populates what is left itself, :meth:`ready`)."""
        self.state_size = size
        if self.budget is None:  # decided once, at the first registration
            self.budget = host_budget.decide(self.host_memory)
        arena = self.first_size = self.size_for(size)
        if arena < size and not self._stream_logged:
            self._stream_logged = True
            logger.warning(
                "range %s: the state (%d bytes) is larger than the host-memory budget for checkpoints (%d bytes: "
                "%s): each save streams it through that buffer in chunks of %d bytes, and training waits while "
                "most of each checkpoint is written (the stall grows from one copy to about the write time). "
                "Set PADDLE_ACP_HOST_MEMORY to the memory you can spare (e.g. 8GiB or 30%%) for shorter stalls.",
                self.range_name, size, self.budget.nbytes, self.budget.source, chunk_size(arena),
            )
        if self._whole:  # the last registration's thread allocates the first arena whole: let it end
            self.join()
        # a mapping (cheap) here, populated chunk by chunk by the thread below (an earlier one goes on with it)
        mapped = self.first.start(arena)
        self._whole = not mapped

        def prefault() -> None:
            lower_thread_priority()
            if mapped:
                while self.first.populate_next():
                    pass
            else:  # no in-kernel population chunk by chunk here: allocate and populate it whole
                self.first.ensure(arena)

        t = threading.Thread(target=prefault, name="paddle-acp-arena", daemon=True)
        self._prefault = [p for p in self._prefault if p.is_alive()] + [t]
        t.start()

    @property
    def unpopulated(self) -> int:
        """Bytes of the first arena that a save now would have to populate (or wait for)."""
        if self._whole:
            return self.first_size if any(t.is_alive() for t in self._prefault) else 0
        return self.first.unclaimed

    def ready(self) -> None:
        """Before a save copies into the first arena: populate what is left on this thread's priority (a loaded
        host may starve the lower-priority background thread for seconds, issue 28)."""
        if self._whole:
            self.join()
        else:
            self.first.finish()

    def size_for(self, size: int) -> int:
        """The snapshot buffer for ``size`` bytes: all of it within the budget, else its whole chunks (at least 2)."""
        b = self.budget_nbytes
        if b is None or size <= b:
            return size
        chunk = chunk_size(b)
        return max(2, b // chunk) * chunk

    def image(self, buffer: int, size: int) -> np.ndarray:
        """Buffer ``buffer`` (0: the first, 1: the second) as ``size`` bytes to copy a snapshot into."""
        return (self.second if buffer else self.first).ensure(size)

    def chunks(self, nbytes: int) -> np.ndarray:
        """The first buffer's ``nbytes`` bytes to stream a larger state through."""
        return self.first.ensure(nbytes)[:nbytes]

    def queue_fits(self) -> bool:
        """Whether the ``queue`` policy's second buffer fits in host memory and the budget (decided once)."""
        b = self.budget_nbytes
        if self._queue_ok is None and b is not None and 2 * self.state_size > b and (
                self.host_memory is not None or self.state_size > b):
            self._queue_ok = False
            logger.warning(
                "range %s: PADDLE_ACP_BUSY_POLICY=queue: a second snapshot buffer of %d bytes does not fit the "
                "host-memory budget (%d bytes: %s); saves that come due while the previous checkpoint is being "
                "written are skipped instead", self.range_name, self.state_size, b,
                self.budget.source if self.budget else "")
        if self._queue_ok is None:
            need = self.first.nbytes
            avail = host_budget.mem_available()
            self._queue_ok = avail is None or self.second.nbytes >= need or avail - need >= QUEUE_HEADROOM
            if not self._queue_ok:
                logger.warning(
                    "range %s: PADDLE_ACP_BUSY_POLICY=queue: a second snapshot buffer of %d bytes would leave less "
                    "than %d MiB of host memory available (MemAvailable %d bytes); saves that come due while the "
                    "previous checkpoint is being written are skipped instead",
                    self.range_name, need, QUEUE_HEADROOM >> 20, avail,
                )
        return self._queue_ok

    def join(self) -> None:
        """Wait until the background threads populating the first arena are done (when any runs)."""
        threads, self._prefault = self._prefault, []
        for t in threads:
            t.join()

    def release(self) -> None:
        """Free both buffers (the range ended); one lent to a restore is freed when it comes back."""
        self._released = True
        self.first.cancel()
        self.join()
        self.first.release()
        self.second.release()
