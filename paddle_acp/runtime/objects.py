"""The script's own state in a range's checkpoints: captured RNGs, ``state=`` and ``track`` objects.

:class:`ScriptState` holds one range's captured RNG objects (:mod:`paddle_acp.runtime.capture`) and registered
objects; it captures their state in the serialized form of :mod:`paddle_acp.format.objstate` (the manifest's
``extra``) and restores a checkpoint's into the same objects. Registered objects (checked when the loop opens):
anything with ``state_dict()``/``set_state_dict(state)`` of plain data (restored into what ``state_dict()``
returns, so containers it hands out keep their identity; :class:`~paddle_acp.runtime.values.Value`), a ``dict``
or ``list`` of plain data (restored in place, :func:`paddle_acp.runtime.inplace.restore_into`), a NumPy array
(same shape and dtype), or an RNG object. A bare ``int``/``float`` cannot be restored in place.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from paddle_acp.errors import CheckpointError, ConfigError, CorruptCheckpointError
from paddle_acp.format import objstate
from paddle_acp.runtime.capture import MISSING, Site, rng_kind
from paddle_acp.runtime.inplace import restore_into
from paddle_acp.runtime.state import STATE

logger = logging.getLogger("paddle_acp")

__all__ = ["ScriptState", "check_state", "track", "tracked"]

_IMMUTABLE = (bool, int, float, complex, str, bytes, tuple, frozenset, type(None), np.generic)


def kind_of(name: str, obj: Any) -> str:
    """The kind (``objstate.STATE_KINDS``) ``obj`` is saved as; ConfigError when it cannot be restored in place."""
    if not isinstance(name, str) or not name or len(name) > objstate.MAX_NAME or not name.isprintable():
        raise ConfigError(f"state name {name!r} must be a non-empty printable string of at most {objstate.MAX_NAME} characters")
    what = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "set_state_dict", None)):
        return "state_dict"
    kind = rng_kind(obj)
    if kind is not None:
        return kind
    if type(obj) is dict or isinstance(obj, dict):
        return "dict"
    if isinstance(obj, list):
        return "list"
    if isinstance(obj, np.ndarray):
        if not obj.flags.writeable:
            raise ConfigError(f"state {name!r}: the NumPy array is read-only, so it cannot be restored in place")
        return "ndarray"
    if isinstance(obj, _IMMUTABLE):
        raise ConfigError(
            f"state {name!r} is a {what}, which cannot be restored in place (the name would still point at the "
            f"old value): hold it in paddle_acp.Counter(...) (integers) or paddle_acp.Value(...) (anything else), "
            f"or keep it in a dict, and pass that"
        )
    raise ConfigError(
        f"state {name!r} is a {what}, which paddle-acp cannot save: pass an object with state_dict() and "
        "set_state_dict() (e.g. a paddle.optimizer.lr scheduler), a dict or list of plain data, a NumPy array, "
        "an RNG, or a paddle_acp.Counter / Value"
    )


def read(kind: str, obj: Any) -> Any:
    """The Python value saved for ``obj`` of ``kind``."""
    if kind == "state_dict":
        return obj.state_dict()
    if kind in objstate.RNG_KINDS:
        return objstate.read_rng(kind, obj)
    return obj  # dict, list, ndarray: the object's content


def check_state(state: Optional[Mapping[str, Any]]) -> Dict[str, Tuple[str, Any]]:
    """``train_epoch_range``'s ``state=``: name -> (kind, object); ConfigError for anything that cannot be saved."""
    if state is None:
        return {}
    if not isinstance(state, Mapping):
        raise ConfigError(f"state= must be a dict of name -> object, not a {type(state).__name__}")
    if len(state) > objstate.MAX_OBJECTS:
        raise ConfigError(f"state= holds {len(state)} objects; at most {objstate.MAX_OBJECTS}")
    out = {}
    size = 0
    for name, obj in state.items():
        kind = kind_of(name, obj)
        try:
            size += len(json.dumps(objstate.encode(read(kind, obj), f"state {name!r}"), separators=(",", ":")))
        except objstate.EncodeError as exc:
            raise ConfigError(f"cannot checkpoint {exc}") from None
        out[name] = (kind, obj)
    if size > objstate.MAX_BYTES:
        raise ConfigError(f"the state of {', '.join(map(repr, out))} takes {size} bytes serialized, more than the "
                          f"{objstate.MAX_BYTES} paddle-acp saves in a manifest; keep large state (arrays) in Paddle variables")
    return out


