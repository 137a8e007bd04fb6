"""Operator tools: ``paddle-acp ls / inspect / verify / gc / export / stats / check``.

One module per command (:mod:`.ls`, :mod:`.inspect_checkpoint`, :mod:`.verify`, :mod:`.gc`, :mod:`.export`,
:mod:`.stats` with :mod:`.plot`, :mod:`.check` with :mod:`.check_report`); each has a function that computes a result object (a dataclass), a
``render`` to text and a ``to_json``, its ``register`` (argparse) and ``main``. Shared: :mod:`.discovery`
(the root, jobs, ranges), :mod:`.scan` (the checkpoints of a range and the one a restart loads),
:mod:`.refs` (checkpoint references), :mod:`.reading` (every checksum, streaming), :mod:`.metrics`
(the save metrics), :mod:`.kinds`, :mod:`.values` (saved values, bounded and redacted), :mod:`.render` and
:mod:`.progress`.

Everything goes through :class:`paddle_acp.storage.Storage`, so the commands work on every root
:func:`paddle_acp.storage.open_storage` accepts. Only ``gc`` modifies the storage; ``export`` writes
only under its ``--to`` directory. None of this imports Paddle.

Errors that the operator can fix (a wrong URI, a missing job, an unreadable checkpoint) raise
:class:`ToolError` (an :class:`~paddle_acp.errors.AcpError`): the command line prints it and exits
with status 2. ``verify`` exits with 1 when the checkpoint a restart would load is bad.

Long transfers show progress on stderr when it is a terminal (``PADDLE_ACP_PROGRESS=1`` forces it on,
``=0`` off).
"""

from __future__ import annotations

from typing import Any

from paddle_acp.tools import check, export, gc, inspect_checkpoint, ls, stats, verify
from paddle_acp.tools.discovery import ToolError, open_root, uri_join
from paddle_acp.tools.kinds import export_split, tensor_kinds
from paddle_acp.tools.metrics import EVENTS, clean_record, read_metrics, restarts_of, saves_of
from paddle_acp.tools.progress import Progress
from paddle_acp.tools.reading import verify_checkpoint
from paddle_acp.tools.refs import resolve_checkpoint
from paddle_acp.tools.render import guard
from paddle_acp.tools.scan import CkptInfo, restart_checkpoint, scan_range
from paddle_acp.tools.stats import summarize_metrics

COMMANDS = (ls, inspect_checkpoint, verify, gc, export, stats, check)

__all__ = [
    "add_subcommands", "COMMANDS", "ToolError", "open_root", "uri_join", "export_split", "tensor_kinds", "EVENTS",
    "clean_record", "read_metrics", "restarts_of", "saves_of", "Progress", "verify_checkpoint", "resolve_checkpoint",
    "CkptInfo", "restart_checkpoint", "scan_range", "summarize_metrics",
]


def add_subcommands(sub: Any) -> None:
    """Register ls, inspect, verify, gc, export and stats on an argparse subparsers object."""
    for command in COMMANDS:
        command.register(sub).set_defaults(func=guard(command.main))
