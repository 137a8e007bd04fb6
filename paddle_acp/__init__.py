"""paddle-acp: automatic, crash-safe checkpoints for PaddlePaddle static-graph training.

Public API::

    import paddle_acp as acp          # installs the Executor.run hook
    for epoch in acp.train_epoch_range(max_epoch_num, save_checkpoint_inter=None):
        for batch in acp.resumable(loader):   # optional: mid-epoch checkpoints and resume
            exe.run(train_program, feed=batch, fetch_list=[loss])

Switch it on with ``PADDLE_ACP_CHECKPOINT_URI=<path or URI>`` (or the PaddleCloud
variables, see :mod:`paddle_acp.config`); without them the loop is a plain range.

* :func:`train_epoch_range` – the epoch loop that saves and resumes.
* :func:`resumable` – wrap an epoch's batches for mid-epoch checkpoints and resume.
* :class:`Preempted` – the ``SystemExit`` (status 128+signal) raised after a SIGTERM-triggered save.
* :class:`CheckpointConfig`, :func:`config_from_env` – the configuration.
* :func:`install` / :func:`uninstall` – the Executor.run hook (installed on import).
* :func:`simulate_restart` – forget all in-process state, as a restart would (for tests).
* :func:`is_training_program` – whether a program would be checkpointed.
* Errors: :class:`AcpError` and its subclasses (:class:`UnsupportedPaddleError`, an ``ImportError``,
  when Paddle is missing or its version is not supported; see :mod:`paddle_acp.adapter.version`).

Data flows one way: hook -> registry (per range) -> snapshot -> checkpointer -> storage.
"""

import logging as _logging

from paddle_acp import config as _config
from paddle_acp.adapter import version as _paddle_version
from paddle_acp.errors import UnsupportedPaddleError  # noqa: F401  (first: the version gate below needs only it)

# Checked before anything imports Paddle: an invalid value is a ConfigError naming the variable
# (Paddle's own logger would fail on PADDLE_TRAINER_ID=x with a bare ValueError).
_level = _config.log_level_from_env()
_config.trainer_id_from_env()
_logger = _logging.getLogger("paddle_acp")
if _logger.level == _logging.NOTSET:
    _logger.setLevel(_level)
if not _logger.handlers and not _logging.getLogger().handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("[paddle_acp] %(levelname)s %(message)s"))
    _logger.addHandler(_handler)
    _logger.propagate = False

# No Paddle, or an unsupported one: one clear UnsupportedPaddleError (an ImportError) here, before
# anything else touches Paddle. A newer or development build is used with a warning.
PADDLE_VERSION = _paddle_version.check()

from paddle_acp.adapter.programs import is_training_program
from paddle_acp.config import CheckpointConfig
from paddle_acp.config import from_env as config_from_env
from paddle_acp.errors import AcpError, CheckpointError, ConfigError, CorruptCheckpointError, StorageError
from paddle_acp.runtime.epoch_range import (
    CONST_CHECKPOINT,
    CONST_MEMORYINIT,
    active_range,
    resumable,
    train_epoch_range,
)
from paddle_acp.runtime.hook import install, installed, uninstall
from paddle_acp.runtime.preemption import Preempted

__version__ = "0.1.0"

__all__ = [
    "train_epoch_range",
    "resumable",
    "Preempted",
    "active_range",
    "CheckpointConfig",
    "config_from_env",
    "install",
    "uninstall",
    "installed",
    "simulate_restart",
    "is_training_program",
    "AcpError",
    "ConfigError",
    "CheckpointError",
    "CorruptCheckpointError",
    "StorageError",
    "UnsupportedPaddleError",
    "PADDLE_VERSION",
    "CONST_CHECKPOINT",
    "CONST_MEMORYINIT",
]

def simulate_restart() -> None:
    """Reset paddle-acp's process state as a restart would: ranges are numbered from 0 again.

    Waits for a pending save first. Paddle's scopes are not touched: to resume
    bit-identically in one process, also start from a fresh scope/programs.
    """
    from paddle_acp.runtime import epoch_range

    epoch_range.reset()


install()