def track(name: str, obj: Any) -> Any:
    """Save ``obj`` under ``name`` with every checkpoint of the ranges opened after this call, and restore it in
    place before a resumed run's first epoch (``state=`` for every range). Returns ``obj``."""
    if STATE.active is not None:
        raise ConfigError(f"paddle_acp.track({name!r}, ...) inside the active range {STATE.active.name}: call it "
                          "before train_epoch_range, so that the object is restored before the first epoch")
    STATE.tracked.update(check_state({name: obj}))
    return obj


def tracked() -> Dict[str, Tuple[str, Any]]:
    """The objects :func:`track` registered (name -> (kind, object)); cleared by a restart."""
    return STATE.tracked


def _describe(kind: str, obj: Any) -> str:
    if kind in ("numpy.Generator",):
        return f"{kind}[{type(obj.bit_generator).__name__}]"
    if kind == "numpy.BitGenerator":
        return f"{kind}[{type(obj).__name__}]"
    if kind == "state_dict":
        return type(obj).__name__
    return kind


def _into_state_dict(current: Any, saved: Any) -> Any:
    """What ``set_state_dict`` gets: the saved state restored into the containers ``state_dict()`` hands out,
    in a new top-level dict."""
    if isinstance(current, dict) and isinstance(saved, dict):
        return {k: restore_into(current[k], v) if k in current else v for k, v in saved.items()}
    return restore_into(current, saved)


