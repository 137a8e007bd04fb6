"""Paddle's ``ExeTrainStatus``: the status of one training program in a range, serialized as Paddle did."""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence

from paddle_acp.compat.checkpoint_saver import SerializableBase
from paddle_acp.errors import CheckpointError

__all__ = ["ExeTrainStatus"]


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
        return (
            self._epoch_no == t._epoch_no
            and self._hash_key == t._hash_key
            and self._key == t._key
            and self._checkpoint_path == t._checkpoint_path
            and self._checkpoint_no == t._checkpoint_no
            and self._exe_name == t._exe_name
            and self._program_name == t._program_name
        )

    def __ne__(self, t: object) -> bool:
        eq = self.__eq__(t)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as in Paddle

    def _to_dict(self) -> Dict[str, Any]:
        return {
            "epoch_no": self._epoch_no,
            "key": self._key,
            "hash_key": self._hash_key,
            "checkpoint_path": self._checkpoint_path,
            "restored_from": self._restored_from,
            "exe_name": self._exe_name,
            "program_name": self._program_name,
            "checkpoint_no": self._checkpoint_no,
        }

    def _serialize(self, pop_keys: Sequence[str] = ("restored_from",)) -> str:
        d = self._to_dict()
        for k in pop_keys:
            d.pop(k, None)
        return json.dumps(d)

    def _deserialize(self, s: str) -> None:
        d = json.loads(s)
        try:
            self._epoch_no = d["epoch_no"]
            self._key = d["key"]
            self._hash_key = d["hash_key"]
            self._checkpoint_path = d["checkpoint_path"]
            self._checkpoint_no = d["checkpoint_no"]
            self._exe_name = d["exe_name"]
            self._program_name = d["program_name"]
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

