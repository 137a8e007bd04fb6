"""Keeping credentials out of messages, logs, files and metrics.

URIs' user info and credential query values, PaddleCloud's UGI password and AWS secrets are registered by
``open_storage`` and ``config.from_env``; :func:`scrub` replaces them, in every "paddle_acp" log record too.
"""

from __future__ import annotations

import logging
import re
from typing import List, Optional, Set
from urllib.parse import parse_qsl, quote, unquote, urlparse

logger = logging.getLogger("paddle_acp")

_SECRETS: Set[str] = set()
_MIN_SECRET = 3  # shorter values (an "x") would mangle every message; nothing that short is a secret


def redact(uri: object) -> str:
    """The URI without query parameters, fragment or user info (they may hold credentials)."""
    if not isinstance(uri, str):
        return repr(uri)
    if "://" not in uri:
        return uri
    p = urlparse(uri)
    if not p.scheme or len(p.scheme) == 1:
        return uri
    netloc = p.netloc.rpartition("@")[2]  # not .hostname: that lowercases the bucket
    return f"{p.scheme}://{netloc}{p.path}"


def register_secret(value: Optional[str]) -> None:
    if isinstance(value, str) and len(value) >= _MIN_SECRET:
        _SECRETS.add(value)
        q = quote(value, safe="")
        if q != value:
            _SECRETS.add(q)


_SECRET_KEY_RE = re.compile(r"key|secret|token|pass|pwd|sig|cred|auth|session", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether ``name`` (a query parameter, a dict key) is named like a credential: its value is shown as ``***``."""
    return bool(_SECRET_KEY_RE.search(name))


def uri_secrets(uri: str) -> List[str]:
    """The parts of ``uri`` that may hold credentials: user info, the password alone, credential-named query values."""
    if not isinstance(uri, str) or "://" not in uri:
        return []
    p = urlparse(uri)
    out = []
    userinfo = p.netloc.rpartition("@")[0]
    if userinfo:
        out.append(userinfo)
        user, _, password = userinfo.partition(":")
        out += [password, unquote(password), unquote(user) if password else ""]
    for key, value in parse_qsl(p.query, keep_blank_values=True):
        if secret_name(key):  # not endpoint_override or scheme: "http" is no secret
            out.append(value)
    return [x for x in out if x]


def register_uri(uri: str) -> None:
    for value in uri_secrets(uri):
        register_secret(value)


def scrub(text: object) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    out = str(text)
    for value in sorted(_SECRETS, key=len, reverse=True):
        if value in out:
            out = out.replace(value, "***")
    return out


class _ScrubFilter(logging.Filter):
    """Replaces registered secrets in a record's message and traceback (a backstop to redacted URIs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _SECRETS:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error path
            return True
        record.msg, record.args = scrub(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


if not any(isinstance(f, _ScrubFilter) for f in logger.filters):
    logger.addFilter(_ScrubFilter())
