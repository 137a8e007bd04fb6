"""The progress line of long transfers: a one-line byte counter on stderr, on a terminal only.

``PADDLE_ACP_PROGRESS=1`` forces it on, ``=0`` off (see :func:`paddle_acp.config.progress_from_env`).
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Optional

from paddle_acp.config import progress_from_env
from paddle_acp.tools.render import human_bytes


def progress_enabled(stream: Optional[IO[str]] = None) -> bool:
    forced = progress_from_env()
    if forced is not None:
        return forced
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A one-line byte counter on stderr, shown only on a terminal."""

    def __init__(self, label: str, total: int, stream: Optional[IO[str]] = None, enabled: Optional[bool] = None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(self.stream) if enabled is None else enabled
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
        try:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        except (OSError, ValueError):
            pass
        self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
