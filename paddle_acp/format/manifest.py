"""Manifest: the JSON document that describes (and commits) one checkpoint.

Data, never code: no pickle. Its checksum guards against accidents, not edits: a crafted manifest is untrusted input, so
its size is capped (:func:`max_manifest_size`) before parsing, every field is type- and range-checked and the RNG,
LR-scheduler and script states are validated in full: anything accepted restores without an exception, anything else
raises :class:`CorruptCheckpointError` (restore falls back to an older checkpoint)."""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import crc32c
import numpy as np

from paddle_acp.format import objstate, rng_schema
from paddle_acp.format.untrusted_json import (
    MAX_DOCUMENT_SIZE,
    _fail,
    _get,
    _int_in,
    check_json_data,
    check_newer_version,
    check_text,
    parse_json,
    unseal,
)
from paddle_acp.format.untrusted_json import seal as seal  # the manifest's encoding (tests and tools seal documents)

FORMAT = "paddle-acp/checkpoint"
VERSION = 2  # what this paddle-acp writes
PIECES_VERSION = 3  # a part that holds pieces of tensors (spread writes): older builds must refuse it
# version -> the checksum of each tensor's bytes (also its JSON key). Version 1 is still read.
TENSOR_CHECKSUMS: Dict[int, str] = {1: "crc32", 2: "crc32c", 3: "crc32c"}
# (data, running value) -> value: both release the GIL; CRC32C uses the CPU's crc32 instruction
_CHECKSUM_FUNCTIONS: Dict[str, Callable[[Any, int], int]] = {"crc32": zlib.crc32, "crc32c": crc32c.crc32c}
MANIFEST_NAME = "manifest.json"
DATA_NAME = "tensors.bin"
ALIGN = 64

# dtype name -> numpy storage dtype (bfloat16 is stored as its raw 16 bits).
DTYPES: Dict[str, np.dtype] = {
    name: np.dtype("uint16" if name == "bfloat16" else name)
    for name in ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
                 "complex64", "complex128")
}
MAX_NDIM = 16

# Bounds of a manifest (what paddle-acp itself never comes near; anything beyond is rejected).
MAX_MANIFEST_BASE = 4 << 20  # bytes every manifest may have (RNG states, loader state, ...)
MAX_MANIFEST_PER_DATA_BYTE = 16  # plus this many per byte of tensors.bin (a tensor record is ~250 bytes
#                                  and a non-empty tensor takes at least 64 aligned bytes of data)
MAX_MANIFEST_SIZE = MAX_DOCUMENT_SIZE  # and never more than this
MAX_NUMBER = 10**15 - 1  # checkpoint numbers: at most 15 digits (commit/atomic.py parses names the same way)
MAX_BYTES = 2**62  # sizes and offsets
MAX_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC: `created` must be a time a calendar can show
MAX_DIM_PRODUCT = 2**56  # the nonzero dimensions of a shape, times the item size (NumPy needs < 2**63)
MAX_TENSORS = 1_000_000  # tensor records in one manifest


def max_manifest_size(data_size: int) -> int:
    """The largest manifest accepted for a checkpoint whose tensors.bin has ``data_size`` bytes."""
    return min(MAX_MANIFEST_SIZE, MAX_MANIFEST_BASE + MAX_MANIFEST_PER_DATA_BYTE * max(0, data_size))


def check_lr_scheduler(state: Any, where: str) -> None:
    """An ``LRScheduler.state_dict()``: JSON data, an integer ``last_epoch`` and a number ``last_lr``."""
    if not isinstance(state, dict):
        raise _fail(f"{where} must be an object")
    check_json_data(state, where, max_items=10_000)
    _int_in(state, "last_epoch", where, -(2**62), 2**62, optional=True)
    _get(state, "last_lr", (int, float), where, optional=True)


def checksum_function(version: int) -> Callable[[Any, int], int]:
    """The tensor checksum of a manifest ``version``: ``f(buffer, running_value) -> int``, chainable."""
    return _CHECKSUM_FUNCTIONS[TENSOR_CHECKSUMS[version]]


