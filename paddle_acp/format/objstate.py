"""The serialized form of the script's own state (``manifest.extra.objects``), and its validation.

The RNG objects captured from the script's globals and locals and the values it registered
(:mod:`paddle_acp.runtime.capture`, :mod:`paddle_acp.runtime.objects`), stored as JSON data, never pickled::

    extra.objects = {"version": 2,
                     "rng":   {"module_global:rng": {"kind": "numpy.Generator", "value": V}, ...},
                     "state": {"step": {"kind": "state_dict", "value": V}, ...}}

A Generator's / BitGenerator's value is its bit generator's ``state``, plus (version 2) ``"seed_seq"``: its
SeedSequence's ``{"entropy", "spawn_key", "pool_size", "n_children_spawned"}`` (``state`` does not hold the spawn
count); a ``numpy.SeedSequence`` is those four fields. ``extra.epoch_start_objects`` has the same shape. A value ``V``
(:func:`encode`): null, booleans, strings, finite floats, integers below 2**63 and lists as themselves; else one ``$``
key: ``{"$dict": {str: V}}``, ``{"$tuple": [V]}``, ``{"$int": "<decimal>"}``, ``{"$float": "nan"|"inf"|"-inf"}``,
``{"$array": {"dtype", "shape", "data": base64, little-endian}}``, ``{"$scalar": {"dtype", "data"}}``. :func:`validate`
checks a section read back in full (for an RNG: that a fresh object of its kind accepts the state), so that anything
accepted restores without an exception."""

from __future__ import annotations

import base64
import binascii
import math
import random
from typing import Any, Dict, List, Tuple

import numpy as np

from paddle_acp.errors import CorruptCheckpointError

__all__ = [
    "MAX_BYTES", "MAX_DEPTH", "MAX_NAME", "MAX_OBJECTS", "RNG_KINDS", "STATE_KINDS",
    "EncodeError", "apply_rng", "decode", "encode", "read_rng", "validate",
]

VERSION = 2  # 2: seed sequences (version 1 is read too)
VERSIONS = (1, 2)
MAX_OBJECTS = 4096  # named objects in one part ("rng" or "state"); MAX_BYTES bounds them too (~250 bytes a Generator)
MAX_NAME = 512  # characters of an object's name
MAX_BYTES = 1 << 20  # encoded size of all the objects of one checkpoint (the manifest holds them twice at most)
MAX_DEPTH = 24  # JSON nesting of one value (the manifest's 32 levels hold 5 above it)
MAX_INT_DIGITS = 80  # {"$int": ...}: 2**256 has 78 digits
_SMALL_INT = 1 << 63
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128")
RNG_KINDS = ("numpy.Generator", "numpy.BitGenerator", "numpy.RandomState", "random.Random", "numpy.SeedSequence")
STATE_KINDS = ("state_dict", "dict", "list", "ndarray") + RNG_KINDS
_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")
_SEED_SEQ_KEYS = ("entropy", "spawn_key", "pool_size", "n_children_spawned")
MAX_ENTROPY_WORDS = 256  # integers in a seed sequence's entropy list
MAX_SPAWN_DEPTH = 256  # integers in a seed sequence's spawn key (one per spawn level)
MAX_POOL_SIZE = 1024  # a seed sequence's pool size (NumPy's default is 4)


class EncodeError(ValueError):
    """A value that has no serialized form (the message names where in it and its type)."""


def _fail(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"invalid script state in manifest: {msg}")


