"""Per-epoch digests for ``paddle-acp check``: what the hook sees at every epoch end, written to a file.

Active only when ``PADDLE_ACP_CHECK_DIGESTS`` names a file. Each epoch appends a ``start`` record and an
``epoch`` record: ``tensors`` (a digest of every persistable of every registered program), ``fetched`` (a digest
of each value fetched from ``Executor.run`` over the epoch), ``scalars`` (the numbers held by the script's globals
and the locals of the frame that opened the range, and by the attributes of objects of the script's own
classes), ``uncaptured`` (objects there whose state paddle-acp does not checkpoint), ``resumed_mid_epoch`` and ``left_early`` (the loop was left inside the epoch). ``save`` and ``kill``
records mark a mid-epoch checkpoint and the kill point (:mod:`~paddle_acp.runtime.check_kill`). Rank k > 0
writes to the file's name + ``.rank<k>``. One JSON object a line, flushed at once (the process may be killed).
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import io
import itertools
import json
import logging
import os
import random
import sys
import time
import types
from typing import Any, Dict, Iterator, List, Optional, Protocol, Tuple

import numpy as np

from paddle_acp.runtime.capture import capturable
from paddle_acp.runtime.check_kill import KillPoint
from paddle_acp.runtime.registry import Registry

logger = logging.getLogger("paddle_acp")

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIP_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type, types.MethodType)


def _digest(arr: np.ndarray) -> str:
    a = np.ascontiguousarray(arr)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()[:16]


def uncaptured_kind(obj: Any) -> Optional[str]:
    """What state ``obj`` holds that paddle-acp does not checkpoint (``None``: nothing known)."""
    if isinstance(obj, (bool, io.IOBase)) or capturable(obj):
        return None  # (an open file is not training state, though it iterates its lines)
    if isinstance(obj, (random.Random, np.random.RandomState, np.random.Generator)):
        return f"RNG object ({type(obj).__module__}.{type(obj).__name__})"
    if isinstance(obj, types.GeneratorType):
        if obj.gi_code.co_filename.startswith(_PACKAGE_DIR):
            return None  # paddle-acp's own (``resumable``: its position is checkpointed)
        return "generator"
    if isinstance(obj, itertools.count):
        return "counter (itertools.count)"
    try:
        if hasattr(obj, "__next__") and iter(obj) is obj:
            return "iterator"
    except Exception:
        return None
    return None


def _name_of(var: Any) -> Optional[str]:
    try:  # a PIR value computed by an op has no name (Paddle raises)
        return getattr(var, "name", None)
    except Exception:
        return None


def _visible(name: str, value: Any) -> bool:
    return not (name.startswith("__") or isinstance(value, _SKIP_TYPES))


_MAX_ITEMS = 64  # a container holding more is not looked into (a dataset, not a counter)
_MAX_NUMBERS = 4096  # numbers read per epoch end, at most


def _script_own(obj: Any) -> bool:
    """Whether ``obj``'s class (or ``obj``, a class or function) is the script's own (defined in ``__main__``)."""
    named = isinstance(obj, (type, types.FunctionType)) or hasattr(obj, "__wrapped__")  # (a decorated function)
    return getattr(obj if named else type(obj), "__module__", None) == "__main__"


def _inside(obj: Any) -> List[Tuple[str, Any]]:
    """(key suffix, value) one level inside ``obj``: a small dict, list, tuple or deque's items; the attributes of
    an object or class of the script's own (or a ``SimpleNamespace``); a script function's closure cells, and
    the size of its ``lru_cache``."""
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in obj.items() if isinstance(k, (str, int))] if len(obj) <= _MAX_ITEMS else []
    if isinstance(obj, (list, tuple, collections.deque)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)] if len(obj) <= _MAX_ITEMS else []
    if not (_script_own(obj) or isinstance(obj, types.SimpleNamespace)):
        return []
    out: List[Tuple[str, Any]] = []
    if isinstance(obj, types.FunctionType) or hasattr(obj, "cache_info"):
        fn = getattr(obj, "__wrapped__", obj)
        cells = zip(fn.__code__.co_freevars, fn.__closure__ or ()) if isinstance(fn, types.FunctionType) else ()
        out += [(f".<closure {n}>", c.cell_contents) for n, c in cells if c.cell_contents is not obj]
        if hasattr(obj, "cache_info"):
            out.append((".cache_info().currsize", obj.cache_info().currsize))
        return out
    attrs = getattr(obj, "__dict__", None)
    return out + [(f".{k}", v) for k, v in dict(attrs).items() if not k.startswith("__")] if attrs is not None else out


def _numbers(scalars: Dict[str, Any], key: str, value: Any, depth: int = 3) -> None:
    """Record the numbers ``value`` holds, itself or up to ``depth`` levels inside (:func:`_inside`)."""
    if len(scalars) >= _MAX_NUMBERS:
        return
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        v = value.item() if isinstance(value, np.generic) else value
        scalars[key] = v if not isinstance(v, float) or np.isfinite(v) else repr(v)
        return
    if depth > 0:
        try:
            inner = _inside(value)
        except Exception:  # an object whose look-inside raises: nothing of it is read
            return
        for suffix, v in inner:
            _numbers(scalars, key + suffix, v, depth - 1)


class DigestedRange(Protocol):
    """What the digests read of a range (:class:`paddle_acp.runtime.range.EpochRange` imports this module)."""

    @property
    def name(self) -> str: ...

    @property
    def registry(self) -> Registry: ...


class EpochDigests:
    """The digests of one range's epochs, appended to ``path``."""

    def __init__(self, path: str, frame: Optional[types.FrameType], rank: int = 0) -> None:
        self.path = path if rank == 0 else f"{path}.rank{rank}"  # one file per rank: one writer each
        self.rank = rank
        self.kill: Optional[KillPoint] = None  # paddle-acp check's kill point (runtime.check_kill)
        self._range = ""
        self._frame = frame  # the frame that opened the range (None: module level)
        self._fetched: Dict[str, hashlib._Hash] = {}  # fetched value's label -> the digest so far
        self._fetch_runs = 0
        self._started = 0.0

    @classmethod
    def for_range(cls, path: Optional[str], rank: int = 0) -> Optional["EpochDigests"]:
        """The digests of a range opened now (None: no check runs); ``rank``: this process's trainer id."""
        if path is None:
            return None
        frame = inspect.currentframe()
        while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("paddle_acp", "paddle"):
            frame = frame.f_back
        if frame is not None and frame.f_code.co_name == "<module>":
            frame = None  # the script's globals are read anyway
        return cls(path, frame, rank)

    def _write(self, record: Dict[str, Any]) -> None:
        record["rank"] = self.rank
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
                f.flush()
        except OSError as exc:
            logger.warning("paddle-acp check: cannot write the epoch digests to %s: %s", self.path, exc)

    def start_epoch(self, range_name: str, epoch: int, resumed_mid_epoch: bool) -> None:
        self._fetched = {}
        self._fetch_runs = 0
        self._started = time.time()
        self._range = range_name
        self._write({"kind": "start", "range": range_name, "epoch": epoch, "pid": os.getpid(),
                     "time": self._started, "resumed_mid_epoch": resumed_mid_epoch})

    def on_fetch(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], result: Any) -> None:
        """The values one Executor.run returned (called by the hook after the run, with its arguments)."""
        if result is None:
            return
        fetch_list = kwargs.get("fetch_list", args[2] if len(args) > 2 else None)
        values = result if isinstance(result, (list, tuple)) else [result]
        names: List[Any] = list(fetch_list) if isinstance(fetch_list, (list, tuple)) else []
        self._fetch_runs += 1
        for i, v in enumerate(values):
            n = names[i] if i < len(names) else None
            label = n if isinstance(n, str) else _name_of(n)
            if not isinstance(label, str) or not label:
                label = f"fetch[{i}]"
            try:
                arr = np.asarray(v)
            except Exception:
                continue
            h = self._fetched.get(label)
            if h is None:
                h = self._fetched[label] = hashlib.sha256()
            h.update(f"{arr.dtype.str}{arr.shape}".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
        if self.kill is not None:
            self.kill.after_run(self._fetch_runs)

    def note(self, record: Dict[str, Any]) -> None:
        """Append a record of this range at the current epoch (a kill, a mid-epoch save)."""
        self._write({"range": self._range, "pid": os.getpid(), "time": time.time(), **record})

    def end_epoch(self, r: DigestedRange, epoch: int, resumed_mid_epoch: bool, left: bool = False) -> None:
        """Append the epoch's record (``left``: the loop was left inside the epoch). Never raises."""
        try:
            self._end_epoch(r, epoch, resumed_mid_epoch, left)
        except Exception as exc:  # a digest is a diagnosis: it never breaks the training it watches
            logger.warning("paddle-acp check: cannot digest epoch %d of range %s: %s", epoch, r.name, exc)

    def _end_epoch(self, r: DigestedRange, epoch: int, resumed_mid_epoch: bool, left: bool) -> None:
        from paddle_acp.adapter.tensors import tensor_views

        tensors: Dict[str, str] = {}
        entries = list(r.registry.entries)
        for e in entries:
            prefix = f"{e.key}/" if len(entries) > 1 else ""
            for t in tensor_views(e.scope, e.info.persistables):
                tensors[prefix + t.name] = _digest(t.array)
        scalars: Dict[str, Any] = {}
        uncaptured: Dict[str, str] = {}
        for where, names in self._namespaces():
            for name, value in names.items():
                key = f"{where}{name}"
                if name.startswith("__"):
                    continue
                _numbers(scalars, key, value)  # a counter in a dict, a list, a closure, an object of the script's
                if not _visible(name, value):
                    continue
                kind = uncaptured_kind(value)
                if kind is not None:
                    uncaptured[key] = f"{kind}: {type(value).__module__}.{type(value).__qualname__}"
        self._write({"kind": "epoch", "range": r.name, "epoch": epoch, "pid": os.getpid(), "time": time.time(),
                     "seconds": time.time() - self._started, "tensors": tensors,
                     "fetched": {k: h.hexdigest()[:16] for k, h in self._fetched.items()},
                     "fetch_runs": self._fetch_runs, "scalars": scalars, "uncaptured": uncaptured,
                     "resumed_mid_epoch": resumed_mid_epoch, "left_early": left})

    def _namespaces(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """(label prefix, names -> the script's objects) of the script's globals and the range's frame."""
        main = sys.modules.get("__main__")
        if main is not None:
            yield "", dict(vars(main))
        if self._frame is not None:
            yield f"{self._frame.f_code.co_name}().", dict(self._frame.f_locals)

    def release(self) -> None:
        """The range ended: keep no reference to the script's frame (and its locals)."""
        self._frame = None