@dataclasses.dataclass
class TensorRecord:
    name: str
    dtype: str
    shape: List[int]  # the whole tensor's, also for a piece
    offset: int
    nbytes: int  # the bytes this record holds in the data file (a piece's: stop - start)
    checksum: int  # of those bytes, with the manifest version's algorithm
    # spread writes: this record holds bytes [start, stop) of the tensor's bytes, not the whole tensor
    piece: Optional[Tuple[int, int]] = None

    def to_json(self, version: int = VERSION) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d[TENSOR_CHECKSUMS[version]] = d.pop("checksum")
        if self.piece is None:
            del d["piece"]
        return d

    @property
    def whole_nbytes(self) -> int:
        """The bytes of the whole tensor (its dtype and shape)."""
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    def stored(self) -> Tuple[List[int], np.dtype]:
        """Shape and dtype (``np.empty``'s arguments) of the bytes it holds: the tensor's, or a piece's."""
        if self.piece is not None:
            return [self.nbytes], np.dtype(np.uint8)
        return list(self.shape), DTYPES[self.dtype]

    @classmethod
    def from_json(cls, d: Any, where: str, version: int = VERSION) -> "TensorRecord":
        name = check_text(_get(d, "name", str, where), f"{where}.name", empty=False)
        dtype = _get(d, "dtype", str, where)
        if dtype not in DTYPES:
            raise _fail(f"{where}.dtype {dtype!r} is not an allowed dtype")
        shape = _get(d, "shape", list, where)
        if len(shape) > MAX_NDIM or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_BYTES for s in shape):
            raise _fail(f"{where}.shape {shape!r} is not a list of at most {MAX_NDIM} non-negative integers")
        if math.prod(s for s in shape if s) * DTYPES[dtype].itemsize > MAX_DIM_PRODUCT:
            raise _fail(f"{where}.shape {shape!r} is too large")
        offset = _int_in(d, "offset", where, 0, MAX_BYTES)
        nbytes = _int_in(d, "nbytes", where, 0, MAX_BYTES)
        algorithm = TENSOR_CHECKSUMS[version]
        crc = _int_in(d, algorithm, where, 0, 2**32 - 1)
        expected = math.prod(shape) * DTYPES[dtype].itemsize
        piece: Optional[Tuple[int, int]] = None
        if "piece" in d:
            raw = d["piece"]
            if version < PIECES_VERSION:
                raise _fail(f"{where}.piece: a manifest of version {version} holds whole tensors only")
            if (not isinstance(raw, list) or len(raw) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw)
                    or not 0 <= raw[0] < raw[1] <= expected):
                raise _fail(f"{where}.piece {str(raw)[:100]} is not a byte range [start, stop) of the "
                            f"tensor's {expected} bytes")
            if nbytes != raw[1] - raw[0]:
                raise _fail(f"{where}: nbytes {nbytes} does not match its piece {raw}")
            piece = (raw[0], raw[1])
        elif expected != nbytes:
            raise _fail(f"{where}: nbytes {nbytes} does not match shape {shape} of {dtype} ({expected})")
        return cls(name, dtype, list(shape), offset, nbytes, crc, piece)


@dataclasses.dataclass
class ProgramRecord:
    key: str
    label: str
    tensors: List[TensorRecord]
    lr_scheduler: Optional[Dict[str, Any]] = None

    def to_json(self, version: int = VERSION) -> Dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "lr_scheduler": self.lr_scheduler,
            "tensors": [t.to_json(version) for t in self.tensors],
        }

    @classmethod
    def from_json(cls, d: Any, where: str, version: int = VERSION) -> "ProgramRecord":
        key = check_text(_get(d, "key", str, where), f"{where}.key", max_len=256, empty=False)
        label = check_text(_get(d, "label", str, where), f"{where}.label")
        sched = _get(d, "lr_scheduler", dict, where, optional=True)
        if sched is not None:
            check_lr_scheduler(sched, f"{where}.lr_scheduler")
        raw = _get(d, "tensors", list, where)
        if len(raw) > MAX_TENSORS:
            raise _fail(f"{where} lists more than {MAX_TENSORS} tensors")
        tensors = [TensorRecord.from_json(t, f"{where}.tensors[{i}]", version) for i, t in enumerate(raw)]
        names = [t.name for t in tensors]
        if len(set(names)) != len(names):
            raise _fail(f"{where} lists a tensor twice")
        return cls(key, label, tensors, sched)


@dataclasses.dataclass
class RangeRecord:
    name: str
    epoch_no: int
    max_epoch_num: int
    step: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any, where: str = "range") -> "RangeRecord":
        name = check_text(_get(d, "name", str, where), f"{where}.name", max_len=256)
        epoch_no = _int_in(d, "epoch_no", where, -1, 2**62)
        max_epoch_num = _int_in(d, "max_epoch_num", where, -(2**63), 2**63 - 1)
        step = _int_in(d, "step", where, 0, 2**62, optional=True)
        return cls(name, epoch_no, max_epoch_num, step)


