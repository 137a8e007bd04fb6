"""Configuration: one frozen dataclass, read from the environment in one place.

Two ways to switch checkpointing on:

* ``PADDLE_ACP_CHECKPOINT_URI`` (a local path, ``file://``, later ``hdfs://`` and
  ``s3://``): the plain way for everyone outside PaddleCloud.
* ``PADDLE_RUNNING_ENV=PADDLE_EDL_AUTO_CHECKPOINT`` plus the PaddleCloud
  variables that Paddle's original ``auto_checkpoint`` read.

Every invalid value raises :class:`ConfigError` naming the variable and value.
"""

from __future__ import annotations

import dataclasses
import fractions
import logging
import os
import re
import signal
from typing import Any, Dict, List, Mapping, Optional, Tuple

from paddle_acp.errors import ConfigError

PADDLECLOUD_RUNNING_ENV = "PADDLE_EDL_AUTO_CHECKPOINT"
DEFAULT_JOB_ID = "default"
DEFAULT_SAVE_INTERVAL = 900.0
DEFAULT_MAX_TO_KEEP = 3
DEFAULT_PART_TIMEOUT = 300.0
RANK_STATE_MODES = ("auto", "replicated", "per-rank")
# What a save that comes due while the previous checkpoint is still being written does
# (asynchronous saves only; the final save of a range, preemption saves and synchronous
# mode always wait): see saver.busy_action.
BUSY_POLICIES = ("skip", "queue", "wait")
DEFAULT_BUSY_POLICY = "skip"
# Set in every trainer by ``python -m paddle.distributed.launch``, which does NOT pass its --job_id on.
_LAUNCHER_MARKERS = ("PADDLE_LOG_DIR", "POD_NAME")

logger = logging.getLogger("paddle_acp")

_JOB_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}", re.ASCII)  # fullmatch: no trailing newline

