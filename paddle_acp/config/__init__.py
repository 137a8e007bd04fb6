"""Configuration: one frozen dataclass, read from the environment in one place.

Checkpointing is on with ``PADDLE_ACP_CHECKPOINT_URI`` (a local path, ``file://``, ``hdfs://`` or ``s3://``), or with
``PADDLE_RUNNING_ENV=PADDLE_EDL_AUTO_CHECKPOINT`` plus the PaddleCloud variables Paddle's ``auto_checkpoint`` read.
Every invalid value raises :class:`ConfigError` naming the variable and value. This package reads every environment
variable paddle-acp uses (:data:`ENV_VARS`): the training configuration here (:func:`from_env`), the rest in
:mod:`.components`, :mod:`.ranks` and :mod:`.check`, parsed by :mod:`.values`; :mod:`.names` warns of unknown
``PADDLE_ACP_*`` names. Most public names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from paddle_acp.config import ranks
from paddle_acp.config.check import check_digests_from_env as check_digests_from_env
from paddle_acp.config.check import check_epochs_from_env as check_epochs_from_env
from paddle_acp.config.check import check_kill_at_from_env as check_kill_at_from_env
from paddle_acp.config.components import DEFAULT_CONNECT_TIMEOUT as DEFAULT_CONNECT_TIMEOUT
from paddle_acp.config.components import HDFS_CLIENTS as HDFS_CLIENTS
from paddle_acp.config.components import STORE_VARS, coordination_from_env
from paddle_acp.config.components import S3Env as S3Env
from paddle_acp.config.components import StorageOptions as StorageOptions
from paddle_acp.config.components import connect_early_from_env as connect_early_from_env
from paddle_acp.config.components import connect_timeout_from_env as connect_timeout_from_env
from paddle_acp.config.components import exit_on_preempt_from_env as exit_on_preempt_from_env
from paddle_acp.config.components import hadoop_home_from_env as hadoop_home_from_env
from paddle_acp.config.components import hdfs_client_from_env as hdfs_client_from_env
from paddle_acp.config.components import log_level_from_env as log_level_from_env
from paddle_acp.config.components import preempt_signals_from_env as preempt_signals_from_env
from paddle_acp.config.components import progress_from_env as progress_from_env
from paddle_acp.config.components import s3_from_env as s3_from_env
from paddle_acp.config.components import storage_options_from_env as storage_options_from_env
from paddle_acp.config.components import trainer_id_from_env as trainer_id_from_env
from paddle_acp.config.ranks import (
    DEFAULT_PART_TIMEOUT,
    DEFAULT_REPLICATED_WRITERS,
    MAX_PART_TIMEOUT,
    PART_TIMEOUT_WHY,
    RANK_STATE_MODES,
)
from paddle_acp.config.ranks import DEFAULT_SHARE_WRITERS as DEFAULT_SHARE_WRITERS
from paddle_acp.config.ranks import writer_cap as writer_cap
from paddle_acp.config.values import FALSE_WORDS as FALSE_WORDS
from paddle_acp.config.values import MAX_WORLD as MAX_WORLD
from paddle_acp.config.values import MIN_HOST_MEMORY as MIN_HOST_MEMORY
from paddle_acp.config.values import TRUE_WORDS as TRUE_WORDS
from paddle_acp.config.values import HostMemory as HostMemory
from paddle_acp.config.values import check_interval as check_interval
from paddle_acp.config.values import env_choice, env_int
from paddle_acp.config.values import is_valid_job_id as is_valid_job_id
from paddle_acp.config.values import parse_bool as parse_bool
from paddle_acp.config.values import parse_host_memory as parse_host_memory
from paddle_acp.config.values import validate_job_id as validate_job_id
from paddle_acp.errors import ConfigError

PADDLECLOUD_RUNNING_ENV = "PADDLE_EDL_AUTO_CHECKPOINT"
DEFAULT_JOB_ID = "default"
DEFAULT_SAVE_INTERVAL = 900.0
DEFAULT_MAX_TO_KEEP = 3
# What an asynchronous save due while the previous one is still being written does (runtime/save_decision.py). ``auto``
# waits unless the range's waits would pass AUTO_WAIT_SHARE of its time beyond its first AUTO_WAIT_FREE_S seconds
# (runtime/schedule.py): then it skips.
BUSY_POLICIES = ("auto", "skip", "queue", "wait")
DEFAULT_BUSY_POLICY = "auto"
AUTO_WAIT_SHARE = 0.05
AUTO_WAIT_FREE_S = 2.0
# Set in every trainer by ``python -m paddle.distributed.launch``, which does NOT pass its --job_id on.
_LAUNCHER_MARKERS = ("PADDLE_LOG_DIR", "POD_NAME")

logger = logging.getLogger("paddle_acp")


# Every environment variable paddle-acp reads, each read in this package only (tests/unit/config/test_config.py
# checks it). To add one: list it here, read it in a ``*_from_env(env=None)`` function that raises ConfigError
# naming it (with ``config.values``' parsers), and add a row to README.md's table.
ENV_VARS = (
    "PADDLE_ACP_CHECKPOINT_URI",
    "PADDLE_ACP_SAVE_INTERVAL",
    "PADDLE_ACP_MAX_TO_KEEP",
    "PADDLE_ACP_ASYNC",
    "PADDLE_ACP_LOG_LEVEL",
    "PADDLE_ACP_CONNECT_TIMEOUT",
    "PADDLE_ACP_CONNECT_EARLY",
    "PADDLE_ACP_BUSY_POLICY",
    "PADDLE_ACP_HOST_MEMORY",
    "PADDLE_ACP_PREEMPT_SIGNALS",
    "PADDLE_ACP_EXIT_ON_PREEMPT",
    "PADDLE_ACP_HDFS_CLIENT",
    "PADDLE_ACP_PROGRESS",
    "PADDLE_ACP_LOCAL_CACHE",
    "PADDLE_ACP_START_FRESH",
    "PADDLE_RUNNING_ENV",
    "PADDLE_RUNNING_PLATFORM",
    "PADDLE_JOB_ID",
    "PADDLE_TRAINER_ID",
    "PADDLE_TRAINERS_NUM",
    "PADDLE_ACP_RANK_STATE",
    "PADDLE_ACP_PART_TIMEOUT",
    "PADDLE_ACP_REPLICATED_WRITERS",
    "PADDLE_ACP_COORDINATION",
    "PADDLE_EDL_HDFS_HOME",
    "PADDLE_EDL_HDFS_NAME",
    "PADDLE_EDL_HDFS_UGI",
    "PADDLE_EDL_HDFS_CHECKPOINT_PATH",
    "PADDLE_EDL_ONLY_FOR_CE_TEST",
    "PADDLE_EDL_FS_CACHE",
    "PADDLE_EDL_SAVE_CHECKPOINT_INTER",
    "PADDLE_ACP_CHECK_DIGESTS",
    "PADDLE_ACP_CHECK_EPOCHS",
    "PADDLE_ACP_CHECK_KILL_AT",
    # other tools' variables, read for their clients
    "HADOOP_HOME",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Everything that decides where, when and how checkpoints are written."""

    uri: Optional[str] = None
    job_id: str = DEFAULT_JOB_ID
    trainer_id: int = 0
    world_size: Optional[int] = None  # PADDLE_TRAINERS_NUM; None: not set (only trainer 0 writes)
    rank_state: str = "auto"  # auto | replicated | per-rank
    part_timeout: float = DEFAULT_PART_TIMEOUT  # seconds rank 0 waits for the other ranks' parts
    replicated_writers: str = DEFAULT_REPLICATED_WRITERS
    save_interval: float = DEFAULT_SAVE_INTERVAL
    max_to_keep: int = DEFAULT_MAX_TO_KEEP
    async_save: bool = True
    busy_policy: str = DEFAULT_BUSY_POLICY
    # the bound of the snapshot buffers; None: adapt to the memory available when the first program registers
    host_memory: Optional["HostMemory"] = None
    fs_cache: str = ".cache"
    local_cache: Optional[str] = None  # a local copy of each checkpoint written to a remote store
    start_fresh: bool = False
    source: str = "inactive"
    inactive_reason: str = ""
    # PaddleCloud extras (kept for the compat surface and HDFS clients).
    platform: Optional[str] = None
    hdfs_home: Optional[str] = None
    hdfs_name: Optional[str] = None
    hdfs_ugi: Optional[str] = None
    hdfs_checkpoint_path: Optional[str] = None
    ce_test: bool = False
    storage: StorageOptions = dataclasses.field(default_factory=StorageOptions)

    @property
    def active(self) -> bool:
        return self.uri is not None

    @property
    def multi_rank(self) -> bool:
        return self.world_size is not None and self.world_size > 1

    def __post_init__(self) -> None:
        validate_job_id(self.job_id, "job_id")
        if not isinstance(self.trainer_id, int) or self.trainer_id < 0:
            raise ConfigError(f"trainer_id must be an integer >= 0, got {self.trainer_id!r}")
        if self.world_size is not None and (
            not isinstance(self.world_size, int) or not 1 <= self.world_size <= MAX_WORLD
        ):
            raise ConfigError(f"world_size must be an integer from 1 to {MAX_WORLD}, got {self.world_size!r}")
        if self.world_size is not None and self.trainer_id >= self.world_size:
            raise ConfigError(
                f"PADDLE_TRAINER_ID={self.trainer_id} is not below PADDLE_TRAINERS_NUM={self.world_size}: "
                "set both as paddle.distributed.launch does (ranks 0 .. world size - 1)"
            )
        if self.rank_state not in RANK_STATE_MODES:
            raise ConfigError(f"PADDLE_ACP_RANK_STATE={self.rank_state!r} must be one of {', '.join(RANK_STATE_MODES)}")
        check_interval(self.part_timeout, "PADDLE_ACP_PART_TIMEOUT", MAX_PART_TIMEOUT, PART_TIMEOUT_WHY)
        writer_cap(self.replicated_writers)  # ConfigError naming a bad value
        check_interval(self.save_interval, "save_interval")
        if not isinstance(self.max_to_keep, int) or self.max_to_keep < 0:
            raise ConfigError(f"max_to_keep must be an integer >= 0, got {self.max_to_keep!r}")
        if self.busy_policy not in BUSY_POLICIES:
            raise ConfigError(f"busy_policy must be one of {', '.join(BUSY_POLICIES)}, got {self.busy_policy!r}")


