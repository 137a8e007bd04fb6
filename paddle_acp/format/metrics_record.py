"""The metrics record: one line of ``{job}/metrics/trainer-{id}.jsonl``: its fields, how writers build it, how it is
serialized, and how a line read back is parsed and validated.

A line is a JSON object (keys sorted) with ``event``, ``time``, ``pid`` and ``range``. Its ``event``:

* ``start``: a process began writing checkpoints of a range (``restored``, ``restore_source``, ``policy``);
* ``saved`` / ``failed``: a save (``epoch``, ``step``, ``stall_s``, ``waited_s``, ``policy``, ``ok``, ``persist_s``; of
  one writer ``number``, ``bytes``, ``throughput_mb_s``; a rank's part ``name``, ``bytes``, ``rank``, ``committed``,
  ``parts_wait_s``; a failure ``error``; optional ``queued``, ``skipped_before``, ``streamed``);
* ``skipped``: a save due while the previous one was still being written (``epoch``, ``step``, ``stall_s``, ``policy``).

Each field's meaning and type is its ``metadata["doc"]``. A line older than ``event`` is ``saved`` (``failed`` with
``ok: false``); unknown keys are kept (``extra``) and written back unchanged. A line read back is untrusted (shared
storage): :meth:`MetricsRecord.from_line` raises :class:`MetricsRecordError` naming the field and its fault."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time as _time
from typing import Any, Callable, Dict, FrozenSet, Mapping, Optional, Tuple, Type, Union

EVENTS = ("saved", "failed", "skipped", "start")
TIME_MAX = 32503680000.0  # year 3000
RANGE_MAX_CHARS = 200  # a longer range name read back is cut (never an error)
ERROR_MAX_CHARS = 500  # a failed save's error text, cut when written and when read back
# Numeric fields and the range a real record keeps them in; a line outside it is rejected.
BOUNDS: Dict[str, Tuple[Union[int, float], Union[int, float]]] = {
    "time": (0.0, TIME_MAX), "stall_s": (0.0, 1e7), "waited_s": (0.0, 1e7), "persist_s": (0.0, 1e7),
    "parts_wait_s": (0.0, 1e7), "throughput_mb_s": (0.0, 1e9), "bytes": (0, 1 << 60), "number": (0, 10 ** 18),
    "epoch": (-1, 1 << 62), "step": (0, 1 << 62), "pid": (0, 1 << 31), "skipped_before": (0, 1 << 62),
    "restored": (0, 1 << 62), "rank": (0, 1 << 31),
}
STREAMED_KEYS = ("budget", "buffer", "chunk", "chunks")  # the figures of a streamed save, each a count of bytes
_STREAMED_MAX = 1 << 60


class MetricsRecordError(ValueError):
    """A metrics line that is not a valid record; the message names the field and the fault."""


def is_num(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def _doc(text: str, default: Any = None) -> Any:
    return dataclasses.field(default=default, metadata={"doc": text})


@dataclasses.dataclass(frozen=True)
class MetricsRecord:
    """One metrics line. ``None`` is an absent key unless the key is in ``nulls`` (written as ``null``). Writers build
    records with :meth:`start`, :meth:`skipped` and :class:`SaveBegun`, never field by field."""

    event: str = dataclasses.field(metadata={"doc": "str: start, saved, failed or skipped"})
    time: float = dataclasses.field(metadata={"doc": "float: wall-clock time of the record, seconds since the epoch"})
    pid: Optional[int] = _doc("int: the process id of the training process")
    range: str = _doc("str: the epoch range's name (``-`` when a line has none)", "-")
    restored: Optional[int] = _doc("int or null (start): the number of the checkpoint the process resumed from "
                                   "(several ranks: its position, (epoch + 1) << 32 | step)")
    restore_source: Optional[str] = _doc("str or null (start): where it was read from: local, remote or cache")
    policy: Optional[str] = _doc("str: PADDLE_ACP_BUSY_POLICY of the process (auto, skip, queue or wait)")
    epoch: Optional[int] = _doc("int: the epoch the save (or skipped save) is of")
    step: Optional[int] = _doc("int or null: the step within the epoch (null: an epoch's end)")
    stall_s: Optional[float] = _doc("float: seconds the training thread was blocked by this save, waited_s included")
    waited_s: Optional[float] = _doc("float: of stall_s, seconds waiting for the previous checkpoint")
    queued: Optional[bool] = _doc("bool (only true is written): the snapshot waited in the second buffer")
    skipped_before: Optional[int] = _doc("int (only above 0 is written): saves skipped since the previous one")
    ok: Optional[bool] = _doc("bool: the save succeeded (true for saved, false for failed)")
    number: Optional[int] = _doc("int: the checkpoint's number (a checkpoint of one writer)")
    name: Optional[str] = _doc("str: the checkpoint's name (a part of a checkpoint of several ranks)")
    bytes: Optional[int] = _doc("int: bytes written (several ranks: this rank's part)")
    persist_s: Optional[float] = _doc("float: seconds the write (and commit) took, on the saver's thread")
    throughput_mb_s: Optional[float] = _doc("float: bytes / persist_s, in MB/s (a checkpoint of one writer)")
    rank: Optional[int] = _doc("int: the rank that wrote the part (several ranks)")
    committed: Optional[bool] = _doc("bool or null: the global checkpoint committed (null: decided by rank 0)")
    parts_wait_s: Optional[float] = _doc("float: of persist_s, seconds rank 0 waited for the other ranks' parts")
    error: Optional[str] = _doc(f"str: why the save failed (at most {ERROR_MAX_CHARS} characters)")
    streamed: Optional[Mapping[str, Optional[int]]] = _doc(
        "object: a streamed save's figures: budget (int or null), buffer, chunk, chunks")
    nulls: FrozenSet[str] = dataclasses.field(default=frozenset(), metadata={"internal": True})
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, metadata={"internal": True})

    @classmethod
    def start(cls, *, range: str, restored: Optional[int], policy: str, restore_source: Optional[str],
              time: Optional[float] = None, pid: Optional[int] = None) -> "MetricsRecord":
        """A process began writing checkpoints of ``range``, restored from ``restored`` (None: none)."""
        return _written(cls(event="start", time=_now(time), pid=_pid(pid), range=range, restored=restored,
                            policy=policy, restore_source=restore_source),
                        always=("restored", "restore_source"))

    @classmethod
    def skipped(cls, *, range: str, epoch: int, step: Optional[int], stall_s: float, policy: str,
                time: Optional[float] = None, pid: Optional[int] = None) -> "MetricsRecord":
        """A save that came due while the previous checkpoint was being written, not taken."""
        return _written(cls(event="skipped", time=_now(time), pid=_pid(pid), range=range, epoch=epoch, step=step,
                            stall_s=round(stall_s, 6), policy=policy), always=("step",))

    def to_dict(self) -> Dict[str, Any]:
        """The line's JSON object: every field set (or in ``nulls``), and the unknown keys read with it."""
        out: Dict[str, Any] = dict(self.extra)
        nulls = self.nulls
        for name, v in self.__dict__.items():  # the fields, in order (a frozen dataclass without slots)
            if (v is not None or name in nulls) and name in _NAMES:
                out[name] = dict(v) if name == "streamed" and v is not None else v
        return out

    def to_line(self, values: Optional[Callable[[Any], Any]] = None) -> str:
        """The JSON line (without its newline), keys sorted; ``values`` maps each field's value first (the fixed
        words of :data:`FIXED_WORDS` excepted: metrics_log scrubs secrets from values, never from the format)."""
        obj = self.to_dict()
        if values is not None:
            obj = {k: v if k in FIXED_WORDS else values(v) for k, v in obj.items()}
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_line(cls, line: str) -> "MetricsRecord":
        """Parse and validate one line read back; :class:`MetricsRecordError` when it is not a record."""
        try:
            obj = json.loads(line)
        except RecursionError:
            raise MetricsRecordError("not a metrics record: JSON nested too deeply") from None
        except ValueError as exc:
            raise MetricsRecordError(f"not a metrics record: not JSON ({exc})") from None
        return cls.from_dict(obj)

    @classmethod
    def from_dict(cls, obj: Any) -> "MetricsRecord":
        """Validate a line's JSON object; :class:`MetricsRecordError` when invalid."""
        if not isinstance(obj, dict):
            raise MetricsRecordError(f"not a metrics record: a JSON {_json_type(obj)}, not an object")
        kw: Dict[str, Any] = {}
        nulls = set()
        extra = {}
        for name, v in obj.items():
            kind = _TYPES.get(name)
            if kind is None:
                extra[name] = v
            elif v is None:
                if name == "time":
                    raise MetricsRecordError("field 'time' is null: every record has a time")
                nulls.add(name)
            else:
                kw[name] = _check(name, kind, v)
        if "time" not in kw:
            raise MetricsRecordError("field 'time' is missing: every record has a time")
        event = kw.get("event")
        if event is None:  # written before events existed
            event = "failed" if kw.get("ok") is False else "saved"
            nulls.discard("event")
        if event not in EVENTS:
            raise MetricsRecordError(f"field 'event' is {_show(event)}: not one of {', '.join(EVENTS)}")
        kw["event"] = event
        if kw.get("range") is None:
            nulls.discard("range")
        return cls(**kw, nulls=frozenset(nulls), extra=extra)


