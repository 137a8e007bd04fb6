"""What a checkpointed variable is (parameter, optimizer state, learning rate), from Paddle's naming,
and where ``paddle.static.save`` would put it (``.pdparams`` or ``.pdopt``)."""

from __future__ import annotations

import re
from typing import Dict, Sequence

_LR_RE = re.compile(r"^(learning_rate(_\d+)?|.*@.*)$")
_ACC_TAIL_RE = re.compile(r"^_[A-Za-z][A-Za-z0-9_]*_\d+$")


def tensor_kinds(names: Sequence[str]) -> Dict[str, str]:
    """name -> "param", "optimizer" or "lr", from Paddle's naming of optimizer variables.

    Paddle names an optimizer accumulator ``<parameter>_<accumulator>_<n>``
    (Adam's ``w_moment1_0``, ``w_beta1_pow_acc_0``, AMP's ``w_fp32_master_0``)
    and the learning-rate variable ``learning_rate_<n>`` ("lr"; counters with
    an '@' count as "lr" too). A variable is optimizer state when it is named
    so after another variable of the same program; everything else (weights,
    biases, batch-norm statistics) is a parameter.
    """
    present = set(names)
    kinds = {}
    for n in names:
        kind = "param"
        if _LR_RE.match(n):
            kind = "lr"
        else:
            for i, ch in enumerate(n):
                if ch == "_" and i and n[:i] in present and _ACC_TAIL_RE.match(n[i:]):
                    kind = "optimizer"
                    break
        kinds[n] = kind
    return kinds


def program_ir(label: str, manifest_ir: str) -> str:
    """The IR of one program: its label starts with it ("pir: 61 ops, ...")."""
    head = label.split(":", 1)[0].strip()
    if head in ("pir", "legacy"):
        return head
    return "legacy" if manifest_ir == "legacy" else "pir"


def export_split(names: Sequence[str], ir: str) -> Dict[str, str]:
    """name -> "pdparams" or "pdopt", as ``paddle.static.save`` splits them.

    Under PIR the learning-rate variable is a parameter (``builtin.parameter``)
    and goes to ``.pdparams``; under the legacy IR it goes to ``.pdopt``.
    """
    out = {}
    for n, kind in tensor_kinds(names).items():
        if kind == "param" or (kind == "lr" and ir == "pir"):
            out[n] = "pdparams"
        else:
            out[n] = "pdopt"
    return out
