"""Hook: the patch on ``paddle.static.Executor.run`` that feeds programs to the active range.

The fast path (no range to feed) is one attribute lookup on the process state
(:data:`paddle_acp.runtime.state.STATE`); Executor.run is called thousands of times a second.
"""

from __future__ import annotations

import functools
import logging
import sys

from paddle_acp.runtime.state import STATE

logger = logging.getLogger("paddle_acp")

_original_run = None


def install() -> None:
    """Patch Executor.run (idempotent). Importing paddle_acp calls this."""
    global _original_run
    from paddle.base.executor import Executor

    if _original_run is not None:
        return
    original = Executor.run

    @functools.wraps(original)
    def run(self, *args, **kwargs):
        r = STATE.hooked  # the public field of the process state
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

    run.__paddle_acp_original__ = original  # type: ignore[attr-defined]
    Executor.run = run  # type: ignore[method-assign]  # the patch
    _original_run = original
    _neutralize_paddle_hook()
    logger.debug("installed the Executor.run hook")


def uninstall() -> None:
    global _original_run
    from paddle.base.executor import Executor

    if _original_run is None:
        return
    Executor.run = _original_run  # type: ignore[method-assign]
    _original_run = None


def installed() -> bool:
    return _original_run is not None


def paddle_auto_checkpoint(exe, program) -> None:
    """What Paddle's executor calls as ``acp._auto_checkpoint`` (its own hook: dead on 2.6.2-3.3 but for a
    legacy inference path). A no-op while the Executor.run hook is installed (it registered the program
    already); otherwise ``program`` goes to the active range."""
    r = STATE.active
    if r is None or installed():
        return None
    import paddle

    r.on_run(exe, program, paddle.static.global_scope())
    return None


_auto_checkpoint = paddle_auto_checkpoint  # the name Paddle's executor calls


def _neutralize_paddle_hook() -> None:
    """Point Paddle's own (dead, sys.exit-prone) auto-checkpoint call at ours.

    Paddle's executor calls ``paddle.base.executor.acp._auto_checkpoint`` and nothing else of that
    module; ours (:func:`paddle_auto_checkpoint`) is a no-op while the hook above does the work.
    """
    import paddle.base.executor as executor_mod

    if hasattr(executor_mod, "acp"):
        executor_mod.acp = sys.modules[__name__]  # its _auto_checkpoint is paddle_auto_checkpoint
