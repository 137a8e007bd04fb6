"""The reader: the one place a checkpoint is read and verified.

Nothing unverified is handed on: :func:`load` checks the manifest (untrusted
input, refused unread when it is too large), the data file's size and every
tensor's checksum before it returns a :class:`LoadedCheckpoint`. Restore uses
it, and so does every tool (``verify_checkpoint``, ``read_tensors``).

Local files are checksummed as they stream (mapped and populated by the kernel,
or read into three rotating buffers where mapping is not possible), then read
again from the page cache straight into the scope's tensors; remote files are
read once into memory.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterator, List, MutableMapping, Optional, Sequence, Tuple

import numpy as np

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format.arena import CopyJob, alloc_buffer, chunked, copy_job, run_parallel
from paddle_acp.format.crc import checksum, crc_pool, drain
from paddle_acp.format.layout import DATA_NAME, MANIFEST_NAME
from paddle_acp.format.manifest import DTYPES, Manifest, TensorRecord, max_manifest_size
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")

_READ_CHUNK = 32 << 20
_VERIFY_CHUNK = 8 << 20
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14

Key = Tuple[str, str]  # (program key, tensor name)
Record = Tuple[int, str, TensorRecord]  # (offset, program key, tensor), sorted by offset
ReadItem = Tuple[str, TensorRecord, np.ndarray]  # (program key, tensor, the array to fill)
Span = Tuple[int, int]
CrcChunk = Callable[[np.ndarray, int, int, int], None]


# -- verified sources of tensors -----------------------------------------------------
class _MemorySource:
    """Verified tensors held in one in-memory image (remote stores: read once)."""

    def __init__(self, arrays: Dict[Key, np.ndarray]):
        self._arrays = arrays

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        return self._arrays[(key, rec.name)]

    def read_into(self, items: Sequence[ReadItem]) -> None:
        jobs: List[CopyJob] = []
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

    def __init__(self, fd: int, path: str, size: int, mapping: Optional[mmap.mmap] = None):
        self._fd = fd
        self._path = path
        self._size = size
        self._map = mapping
        self._bytes = np.frombuffer(mapping, dtype=np.uint8) if mapping is not None else None

    def _check_size(self) -> None:
        # a mapped file that shrank would fault (SIGBUS) on access: refuse it first
        if os.fstat(self._fd).st_size < self._size:
            raise CorruptCheckpointError(f"{self._path}: the file shrank after it was verified")

    def _pread(self, job: Tuple[memoryview, int]) -> None:
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

    def read_into(self, items: Sequence[ReadItem]) -> None:
        if self._bytes is not None:
            copies: List[CopyJob] = []
            self._check_size()
            for _key, rec, view in items:
                chunked(view, self._bytes[rec.offset:rec.offset + rec.nbytes], copies)
            run_parallel(copy_job, copies)
            return
        reads: List[Tuple[memoryview, int]] = []
        for _key, rec, view in items:
            mv = memoryview(view.reshape(-1).view(np.uint8))
            for i in range(0, rec.nbytes, _READ_CHUNK):
                reads.append((mv[i:i + _READ_CHUNK], rec.offset + i))
        run_parallel(self._pread, reads)

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


Source = Any  # _MemorySource | _FileSource


class _PendingArrays(MutableMapping[Key, np.ndarray]):
    """``(program key, tensor name) -> array`` over the tensors not yet handed out; reads on access."""

    def __init__(self, loaded: "LoadedCheckpoint"):
        self._ck = loaded

    def __getitem__(self, k: Key) -> np.ndarray:
        return self._ck.read(k[0], self._ck._pending[k])

    def __setitem__(self, k: Key, v: np.ndarray) -> None:
        raise TypeError("the arrays of a loaded checkpoint are read-only")

    def __delitem__(self, k: Key) -> None:
        self._ck.hand_out(k)  # KeyError when not pending

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._ck._pending))

    def __len__(self) -> int:
        return len(self._ck._pending)


class LoadedCheckpoint:
    """A verified checkpoint whose tensors are handed out once each.

    ``arrays`` maps ``(program key, tensor name)`` to the tensors not yet
    handed out (read on access). :func:`paddle_acp.adapter.tensors.write_program`
    puts one program's tensors straight into a scope (through ``pending``,
    ``read``, ``read_into`` and ``hand_out``). When every tensor has been handed
    out the data file (or image) is released.
    """

    def __init__(self, path: str, manifest: Manifest, source: Source):
        self.path = path
        self.manifest = manifest
        self._source = source
        self.name = path.rsplit("/", 1)[-1]  # ckpt-N, or ckpt-eE[-sS] for a global checkpoint
        self.global_manifest: Any = None  # a global_manifest.GlobalManifest for a checkpoint of several ranks
        self.position_key: Optional[Tuple[int, int]] = None
        self.source = "local" if isinstance(source, _FileSource) else "remote"  # or "cache": the node-local copy
        self._pending: Dict[Key, TensorRecord] = {
            (p.key, t.name): t for p in manifest.programs for t in p.tensors
        }
        if not self._pending:
            source.close()

    @property
    def arrays(self) -> _PendingArrays:
        return _PendingArrays(self)

    def pending(self, key: str) -> List[TensorRecord]:
        """Program ``key``'s tensors not handed out yet, in manifest order."""
        rec = self.manifest.program(key)
        if rec is None:
            return []
        return [t for t in rec.tensors if (key, t.name) in self._pending]

    def read(self, key: str, rec: TensorRecord) -> np.ndarray:
        """One verified tensor as a new array (or a view of the verified image)."""
        return self._source.read(key, rec)  # type: ignore[no-any-return]

    def read_into(self, items: Sequence[ReadItem]) -> None:
        """Fill each ``(key, record, array)``'s array (its dtype and shape) with the tensor."""
        self._source.read_into(items)

    def hand_out(self, k: Key) -> None:
        """Tensor ``k`` is handed out: no longer pending (KeyError if it was not)."""
        del self._pending[k]
        if not self._pending:
            self._source.close()

    def close(self) -> None:
        self._pending.clear()
        self._source.close()