@dataclasses.dataclass(frozen=True)
class SaveBegun:
    """What a save's record knows when its snapshot is taken; its outcome makes the record."""

    range: str
    epoch: int
    step: Optional[int]
    stall_s: float
    waited_s: float
    policy: str
    queued: bool = False
    skipped_before: int = 0
    streamed: Optional[Mapping[str, Optional[int]]] = None
    time: float = dataclasses.field(default_factory=_time.time)
    pid: int = dataclasses.field(default_factory=os.getpid)

    def with_stream(self, stall_s: float, budget: Optional[int], buffer: int, chunk: int,
                    chunks: int) -> "SaveBegun":
        """A streamed save: its stall ended when its last chunk was copied, and the stream's figures."""
        return dataclasses.replace(self, stall_s=stall_s,
                                   streamed={"budget": budget, "buffer": buffer, "chunk": chunk, "chunks": chunks})

    def saved(self, *, number: int, nbytes: int, persist_s: float) -> MetricsRecord:
        """Checkpoint ``number`` of one writer committed: ``nbytes`` written in ``persist_s`` seconds."""
        mbps = nbytes / persist_s / 1e6 if persist_s > 0 else 0.0
        return self._record("saved", ok=True, number=number, bytes=nbytes, persist_s=round(persist_s, 6),
                            throughput_mb_s=round(mbps, 3))

    def failed(self, *, error: BaseException, persist_s: float) -> MetricsRecord:
        """The save failed with ``error`` after ``persist_s`` seconds."""
        return self._record("failed", ok=False, error=str(error)[:ERROR_MAX_CHARS], persist_s=round(persist_s, 6))

    def part(self, *, name: str, nbytes: int, persist_s: float, rank: int, committed: Optional[bool],
             parts_wait_s: float, error: Optional[BaseException] = None) -> MetricsRecord:
        """A rank's part of checkpoint ``name`` written (rank 0's: ``committed`` decided; None on the others). An
        ``error`` of the commit makes it a failed save."""
        if error is not None:
            committed = False
        ok = committed is not False
        return self._record("saved" if ok else "failed", ok=ok, name=name, bytes=nbytes, persist_s=round(persist_s, 6),
                            rank=rank, committed=committed, parts_wait_s=round(parts_wait_s, 6),
                            error=None if error is None else str(error)[:ERROR_MAX_CHARS],
                            always=("committed",))

    def _record(self, event: str, *, always: Tuple[str, ...] = (), **outcome: Any) -> MetricsRecord:
        rec = MetricsRecord(event=event, time=self.time, pid=self.pid, range=self.range, epoch=self.epoch,
                            step=self.step, stall_s=round(self.stall_s, 6), waited_s=round(self.waited_s, 6),
                            policy=self.policy, queued=True if self.queued else None,
                            skipped_before=self.skipped_before or None,
                            streamed=dict(self.streamed) if self.streamed is not None else None, **outcome)
        return _written(rec, always=("step",) + always)


