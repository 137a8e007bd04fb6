"""Storage layer: one small interface over local disks, HDFS and S3, chosen by URI.

``base`` (the interface and its capabilities), ``arrow`` (what every pyarrow filesystem shares), ``local``, ``s3``,
``hdfs`` (+ ``hadoop_cli``), ``schemes`` (scheme -> class); ``etcd``: a tiny etcd v3 client for the ranks'
coordination (no checkpoint backend: :mod:`paddle_acp.runtime.coord.etcd`). Redaction of credentials is
:mod:`paddle_acp.secrets` (below every layer; re-exported here)."""

from paddle_acp.secrets import redact, scrub
from paddle_acp.storage.arrow import ArrowStorage
from paddle_acp.storage.base import MANIFEST_LAST, RENAME, WRITE_CHUNK, Entry, Storage
from paddle_acp.storage.hdfs import HdfsStorage
from paddle_acp.storage.local import LocalStorage
from paddle_acp.storage.s3 import S3Storage
from paddle_acp.storage.schemes import open_storage, register_backend

__all__ = ["WRITE_CHUNK", "RENAME", "MANIFEST_LAST", "Entry", "Storage", "ArrowStorage", "LocalStorage",
           "S3Storage", "HdfsStorage", "open_storage", "register_backend", "redact", "scrub"]
