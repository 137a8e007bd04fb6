"""A one-process job's range for tests: today's writer (rank 0 of 1), an earlier release's numbered
``ckpt-N`` written by the format engine, the restart's own choice of checkpoint and the committed ones
(either layout: an earlier release's ``ckpt-N``, today's one-part ``ckpt-e{E}[-s{S}]/rank-0``)."""

from __future__ import annotations

import json
import os
import zlib
from typing import List, Optional

from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer, SaveResult
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.commit import atomic
from paddle_acp.format.commit.fencing import Fence
from paddle_acp.format.engine.loaded import LoadedCheckpoint
from paddle_acp.format.engine.snapshot import Snapshot
from paddle_acp.format.engine.writer import WriteResult, write_checkpoint
from paddle_acp.format.layout import GLOBAL_NAME, MANIFEST_NAME, range_dir
from paddle_acp.format.manifest import seal
from paddle_acp.storage import Storage


def one_process(storage: Storage, job_id: str = "job", range_name: str = "_range_0", keep: int = 3,
                fence: Optional[Fence] = None, **kw) -> GlobalCheckpointer:
    """A one-process job's checkpointer: rank 0 of 1 (the runtime's writer for every world size)."""
    return GlobalCheckpointer(storage, job_id, range_name, 0, 1, keep, fence=fence, **kw)


def save(g: GlobalCheckpointer, snap: Snapshot) -> SaveResult:
    """One save of a one-process job: its part, then its commit and retention (waited for)."""
    res = g.save(snap, "replicated")
    assert res.committed in (True, None), res  # None: the position was committed already (not written again)
    return res


def reader(storage: Storage, job_id: str = "job", range_name: str = "_range_0", **kw) -> PartReader:
    """Reads the range's one-writer checkpoints (a part, an earlier release's ckpt-N)."""
    return PartReader(storage, job_id, range_name, **kw)


def write_numbered(storage: Storage, number: int, snap: Snapshot, job_id: str = "job", range_name: str = "_range_0",
                   strategy: Optional[atomic.CommitStrategy] = None) -> WriteResult:
    """An earlier release's numbered checkpoint ``ckpt-N`` (nothing writes them any more; the restart and the tools
    still read them): written and committed by the format engine's own writer, as that release did."""
    pending = atomic.Pending(storage, range_dir(job_id, range_name), number,
                             strategy=strategy or atomic.strategy_for(storage))
    pending.prepare()
    try:
        return write_checkpoint(pending, snap, number)
    except BaseException:
        pending.abort()
        raise


def load_as_restart(ck: "PartReader | GlobalCheckpointer") -> Optional[LoadedCheckpoint]:
    """What a restart of a one-process job over ``ck``'s range loads: the newest checkpoint that
    verifies (:func:`paddle_acp.format.checkpoints.restart.load_newest`, the runtime's path)."""
    numbered = ck if isinstance(ck, PartReader) else PartReader(ck.storage, ck.job_id, ck.range_name)
    return load_newest(numbered, one_process(ck.storage, ck.job_id, ck.range_name), None)


def committed(storage: Storage, job_id: str, range_name: str = "_range_0") -> List[str]:
    """The names of the range's committed checkpoints, oldest first (the restart's order, reversed)."""
    return [e.name for e in reversed(index.entries(storage, job_id, range_name))]


def part_dir(range_dir: "str | os.PathLike[str]", name: str) -> str:
    """The local directory holding ``name``'s ``manifest.json`` and ``tensors.bin`` (one process: its rank-0
    part; an earlier release's ``ckpt-N``: the checkpoint itself)."""
    d = os.path.join(os.fspath(range_dir), name)
    return d if os.path.exists(os.path.join(d, "manifest.json")) else os.path.join(d, "rank-0")


def recommit(position: "str | os.PathLike[str]") -> None:
    """Re-seal the local one-part checkpoint ``position``'s (``.../ckpt-e{E}``) global.json over its part's manifest as
    it now is (the CRC32 and size it records), as an attacker would: an edited manifest is then what a restart reads,
    not one the commit already tells apart."""
    with open(os.path.join(position, "rank-0", MANIFEST_NAME), "rb") as f:
        raw = f.read()
    path = os.path.join(position, GLOBAL_NAME)
    with open(path, "rb") as f:
        g = json.loads(f.read())
    g.pop("checksum")
    g["parts"][0].update(manifest_crc32=zlib.crc32(raw) & 0xFFFFFFFF, manifest_size=len(raw))
    with open(path, "wb") as f:
        f.write(seal(g))