def host_memory_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[HostMemory]:
    """``PADDLE_ACP_HOST_MEMORY``, or None when unset or empty (adapt to MemAvailable)."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_HOST_MEMORY")
    if raw is None or raw.strip() == "":
        return None
    return parse_host_memory(raw)


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    return parse_bool(env.get(name), name, default)


def _busy_policy(env: Mapping[str, str]) -> str:
    return env_choice(
        env, "PADDLE_ACP_BUSY_POLICY", DEFAULT_BUSY_POLICY, BUSY_POLICIES, str.lower,
        "is not a policy: use auto (default: a save that comes due while the "
        "previous checkpoint is still being written waits for it, unless the range's waits would pass "
        f"{AUTO_WAIT_SHARE:.0%} of its time beyond its first {AUTO_WAIT_FREE_S:g} s: then it is skipped), skip "
        "(it is always skipped), queue (it waits in a second host buffer when memory allows) or wait (training "
        "always waits for the previous checkpoint)",
    )


def busy_policy_chosen(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``PADDLE_ACP_BUSY_POLICY`` names a policy."""
    raw = (os.environ if env is None else env).get("PADDLE_ACP_BUSY_POLICY")
    return raw is not None and raw.strip() != ""


def _interval(env: Mapping[str, str]) -> float:
    for name in ("PADDLE_ACP_SAVE_INTERVAL", "PADDLE_EDL_SAVE_CHECKPOINT_INTER"):
        raw = env.get(name)
        if raw is not None and raw.strip() != "":
            return check_interval(raw.strip(), name)
    return DEFAULT_SAVE_INTERVAL


