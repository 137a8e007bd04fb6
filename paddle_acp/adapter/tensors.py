"""Paddle tensors: views of a scope's tensors for a snapshot, and writes of restored ones.

The only code that reads or writes a Paddle tensor's memory. The snapshot
types (:class:`~paddle_acp.format.engine.snapshot.TensorData`, ``ProgramSnapshot``)
are the format's; host buffers are :mod:`paddle_acp.format.engine.arena`'s.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Final, Iterable, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np

from paddle_acp.errors import CheckpointError
from paddle_acp.format.engine.reader import LoadedCheckpoint
from paddle_acp.format.engine.snapshot import TensorData
from paddle_acp.format.engine.stager import HOST, Stager
from paddle_acp.format.manifest import DTYPES, align

logger = logging.getLogger("paddle_acp")

# Paddle's API is untyped: its objects are Any at this boundary, named for what they are.
PaddleTensor = Any  # a core DenseTensor (LoDTensor) of a scope variable
PaddleScope = Any  # a core Scope
PaddlePlace = Any  # a core Place or a concrete paddle.CPUPlace/CUDAPlace/...


def dtype_name(tensor: PaddleTensor) -> str:
    name = str(tensor._dtype())
    name = name.split(".")[-1].lower()
    if name not in DTYPES:
        raise CheckpointError(f"tensor dtype {tensor._dtype()} is not supported by paddle-acp")
    return name


def tensor_meta(tensor: PaddleTensor) -> Tuple[str, List[int]]:
    """(dtype, shape) of an initialized dense tensor; a dtype paddle-acp does not save by Paddle's own name."""
    try:
        dt = dtype_name(tensor)
    except CheckpointError:
        dt = str(tensor._dtype())
    return dt, list(tensor.shape())


NON_TENSOR: Final = "non-tensor"


def scope_var_meta(scope: PaddleScope, name: str) -> Union[None, Literal["non-tensor"], Tuple[str, List[int]]]:
    """What ``scope`` holds under ``name``: None (nothing, or a tensor not initialized), :data:`NON_TENSOR`
    (a variable that is not a dense tensor: a reader, a list), else the tensor's (dtype, shape)."""
    var = scope.find_var(name)
    if var is None:
        return None
    try:
        tensor = var.get_tensor()
    except Exception:  # not a dense tensor (a reader, a list): the program differs
        return NON_TENSOR
    return tensor_meta(tensor) if tensor._is_initialized() else None


def default_place() -> PaddlePlace:
    """The device Paddle puts a new tensor on (as the executor would)."""
    from paddle.base import framework

    return framework._current_expected_place_()


def tensor_view(tensor: PaddleTensor) -> Tuple[str, np.ndarray]:
    """A zero-copy NumPy view over a CPU tensor (a copy for other places).

    The view is valid only until Paddle touches the tensor again: copy it out
    before returning control to the training loop.
    """
    dt = dtype_name(tensor)
    shape = tuple(tensor.shape())
    npdt = DTYPES[dt]
    place = tensor._place()
    numel = int(np.prod(shape)) if shape else 1
    if place.is_cpu_place() and numel > 0:
        nbytes = numel * npdt.itemsize
        raw = (ctypes.c_char * nbytes).from_address(tensor._ptr())
        return dt, np.frombuffer(raw, dtype=npdt).reshape(shape)  # type: ignore[call-overload]  # a ctypes array has the buffer protocol
    arr = np.array(tensor)
    if dt == "bfloat16":
        arr = arr.view(np.uint16)
    return dt, np.ascontiguousarray(arr.reshape(shape))


def tensor_nbytes(tensor: PaddleTensor) -> int:
    """The bytes ``tensor`` holds, from its metadata alone (element count and dtype): no copy,
    and on an accelerator no device-to-host transfer."""
    shape = tuple(tensor.shape())
    numel = int(np.prod(shape)) if shape else 1
    return numel * DTYPES[dtype_name(tensor)].itemsize


def layout_size(scope: PaddleScope, names: Iterable[str]) -> int:
    """The size of the data file that ``layout()`` gives the named, initialized tensors (metadata only)."""
    total = 0
    for name in names:
        t = find_tensor(scope, name)
        if t is not None:
            total += align(tensor_nbytes(t))
    return total


