"""Paddle's ``AutoCheckpointChecker``: the auto-checkpoint environment, read like Paddle's, validated like ours."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from paddle_acp import config as _config
from paddle_acp.errors import ConfigError
from paddle_acp.secrets import redact

__all__ = ["AutoCheckpointChecker"]


def _read_only(attr: str) -> Any:
    """A read-only property giving ``self.<attr>``, as Paddle's checker exposes its fields."""
    return property(lambda self: getattr(self, attr))


class AutoCheckpointChecker:
    """The auto-checkpoint environment, read like Paddle's checker: under PaddleCloud a missing or invalid
    variable raises ConfigError; otherwise it describes paddle-acp's own configuration, or an inactive one."""

    def __init__(self, env: Optional[Mapping[str, str]] = None) -> None:
        self._run_env, cfg = _config.paddlecloud_view_from_env(env)
        self._cfg = cfg
        try:  # where the checkpoints go: PADDLE_ACP_CHECKPOINT_URI wins over PaddleCloud's path (its paths say so)
            used = _config.from_env(env)
        except ConfigError:
            used = cfg
        self._used_uri: Optional[str] = used.uri if used.source != cfg.source else None
        active = cfg.active
        self._platform: Optional[str] = cfg.platform if active else None
        self._job_id: Optional[str] = cfg.job_id if active else None
        self._trainer_id: Optional[int] = cfg.trainer_id if active else None
        self._hdfs_home = cfg.hdfs_home
        self._hdfs_name = cfg.hdfs_name
        self._hdfs_ugi = cfg.hdfs_ugi
        self._hdfs_checkpoint_path = cfg.hdfs_checkpoint_path
        self._ce_test: Optional[int] = int(cfg.ce_test) if active else None
        self._fs_cache = cfg.fs_cache
        interval = cfg.save_interval
        self._save_checkpoint_inter: Union[int, float] = int(interval) if float(interval).is_integer() else interval

    @property
    def config(self) -> _config.CheckpointConfig:
        """paddle-acp's configuration this checker was read from."""
        return self._cfg

    def valid(self) -> bool:
        """Whether auto-checkpointing is on (never in dygraph mode)."""
        try:
            import paddle

            if paddle.in_dynamic_mode():
                return False
        except ImportError:  # pragma: no cover
            pass
        return self._cfg.active

    def _root(self) -> Optional[str]:
        if self._used_uri is not None:
            return self._used_uri
        return self._hdfs_checkpoint_path if self._hdfs_checkpoint_path is not None else self._cfg.uri

    def get_job_path(self) -> str:
        return f"{self._root()}/{self.job_id}"

    def get_range_checkpoint_path(self, name: str) -> str:
        return f"{self.get_job_path()}/range/{name}"

    def get_exe_checkpoint_path(self, name: str) -> str:
        return f"{self.get_job_path()}/exe/{name}"

    @property
    def save_checkpoint_inter(self) -> Union[int, float]:
        return self._save_checkpoint_inter

    run_env = _read_only("_run_env")
    platform = _read_only("_platform")
    job_id = _read_only("_job_id")
    trainer_id = _read_only("_trainer_id")
    hdfs_home = _read_only("_hdfs_home")
    hdfs_name = _read_only("_hdfs_name")
    hdfs_ugi = _read_only("_hdfs_ugi")
    hdfs_checkpoint_path = _read_only("_hdfs_checkpoint_path")
    ce_test = _read_only("_ce_test")

    def __str__(self) -> str:
        ugi = self._hdfs_ugi
        if ugi and "," in ugi:  # "user,password": never print the password
            ugi = ugi.split(",", 1)[0] + ",***"
        name = redact(self._hdfs_name) if self._hdfs_name else self._hdfs_name
        return (
            f"run_env:{self._run_env} platform:{self._platform} job_id:{self._job_id} "
            f"hdfs_home:{self._hdfs_home} hdfs_name:{name} hdfs_ugi:{ugi} "
            f"hdfs_checkpoint_path:{self._hdfs_checkpoint_path} trainer_id:{self._trainer_id} "
            f"ce_test:{self._ce_test}"
        )

    __repr__ = __str__