_FIELDS = tuple(f for f in dataclasses.fields(MetricsRecord) if not f.metadata.get("internal"))
_NAMES = frozenset(f.name for f in _FIELDS)
FIXED_WORDS = frozenset({"event", "policy", "restore_source"})  # the format's own words, never a secret
_TYPES: Dict[str, Type[Any]] = {
    "event": str, "time": float, "pid": int, "range": str, "restored": int, "restore_source": str, "policy": str,
    "epoch": int, "step": int, "stall_s": float, "waited_s": float, "queued": bool, "skipped_before": int,
    "ok": bool, "number": int, "name": str, "bytes": int, "persist_s": float, "throughput_mb_s": float,
    "rank": int, "committed": bool, "parts_wait_s": float, "error": str, "streamed": dict,
}


def _written(rec: MetricsRecord, always: Tuple[str, ...]) -> MetricsRecord:
    """``rec`` with the keys a writer writes even when null."""
    return dataclasses.replace(rec, nulls=frozenset(k for k in always if getattr(rec, k) is None))


def _now(t: Optional[float]) -> float:
    return _time.time() if t is None else t


def _pid(p: Optional[int]) -> int:
    return os.getpid() if p is None else p


def _json_type(v: Any) -> str:
    for kind, name in ((type(None), "null"), (bool, "boolean"), (dict, "object"), (list, "array"), (str, "string")):
        if isinstance(v, kind):
            return name
    return "number"