@dataclasses.dataclass
class Manifest:
    number: int
    created: float
    range: RangeRecord
    programs: List[ProgramRecord]
    data_size: int
    rng: Optional[Dict[str, Any]] = None
    paddle_version: str = ""
    ir: str = ""
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    version: int = VERSION

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "number": self.number,
            "created": self.created,
            "paddle_version": self.paddle_version,
            "ir": self.ir,
            "range": self.range.to_json(),
            "rng": self.rng,
            "programs": [p.to_json(self.version) for p in self.programs],
            "files": {DATA_NAME: {"size": self.data_size}},
            "extra": self.extra,
        }

    def dumps(self) -> bytes:
        return seal(self.to_json())

    def program(self, key: str) -> Optional[ProgramRecord]:
        for p in self.programs:
            if p.key == key:
                return p
        return None

    @property
    def checksum(self) -> Callable[[Any, int], int]:
        """The function that checks this manifest's tensors."""
        return checksum_function(self.version)

    @classmethod
    def loads(cls, raw: bytes, data_file_size: Optional[int] = None) -> "Manifest":
        """Parse and validate a manifest (at most :func:`max_manifest_size` of ``data_file_size``, the size of its
        tensors.bin, when known); raises CorruptCheckpointError only."""
        if not isinstance(raw, (bytes, bytearray)):
            raise _fail("not bytes")
        limit = MAX_MANIFEST_SIZE if data_file_size is None else max_manifest_size(data_file_size)
        d = parse_json(bytes(raw), max_size=limit)
        if not isinstance(d, dict):
            raise _fail("top level must be an object")
        check_newer_version(d, FORMAT, max(TENSOR_CHECKSUMS), "manifest")
        unseal(d, "", "the manifest")
        m = cls.from_json(d)
        if len(raw) > max_manifest_size(m.data_size):
            raise _fail(f"{len(raw)} bytes, more than the {max_manifest_size(m.data_size)} allowed for {m.data_size} bytes of data")
        return m

    @classmethod
    def from_json(cls, d: Any) -> "Manifest":
        if not isinstance(d, dict):
            raise _fail("top level must be an object")
        if d.get("format") != FORMAT:
            raise _fail(f"format is {d.get('format')!r}, expected {FORMAT!r}")
        version = _get(d, "version", int, "manifest")
        if version not in TENSOR_CHECKSUMS:
            readable = ", ".join(str(v) for v in sorted(TENSOR_CHECKSUMS))
            raise _fail(f"version {version} is not supported (this paddle-acp reads versions {readable})")
        number = _int_in(d, "number", "manifest", 0, MAX_NUMBER)
        created = _get(d, "created", (int, float), "manifest")
        if not 0 <= created <= MAX_TIME:
            raise _fail(f"manifest.created = {created!r} is not a time between 1970 and 9999")
        rng = _get(d, "rng", dict, "manifest", optional=True)
        if rng is not None:
            rng_schema.validate(rng)
        files = _get(d, "files", dict, "manifest")
        if set(files) != {DATA_NAME}:
            raise _fail(f"files must list exactly {DATA_NAME!r}, got {sorted(files)!r}")
        data_size = _int_in(files[DATA_NAME], "size", f"files.{DATA_NAME}", 0, MAX_BYTES)
        programs = [ProgramRecord.from_json(p, f"programs[{i}]", version) for i, p in enumerate(_get(d, "programs", list, "manifest"))]
        keys = [p.key for p in programs]
        if len(set(keys)) != len(keys):
            raise _fail("a program key is listed twice")
        for p in programs:
            for t in p.tensors:
                if t.offset + t.nbytes > data_size:
                    raise _fail(f"tensor {t.name!r} of program {p.key} lies outside {DATA_NAME} ({data_size} bytes)")
        if sum(len(p.tensors) for p in programs) > MAX_TENSORS:
            raise _fail(f"more than {MAX_TENSORS} tensors")
        extra = _get(d, "extra", dict, "manifest", optional=True) or {}
        check_json_data(extra, "manifest.extra", max_items=1_000_000)
        part = extra.get("part")
        strays = [f"{t.name!r} of program {p.key}" for p in programs for t in p.tensors if t.piece is not None]
        if strays and not (isinstance(part, dict) and isinstance(part.get("share"), dict)):  # only a share has pieces
            raise _fail(f"tensor {strays[0]} is a piece of a tensor, but this is no part of a checkpoint whose ranks "
                        "wrote shares (extra.part.share)")
        if extra.get("epoch_start_rng") is not None:
            rng_schema.validate(extra["epoch_start_rng"])
        for key in ("objects", "epoch_start_objects"):  # the script's own state
            if extra.get(key) is not None:
                objstate.validate(extra[key], f"manifest.extra.{key}")
        return cls(
            number=number,
            created=float(created),
            range=RangeRecord.from_json(_get(d, "range", dict, "manifest")),
            programs=programs,
            data_size=data_size,
            rng=rng,
            paddle_version=check_text(_get(d, "paddle_version", str, "manifest"), "manifest.paddle_version", max_len=256),
            ir=check_text(_get(d, "ir", str, "manifest"), "manifest.ir", max_len=256),
            extra=extra,
            version=version,
        )


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
