"""Registry: the training programs (with their scopes) that one range checkpoints, registered on their first run."""

from __future__ import annotations

import logging
import numbers
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union, overload

from paddle_acp.adapter.programs import PaddleProgram, ProgramInfo, lr_scheduler_of
from paddle_acp.adapter.tensors import (
    PaddlePlace,
    PaddleScope,
    find_tensor,
    layout_size,
    tensor_items,
    tensor_meta,
    tensor_views,
    write_program,
)
from paddle_acp.errors import CheckpointError
from paddle_acp.format.engine.reader import LoadedCheckpoint
from paddle_acp.format.engine.snapshot import ProgramSnapshot, TensorData
from paddle_acp.format.engine.stager import Stager
from paddle_acp.format.manifest import ProgramRecord

logger = logging.getLogger("paddle_acp")

#: Plain JSON data, as :func:`jsonable` gives it.
JSONData = Union[None, bool, int, float, str, List["JSONData"], Dict[str, "JSONData"]]


@overload
def jsonable(value: Mapping[Any, Any], where: str) -> Dict[str, JSONData]: ...


@overload
def jsonable(value: object, where: str) -> JSONData: ...


def jsonable(value: object, where: str) -> JSONData:
    """Convert an LR scheduler state value to plain JSON data, or fail clearly."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "tolist"):  # numpy scalars/arrays, paddle tensors
        data: object = value.tolist()
        return jsonable(data, where)
    raise CheckpointError(f"cannot checkpoint {where}: value of type {type(value).__name__} is not JSON data")


def _piece_of(t: TensorData, piece: Optional[Tuple[int, int]]) -> TensorData:
    return t if piece is None else t.cut(*piece)


class ProgramEntry:
    """One registered (program, scope) pair."""

    def __init__(self, key: str, info: ProgramInfo, program: PaddleProgram, scope: PaddleScope,
                 place: Optional[PaddlePlace]) -> None:
        self.key = key
        self.info = info
        self.program = program
        self.scope = scope
        self.place = place

    def views(self, only: Optional[Mapping[Tuple[str, str], Optional[Tuple[int, int]]]] = None) -> ProgramSnapshot:
        """The program's state as zero-copy views; copy them before Paddle runs again. ``only``: (program key,
        name) of the tensors to take -> the byte range of it (None: whole); None: all of them."""
        names = [n for n in self.info.persistables if only is None or (self.key, n) in only]
        tensors = tensor_views(self.scope, names)
        if only:
            tensors = [_piece_of(t, only[(self.key, t.name)]) for t in tensors]
        sched: Any = lr_scheduler_of(self.program)  # a Paddle LRScheduler (untyped) or None
        state = jsonable(sched.state_dict(), "lr_scheduler") if sched is not None else None
        return ProgramSnapshot(self.key, self.info.label, tensors, state)

    def nbytes(self) -> int:
        """The bytes this program's state takes in a checkpoint's data file, from the tensors' metadata alone."""
        return layout_size(self.scope, self.info.persistables)

    def items(self) -> List[Tuple[str, str, str, Tuple[int, ...], int]]:
        """(program key, name, dtype, shape, bytes) of the tensors :meth:`views` would take, from metadata."""
        return [(self.key, n, d, s, b) for n, d, s, b in tensor_items(self.scope, self.info.persistables)]

    def check_checkpoint(self, rec: ProgramRecord, where: str) -> None:
        """CheckpointError unless ``rec`` restores this program exactly: every persistable the scope holds, same
        dtype and shape, nothing else, and an LR scheduler state with the keys this program's scheduler has."""
        saved = {t.name: t for t in rec.tensors}
        persist = set(self.info.persistables)
        missing: List[str] = []
        extra = sorted(set(saved) - persist)
        differ: List[str] = []
        for name in self.info.persistables:
            t = find_tensor(self.scope, name)
            rec_t = saved.get(name)
            if t is None:  # not initialized: nothing to compare it with (it is restored if saved)
                continue
            if rec_t is None:
                missing.append(name)
                continue
            dtype, shape = tensor_meta(t)
            if dtype != rec_t.dtype or shape != list(rec_t.shape):
                differ.append(f"{name} is {dtype}{shape} here, {rec_t.dtype}{list(rec_t.shape)} in the checkpoint")
        problems: List[str] = []
        if missing:
            problems.append(f"missing from it: {_names(missing)}")
        if extra:
            problems.append(f"not variables of this program: {_names(extra)}")
        if differ:
            problems.append("; ".join(differ[:5]) + (f" (and {len(differ) - 5} more)" if len(differ) > 5 else ""))
        sched: Any = lr_scheduler_of(self.program)  # a Paddle LRScheduler (untyped) or None
        if rec.lr_scheduler is not None and sched is not None:
            problem = _scheduler_mismatch(jsonable(sched.state_dict(), "lr_scheduler"), rec.lr_scheduler)
            if problem:
                problems.append(f"LR scheduler state {problem}")
        if problems:
            raise CheckpointError(
                f"checkpoint {where} cannot restore training program {self.key} ({self.info.label}) exactly: "
                + "; ".join(problems)
                + ". Nothing was restored. If the model changed, start a new job (a new PADDLE_JOB_ID); "
                "if the checkpoint was damaged or edited, remove it (`paddle-acp ls` shows it; restarts then "
                "use the one before)"
            )

    def restore(self, loaded: LoadedCheckpoint, sched_state: Optional[Dict[str, Any]], stager: Stager) -> None:
        """Write this program's tensors from ``loaded`` (a verified checkpoint) and its LR scheduler."""
        rec = loaded.manifest.program(self.key)
        if rec is not None:
            self.check_checkpoint(rec, f"{loaded.manifest.number} ({loaded.path})")
        write_program(loaded, self.key, self.scope, self.place, stager=stager)
        sched: Any = lr_scheduler_of(self.program)  # a Paddle LRScheduler (untyped) or None
        if sched_state is not None:
            if sched is None:
                logger.warning("checkpoint holds LR scheduler state for program %s but the program has no lr_scheduler", self.key)
            else:
                sched.set_state_dict(sched_state)


