"""The reader: the one place a checkpoint is read and verified.

Nothing unverified is handed on: every entry point validates the manifest first (untrusted: refused unread when too
large) and the data file's size (:func:`check_header`); :func:`load` (restore), :func:`verify` (``verify``,
``ls --verify``, ``gc``) and :func:`read_tensors` (``export``) check every tensor's checksum before they return
anything. All three stream the data file once, in order, through one loop (:func:`_verify_stream`), reading a chunk
while the CRC threads checksum the previous ones."""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Collection, Dict, List, Optional, Tuple

import numpy as np

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format.engine.chunks import Chunks, PreadChunks, RangedChunks, RemoteChunks, WindowChunks, local_chunks
from paddle_acp.format.engine.chunks import map_file as _map_file
from paddle_acp.format.engine.crc import combine, crc_pool, drain, restore_crc_pool
from paddle_acp.format.engine.loaded import FileSource, Key, Landing, Lent, LoadedCheckpoint, MemorySource
from paddle_acp.format.engine.spool import open_spool, spool_writer
from paddle_acp.format.layout import DATA_NAME, MANIFEST_NAME
from paddle_acp.format.manifest import TENSOR_CHECKSUMS, Manifest, TensorRecord, max_manifest_size
from paddle_acp.storage.base import InputFile, Storage
from paddle_acp.storage.local import open_regular

__all__ = [
    "Key", "Landing", "LoadedCheckpoint", "Progress", "check_header", "file_size", "load", "read_manifest",
    "read_manifest_raw", "read_tensors", "verify",
]

logger = logging.getLogger("paddle_acp")

_READ_CHUNK = 32 << 20
_VERIFY_CHUNK = 8 << 20

Record = Tuple[int, str, TensorRecord]  # (offset, program key, tensor), sorted by offset
Progress = Callable[[int, int], None]  # (bytes just read, bytes of the whole data file)
Pieces = List[Tuple[int, int, int]]  # a chunk's pieces of tensors: (record index, checksum from 0, length)


# -- the manifest and the data file's size -----------------------------------------------
def file_size(storage: Storage, path: str, what: str) -> Optional[int]:
    """The size of a regular file of a checkpoint; None when missing, CorruptCheckpointError when not a file."""
    kind, size = storage.stat(path)
    if kind == "missing":
        return None
    if kind != "file":
        what_it_is = {"link": "a symbolic link (never followed)", "dir": "a directory"}.get(kind, "not a regular file")
        raise CorruptCheckpointError(f"{path}: the {what} is {what_it_is}")
    return size


def _read_manifest(storage: Storage, base: str, number: int, range_name: str,
                   raw: Optional[bytes]) -> Tuple[Manifest, bytes, Optional[int]]:
    """The validated manifest, its bytes and the data file's size (None: missing; -1: not looked up, ``raw`` given)."""
    path = f"{base}/{MANIFEST_NAME}"
    data_size: Optional[int] = None
    looked_up = raw is None
    if raw is None:
        if storage.has_symlinks and storage.kind(base) != "dir":
            raise CorruptCheckpointError(f"{base} is not a directory (a symbolic link is never followed)")
        size = file_size(storage, path, "manifest")
        if size is None:
            raise CorruptCheckpointError(f"{path}: manifest is missing (checkpoint not committed)")
        data_size = file_size(storage, f"{base}/{DATA_NAME}", DATA_NAME)
        limit = max_manifest_size(data_size or 0)
        if size > limit:  # refused unread: parsing a huge document costs seconds and gigabytes
            raise CorruptCheckpointError(
                f"{path}: invalid manifest: {size} bytes, more than the {limit} allowed for {data_size or 0} bytes of data"
            )
        try:
            raw = storage.read_bytes(path, limit=limit)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{path}: manifest is missing (checkpoint not committed)") from None
    try:
        m = Manifest.loads(raw, data_file_size=(data_size or 0) if looked_up else None)
    except CorruptCheckpointError as exc:  # the same class: a newer format stays one (UnknownFormatError)
        raise type(exc)(f"{path}: {exc}") from None
    if m.number != number:
        raise CorruptCheckpointError(f"{path}: manifest says checkpoint {m.number}, directory says {number}")
    if m.range.name != range_name:
        raise CorruptCheckpointError(f"{path}: manifest belongs to range {m.range.name!r}")
    return m, raw, data_size if looked_up else -1


