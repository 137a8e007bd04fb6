"""Reading a checkpoint's data for the tools with the checks of a restore, streaming, in constant memory (the format
layer's one reader, :func:`paddle_acp.format.engine.reader.read_tensors`), and a one-line byte counter on stderr on a
terminal (``PADDLE_ACP_PROGRESS=1`` forces it on, ``=0`` off: :func:`paddle_acp.config.progress_from_env`)."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Set, Tuple

from paddle_acp.config import progress_from_env
from paddle_acp.format.engine import reader
from paddle_acp.format.layout import final_name, range_dir
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Storage
from paddle_acp.tools.discovery import uri_join
from paddle_acp.tools.render import human_bytes

if TYPE_CHECKING:
    import numpy as np

Key = Tuple[str, str]  # (program key, tensor name)


class Progress:
    """A one-line byte counter on stderr, shown if ``enabled`` (default: as PADDLE_ACP_PROGRESS says, else on a tty)."""

    def __init__(self, label: str, total: int, stream: Optional[IO[str]] = None, enabled: Optional[bool] = None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _progress_enabled(self.stream) if enabled is None else enabled
        self.label = label
        self.total = max(0, int(total))
        self.done = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self._width = 0

    def update(self, n: int) -> None:
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now - self._last >= 0.1:
                self._last = now
                self._render()

    def _render(self) -> None:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        dt = time.monotonic() - self._t0
        rate = f", {self.done / dt / 1e6:.1f} MB/s" if dt > 0.05 else ""
        text = f"{self.label}: {pct:3.0f}% {human_bytes(self.done)} / {human_bytes(self.total)}{rate}"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        if not self.enabled:
            return
        self._render()
        with contextlib.suppress(OSError, ValueError):
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _progress_enabled(stream: IO[str]) -> bool:
    forced = progress_from_env()
    if forced is not None:
        return forced
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def progress_line(label: str, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """A progress line (none when ``quiet``) for the reader's ``progress(done, total)`` callback."""
    with Progress(label, 0, enabled=False if quiet else None) as prog:

        def progress(n: int, total: int) -> None:
            prog.total = total
            prog.update(n)

        yield progress


def verify_checkpoint(storage: Storage, job: str, range_name: str, number: int, quiet: bool = False) -> Manifest:
    """Check one committed checkpoint as a restore does (manifest, RNG state, data size, every tensor's
    CRC), streaming. Raises CorruptCheckpointError."""
    manifest, _ = read_checkpoint(storage, job, range_name, number, want=None, quiet=quiet, verb="verifying")
    return manifest


def read_checkpoint(storage: Storage, job: str, range_name: str, number: int, want: Optional[Set[Key]],
                    quiet: bool = False, verb: str = "reading",
                    base: Optional[str] = None) -> Tuple[Manifest, Dict[Key, "np.ndarray"]]:
    """Verify a checkpoint; return (manifest, {(key, name): ndarray} for the tensors in ``want``).
    ``base``: the directory holding the manifest and data file (default ``ckpt-<number>``)."""
    base = base or f"{range_dir(job, range_name)}/{final_name(number)}"
    with progress_line(f"{verb} {uri_join(storage.uri, base)}", quiet) as progress:
        return reader.read_tensors(storage, base, number, range_name, want or (), progress=progress)