# Every environment variable paddle-acp reads, each read in this module only (tests/test_config.py greps
# the package: a PADDLE_ACP_* name anywhere must be listed here and documented in README.md's table).
# To add one: list it here, read it in a ``*_from_env(env=None)`` function of this module that raises
# ConfigError naming it (``parse_bool`` for a boolean), and add a row to README.md's table.
ENV_VARS = (
    "PADDLE_ACP_CHECKPOINT_URI",
    "PADDLE_ACP_SAVE_INTERVAL",
    "PADDLE_ACP_MAX_TO_KEEP",
    "PADDLE_ACP_ASYNC",
    "PADDLE_ACP_LOG_LEVEL",
    "PADDLE_ACP_CONNECT_TIMEOUT",
    "PADDLE_ACP_BUSY_POLICY",
    "PADDLE_ACP_HOST_MEMORY",
    "PADDLE_ACP_PREEMPT_SIGNALS",
    "PADDLE_ACP_EXIT_ON_PREEMPT",
    "PADDLE_ACP_HDFS_CLIENT",
    "PADDLE_ACP_PROGRESS",
    "PADDLE_RUNNING_ENV",
    "PADDLE_RUNNING_PLATFORM",
    "PADDLE_JOB_ID",
    "PADDLE_TRAINER_ID",
    "PADDLE_TRAINERS_NUM",
    "PADDLE_ACP_RANK_STATE",
    "PADDLE_ACP_PART_TIMEOUT",
    "PADDLE_EDL_HDFS_HOME",
    "PADDLE_EDL_HDFS_NAME",
    "PADDLE_EDL_HDFS_UGI",
    "PADDLE_EDL_HDFS_CHECKPOINT_PATH",
    "PADDLE_EDL_ONLY_FOR_CE_TEST",
    "PADDLE_EDL_FS_CACHE",
    "PADDLE_EDL_SAVE_CHECKPOINT_INTER",
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
    world_size: Optional[int] = None  # PADDLE_TRAINERS_NUM; None: not set (only trainer 0 writes, as before)
    rank_state: str = "auto"  # auto | replicated | per-rank
    part_timeout: float = DEFAULT_PART_TIMEOUT  # seconds rank 0 waits for the other ranks' parts
    save_interval: float = DEFAULT_SAVE_INTERVAL
    max_to_keep: int = DEFAULT_MAX_TO_KEEP
    async_save: bool = True
    busy_policy: str = DEFAULT_BUSY_POLICY
    # PADDLE_ACP_HOST_MEMORY: the bound of the snapshot buffers (see memory_budget_from_env); None: adapt
    # to the memory available when the first training program registers
    host_memory: Optional["HostMemory"] = None
    fs_cache: str = ".cache"
    source: str = "inactive"
    inactive_reason: str = ""
    # PaddleCloud extras (kept for the compat surface and HDFS clients).
    platform: Optional[str] = None
    hdfs_home: Optional[str] = None
    hdfs_name: Optional[str] = None
    hdfs_ugi: Optional[str] = None
    hdfs_checkpoint_path: Optional[str] = None
    ce_test: bool = False

    @property
    def active(self) -> bool:
        return self.uri is not None

    @property
    def multi_rank(self) -> bool:
        """Several ranks, each writing its part of a globally committed checkpoint."""
        return self.world_size is not None and self.world_size > 1

    def __post_init__(self):
        validate_job_id(self.job_id, "job_id")
        if not isinstance(self.trainer_id, int) or self.trainer_id < 0:
            raise ConfigError(f"trainer_id must be an integer >= 0, got {self.trainer_id!r}")
        if self.world_size is not None and (not isinstance(self.world_size, int) or self.world_size < 1):
            raise ConfigError(f"world_size must be an integer >= 1, got {self.world_size!r}")
        if self.world_size is not None and self.trainer_id >= self.world_size:
            raise ConfigError(
                f"PADDLE_TRAINER_ID={self.trainer_id} is not below PADDLE_TRAINERS_NUM={self.world_size}: "
                "set both as paddle.distributed.launch does (ranks 0 .. world size - 1)"
            )
        if self.rank_state not in RANK_STATE_MODES:
            raise ConfigError(f"PADDLE_ACP_RANK_STATE={self.rank_state!r} must be one of {', '.join(RANK_STATE_MODES)}")
        check_interval(self.part_timeout, "PADDLE_ACP_PART_TIMEOUT")
        check_interval(self.save_interval, "save_interval")
        if not isinstance(self.max_to_keep, int) or self.max_to_keep < 0:
            raise ConfigError(f"max_to_keep must be an integer >= 0, got {self.max_to_keep!r}")
        if self.busy_policy not in BUSY_POLICIES:
            raise ConfigError(f"busy_policy must be one of {', '.join(BUSY_POLICIES)}, got {self.busy_policy!r}")


# -- PADDLE_ACP_HOST_MEMORY --------------------------------------------------------------------
MIN_HOST_MEMORY = 16 << 20  # two 8 MiB chunks: below this a streamed save is all overhead
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_MEMORY_RE = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*|%)", re.ASCII)


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """``PADDLE_ACP_HOST_MEMORY``: a number of bytes, or a percentage of the machine's memory."""

    nbytes: Optional[int] = None  # an absolute bound
    percent: Optional[float] = None  # of MemTotal

    def resolve(self, mem_total: Optional[int]) -> int:
        """The bound in bytes (a percentage of ``mem_total``; where that is unknown, of 4 GiB)."""
        if self.nbytes is not None:
            return self.nbytes
        total = mem_total if mem_total else 4 << 30
        return max(MIN_HOST_MEMORY, int(total * (self.percent or 0.0) / 100.0))


def parse_host_memory(raw: str, name: str = "PADDLE_ACP_HOST_MEMORY") -> HostMemory:
    """``512MiB``, ``2GB``, ``1.5g``, ``1073741824`` (bytes) or ``25%`` (of the machine's memory).

    Units: B, k/KB/M/MB/G/GB/T/TB (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024),
    case-insensitive. Raises ConfigError naming the variable, the value and the way out."""
    text = raw.strip().lower()
    m = _MEMORY_RE.fullmatch(text)
    how = ("use bytes with an optional unit (512MiB, 2GB, 1.5GiB) or a percentage of the machine's memory "
           "(25%); unset it to adapt to the memory available")
    if m is None or (m.group(2) not in _UNITS and m.group(2) != "%"):
        raise ConfigError(f"{name}={raw!r} is not an amount of memory: {how}")
    number, unit = fractions.Fraction(m.group(1)), m.group(2)  # exact: 3.3GB is 3300000000 bytes
    if unit == "%":
        if not 0 < number <= 90:
            raise ConfigError(f"{name}={raw!r}: a percentage must be above 0 and at most 90 (the rest is the "
                              f"training's own): {how}")
        return HostMemory(percent=float(number))
    nbytes = number * _UNITS[unit]
    if nbytes >= 2**62:
        raise ConfigError(f"{name}={raw!r} is absurdly large: {how}")
    if nbytes < MIN_HOST_MEMORY:
        raise ConfigError(f"{name}={raw!r} is below the minimum of {MIN_HOST_MEMORY >> 20} MiB "
                          f"(two chunks of a streamed save): {how}")
    return HostMemory(nbytes=int(nbytes))


