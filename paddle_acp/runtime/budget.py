"""The host-memory budget of the snapshot buffers (``PADDLE_ACP_HOST_MEMORY``).

A state that does not fit the budget is saved through it in chunks (:mod:`paddle_acp.format.engine.stream`).
Unset, the budget is half of ``MemAvailable`` when the first program registers, leaving at least 1 GiB available.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from paddle_acp.config import MIN_HOST_MEMORY, HostMemory

logger = logging.getLogger("paddle_acp")

HEADROOM = 1 << 30  # the adaptive budget leaves at least this much of MemAvailable free


def _meminfo(key: bytes) -> Optional[int]:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(key + b":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def mem_available() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes, or None where it cannot be read."""
    return _meminfo(b"MemAvailable")


def mem_total() -> Optional[int]:
    return _meminfo(b"MemTotal")


@dataclasses.dataclass(frozen=True)
class Budget:
    nbytes: Optional[int]  # None: unbounded (the memory could not be read and nothing was set)
    source: str  # how it was decided, for the log line

    def fits(self, size: int) -> bool:
        return self.nbytes is None or size <= self.nbytes


def decide(setting: Optional[HostMemory], available: Optional[int] = None, total: Optional[int] = None) -> Budget:
    """The budget in bytes: ``PADDLE_ACP_HOST_MEMORY`` when set (a percentage of MemTotal),
    else adapted to ``available`` (MemAvailable now, when not given)."""
    if setting is not None:
        if setting.nbytes is not None:
            return Budget(setting.nbytes, f"PADDLE_ACP_HOST_MEMORY={setting.nbytes} bytes")
        total = mem_total() if total is None else total
        return Budget(setting.resolve(total), f"PADDLE_ACP_HOST_MEMORY={setting.percent:g}% of {total} bytes")
    available = mem_available() if available is None else available
    if available is None:
        return Budget(None, "MemAvailable unknown: unbounded")
    adaptive = max(MIN_HOST_MEMORY, min(available // 2, available - HEADROOM))
    return Budget(adaptive, f"half of MemAvailable ({available} bytes), at least 1 GiB left free")
