"""Paddle's ``ExeTrainStatus``: the status of one training program in a range, serialized as Paddle did."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence

from paddle_acp.compat.checkpoint_saver import SerializableBase
from paddle_acp.errors import CheckpointError

__all__ = ["ExeTrainStatus"]

# Paddle's fields, in its JSON's order; all but restored_from are compared and required when read back
_FIELDS = ("epoch_no", "key", "hash_key", "checkpoint_path", "restored_from", "exe_name", "program_name",
           "checkpoint_no")
_REQUIRED = ("epoch_no", "key", "hash_key", "checkpoint_path", "checkpoint_no", "exe_name", "program_name")


class ExeTrainStatus(SerializableBase):
    """The status of one training program in a range (Paddle's per-executor record)."""

    def __init__(self) -> None:
        # Fields read back from JSON (untrusted) or set by the range from Paddle's objects: Any at that boundary.
        self._epoch_no: Any = -1
        self._hash_key: Any = None
        self._key: Any = None
        self._checkpoint_path: Any = None
        self._checkpoint_no: Any = None
        self._restored_from: Any = None
        self._exe: Any = None  # a paddle.static.Executor
        self._program: Any = None  # a paddle.static.Program (or CompiledProgram)
        self._exe_name: Optional[str] = None
        self._program_name: Optional[str] = None
        self._file_name = "exe_train_status"

    def __eq__(self, t: object) -> bool:
        if not isinstance(t, ExeTrainStatus):
            return NotImplemented
        return all(getattr(self, "_" + k) == getattr(t, "_" + k) for k in _REQUIRED)

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as in Paddle

    def _to_dict(self) -> Dict[str, Any]:
        return {k: getattr(self, "_" + k) for k in _FIELDS}

    def _serialize(self, pop_keys: Sequence[str] = ("restored_from",)) -> str:
        d = self._to_dict()
        for k in pop_keys:
            d.pop(k, None)
        return json.dumps(d)

    def _deserialize(self, s: str) -> None:
        d = json.loads(s)
        try:
            for k in _REQUIRED:
                setattr(self, "_" + k, d[k])
        except KeyError as exc:
            raise CheckpointError(f"executor train status lacks {exc.args[0]!r}") from None

    def serialize(self, path: str) -> None:
        with open(f"{path}/{self._file_name}", "w") as f:
            f.write(self._serialize())

    def deserialize(self, path: str) -> None:
        with open(f"{path}/{self._file_name}") as f:
            self._deserialize(f.read())

    def __str__(self) -> str:
        return self._serialize(())

    __repr__ = __str__

