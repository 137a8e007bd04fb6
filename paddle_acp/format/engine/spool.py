"""The local spool file of a remote restore larger than the host-memory budget (or with nowhere to land).

:func:`paddle_acp.format.engine.reader.load` verifies such a file on its way into an unlinked local file (gone with the
descriptor whatever happens to the process) and copies the tensors out of it with ``preadv``."""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Optional

import numpy as np

from paddle_acp.errors import StorageError


def open_spool(data_path: str, spool_dir: Optional[str] = None) -> int:
    """The descriptor of a new, already unlinked file in ``spool_dir`` (default: the temporary directory)."""
    try:
        fd, path = tempfile.mkstemp(prefix="paddle-acp-restore-", dir=spool_dir)
        os.unlink(path)
    except OSError as exc:
        raise StorageError(f"cannot create a local spool file for restoring {data_path} "
                           f"({spool_dir or tempfile.gettempdir()}): {exc.strerror}") from exc
    return fd


def spool_writer(fd: int, data_path: str) -> Callable[[np.ndarray, int], None]:
    """The sink of the reader's verification loop: writes each chunk at its offset in the spool."""

    def write(buf: np.ndarray, pos: int) -> None:
        mv = buf.data
        done = 0
        while done < mv.nbytes:
            try:
                done += os.pwrite(fd, mv[done:], pos + done)
            except OSError as exc:
                raise StorageError(f"writing the local spool of {data_path} failed: {exc.strerror}") from exc

    return write
