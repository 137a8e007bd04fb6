"""The serialized form of the script's own state (``manifest.extra.objects``), and its validation.

A checkpoint holds, besides Paddle's tensors, the state of Python objects the script keeps:
the RNG objects captured from its globals and locals and the values it registered with
``train_epoch_range(state=...)`` / ``paddle_acp.track``
(:mod:`paddle_acp.runtime.capture`, :mod:`paddle_acp.runtime.objects`). They are stored as
plain JSON data in the manifest, never pickled::

    extra.objects = {"version": 1,
                     "rng":   {"module_global:rng": {"kind": "numpy.Generator", "value": V}, ...},
                     "state": {"step": {"kind": "state_dict", "value": V}, ...}}

``extra.epoch_start_objects`` (mid-epoch checkpoints) has the same shape: the state at the
start of the checkpoint's epoch. A value ``V`` is :func:`encode`'s form of a Python value:
``null``, booleans, strings, finite floats and integers below 2**63 in magnitude as
themselves, JSON lists for lists; every other value is an object with one ``$`` key:
``{"$dict": {str: V}}``, ``{"$tuple": [V]}``, ``{"$int": "<decimal>"}`` (larger integers, e.g.
PCG64's 128-bit state), ``{"$float": "nan"|"inf"|"-inf"}``, ``{"$array": {"dtype", "shape",
"data": base64 of the little-endian bytes}}`` and ``{"$scalar": {"dtype", "data"}}`` (NumPy).

:func:`validate` checks a section read from an untrusted manifest in full: bounded sizes,
the encoding, and for every RNG kind that a fresh object of that kind accepts the state, so
that anything accepted restores without an exception.
"""

from __future__ import annotations

import base64
import binascii
import math
import random
from typing import Any, Dict, Tuple

import numpy as np

from paddle_acp.errors import CorruptCheckpointError

__all__ = [
    "MAX_BYTES", "MAX_DEPTH", "MAX_NAME", "MAX_OBJECTS", "RNG_KINDS", "STATE_KINDS",
    "EncodeError", "apply_rng", "decode", "encode", "read_rng", "validate",
]

VERSION = 1
MAX_OBJECTS = 256  # named objects in one section ("rng" or "state")
MAX_NAME = 512  # characters of an object's name
MAX_BYTES = 1 << 20  # encoded size of all the objects of one checkpoint (the manifest holds them twice at most)
MAX_DEPTH = 24  # JSON nesting of one value (the manifest's 32 levels hold 5 above it)
MAX_INT_DIGITS = 80  # {"$int": ...}: 2**256 has 78 digits
_SMALL_INT = 1 << 63
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
RNG_KINDS = ("numpy.Generator", "numpy.BitGenerator", "numpy.RandomState", "random.Random")
STATE_KINDS = ("state_dict", "dict", "list", "ndarray") + RNG_KINDS
_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")


class EncodeError(ValueError):
    """A value that has no serialized form (the message names where in it and its type)."""


def _fail(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"invalid script state in manifest: {msg}")


# -- encoding ------------------------------------------------------------------------------------
def encode(value: Any, where: str = "value") -> Any:
    """``value`` as JSON data (the form above); EncodeError names the part that has none."""
    return _enc(value, where, 1)


