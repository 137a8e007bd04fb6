"""A tiny etcd v3 client over etcd's JSON gateway (``POST /v3/...``), for the ranks' coordination.

Paddle's elastic launcher uses PyPI's ``etcd3``, not a Paddle dependency and with protobuf modules that clash with
Paddle's: a trainer cannot use it. Every etcd v3 server (``/v3`` since 3.4) serves the same calls as JSON over HTTP
(keys and values base64, 64-bit integers as decimal strings), spoken here with :mod:`http.client` only. Every call is
bounded (one connection, ``timeout`` seconds for the connect and each read, an answer of at most :data:`MAX_ANSWER`
bytes); a failure, or an answer that is not etcd's, raises :class:`EtcdError` naming HOST:PORT and what failed."""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from paddle_acp.errors import StorageError
from paddle_acp.secrets import only_host_port, redact

MAX_TXN_OPS = 128  # operations per transaction (etcd's --max-txn-ops default)
MAX_ANSWER = 4 << 20  # bytes of one answer (the save plan is far smaller; etcd's own request limit is 1.5 MiB)
_HOST_RE = re.compile(r"\A(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)\Z")


class EtcdError(StorageError):
    """An etcd call failed (unreachable, timed out, refused) or etcd answered something else than etcd does."""


def parse_endpoint(text: str) -> Tuple[str, int]:
    """``(host, port)`` of ``etcd://HOST:PORT``, ``http://HOST:PORT`` or ``HOST:PORT`` (the first of a
    comma-separated list); ValueError otherwise (no https, no user info)."""
    first = text.strip().split(",")[0].strip()
    scheme, sep, rest = first.partition("://")
    if not sep:
        scheme, rest = "etcd", first
    if scheme not in ("etcd", "http"):
        raise ValueError(f"{redact(first)!r}: the scheme must be etcd:// or http:// (no TLS here)")
    only_host_port(rest, first)
    host, colon, port = rest.rstrip("/").rpartition(":")
    if not colon or not _HOST_RE.match(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{redact(first)!r}: not HOST:PORT with a port in 1-65535")
    return host.strip("[]"), int(port)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise EtcdError(f"etcd answered a {type(text).__name__} for {what}, not base64 text")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise EtcdError(f"etcd answered {what} that is not base64 ({exc})") from None


def _int(d: Dict[str, Any], name: str, default: Optional[int] = None) -> int:
    v = d.get(name)
    if v is None and default is not None:
        return default
    if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).lstrip("-").isdigit() or len(str(v)) > 20:
        raise EtcdError(f"etcd answered {name}={v!r}, not an integer")
    return int(v)


def put_op(key: bytes, value: bytes, lease: int = 0) -> Dict[str, Any]:
    op: Dict[str, Any] = {"key": b64(key), "value": b64(value)}
    if lease:
        op["lease"] = str(lease)
    return op


def count_op(prefix: bytes) -> Dict[str, Any]:
    """A range request counting the keys under ``prefix`` (non-empty, not ending in 0xff)."""
    if not prefix or prefix[-1] == 0xFF:
        raise ValueError(f"no range ends after the prefix {prefix!r}")
    return {"key": b64(prefix), "range_end": b64(prefix[:-1] + bytes([prefix[-1] + 1])), "count_only": True}


def range_answer(answer: Dict[str, Any], key: bytes) -> Optional[bytes]:
    """The value of ``key`` in a ``/v3/kv/range`` answer, or None when it has none."""
    kvs = answer.get("kvs", [])
    if not isinstance(kvs, list) or len(kvs) > 1:
        raise EtcdError(f"etcd answered {type(kvs).__name__} kvs of {len(kvs) if isinstance(kvs, list) else '?'} "
                        "entries for one key")
    if not kvs:
        return None
    kv = kvs[0]
    if not isinstance(kv, dict) or unb64(kv.get("key"), "a key") != key:
        raise EtcdError("etcd answered another key than the one asked for")
    return unb64(kv.get("value", ""), "a value")  # an empty value is left out of the answer


