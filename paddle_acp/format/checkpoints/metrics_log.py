"""The metrics log: one JSON line per save in ``{job}/metrics/trainer-{id}.jsonl`` on the checkpoint storage.

A line is a :class:`~paddle_acp.format.metrics_record.MetricsRecord` (defined there); this module buffers and
writes the lines. On a local disk a line is appended as soon as its checkpoint commits, so a kill loses none.
Elsewhere (an append is a round trip; on S3 a rewrite) lines go in batches: the first at once, then at most every
``FLUSH_INTERVAL`` seconds and whenever a range ends or a preemption save commits; a kill loses the unwritten
batch (``paddle-acp stats`` counts committed checkpoints without a line). Written on the saver's thread only.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import List, Optional

import pyarrow

from paddle_acp.errors import StorageError
from paddle_acp.format.metrics_record import MetricsRecord
from paddle_acp.secrets import scrub_values
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")


def metrics_path(job_id: str, trainer_id: int) -> str:
    return f"{job_id}/metrics/trainer-{trainer_id}.jsonl"


def scrubbed_line(record: MetricsRecord) -> str:
    """``record``'s JSON line, registered secrets scrubbed from its string values (an error's text) before it is
    serialised: never from its keys, numbers, booleans or fixed words, so a secret such as "saved" or "true" leaves
    the line a valid record."""
    return record.to_line(scrub_values)


FLUSH_INTERVAL = 10.0  # seconds between two metrics writes (batches of lines)
MAX_PENDING = 10000  # lines kept while the storage is unreachable; older ones are dropped


class MetricsLog:
    """The metrics file of one trainer; lines are buffered and written in batches."""

    def __init__(self, storage: Storage, job_id: str, trainer_id: int = 0, flush_interval: Optional[float] = None):
        self.storage = storage
        self.path = metrics_path(job_id, trainer_id)
        if flush_interval is None:  # a local disk: every line at once (an append costs microseconds)
            flush_interval = 0.0 if storage.local_path("") is not None else FLUSH_INTERVAL
        self.flush_interval = flush_interval
        self._pending: List[bytes] = []
        self._lock = threading.Lock()  # guards _pending
        self._io = threading.Lock()  # one write at a time
        self._exists = False  # the file is known to exist (this process wrote it)
        self._last_flush: float = float("-inf")

    def add(self, record: MetricsRecord) -> None:
        """Buffer one record (no storage access: safe on the training thread)."""
        line = (scrubbed_line(record) + "\n").encode()  # an error text never carries a secret
        with self._lock:
            self._pending.append(line)
            if len(self._pending) > MAX_PENDING:
                del self._pending[: len(self._pending) - MAX_PENDING]

    def flush_due(self) -> None:
        """Write the buffered lines when the last write is ``flush_interval`` seconds old."""
        if time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Write every buffered line now (one append)."""
        with self._io:
            with self._lock:
                lines, self._pending = self._pending, []
            if not lines:
                return
            self._last_flush = time.monotonic()
            if not self._write(b"".join(lines)):
                with self._lock:  # retried with the next write
                    self._pending[:0] = lines
                    if len(self._pending) > MAX_PENDING:
                        del self._pending[: len(self._pending) - MAX_PENDING]

    def append(self, record: MetricsRecord) -> None:
        """Add one record and write everything buffered now."""
        self.add(record)
        self.flush()

    def _write(self, data: bytes) -> bool:
        st = self.storage
        try:
            if not self._exists and not st.exists(self.path):
                st.makedirs(self.path.rsplit("/", 1)[0])
                st.write_bytes(self.path, data)
                self._exists = True
                return True
            self._exists = True
            try:
                st.append_bytes(self.path, data)
                return True
            except StorageError:
                pass  # object stores (and some clients) cannot append: rewrite the small file
            st.write_bytes(self.path, st.read_bytes(self.path) + data)
            return True
        except (StorageError, OSError, pyarrow.ArrowException) as exc:
            self._exists = False
            logger.warning("could not append to the metrics file %s: %s", self.path, exc)
            return False