def _enc(v: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise EncodeError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    if isinstance(v, np.str_):
        return str(v)
    if isinstance(v, np.generic):  # before float: np.float64 is a float
        a = _array(np.asarray(v), where)
        return {"$scalar": {"dtype": a["dtype"], "data": a["data"]}}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        if -_SMALL_INT < v < _SMALL_INT:
            return int(v)
        s = str(int(v))
        if len(s.lstrip("-")) > MAX_INT_DIGITS:
            raise EncodeError(f"{where}: an integer of more than {MAX_INT_DIGITS} digits")
        return {"$int": s}
    if isinstance(v, float):
        if math.isfinite(v):
            return float(v)
        return {"$float": "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")}
    if isinstance(v, np.ndarray):
        return {"$array": _array(v, where)}
    if isinstance(v, list):
        return [_enc(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
    if isinstance(v, tuple):
        return {"$tuple": [_enc(x, f"{where}[{i}]", depth + 2) for i, x in enumerate(v)]}
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise EncodeError(f"{where}: key {k!r} is a {type(k).__name__}; only string keys can be saved")
            out[k] = _enc(x, f"{where}[{k!r}]", depth + 2)
        return {"$dict": out}
    raise EncodeError(
        f"{where} is a {type(v).__module__}.{type(v).__qualname__}, which paddle-acp cannot save as data "
        "(supported: None, bool, int, float, str, list, tuple, dict with string keys, NumPy arrays and scalars)"
    )


def _array(a: np.ndarray, where: str) -> Dict[str, Any]:
    name = a.dtype.name
    if name not in DTYPES:
        raise EncodeError(f"{where}: a NumPy array of dtype {a.dtype} (supported: {', '.join(DTYPES)})")
    if a.nbytes > MAX_BYTES:
        raise EncodeError(f"{where}: a NumPy array of {a.nbytes} bytes (at most {MAX_BYTES} bytes of script "
                          "state are saved; keep large state in Paddle variables)")
    raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    return {"dtype": name, "shape": [int(s) for s in a.shape], "data": base64.b64encode(raw).decode("ascii")}


# -- decoding (untrusted input) ------------------------------------------------------------------
def decode(data: Any, where: str = "value") -> Any:
    """The Python value of :func:`encode`'s form; CorruptCheckpointError for anything else."""
    return _dec(data, where, 1)


def _dec(v: Any, where: str, depth: int) -> Any:
    if depth > MAX_DEPTH + 2:
        raise _fail(f"{where} is nested too deep")
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        if not -_SMALL_INT < v < _SMALL_INT:
            raise _fail(f"{where}: integer {v} is out of range (larger ones are written as $int)")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _fail(f"{where}: a non-finite number")
        return v
    if isinstance(v, list):
        return [_dec(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
    if not isinstance(v, dict) or len(v) != 1:
        raise _fail(f"{where} is not an encoded value")
    tag, body = next(iter(v.items()))
    if tag == "$dict" and isinstance(body, dict):
        return {str(k): _dec(x, f"{where}[{k!r}]", depth + 2) for k, x in body.items()}
    if tag == "$tuple" and isinstance(body, list):
        return tuple(_dec(x, f"{where}[{i}]", depth + 2) for i, x in enumerate(body))
    if tag == "$int" and isinstance(body, str):
        digits = body[1:] if body.startswith("-") else body
        if not (digits.isascii() and digits.isdigit() and 0 < len(digits) <= MAX_INT_DIGITS):
            raise _fail(f"{where}: $int {body[:40]!r} is not an integer of at most {MAX_INT_DIGITS} digits")
        return int(body)
    if tag == "$float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "$array" and isinstance(body, dict):
        return _dec_array(body, where, scalar=False)
    if tag == "$scalar" and isinstance(body, dict):
        return _dec_array(body, where, scalar=True)[()]
    raise _fail(f"{where}: unknown or malformed tag {str(tag)[:40]!r}")


def _dec_array(body: Dict[str, Any], where: str, scalar: bool) -> np.ndarray:
    keys = {"dtype", "data"} if scalar else {"dtype", "shape", "data"}
    if set(body) != keys:
        raise _fail(f"{where}: an array has keys {sorted(map(str, body))[:8]}, not {sorted(keys)}")
    dtype, data = body["dtype"], body["data"]
    shape = [] if scalar else body["shape"]
    if dtype not in DTYPES:
        raise _fail(f"{where}: dtype {str(dtype)[:40]!r} is not one of {', '.join(DTYPES)}")
    if not (isinstance(shape, list) and len(shape) <= 16
            and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_BYTES for s in shape)):
        raise _fail(f"{where}: shape is not a list of at most 16 sizes")
    if not isinstance(data, str) or len(data) > 2 * MAX_BYTES:
        raise _fail(f"{where}: array data is not base64 text of at most {MAX_BYTES} bytes")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise _fail(f"{where}: array data is not base64") from None
    dt = np.dtype(dtype).newbyteorder("<")
    count = math.prod(shape)
    if count * dt.itemsize != len(raw):
        raise _fail(f"{where}: {len(raw)} bytes of data for a {dtype} array of shape {shape}")
    return np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="), copy=True).reshape(shape)


# -- RNG objects ---------------------------------------------------------------------------------
def read_rng(kind: str, obj: Any) -> Any:
    """The state of RNG object ``obj`` of ``kind``, as a Python value ``apply_rng`` takes back."""
    if kind == "numpy.Generator":
        return obj.bit_generator.state
    if kind == "numpy.BitGenerator":
        return obj.state
    if kind == "numpy.RandomState":
        return obj.get_state(legacy=False)
    if kind == "random.Random":
        return obj.getstate()
    raise ValueError(f"unknown RNG kind {kind!r}")


def apply_rng(kind: str, obj: Any, state: Any) -> None:
    """Set RNG object ``obj`` of ``kind`` to ``state`` in place (the same object goes on drawing)."""
    if kind == "numpy.Generator":
        obj.bit_generator.state = state
    elif kind == "numpy.BitGenerator":
        obj.state = state
    elif kind == "numpy.RandomState":
        obj.set_state(state)
    elif kind == "random.Random":
        version, internal, gauss = state
        obj.setstate((version, tuple(internal), gauss))
    else:
        raise ValueError(f"unknown RNG kind {kind!r}")


def _check_rng_state(kind: str, state: Any, where: str) -> None:
    """A fresh RNG of ``kind`` accepts ``state`` (numpy and random check every field themselves)."""
    try:
        if kind in ("numpy.Generator", "numpy.BitGenerator"):
            name = state.get("bit_generator") if isinstance(state, dict) else None
            if name not in _BIT_GENERATORS:
                raise ValueError(f"bit generator {str(name)[:40]!r} is not one of {', '.join(_BIT_GENERATORS)}")
            fresh: Any = getattr(np.random, name)(0)
            fresh.state = state
            if fresh.state["bit_generator"] != name:
                raise ValueError("the state names another bit generator")
        elif kind == "numpy.RandomState":
            np.random.RandomState(0).set_state(state)
        elif kind == "random.Random":
            if not (isinstance(state, tuple) and len(state) == 3 and isinstance(state[1], tuple)):
                raise ValueError("not a (version, internal state, gauss_next) tuple")
            apply_rng(kind, random.Random(), state)
        else:
            raise ValueError(f"unknown RNG kind {str(kind)[:40]!r}")
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 -- numpy/random reject malformed states with many types
        raise _fail(f"{where}: not a valid {kind} state ({type(exc).__name__}: {str(exc)[:200]})") from None


# -- a section as a whole ------------------------------------------------------------------------
def validate(section: Any, where: str = "manifest.extra.objects") -> Tuple[Dict[str, Tuple[str, Any]], Dict[str, Tuple[str, Any]]]:
    """Check one ``objects`` section read from a manifest; returns ``(rng, state)``, each a dict
    name -> (kind, decoded value). Raises CorruptCheckpointError for anything :func:`encode` and
    the capture could not have written."""
    if not isinstance(section, dict) or set(section) != {"version", "rng", "state"}:
        raise _fail(f"{where} is not an object with keys version, rng, state")
    if section["version"] != VERSION or isinstance(section["version"], bool):
        raise _fail(f"{where}.version {str(section['version'])[:20]} is not {VERSION} (written by a newer paddle-acp?)")
    out = []
    for part, kinds in (("rng", RNG_KINDS), ("state", STATE_KINDS)):
        objs = section[part]
        if not isinstance(objs, dict) or len(objs) > MAX_OBJECTS:
            raise _fail(f"{where}.{part} is not an object of at most {MAX_OBJECTS} entries")
        got: Dict[str, Tuple[str, Any]] = {}
        for name, entry in objs.items():
            w = f"{where}.{part}[{name[:80]!r}]"
            if not name or len(name) > MAX_NAME or not name.isprintable():
                raise _fail(f"{w}: the name is empty, longer than {MAX_NAME} characters or not printable")
            if not isinstance(entry, dict) or set(entry) != {"kind", "value"} or entry["kind"] not in kinds:
                raise _fail(f"{w} is not {{kind, value}} with kind one of {', '.join(kinds)}")
            value = decode(entry["value"], w)
            if entry["kind"] in RNG_KINDS:
                _check_rng_state(entry["kind"], value, w)
            got[name] = (entry["kind"], value)
        out.append(got)
    return out[0], out[1]
