"""Untrusted JSON documents: how every record on storage (manifest, global record, plan, markers) is parsed, checked
field by field (CorruptCheckpointError naming the field) and sealed with its checksum."""

from __future__ import annotations

import json
import math
import re
import zlib
from typing import Any, Dict

import numpy as np

from paddle_acp.errors import CorruptCheckpointError, UnknownFormatError

MAX_DEPTH = 32  # JSON nesting (paddle-acp writes 6 levels; a data loader's state may add some)
MAX_INT = 2**64  # any integer anywhere in a manifest: |x| < 2**64 (RNG seeds are 64-bit)
MAX_TEXT = 4096  # names, labels, versions
MAX_DOCUMENT_SIZE = 64 << 20  # bytes of any document (a manifest's own bound is lower: max_manifest_size)


def _fail(msg: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"invalid manifest: {msg}")


# a JSON string (escapes included): removed before brackets are counted
_JSON_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = np.zeros(256, dtype=np.int8)
_BRACKETS[[ord("["), ord("{")]] = 1
_BRACKETS[[ord("]"), ord("}")]] = -1


def nesting_depth(raw: bytes) -> int:
    """The deepest array/object nesting of a JSON text, found without parsing (the parser recurses: RecursionError)."""
    stripped = _JSON_STRING_RE.sub(b"", raw)
    if not stripped:
        return 0
    depth = np.cumsum(_BRACKETS[np.frombuffer(stripped, dtype=np.uint8)], dtype=np.int64)
    return int(depth.max())


def _parse_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e400 parses as infinity
        raise ValueError(f"number {text[:24]} is out of range")
    return v


def _parse_constant(text: str) -> Any:
    raise ValueError(f"{text} is not allowed")


def parse_json(raw: bytes, what: str = "manifest", max_size: int = MAX_DOCUMENT_SIZE) -> Any:
    """``json.loads`` for untrusted bytes: size and nesting capped, NaN/Infinity refused. Raises CorruptCheckpointError,
    never RecursionError or MemoryError."""
    if len(raw) > max_size:
        raise CorruptCheckpointError(f"invalid {what}: {len(raw)} bytes, more than the {max_size} allowed")
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise CorruptCheckpointError(f"invalid {what}: nested {depth} deep (at most {MAX_DEPTH})")
    try:
        return json.loads(raw.decode("utf-8"), parse_float=_parse_float, parse_constant=_parse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError, MemoryError) as exc:
        raise CorruptCheckpointError(f"invalid {what}: not valid JSON ({str(exc)[:200]})") from None


def check_newer_version(d: Any, fmt: str, known: int, what: str) -> None:
    """UnknownFormatError when document ``d`` of format ``fmt`` has a version above ``known``: decided before anything
    else is checked (a newer paddle-acp's checksums and fields may differ)."""
    if not isinstance(d, dict) or d.get("format") != fmt:
        return
    version = d.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and known < version < MAX_INT:
        raise UnknownFormatError(
            f"{what} format version {version} is newer than this paddle-acp reads (up to {known}): "
            "a newer paddle-acp wrote it; resume with that paddle-acp (or a newer one)"
        )


def check_text(value: Any, where: str, max_len: int = MAX_TEXT, empty: bool = True) -> str:
    """A string that can be logged and passed to Paddle: bounded, encodable as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str):
        raise _fail(f"{where} must be a string")
    if len(value) > max_len or (not empty and not value):
        raise _fail(f"{where} is empty or longer than {max_len} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(f"{where} is not valid text (lone surrogate)") from None
    return value


def _int_in(d: Any, key: str, where: str, lo: int, hi: int, optional: bool = False) -> Any:
    v = _get(d, key, int, where, optional=optional)
    if v is not None and not lo <= v <= hi:
        raise _fail(f"{where}.{key} = {v} is out of range [{lo}, {hi}]")
    return v


def check_json_data(value: Any, where: str, max_items: int = 100_000) -> None:
    """JSON data as paddle-acp writes it (LR scheduler, RNG and loader state): plain types, string keys, encodable
    texts, integers below 2**64 in magnitude, at most ``max_items`` values."""
    stack, n = [(value, where)], 0
    while stack:
        v, w = stack.pop()
        n += 1
        if n > max_items:
            raise _fail(f"{where} holds more than {max_items} values")
        if v is None or isinstance(v, (bool, float)):
            continue
        if isinstance(v, int):
            if not -MAX_INT < v < MAX_INT:
                raise _fail(f"{w} = {v} is out of range")
            continue
        if isinstance(v, str):
            check_text(v, w, max_len=1 << 20)
        elif isinstance(v, list):
            stack.extend((x, f"{w}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, dict):
            for k, x in v.items():
                check_text(k, f"{w} key", max_len=MAX_TEXT)
                stack.append((x, f"{w}.{k}"))
        else:
            raise _fail(f"{w} has the wrong type ({type(v).__name__})")


def _get(d: Any, key: str, types: Any, where: str, optional: bool = False) -> Any:
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


def _doc_checksum(doc: Dict[str, Any]) -> int:
    canon = json.dumps(doc, sort_keys=True, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return zlib.crc32(canon) & 0xFFFFFFFF


def unseal(d: Dict[str, Any], what: str, damaged: str) -> None:
    """Take the checksum out of document ``d`` (parsed by :func:`parse_json`: no NaN) and check it; it guards against
    accidents, not edits."""
    checksum = d.pop("checksum", None)
    if not isinstance(checksum, int) or isinstance(checksum, bool) or checksum != _doc_checksum(d):
        raise _fail(f"{what}checksum mismatch ({damaged} was modified or damaged)")


def seal(doc: Dict[str, Any]) -> bytes:
    """Encode a document with its checksum (the form written to storage)."""
    doc = dict(doc)
    doc.pop("checksum", None)
    doc["checksum"] = _doc_checksum(doc)
    return json.dumps(doc, sort_keys=True, allow_nan=False).encode("utf-8")