def _names(names: Sequence[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _kind(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return type(v).__name__


def _scheduler_mismatch(live: object, saved: object) -> str:
    """'' when ``saved`` has the keys and value kinds of the live scheduler's state, else why not."""
    if not isinstance(live, dict) or not isinstance(saved, dict):
        return "is not an object" if not isinstance(saved, dict) else ""
    if set(live) != set(saved):
        gone, new = sorted(set(live) - set(saved)), sorted(set(saved) - set(live))
        return "has other keys than this program's scheduler" + (f" (lacks {_names(gone)})" if gone else "") + (
            f" (has unknown {_names(new)})" if new else "")
    for k in sorted(live):
        a, b = live[k], saved[k]
        if _kind(a) != _kind(b) and not (a is None or b is None):
            return f"has a {_kind(b)} for {k!r} where this program's scheduler has a {_kind(a)}"
        if isinstance(a, dict):
            inner = _scheduler_mismatch(a, b)
            if inner:
                return f"{k}: {inner}"
    return ""


class Registry:
    def __init__(self) -> None:
        self.entries: List[ProgramEntry] = []
        self._by_token: Dict[Tuple[int, int], ProgramEntry] = {}
        self._scopes_by_fp: Dict[str, List[int]] = {}
        self._aliases: List[object] = []

    def lookup(self, program: PaddleProgram, scope: PaddleScope) -> Optional[ProgramEntry]:
        return self._by_token.get((id(program), id(scope)))

    def add(self, info: ProgramInfo, program: PaddleProgram, scope: PaddleScope,
            place: Optional[PaddlePlace]) -> Tuple[ProgramEntry, bool]:
        """Register; returns (entry, is_new). Identical programs on one scope share an entry."""
        scopes = self._scopes_by_fp.setdefault(info.fingerprint, [])
        sid = id(scope)
        is_new = sid not in scopes
        if is_new:
            scopes.append(sid)
        idx = scopes.index(sid)
        key = info.fingerprint if idx == 0 else f"{info.fingerprint}.{idx}"
        if is_new:
            entry = ProgramEntry(key, info, program, scope, place)
            self.entries.append(entry)
        else:
            entry = next(e for e in self.entries if e.key == key)
            self._aliases.append(program)  # keep it alive: its id must not be reused
        self._by_token[(id(program), sid)] = entry
        return entry, is_new