def _show(v: Any) -> str:
    """A value read back, for a message: short, and never more than its first characters."""
    text = json.dumps(v) if isinstance(v, (str, int, float, bool)) else f"a JSON {_json_type(v)}"
    return text if len(text) <= 40 else text[:37] + "..."


def _check(name: str, kind: Type[Any], v: Any) -> Any:
    """The value of field ``name`` read back, or :class:`MetricsRecordError`."""
    if name in ("range", "error"):  # free text: anything is kept, as text, cut to its length
        return str(v)[:RANGE_MAX_CHARS if name == "range" else ERROR_MAX_CHARS]
    if kind is float or kind is int:
        if not is_num(v) or (kind is int and not isinstance(v, int)):
            what = "an integer" if kind is int else "a finite number"
            raise MetricsRecordError(f"field {name!r} is {_show(v)}: not {what}")
        lo, hi = BOUNDS[name]
        if not lo <= v <= hi:
            raise MetricsRecordError(f"field {name!r} is {_show(v)}: outside [{lo}, {hi}]")
        return v
    if name == "streamed":
        return _check_streamed(v)
    if not isinstance(v, kind):
        want = {str: "a string", bool: "true or false"}[kind]
        raise MetricsRecordError(f"field {name!r} is {_show(v)}: not {want}")
    return v


def _check_streamed(v: Any) -> Mapping[str, Optional[int]]:
    if not isinstance(v, dict) or set(v) != set(STREAMED_KEYS):
        raise MetricsRecordError(f"field 'streamed' is {_show(v)}: not an object of {', '.join(STREAMED_KEYS)}")
    for k in STREAMED_KEYS:
        x = v[k]
        if x is None and k == "budget":
            continue
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= _STREAMED_MAX:
            raise MetricsRecordError(f"field 'streamed.{k}' is {_show(x)}: not a count of bytes")
    return dict(v)
