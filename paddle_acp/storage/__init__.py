"""Storage layer: one small interface over local disks, HDFS and S3, chosen by URI."""

from paddle_acp.storage.base import WRITE_CHUNK, Entry, Storage, open_storage, redact, scrub

__all__ = ["WRITE_CHUNK", "Entry", "Storage", "open_storage", "redact", "scrub"]
