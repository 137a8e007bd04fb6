"""Retention: which committed checkpoints to keep, and the one way to delete one.

Deleting removes the checkpoint's commit file first (its manifest, or the
``global.json`` of a checkpoint of several ranks), then the directory: a
half-deleted checkpoint is never mistaken for a committed one.
"""

from __future__ import annotations

from paddle_acp.format.layout import MANIFEST_NAME
from paddle_acp.storage.base import Storage


def delete_checkpoint(storage: Storage, path: str, commit_file: str = MANIFEST_NAME, committed: bool = True) -> None:
    """Delete the checkpoint directory ``path``: its ``commit_file`` first when ``committed``."""
    if committed:
        # the commit first: a half-deleted checkpoint is never mistaken for a committed one
        storage.delete_file(f"{path}/{commit_file}")
    storage.delete_dir(path)