def host_memory_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[HostMemory]:
    """``PADDLE_ACP_HOST_MEMORY``, or None when unset or empty (adapt to MemAvailable)."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_HOST_MEMORY")
    if raw is None or raw.strip() == "":
        return None
    return parse_host_memory(raw)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_CONNECT_TIMEOUT = 30.0


def log_level_from_env(env: Optional[Mapping[str, str]] = None) -> str:
    """``PADDLE_ACP_LOG_LEVEL`` (case-insensitive), ``INFO`` when unset or empty."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_LOG_LEVEL")
    if raw is None or raw.strip() == "":
        return "INFO"
    level = raw.strip().upper()
    if level not in LOG_LEVELS:
        raise ConfigError(f"PADDLE_ACP_LOG_LEVEL={raw!r} is not a log level (use one of {', '.join(LOG_LEVELS)})")
    return level


def trainer_id_from_env(env: Optional[Mapping[str, str]] = None) -> int:
    """``PADDLE_TRAINER_ID``: an integer >= 0 (0 when unset). Checked when paddle_acp is imported,
    before Paddle, whose own logger would otherwise fail on it with a bare ValueError."""
    env = os.environ if env is None else env
    return _int(env, "PADDLE_TRAINER_ID", 0)


def connect_timeout_from_env(env: Optional[Mapping[str, str]] = None) -> float:
    """``PADDLE_ACP_CONNECT_TIMEOUT``: seconds a storage client may spend connecting (default 30)."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_CONNECT_TIMEOUT")
    if raw is None or raw.strip() == "":
        return DEFAULT_CONNECT_TIMEOUT
    seconds = check_interval(raw.strip(), "PADDLE_ACP_CONNECT_TIMEOUT")
    if seconds <= 0:
        raise ConfigError(f"PADDLE_ACP_CONNECT_TIMEOUT={raw!r} must be a number of seconds > 0")
    return seconds


def preempt_signals_from_env(env: Optional[Mapping[str, str]] = None) -> List[int]:
    """``PADDLE_ACP_PREEMPT_SIGNALS``: comma-separated catchable signals (``SIGTERM`` or ``TERM``),
    ``SIGTERM`` when unset; empty: none."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_PREEMPT_SIGNALS", "SIGTERM")
    out = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name = part.upper() if part.upper().startswith("SIG") else "SIG" + part.upper()
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals) or sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ConfigError(f"PADDLE_ACP_PREEMPT_SIGNALS={raw!r}: {part!r} is not a catchable signal")
        out.append(int(sig))
    return out


def exit_on_preempt_from_env(env: Optional[Mapping[str, str]] = None) -> bool:
    """``PADDLE_ACP_EXIT_ON_PREEMPT``: exit after a preemption save (default 1)."""
    env = os.environ if env is None else env
    return _bool(env, "PADDLE_ACP_EXIT_ON_PREEMPT", True)