def read_manifest(storage: Storage, base: str, number: int, range_name: str, raw: Optional[bytes] = None) -> Manifest:
    """The manifest of checkpoint ``number`` in directory ``base``; see :func:`read_manifest_raw`."""
    return _read_manifest(storage, base, number, range_name, raw)[0]


def read_manifest_raw(storage: Storage, base: str, number: int, range_name: str,
                      raw: Optional[bytes] = None) -> Tuple[Manifest, bytes]:
    """The manifest of checkpoint ``number`` in directory ``base`` of range ``range_name``, and its bytes (``raw``:
    already read by the caller). The data file is not checked here."""
    m, raw_bytes, _size = _read_manifest(storage, base, number, range_name, raw)
    return m, raw_bytes


def check_header(storage: Storage, base: str, number: int, range_name: str,
                 raw: Optional[bytes] = None, sized_by_read: bool = False) -> Tuple[Manifest, str]:
    """Validate the manifest and the data file's size, reading no data; returns (manifest, data path).
    ``sized_by_read``: a remote data file is not looked up when ``raw`` is given (its reader checks its size)."""
    m, _raw, size = _read_manifest(storage, base, number, range_name, raw)
    data_path = f"{base}/{DATA_NAME}"
    if size == -1 and sized_by_read and storage.local_path(data_path) is None:
        return m, data_path
    if size == -1:  # not looked up yet
        size = file_size(storage, data_path, DATA_NAME)
    if size is None:
        raise CorruptCheckpointError(f"{data_path} is missing")
    if size != m.data_size:
        raise CorruptCheckpointError(f"{data_path} has {size} bytes, manifest says {m.data_size}")
    return m, data_path


# -- the data file: the entry points -------------------------------------------------------
def load(storage: Storage, base: str, number: int, range_name: str, raw: Optional[bytes] = None,
         memory_budget: Optional[int] = None, landing: Optional[Landing] = None) -> LoadedCheckpoint:
    """Read and verify checkpoint ``number`` (directory ``base``) completely; raises CorruptCheckpointError.

    The checksums run at normal priority as the bytes arrive; nothing maps or buffers the whole file beyond what is
    lent. A local file is verified a mapped window at a time (plain reads where it cannot be mapped) and stays open:
    its tensors are read from the page cache with ``preadv`` straight into the scope's (landing it in a fresh arena
    made training wait on page faults). A remote file lands in the buffer ``landing`` lends (the snapshot arena) when
    it fits ``memory_budget``, by parallel ranged reads; else it is verified on its way into an unlinked local spool
    file and read from there."""
    m, data_path = check_header(storage, base, number, range_name, raw, sized_by_read=True)
    records = _records(m)
    os_path = storage.local_path(data_path)
    fits = m.data_size > 0 and (memory_budget is None or m.data_size <= memory_budget)
    lent = landing(m.data_size) if landing is not None and fits and os_path is None else None
    if lent is not None:
        loaded = _land(storage, base, m, data_path, records, lent)
    elif os_path is None:
        loaded = LoadedCheckpoint(base, m, _spool_verified(storage, m, data_path, records, memory_budget))
    else:
        fd, _mapping = _open_local(storage, os_path, data_path, m.data_size, mapped=False)
        try:
            probe = _map_file(fd, min(m.data_size, mmap.PAGESIZE))  # None where mapping is not possible
            if probe is not None:
                probe.close()
            chunks = (WindowChunks(fd, data_path, _VERIFY_CHUNK) if probe is not None
                      else PreadChunks(fd, data_path, _VERIFY_CHUNK))
            try:
                _verify_stream(chunks, m, data_path, records, pool=restore_crc_pool())
            finally:
                chunks.close()
        except BaseException:
            os.close(fd)
            raise
        loaded = LoadedCheckpoint(base, m, FileSource(fd, data_path))
    loaded.source = "local" if os_path is not None else "remote"
    return loaded