# -- the manifest and the data file's size -----------------------------------------------
def file_size(storage: Storage, path: str, what: str) -> Optional[int]:
    """The size of a regular file of a checkpoint; None when it is missing.
    CorruptCheckpointError for a directory, a symbolic link or anything else."""
    kind, size = storage.stat(path)
    if kind == "missing":
        return None
    if kind != "file":
        what_it_is = {"link": "a symbolic link (never followed)", "dir": "a directory"}.get(kind, "not a regular file")
        raise CorruptCheckpointError(f"{path}: the {what} is {what_it_is}")
    return size


def read_manifest(storage: Storage, base: str, number: int, range_name: str, raw: Optional[bytes] = None) -> Manifest:
    """The manifest of checkpoint ``number`` in directory ``base``; see :func:`read_manifest_raw`."""
    return read_manifest_raw(storage, base, number, range_name, raw)[0]


def read_manifest_raw(storage: Storage, base: str, number: int, range_name: str,
                      raw: Optional[bytes] = None) -> Tuple[Manifest, bytes]:
    """The manifest of checkpoint ``number`` in directory ``base`` of range ``range_name``, and
    its bytes; ``raw``: its bytes, already read (and checked) by the caller.

    Untrusted input: a manifest or data file that is a directory or a symbolic
    link, or a manifest larger than :func:`max_manifest_size` of its data, is
    refused unread (CorruptCheckpointError)."""
    path = f"{base}/{MANIFEST_NAME}"
    data_size = None
    if raw is None:
        if storage.local and storage.kind(base) != "dir":
            raise CorruptCheckpointError(f"{base} is not a directory (a symbolic link is never followed)")
        size = file_size(storage, path, "manifest")
        if size is None:
            raise CorruptCheckpointError(f"{path}: manifest is missing (checkpoint not committed)")
        data_size = file_size(storage, f"{base}/{DATA_NAME}", DATA_NAME) or 0
        limit = max_manifest_size(data_size)
        if size > limit:  # refused unread: parsing a huge document costs seconds and gigabytes
            raise CorruptCheckpointError(
                f"{path}: invalid manifest: {size} bytes, more than the {limit} allowed for {data_size} bytes of data"
            )
        try:
            raw = storage.read_bytes(path, limit=limit)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{path}: manifest is missing (checkpoint not committed)") from None
    try:
        m = Manifest.loads(raw, data_file_size=data_size)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(f"{path}: {exc}") from None
    if m.number != number:
        raise CorruptCheckpointError(f"{path}: manifest says checkpoint {m.number}, directory says {number}")
    if m.range.name != range_name:
        raise CorruptCheckpointError(f"{path}: manifest belongs to range {m.range.name!r}")
    return m, raw


def check_header(storage: Storage, base: str, number: int, range_name: str,
                 raw: Optional[bytes] = None) -> Tuple[Manifest, str]:
    """Validate the manifest and the data file's size; returns (manifest, data path).

    Raises CorruptCheckpointError. The tensors' checksums are checked by :func:`load`.
    """
    m = read_manifest(storage, base, number, range_name, raw)  # RNG and LR-scheduler states are validated there
    data_path = f"{base}/{DATA_NAME}"
    size = file_size(storage, data_path, DATA_NAME)
    if size is None:
        raise CorruptCheckpointError(f"{data_path} is missing")
    if size != m.data_size:
        raise CorruptCheckpointError(f"{data_path} has {size} bytes, manifest says {m.data_size}")
    return m, data_path