def progress_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[bool]:
    """``PADDLE_ACP_PROGRESS``: True/False forces the tools' progress line on or off (a boolean, or
    ``always``/``never``); None (unset, empty or ``auto``): shown when stderr is a terminal."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_PROGRESS")
    low = (raw or "").strip().lower()
    if low in ("", "auto"):
        return None
    if low in ("always", "never"):
        return low == "always"
    return parse_bool(raw, "PADDLE_ACP_PROGRESS", False)


HDFS_CLIENTS = ("pyarrow", "hdfs-native", "cli")


def hdfs_client_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``PADDLE_ACP_HDFS_CLIENT``: the HDFS client to use (one of :data:`HDFS_CLIENTS`), or None
    (unset or empty: the first that works)."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_HDFS_CLIENT")
    if not raw:
        return None
    if raw not in HDFS_CLIENTS:
        raise ConfigError(f"PADDLE_ACP_HDFS_CLIENT={raw!r} must be one of {', '.join(HDFS_CLIENTS)}")
    return raw


def hadoop_home_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The Hadoop installation of the hadoop command line client: ``PADDLE_EDL_HDFS_HOME``, else
    ``HADOOP_HOME``, else None."""
    env = os.environ if env is None else env
    return env.get("PADDLE_EDL_HDFS_HOME") or env.get("HADOOP_HOME") or None


