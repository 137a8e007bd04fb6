"""Reading a checkpoint's data for the tools, through the format layer's one reader
(:func:`paddle_acp.format.engine.reader.read_tensors`: the checks of a restore, streaming, in constant
memory), with a progress line on a terminal."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Dict, Iterator, Optional, Set, Tuple

from paddle_acp.format.engine import reader
from paddle_acp.format.layout import final_name, range_dir
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Storage
from paddle_acp.tools.discovery import uri_join
from paddle_acp.tools.progress import Progress

if TYPE_CHECKING:
    import numpy as np

Key = Tuple[str, str]  # (program key, tensor name)


def verify_checkpoint(storage: Storage, job: str, range_name: str, number: int, quiet: bool = False) -> Manifest:
    """Check one committed checkpoint completely, streaming (constant memory).

    The same checks as a restore: manifest, RNG state, data size and every
    tensor's CRC. Raises CorruptCheckpointError.
    """
    manifest, _ = read_checkpoint(storage, job, range_name, number, want=None, quiet=quiet, verb="verifying")
    return manifest


def read_checkpoint(storage: Storage, job: str, range_name: str, number: int, want: Optional[Set[Key]],
                    quiet: bool = False, verb: str = "reading",
                    base: Optional[str] = None) -> Tuple[Manifest, Dict[Key, "np.ndarray"]]:
    """Verify a checkpoint; return (manifest, {(key, name): ndarray} for the tensors in ``want``).

    ``base``: the directory holding the manifest and data file (default ``ckpt-<number>``; a part
    ``ckpt-e<E>/rank-<k>`` of a checkpoint of several ranks)."""
    base = base or f"{range_dir(job, range_name)}/{final_name(number)}"
    with progress_line(f"{verb} {uri_join(storage.uri, base)}", quiet) as progress:
        return reader.read_tensors(storage, base, number, range_name, want or (), progress=progress)


@contextlib.contextmanager
def progress_line(label: str, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """A progress line on a terminal (none when ``quiet``) for the reader's ``progress(done, total)`` callback."""
    with Progress(label, 0, enabled=False if quiet else None) as prog:

        def progress(n: int, total: int) -> None:
            prog.total = total
            prog.update(n)

        yield progress
