"""Registry: the training programs (with their scopes) that one range checkpoints.

A program is registered on its first ``Executor.run`` inside a range; if the
range was restored from a checkpoint, its state is written back right then,
before the run.
"""

from __future__ import annotations

import logging
import numbers
from typing import Dict, List, Optional, Tuple

from .errors import CheckpointError
from .programs import ProgramInfo, lr_scheduler_of
from .snapshot import ProgramSnapshot, tensor_views

logger = logging.getLogger("paddle_acp")


def jsonable(value, where: str):
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
        return jsonable(value.tolist(), where)
    raise CheckpointError(f"cannot checkpoint {where}: value of type {type(value).__name__} is not JSON data")


class ProgramEntry:
    """One registered (program, scope) pair."""

    def __init__(self, key: str, info: ProgramInfo, program, scope, place):
        self.key = key
        self.info = info
        self.program = program
        self.scope = scope
        self.place = place

    def views(self) -> ProgramSnapshot:
        """The program's state as zero-copy views; copy them before Paddle runs again."""
        tensors = tensor_views(self.scope, self.info.persistables)
        sched = lr_scheduler_of(self.program)
        state = jsonable(sched.state_dict(), "lr_scheduler") if sched is not None else None
        return ProgramSnapshot(self.key, self.info.label, tensors, state)

    def restore(self, loaded, sched_state) -> None:
        """Write this program's tensors from ``loaded`` (a verified checkpoint) and its LR scheduler."""
        loaded.write_program(self.key, self.scope, self.place)
        sched = lr_scheduler_of(self.program)
        if sched_state is not None:
            if sched is None:
                logger.warning("checkpoint holds LR scheduler state for program %s but the program has no lr_scheduler", self.key)
            else:
                sched.set_state_dict(sched_state)


class Registry:
    def __init__(self):
        self.entries: List[ProgramEntry] = []
        self._by_token: Dict[Tuple[int, int], ProgramEntry] = {}
        self._scopes_by_fp: Dict[str, List[int]] = {}
        self._aliases: List[object] = []

    def lookup(self, program, scope) -> Optional[ProgramEntry]:
        return self._by_token.get((id(program), id(scope)))

    def add(self, info: ProgramInfo, program, scope, place) -> Tuple[ProgramEntry, bool]:
        """Register; returns (entry, is_new). Identical programs on one scope share an entry."""
        scopes = self._scopes_by_fp.setdefault(info.fingerprint, [])
        sid = id(scope)
        if sid in scopes:
            idx = scopes.index(sid)
            key = info.fingerprint if idx == 0 else f"{info.fingerprint}.{idx}"
            entry = next(e for e in self.entries if e.key == key)
            self._by_token[(id(program), sid)] = entry
            self._aliases.append(program)  # keep it alive: its id must not be reused
            return entry, False
        scopes.append(sid)
        idx = len(scopes) - 1
        key = info.fingerprint if idx == 0 else f"{info.fingerprint}.{idx}"
        entry = ProgramEntry(key, info, program, scope, place)
        self.entries.append(entry)
        self._by_token[(id(program), sid)] = entry
        return entry, True