class ScriptState:
    """The script's objects one range saves with each checkpoint: captured RNGs and registered state."""

    def __init__(self, range_name: str, rngs: Dict[str, Any], state: Dict[str, Tuple[str, Any]],
                 site: Optional[Site] = None) -> None:
        self.range_name = range_name
        self.site = site  # where ``rngs`` were found: their names are looked up again at each save
        registered = {id(obj) for _, obj in state.values()}
        self.rngs: Dict[str, Tuple[str, Any]] = {}
        for n, o in rngs.items():
            kind = rng_kind(o)
            if kind is not None and id(o) not in registered:
                self.rngs[n] = (kind, o)
        self.state = dict(state)
        self._warned: Set[Tuple[str, Tuple[str, ...]]] = set()

    def __bool__(self) -> bool:
        return bool(self.rngs or self.state)

    def describe(self) -> str:
        """What is saved, for the start log."""
        def listed(objs: Dict[str, Tuple[str, Any]]) -> str:
            shown = [f"{n} ({_describe(k, o)})" for n, (k, o) in list(objs.items())[:16]]
            return ", ".join(shown) + (f" and {len(objs) - 16} more" if len(objs) > 16 else "")

        parts = []
        if self.rngs:
            parts.append("the script's RNGs " + listed(self.rngs))
        if self.state:
            parts.append("the state " + listed(self.state))
        return " and ".join(parts)

    def check(self) -> None:
        """At the loop's open: ConfigError when the objects are more, or larger, than a checkpoint holds."""
        for what, objs in (("captured RNG objects", self.rngs), ("registered state objects (state=, track)", self.state)):
            if len(objs) > objstate.MAX_OBJECTS:
                names = list(objs)
                raise ConfigError(
                    f"range {self.range_name}: {len(objs)} {what}, more than the {objstate.MAX_OBJECTS} a checkpoint "
                    f"holds: {', '.join(names[:8])}, ... {names[-1]}; keep them in one container registered with "
                    "state= (e.g. their states in a list), or fewer"
                )
        try:
            self.capture()
        except CheckpointError as exc:
            raise ConfigError(str(exc)) from None

    def release(self) -> None:
        """The loop ended: forget the frame the captured names were found in."""
        if self.site is not None:
            self.site.release()
            self.site = None

    def _refresh(self) -> None:
        """Look the captured names up again: a name rebound since the loop opened is saved as it holds now."""
        site = self.site
        if site is None:
            return
        now = site.current()
        for name, (kind, obj) in list(self.rngs.items()):
            cur = now.get(name, obj)
            if cur is not obj:
                ckind = rng_kind(cur) if cur is not MISSING else None
                if ckind is None:
                    how = "deleted" if cur is MISSING else f"rebound to a {type(cur).__name__}"
                    self._once(("gone", (name,)), f"{name} no longer holds an RNG object since the loop opened "
                               f"({how}): checkpoints go on saving the {kind} it held")
                    continue
                self._once(("rebound", (name,)), f"{name} holds another {ckind} than when the loop opened (rebound in "
                           f"the loop): checkpoints save the object it holds at each save, and a restart restores that "
                           f"state into the {ckind} {name} holds when its loop opens")
                self.rngs[name] = (ckind, cur)
                obj = cur
            for alias, _ in site.aliases.get(name, ()):
                other = now[alias]
                if other is not obj and other is not MISSING and rng_kind(other) is not None:
                    self._once(("alias", (alias,)), (
                        f"{alias} held the same object as {name} when the loop opened and holds another "
                        f"{rng_kind(other)} now: checkpoints save {name}'s object only, so a restart restores "
                        f"{alias} to {name}'s state; keep the RNG under one name, or pass it with state="))

    def _once(self, key: Tuple[str, Tuple[str, ...]], message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning("range %s: %s", self.range_name, message)

    def capture(self) -> Optional[Dict[str, Any]]:
        """The objects' state now, in the serialized form (None when there is nothing to save)."""
        if not self:
            return None
        self._refresh()
        section: Dict[str, Any] = {"version": objstate.VERSION, "rng": {}, "state": {}}
        parts: Tuple[Tuple[str, Dict[str, Tuple[str, Any]]], ...] = (("rng", self.rngs), ("state", self.state))
        for part, objs in parts:
            for name, (kind, obj) in objs.items():
                try:
                    value = objstate.encode(read(kind, obj), f"state {name!r}")
                except objstate.EncodeError as exc:
                    raise CheckpointError(f"range {self.range_name}: cannot checkpoint {exc}") from None
                section[part][name] = {"kind": kind, "value": value}
        size = len(json.dumps(section, separators=(",", ":")))
        if size > objstate.MAX_BYTES:
            raise CheckpointError(
                f"range {self.range_name}: the script's state takes {size} bytes serialized, more than the "
                f"{objstate.MAX_BYTES} paddle-acp saves in a manifest; keep large state (arrays) in Paddle variables"
            )
        return section

    def restore(self, section: Any, where: str) -> None:
        """Write ``section`` (validated with its manifest) back into the objects, in place. An object either side
        lacks: one warning; one of another kind than saved, or that cannot take it: CheckpointError."""
        if not self and section is None:
            return
        if section is None:
            self._warn(where, sorted(self.rngs) + sorted(self.state), "the checkpoint does not hold them "
                       "(written before they were saved); they keep their current state")
            return
        try:
            rngs, state = objstate.validate(section)
        except CorruptCheckpointError as exc:  # validated when the manifest was read: cannot happen
            raise CheckpointError(f"{where}: {exc}") from None
        missing: List[str] = []
        gone: List[str] = []
        other = [f"{name} (a {saved[name][0]} in the checkpoint, a {kind} here)"
                 for mine, saved in ((self.rngs, rngs), (self.state, state))
                 for name, (kind, _) in mine.items() if name in saved and saved[name][0] != kind]
        if other:  # (before anything is restored: all or nothing)
            raise CheckpointError(
                f"range {self.range_name}: cannot restore the script's state from {where}: {', '.join(other)}; "
                "each is restored into the object its name holds when the loop opens, which must be of the kind "
                "saved. If the script changed, start a new job (a new PADDLE_JOB_ID)"
            )
        for mine, saved in ((self.rngs, rngs), (self.state, state)):
            for name, (kind, obj) in mine.items():
                if name not in saved:
                    missing.append(name)
                    continue
                self._apply(name, kind, obj, saved[name][1], where)
            gone += [n for n in saved if n not in mine]
        if missing:
            self._warn(where, missing, "the checkpoint does not hold them; they keep their current state")
        if gone:
            self._warn(where, gone, "the checkpoint holds them but this run has no such object (renamed or "
                       "removed?): not restored")

    def _apply(self, name: str, kind: str, obj: Any, value: Any, where: str) -> None:
        try:
            if kind in objstate.RNG_KINDS:
                objstate.apply_rng(kind, obj, value)
            elif kind == "state_dict":
                obj.set_state_dict(_into_state_dict(obj.state_dict(), value))
            elif kind in ("dict", "list"):
                if not isinstance(value, dict if kind == "dict" else list):
                    raise TypeError(f"the checkpoint holds a {type(value).__name__}")
                restore_into(obj, value)
            elif kind == "ndarray":
                if not isinstance(value, np.ndarray) or value.shape != obj.shape or value.dtype != obj.dtype:
                    raise TypeError(f"the checkpoint holds {getattr(value, 'dtype', type(value).__name__)}"
                                    f"{list(getattr(value, 'shape', []))}, this run's array is {obj.dtype}{list(obj.shape)}")
                obj[...] = value
        except Exception as exc:
            raise CheckpointError(
                f"range {self.range_name}: cannot restore {name!r} from {where}: {type(exc).__name__}: {exc}. "
                "If the script changed, start a new job (a new PADDLE_JOB_ID)"
            ) from exc

    def _warn(self, where: str, names: List[str], why: str) -> None:
        self._once((why, tuple(names)), f"script state {', '.join(names)} from {where}: {why}")
