"""S3 and S3-compatible object stores (``s3://bucket/prefix``), through ``pyarrow.fs.S3FileSystem``.

No atomic directory rename: a checkpoint is committed by writing its manifest after its data (``MANIFEST_LAST``).
Credentials come from the AWS variables (or, discouraged, the URI); the endpoint from ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL`` or the URI's query."""

from __future__ import annotations

import posixpath
from typing import Any, Dict, Union
from urllib.parse import ParseResult, parse_qsl, unquote, urlparse

import pyarrow
import pyarrow.fs as pafs

from paddle_acp.config import DEFAULT_CONNECT_TIMEOUT, StorageOptions
from paddle_acp.errors import ConfigError
from paddle_acp.storage.arrow import ArrowStorage
from paddle_acp.storage.base import MANIFEST_LAST, redact, register_secret, scrub

# S3 error codes (as pyarrow reports them) of refused credentials: a HEAD request's 403 has no body to explain it
_S3_AUTH_HINTS = (
    ("SIGNATURE_DOES_NOT_MATCH", "the S3 secret key is wrong (AWS_SECRET_ACCESS_KEY or the URI's secret_key)"),
    ("INVALID_ACCESS_KEY_ID", "the S3 access key id is unknown to the server (AWS_ACCESS_KEY_ID or the URI's access_key)"),
    ("ACCESS_DENIED", "S3 denied access: wrong credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) "
                      "or no permission on this bucket for this key"),
)

_CREDENTIALS_HINT = (" (credentials belong in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, not in the URI: "
                     "a URI is copied into logs, shell histories and job specs)")

_BOOL_OPTIONS = ("allow_bucket_creation", "allow_bucket_deletion", "force_virtual_addressing")
_STR_OPTIONS = ("region", "scheme", "endpoint_override", "access_key", "secret_key", "session_token",
                "role_arn", "session_name", "external_id")


def s3_hint(exc: BaseException, connect_timeout: float) -> str:
    text = str(exc)
    for code, hint in _S3_AUTH_HINTS:
        if code in text:
            return f" ({hint})"
    if "NETWORK_CONNECTION" in text or "curlCode: 28" in text:  # no connection, or it timed out
        return (f" (cannot connect to the S3 endpoint; each attempt is bounded by "
                f"PADDLE_ACP_CONNECT_TIMEOUT={connect_timeout:g} s)")
    return ""


class S3Storage(ArrowStorage):
    """Objects under ``bucket/prefix``; committed manifest-last."""

    commit_style = MANIFEST_LAST
    overlap_writes = True

    def __init__(self, fs: Any, root: str, uri: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT):
        super().__init__(fs, root, uri)
        self.connect_timeout = connect_timeout

    def hint(self, exc: BaseException) -> str:
        return s3_hint(exc, self.connect_timeout)

    def _delete_dir(self, path: str) -> None:
        """The deepest sub-directories first: a service that keeps folders (SeaweedFS) leaves an emptied nested
        folder behind a prefix's deletion, listed ever after."""
        for e in self.listdir(path):
            if e.is_dir:
                self._delete_dir(posixpath.join(path, e.name))
        super()._delete_dir(path)

    @classmethod
    def from_uri(cls, uri: str, parsed: ParseResult, options: StorageOptions) -> "S3Storage":
        if not parsed.netloc:
            raise ConfigError(f"checkpoint URI {redact(uri)!r}: an s3:// URI needs a bucket (s3://bucket/prefix)")
        aws = options.s3
        for secret in aws.secrets:
            register_secret(secret)
        bucket = parsed.netloc.rpartition("@")[2]  # user info never becomes part of a path
        timeouts = dict(connect_timeout=options.connect_timeout, request_timeout=max(options.connect_timeout, 60.0))
        try:
            if parsed.query or not aws.endpoint:
                fs, root = pafs.FileSystem.from_uri(uri)
                if isinstance(fs, pafs.S3FileSystem):
                    fs = _with_s3_timeouts(parsed, timeouts)
            else:
                ep = urlparse(aws.endpoint)
                creds = {}
                if parsed.password is not None:  # s3://KEY:SECRET@bucket/... (pyarrow's own URI form)
                    creds = dict(access_key=unquote(parsed.username or ""), secret_key=unquote(parsed.password))
                fs = pafs.S3FileSystem(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https",
                                       region=aws.region, **creds, **timeouts)
                root = (bucket + parsed.path).rstrip("/")
        except (pyarrow.ArrowException, OSError, ValueError, TypeError) as exc:
            # from None: the original text may quote the URI, credentials included
            raise ConfigError(f"checkpoint URI {redact(uri)!r}: cannot configure S3: {scrub(exc)}{_CREDENTIALS_HINT}") from None
        return cls(fs, str(root), uri, options.connect_timeout)


def _with_s3_timeouts(parsed: ParseResult, timeouts: Dict[str, float]) -> Any:
    """The S3 filesystem of the URI's options (as pyarrow parses them) with timeouts, which ``from_uri`` cannot set."""
    opts: Dict[str, Union[str, bool]] = {}
    for key, value in parse_qsl(parsed.query, keep_blank_values=True):
        if key in _STR_OPTIONS:
            opts[key] = value
        elif key in _BOOL_OPTIONS:
            opts[key] = value.lower() in ("1", "true", "yes")
    if parsed.password is not None and "access_key" not in opts:
        opts.update(access_key=unquote(parsed.username or ""), secret_key=unquote(parsed.password))
    return pafs.S3FileSystem(**opts, **timeouts)
