"""The node-local cache's key: which directory of ``PADDLE_ACP_LOCAL_CACHE=DIR`` holds a remote location's copies.

One directory per remote checkpoint location, ``DIR/<key>/`` (:func:`cache_key`): keys keep jobs and
locations apart, so that one location's retention never deletes another's copies, and never hold user
info or query values (credentials). :mod:`~paddle_acp.format.checkpoints.cache` owns what is inside.
"""

from __future__ import annotations

import hashlib
import re
from typing import Optional
from urllib.parse import parse_qsl, urlencode, urlsplit

from paddle_acp.storage.base import redact

_SAFE = re.compile(r"[^A-Za-z0-9._-]+", re.ASCII)
# query parameters that name a different store (never credentials)
_IDENTITY_PARAMS = ("endpoint_override", "scheme")


def canonical_location(uri: str, s3_endpoint: Optional[str] = None) -> str:
    """The remote location ``uri`` names, without user info, credentials (query parameters other than the
    endpoint) or a trailing or doubled ``/``. For ``s3://`` without ``endpoint_override`` it includes
    ``s3_endpoint`` (:class:`~paddle_acp.config.StorageOptions`): the same bucket on another server differs."""
    p = urlsplit(uri.strip())
    scheme = p.scheme.lower()
    netloc = p.netloc.rpartition("@")[2]
    host = netloc if scheme == "s3" else netloc.lower()  # bucket names are case-sensitive
    path = "/" + "/".join(seg for seg in p.path.split("/") if seg not in ("", "."))
    params = sorted((k, v.rpartition("@")[2]) for k, v in parse_qsl(p.query, keep_blank_values=True)
                    if k in _IDENTITY_PARAMS)
    if scheme == "s3" and not any(k == "endpoint_override" for k, _v in params):
        if s3_endpoint:
            params.append(("endpoint", redact(s3_endpoint.strip())))
    return f"{scheme}://{host}{path}" + ("?" + urlencode(params) if params else "")


def cache_key(uri: str, s3_endpoint: Optional[str] = None) -> str:
    """The cache directory name of ``uri``: ``<scheme>-<slug>-<hash>`` (hash: SHA-256 of
    :func:`canonical_location`; slug: host and last path component, for people). No user info or query values."""
    canon = canonical_location(uri, s3_endpoint)
    p = urlsplit(canon)
    scheme = re.sub(r"[^a-z0-9]", "", p.scheme.lower(), flags=re.ASCII)[:16] or "x"
    last = p.path.rstrip("/").rpartition("/")[2]
    slug = _SAFE.sub("_", f"{p.netloc}_{last}" if last else p.netloc).strip("._-")[:48].strip("._-")
    digest = hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{scheme}-{slug}-{digest}"
