"""The variables of single components: logging, the trainer id checked at import, storage clients
(connect timeout, HDFS client and Hadoop home, the AWS variables), preemption and the tools' progress line.

Each ``*_from_env(env=None)`` reads ``os.environ`` (or ``env``) and raises
:class:`~paddle_acp.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from paddle_acp.config.values import check_interval, env_int, parse_bool
from paddle_acp.errors import ConfigError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_CONNECT_TIMEOUT = 30.0
# The options of the JVM that libhdfs starts in the training process, when the user's LIBHDFS_OPTS does not
# give them (set LIBHDFS_OPTS, even empty, for the JVM's own defaults). That JVM makes few calls of its own
# (checksums and copies are intrinsics): C1 alone compiles what it needs at a fraction of C2's CPU, and the
# serial collector has no threads of its own. Measured (ci/bench/ranks_training_hdfs.py's machine, 5 fresh processes each):
# connect 1.33 -> 0.95 s, 2.11 -> 1.31 CPU-seconds to the first write; 256 MB writes no slower.
DEFAULT_LIBHDFS_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def log_level_from_env(env: Optional[Mapping[str, str]] = None) -> str:
    """``PADDLE_ACP_LOG_LEVEL`` (case-insensitive), ``INFO`` when unset or empty."""
    return _choice(env, "PADDLE_ACP_LOG_LEVEL", "INFO", LOG_LEVELS, str.upper,
                   f"is not a log level (use one of {', '.join(LOG_LEVELS)})")


def _choice(env: Optional[Mapping[str, str]], name: str, default: str, choices: Sequence[str],
            norm: Callable[[str], str], problem: str) -> str:
    """The variable ``name`` of ``env`` (``os.environ`` by default), stripped and normalised by ``norm``:
    ``default`` when unset or empty, one of ``choices``, else a ConfigError saying ``problem``."""
    env = os.environ if env is None else env
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = norm(raw.strip())
    if value not in choices:
        raise ConfigError(f"{name}={raw!r} {problem}")
    return value


def trainer_id_from_env(env: Optional[Mapping[str, str]] = None) -> int:
    """``PADDLE_TRAINER_ID``: an integer >= 0 (0 when unset). Checked when paddle_acp is imported,
    before Paddle, whose own logger would otherwise fail on it with a bare ValueError."""
    env = os.environ if env is None else env
    return env_int(env, "PADDLE_TRAINER_ID", 0)


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
    return parse_bool(env.get("PADDLE_ACP_EXIT_ON_PREEMPT"), "PADDLE_ACP_EXIT_ON_PREEMPT", True)


def connect_early_from_env(env: Optional[Mapping[str, str]] = None) -> bool:
    """``PADDLE_ACP_CONNECT_EARLY``: open a remote store whose client is slow to start (HDFS) in the background
    from the package's import, for the first range (default 1; see :mod:`paddle_acp.runtime.early`)."""
    env = os.environ if env is None else env
    return parse_bool(env.get("PADDLE_ACP_CONNECT_EARLY"), "PADDLE_ACP_CONNECT_EARLY", True)


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
    """The AWS variables of :class:`S3Env` (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...)."""
    env = os.environ if env is None else env
    secrets = tuple(v for v in (env.get("AWS_SECRET_ACCESS_KEY"), env.get("AWS_SESSION_TOKEN")) if v)
    return S3Env(
        endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        secrets=secrets,
    )


@dataclasses.dataclass(frozen=True)
class StorageOptions:
    """Every setting a storage backend needs, built once here and handed to
    :func:`paddle_acp.storage.schemes.open_storage`: no backend reads the environment itself."""

    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT  # PADDLE_ACP_CONNECT_TIMEOUT
    hdfs_client: Optional[str] = None  # PADDLE_ACP_HDFS_CLIENT: one of HDFS_CLIENTS; None: the first that works
    hadoop_home: Optional[str] = None  # PADDLE_EDL_HDFS_HOME, else HADOOP_HOME (the hadoop CLI client)
    hdfs_user: Optional[str] = None  # the HDFS user (PaddleCloud: the UGI's user); None: the URI's, or the process's
    hdfs_ugi: Optional[str] = dataclasses.field(default=None, repr=False)  # PADDLE_EDL_HDFS_UGI: a secret
    cache_dir: Optional[str] = None  # PADDLE_EDL_FS_CACHE: the hadoop CLI client's staging directory
    libhdfs_opts: Optional[str] = DEFAULT_LIBHDFS_OPTS  # libhdfs's JVM options when LIBHDFS_OPTS is unset; None: none
    s3: S3Env = dataclasses.field(default_factory=lambda: S3Env(endpoint=None, region="us-east-1", secrets=()))

    def replace(self, **changes: object) -> "StorageOptions":
        """A copy with ``changes`` (None values are ignored: the setting stays)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]


def storage_options_from_env(env: Optional[Mapping[str, str]] = None) -> StorageOptions:
    """The :class:`StorageOptions` the environment (``os.environ`` by default) sets."""
    env = os.environ if env is None else env
    return StorageOptions(
        connect_timeout=connect_timeout_from_env(env),
        hdfs_client=hdfs_client_from_env(env),
        hadoop_home=hadoop_home_from_env(env),
        hdfs_ugi=hdfs_ugi_from_env(env),
        cache_dir=env.get("PADDLE_EDL_FS_CACHE") or None,
        s3=s3_from_env(env),
    )


COORDINATION_MODES = ("auto", "store", "etcd", "storage")


def coordination_from_env(env: Optional[Mapping[str, str]] = None) -> str:
    """``PADDLE_ACP_COORDINATION``: how the ranks of a job of several coordinate (``auto`` when unset):
    ``store`` (through the job's store: ``PADDLE_MASTER`` of ``paddle.distributed.launch``, or
    ``MASTER_ADDR``/``MASTER_PORT``; an error when the job has none), ``etcd`` (through the etcd server of
    Paddle's elastic launcher, or ``PADDLE_ELASTIC_SERVER``; an error when there is none), ``storage`` (small
    files on the checkpoint storage: the protocol of earlier versions) or ``auto`` (etcd under an elastic
    launcher with one, else a store of paddle-acp's own at ``MASTER_ADDR``/``MASTER_PORT``, storage otherwise:
    docs/design.md). The same on every rank."""
    return _choice(env, "PADDLE_ACP_COORDINATION", "auto", COORDINATION_MODES, str.lower,
                   "is not a mode: use auto (default: the elastic launcher's etcd where there is one, else a "
                   "store at MASTER_ADDR/MASTER_PORT where set, storage otherwise), store, etcd or storage")


STORE_VARS = ("PADDLE_MASTER", "PADDLE_TRAINER_ENDPOINTS", "MASTER_ADDR", "MASTER_PORT", "PADDLE_ELASTIC_SERVER")


def store_env_from_env(env: Optional[Mapping[str, str]] = None) -> Mapping[str, str]:
    """The variables that name a job's store or etcd (:data:`STORE_VARS`, set by ``paddle.distributed.launch`` or
    the user; read by Paddle itself, so never judged here: :func:`paddle_acp.adapter.store.job_store_endpoint`,
    :func:`paddle_acp.adapter.elastic.elastic_etcd`)."""
    env = os.environ if env is None else env
    return {k: env[k] for k in STORE_VARS if k in env}