def _land(storage: Storage, base: str, m: Manifest, data_path: str, records: List[Record], lent: Lent) -> LoadedCheckpoint:
    """A remote restore into a lent buffer: every byte read once into it and checksummed there; the buffer is given back
    at once when the file does not verify."""
    buf, give_back = lent
    image = buf[:m.data_size]
    try:
        with RangedChunks(lambda: _open_remote(storage, data_path), data_path, _READ_CHUNK, image,
                          storage.ranged_readers) as chunks:
            _verify_stream(chunks, m, data_path, records, pool=restore_crc_pool())
            chunks.check_end(m.data_size)
    except BaseException:
        give_back()
        raise
    arrays: Dict[Key, np.ndarray] = {}
    for off, key, t in records:
        shape, dtype = t.stored()  # a piece of a tensor (spread writes): its raw bytes
        arrays[(key, t.name)] = (image[off:off + t.nbytes].view(dtype).reshape(shape) if t.nbytes
                                 else np.empty(shape, dtype))
    return LoadedCheckpoint(base, m, MemorySource(arrays, on_close=give_back))


def verify(storage: Storage, base: str, number: int, range_name: str, raw: Optional[bytes] = None,
           progress: Optional[Progress] = None) -> Manifest:
    """Check checkpoint ``number`` completely in constant memory, keeping nothing; returns its manifest."""
    return read_tensors(storage, base, number, range_name, (), raw, progress)[0]


def read_tensors(storage: Storage, base: str, number: int, range_name: str, want: Collection[Key],
                 raw: Optional[bytes] = None, progress: Optional[Progress] = None) -> Tuple[Manifest, Dict[Key, np.ndarray]]:
    """Check checkpoint ``number`` completely; returns its manifest and the tensors ``want`` names, new arrays."""
    m, data_path = check_header(storage, base, number, range_name, raw)
    records = _records(m)
    out = {(key, t.name): np.empty(*t.stored()) for _off, key, t in records if (key, t.name) in want}
    keep = {i: out[(key, t.name)] for i, (_off, key, t) in enumerate(records) if (key, t.name) in out}
    os_path = storage.local_path(data_path)
    if os_path is not None:
        fd, mapping = _open_local(storage, os_path, data_path, m.data_size)
        try:
            _verify_stream(local_chunks(fd, mapping, data_path, _VERIFY_CHUNK), m, data_path, records, keep, progress)
        finally:
            _close_local(fd, mapping)
    else:
        with _open_remote(storage, data_path) as f:
            _verify_stream(RemoteChunks(f, data_path, _READ_CHUNK), m, data_path, records, keep, progress)
    return m, out


# -- the data file: where its bytes come from ----------------------------------------------
def _records(m: Manifest) -> List[Record]:
    return sorted(((t.offset, p.key, t) for p in m.programs for t in p.tensors), key=lambda x: x[0])


def _open_remote(storage: Storage, data_path: str) -> InputFile:
    try:
        return storage.open_input(data_path)
    except (FileNotFoundError, StorageError):  # (a directory reads as missing on some stores)
        if file_size(storage, data_path, DATA_NAME) is None:  # CorruptCheckpointError when not a regular file
            raise CorruptCheckpointError(f"{data_path} is missing") from None
        raise


def _open_local(storage: Storage, os_path: str, data_path: str, size: int,
                mapped: bool = True) -> Tuple[int, Optional[mmap.mmap]]:
    """The data file opened (never through a link, nor blocking: a named pipe is refused) and, where possible,
    mapped."""
    try:
        fd = open_regular(os_path, data_path)
    except StorageError as exc:  # not a regular file
        raise CorruptCheckpointError(str(exc)) from None
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{data_path} is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptCheckpointError(f"{data_path} is a symbolic link (never followed)") from None
        raise StorageError(f"opening {storage.uri}/{data_path} failed: {exc}") from exc
    try:
        if os.fstat(fd).st_size != size:
            raise CorruptCheckpointError(f"{data_path} changed size while it was opened")
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead
        return fd, (_map_file(fd, size) if mapped else None)
    except BaseException:
        os.close(fd)
        raise


def _close_local(fd: int, mapping: Optional[mmap.mmap]) -> None:
    if mapping is not None:
        with contextlib.suppress(BufferError):  # a view in the traceback: unmapped with it
            mapping.close()
    os.close(fd)