def local_cache_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``PADDLE_ACP_LOCAL_CACHE`` as an absolute directory, or None when unset or empty. ConfigError for a
    value that cannot name a directory; whether it is writable is found out when a range opens."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_LOCAL_CACHE")
    if raw is None or raw.strip() == "":
        return None
    if "\0" in raw:
        raise ConfigError(
            "PADDLE_ACP_LOCAL_CACHE contains a NUL byte: set it to a local directory, e.g. /local/acp-cache"
        )
    value = raw.strip()
    if "://" in value:
        from paddle_acp.secrets import redact  # its user info or query may hold credentials

        raise ConfigError(
            f"PADDLE_ACP_LOCAL_CACHE={redact(value)!r} is a URI: it must be a directory on this node's own disk "
            "(e.g. /local/acp-cache); the checkpoint location itself is PADDLE_ACP_CHECKPOINT_URI"
        )
    path = os.path.abspath(os.path.expanduser(value))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(
            f"PADDLE_ACP_LOCAL_CACHE={value!r} exists and is not a directory: point it to a directory "
            "(it is created when missing) or unset it"
        )
    return path


def running_env(env: Mapping[str, str]) -> Optional[str]:
    """``PADDLE_RUNNING_ENV`` without surrounding blanks (as every variable), None when unset."""
    raw = env.get("PADDLE_RUNNING_ENV")
    return None if raw is None else raw.strip()


