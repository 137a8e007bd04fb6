"""Programs (PIR and legacy IR): tell training ones from the rest, list their state, fingerprint them (cached)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any, Callable, Iterator, List, Optional, Tuple

from paddle_acp.errors import AcpError, CheckpointError

logger = logging.getLogger("paddle_acp")

_CACHE_ATTR = "_paddle_acp_info"

#: A paddle.static.Program, a paddle.pir.Program or a CompiledProgram (Paddle's API is untyped).
PaddleProgram = Any


@dataclasses.dataclass
class ProgramInfo:
    """What paddle-acp knows about one program object."""

    is_training: bool
    ir: str  # "pir" or "legacy"
    fingerprint: str = ""
    persistables: Tuple[str, ...] = ()
    label: str = ""
    has_backward: bool = False
    has_optimizer: bool = False
    parallel_ops: Tuple[str, ...] = ()  # see PARALLEL_OPS


# Operators that make a rank's state its own, as Paddle 3.3.1's fleet inserts them (legacy IR op types; PIR:
# "pd_op." + the same, in-place variants end in "_"). Data-parallel all-reduces keep the ranks' state identical.
PARALLEL_OPS = {
    "tensor-parallel": ("c_identity", "c_split", "c_concat", "c_embedding", "mp_allreduce_sum",
                        "c_softmax_with_cross_entropy", "c_softmax_with_multi_label_cross_entropy"),
    "pipeline": ("send_v2", "recv_v2", "partial_send", "partial_recv", "partial_allgather", "p_send", "p_recv"),
    "sharding": ("c_broadcast", "broadcast", "c_reduce_sum", "reduce", "c_reducescatter", "reduce_scatter"),
}
_PARALLEL_BY_NAME = {op: kind for kind, ops in PARALLEL_OPS.items() for op in ops}


def parallel_kind(op_name: str) -> Optional[str]:
    """'tensor-parallel', 'pipeline', 'sharding' or None for one operator name (either IR)."""
    name = op_name[6:] if op_name.startswith("pd_op.") else op_name
    for suffix in ("_grad_", "_grad", "_"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return _PARALLEL_BY_NAME.get(name)


def unwrap(program: PaddleProgram) -> PaddleProgram:
    """Return the underlying Program of a CompiledProgram (or the program itself)."""
    inner = getattr(program, "_program", None)
    if inner is not None and type(program).__name__ == "CompiledProgram":
        return inner
    return program


def _pir_ops(block: Any) -> Iterator[Any]:  # a pir Block; its pir Operations
    """Every op of a block, control-flow bodies (``pd_op.if``/``while`` blocks) included."""
    for op in block.ops:
        yield op
        for sub in op.blocks():
            yield from _pir_ops(sub)


def _pir_is_optimizer_op(op: Any, name: str) -> bool:
    if not name.endswith("_") or name.endswith("_grad_"):
        return False
    try:
        names: List[str] = op.get_input_names()
        return "param" in names
    except (ValueError, RuntimeError, AttributeError):
        return False


def _pir_info(program: PaddleProgram) -> ProgramInfo:
    has_bwd = has_opt = False
    op_names: List[str] = []
    persist: List[Tuple[str, str, str]] = []
    for op in _pir_ops(program.global_block()):
        name = op.name()
        op_names.append(name)
        if name.endswith("_grad") or name.endswith("_grad_"):
            has_bwd = True
        elif _pir_is_optimizer_op(op, name):
            has_opt = True
        if name == "builtin.parameter":
            var = op.str_attr("parameter_name")
            res = op.result(0)
            persist.append((var, str(res.shape), str(res.dtype)))
        elif name == "pd_op.data":
            res = op.result(0)
            if res.persistable:
                persist.append((op.str_attr("name"), str(res.shape), str(res.dtype)))
    return _finish("pir", has_bwd, has_opt, op_names, persist)


def _legacy_info(program: PaddleProgram) -> ProgramInfo:
    from paddle.base import core

    has_bwd = has_opt = False
    op_names: List[str] = []
    for block in program.blocks:
        for op in block.ops:
            op_names.append(op.type)
            if op._is_backward_op():
                has_bwd = True
            if op._is_optimize_op():
                has_opt = True
    skip = {
        core.VarDesc.VarType.FEED_MINIBATCH,
        core.VarDesc.VarType.FETCH_LIST,
        core.VarDesc.VarType.RAW,
        core.VarDesc.VarType.READER,
    }
    persist: List[Tuple[str, str, str]] = []
    for var in program.list_vars():
        if var.persistable and var.type not in skip:
            persist.append((var.name, str(tuple(var.shape)), str(var.dtype)))
    return _finish("legacy", has_bwd, has_opt, op_names, persist)


def _finish(
    ir: str, has_bwd: bool, has_opt: bool, op_names: List[str], persist: List[Tuple[str, str, str]]
) -> ProgramInfo:
    persist = sorted(set(persist))
    h = hashlib.sha256()
    h.update(ir.encode())
    for n in op_names:
        h.update(b"\x00" + n.encode())
    h.update(b"\x01")
    for p in persist:
        h.update(("\x00".join(p) + "\x01").encode())
    names = tuple(dict.fromkeys(p[0] for p in persist))
    label = f"{ir}: {len(op_names)} ops, {len(names)} persistables"
    parallel = tuple(sorted({n for n in op_names if parallel_kind(n) is not None}))
    return ProgramInfo(
        parallel_ops=parallel,
        is_training=has_bwd and has_opt,
        ir=ir,
        fingerprint=h.hexdigest()[:16],
        persistables=names,
        label=label,
        has_backward=has_bwd,
        has_optimizer=has_opt,
    )


def _refuse_unsupported_pir(program: PaddleProgram) -> None:
    """Raise CheckpointError for a PIR program on a Paddle whose PIR paddle-acp does not support (2.6)."""
    from paddle import pir

    if isinstance(program, pir.Program):
        from paddle_acp.adapter.version import pir_refusal

        reason = pir_refusal()
        if reason is not None:
            raise CheckpointError(reason)


def program_info(program: PaddleProgram) -> ProgramInfo:
    """Analyse (once) and return the :class:`ProgramInfo` of a Program/CompiledProgram."""
    program = unwrap(program)
    cached: Optional[ProgramInfo] = getattr(program, _CACHE_ATTR, None)  # set below, by this function only
    if cached is not None:
        return cached
    from paddle.base.framework import Program as LegacyProgram

    if isinstance(program, LegacyProgram):
        info = _legacy_info(program)
    else:
        _refuse_unsupported_pir(program)
        info = _pir_info(program)
    try:
        setattr(program, _CACHE_ATTR, info)
    except (AttributeError, TypeError):
        logger.debug("cannot cache program info on %r", type(program))
    return info


def is_training_program(program: PaddleProgram) -> bool:
    """True when the program has both backward and optimizer ops."""
    try:
        return program_info(program).is_training
    except AcpError:
        raise  # a program paddle-acp cannot checkpoint on this Paddle: never silently skipped
    except Exception as exc:  # an unknown object: not ours to checkpoint
        logger.debug("program detection failed for %r: %s", type(program), exc)
        return False


def lr_scheduler_of(program: PaddleProgram) -> Optional[object]:
    return getattr(unwrap(program), "lr_scheduler", None)


def is_program(obj: object) -> bool:
    """Whether ``obj`` is a legacy-IR or PIR ``Program``, or a ``CompiledProgram`` built from one."""
    import paddle
    from paddle.base.framework import Program as LegacyProgram

    if isinstance(obj, paddle.static.CompiledProgram):
        return unwrap(obj) is not obj
    return isinstance(obj, (LegacyProgram, paddle.pir.Program))


def is_distributed(program: PaddleProgram) -> bool:
    """Whether Paddle marked ``program`` a parameter-server program: its state lives on the servers."""
    return bool(getattr(program, "_is_distributed", False))


def auto_checkpoint_name(program: PaddleProgram) -> Optional[str]:
    """The name Paddle's own auto-checkpoint gave ``program``, or None."""
    name: Optional[str] = getattr(program, "_auto_checkpoint_name", None)
    return name


def persistable_predicate() -> Callable[[Any], bool]:
    """``paddle.static.io.is_persistable``: persistable but not feed, fetch or reader variables."""
    import paddle

    predicate: Callable[[Any], bool] = paddle.static.io.is_persistable
    return predicate
