"""Restart: the checkpoint a range resumes from, of either layout, on every rank alike.

:func:`load_newest` loads the first checkpoint, in :func:`paddle_acp.format.checkpoints.index.entries` order, that
verifies and fits this job. When checkpoints exist but none can be used the restart stops naming each and why
(never a silent start from scratch, nothing deleted) unless ``PADDLE_ACP_START_FRESH`` is set; a checkpoint of a
newer format is never deleted or withdrawn.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

from paddle_acp.errors import CheckpointError, NoUsableCheckpointError, StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.engine.reader import LoadedCheckpoint
from paddle_acp.format.global_manifest import describe_topology
from paddle_acp.format.layout import position_key
from paddle_acp.secrets import redact

if TYPE_CHECKING:
    from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer

logger = logging.getLogger("paddle_acp")


def load_newest(numbered: PartReader, global_checkpointer: "GlobalCheckpointer", running_mode: Optional[str],
                check: Optional[Callable[[LoadedCheckpoint], None]] = None,
                start_fresh: bool = False) -> Optional[LoadedCheckpoint]:
    """The newest checkpoint of either layout that verifies and that ``check(loaded)`` accepts, older ones tried
    in turn (each rejection logged); ``ckpt-N`` counts as replicated, and topology mismatches raise CheckpointError.
    None when the range has no committed checkpoint. When none loads: :func:`no_usable`'s error, or with
    ``start_fresh`` (``PADDLE_ACP_START_FRESH``) a warning and None. Nothing is deleted here.
    """
    numbered.check_no_links()
    where = f"{global_checkpointer.storage.uri}/{global_checkpointer.dir}"
    multi = global_checkpointer.world_size > 1
    who = f"rank {global_checkpointer.rank}: " if multi else ""

    listed, listed_only = index.restart_candidates(global_checkpointer.storage, global_checkpointer.job_id, global_checkpointer.range_name)
    uncommitted = set()

    def load(e: index.Entry) -> LoadedCheckpoint:
        if e.layout == index.GLOBAL:
            try:
                loaded = global_checkpointer.load(e.name, running_mode, listed_only)
            except index.NotCommitted:
                uncommitted.add(e.name)
                raise
            return loaded.found_as(e.name, e.key)
        else:
            if running_mode == "per-rank" and multi:
                raise CheckpointError(
                    f"rank {global_checkpointer.rank}: checkpoint {e.number} of range {global_checkpointer.range_name} (job {global_checkpointer.job_id}) was written by "
                    "trainer 0 alone (replicated state), but this job keeps per-rank state "
                    f"({describe_topology(global_checkpointer.world_size, 'per-rank')}): every rank would load rank 0's state. "
                    "Set PADDLE_ACP_RANK_STATE=replicated if the ranks' state is identical, or start a new job "
                    "(a new PADDLE_JOB_ID)."
                )
            loaded = numbered.load(e.number)  # an earlier release's ckpt-N: no global manifest
            return loaded.found_as(e.name, position_key(loaded.manifest.range.epoch_no, loaded.manifest.range.step))

    def fatal(e: index.Entry, exc: StorageError) -> Optional[BaseException]:
        if e.layout != index.GLOBAL or not multi:
            return None
        # another rank may read it: falling back alone would split the ranks; fail, the job's restart tries again
        return StorageError(
            f"rank {global_checkpointer.rank}: checkpoint {e.name} of {where} cannot be read ({exc}); every "
            "rank must resume from the same checkpoint, so this rank does not fall back alone: fix the storage "
            "and restart the job"
        )

    search = index.first_usable(listed, load, check, where, fatal)  # (it passes over the uncommitted)
    # the start's clean-up (discard_newer) removes what is newer than the choice without listing again
    global_checkpointer.start.remember_listing(listed, uncommitted, search.rejected)
    newer = index.newer_in_the_way(search)
    if newer and (search.found is not None or start_fresh):
        if search.found is not None:
            search.found.close()
        # the positions this job would train again are taken by checkpoints it can neither read nor replace
        raise CheckpointError(
            f"{who}checkpoint(s) {', '.join(r.entry.name for r in newer)} of {where} (job {global_checkpointer.job_id}) "
            f"are of a newer format ({newer[0].reason}); this job would train their positions again "
            f"{'from ' + search.found.name if search.found is not None else 'from scratch'} and cannot replace them. "
            "Resume with the newer paddle-acp that wrote them, or use a new PADDLE_JOB_ID. Nothing was deleted."
        )
    if search.found is None and not search.rejected:
        unfinished = sorted({e.name for e in listed if not e.committed} | uncommitted)
        logger.info("%sno committed checkpoint of range %s in %s: starting at epoch 0%s", who,
                    global_checkpointer.range_name, redact(where),
                    f" ({', '.join(unfinished)}: left by a save that did not finish, not a checkpoint)"
                    if unfinished else "")
    if search.found is not None or not search.rejected:
        return search.found
    err = no_usable(search, where, global_checkpointer.job_id, who)
    if start_fresh and isinstance(err, NoUsableCheckpointError):
        gone = [r.entry.name for r in search.of_kind(index.CORRUPT) if r.entry.layout == index.GLOBAL]
        kept = [r.entry.name for r in search.rejected if r.entry.name not in gone]
        logger.warning("%sPADDLE_ACP_START_FRESH is set: STARTING FROM SCRATCH although checkpoints exist (%s)%s%s", who,
                       index.describe(search.rejected),
                       f"; the corrupt {', '.join(gone)} are withdrawn and deleted now (this run trains their positions "
                       "again and saves there)" if gone else "",
                       f"; {', '.join(kept)} are kept (an earlier release's ckpt-N, or of a newer format: never "
                       "deleted)" if kept else "")
        return None
    raise err


def no_usable(search: "index.Search[LoadedCheckpoint]", where: str, job_id: str, who: str = "") -> BaseException:
    """Why a restart that found committed checkpoints but none it can use stops: the first
    misfit's CheckpointError, a StorageError when some could not be read, else
    :func:`paddle_acp.format.checkpoints.index.no_usable_error` naming each checkpoint."""
    misfits = search.of_kind(index.MISFIT)
    if misfits:
        return misfits[0].error
    unreadable = search.of_kind(index.UNREADABLE)
    if unreadable:
        return StorageError(
            f"{who}no checkpoint of {where} could be loaded, and {len(unreadable)} could not be read "
            f"({index.describe(unreadable)}): fix the storage (permissions?) rather than train from scratch, "
            "or remove the unreadable checkpoints"
        )
    return index.no_usable_error(where, job_id, search.rejected, who)