def _spool_verified(storage: Storage, m: Manifest, data_path: str, records: List[Record],
                    budget: Optional[int], spool_dir: Optional[str] = None) -> FileSource:
    """Nowhere to land: a remote data file verified into an unlinked local spool file, then read like a local one."""
    if budget is not None and m.data_size > budget:
        logger.info("%s: %d bytes, more than the host-memory budget (%d bytes): verified on its way into a local "
                    "spool file instead of memory", data_path, m.data_size, budget)
    else:
        logger.info("%s: %d bytes and no snapshot buffer to land in: verified on its way into a local spool file",
                    data_path, m.data_size)
    fd = open_spool(data_path, spool_dir)
    try:
        with _open_remote(storage, data_path) as f:
            chunks = RemoteChunks(f, data_path, _READ_CHUNK)
            _verify_stream(chunks, m, data_path, records, sink=spool_writer(fd, data_path), pool=restore_crc_pool())
            chunks.check_end(m.data_size)
    except BaseException:
        os.close(fd)
        raise
    return FileSource(fd, data_path)


# -- the data file: the one verification loop ----------------------------------------------
def _verify_stream(chunks: Chunks, m: Manifest, data_path: str, records: List[Record],
                   keep: Optional[Dict[int, np.ndarray]] = None, progress: Optional[Progress] = None,
                   sink: Optional[Callable[[np.ndarray, int], None]] = None,
                   pool: Optional[ThreadPoolExecutor] = None) -> None:
    """Read the data file once, in order, and check every tensor's checksum (CorruptCheckpointError).

    This thread gets each chunk (and hands it to ``sink(chunk, offset)``); a CRC thread of ``pool`` (default: the
    background one) checksums it tensor by tensor, each piece from 0, and copies the bytes of the tensors in ``keep``
    (record index -> array); this thread joins a tensor's pieces in order (:func:`combine`)."""
    size = m.data_size
    fn, algorithm = m.checksum, TENSOR_CHECKSUMS[m.version]
    crcs = [0] * len(records)
    spans = [(off, off + t.nbytes) for off, _key, t in records]
    kept = {i: arr.reshape(-1).view(np.uint8) for i, arr in (keep or {}).items()}

    def crc_chunk(held: List[np.ndarray], start: int, n: int, first: int) -> Pieces:
        buf = held.pop()  # no reference to the chunk outlives this call (a window is unmapped after it)
        end = start + n
        i, pieces = first, []
        while i < len(spans) and spans[i][0] < end:
            lo, hi = max(spans[i][0], start), min(spans[i][1], end)
            if hi > lo:
                pieces.append((i, fn(buf[lo - start:hi - start], 0), hi - lo))
                dst = kept.get(i)
                if dst is not None:
                    dst[lo - spans[i][0]:hi - spans[i][0]] = buf[lo - start:hi - start]
            i += 1
        return pieces

    futs: List["Future[Pieces]"] = []
    checker = pool if pool is not None else crc_pool()
    pos, first, k, joined = 0, 0, 0, 0

    def join(upto: int, wait: bool) -> int:
        """Join the pieces of chunks ``joined``..``upto`` in order (without ``wait``: up to the first not done)."""
        j = joined
        while j < upto and (wait or futs[j].done()):
            for i, crc, n in futs[j].result():
                crcs[i] = combine(algorithm, crcs[i], crc, n)
            j += 1
        return j

    try:
        while pos < size:
            n = min(chunks.size, size - pos)
            slot = 0
            if chunks.depth is not None:
                slot = k % chunks.depth
                if k >= chunks.depth:
                    joined = join(k - chunks.depth + 1, True)  # that buffer's previous chunk is checksummed
            buf = chunks.get(pos, n, slot)
            if sink is not None:
                sink(buf, pos)
            while first < len(spans) and spans[first][1] <= pos:
                first += 1
            futs.append(checker.submit(crc_chunk, [buf], pos, n, first))
            if progress is not None:
                progress(n, size)
            pos += n
            k += 1
            joined = join(k, False)
        joined = join(k, True)
    except BaseException:
        drain(futs)  # no checksum may touch a mapping or a buffer after this returns
        raise
    for (_off, key, t), crc in zip(records, crcs):
        if crc != t.checksum:
            raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {t.name!r} of program {key}")
