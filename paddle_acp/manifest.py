"""Manifest: the JSON document that describes (and commits) one checkpoint.

It is data, never code: no pickle, every field type-checked on load, names
validated, offsets bounded by the data file's size, dtypes from an allow-list.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import zlib
from typing import Any, Callable, Dict, List, Optional

import crc32c
import numpy as np

from .errors import CorruptCheckpointError

FORMAT = "paddle-acp/checkpoint"
VERSION = 2  # what this paddle-acp writes
# version -> the checksum of each tensor's bytes (also its JSON key). Version 1 is still read.
TENSOR_CHECKSUMS: Dict[int, str] = {1: "crc32", 2: "crc32c"}
# (data, running value) -> value: both release the GIL; CRC32C uses the CPU's crc32 instruction
_CHECKSUM_FUNCTIONS: Dict[str, Callable[[Any, int], int]] = {"crc32": zlib.crc32, "crc32c": crc32c.crc32c}
MANIFEST_NAME = "manifest.json"
DATA_NAME = "tensors.bin"
ALIGN = 64

# dtype name -> numpy storage dtype (bfloat16 is stored as its raw 16 bits).
DTYPES: Dict[str, np.dtype] = {
    "float16": np.dtype("float16"),
    "bfloat16": np.dtype("uint16"),
    "float32": np.dtype("float32"),
    "float64": np.dtype("float64"),
    "int8": np.dtype("int8"),
    "uint8": np.dtype("uint8"),
    "int16": np.dtype("int16"),
    "int32": np.dtype("int32"),
    "int64": np.dtype("int64"),
    "bool": np.dtype("bool"),
    "complex64": np.dtype("complex64"),
    "complex128": np.dtype("complex128"),
}

_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
MAX_NDIM = 16


def _fail(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"invalid manifest: {msg}")


def _get(d: Dict[str, Any], key: str, types, where: str, optional: bool = False):
    if not isinstance(d, dict):
        raise _fail(f"{where} must be an object")
    if key not in d:
        if optional:
            return None
        raise _fail(f"{where}.{key} is missing")
    value = d[key]
    if optional and value is None:
        return None
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _fail(f"{where}.{key} has the wrong type")
    if not isinstance(value, types):
        raise _fail(f"{where}.{key} has the wrong type ({type(value).__name__})")
    return value


def checksum_function(version: int) -> Callable[[Any, int], int]:
    """The tensor checksum of a manifest ``version``: ``f(buffer, running_value) -> int``, chainable."""
    return _CHECKSUM_FUNCTIONS[TENSOR_CHECKSUMS[version]]


def check_file_name(name: str, where: str = "file") -> str:
    if not isinstance(name, str) or not _FILE_RE.match(name) or ".." in name:
        raise _fail(f"{where} name {name!r} is not a plain file name inside the checkpoint")
    return name


@dataclasses.dataclass
class TensorRecord:
    name: str
    dtype: str
    shape: List[int]
    offset: int
    nbytes: int
    checksum: int  # of the tensor's bytes, with the manifest version's algorithm

    def to_json(self, version: int = VERSION):
        d = dataclasses.asdict(self)
        d[TENSOR_CHECKSUMS[version]] = d.pop("checksum")
        return d

    @classmethod
    def from_json(cls, d, where, version: int = VERSION):
        name = _get(d, "name", str, where)
        if not name or len(name) > 4096:
            raise _fail(f"{where}.name is empty or too long")
        dtype = _get(d, "dtype", str, where)
        if dtype not in DTYPES:
            raise _fail(f"{where}.dtype {dtype!r} is not an allowed dtype")
        shape = _get(d, "shape", list, where)
        if len(shape) > MAX_NDIM or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
            raise _fail(f"{where}.shape {shape!r} is not a list of non-negative integers")
        offset = _get(d, "offset", int, where)
        nbytes = _get(d, "nbytes", int, where)
        algorithm = TENSOR_CHECKSUMS[version]
        crc = _get(d, algorithm, int, where)
        if offset < 0 or nbytes < 0 or not 0 <= crc < 2**32:
            raise _fail(f"{where}: negative offset/size or bad {algorithm}")
        expected = math.prod(shape) * DTYPES[dtype].itemsize
        if expected != nbytes:
            raise _fail(f"{where}: nbytes {nbytes} does not match shape {shape} of {dtype} ({expected})")
        return cls(name, dtype, list(shape), offset, nbytes, crc)


@dataclasses.dataclass
class ProgramRecord:
    key: str
    label: str
    tensors: List[TensorRecord]
    lr_scheduler: Optional[Dict[str, Any]] = None

    def to_json(self, version: int = VERSION):
        return {
            "key": self.key,
            "label": self.label,
            "lr_scheduler": self.lr_scheduler,
            "tensors": [t.to_json(version) for t in self.tensors],
        }

    @classmethod
    def from_json(cls, d, where, version: int = VERSION):
        key = _get(d, "key", str, where)
        if not key:
            raise _fail(f"{where}.key is empty")
        label = _get(d, "label", str, where)
        sched = _get(d, "lr_scheduler", dict, where, optional=True)
        raw = _get(d, "tensors", list, where)
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

    def to_json(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d, where="range"):
        name = _get(d, "name", str, where)
        epoch_no = _get(d, "epoch_no", int, where)
        max_epoch_num = _get(d, "max_epoch_num", int, where)
        step = _get(d, "step", int, where, optional=True)
        if epoch_no < -1:
            raise _fail(f"{where}.epoch_no {epoch_no} < -1")
        if step is not None and step < 0:
            raise _fail(f"{where}.step {step} < 0")
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
        """The function that checks this manifest's tensors (see :func:`checksum_function`)."""
        return checksum_function(self.version)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for p in self.programs for t in p.tensors)

    @classmethod
    def loads(cls, raw: bytes) -> "Manifest":
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _fail(f"not valid JSON ({exc})") from None
        if not isinstance(d, dict):
            raise _fail("top level must be an object")
        checksum = d.pop("checksum", None)
        try:
            actual = _doc_checksum(d)
        except ValueError:
            raise _fail("contains NaN or infinity") from None
        if not isinstance(checksum, int) or isinstance(checksum, bool) or checksum != actual:
            raise _fail("checksum mismatch (the manifest was modified or damaged)")
        return cls.from_json(d)

    @classmethod
    def from_json(cls, d) -> "Manifest":
        if not isinstance(d, dict):
            raise _fail("top level must be an object")
        if d.get("format") != FORMAT:
            raise _fail(f"format is {d.get('format')!r}, expected {FORMAT!r}")
        version = _get(d, "version", int, "manifest")
        if version not in TENSOR_CHECKSUMS:
            readable = ", ".join(str(v) for v in sorted(TENSOR_CHECKSUMS))
            raise _fail(f"version {version} is not supported (this paddle-acp reads versions {readable})")
        number = _get(d, "number", int, "manifest")
        created = _get(d, "created", (int, float), "manifest")
        rng = _get(d, "rng", dict, "manifest", optional=True)
        files = _get(d, "files", dict, "manifest")
        if set(files) != {DATA_NAME}:
            raise _fail(f"files must list exactly {DATA_NAME!r}, got {sorted(files)!r}")
        for name in files:
            check_file_name(name)
        data_size = _get(files[DATA_NAME], "size", int, f"files.{DATA_NAME}")
        if data_size < 0:
            raise _fail("negative data size")
        programs = [ProgramRecord.from_json(p, f"programs[{i}]", version) for i, p in enumerate(_get(d, "programs", list, "manifest"))]
        keys = [p.key for p in programs]
        if len(set(keys)) != len(keys):
            raise _fail("a program key is listed twice")
        for p in programs:
            for t in p.tensors:
                if t.offset + t.nbytes > data_size:
                    raise _fail(f"tensor {t.name!r} of program {p.key} lies outside {DATA_NAME} ({data_size} bytes)")
        extra = _get(d, "extra", dict, "manifest", optional=True) or {}
        return cls(
            number=number,
            created=float(created),
            range=RangeRecord.from_json(_get(d, "range", dict, "manifest")),
            programs=programs,
            data_size=data_size,
            rng=rng,
            paddle_version=_get(d, "paddle_version", str, "manifest"),
            ir=_get(d, "ir", str, "manifest"),
            extra=extra,
            version=version,
        )


def _doc_checksum(doc: Dict[str, Any]) -> int:
    canon = json.dumps(doc, sort_keys=True, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return zlib.crc32(canon) & 0xFFFFFFFF


def seal(doc: Dict[str, Any]) -> bytes:
    """Encode a manifest document with its checksum (the form written to storage)."""
    doc = dict(doc)
    doc.pop("checksum", None)
    doc["checksum"] = _doc_checksum(doc)
    return json.dumps(doc, sort_keys=True, allow_nan=False).encode("utf-8")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
