"""The local spool file of a remote restore larger than the host-memory budget.

A remote data file is normally read once into memory and verified there, which doubles
the process's memory at restore (the scope's tensors plus the image). When the file is
larger than the budget, :func:`paddle_acp.format.engine.reader.load` streams it instead through
a few small buffers into an unlinked local file (the spool), every tensor's checksum
computed on the way by the reader's one verification loop; only a file whose every
checksum matched is handed on, and the tensors are then copied out of it with ``preadv``
(page cache, nothing mapped). This module owns the spool file itself: its creation
(unlinked at once, so it goes with the descriptor whatever happens to the process) and
the writes into it.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Optional

import numpy as np

from paddle_acp.errors import StorageError


def open_spool(data_path: str, spool_dir: Optional[str] = None) -> int:
    """A new, already unlinked file in ``spool_dir`` (else the system's temporary directory),
    for the data file ``data_path``; its descriptor. StorageError when it cannot be made."""
    try:
        fd, path = tempfile.mkstemp(prefix="paddle-acp-restore-", dir=spool_dir)
        os.unlink(path)  # gone with the descriptor, whatever happens to this process
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
