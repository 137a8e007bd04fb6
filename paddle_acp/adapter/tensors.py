"""Paddle tensors: views of a scope's tensors for a snapshot, and writes of restored ones.

The only code that reads or writes a Paddle tensor's memory; the snapshot types and host buffers are the format's.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Final, Iterable, Iterator, List, Literal, Optional, Sequence, Tuple, Union

import numpy as np

from paddle_acp.errors import CheckpointError
from paddle_acp.format.engine.reader import LoadedCheckpoint
from paddle_acp.format.engine.snapshot import TensorData
from paddle_acp.format.engine.stager import HOST, Stager
from paddle_acp.format.manifest import DTYPES, align

logger = logging.getLogger("paddle_acp")

# Paddle's API is untyped: Any, named for what they are.
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
    """(dtype, shape) of an initialized dense tensor (an unsupported dtype by Paddle's own name)."""
    try:
        dt = dtype_name(tensor)
    except CheckpointError:
        dt = str(tensor._dtype())
    return dt, list(tensor.shape())


NON_TENSOR: Final = "non-tensor"


def scope_var_meta(scope: PaddleScope, name: str) -> Union[None, Literal["non-tensor"], Tuple[str, List[int]]]:
    """What ``scope`` holds as ``name``: None (nothing, or uninitialized), :data:`NON_TENSOR` or (dtype, shape)."""
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
    """A zero-copy NumPy view over a CPU tensor (a copy for other places), valid until Paddle touches it again."""
    dt = dtype_name(tensor)
    shape = tuple(tensor.shape())
    npdt = DTYPES[dt]
    place = tensor._place()
    numel = int(np.prod(shape)) if shape else 1
    if place.is_cpu_place() and numel > 0:
        nbytes = numel * npdt.itemsize
        raw = (ctypes.c_char * nbytes).from_address(tensor._ptr())
        # (a ctypes array has the buffer protocol)
        return dt, np.frombuffer(raw, dtype=npdt).reshape(shape)  # type: ignore[call-overload]
    arr = np.array(tensor)
    if dt == "bfloat16":
        arr = arr.view(np.uint16)
    return dt, np.ascontiguousarray(arr.reshape(shape))


def tensor_nbytes(tensor: PaddleTensor) -> int:
    """The bytes ``tensor`` holds, from its metadata alone (no device-to-host transfer)."""
    shape = tuple(tensor.shape())
    numel = int(np.prod(shape)) if shape else 1
    return numel * DTYPES[dtype_name(tensor)].itemsize


def layout_size(scope: PaddleScope, names: Iterable[str]) -> int:
    """The size of the data file that ``layout()`` gives the named, initialized tensors (metadata only)."""
    return sum(align(tensor_nbytes(t)) for _, t in _found(scope, names))


def tensor_items(scope: PaddleScope, names: Iterable[str]) -> List[Tuple[str, str, Tuple[int, ...], int]]:
    """(name, dtype, shape, bytes) of the named, initialized tensors, from their metadata alone."""
    return [(n, dtype_name(t), tuple(int(x) for x in t.shape()), tensor_nbytes(t)) for n, t in _found(scope, names)]


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


def _found(scope: PaddleScope, names: Iterable[str]) -> Iterator[Tuple[str, PaddleTensor]]:
    """(name, tensor) of the named, initialized tensors."""
    for name in names:
        t = find_tensor(scope, name)
        if t is not None:
            yield name, t


def tensor_views(scope: PaddleScope, names: Iterable[str]) -> List[TensorData]:
    """Zero-copy views of the named, initialized tensors (valid until Paddle runs again)."""
    return [TensorData(name, *tensor_view(t)) for name, t in _found(scope, names)]


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
    """The concrete place (``tensor.set`` takes no generic ``Place``) ``tensor`` lives on; ``default`` (else
    the CPU) for one that holds nothing yet."""
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
    """Replace ``tensor``'s contents with ``arr`` on ``place``; with None, where it lives (:func:`own_place`)."""
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
    """Write program ``key``'s pending tensors of ``loaded`` into ``scope``; returns how many. CPU tensors of the
    same dtype and shape are filled in place (through ``stager``), others replaced; ``consume`` hands them out."""
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