class EtcdClient:
    """Calls to one etcd server (module docstring); ``timeout``: seconds for the connect and each read."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        self.host, self.port = parse_endpoint(endpoint)
        self.timeout = timeout

    def __str__(self) -> str:
        return f"etcd at {self.host}:{self.port}"

    def call(self, path: str, body: Dict[str, Any]) -> Dict[str, Any]:
        """One POST of ``body`` as JSON to ``path``; the answer's JSON object."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request("POST", path, body=json.dumps(body).encode("ascii"),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER + 1)
            status = resp.status
        except (OSError, http.client.HTTPException) as exc:
            raise EtcdError(f"{self}: {path} failed ({type(exc).__name__}: {exc})") from None
        finally:
            conn.close()
        if len(raw) > MAX_ANSWER:
            raise EtcdError(f"{self}: {path} answered more than {MAX_ANSWER} bytes")
        try:
            answer = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError):
            answer = None
        if status != 200:
            msg = answer.get("message") if isinstance(answer, dict) else None
            text = msg if isinstance(msg, str) else raw[:200].decode("utf-8", "replace")
            raise EtcdError(f"{self}: {path} answered HTTP {status}: {text}")
        if not isinstance(answer, dict):
            raise EtcdError(f"{self}: {path} answered something other than a JSON object")
        return answer

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        self.call("/v3/kv/put", put_op(key, value, lease))

    def get(self, key: bytes) -> Optional[bytes]:
        return range_answer(self.call("/v3/kv/range", {"key": b64(key)}), key)

    def txn(self, ops: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Answers to ``ops`` (``request_put`` / ``request_range`` dicts), one transaction per :data:`MAX_TXN_OPS`."""
        out: List[Dict[str, Any]] = []
        for i in range(0, len(ops), MAX_TXN_OPS):
            chunk = ops[i:i + MAX_TXN_OPS]
            responses = self.call("/v3/kv/txn", {"success": list(chunk)}).get("responses", [])
            if not isinstance(responses, list) or len(responses) != len(chunk) or \
                    not all(isinstance(r, dict) and len(r) == 1 for r in responses):
                raise EtcdError(f"{self}: a transaction of {len(chunk)} operations answered something else")
            for r in responses:
                answer = next(iter(r.values()))
                out.append(answer if isinstance(answer, dict) else {})
        return out

    def puts(self, items: Sequence[Tuple[bytes, bytes]], lease: int = 0) -> None:
        """Put every ``(key, value)`` of ``items``: one transaction for up to :data:`MAX_TXN_OPS` of them."""
        self.txn([{"request_put": put_op(k, v, lease)} for k, v in items])

    def gets(self, keys: Sequence[bytes]) -> List[Optional[bytes]]:
        """The value of each of ``keys`` (None where there is none)."""
        answers = self.txn([{"request_range": {"key": b64(k)}} for k in keys])
        return [range_answer(a, k) for a, k in zip(answers, keys)]

    def counts(self, prefixes: Sequence[bytes]) -> List[int]:
        """How many keys start with each of ``prefixes``."""
        return [_int(a, "count", 0) for a in self.txn([{"request_range": count_op(p)} for p in prefixes])]

    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        answer = self.call("/v3/lease/grant", {"TTL": str(ttl)})
        if answer.get("error"):
            raise EtcdError(f"{self}: no lease granted: {str(answer['error'])[:200]}")
        lease = _int(answer, "ID")
        if lease <= 0:
            raise EtcdError(f"{self}: granted lease id {lease}")
        return lease

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``: the seconds it has now, 0 when it expired (its keys are gone)."""
        result = self.call("/v3/lease/keepalive", {"ID": str(lease)}).get("result")
        if not isinstance(result, dict):
            raise EtcdError(f"{self}: the lease keep-alive answered no result")
        return _int(result, "TTL", 0)

