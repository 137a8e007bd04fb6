"""Keeping credentials out of messages, logs, files and metrics.

URIs' user info and credential query values, PaddleCloud's UGI password and AWS secrets are registered by
``open_storage`` and ``config.from_env``; :func:`scrub` replaces them, in every "paddle_acp" log record too.
"""

from __future__ import annotations

import logging
import re
from typing import Any, List, Optional, Set, Tuple
from urllib.parse import quote, quote_plus, unquote, unquote_plus

logger = logging.getLogger("paddle_acp")

_SECRETS: Set[str] = set()
_MIN_SECRET = 3  # shorter values (an "x") would mangle every message; nothing that short is a secret


_SCHEME_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9+.-]+://")  # two letters at least: "C://" is a drive
_NAMED_RE = re.compile(r"[?&;]([^=?&;#/@]*)=")  # where a query parameter's value begins
_PARAM_RE = re.compile(r"(?P<name>[^?&;=#]*)=(?P<value>[^&;#]*)")  # a query parameter (split on "&" and ";")


def split_userinfo(uri: str) -> Tuple[str, str, str]:
    """``(scheme://, user info, the rest)``: the user info is everything before the last "@" when that holds a ":"
    and no "/", "?" or "#" before it (a user's name holds none; a password may hold them, "@" or a quote), or, after
    a scheme, the part of the host before an "@" (``s3://KEY@bucket``). In doubt, more is user info (never shown).
    A value without a scheme (``user:pass@host:port``) has user info too; ``scheme://`` is then empty."""
    m = _SCHEME_RE.match(uri)
    prefix, rest = (m.group(0), uri[m.end():]) if m else ("", uri)
    named = (m for m in _NAMED_RE.finditer(rest) if secret_name(unquote_plus(m.group(1))))
    at = rest.rfind("@", 0, next((m.start() for m in named), len(rest)))  # never one in a query secret ("?token=a@b")
    if at >= 0 and ":" in rest[:at] and not re.search(r"[/?#]", rest[:at].partition(":")[0]):
        return prefix, rest[:at], rest[at + 1:]
    if prefix:
        host = re.split(r"[/?#]", rest, maxsplit=1)[0]
        if "@" in host:
            userinfo, _, hostname = host.rpartition("@")
            return prefix, userinfo, hostname + rest[len(host):]
    return prefix, "", rest


def _mask_params(text: str) -> str:
    """``text`` with the value of every credential-named ``name=value`` after a "?", "&" or ";" as ``***``."""
    head, q, query = text.partition("?")
    if not q:
        return text

    def mask(m: "re.Match[str]") -> str:
        return f"{m.group('name')}=***" if secret_name(unquote_plus(m.group("name"))) else m.group(0)

    return head + q + _PARAM_RE.sub(mask, query)


def redact(uri: object) -> str:
    """The URI without query parameters, fragment or user info (they may hold credentials); a value without a
    scheme with its user info as ``***@`` and credential-named query values as ``***``."""
    if not isinstance(uri, str):
        return repr(uri)
    prefix, userinfo, rest = split_userinfo(uri)
    if prefix:
        return prefix + re.split(r"[?#]", rest, maxsplit=1)[0]  # the host as written: .hostname lowercases
    return ("***@" if userinfo else "") + _mask_params(rest)


def only_host_port(endpoint: str, shown: Optional[str] = None) -> None:
    """ValueError showing ``shown`` (default ``endpoint``) redacted where ``endpoint`` (HOST:PORT, after any scheme)
    holds user info, a path or a query: an endpoint's credentials are neither taken nor shown."""
    if "@" in endpoint or "/" in endpoint.rstrip("/") or "?" in endpoint:
        raise ValueError(f"{redact(endpoint if shown is None else shown)!r}: only HOST:PORT (no user info, path or query)")


_TOKEN_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+|[^\s:@]+:\S*@\S+")  # a URI; user:pass@host (no scheme)


def redact_text(text: str) -> str:
    """``text`` with every URI in it redacted (to its end at white space: a password may hold a quote), and every
    ``user:pass@host`` without a scheme as ``***@host``; then registered secrets scrubbed."""
    return scrub(_TOKEN_RE.sub(lambda m: redact(m.group(0)), text))


def redact_arg(word: str) -> str:
    """One command-line argument redacted: a URI (or ``--option=URI``) as :func:`redact` shows it."""
    name, eq, value = word.partition("=")
    if eq and word.startswith("-"):
        return f"{name}={redact_arg(value)}"
    return scrub(redact(word) if ("://" in word or "@" in word or "?" in word) else word)


def redact_command(words: List[str]) -> List[str]:
    """A command line as it may be shown: every argument redacted (:func:`redact_arg`), and the value after an
    option named like a credential (``--password X``) as ``***``."""
    out: List[str] = []
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        hidden = before.startswith("-") and "=" not in before and secret_name(before.lstrip("-"))
        out.append("***" if hidden else redact_arg(word))
    return out


def register_secret(value: Optional[str]) -> None:
    if isinstance(value, str) and len(value) >= _MIN_SECRET:
        _SECRETS.add(value)
        for form in (quote(value, safe=""), quote_plus(value, safe="")):
            if form != value:
                _SECRETS.add(form)


_SECRET_KEY_RE = re.compile(r"key|secret|token|pass|pwd|sig|cred|auth|session", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether ``name`` (a query parameter, a dict key) is named like a credential: its value is shown as ``***``."""
    return bool(_SECRET_KEY_RE.search(name))


def _forms(value: str) -> List[str]:
    """``value`` as written, percent-decoded and "+"-decoded (a parser may echo any of them)."""
    return [value, unquote(value), unquote_plus(value)]


def uri_secrets(uri: str) -> List[str]:
    """The parts of ``uri`` that may hold credentials: user info, the password alone, credential-named query values
    (parameters split on "&" and ";"), each as written and decoded; nested URIs' too. Never raises."""
    if not isinstance(uri, str):
        return []
    _, userinfo, rest = split_userinfo(uri)
    out: List[str] = []
    if userinfo:
        out.append(userinfo)
        user, _, password = userinfo.partition(":")
        if password:
            out += _forms(password) + _forms(user)
    query = rest.partition("?")[2].partition("#")[0]
    for m in _PARAM_RE.finditer(query):
        value = m.group("value")
        if secret_name(unquote_plus(m.group("name"))):  # not endpoint_override or scheme: "http" is no secret
            out += _forms(value)
        elif "://" in unquote(value) or "@" in unquote(value):
            out += uri_secrets(unquote(value))
    return [x for x in dict.fromkeys(out) if x]


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


def scrub_values(obj: Any) -> Any:
    """``obj`` (JSON data) with :func:`scrub` applied to every string value, never to keys, numbers or booleans:
    scrubbed before it is serialised, the JSON stays valid whatever the secret ("true", a quote, non-ASCII)."""
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, dict):
        return {k: scrub_values(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_values(v) for v in obj]
    return obj


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