def hdfs_ugi_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``PADDLE_EDL_HDFS_UGI`` (``user,password``) as set, or None. A secret: never log it."""
    env = os.environ if env is None else env
    return env.get("PADDLE_EDL_HDFS_UGI") or None


@dataclasses.dataclass(frozen=True)
class S3Env:
    """The AWS variables the S3 client reads (beyond what pyarrow reads itself)."""

    endpoint: Optional[str]  # AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL
    region: str  # AWS_REGION, else AWS_DEFAULT_REGION, else us-east-1
    secrets: Tuple[str, ...]  # AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN where set: never in a message


def s3_from_env(env: Optional[Mapping[str, str]] = None) -> S3Env:
    env = os.environ if env is None else env
    secrets = tuple(v for v in (env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_SESSION_TOKEN")) if v)
    return S3Env(
        endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        secrets=secrets,
    )


def validate_job_id(value: str, name: str = "PADDLE_JOB_ID") -> str:
    if not isinstance(value, str) or not value or ".." in value or not _JOB_ID_RE.fullmatch(value):
        raise ConfigError(
            f"{name}={value!r} is not a valid job id: use letters, digits, '.', '_' "
            "and '-' only (no '/', no '..', not empty, at most 200 characters)"
        )
    return value


def check_interval(value, name: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number of seconds") from None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ConfigError(f"{name}={value!r} must be a finite number of seconds >= 0")
    return seconds


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
    return value


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(raw: Optional[str], name: str, default: bool) -> bool:
    """The one boolean parser: ``1/true/yes/on`` and ``0/false/no/off`` (any case, surrounding
    blanks ignored); ``default`` when ``raw`` is None or blank; else ConfigError naming ``name``."""
    if raw is None or raw.strip() == "":
        return default
    low = raw.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1 or 0)")


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    return parse_bool(env.get(name), name, default)


def _busy_policy(env: Mapping[str, str]) -> str:
    raw = env.get("PADDLE_ACP_BUSY_POLICY")
    if raw is None or raw.strip() == "":
        return DEFAULT_BUSY_POLICY
    value = raw.strip().lower()
    if value not in BUSY_POLICIES:
        raise ConfigError(
            f"PADDLE_ACP_BUSY_POLICY={raw!r} is not a policy: use skip (default: a save that comes due while the "
            "previous checkpoint is still being written is skipped), queue (it waits in a second host buffer when "
            "memory allows) or wait (training waits for the previous checkpoint)"
        )
    return value


def _interval(env: Mapping[str, str]) -> float:
    for name in ("PADDLE_ACP_SAVE_INTERVAL", "PADDLE_EDL_SAVE_CHECKPOINT_INTER"):
        raw = env.get(name)
        if raw is not None and raw.strip() != "":
            return check_interval(raw.strip(), name)
    return DEFAULT_SAVE_INTERVAL


def _world_size(env: Mapping[str, str]) -> Optional[int]:
    raw = env.get("PADDLE_TRAINERS_NUM")
    if raw is None or raw.strip() == "":
        return None
    return _int(env, "PADDLE_TRAINERS_NUM", 1, minimum=1)


def _rank_state(env: Mapping[str, str]) -> str:
    raw = (env.get("PADDLE_ACP_RANK_STATE") or "").strip().lower()
    if not raw:
        return "auto"
    if raw == "per_rank":
        raw = "per-rank"
    if raw not in RANK_STATE_MODES:
        raise ConfigError(f"PADDLE_ACP_RANK_STATE={env.get('PADDLE_ACP_RANK_STATE')!r} must be one of {', '.join(RANK_STATE_MODES)}")
    return raw


def _part_timeout(env: Mapping[str, str]) -> float:
    raw = env.get("PADDLE_ACP_PART_TIMEOUT")
    if raw is None or raw.strip() == "":
        return DEFAULT_PART_TIMEOUT
    return check_interval(raw.strip(), "PADDLE_ACP_PART_TIMEOUT")


def _required(env: Mapping[str, str], name: str, why: str) -> str:
    value = env.get(name)
    if value is None or value.strip() == "":
        raise ConfigError(f"{name} is not set but is required {why}")
    return value.strip()


def from_env(env: Optional[Mapping[str, str]] = None) -> CheckpointConfig:
    """Build the configuration from environment variables (``os.environ`` by default)."""
    env = os.environ if env is None else env
    log_level_from_env(env)
    connect_timeout_from_env(env)
    common: Dict[str, Any] = dict(
        trainer_id=trainer_id_from_env(env),
        world_size=_world_size(env),
        rank_state=_rank_state(env),
        part_timeout=_part_timeout(env),
        save_interval=_interval(env),
        max_to_keep=_int(env, "PADDLE_ACP_MAX_TO_KEEP", DEFAULT_MAX_TO_KEEP),
        async_save=_bool(env, "PADDLE_ACP_ASYNC", True),
        busy_policy=_busy_policy(env),
        host_memory=host_memory_from_env(env),
        fs_cache=env.get("PADDLE_EDL_FS_CACHE") or ".cache",
    )
    from paddle_acp.storage.base import redact, register_secret, register_uri  # no secret may reach a message

    ugi = env.get("PADDLE_EDL_HDFS_UGI") or ""
    if "," in ugi:
        register_secret(ugi.strip())
        register_secret(ugi.split(",", 1)[1].strip())
    for name in ("PADDLE_ACP_CHECKPOINT_URI", "PADDLE_EDL_HDFS_NAME", "PADDLE_EDL_HDFS_CHECKPOINT_PATH"):
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
        return CheckpointConfig(uri=uri.strip(), job_id=job_id, source="PADDLE_ACP_CHECKPOINT_URI", **common)

    run_env = env.get("PADDLE_RUNNING_ENV")
    if run_env != PADDLECLOUD_RUNNING_ENV:
        reason = (
            "neither PADDLE_ACP_CHECKPOINT_URI nor "
            f"PADDLE_RUNNING_ENV={PADDLECLOUD_RUNNING_ENV} is set"
        )
        return CheckpointConfig(inactive_reason=reason, **common)

    why = f"when PADDLE_RUNNING_ENV={PADDLECLOUD_RUNNING_ENV}"
    job_id = validate_job_id(_required(env, "PADDLE_JOB_ID", why))
    if env.get("PADDLE_TRAINER_ID") is None or env.get("PADDLE_TRAINER_ID", "").strip() == "":
        raise ConfigError(f"PADDLE_TRAINER_ID is not set but is required {why}")
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
        if "://" not in hdfs_name:
            raise ConfigError(
                f"PADDLE_EDL_HDFS_NAME={redact(hdfs_name)!r} must be a filesystem URI such as hdfs://namenode:9000"
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
        **common,
    )


def paddlecloud_view_from_env(env: Optional[Mapping[str, str]] = None) -> Tuple[Optional[str], CheckpointConfig]:
    """What Paddle's ``AutoCheckpointChecker`` describes: ``PADDLE_RUNNING_ENV`` and the configuration.
    Under PaddleCloud (``PADDLE_RUNNING_ENV=PADDLE_EDL_AUTO_CHECKPOINT``) that is the PaddleCloud
    variables' configuration (``PADDLE_ACP_CHECKPOINT_URI`` ignored), as Paddle's checker read it."""
    env = os.environ if env is None else env
    run_env = env.get("PADDLE_RUNNING_ENV")
    if run_env == PADDLECLOUD_RUNNING_ENV:
        env = {k: v for k, v in env.items() if k != "PADDLE_ACP_CHECKPOINT_URI"}
    return run_env, from_env(env)
