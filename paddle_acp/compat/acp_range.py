"""Paddle's ``TrainEpochRange``: a view of paddle-acp's active range with the names Paddle's code and tests read."""

from __future__ import annotations

import json
import logging
import weakref
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from paddle_acp.adapter.programs import auto_checkpoint_name
from paddle_acp.compat.acp_status import ExeTrainStatus
from paddle_acp.format.checkpoints import index
from paddle_acp.format.manifest import Manifest
from paddle_acp.runtime.api import CONST_CHECKPOINT, CONST_MEMORYINIT, active_range
from paddle_acp.runtime.range import EpochRange

__all__ = ["TrainEpochRange", "_get_train_epoch_range"]

logger = logging.getLogger("paddle_acp")


class _RangeState:
    """Compat bookkeeping of one library range (no reference to it)."""

    def __init__(self) -> None:
        self.statuses: Dict[str, ExeTrainStatus] = {}
        self.manifest: Optional[Manifest] = None
        self.manifest_read = False
        self.numbers: Dict[str, int] = {}  # Paddle's checkpoint_no of each checkpoint seen, by name


_states: "weakref.WeakKeyDictionary[EpochRange, _RangeState]" = weakref.WeakKeyDictionary()
_views: "weakref.WeakValueDictionary[int, TrainEpochRange]" = weakref.WeakValueDictionary()


class TrainEpochRange:
    """Paddle's view of an active ``train_epoch_range`` (from :func:`_get_train_epoch_range`): other attributes
    are those of the wrapped :class:`~paddle_acp.runtime.range.EpochRange`, also available as :attr:`range`."""

    def __init__(self, lib_range: EpochRange) -> None:
        if not isinstance(lib_range, EpochRange):
            raise TypeError(
                "TrainEpochRange wraps an active paddle-acp range: use train_epoch_range() "
                "and _get_train_epoch_range(), not TrainEpochRange(...)"
            )
        self._range = lib_range
        self._state = _states.setdefault(lib_range, _RangeState())
        self._read_restored_manifest()

    @property
    def range(self) -> EpochRange:
        return self._range

    # the private names Paddle's tests read, as the wrapped range's
    _ALIASES = {"_name": "name", "_epoch_no": "epoch_no", "_max_epoch_num": "max_epoch_num",
                "_restored_from": "restored_from", "_save_checkpoint_inter": "save_interval"}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_range", "_state"):
            raise AttributeError(name)
        return getattr(self._range, self._ALIASES.get(name, name))

    def get(self) -> int:
        return self._range.get()

    @property
    def _checkpoint_path(self) -> str:
        r = self._range
        path: str = r.storage.full(r.numbered.dir)  # (untyped in runtime/)
        return path

    @property
    def _checkpoint_epoch_no(self) -> Optional[int]:
        m = self._state.manifest
        return None if m is None else m.range.epoch_no

    def _read_restored_manifest(self) -> Optional[Manifest]:
        st = self._state
        if st.manifest_read:
            return st.manifest
        st.manifest_read = True
        loaded = self._range.restorer.loaded
        st.manifest = loaded.manifest if loaded is not None else None
        return st.manifest

    def _last_checkpoint(self) -> Union[Tuple[int, str], Tuple[None, None]]:
        """The number (Paddle's ``checkpoint_no``: 0 for the range's first checkpoint, one more for each later)
        and path of the range's newest committed checkpoint. An earlier release's ``ckpt-N`` has its N; one named
        by position gets the next number after those seen before it (first seen: its rank, oldest first)."""
        r = self._range
        try:
            newest = index.entries(r.storage, r.cfg.job_id, r.name)
        except Exception as exc:
            logger.debug("cannot list checkpoints of range %s: %s", r.name, exc)
            newest = []
        if not newest:
            return None, None
        e = newest[0]
        if e.layout == index.SINGLE:
            return e.number, r.storage.full(e.path)
        numbers = self._state.numbers
        number = numbers.get(e.name)
        if number is None:
            below = [x.number for x in newest if x.layout == index.SINGLE]  # an earlier release's, older
            number = max(len(newest) - 1, max(below, default=-1) + sum(x.layout == index.GLOBAL for x in newest),
                         max(numbers.values(), default=-1) + 1)
            numbers[e.name] = number
        return number, r.storage.full(e.path)

    @property
    def _exe_status(self) -> Dict[str, ExeTrainStatus]:
        """One :class:`ExeTrainStatus` per registered training program, by key (a fresh dict)."""
        r = self._range
        st = self._state
        m = st.manifest
        number, path = self._last_checkpoint()
        out: Dict[str, ExeTrainStatus] = {}
        for e in r.registry.entries:
            t = st.statuses.get(e.key)
            if t is None:
                t = ExeTrainStatus()
                t._key = t._hash_key = e.key
                t._program = e.program
                t._program_name = auto_checkpoint_name(e.program) or e.key
                restored = m is not None and m.program(e.key) is not None
                t._restored_from = CONST_CHECKPOINT if restored else CONST_MEMORYINIT
                st.statuses[e.key] = t
            t._epoch_no = r.get()
            t._checkpoint_no = number
            t._checkpoint_path = path
            out[e.key] = t
        return out

    def _to_dict(self) -> Dict[str, Any]:
        return {
            "max_epoch_num": self._max_epoch_num,
            "epoch_no": self._epoch_no,
            "name": self.name,
            "checkpoint_path": self._checkpoint_path,
            "restored_from": self.restored_from,
            "checkpoint_epoch_no": self._checkpoint_epoch_no,
        }

    def _serialize(self, pop_keys: Sequence[str] = ("restored_from", "checkpoint_epoch_no")) -> str:
        d = self._to_dict()
        for k in pop_keys:
            d.pop(k, None)
        d["exe_status"] = {k: t._serialize() for k, t in self._exe_status.items()}
        return json.dumps(d)

    def __str__(self) -> str:
        return self._serialize(())

    def __repr__(self) -> str:
        return f"<TrainEpochRange {self.name} epoch {self.get()} restored_from={self.restored_from}>"


def _get_train_epoch_range() -> Optional[TrainEpochRange]:
    """The active range's :class:`TrainEpochRange` view (the same object while the caller keeps it), or None."""
    r = active_range()
    if r is None:
        return None
    view = _views.get(id(r))
    if view is None or view._range is not r:
        view = TrainEpochRange(r)
        _views[id(r)] = view
    return view