# -- the data file ------------------------------------------------------------------
def load(storage: Storage, base: str, number: int, range_name: str, raw: Optional[bytes] = None) -> LoadedCheckpoint:
    """Read and verify checkpoint ``number`` (directory ``base``) completely; raises CorruptCheckpointError.

    Every tensor's checksum is checked before this returns, so nothing of a
    corrupt checkpoint can reach a scope. Local files are checksummed as they
    stream through small buffers and read again (from the page cache) straight
    into the scope's tensors; remote files are read once into memory.
    """
    m, data_path = check_header(storage, base, number, range_name, raw)
    records = sorted(((t.offset, p.key, t) for p in m.programs for t in p.tensors), key=lambda x: x[0])
    if storage.local:
        return LoadedCheckpoint(base, m, _verify_local(storage, m, data_path, records))
    return LoadedCheckpoint(base, m, _read_verified(storage, m, data_path, records))


def _populate(mapping: mmap.mmap, pos: int, n: int, data_path: str) -> None:
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


def _map_file(fd: int, size: int) -> Optional[mmap.mmap]:
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


def _verify_local(storage: Storage, m: Manifest, data_path: str, records: List[Record]) -> _FileSource:
    os_path = storage.full(data_path)
    try:
        fd = os.open(os_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{data_path} is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptCheckpointError(f"{data_path} is a symbolic link (never followed)") from None
        raise StorageError(f"opening {storage.uri}/{data_path} failed: {exc}") from exc
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
            _verify_mapped(mapping, m.data_size, data_path, spans, crc_chunk)
        else:
            _verify_buffered(fd, m.data_size, data_path, spans, crc_chunk)
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


def _verify_mapped(mapping: mmap.mmap, size: int, data_path: str, spans: List[Span], crc_chunk: CrcChunk) -> None:
    """Checksum a mapped file: this thread waits for each chunk's pages
    (``MADV_POPULATE_READ``: read from disk into the page cache and mapped,
    no copy), the CRC thread checksums them in place."""
    data = np.frombuffer(mapping, dtype=np.uint8)
    futs: List["Future[None]"] = []
    first = 0
    try:
        for pos in range(0, size, _VERIFY_CHUNK):
            n = min(_VERIFY_CHUNK, size - pos)
            _populate(mapping, pos, n, data_path)
            while first < len(spans) and spans[first][1] <= pos:
                first += 1
            futs.append(crc_pool().submit(crc_chunk, data[pos:pos + n], pos, n, first))
    except BaseException:
        drain(futs)  # no checksum may touch the mapping after this returns
        raise
    for f in futs:
        f.result()


def _verify_buffered(fd: int, size: int, data_path: str, spans: List[Span], crc_chunk: CrcChunk) -> None:
    """Checksum a file read on this thread into three rotating buffers, checksummed on the CRC thread."""
    bufs = [alloc_buffer(_VERIFY_CHUNK) for _ in range(3)]
    futs: List[Optional["Future[None]"]] = [None, None, None]
    pos, first, k = 0, 0, 0
    try:
        while pos < size:
            slot = k % 3
            prev = futs[slot]
            if prev is not None:
                prev.result()
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
            futs[slot] = crc_pool().submit(crc_chunk, bufs[slot], pos, n, first)
            pos += n
            k += 1
    except BaseException:
        drain([f for f in futs if f is not None])  # before the buffers go
        raise
    for f in futs:
        if f is not None:
            f.result()


def _read_verified(storage: Storage, m: Manifest, data_path: str, records: List[Record]) -> _MemorySource:
    image = alloc_buffer(m.data_size)
    pending: List[Tuple[str, TensorRecord, np.ndarray, "Future[int]"]] = []
    nxt = 0
    with storage.open_input(data_path) as f:
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
                pending.append((key, t, arr, crc_pool().submit(checksum, arr, m.version)))
                nxt += 1
    while nxt < len(records):  # zero-size tensors at the very end
        off, key, t = records[nxt]
        arr = np.empty(t.shape, DTYPES[t.dtype])
        pending.append((key, t, arr, crc_pool().submit(checksum, arr, m.version)))
        nxt += 1
    arrays: Dict[Key, np.ndarray] = {}
    for key, t, arr, fut in pending:
        if fut.result() != t.checksum:
            raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {t.name!r} of program {key}")
        arrays[(key, t.name)] = arr
    return _MemorySource(arrays)