def encode(v: Any, where: str = "value", depth: int = 1) -> Any:
    """``v`` (nested ``depth`` deep) as JSON data; EncodeError names the part that has none."""
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
        return [encode(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
    if isinstance(v, tuple):
        return {"$tuple": [encode(x, f"{where}[{i}]", depth + 2) for i, x in enumerate(v)]}
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise EncodeError(f"{where}: key {k!r} is a {type(k).__name__}; only string keys can be saved")
            out[k] = encode(x, f"{where}[{k!r}]", depth + 2)
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


def decode(v: Any, where: str = "value", depth: int = 1) -> Any:
    """The Python value of :func:`encode`'s form (untrusted input); CorruptCheckpointError for anything else."""
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
        return [decode(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
    if not isinstance(v, dict) or len(v) != 1:
        raise _fail(f"{where} is not an encoded value")
    tag, body = next(iter(v.items()))
    if tag == "$dict" and isinstance(body, dict):
        return {str(k): decode(x, f"{where}[{k!r}]", depth + 2) for k, x in body.items()}
    if tag == "$tuple" and isinstance(body, list):
        return tuple(decode(x, f"{where}[{i}]", depth + 2) for i, x in enumerate(body))
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


def read_rng(kind: str, obj: Any) -> Any:
    """The state of RNG object ``obj`` of ``kind``, as a Python value ``apply_rng`` takes back."""
    if kind in ("numpy.Generator", "numpy.BitGenerator"):
        bitgen = obj.bit_generator if kind == "numpy.Generator" else obj
        state = dict(bitgen.state)
        seq = getattr(bitgen, "_seed_seq", None)  # (the public ``seed_seq`` is NumPy >= 1.25)
        if isinstance(seq, np.random.SeedSequence):
            state["seed_seq"] = read_seed_seq(seq)
        return state
    if kind == "numpy.RandomState":
        return obj.get_state(legacy=False)
    if kind == "random.Random":
        return obj.getstate()
    if kind == "numpy.SeedSequence":
        return read_seed_seq(obj)
    raise ValueError(f"unknown RNG kind {kind!r}")


def apply_rng(kind: str, obj: Any, state: Any) -> None:
    """Set RNG object ``obj`` of ``kind`` to ``state`` in place (the same object goes on drawing).

    A bit generator's seed sequence gets the saved spawn count when it is the saved one (same entropy, spawn key and
    pool size), else is replaced by the saved one. A ``SeedSequence`` object: ValueError unless it is the saved one (its
    identity cannot be changed in place)."""
    if kind in ("numpy.Generator", "numpy.BitGenerator"):
        bitgen = obj.bit_generator if kind == "numpy.Generator" else obj
        state = dict(state)
        if state.get("bit_generator") != type(bitgen).__name__:  # (before anything changes)
            raise ValueError(f"its bit generator is a {type(bitgen).__name__}, the checkpoint's a "
                             f"{str(state.get('bit_generator'))[:40]}")
        saved_seq = state.pop("seed_seq", None)
        if saved_seq is not None:
            seq = getattr(bitgen, "_seed_seq", None)
            if isinstance(seq, np.random.SeedSequence) and not _seed_seq_differs(seq, saved_seq):
                _set_children(seq, saved_seq["n_children_spawned"])
            else:
                _replace_seed_seq(bitgen, _new_seed_seq(saved_seq))
        bitgen.state = state
    elif kind == "numpy.RandomState":
        obj.set_state(state)
    elif kind == "random.Random":
        version, internal, gauss = state
        obj.setstate((version, tuple(internal), gauss))
    elif kind == "numpy.SeedSequence":
        differ = _seed_seq_differs(obj, state)
        if differ:
            raise ValueError(
                f"the SeedSequence's {' and '.join(differ)} {'differs' if len(differ) == 1 else 'differ'} from the checkpoint's (this run's "
                f"{_short(read_seed_seq(obj), differ)}, the checkpoint's {_short(state, differ)}): it is another "
                "seed sequence than the one saved, and only its spawn count can be restored in place"
            )
        _set_children(obj, state["n_children_spawned"])
    else:
        raise ValueError(f"unknown RNG kind {kind!r}")


def read_seed_seq(seq: Any) -> Dict[str, Any]:
    """A ``numpy.random.SeedSequence`` as plain data: entropy, spawn key, pool size, spawn count."""
    entropy = seq.entropy
    if isinstance(entropy, (int, np.integer)):
        ent: Any = int(entropy)
    else:
        try:
            ent = [int(x) for x in entropy]
        except (TypeError, ValueError):
            raise EncodeError(f"a SeedSequence whose entropy is a {type(entropy).__name__} of other than integers") from None
    return {"entropy": ent, "spawn_key": [int(k) for k in seq.spawn_key], "pool_size": int(seq.pool_size),
            "n_children_spawned": int(seq.n_children_spawned)}


def _seed_seq_differs(seq: Any, saved: Dict[str, Any]) -> List[str]:
    mine = read_seed_seq(seq)
    return [k for k in _SEED_SEQ_KEYS[:3] if mine[k] != saved[k]]


def _short(d: Dict[str, Any], keys: List[str]) -> str:
    return ", ".join(f"{k}={str(d[k])[:48]}" for k in keys)


def _new_seed_seq(saved: Dict[str, Any]) -> Any:
    return np.random.SeedSequence(saved["entropy"], spawn_key=tuple(saved["spawn_key"]), pool_size=saved["pool_size"],
                                  n_children_spawned=saved["n_children_spawned"])


_children_slot: List[int] = []  # the index of n_children_spawned in SeedSequence's pickled state, once found


def _set_children(seq: Any, n: int) -> None:
    """Set ``seq.n_children_spawned`` (read-only from Python) to ``n`` in place: through its pickled state, else by
    spawning the difference."""
    if seq.n_children_spawned == n:
        return
    try:
        if not _children_slot:
            probe = np.random.SeedSequence(0, n_children_spawned=54321).__reduce_cython__()[2]
            _children_slot.extend(i for i, v in enumerate(probe) if type(v) is int and v == 54321)
        state = list(seq.__reduce_cython__()[2])
        if len(_children_slot) == 1 and state[_children_slot[0]] == seq.n_children_spawned:
            state[_children_slot[0]] = n
            seq.__setstate_cython__(tuple(state))
    except (AttributeError, IndexError, TypeError):
        pass  # another NumPy: below
    if seq.n_children_spawned < n <= seq.n_children_spawned + (1 << 16):
        seq.spawn(n - seq.n_children_spawned)  # deterministic: only the count changes
    if seq.n_children_spawned != n:
        raise ValueError(f"cannot set the SeedSequence's spawn count to {n} (it is {seq.n_children_spawned}) "
                         f"on NumPy {np.__version__}")


def _replace_seed_seq(bitgen: Any, seq: Any) -> None:
    """Give ``bitgen`` the seed sequence ``seq`` in place (through its pickled state: NumPy >= 1.25)."""
    if isinstance(bitgen.__getstate__(), tuple):
        bitgen.__setstate__((bitgen.state, seq))
    if getattr(bitgen, "_seed_seq", None) is not seq:
        raise ValueError(f"its {type(bitgen).__name__} was seeded otherwise than the one saved, and NumPy "
                         f"{np.__version__} cannot give it the saved seed sequence (NumPy >= 1.25 can)")


def _check_seed_seq(v: Any) -> None:
    if not isinstance(v, dict) or set(v) != set(_SEED_SEQ_KEYS):
        raise ValueError(f"a seed sequence is not an object with keys {', '.join(_SEED_SEQ_KEYS)}")

    def uint(x: Any, bound: int) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < bound

    ent = v["entropy"]
    if not (uint(ent, 10**MAX_INT_DIGITS) or (isinstance(ent, list) and 0 < len(ent) <= MAX_ENTROPY_WORDS
                                              and all(uint(x, 10**MAX_INT_DIGITS) for x in ent))):
        raise ValueError(f"entropy is not a non-negative integer or a list of at most {MAX_ENTROPY_WORDS} of them")
    key = v["spawn_key"]
    if not (isinstance(key, list) and len(key) <= MAX_SPAWN_DEPTH and all(uint(x, 1 << 64) for x in key)):
        raise ValueError(f"spawn_key is not a list of at most {MAX_SPAWN_DEPTH} non-negative integers")
    if not uint(v["pool_size"], MAX_POOL_SIZE + 1) or not uint(v["n_children_spawned"], 1 << 32):
        raise ValueError(f"pool_size is not an integer of at most {MAX_POOL_SIZE}, or n_children_spawned not below 2**32")
    _new_seed_seq(v)  # NumPy's own checks (a pool size below 4, ...)


def _check_rng_state(kind: str, state: Any, where: str) -> None:
    """A fresh RNG of ``kind`` accepts ``state`` (numpy and random check every field themselves)."""
    try:
        if kind in ("numpy.Generator", "numpy.BitGenerator"):
            name = state.get("bit_generator") if isinstance(state, dict) else None
            if name not in _BIT_GENERATORS:
                raise ValueError(f"bit generator {str(name)[:40]!r} is not one of {', '.join(_BIT_GENERATORS)}")
            if "seed_seq" in state:
                _check_seed_seq(state["seed_seq"])
            fresh: Any = getattr(np.random, name)(0)
            fresh.state = {k: v for k, v in state.items() if k != "seed_seq"}
            if fresh.state["bit_generator"] != name:
                raise ValueError("the state names another bit generator")
        elif kind == "numpy.RandomState":
            np.random.RandomState(0).set_state(state)
        elif kind == "random.Random":
            if not (isinstance(state, tuple) and len(state) == 3 and isinstance(state[1], tuple)):
                raise ValueError("not a (version, internal state, gauss_next) tuple")
            apply_rng(kind, random.Random(), state)
        elif kind == "numpy.SeedSequence":
            _check_seed_seq(state)
        else:
            raise ValueError(f"unknown RNG kind {str(kind)[:40]!r}")
    except CorruptCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 -- numpy/random reject malformed states with many types
        raise _fail(f"{where}: not a valid {kind} state ({type(exc).__name__}: {str(exc)[:200]})") from None


def validate(section: Any, where: str = "manifest.extra.objects") -> Tuple[Dict[str, Tuple[str, Any]], Dict[str, Tuple[str, Any]]]:
    """Check one ``objects`` section read from a manifest; returns ``(rng, state)``, each name -> (kind, value).
    CorruptCheckpointError for anything :func:`encode` and the capture could not have written."""
    if not isinstance(section, dict) or set(section) != {"version", "rng", "state"}:
        raise _fail(f"{where} is not an object with keys version, rng, state")
    if section["version"] not in VERSIONS or isinstance(section["version"], bool):
        raise _fail(f"{where}.version {str(section['version'])[:20]} is not one of {VERSIONS} (written by a newer paddle-acp?)")
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
