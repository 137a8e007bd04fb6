"""Which backend serves a URI: one table from scheme to class (the one place that decides)."""

from __future__ import annotations

from typing import Callable, Dict, Optional
from urllib.parse import ParseResult, urlparse

from paddle_acp.config import StorageOptions, storage_options_from_env
from paddle_acp.errors import ConfigError
from paddle_acp.storage.base import Storage, redact, register_uri
from paddle_acp.storage.hdfs import HdfsStorage
from paddle_acp.storage.local import LocalStorage
from paddle_acp.storage.s3 import S3Storage

Opener = Callable[[str, ParseResult, StorageOptions], Storage]  # (uri, parsed, options) -> Storage

_BACKENDS: Dict[str, Opener] = {
    "": LocalStorage.from_uri,
    "file": LocalStorage.from_uri,
    "s3": S3Storage.from_uri,
    "hdfs": HdfsStorage.from_uri,
    "viewfs": HdfsStorage.from_uri,
}

# schemes slow to open (libhdfs starts a JVM, ~1 s): opened in the background at import (runtime.early)
SLOW_TO_OPEN = frozenset({"hdfs", "viewfs"})


def slow_to_open(uri: str) -> bool:
    """Whether ``uri``'s backend is slow to open (:data:`SLOW_TO_OPEN`)."""
    try:
        return urlparse(uri).scheme.lower() in SLOW_TO_OPEN
    except ValueError:  # malformed: open_storage says why
        return False


def parse_uri(uri: str) -> ParseResult:
    """``uri`` parsed, its port checked; ConfigError (the URI redacted, Python's text, which may quote a password,
    left out) for an IPv6 host without its "]" or a port that is no number in 0-65535."""
    try:
        parsed = urlparse(uri)
        parsed.port  # noqa: B018 (raises ValueError for a bad port)
    except ValueError as exc:
        if "IPv6" in str(exc):
            why = "an IPv6 host in '[' ']' is not closed or not valid"
        elif "out of range" in str(exc):
            why = "the port is not in 0-65535"
        else:
            why = ("the text after the host's ':' is not a port number (a password holding '/', '?', '#' or '@' "
                   "must be percent-encoded, e.g. '/' as %2F)")
        raise ConfigError(f"checkpoint URI {redact(uri)!r} is malformed: {why}") from None
    return parsed


def register_backend(scheme: str, opener: Opener) -> None:
    """Serve ``scheme://`` URIs with ``opener(uri, parsed, options)`` (the options :func:`open_storage` was given)."""
    _BACKENDS[scheme.lower()] = opener


def open_storage(uri: str, options: Optional[StorageOptions] = None, *, hdfs_user: Optional[str] = None,
                 hadoop_home: Optional[str] = None, cache_dir: Optional[str] = None) -> Storage:
    """The backend of the URI's scheme (a plain path or ``file://``, ``hdfs://``, ``s3://``) opened with
    ``options`` (None: :func:`~paddle_acp.config.storage_options_from_env`); ``hdfs_user``, ``hadoop_home``
    and ``cache_dir``, where given, override those of ``options``."""
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"checkpoint URI {uri!r} is empty")
    register_uri(uri)
    parsed = parse_uri(uri)
    scheme = parsed.scheme.lower()
    opener = _BACKENDS.get(scheme)
    if opener is None:
        raise ConfigError(
            f"checkpoint URI {redact(uri)!r}: unsupported scheme {scheme!r} "
            "(supported: a local path, file://, hdfs://, s3://)"
        )
    options = (options if options is not None else storage_options_from_env()).replace(
        hdfs_user=hdfs_user, hadoop_home=hadoop_home, cache_dir=cache_dir)
    return opener(uri, parsed, options)
