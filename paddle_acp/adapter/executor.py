"""Executor: Paddle's ``Executor.run`` (the method paddle-acp's hook replaces) and Paddle's own auto-checkpoint call.

The only code that reaches into ``paddle.base.executor``; the hook's logic is :mod:`paddle_acp.runtime.hook`'s.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

#: ``Executor.run(self, program, feed, fetch_list, ...)``: Paddle's API is untyped.
RunMethod = Callable[..., Any]


def executor_run() -> RunMethod:
    """The ``run`` method ``Executor`` has now (Paddle's, or a patch)."""
    from paddle.base.executor import Executor

    run: RunMethod = Executor.run
    return run


def set_executor_run(run: RunMethod) -> None:
    """Make ``run`` the ``run`` method of every ``Executor`` (a patch, or Paddle's put back)."""
    from paddle.base.executor import Executor

    Executor.run = run


def redirect_auto_checkpoint(module: ModuleType) -> None:
    """Point ``paddle.base.executor.acp`` (Paddle's auto-checkpoint call), where the executor has one, at ``module``."""
    import paddle.base.executor as executor_mod

    if hasattr(executor_mod, "acp"):
        executor_mod.acp = module


def executor_place(exe: Any) -> Any:
    """The place ``exe`` (a ``paddle.static.Executor``) runs its programs on; None for an object without one."""
    return getattr(exe, "place", None)
