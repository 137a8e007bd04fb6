"""What the installed Paddle supports, for the tests (they run on every Paddle of the matrix).

* ``IRS``: the IRs paddle-acp supports on this Paddle: both on 3.x, the legacy IR only on 2.6
  (PIR programs are refused there; tests/e2e/test_paddle_version.py checks that refusal on 2.6);
* ``CARRIES_CPU_RNG``: whether the CPU generator's engine state survives a restart (3.x);
* ``legacy_ir_guard()``: enter the legacy IR in-process (``paddle.pir_utils.OldIrGuard`` on 3.x;
  2.6 has no such guard because the legacy IR is its default).
"""
import contextlib

import paddle

VERSION = paddle.__version__
MAJOR = 3 if VERSION.startswith("0.0.0") else int(VERSION.split(".")[0])
PIR_SUPPORTED = MAJOR >= 3
IRS = ("pir", "legacy") if PIR_SUPPORTED else ("legacy",)
CARRIES_CPU_RNG = MAJOR >= 3


def legacy_ir_guard():
    """A context manager that selects the legacy IR for building and running programs."""
    guard = getattr(paddle.pir_utils, "OldIrGuard", None)
    if guard is not None:
        return guard()
    if paddle.framework.in_pir_mode():
        raise RuntimeError("Paddle %s has no OldIrGuard and is in PIR mode: unset FLAGS_enable_pir_api" % VERSION)
    return contextlib.nullcontext()
