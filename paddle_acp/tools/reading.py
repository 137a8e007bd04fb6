"""Reading a checkpoint's data for the tools: every checksum, streaming, with a progress line.

The same checks as a restore (manifest, RNG state, data size, every tensor's CRC), in constant memory:
``verify`` reads everything and keeps nothing; ``export`` keeps the tensors it asks for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Optional, Set, Tuple

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.checkpointer import Checkpointer
from paddle_acp.format.manifest import DTYPES, Manifest
from paddle_acp.storage.base import Storage
from paddle_acp.tools.discovery import uri_join
from paddle_acp.tools.progress import Progress

if TYPE_CHECKING:
    import numpy as np

_CHUNK = 16 << 20

Key = Tuple[str, str]  # (program key, tensor name)


def verify_checkpoint(storage: Storage, job: str, range_name: str, number: int, quiet: bool = False) -> Manifest:
    """Check one committed checkpoint completely, streaming (constant memory).

    The same checks as :meth:`Checkpointer.load`: manifest, RNG state, data
    size and every tensor's CRC32. Raises CorruptCheckpointError.
    """
    manifest, _ = read_checkpoint(storage, job, range_name, number, want=None, quiet=quiet, verb="verifying")
    return manifest


def read_checkpoint(storage: Storage, job: str, range_name: str, number: int, want: Optional[Set[Key]],
                    quiet: bool = False, verb: str = "reading") -> Tuple[Manifest, Dict[Key, "np.ndarray"]]:
    """Verify a checkpoint; return (manifest, {(key, name): ndarray} for the tensors in ``want``)."""
    import numpy as np

    m, base, data_path = Checkpointer(storage, job, range_name).check_header(number)
    records = sorted(((t.offset, p.key, t) for p in m.programs for t in p.tensors), key=lambda x: x[0])
    checksum = m.checksum
    out: Dict[Key, np.ndarray] = {}
    total = sum(t.nbytes for _, _, t in records)
    label = f"{verb} {uri_join(storage.uri, base)}"
    try:
        f = storage.open_input(data_path)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{data_path} is missing") from None
    with f, Progress(label, total, enabled=False if quiet else None) as prog:
        for off, key, t in records:
            keep = want is not None and (key, t.name) in want
            arr = np.empty(t.shape, DTYPES[t.dtype]) if keep else None
            buf = memoryview(arr).cast("B") if arr is not None and t.nbytes else None
            crc, pos = 0, 0
            if t.nbytes:
                f.seek(off)
            while pos < t.nbytes:
                n = min(_CHUNK, t.nbytes - pos)
                chunk = f.read(n)
                if len(chunk) != n:
                    raise CorruptCheckpointError(f"{data_path}: short read of tensor {t.name!r}")
                crc = checksum(chunk, crc)
                if buf is not None:
                    buf[pos : pos + n] = chunk
                pos += n
                prog.update(n)
            if crc != t.checksum:
                raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {t.name!r} of program {key}")
            if arr is not None:
                out[(key, t.name)] = arr
    return m, out
