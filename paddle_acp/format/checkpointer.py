"""Checkpointer: write, find, verify and prune the numbered checkpoints of one range.

Layout under the storage root::

    {job_id}/job.json
    {job_id}/range/{range_name}/ckpt-{N}/tensors.bin
    {job_id}/range/{range_name}/ckpt-{N}/manifest.json     (written last)

A checkpoint is written under ``ckpt-{N}.tmp-{id}`` and renamed into place
(see :mod:`paddle_acp.format.atomic`); on object stores the manifest is the commit.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import mmap
import os
import signal
import threading
import time
from collections.abc import MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Tuple

import numpy as np

from paddle_acp.adapter.tensors import (
    ProgramSnapshot,
    alloc_buffer,
    chunked,
    copy_job,
    inplace_view,
    layout,
    run_parallel,
    scope_tensor,
    set_tensor,
)
from paddle_acp.errors import CheckpointError, CorruptCheckpointError, StorageError
from paddle_acp.format import atomic
from paddle_acp.format.manifest import (
    ALIGN,
    DATA_NAME,
    DTYPES,
    MANIFEST_NAME,
    VERSION,
    Manifest,
    ProgramRecord,
    RangeRecord,
    TensorRecord,
    checksum_function,
    max_manifest_size,
)
from paddle_acp.runtime.saver import lower_thread_priority
from paddle_acp.storage.base import Storage

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
    mode: Optional[str] = None  # several ranks: "replicated" or "per-rank"
    part_wait: Optional[float] = None  # several ranks: rank 0's wait for the parts (None: the configured timeout)
    stall_seconds: float = 0.0  # training-thread time spent taking the snapshot
    waited_seconds: float = 0.0  # of which waiting for the previous save
    buffer: int = 0  # which of the range's snapshot buffers holds ``image`` (0, or 1 when queued)
    durable: bool = False  # the final save of a range or a preemption save: its metrics are written at once
    queued: bool = False  # it waited in the second buffer behind the previous checkpoint
    skipped_before: int = 0  # saves skipped since the previous one was taken


class _MemorySource:
    """Verified tensors held in one in-memory image (remote stores: read once)."""

    def __init__(self, arrays: Dict[Tuple[str, str], np.ndarray]):
        self._arrays = arrays

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        return self._arrays[(key, rec.name)]

    def read_into(self, items) -> None:
        jobs: list = []
        for key, rec, view in items:
            chunked(view, self._arrays[(key, rec.name)], jobs)
        run_parallel(copy_job, jobs)

    def close(self) -> None:
        self._arrays.clear()


class _FileSource:
    """Tensors of a verified local data file, read on demand through an open descriptor.

    The file was read and checksummed in full before this source exists; the
    descriptor (and the mapping) keep that very file (inode) readable even if
    it is unlinked (retention, ``paddle-acp gc``) before the program first
    runs. With ``mapping`` (the file mapped read-only, its page-cache pages
    already mapped by the verification pass) tensors are copied straight out
    of the page cache: a plain memcpy on two threads, 1.5-2x faster here than
    ``preadv`` of the same cached bytes. Without it they are read with ``preadv``.
    """

    def __init__(self, fd: int, path: str, size: int, mapping=None):
        self._fd = fd
        self._path = path
        self._size = size
        self._map = mapping
        self._bytes = np.frombuffer(mapping, dtype=np.uint8) if mapping is not None else None

    def _check_size(self) -> None:
        # a mapped file that shrank would fault (SIGBUS) on access: refuse it first
        if os.fstat(self._fd).st_size < self._size:
            raise CorruptCheckpointError(f"{self._path}: the file shrank after it was verified")

    def _pread(self, job) -> None:
        mv, offset = job
        pos = 0
        while pos < mv.nbytes:
            n = os.preadv(self._fd, [mv[pos:]], offset + pos)
            if n <= 0:
                raise CorruptCheckpointError(f"{self._path}: the file shrank after it was verified (byte {offset + pos})")
            pos += n

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        arr = np.empty(rec.shape, DTYPES[rec.dtype])
        if rec.nbytes:
            self.read_into([(key, rec, arr)])
        return arr

    def read_into(self, items) -> None:
        jobs = []
        if self._bytes is not None:
            self._check_size()
            for _key, rec, view in items:
                chunked(view, self._bytes[rec.offset:rec.offset + rec.nbytes], jobs)
            run_parallel(copy_job, jobs)
            return
        for _key, rec, view in items:
            mv = memoryview(view.reshape(-1).view(np.uint8))
            for i in range(0, rec.nbytes, _READ_CHUNK):
                jobs.append((mv[i:i + _READ_CHUNK], rec.offset + i))
        run_parallel(self._pread, jobs)

    def close(self) -> None:
        self._bytes = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive somewhere: the GC unmaps it with that view
                pass
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _PendingArrays(MutableMapping):
    """``(program key, tensor name) -> array`` over the tensors not yet handed out; reads on access."""

    def __init__(self, loaded: "LoadedCheckpoint"):
        self._ck = loaded

    def __getitem__(self, k):
        return self._ck._source.read(k[0], self._ck._pending[k])

    def __setitem__(self, k, v):
        raise TypeError("the arrays of a loaded checkpoint are read-only")

    def __delitem__(self, k):
        self._ck._forget(k)  # KeyError when not pending

    def __iter__(self):
        return iter(list(self._ck._pending))

    def __len__(self):
        return len(self._ck._pending)


class LoadedCheckpoint:
    """A verified checkpoint whose tensors are handed out once each.

    ``arrays`` maps ``(program key, tensor name)`` to the tensors not yet
    handed out (read on access); ``write_program`` puts one program's tensors
    straight into a scope. When every tensor has been handed out the data file
    (or image) is released.
    """

    def __init__(self, path: str, manifest: Manifest, source):
        self.path = path
        self.manifest = manifest
        self._source = source
        self.name = path.rsplit("/", 1)[-1]  # ckpt-N, or ckpt-eE[-sS] for a global checkpoint
        self.global_manifest = None  # a multirank.GlobalManifest for a checkpoint of several ranks
        self.position_key = None
        self._pending: Dict[Tuple[str, str], TensorRecord] = {
            (p.key, t.name): t for p in manifest.programs for t in p.tensors
        }
        if not self._pending:
            source.close()

    @property
    def arrays(self) -> _PendingArrays:
        return _PendingArrays(self)

    def _forget(self, k) -> None:
        del self._pending[k]
        if not self._pending:
            self._source.close()

    def close(self) -> None:
        self._pending.clear()
        self._source.close()

    def write_program(self, key: str, scope, place, consume: bool = True, default_place=None) -> int:
        """Write program ``key``'s pending tensors into ``scope``; returns how many.

        Tensors the scope already holds with the same dtype and shape on the CPU
        are filled in place (read straight into them, on two threads); others
        are replaced. With ``consume`` they are handed out (no longer pending).
        """
        rec = self.manifest.program(key)
        if rec is None:
            return 0
        inplace, done = [], 0
        for t in rec.tensors:
            if (key, t.name) not in self._pending:
                continue
            tensor = scope_tensor(scope, t.name)
            view = inplace_view(tensor, t.dtype, t.shape)
            if view is not None:
                inplace.append((key, t, view))
            else:
                set_tensor(tensor, self._source.read(key, t), place, default_place)
            done += 1
        if inplace:
            self._source.read_into(inplace)
        if consume:
            for t in rec.tensors:
                if (key, t.name) in self._pending:
                    self._forget((key, t.name))
        return done


_pool: Optional[ThreadPoolExecutor] = None
_READ_CHUNK = 32 << 20
_VERIFY_CHUNK = 8 << 20
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14


def _drain(futs) -> None:
    """Cancel the futures not started yet and wait for the running ones."""
    for f in futs:
        if not f.cancel():
            f.exception()


def _populate(mapping, pos: int, n: int, data_path: str) -> None:
    """Wait until bytes [pos, pos + n) of a mapped file are in the page cache and mapped."""
    while True:
        try:
            mapping.madvise(_MADV_POPULATE_READ, pos, n)
            return
        except (InterruptedError, BlockingIOError):  # EINTR, EAGAIN: try again
            continue
        except OSError as exc:
            if exc.errno == errno.EFAULT:  # pages past the end: the file shrank under the mapping
                raise CorruptCheckpointError(f"{data_path}: short read at byte {pos}") from None
            raise StorageError(f"reading {data_path} failed at byte {pos}: {exc}") from exc


def _map_file(fd: int, size: int):
    """The file mapped read-only for the verification pass, or None where that is not
    possible (empty file, no ``mmap``/``MADV_POPULATE_READ``): then it is read into buffers."""
    if size <= 0 or not hasattr(mmap, "MAP_SHARED"):
        return None
    try:
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None
    try:
        mapping.madvise(mmap.MADV_SEQUENTIAL)
        mapping.madvise(_MADV_POPULATE_READ, 0, min(size, mmap.PAGESIZE))  # EINVAL before Linux 5.14
    except (OSError, ValueError, AttributeError):
        mapping.close()
        return None
    return mapping


def _crc_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paddle-acp-crc", initializer=lower_thread_priority)
        # Start its worker now, with Ctrl-C and SIGTERM held back: a KeyboardInterrupt raised inside
        # the pool's Thread.start() leaves a worker the pool does not know, and the interpreter then
        # waits for it forever at exit. A held-back signal is delivered right after (the worker
        # inherits the mask: signals are the main thread's business anyway).
        held = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held) if hasattr(signal, "pthread_sigmask") else None
        try:
            pool.submit(int).result()
        finally:
            if old is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
        _pool = pool
    return _pool


def checksum(arr: np.ndarray, version: int = VERSION) -> int:
    """The checksum of a C-contiguous array's bytes, as a manifest of ``version`` records it."""
    return checksum_function(version)(memoryview(arr).cast("B"), 0) if arr.nbytes else 0  # cast() rejects 0 in shape


