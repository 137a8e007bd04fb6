"""Value parsers of the configuration: booleans, seconds, integers, job ids, amounts of memory.

Pure functions of a string; each raises ConfigError naming the variable, the value and the way out.
"""

from __future__ import annotations

import dataclasses
import fractions
import re
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from paddle_acp.errors import ConfigError

_JOB_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}", re.ASCII)  # fullmatch: no trailing newline


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(raw: Optional[str], name: str, default: bool) -> bool:
    """The one boolean parser: ``1/true/yes/on`` and ``0/false/no/off`` (any case, blanks ignored);
    ``default`` when ``raw`` is None or blank; else ConfigError naming ``name``."""
    if raw is None or raw.strip() == "":
        return default
    low = raw.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1 or 0)")


def is_valid_job_id(value: object) -> bool:
    """The job-id rule (also what the operator tools accept as a job directory's name)."""
    return isinstance(value, str) and bool(value) and ".." not in value and _JOB_ID_RE.fullmatch(value) is not None


def validate_job_id(value: str, name: str = "PADDLE_JOB_ID") -> str:
    if not is_valid_job_id(value):
        raise ConfigError(
            f"{name}={value!r} is not a valid job id: use letters, digits, '.', '_' "
            "and '-' only (no '/', no '..', not empty, at most 200 characters)"
        )
    return value


N = TypeVar("N", int, float)


def ascii_number(value: Any, kind: Callable[[Any], N]) -> N:
    """``kind(value)``, the one parser of numbers in variables: a string only in ASCII and without ``_`` (Python's
    int and float take any Unicode digit, "１", and "1_000", which nothing else reads as numbers); ValueError or
    TypeError otherwise."""
    if isinstance(value, str) and (not value.isascii() or "_" in value):
        raise ValueError(f"{value!r} is not a plain ASCII number")
    return kind(value)


def check_interval(value: Any, name: str, maximum: Optional[float] = None, what: str = "") -> float:
    """``value`` as seconds >= 0 and finite; with ``maximum`` (a timeout that becomes a deadline: the clocks and
    the clients' own timers overflow far below float's range) at most that, ``what`` saying why."""
    try:
        seconds = ascii_number(value, float)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number of seconds") from None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ConfigError(f"{name}={value!r} must be a finite number of seconds >= 0")
    if maximum is not None and seconds > maximum:
        raise ConfigError(f"{name}={value!r} is too large: at most {maximum:g} s{what}")
    return seconds


#: The most ranks one job may have: the largest world size a checkpoint's global.json records.
MAX_WORLD = 1 << 16


def env_seconds(env: Mapping[str, str], name: str, default: float, maximum: Optional[float] = None,
                what: str = "") -> float:
    """Variable ``name`` of ``env`` as seconds (:func:`check_interval`); ``default`` when unset or blank."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    return check_interval(raw.strip(), name, maximum, what)


def env_choice(env: Mapping[str, str], name: str, default: str, choices: Sequence[str],
               norm: Callable[[str], str], problem: str) -> str:
    """Variable ``name``, stripped and normalised by ``norm``: ``default`` when unset or empty, one of
    ``choices``, else a ConfigError saying ``problem``."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = norm(raw.strip())
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} {problem}")
    return value


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    """Variable ``name`` of ``env`` as an integer >= ``minimum``; ``default`` when unset or blank."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = ascii_number(raw.strip(), int)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
    return value


# -- PADDLE_ACP_HOST_MEMORY --------------------------------------------------------------------
MIN_HOST_MEMORY = 16 << 20  # two 8 MiB chunks: below this a streamed save is all overhead
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_MEMORY_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*|%)", re.ASCII)


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """``PADDLE_ACP_HOST_MEMORY``: a number of bytes, or a percentage of the machine's memory."""

    nbytes: Optional[int] = None  # an absolute bound
    percent: Optional[float] = None  # of MemTotal

    def resolve(self, mem_total: Optional[int]) -> int:
        """The bound in bytes (a percentage of ``mem_total``; where that is unknown, of 4 GiB)."""
        if self.nbytes is not None:
            return self.nbytes
        total = mem_total if mem_total else 4 << 30
        return max(MIN_HOST_MEMORY, int(total * (self.percent or 0.0) / 100.0))


def parse_host_memory(raw: str, name: str = "PADDLE_ACP_HOST_MEMORY") -> HostMemory:
    """``512MiB``, ``2GB``, ``1.5g``, ``1073741824`` (bytes) or ``25%`` (of the machine's memory); units
    case-insensitive, KB/MB/... powers of 1000, KiB/MiB/... of 1024."""
    text = raw.strip().lower()
    m = _MEMORY_RE.fullmatch(text)
    how = ("use bytes with an optional unit (512MiB, 2GB, 1.5GiB) or a percentage of the machine's memory "
           "(25%); unset it to adapt to the memory available")
    if m is None or (m.group(2) not in _UNITS and m.group(2) != "%"):
        raise ConfigError(f"{name}={raw!r} is not an amount of memory: {how}")
    number, unit = fractions.Fraction(m.group(1)), m.group(2)  # exact: 3.3GB is 3300000000 bytes
    if unit == "%":
        if not 0 < number <= 90:
            raise ConfigError(f"{name}={raw!r}: a percentage must be above 0 and at most 90 (the rest is the "
                              f"training's own): {how}")
        return HostMemory(percent=float(number))
    nbytes = number * _UNITS[unit]
    if nbytes >= 2**62:
        raise ConfigError(f"{name}={raw!r} is absurdly large: {how}")
    if nbytes < MIN_HOST_MEMORY:
        raise ConfigError(f"{name}={raw!r} is below the minimum of {MIN_HOST_MEMORY >> 20} MiB "
                          f"(two chunks of a streamed save): {how}")
    return HostMemory(nbytes=int(nbytes))
