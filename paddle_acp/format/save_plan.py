"""The save plan of a job of several ranks (``plan.json``): which due points every rank saves at.

Written by rank 0 only, read by every rank (:mod:`paddle_acp.runtime.agree`). Due points are counted alike by every rank
in two sequences: ``due`` (epoch ends when every epoch saves, ``save_every_steps`` boundaries) and ``interval`` (epoch
ends when ``save_checkpoint_inter`` > 0). ``strides``: ``[anchor, stride]`` pairs over ``due`` (from point ``anchor`` on
every ``stride``-th is taken; before the first pair every ``default_stride``-th from 0); ``requests``: the indices of
``interval`` that are taken. Stored at ``{job}/range/{range}/plan.json``; untrusted input like every manifest. A plan of
another range or another ``base`` (the checkpoint the job resumed from) is not this job's."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.format.untrusted_json import (
    MAX_INT,
    _doc_checksum,
    _get,
    check_newer_version,
    check_text,
    parse_json,
    seal,
)

PLAN_NAME = "plan.json"
PLAN_FORMAT = "paddle-acp/save-plan"
PLAN_VERSION = 1
MAX_PLAN_SIZE = 8192
MAX_ENTRIES = 8  # pairs and requests kept: the newest (the ranks need those not yet passed)
MAX_STRIDE = 1 << 20


def _fail(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"invalid save plan: {msg}")


@dataclasses.dataclass(frozen=True)
class SavePlan:
    """One version of the plan (see the module docstring); ``token`` names the start of rank 0 that wrote it."""

    range_name: str
    base: Optional[str]
    token: str
    seq: int = 0  # the version: one more at each change
    default_stride: int = 1  # before the first pair
    strides: Tuple[Tuple[int, int], ...] = ()
    requests: Tuple[int, ...] = ()

    def stride_at(self, index: int) -> Tuple[int, int]:
        """(anchor, stride) that holds for due point ``index``."""
        held = (0, self.default_stride)
        for anchor, stride in self.strides:
            if anchor <= index:
                held = (anchor, stride)
        return held

    def taken(self, kind: str, index: int) -> bool:
        """Whether every rank saves at point ``index`` of sequence ``kind`` ("due" or "interval")."""
        if kind == "interval":
            return index in self.requests
        anchor, stride = self.stride_at(index)
        return (index - anchor) % stride == 0

    def with_stride(self, anchor: int, stride: int) -> "SavePlan":
        """Every ``stride``-th due point from ``anchor`` on. Anchors increase: an entry at the last one's anchor
        replaces it (ValueError for an earlier anchor)."""
        kept = self.strides[:-1] if self.strides and self.strides[-1][0] == anchor else self.strides
        if kept and kept[-1][0] > anchor:
            raise ValueError(f"save plan: anchor {anchor} before the last one ({kept[-1][0]})")
        return dataclasses.replace(self, seq=self.seq + 1, strides=(kept + ((anchor, stride),))[-MAX_ENTRIES:])

    def with_request(self, index: int) -> "SavePlan":
        return dataclasses.replace(self, seq=self.seq + 1, requests=(self.requests + (index,))[-MAX_ENTRIES:])

    # -- the record ----------------------------------------------------------
    def dumps(self) -> bytes:
        return seal({
            "format": PLAN_FORMAT, "version": PLAN_VERSION, "range": self.range_name, "base": self.base,
            "token": self.token, "seq": self.seq, "default_stride": self.default_stride, "strides": [list(p) for p in self.strides],
            "requests": list(self.requests),
        })

    @classmethod
    def loads(cls, raw: bytes) -> "SavePlan":
        """The plan in ``raw``; CorruptCheckpointError for anything else (UnknownFormatError: a newer version)."""
        d = parse_json(raw, "save plan", MAX_PLAN_SIZE)
        check_newer_version(d, PLAN_FORMAT, PLAN_VERSION, "save plan")
        if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT or d.get("version") != PLAN_VERSION:
            raise _fail("not a save plan of this version")
        if _get(d, "checksum", int, "plan") != _doc_checksum({k: v for k, v in d.items() if k != "checksum"}):
            raise _fail("checksum mismatch")
        base = _get(d, "base", str, "plan", optional=True)
        seq = _index(d.get("seq"), "plan.seq")
        default_stride = _index(d.get("default_stride"), "plan.default_stride")
        if not 1 <= default_stride <= MAX_STRIDE:
            raise _fail(f"plan.default_stride {default_stride} out of range")
        strides = _get(d, "strides", list, "plan")
        requests = _get(d, "requests", list, "plan")
        if len(strides) > MAX_ENTRIES or len(requests) > MAX_ENTRIES:
            raise _fail(f"more than {MAX_ENTRIES} entries")
        pairs = []
        for i, p in enumerate(strides):
            if not isinstance(p, list) or len(p) != 2:
                raise _fail(f"plan.strides[{i}] must be [anchor, stride]")
            anchor, stride = _index(p[0], f"plan.strides[{i}][0]"), _index(p[1], f"plan.strides[{i}][1]")
            if not 1 <= stride <= MAX_STRIDE:
                raise _fail(f"plan.strides[{i}]: stride {stride} out of range")
            pairs.append((anchor, stride))
        reqs = [_index(r, f"plan.requests[{i}]") for i, r in enumerate(requests)]
        if any(a[0] >= b[0] for a, b in zip(pairs, pairs[1:])) or any(a >= b for a, b in zip(reqs, reqs[1:])):
            raise _fail("anchors and requests must increase")
        return cls(
            range_name=check_text(_get(d, "range", str, "plan"), "plan.range", empty=False),
            base=None if base is None else check_text(base, "plan.base", empty=False),
            token=check_text(_get(d, "token", str, "plan"), "plan.token", max_len=64, empty=False),
            seq=seq, default_stride=default_stride, strides=tuple(pairs), requests=tuple(reqs),
        )


def _index(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_INT:
        raise _fail(f"{where} must be an integer in [0, {MAX_INT})")
    return v