def _is_out_of_space(exc: BaseException) -> bool:
    """True when a storage error means the disk (or quota) is full."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def job_dir(job_id: str) -> str:
    return job_id


def range_dir(job_id: str, range_name: str) -> str:
    return f"{job_id}/range/{range_name}"


class Checkpointer:
    """Numbered, atomically committed checkpoints of one range of one job."""

    def __init__(self, storage: Storage, job_id: str, range_name: str, max_to_keep: int = 3, fence=None,
                 single_writer: bool = False):
        self.storage = storage
        self.fence = fence  # a fencing.Fence (the writer's generation) or None
        self.job_id = job_id
        self.range_name = range_name
        self.max_to_keep = max_to_keep
        self.dir = range_dir(job_id, range_name)
        # The only writer of this range (the training process): after its first save has
        # listed the range, it knows the committed checkpoints without listing again (a
        # listing costs 1 + one stat per checkpoint on remote stores). Any failure forgets
        # what it knew and the next save lists again.
        self.single_writer = single_writer
        self._known: Optional[List[atomic.DirEntry]] = None

    # -- writing ---------------------------------------------------------------
    def write_job_marker(self) -> None:
        path = f"{self.job_id}/{JOB_MARKER}"
        if self.storage.exists(path):
            return
        self.storage.makedirs(self.job_id)
        body = {"format": "paddle-acp/job", "version": 1, "job_id": self.job_id, "created": time.time()}
        self.storage.write_bytes(path, json.dumps(body).encode())

    def check_no_links(self) -> None:
        """Refuse a job whose ``range`` directory or range directory is a symbolic link:
        writes would land, and retention would delete, in whatever it points to.
        (Remote stores have no links.)"""
        if not self.storage.local:
            return
        for path in (f"{self.job_id}/range", self.dir):
            if self.storage.kind(path) == "link":
                raise StorageError(
                    f"{self.storage.uri}/{path} is a symbolic link: paddle-acp never follows links inside a job "
                    "directory (another job's checkpoints could be read or deleted through it); "
                    "replace it with a real directory"
                )

    def save(self, snap: Snapshot) -> Tuple[int, int]:
        """Write and commit one checkpoint; returns (number, bytes written).

        Stray entries (a file or link named like a checkpoint, a leftover that cannot
        be removed) never stop it: the number goes past them. When the storage is
        full, older checkpoints are deleted one by one (never the newest valid one)
        until the checkpoint fits."""
        st = self.storage
        if self.fence is not None and self.fence.fenced_by is not None:
            self.fence.check("write a checkpoint")  # fenced for good: not even the data is written
        known, self._known = self._known, None  # forgotten until this save ended well
        if known is None:
            self.check_no_links()
            listing = st.listdir(self.dir)
            entries = atomic.scan(st, self.dir, listing)
            stuck = atomic.remove_leftovers(st, self.dir, entries)
            others = [e for e in listing if not e.is_dir]  # files and links named ckpt-N keep their names
            try:  # past removed leftovers too: a number is not reused while a zombie writer may hold it
                number = atomic.next_number(entries, others)
            except CheckpointError:  # ... unless a removed stray had an absurd number
                number = atomic.next_number([e for e in entries if e.committed] + stuck, others)
            committed = [e for e in entries if e.committed]
        else:  # the single writer's own record: one past its newest, which is past every stray
            self.check_no_links()
            committed = known
            number = atomic.next_number(known)
        self._space_made = False
        while True:
            try:
                offset = self._write_pending(snap, number)
                break
            except StorageError as exc:
                if not _is_out_of_space(exc) or not self._make_space(number, exc):
                    raise
        committed = committed + [atomic.DirEntry(atomic.final_name(number), number, True)]
        try:
            doomed = self._retain([e.number for e in committed])
        except (StorageError, CheckpointError) as exc:  # the new checkpoint is committed; pruning retries next time
            logger.warning("retention after checkpoint %d failed: %s", number, exc)
            return number, offset
        if self.single_writer and not self._space_made:  # (a deletion to make space: list again)
            self._known = [e for e in committed if e.number not in doomed]
        return number, offset

    def _write_pending(self, snap: Snapshot, number: int) -> int:
        pending = atomic.begin(self.storage, self.dir, number)
        try:
            return self._write(pending, snap, number)
        except BaseException:
            try:
                pending.abort()
            except Exception as exc:  # the leftover is removed by the next save
                logger.debug("could not remove %s: %s", pending.path, exc)
            raise

    def _make_space(self, number: int, cause: BaseException) -> bool:
        """The storage is full: delete the oldest committed checkpoint that is older than
        the newest valid one (verified in full here). False when there is none."""
        committed = self.committed_numbers()
        newest_valid = None
        for n in reversed(committed):
            try:
                self.load(n).close()
            except (CorruptCheckpointError, StorageError) as exc:
                logger.debug("checkpoint %d is not usable: %s", n, exc)
                continue
            newest_valid = n
            break
        older = [n for n in committed if newest_valid is not None and n < newest_valid]
        if not older:
            logger.error(
                "checkpoint %d of %s/%s does not fit (%s) and no older checkpoint can be deleted "
                "(the newest valid one, %s, is always kept): free space on the storage",
                number, self.storage.uri, self.dir, cause, newest_valid if newest_valid is not None else "none",
            )
            return False
        if self.fence is not None:
            self.fence.check("delete an old checkpoint to make space")
        from paddle_acp.format.fencing import check_deletable

        check_deletable(self.storage, self.job_id, self.dir)
        victim = older[0]
        self._space_made = True
        logger.warning(
            "storage full while writing checkpoint %d of %s/%s: deleting the oldest checkpoint %d to make space "
            "(the newest valid one, %d, is kept)", number, self.storage.uri, self.dir, victim, newest_valid,
        )
        self._delete(victim)
        return True

    def _delete(self, n: int) -> None:
        # the manifest first: a half-deleted checkpoint is never mistaken for a committed one
        self.storage.delete_file(f"{self.dir}/{atomic.final_name(n)}/{MANIFEST_NAME}")
        self.storage.delete_dir(f"{self.dir}/{atomic.final_name(n)}")

    def _write(self, pending, snap: Snapshot, number: int) -> int:
        st = self.storage
        if snap.data_size < 0:
            snap.data_size = layout(snap.programs)
        size = snap.data_size
        tensors = [t for p in snap.programs for t in p.tensors]
        # checksums on a second core while this thread writes (both release the GIL)
        crcs = [_crc_pool().submit(checksum, t.array) for t in tensors]
        path = f"{pending.path}/{DATA_NAME}"

        def write_data() -> int:
            if snap.image is not None:
                return st.write_image(path, snap.image, size)
            buffers, end = [], 0
            for t in tensors:
                if t.offset > end:
                    buffers.append(_ZEROS[: t.offset - end])
                if t.array.nbytes:
                    buffers.append(memoryview(t.array).cast("B"))
                end = t.offset + t.array.nbytes
            if size > end:
                buffers.append(_ZEROS[: size - end])
            return st.write_buffers(path, buffers)

        def manifest_bytes() -> bytes:
            it = iter(crcs)
            programs = [
                ProgramRecord(p.key, p.label, [TensorRecord(t.name, t.dtype, list(t.array.shape), t.offset, t.array.nbytes, next(it).result()) for t in p.tensors], p.lr_scheduler)
                for p in snap.programs
            ]
            raw = Manifest(
                number=number,
                created=time.time(),
                range=snap.range,
                programs=programs,
                data_size=size,
                rng=snap.rng,
                paddle_version=snap.paddle_version,
                ir=snap.ir,
                extra=snap.extra,
            ).dumps()
            try:  # what restarts will read: never commit a checkpoint they would reject
                Manifest.loads(raw, data_file_size=size)
            except CorruptCheckpointError as exc:
                raise CheckpointError(
                    f"checkpoint {number} is not written: a restart could not read it back ({exc}); "
                    "the LR scheduler or data loader state is not plain JSON data of bounded size and depth"
                ) from None
            return raw

        if st.atomic_rename and not st.local:
            # The rename commits, so the manifest need not wait for the data: both files are
            # written at once. On HDFS closing a file waits for the namenode to see its block
            # (often ~0.4 s, the client's first retry): overlapped, a small checkpoint pays it once.
            box: list = []

            def data_thread():
                try:
                    box.append(write_data())
                except BaseException as exc:  # re-raised below
                    box.append(exc)

            t = threading.Thread(target=data_thread, name="paddle-acp-data", daemon=True)
            t.start()
            try:
                pending.write_manifest(manifest_bytes())
            finally:
                t.join()
            written = box[0]
            if isinstance(written, BaseException):
                raise written
        else:
            written = write_data()
        if written != size:
            raise StorageError(f"short write of {DATA_NAME}: {written} of {size} bytes")
        before = self._check_fence("commit checkpoint %d" % number)
        if st.atomic_rename and not st.local:
            pending.publish(before)
        else:
            pending.commit(manifest_bytes(), before=before)
        return size

    def _check_fence(self, what: str):
        if self.fence is None:
            return None
        return lambda: self.fence.check(what)

    def apply_retention(self, keep: Optional[int] = None) -> List[int]:
        if (self.max_to_keep if keep is None else keep) <= 0:
            return []
        committed = [e.number for e in atomic.scan(self.storage, self.dir) if e.committed]
        return self._retain(committed, keep)

    def _retain(self, committed: List[int], keep: Optional[int] = None) -> List[int]:
        """Delete all but the newest ``keep`` of the ``committed`` checkpoint numbers."""
        keep = self.max_to_keep if keep is None else keep
        if keep <= 0:
            return []
        doomed = sorted(committed)[:-keep] if len(committed) > keep else []
        if doomed:
            if self.fence is not None:
                self.fence.check("delete old checkpoints")
            from paddle_acp.format.fencing import check_deletable

            check_deletable(self.storage, self.job_id, self.dir)
        for n in doomed:
            self._delete(n)
            logger.debug("retention: deleted checkpoint %d of %s", n, self.dir)
        return doomed

    # -- reading ---------------------------------------------------------------
    def committed_numbers(self) -> List[int]:
        return sorted(e.number for e in atomic.scan(self.storage, self.dir) if e.committed)

    def _file_size(self, path: str, what: str) -> Optional[int]:
        """The size of a regular file of a checkpoint; None when it is missing.
        CorruptCheckpointError for a directory, a symbolic link or anything else."""
        kind, size = self.storage.stat(path)
        if kind == "missing":
            return None
        if kind != "file":
            what_it_is = {"link": "a symbolic link (never followed)", "dir": "a directory"}.get(kind, "not a regular file")
            raise CorruptCheckpointError(f"{path}: the {what} is {what_it_is}")
        return size

    def read_manifest(self, number: int, base: Optional[str] = None, raw: Optional[bytes] = None) -> Manifest:
        """The manifest of checkpoint ``number`` (in ``base``, default ``ckpt-N``); ``raw``:
        its bytes, already read (and checked) by the caller.

        Untrusted input: a manifest or data file that is a directory or a symbolic
        link, or a manifest larger than :func:`max_manifest_size` of its data, is
        refused unread (CorruptCheckpointError)."""
        base = base or f"{self.dir}/{atomic.final_name(number)}"
        path = f"{base}/{MANIFEST_NAME}"
        data_size = None
        if raw is None:
            if self.storage.local and self.storage.kind(base) != "dir":
                raise CorruptCheckpointError(f"{base} is not a directory (a symbolic link is never followed)")
            size = self._file_size(path, "manifest")
            if size is None:
                raise CorruptCheckpointError(f"{path}: manifest is missing (checkpoint not committed)")
            data_size = self._file_size(f"{base}/{DATA_NAME}", DATA_NAME) or 0
            limit = max_manifest_size(data_size)
            if size > limit:  # refused unread: parsing a huge document costs seconds and gigabytes
                raise CorruptCheckpointError(
                    f"{path}: invalid manifest: {size} bytes, more than the {limit} allowed for {data_size} bytes of data"
                )
            try:
                raw = self.storage.read_bytes(path, limit=limit)
            except FileNotFoundError:
                raise CorruptCheckpointError(f"{path}: manifest is missing (checkpoint not committed)") from None
        try:
            m = Manifest.loads(raw, data_file_size=data_size)
        except CorruptCheckpointError as exc:
            raise CorruptCheckpointError(f"{path}: {exc}") from None
        if m.number != number:
            raise CorruptCheckpointError(f"{path}: manifest says checkpoint {m.number}, directory says {number}")
        if m.range.name != self.range_name:
            raise CorruptCheckpointError(f"{path}: manifest belongs to range {m.range.name!r}")
        return m

    def check_header(self, number: int, base: Optional[str] = None, raw: Optional[bytes] = None) -> Tuple[Manifest, str, str]:
        """Validate the manifest and the data file's size; returns (manifest, dir, data path).

        Raises CorruptCheckpointError. The tensors' checksums are checked by the reader.
        """
        m = self.read_manifest(number, base, raw)  # RNG and LR-scheduler states are validated there
        base = base or f"{self.dir}/{atomic.final_name(number)}"
        data_path = f"{base}/{DATA_NAME}"
        size = self._file_size(data_path, DATA_NAME)
        if size is None:
            raise CorruptCheckpointError(f"{data_path} is missing")
        if size != m.data_size:
            raise CorruptCheckpointError(f"{data_path} has {size} bytes, manifest says {m.data_size}")
        return m, base, data_path

    def load(self, number: int, base: Optional[str] = None, raw: Optional[bytes] = None) -> LoadedCheckpoint:
        """Read and verify checkpoint ``number`` completely; raises CorruptCheckpointError.

        Every tensor's checksum is checked before this returns, so nothing of a
        corrupt checkpoint can reach a scope. Local files are checksummed as they
        stream through small buffers and read again (from the page cache) straight
        into the scope's tensors; remote files are read once into memory.
        """
        m, base, data_path = self.check_header(number, base, raw)
        records = sorted(((t.offset, p.key, t) for p in m.programs for t in p.tensors), key=lambda x: x[0])
        if self.storage.local:
            return LoadedCheckpoint(base, m, self._verify_local(m, data_path, records))
        return LoadedCheckpoint(base, m, self._read_verified(m, data_path, records))

    def _verify_local(self, m: Manifest, data_path: str, records) -> "_FileSource":
        os_path = self.storage.full(data_path)
        try:
            fd = os.open(os_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{data_path} is missing") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CorruptCheckpointError(f"{data_path} is a symbolic link (never followed)") from None
            raise StorageError(f"opening {self.storage.uri}/{data_path} failed: {exc}") from exc
        mapping = None
        try:
            if os.fstat(fd).st_size != m.data_size:
                raise CorruptCheckpointError(f"{data_path} changed size while it was opened")
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead
            crcs = [0] * len(records)
            fn = m.checksum
            spans = [(off, off + t.nbytes) for off, _key, t in records]

            def crc_chunk(buf: np.ndarray, start: int, n: int, first: int) -> None:
                end = start + n
                i = first
                while i < len(spans) and spans[i][0] < end:
                    lo, hi = max(spans[i][0], start), min(spans[i][1], end)
                    if hi > lo:
                        crcs[i] = fn(buf[lo - start:hi - start], crcs[i])
                    i += 1

            mapping = _map_file(fd, m.data_size)
            if mapping is not None:
                self._verify_mapped(mapping, m.data_size, data_path, spans, crc_chunk)
            else:
                self._verify_buffered(fd, m.data_size, data_path, spans, crc_chunk)
            for (_off, key, t), crc in zip(records, crcs):
                if crc != t.checksum:
                    raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {t.name!r} of program {key}")
        except BaseException:
            if mapping is not None:
                try:
                    mapping.close()
                except BufferError:  # a view in the traceback: unmapped with it
                    pass
            os.close(fd)
            raise
        return _FileSource(fd, data_path, m.data_size, mapping)

    @staticmethod
    def _verify_mapped(mapping, size: int, data_path: str, spans, crc_chunk) -> None:
        """Checksum a mapped file: this thread waits for each chunk's pages
        (``MADV_POPULATE_READ``: read from disk into the page cache and mapped,
        no copy), the CRC thread checksums them in place."""
        data = np.frombuffer(mapping, dtype=np.uint8)
        futs = []
        first = 0
        try:
            for pos in range(0, size, _VERIFY_CHUNK):
                n = min(_VERIFY_CHUNK, size - pos)
                _populate(mapping, pos, n, data_path)
                while first < len(spans) and spans[first][1] <= pos:
                    first += 1
                futs.append(_crc_pool().submit(crc_chunk, data[pos:pos + n], pos, n, first))
        except BaseException:
            _drain(futs)  # no checksum may touch the mapping after this returns
            raise
        for f in futs:
            f.result()

    @staticmethod
    def _verify_buffered(fd: int, size: int, data_path: str, spans, crc_chunk) -> None:
        """Checksum a file read on this thread into three rotating buffers, checksummed on the CRC thread."""
        bufs = [alloc_buffer(_VERIFY_CHUNK) for _ in range(3)]
        futs = [None, None, None]
        pos, first, k = 0, 0, 0
        try:
            while pos < size:
                slot = k % 3
                if futs[slot] is not None:
                    futs[slot].result()
                n = min(_VERIFY_CHUNK, size - pos)
                got = 0
                mv = memoryview(bufs[slot])
                while got < n:
                    r = os.preadv(fd, [mv[got:n]], pos + got)
                    if r <= 0:
                        raise CorruptCheckpointError(f"{data_path}: short read at byte {pos + got}")
                    got += r
                while first < len(spans) and spans[first][1] <= pos:
                    first += 1
                futs[slot] = _crc_pool().submit(crc_chunk, bufs[slot], pos, n, first)
                pos += n
                k += 1
        except BaseException:
            _drain([f for f in futs if f is not None])  # before the buffers go
            raise
        for f in futs:
            if f is not None:
                f.result()

    def _read_verified(self, m: Manifest, data_path: str, records) -> "_MemorySource":
        image = alloc_buffer(m.data_size)
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
                    pending.append((key, t, arr, _crc_pool().submit(checksum, arr, m.version)))
                    nxt += 1
        while nxt < len(records):  # zero-size tensors at the very end
            off, key, t = records[nxt]
            arr = np.empty(t.shape, DTYPES[t.dtype])
            pending.append((key, t, arr, _crc_pool().submit(checksum, arr, m.version)))
            nxt += 1
        arrays: Dict[Tuple[str, str], np.ndarray] = {}
        for key, t, arr, fut in pending:
            if fut.result() != t.checksum:
                raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {t.name!r} of program {key}")
            arrays[(key, t.name)] = arr
        return _MemorySource(arrays)

    def load_latest(self, check=None) -> Optional[LoadedCheckpoint]:
        """The newest checkpoint that verifies; older ones are tried in turn.

        A checkpoint that is corrupt, crafted or unreadable (a read error on it,
        not on the listing) is skipped with a warning naming it and the cause.
        When checkpoints exist but none could be read, StorageError: a storage
        problem never silently restarts training from scratch.

        ``check(loaded)``, when given, may raise CheckpointError for a checkpoint
        that verifies but does not fit this process: it is skipped too, and when
        no checkpoint passes, that CheckpointError is raised (never a silent start
        from scratch)."""
        self.check_no_links()
        numbers = self.committed_numbers()
        unreadable, misfits = [], []
        for n in reversed(numbers):
            try:
                loaded = self.load(n)
            except CorruptCheckpointError as exc:
                logger.warning("skipping checkpoint %d of %s/%s: %s", n, self.storage.uri, self.dir, exc)
            except StorageError as exc:
                unreadable.append(f"ckpt-{n}: {exc}")
                logger.warning("skipping checkpoint %d of %s/%s, it cannot be read: %s", n, self.storage.uri, self.dir, exc)
            else:
                if check is None:
                    return loaded
                try:
                    check(loaded)
                    return loaded
                except CheckpointError as exc:
                    loaded.close()
                    misfits.append(exc)
                    logger.warning("skipping checkpoint %d of %s/%s: %s", n, self.storage.uri, self.dir, exc)
        if misfits:
            raise misfits[0]
        if unreadable:
            raise StorageError(
                f"no checkpoint of {self.storage.uri}/{self.dir} could be loaded, and {len(unreadable)} could not be read "
                f"({'; '.join(unreadable[:3])}): fix the storage (permissions?) rather than train from scratch, "
                "or remove the unreadable checkpoints"
            )
        if numbers:
            logger.error(
                "none of the %d checkpoints of %s/%s is valid: STARTING FROM SCRATCH", len(numbers), self.storage.uri, self.dir
            )
        return None
