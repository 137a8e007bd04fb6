"""Text rendering shared by the commands: sizes, times, durations, tables, the output; nothing here reads storage."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from typing import Any, Callable, Iterable, List, Optional, Sequence, TypeVar, Union

from paddle_acp.secrets import scrub_values
from paddle_acp.storage.base import scrub


def human_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def fmt_time(t: Optional[float]) -> str:
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError, TypeError):  # not a time a calendar can show
        return f"{clean(repr(t))[:40]} (not a valid time)"


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


# C0 and C1 control characters, DEL, and the Unicode line separators and bidirectional overrides: what would let a
# text read from storage start a line of its own, move the cursor or colour the terminal
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_BUT_NEWLINE_RE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: "re.Match[str]") -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(value: Any) -> str:
    """``value`` as text on one line: control characters (newlines included) escaped (``\\x1b``), for any text read
    from storage that a command prints."""
    return _CONTROL_RE.sub(_escape, str(value))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[int] = (), indent: str = "") -> str:
    """A plain-text table; columns in ``right`` are right-aligned."""
    cells = [["-" if c is None else clean(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(row: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(row):
            out.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
        return (indent + "  ".join(out)).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in cells])


def natural_key(s: str) -> List[Union[int, str]]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def emit(text: str) -> None:
    """Write a rendered result (lines joined by newlines) to stdout, secrets scrubbed, every control character but
    the newlines escaped (the texts read from storage in it went through :func:`clean`)."""
    sys.stdout.write(_CONTROL_BUT_NEWLINE_RE.sub(_escape, scrub(text)) + "\n")


def emit_json(doc: Any) -> None:
    """A result's JSON form on stdout (indented), secrets scrubbed from its string values before it is serialised
    (scrubbing the text could break the JSON: a secret "true")."""
    sys.stdout.write(json.dumps(scrub_values(doc), indent=2) + "\n")


def root_command(sub: Any, name: str, help: str, description: str, uri_help: str = "storage root",
                 job_help: str = "only this job") -> argparse.ArgumentParser:
    """The parser of a command over a storage root: ``URI``, ``--job``, ``--json`` (machine-readable output)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=description)
    p.add_argument("uri", metavar="URI", help=uri_help)
    p.add_argument("--job", help=job_help)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


_R = TypeVar("_R")


def output(res: _R, as_json: bool, to_json: Callable[[_R], Any], render: Callable[[_R], str]) -> _R:
    """A command's result on stdout: its JSON form (``--json``) or its text; returns ``res``."""
    if as_json:
        emit_json(to_json(res))
    else:
        emit(render(res))
    return res


def guard(fn: Callable[[Any], int]) -> Callable[[Any], int]:
    """Wrap a command: stdout closed early (``| head``) is not an error."""

    def run(args: Any) -> int:
        try:
            return fn(args)
        except BrokenPipeError:
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    run.__name__ = getattr(fn, "__name__", "command")
    run.__doc__ = fn.__doc__
    return run