def tensor_items(scope: PaddleScope, names: Iterable[str]) -> List[Tuple[str, str, Tuple[int, ...], int]]:
    """(name, dtype, shape, bytes) of the named, initialized tensors, from their metadata alone (what
    :func:`tensor_views` would give, without a view or, on an accelerator, a device-to-host copy)."""
    out: List[Tuple[str, str, Tuple[int, ...], int]] = []
    for name in names:
        t = find_tensor(scope, name)
        if t is not None:
            out.append((name, dtype_name(t), tuple(int(x) for x in t.shape()), tensor_nbytes(t)))
    return out


def find_tensor(scope: PaddleScope, name: str) -> Optional[PaddleTensor]:
    var = scope.find_var(name)
    if var is None:
        return None
    try:
        t = var.get_tensor()
    except Exception:  # not a dense tensor (reader, raw, ...)
        return None
    if not t._is_initialized():
        return None
    return t


def tensor_views(scope: PaddleScope, names: Iterable[str]) -> List[TensorData]:
    """Zero-copy views of the named, initialized tensors (valid until Paddle runs again)."""
    out: List[TensorData] = []
    for name in names:
        t = find_tensor(scope, name)
        if t is None:
            continue
        dt, view = tensor_view(t)
        out.append(TensorData(name, dt, view))
    return out


def inplace_view(tensor: PaddleTensor, dtype: str, shape: Sequence[int]) -> Optional[np.ndarray]:
    """A writable view of ``tensor`` when it already holds ``dtype``/``shape`` on the CPU, else None."""
    if not tensor._is_initialized() or not tensor._place().is_cpu_place():
        return None
    try:
        cur_dt, view = tensor_view(tensor)
    except CheckpointError:
        return None
    if cur_dt != dtype or view.shape != tuple(shape) or view.size == 0:
        return None
    return view


def scope_tensor(scope: PaddleScope, name: str) -> PaddleTensor:
    var = scope.find_var(name)
    if var is None:
        var = scope.var(name)
    return var.get_tensor()


def own_place(tensor: PaddleTensor, default: Optional[PaddlePlace] = None) -> PaddlePlace:
    """The concrete place (``tensor.set`` takes no generic ``Place``) ``tensor`` lives on now;
    ``default`` (the CPU if None) for a tensor that holds nothing yet."""
    import paddle

    if not tensor._is_initialized():
        return paddle.CPUPlace() if default is None else default
    p = tensor._place()
    if p.is_gpu_place():
        return paddle.CUDAPlace(p.gpu_device_id())
    if p.is_cuda_pinned_place():
        return paddle.CUDAPinnedPlace()
    if p.is_xpu_place():
        return paddle.XPUPlace(p.xpu_device_id())
    if p.is_custom_place():
        return paddle.CustomPlace(p.custom_device_type(), p.custom_device_id())
    if p.is_ipu_place():
        return paddle.IPUPlace()
    return paddle.CPUPlace()


def set_tensor(
    tensor: PaddleTensor, arr: np.ndarray, place: Optional[PaddlePlace], default_place: Optional[PaddlePlace] = None
) -> None:
    """Replace ``tensor``'s contents with ``arr`` on ``place`` (the executor's); with None, on the
    place the tensor lives on now (``default_place``, else the CPU, for one that holds nothing yet)."""
    if place is None:
        place = own_place(tensor, default_place)
    tensor.set(arr, place)


def write_program(
    loaded: LoadedCheckpoint,
    key: str,
    scope: PaddleScope,
    place: Optional[PaddlePlace],
    consume: bool = True,
    default_place: Optional[PaddlePlace] = None,
    stager: Stager = HOST,
) -> int:
    """Write program ``key``'s pending tensors of ``loaded`` into ``scope``; returns how many.

    Tensors the scope already holds with the same dtype and shape on the CPU
    are filled in place (copied straight into them through ``stager``, the runtime's, which a save's
    copy into the snapshot arena goes through too); others are replaced (``tensor.set``).
    With ``consume`` they are handed out (no longer pending).
    """
    pending = loaded.pending(key)
    inplace = []
    for t in pending:
        tensor = scope_tensor(scope, t.name)
        view = inplace_view(tensor, t.dtype, t.shape)
        if view is not None:
            inplace.append((key, t, view))
        else:
            set_tensor(tensor, loaded.read(key, t), place, default_place)
    if inplace:
        loaded.read_into(inplace, stager)
    if consume:
        for t in pending:
            loaded.hand_out((key, t.name))
    return len(pending)