def _required(env: Mapping[str, str], name: str, why: str) -> str:
    value = env.get(name)
    if value is None or value.strip() == "":
        raise ConfigError(f"{name} is not set but is required {why}")
    return value.strip()


def from_env(env: Optional[Mapping[str, str]] = None) -> CheckpointConfig:
    """Build the configuration from environment variables (``os.environ`` by default)."""
    env = os.environ if env is None else env
    log_level_from_env(env)
    coordination_from_env(env), connect_early_from_env(env)  # read where used, refused here when invalid
    storage = storage_options_from_env(env)
    common: Dict[str, Any] = dict(
        trainer_id=trainer_id_from_env(env),
        world_size=ranks.world_size(env),
        rank_state=ranks.rank_state(env),
        part_timeout=ranks.part_timeout(env),
        replicated_writers=ranks.replicated_writers(env),
        save_interval=_interval(env),
        max_to_keep=env_int(env, "PADDLE_ACP_MAX_TO_KEEP", DEFAULT_MAX_TO_KEEP),
        async_save=_bool(env, "PADDLE_ACP_ASYNC", True),
        busy_policy=_busy_policy(env),
        host_memory=host_memory_from_env(env),
        fs_cache=env.get("PADDLE_EDL_FS_CACHE") or ".cache",
        local_cache=local_cache_from_env(env),
        start_fresh=_bool(env, "PADDLE_ACP_START_FRESH", False),
    )
    from paddle_acp.secrets import redact, register_secret, register_uri  # no secret may reach a message

    ugi = env.get("PADDLE_EDL_HDFS_UGI") or ""
    if "," in ugi:
        register_secret(ugi.strip())
        register_secret(ugi.split(",", 1)[1].strip())
    for name in ("PADDLE_ACP_CHECKPOINT_URI", "PADDLE_EDL_HDFS_NAME", "PADDLE_EDL_HDFS_CHECKPOINT_PATH", *STORE_VARS):
        register_uri((env.get(name) or "").strip())
    uri = env.get("PADDLE_ACP_CHECKPOINT_URI")
    if uri is not None and uri.strip() != "":
        job_id = env.get("PADDLE_JOB_ID") or DEFAULT_JOB_ID
        validate_job_id(job_id)
        if not env.get("PADDLE_JOB_ID") and all(env.get(k) for k in _LAUNCHER_MARKERS):
            logger.warning(
                "PADDLE_JOB_ID is not set: checkpoints go to job %r under %s, shared with every other job "
                "that does the same. paddle.distributed.launch does not pass its --job_id to the trainers: "
                "set PADDLE_JOB_ID=<id> in the launcher's environment (the launcher takes it as its job id too).",
                DEFAULT_JOB_ID, redact(uri.strip()),
            )
        return CheckpointConfig(uri=uri.strip(), job_id=job_id, source="PADDLE_ACP_CHECKPOINT_URI", storage=storage,
                                **common)

    run_env = running_env(env)
    if run_env != PADDLECLOUD_RUNNING_ENV:
        reason = (
            "neither PADDLE_ACP_CHECKPOINT_URI nor "
            f"PADDLE_RUNNING_ENV={PADDLECLOUD_RUNNING_ENV} is set"
        ) if not run_env else (
            f"PADDLE_ACP_CHECKPOINT_URI is not set and PADDLE_RUNNING_ENV={run_env!r} is not "
            f"{PADDLECLOUD_RUNNING_ENV} (the value that switches on the PaddleCloud configuration)"
        )
        return CheckpointConfig(inactive_reason=reason, storage=storage, **common)

    why = f"when PADDLE_RUNNING_ENV={PADDLECLOUD_RUNNING_ENV}"
    job_id = validate_job_id(_required(env, "PADDLE_JOB_ID", why))
    _required(env, "PADDLE_TRAINER_ID", why)
    ckpt_path = _required(env, "PADDLE_EDL_HDFS_CHECKPOINT_PATH", why)
    ce_test = _bool(env, "PADDLE_EDL_ONLY_FOR_CE_TEST", False)
    hdfs_name = (env.get("PADDLE_EDL_HDFS_NAME") or "").strip()
    hdfs_home = (env.get("PADDLE_EDL_HDFS_HOME") or "").strip() or None
    hdfs_ugi = (env.get("PADDLE_EDL_HDFS_UGI") or "").strip() or None
    if ce_test and not hdfs_name:
        uri = ckpt_path  # local filesystem, relative to the working directory
    else:
        if not hdfs_name:
            raise ConfigError(
                f"PADDLE_EDL_HDFS_NAME is empty but is required {why} "
                "(set PADDLE_EDL_ONLY_FOR_CE_TEST=1 to checkpoint to the local filesystem)"
            )
        if "://" not in hdfs_name or "?" in hdfs_name or "#" in hdfs_name:
            raise ConfigError(
                f"PADDLE_EDL_HDFS_NAME={redact(hdfs_name)!r} must be a filesystem URI such as hdfs://namenode:9000 "
                "(no query or fragment: the checkpoint path is appended to it)"
            )
        if hdfs_ugi is not None and "," not in hdfs_ugi:
            # not echoed: a UGI without its comma may well be a bare password
            raise ConfigError(f"PADDLE_EDL_HDFS_UGI (a value of {len(hdfs_ugi)} characters, not shown) "
                              "must be 'user,password'")
        uri = hdfs_name.rstrip("/") + "/" + ckpt_path.lstrip("/")
    return CheckpointConfig(
        uri=uri,
        job_id=job_id,
        source="PaddleCloud",
        platform=env.get("PADDLE_RUNNING_PLATFORM"),
        hdfs_home=hdfs_home,
        hdfs_name=hdfs_name or None,
        hdfs_ugi=hdfs_ugi,
        hdfs_checkpoint_path=ckpt_path,
        ce_test=ce_test,
        # PaddleCloud: the UGI's user is the HDFS user; PADDLE_EDL_HDFS_HOME alone names the Hadoop home
        storage=storage.replace(hdfs_user=hdfs_ugi.split(",", 1)[0] if hdfs_ugi else None, hadoop_home=hdfs_home),
        **common,
    )


def paddlecloud_view_from_env(env: Optional[Mapping[str, str]] = None) -> Tuple[Optional[str], CheckpointConfig]:
    """``PADDLE_RUNNING_ENV`` and the configuration, as Paddle's ``AutoCheckpointChecker`` read them: under
    PaddleCloud, ``PADDLE_ACP_CHECKPOINT_URI`` is ignored."""
    env = os.environ if env is None else env
    run_env = running_env(env)
    if run_env == PADDLECLOUD_RUNNING_ENV:
        env = {k: v for k, v in env.items() if k != "PADDLE_ACP_CHECKPOINT_URI"}
    return run_env, from_env(env)
