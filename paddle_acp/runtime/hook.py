"""Hook: the patch on ``paddle.static.Executor.run`` that feeds programs to the active range.

The fast path (no range to feed) is one attribute lookup on :data:`paddle_acp.runtime.state.STATE`:
Executor.run is called thousands of times a second.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import TYPE_CHECKING, Any, Optional

from paddle_acp.adapter import executor as paddle_executor
from paddle_acp.adapter.executor import RunMethod
from paddle_acp.runtime.state import STATE

if TYPE_CHECKING:  # (the range's module imports the process state this one reads)
    from paddle_acp.runtime.range import EpochRange

logger = logging.getLogger("paddle_acp")

_original_run: Optional[RunMethod] = None


def install() -> None:
    """Patch Executor.run (idempotent). Importing paddle_acp calls this."""
    global _original_run
    if _original_run is not None:
        return
    original = paddle_executor.executor_run()

    @functools.wraps(original)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:  # Paddle's Executor and its untyped run
        r: Optional[EpochRange] = STATE.hooked
        if r is not None:
            program = args[0] if args else kwargs.get("program")
            scope = kwargs.get("scope")
            if scope is None and len(args) > 5:
                scope = args[5]  # run(program, feed, fetch_list, feed_var_name, fetch_var_name, scope, ...)
            r.on_run(self, program, scope)
            d = r.digests
            if d is not None and STATE.active is r:  # paddle-acp check: the values the script fetched
                result = original(self, *args, **kwargs)
                d.on_fetch(args, kwargs, result)
                return result
        return original(self, *args, **kwargs)

    run.__paddle_acp_original__ = original  # type: ignore[attr-defined]  # a mark on the function: Paddle's run, for ci/bench/local_costs_figures.py
    paddle_executor.set_executor_run(run)  # the patch
    _original_run = original
    # Paddle's own (sys.exit-prone) auto-checkpoint call: paddle_auto_checkpoint
    paddle_executor.redirect_auto_checkpoint(sys.modules[__name__])
    logger.debug("installed the Executor.run hook")


def uninstall() -> None:
    global _original_run
    if _original_run is None:
        return
    paddle_executor.set_executor_run(_original_run)
    _original_run = None


def installed() -> bool:
    return _original_run is not None


def paddle_auto_checkpoint(exe: Any, program: Any) -> None:
    """What Paddle's executor calls as ``acp._auto_checkpoint``: a no-op while the Executor.run hook is
    installed; otherwise ``program`` goes to the active range."""
    r: Optional[EpochRange] = STATE.active
    if r is None or installed():
        return None
    import paddle

    r.on_run(exe, program, paddle.static.global_scope())
    return None


_auto_checkpoint = paddle_auto_checkpoint  # the name Paddle's executor calls
