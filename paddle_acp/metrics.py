"""Metrics: one JSON line per save in ``{job}/metrics/trainer-{id}.jsonl`` on the checkpoint storage.

Fields: time, range, number, epoch, step, bytes, stall_s, persist_s, throughput_mb_s, ok, error.
"""

from __future__ import annotations

import json
import logging
from typing import List

import pyarrow

from .errors import StorageError
from .storage import Storage, scrub

logger = logging.getLogger("paddle_acp")


def metrics_path(job_id: str, trainer_id: int) -> str:
    return f"{job_id}/metrics/trainer-{trainer_id}.jsonl"


class MetricsLog:
    def __init__(self, storage: Storage, job_id: str, trainer_id: int = 0):
        self.storage = storage
        self.path = metrics_path(job_id, trainer_id)

    def append(self, record: dict) -> None:
        line = (scrub(json.dumps(record, sort_keys=True)) + "\n").encode()  # an error text never carries a secret
        st = self.storage
        try:
            if not st.exists(self.path):
                st.makedirs(self.path.rsplit("/", 1)[0])
                st.write_bytes(self.path, line)
                return
            try:
                with st.fs.open_append_stream(st.full(self.path)) as out:
                    out.write(line)
                return
            except (NotImplementedError, pyarrow.ArrowException, OSError):
                pass  # object stores (and some clients) cannot append: rewrite the small file
            st.write_bytes(self.path, st.read_bytes(self.path) + line)
        except (StorageError, OSError, pyarrow.ArrowException) as exc:
            logger.warning("could not append to the metrics file %s: %s", self.path, exc)


def read_metrics(storage: Storage, job_id: str, trainer_id: int = 0) -> List[dict]:
    path = metrics_path(job_id, trainer_id)
    if not storage.exists(path):
        return []
    out = []
    for line in storage.read_bytes(path).decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn last line after a kill
        if isinstance(rec, dict):
            out.append(rec)
    return out
