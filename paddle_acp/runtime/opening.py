"""Opening a range: owns the I/O before a range is built (its storage, job marker, writer fence, node-local cache).

:func:`open_io` does it once per range (the job marker and trainer 0's fence once per process); :class:`LoopSettings`
are the loop's environment settings, refused when bad before any I/O.
"""

from __future__ import annotations

import logging
import operator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from paddle_acp import config as _config
from paddle_acp.errors import AcpError, ConfigError
from paddle_acp.format.checkpoints.cache import RangeCache
from paddle_acp.format.commit.fencing import Fence, write_job_marker
from paddle_acp.runtime import budget as host_budget
from paddle_acp.runtime import early
from paddle_acp.runtime.state import STATE, location_of
from paddle_acp.storage.base import Storage, redact
from paddle_acp.storage.schemes import open_storage

logger = logging.getLogger("paddle_acp")


def open_storage_for(cfg: _config.CheckpointConfig) -> Storage:
    """The range's storage: the process's early connection where it is to this location (runtime.early)."""
    if cfg.uri is None:
        raise ConfigError(f"checkpointing is off: {cfg.inactive_reason}")
    storage = early.take(cfg)
    return storage if storage is not None else open_storage(cfg.uri, cfg.storage)


@dataclass(frozen=True)
class Opened:
    """What opening a range found or took on storage, handed to the range's checkpointers at construction."""

    fence: Optional[Fence] = None  # this rank's writer fence (every rank that writes)
    cache: Optional[RangeCache] = None  # the node-local copies (single writer), PADDLE_ACP_LOCAL_CACHE
    rank_cache: Optional[RangeCache] = None  # this rank's node-local copies (several ranks)
    memory_budget: Optional[int] = None  # a restore larger than it is neither mapped nor held in memory


@dataclass(frozen=True)
class LoopSettings:
    """The loop's settings from the environment, read (and refused when bad) before any I/O."""

    exit_on_preempt: bool  # PADDLE_ACP_EXIT_ON_PREEMPT
    preempt_signals: List[int]  # PADDLE_ACP_PREEMPT_SIGNALS
    check_epochs: Optional[int]  # PADDLE_ACP_CHECK_EPOCHS (paddle-acp check)
    check_digests: Optional[str]  # PADDLE_ACP_CHECK_DIGESTS (paddle-acp check)
    check_kill_at: Optional[Tuple[str, int, Optional[int]]] = None  # PADDLE_ACP_CHECK_KILL_AT (paddle-acp check)

    @classmethod
    def from_env(cls) -> "LoopSettings":
        return cls(_config.exit_on_preempt_from_env(), _config.preempt_signals_from_env(),
                   _config.check_epochs_from_env(), _config.check_digests_from_env(), _config.check_kill_at_from_env())


def open_io(name: str, cfg: _config.CheckpointConfig, storage: Storage) -> Opened:
    """A range's I/O before it is built: job marker and fence (every writer's, before anything it deletes), cache."""
    fence = None
    if cfg.multi_rank or cfg.trainer_id == 0:
        marker = (location_of(storage), cfg.job_id)
        try:
            if cfg.trainer_id == 0 and marker not in STATE.marked_jobs:  # once per process, not per range
                fence = _marked_and_fenced(storage, cfg)
                STATE.marked_jobs.add(marker)
            else:
                fence = STATE.fence_for(storage, cfg.job_id, cfg.trainer_id)
        except AcpError as exc:
            raise ConfigError(
                f"checkpoint location {redact(cfg.uri)!r} (from {cfg.source}) is not reachable or not writable: {exc}"
            ) from exc
    if cfg.trainer_id > 0 and cfg.world_size is None:
        logger.warning(
            "PADDLE_TRAINER_ID=%d but PADDLE_TRAINERS_NUM is not set: this trainer restores trainer 0's state "
            "and writes nothing. Set PADDLE_TRAINERS_NUM (paddle.distributed.launch does) for per-rank state.",
            cfg.trainer_id,
        )
    cache = STATE.local_cache(cfg, storage)  # local copies of remote checkpoints: written by the writer, read by restore
    return Opened(fence=fence,
                  cache=cache.for_range(cfg.job_id, name) if cache is not None else None,
                  rank_cache=cache.for_range(cfg.job_id, name, cfg.trainer_id) if cache is not None else None,
                  memory_budget=host_budget.decide(cfg.host_memory).nbytes)


def _marked_and_fenced(storage: Storage, cfg: _config.CheckpointConfig) -> Fence:
    """Trainer 0's first open of a job: its fence, and the job marker (~0.4 s on HDFS) written meanwhile in the
    background. The fence's first check waits for the marker (:meth:`Fence.first`); a failed write raises there,
    and later checks write it again until it is written. The fence's error wins when both fail."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="paddle-acp-job-marker")
    marked = pool.submit(write_job_marker, storage, cfg.job_id)
    pool.shutdown(wait=False)
    try:
        fence = STATE.fence_for(storage, cfg.job_id, 0)
    except BaseException:
        futures_wait([marked])  # nothing of this open is left running
        raise

    pending = [marked]

    def written() -> None:
        try:
            if pending:
                pending.pop().result()
            else:  # the background write failed: written again now, on the thread that checks
                write_job_marker(storage, cfg.job_id)
        except AcpError as exc:
            raise ConfigError(f"checkpoint location {redact(cfg.uri)!r} (from {cfg.source}) is not reachable or not "
                              f"writable: {exc}") from exc

    fence.first(written)
    return fence


def check_range_args(max_epoch_num: Any, save_checkpoint_inter: Any) -> int:
    """``max_epoch_num`` as an int (any integer type, as ``range()`` takes: ``operator.index``), or ConfigError
    for a ``train_epoch_range`` argument that is not what it must be (checkpointing on or off alike)."""
    try:
        epochs = operator.index(max_epoch_num) if not isinstance(max_epoch_num, bool) else None
    except TypeError:
        epochs = None
    if epochs is None:
        raise ConfigError(f"max_epoch_num={max_epoch_num!r} must be an integer (a negative one: no end)")
    if save_checkpoint_inter is not None:
        _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
    return epochs
