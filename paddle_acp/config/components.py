"""The variables of single components: logging, the trainer id, storage clients, preemption, the progress line."""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import List, Mapping, Optional, Tuple

from paddle_acp.config.values import env_choice, env_int, env_seconds, parse_bool
from paddle_acp.errors import ConfigError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DEFAULT_CONNECT_TIMEOUT = 30.0
MAX_CONNECT_TIMEOUT = 86400.0  # a day: connecting longer is a dead endpoint (and past ~9.2e9 s the clients' timers fail)
# libhdfs's JVM options in the training process when LIBHDFS_OPTS is unset: it makes few calls, so C1 alone and the
# thread-less serial collector suffice (faster connect, less CPU, writes no slower: ci/bench/ranks_training_hdfs.py).
DEFAULT_LIBHDFS_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def log_level_from_env(env: Optional[Mapping[str, str]] = None) -> str:
    """``PADDLE_ACP_LOG_LEVEL`` (case-insensitive), ``INFO`` when unset or empty."""
    return env_choice(os.environ if env is None else env, "PADDLE_ACP_LOG_LEVEL", "INFO", LOG_LEVELS, str.upper,
                      f"is not a log level (use one of {', '.join(LOG_LEVELS)})")


def trainer_id_from_env(env: Optional[Mapping[str, str]] = None) -> int:
    """``PADDLE_TRAINER_ID``: an integer >= 0 (0 when unset)."""
    env = os.environ if env is None else env
    return env_int(env, "PADDLE_TRAINER_ID", 0)


def connect_timeout_from_env(env: Optional[Mapping[str, str]] = None) -> float:
    """``PADDLE_ACP_CONNECT_TIMEOUT``: seconds a storage client may spend connecting (default 30; above 0, at most
    :data:`MAX_CONNECT_TIMEOUT`)."""
    env = os.environ if env is None else env
    seconds = env_seconds(env, "PADDLE_ACP_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT, MAX_CONNECT_TIMEOUT,
                          " (a day): it bounds each attempt to connect to storage (default 30)")
    if seconds <= 0:
        raise ConfigError(f"PADDLE_ACP_CONNECT_TIMEOUT={env['PADDLE_ACP_CONNECT_TIMEOUT']!r} must be a number of "
                          "seconds > 0")
    return seconds


# signals that cannot be preemption signals: uncatchable ones, and those the kernel sends for a fault of the process
# itself (a handler that only records them returns to the faulting instruction, which faults again: a spinning
# process instead of a crash)
NOT_PREEMPTION_SIGNALS = {
    signal.SIGKILL: "cannot be caught",
    signal.SIGSTOP: "cannot be caught",
    signal.SIGSEGV: "is a fault of the process itself, not a request to stop",
    signal.SIGBUS: "is a fault of the process itself, not a request to stop",
    signal.SIGFPE: "is a fault of the process itself, not a request to stop",
    signal.SIGILL: "is a fault of the process itself, not a request to stop",
    signal.SIGABRT: "is a fault of the process itself, not a request to stop",
    signal.SIGTRAP: "is a fault of the process itself, not a request to stop",
    signal.SIGSYS: "is a fault of the process itself, not a request to stop",
}


