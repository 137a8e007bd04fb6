"""Checkpointer: write, find, verify and prune the numbered checkpoints of one range.

Layout under the storage root::

    {job_id}/job.json
    {job_id}/range/{range_name}/ckpt-{N}/tensors.bin
    {job_id}/range/{range_name}/ckpt-{N}/manifest.json     (written last)

A checkpoint is written under ``ckpt-{N}.tmp-{id}`` and renamed into place
(see :mod:`paddle_acp.atomic`); on object stores the manifest is the commit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import atomic
from .errors import CorruptCheckpointError, StorageError
from .manifest import ALIGN, DATA_NAME, DTYPES, MANIFEST_NAME, Manifest, ProgramRecord, RangeRecord, TensorRecord
from .snapshot import ProgramSnapshot, alloc_buffer, layout
from .storage import Storage

logger = logging.getLogger("paddle_acp")

JOB_MARKER = "job.json"
_ZEROS = bytes(ALIGN)


@dataclasses.dataclass
class Snapshot:
    """Everything one checkpoint holds, already copied out of Paddle."""

    range: RangeRecord
    programs: List[ProgramSnapshot]
    rng: Optional[dict]
    paddle_version: str = ""
    ir: str = ""
    extra: dict = dataclasses.field(default_factory=dict)
    image: Optional[np.ndarray] = None  # the file's bytes, tensors already laid out in it
    data_size: int = -1  # set by layout()
    stall_seconds: float = 0.0  # training-thread time spent taking the snapshot
    waited_seconds: float = 0.0  # of which waiting for the previous save


@dataclasses.dataclass
class LoadedCheckpoint:
    path: str
    manifest: Manifest
    arrays: Dict[Tuple[str, str], np.ndarray]  # (program key, tensor name) -> array

    def take_program_tensors(self, key: str) -> Dict[str, Tuple[str, np.ndarray]]:
        """The verified arrays of one program; they are handed over (released here)."""
        rec = self.manifest.program(key)
        if rec is None:
            return {}
        return {t.name: (t.dtype, self.arrays.pop((key, t.name))) for t in rec.tensors}


_pool: Optional[ThreadPoolExecutor] = None
_READ_CHUNK = 32 << 20


def _crc_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paddle-acp-crc")
    return _pool


def crc32(arr: np.ndarray) -> int:
    return zlib.crc32(memoryview(arr).cast("B")) & 0xFFFFFFFF if arr.nbytes else 0


def job_dir(job_id: str) -> str:
    return job_id


def range_dir(job_id: str, range_name: str) -> str:
    return f"{job_id}/range/{range_name}"


class Checkpointer:
    """Numbered, atomically committed checkpoints of one range of one job."""

    def __init__(self, storage: Storage, job_id: str, range_name: str, max_to_keep: int = 3):
        self.storage = storage
        self.job_id = job_id
        self.range_name = range_name
        self.max_to_keep = max_to_keep
        self.dir = range_dir(job_id, range_name)

    # -- writing ---------------------------------------------------------------
    def write_job_marker(self) -> None:
        path = f"{self.job_id}/{JOB_MARKER}"
        if self.storage.exists(path):
            return
        self.storage.makedirs(self.job_id)
        body = {"format": "paddle-acp/job", "version": 1, "job_id": self.job_id, "created": time.time()}
        self.storage.write_bytes(path, json.dumps(body).encode())

    def save(self, snap: Snapshot) -> Tuple[int, int]:
        """Write and commit one checkpoint; returns (number, bytes written)."""
        st = self.storage
        entries = atomic.scan(st, self.dir)
        atomic.remove_leftovers(st, self.dir, entries)
        number = atomic.next_number(entries)
        pending = atomic.begin(st, self.dir, number)
        try:
            offset = self._write(pending, snap, number)
        except BaseException:
            try:
                pending.abort()
            except Exception as exc:  # the leftover is removed by the next save
                logger.debug("could not remove %s: %s", pending.path, exc)
            raise
        try:
            self.apply_retention()
        except StorageError as exc:  # the new checkpoint is committed; pruning retries next time
            logger.warning("retention after checkpoint %d failed: %s", number, exc)
        return number, offset

    def _write(self, pending, snap: Snapshot, number: int) -> int:
        st = self.storage
        if snap.data_size < 0:
            snap.data_size = layout(snap.programs)
        size = snap.data_size
        tensors = [t for p in snap.programs for t in p.tensors]
        # checksums on a second core while this thread writes (both release the GIL)
        crcs = [_crc_pool().submit(crc32, t.array) for t in tensors]
        path = f"{pending.path}/{DATA_NAME}"
        if snap.image is not None:
            written = st.write_image(path, snap.image, size)
        else:
            buffers, end = [], 0
            for t in tensors:
                if t.offset > end:
                    buffers.append(_ZEROS[: t.offset - end])
                if t.array.nbytes:
                    buffers.append(memoryview(t.array).cast("B"))
                end = t.offset + t.array.nbytes
            if size > end:
                buffers.append(_ZEROS[: size - end])
            written = st.write_buffers(path, buffers)
        if written != size:
            raise StorageError(f"short write of {DATA_NAME}: {written} of {size} bytes")
        it = iter(crcs)
        programs = [
            ProgramRecord(p.key, p.label, [TensorRecord(t.name, t.dtype, list(t.array.shape), t.offset, t.array.nbytes, next(it).result()) for t in p.tensors], p.lr_scheduler)
            for p in snap.programs
        ]
        manifest = Manifest(
            number=number,
            created=time.time(),
            range=snap.range,
            programs=programs,
            data_size=size,
            rng=snap.rng,
            paddle_version=snap.paddle_version,
            ir=snap.ir,
            extra=snap.extra,
        )
        pending.commit(manifest.dumps())
        return size

    def apply_retention(self, keep: Optional[int] = None) -> List[int]:
        keep = self.max_to_keep if keep is None else keep
        if keep <= 0:
            return []
        committed = [e.number for e in atomic.scan(self.storage, self.dir) if e.committed]
        doomed = sorted(committed)[:-keep] if len(committed) > keep else []
        for n in doomed:
            # the manifest first: a half-deleted checkpoint is never mistaken for a committed one
            self.storage.delete_file(f"{self.dir}/{atomic.final_name(n)}/{MANIFEST_NAME}")
            self.storage.delete_dir(f"{self.dir}/{atomic.final_name(n)}")
            logger.debug("retention: deleted checkpoint %d of %s", n, self.dir)
        return doomed

    # -- reading ---------------------------------------------------------------
    def committed_numbers(self) -> List[int]:
        return sorted(e.number for e in atomic.scan(self.storage, self.dir) if e.committed)

    def read_manifest(self, number: int) -> Manifest:
        path = f"{self.dir}/{atomic.final_name(number)}/{MANIFEST_NAME}"
        try:
            raw = self.storage.read_bytes(path)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{path}: manifest is missing (checkpoint not committed)") from None
        m = Manifest.loads(raw)
        if m.number != number:
            raise CorruptCheckpointError(f"{path}: manifest says checkpoint {m.number}, directory says {number}")
        if m.range.name != self.range_name:
            raise CorruptCheckpointError(f"{path}: manifest belongs to range {m.range.name!r}")
        return m

    def check_header(self, number: int) -> Tuple[Manifest, str, str]:
        """Validate the manifest and the data file's size; returns (manifest, dir, data path).

        Raises CorruptCheckpointError. The tensors' checksums are checked by the reader.
        """
        m = self.read_manifest(number)
        from . import rng_state

        if m.rng is not None:
            rng_state.validate(m.rng)
        if m.extra.get("epoch_start_rng") is not None:
            rng_state.validate(m.extra["epoch_start_rng"])
        base = f"{self.dir}/{atomic.final_name(number)}"
        data_path = f"{base}/{DATA_NAME}"
        try:
            size = self.storage.size(data_path)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{data_path} is missing") from None
        if size != m.data_size:
            raise CorruptCheckpointError(f"{data_path} has {size} bytes, manifest says {m.data_size}")
        return m, base, data_path

    def load(self, number: int) -> LoadedCheckpoint:
        """Read and verify checkpoint ``number`` completely; raises CorruptCheckpointError."""
        m, base, data_path = self.check_header(number)
        image = alloc_buffer(m.data_size)
        records = sorted(((t.offset, p.key, t) for p in m.programs for t in p.tensors), key=lambda x: x[0])
        pending = []
        nxt = 0
        with self.storage.open_input(data_path) as f:
            pos = 0
            while pos < m.data_size:
                n = min(_READ_CHUNK, m.data_size - pos)
                got = f.readinto(memoryview(image[pos:pos + n]))
                if got <= 0:
                    raise CorruptCheckpointError(f"{data_path}: short read at byte {pos}")
                pos += got
                while nxt < len(records) and records[nxt][0] + records[nxt][2].nbytes <= pos:
                    off, key, t = records[nxt]
                    arr = image[off:off + t.nbytes].view(DTYPES[t.dtype]).reshape(t.shape)
                    pending.append((key, t, arr, _crc_pool().submit(crc32, arr)))
                    nxt += 1
        while nxt < len(records):  # zero-size tensors at the very end
            off, key, t = records[nxt]
            arr = np.empty(t.shape, DTYPES[t.dtype])
            pending.append((key, t, arr, _crc_pool().submit(crc32, arr)))
            nxt += 1
        arrays: Dict[Tuple[str, str], np.ndarray] = {}
        for key, t, arr, fut in pending:
            if fut.result() != t.crc32:
                raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {t.name!r} of program {key}")
            arrays[(key, t.name)] = arr
        return LoadedCheckpoint(base, m, arrays)

    def load_latest(self) -> Optional[LoadedCheckpoint]:
        """The newest checkpoint that verifies; older ones are tried in turn."""
        numbers = self.committed_numbers()
        for n in reversed(numbers):
            try:
                return self.load(n)
            except CorruptCheckpointError as exc:
                logger.warning("skipping checkpoint %d of %s/%s: %s", n, self.storage.uri, self.dir, exc)
        if numbers:
            logger.error(
                "none of the %d checkpoints of %s/%s is valid: STARTING FROM SCRATCH", len(numbers), self.storage.uri, self.dir
            )
        return None
