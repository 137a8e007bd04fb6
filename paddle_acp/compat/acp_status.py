"""Paddle's ``ExeTrainStatus``: the status of one training program in a range, serialized as Paddle did."""

from __future__ import annotations

import json

from paddle_acp.compat.checkpoint_saver import SerializableBase
from paddle_acp.errors import CheckpointError

__all__ = ["ExeTrainStatus"]


class ExeTrainStatus(SerializableBase):
    """The status of one training program in a range (Paddle's per-executor record)."""

    def __init__(self):
        self._epoch_no = -1
        self._hash_key = None
        self._key = None
        self._checkpoint_path = None
        self._checkpoint_no = None
        self._restored_from = None
        self._exe = None
        self._program = None
        self._exe_name = None
        self._program_name = None
        self._file_name = "exe_train_status"

    def __eq__(self, t):
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

    def __ne__(self, t):
        eq = self.__eq__(t)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as in Paddle

    def _to_dict(self):
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

    def _serialize(self, pop_keys=("restored_from",)):
        d = self._to_dict()
        for k in pop_keys:
            d.pop(k, None)
        return json.dumps(d)

    def _deserialize(self, s):
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

    def serialize(self, path):
        with open(f"{path}/{self._file_name}", "w") as f:
            f.write(self._serialize())

    def deserialize(self, path):
        with open(f"{path}/{self._file_name}") as f:
            self._deserialize(f.read())

    def __str__(self):
        return self._serialize(())

    __repr__ = __str__