def preempt_signals_from_env(env: Optional[Mapping[str, str]] = None) -> List[int]:
    """``PADDLE_ACP_PREEMPT_SIGNALS``: comma-separated catchable signals (``SIGTERM`` or ``TERM``),
    ``SIGTERM`` when unset; empty or blank: none. Fault and uncatchable signals (:data:`NOT_PREEMPTION_SIGNALS`)
    are refused."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_PREEMPT_SIGNALS", "SIGTERM")
    out: List[int] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name = part.upper() if part.upper().startswith("SIG") else "SIG" + part.upper()
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals):
            raise ConfigError(f"PADDLE_ACP_PREEMPT_SIGNALS={raw!r}: {part!r} is not a signal name (use e.g. "
                              "SIGTERM,SIGUSR1)")
        why = NOT_PREEMPTION_SIGNALS.get(sig)
        if why is not None:
            raise ConfigError(f"PADDLE_ACP_PREEMPT_SIGNALS={raw!r}: {sig.name} {why}, so it cannot be a "
                              "preemption signal (use e.g. SIGTERM,SIGUSR1)")
        if int(sig) not in out:
            out.append(int(sig))
    return out


def exit_on_preempt_from_env(env: Optional[Mapping[str, str]] = None) -> bool:
    """``PADDLE_ACP_EXIT_ON_PREEMPT``: exit after a preemption save (default 1)."""
    env = os.environ if env is None else env
    return parse_bool(env.get("PADDLE_ACP_EXIT_ON_PREEMPT"), "PADDLE_ACP_EXIT_ON_PREEMPT", True)


def connect_early_from_env(env: Optional[Mapping[str, str]] = None) -> bool:
    """``PADDLE_ACP_CONNECT_EARLY``: open a slow remote store (HDFS) in the background from import (default 1)."""
    env = os.environ if env is None else env
    return parse_bool(env.get("PADDLE_ACP_CONNECT_EARLY"), "PADDLE_ACP_CONNECT_EARLY", True)


def progress_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[bool]:
    """``PADDLE_ACP_PROGRESS``: True/False forces the tools' progress line on or off (a boolean, or
    ``always``/``never``); None (unset, empty or ``auto``): shown on a terminal."""
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
    """``PADDLE_ACP_HDFS_CLIENT`` (one of :data:`HDFS_CLIENTS`), or None: the first that works."""
    env = os.environ if env is None else env
    raw = env.get("PADDLE_ACP_HDFS_CLIENT")
    if not raw:
        return None
    if raw not in HDFS_CLIENTS:
        raise ConfigError(f"PADDLE_ACP_HDFS_CLIENT={raw!r} must be one of {', '.join(HDFS_CLIENTS)}")
    return raw


def hadoop_home_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The hadoop CLI client's installation: ``PADDLE_EDL_HDFS_HOME``, else ``HADOOP_HOME``, else None."""
    env = os.environ if env is None else env
    return env.get("PADDLE_EDL_HDFS_HOME") or env.get("HADOOP_HOME") or None


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


@dataclasses.dataclass(frozen=True)
class StorageOptions:
    """Every setting a storage backend needs, handed to ``open_storage``: no backend reads the environment."""

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
        kept = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **kept)  # type: ignore[arg-type]


def storage_options_from_env(env: Optional[Mapping[str, str]] = None) -> StorageOptions:
    env = os.environ if env is None else env
    return StorageOptions(
        connect_timeout=connect_timeout_from_env(env),
        hdfs_client=hdfs_client_from_env(env),
        hadoop_home=hadoop_home_from_env(env),
        hdfs_ugi=env.get("PADDLE_EDL_HDFS_UGI") or None,
        cache_dir=env.get("PADDLE_EDL_FS_CACHE") or None,
        s3=s3_from_env(env),
    )


COORDINATION_MODES = ("auto", "store", "etcd", "storage")


def coordination_from_env(env: Optional[Mapping[str, str]] = None) -> str:
    """``PADDLE_ACP_COORDINATION``: how the ranks of a job coordinate (the same on every rank; docs/design.md):
    ``store`` (the job's store), ``etcd`` (the elastic launcher's), ``storage`` (small files on the checkpoint
    storage) or ``auto`` (etcd where there is one, else a store at ``MASTER_ADDR``/``MASTER_PORT``, else storage)."""
    return env_choice(os.environ if env is None else env, "PADDLE_ACP_COORDINATION", "auto", COORDINATION_MODES,
                      str.lower, "is not a mode: use auto (default: the elastic launcher's etcd where there is "
                      "one, else a store at MASTER_ADDR/MASTER_PORT where set, storage otherwise), store, etcd or "
                      "storage")


STORE_VARS = ("PADDLE_MASTER", "PADDLE_TRAINER_ENDPOINTS", "MASTER_ADDR", "MASTER_PORT", "PADDLE_ELASTIC_SERVER")


def store_env_from_env(env: Optional[Mapping[str, str]] = None) -> Mapping[str, str]:
    """The variables that name a job's store or etcd (:data:`STORE_VARS`), unjudged: the adapter reads them."""
    env = os.environ if env is None else env
    return {k: env[k] for k in STORE_VARS if k in env}
