"""The writer: one checkpoint's data file and manifest, into a directory being committed.

The tensors' checksums are computed on the CRC thread while this thread writes (both release the GIL). The manifest is
read back before it is written: a checkpoint a restart would reject is never committed. The writer never writes into the
:class:`~paddle_acp.format.engine.snapshot.Snapshot`: it returns what it wrote, a :class:`WriteResult`."""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

from paddle_acp.errors import CheckpointError, CorruptCheckpointError, StorageError
from paddle_acp.format.commit.atomic import Pending
from paddle_acp.format.engine.crc import checksum, crc_pool
from paddle_acp.format.engine.snapshot import Snapshot
from paddle_acp.format.engine.stream import write_stream
from paddle_acp.format.layout import DATA_NAME
from paddle_acp.format.manifest import PIECES_VERSION, VERSION, Manifest, ProgramRecord, TensorRecord
from paddle_acp.storage.base import pieces


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What :func:`write_checkpoint` wrote and committed."""

    number: int  # the manifest's checkpoint number
    path: str  # the committed directory (checkpoint, or a rank's part)
    data_size: int  # the bytes of the data file (tensors.bin)
    manifest: bytes  # the manifest file's bytes, as committed (the node-local cache commits its copy with them)
    checksums: Tuple[int, ...]  # each tensor's checksum, in the manifest's order


def is_out_of_space(exc: Optional[BaseException]) -> bool:
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


class WriteAbandoned(Exception):
    """Raised inside the data thread when the write it belongs to was given up."""


def _until(stop: threading.Event, buffers: List[Union[bytes, memoryview]]) -> Iterator[Any]:
    """``buffers`` as the storage writes them (:func:`~paddle_acp.storage.base.pieces`), ending (WriteAbandoned) once
    ``stop`` is set."""
    for piece in pieces(buffers):
        if stop.is_set():
            raise WriteAbandoned("the checkpoint's write was given up")
        yield piece


def write_checkpoint(pending: Pending, snap: Snapshot, number: int,
                     before_commit: Optional[Callable[[], None]] = None,
                     alongside: Optional[Callable[[bytes, Manifest], None]] = None) -> WriteResult:
    """Write ``snap`` as checkpoint ``number`` into ``pending`` and commit it; returns what was written.

    ``before_commit`` runs (and may raise, e.g. a fenced writer) right before the step that makes the checkpoint
    visible. ``alongside`` (it must not raise) gets the manifest's bytes and the manifest where the files are written at
    once, on a thread of its own beside them (a job of one rank stages its ``global.json`` there: its close pays the
    remote's wait in the same time as theirs)."""
    st = pending.storage
    size = snap.data_size  # (the snapshot was laid out when it was made)
    tensors = [t for p in snap.programs for t in p.tensors]
    stream = snap.stream
    # a streamed snapshot is checksummed chunk by chunk as it is written (its tensors change meanwhile)
    crcs: List[Future[int]] = [] if stream is not None else [crc_pool().submit(checksum, t.array) for t in tensors]
    path = f"{pending.path}/{DATA_NAME}"

    def crc_values() -> List[int]:
        return stream.checksums() if stream is not None else [f.result() for f in crcs]

    def write_data() -> int:
        if stream is not None:
            return write_stream(st, path, stream)
        if snap.image is not None:
            return st.write_image(path, snap.image, size)
        return st.write_buffers(path, _until(stop, snap.buffers()))

    stop = threading.Event()  # set when the write is given up (Ctrl-C): the data stops at its next piece
    written_manifest: List[bytes] = []
    read_back: List[Manifest] = []
    written_crcs: List[int] = []

    def manifest_bytes() -> bytes:
        written_crcs[:] = crc_values()
        it = iter(written_crcs)
        programs = [
            ProgramRecord(p.key, p.label, [TensorRecord(t.name, t.dtype, t.record_shape(), t.offset, t.array.nbytes,
                                                        next(it), t.piece) for t in p.tensors], p.lr_scheduler)
            for p in snap.programs
        ]
        pieces_held = any(t.piece is not None for t in tensors)
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
            version=PIECES_VERSION if pieces_held else VERSION,
        ).dumps()
        try:  # what restarts will read: never commit a checkpoint they would reject
            read_back.append(Manifest.loads(raw, data_file_size=size))
        except CorruptCheckpointError as exc:
            raise CheckpointError(
                f"checkpoint {number} is not written: a restart could not read it back ({exc}); "
                "the LR scheduler or data loader state is not plain JSON data of bounded size and depth"
            ) from None
        written_manifest.append(raw)
        return raw

    written: Union[int, BaseException]
    overlap = st.overlap_writes and not pending.strategy.in_place and stream is None
    if overlap:
        # The rename commits, so the manifest need not wait for the data: both files are written at once. On HDFS
        # closing a file waits for the namenode to see its block (~0.4 s): overlapped, a small checkpoint pays it once.
        box: List[Union[int, BaseException]] = []

        def data_thread() -> None:
            try:
                box.append(write_data())
            except BaseException as exc:  # re-raised below
                box.append(exc)

        t = threading.Thread(target=data_thread, name="paddle-acp-data", daemon=True)
        t.start()
        side: Optional[threading.Thread] = None
        try:
            raw = manifest_bytes()
            if alongside is not None:
                side = threading.Thread(target=alongside, args=(raw, read_back[0]), name="paddle-acp-alongside", daemon=True)
                side.start()
            pending.write_manifest_early(raw)
        except BaseException:
            stop.set()  # (a Ctrl-C here waits for one piece of the data, not for all of it)
            raise
        finally:
            try:
                t.join()
                if side is not None:
                    side.join()
            except BaseException:  # a Ctrl-C while waiting: the data thread writes no further piece
                stop.set()
                raise
        written = box[0]
        if isinstance(written, BaseException):
            raise written
    else:
        written = write_data()
    if written != size:
        raise StorageError(f"short write of {DATA_NAME}: {written} of {size} bytes")
    if overlap:
        pending.publish(before_commit)
    else:
        pending.commit(manifest_bytes(), before=before_commit)
    return WriteResult(number=number, path=pending.final, data_size=size, manifest=written_manifest[0],
                       checksums=tuple(written_crcs))
