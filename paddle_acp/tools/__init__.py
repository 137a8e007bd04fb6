"""Operator tools: ``paddle-acp ls / inspect / verify / gc / export / stats / check``.

One module per command: it computes a result object, renders it as text or JSON (``--json``) and has its ``register``
(argparse) and ``main``. Everything goes through :class:`paddle_acp.storage.Storage`; nothing imports Paddle. Only
``gc`` modifies the storage; ``export`` writes only under ``--to``. Errors the operator can fix raise
:class:`ToolError`: the command line prints it and exits with status 2 (``check``: 3)."""

from __future__ import annotations

from typing import Any

from paddle_acp.tools import check, export, gc, inspect_checkpoint, ls, stats, verify
from paddle_acp.tools.discovery import ToolError, open_root, uri_join
from paddle_acp.tools.inspect_checkpoint import export_split, tensor_kinds
from paddle_acp.tools.metrics import EVENTS, read_metrics, restarts_of, saves_of
from paddle_acp.tools.reading import Progress, verify_checkpoint
from paddle_acp.tools.refs import resolve_checkpoint
from paddle_acp.tools.render import guard
from paddle_acp.tools.scan import CkptInfo, restart_checkpoint, scan_range
from paddle_acp.tools.stats import summarize_metrics

COMMANDS = (ls, inspect_checkpoint, verify, gc, export, stats, check)

__all__ = [
    "add_subcommands", "COMMANDS", "ToolError", "open_root", "uri_join", "export_split", "tensor_kinds", "EVENTS",
    "read_metrics", "restarts_of", "saves_of", "Progress", "verify_checkpoint", "resolve_checkpoint",
    "CkptInfo", "restart_checkpoint", "scan_range", "summarize_metrics",
]


def add_subcommands(sub: Any) -> None:
    """Register every command on an argparse subparsers object."""
    for command in COMMANDS:
        command.register(sub).set_defaults(func=guard(command.main))
