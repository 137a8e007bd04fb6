"""paddle-acp: automatic, crash-safe checkpoints for PaddlePaddle static-graph training.

Public API::

    import paddle_acp as acp          # installs the Executor.run hook
    for epoch in acp.train_epoch_range(max_epoch_num, save_checkpoint_inter=None):
        for batch in acp.resumable(loader):   # optional: mid-epoch checkpoints and resume
            exe.run(train_program, feed=batch, fetch_list=[loss])

Switch it on with ``PADDLE_ACP_CHECKPOINT_URI=<path or URI>`` (or the PaddleCloud variables, see
:mod:`paddle_acp.config`); without them the loop is a plain range.

* :func:`train_epoch_range` – the epoch loop that saves and resumes; :func:`resumable` – an epoch's batches, with
  mid-epoch checkpoints and resume.
* :func:`track`, :class:`Counter`, :class:`Value` – add the script's own state to every checkpoint
  (``train_epoch_range(state=...)`` for one range; RNG objects the script holds are saved without code).
* :class:`Preempted` – the ``SystemExit`` (status 128+signal) raised after a preemption signal's save.
* :class:`CheckpointConfig`, :func:`config_from_env` – the configuration.
* :func:`install` / :func:`uninstall` – the Executor.run hook (installed on import); :func:`simulate_restart` –
  forget all in-process state, as a restart would (for tests); :func:`is_training_program`.
* Errors: :class:`AcpError` and its subclasses (:class:`UnsupportedPaddleError`, an ``ImportError``,
  when Paddle is missing or its version is not supported; see :mod:`paddle_acp.adapter.version`).

Importing runs the version gate (it imports Paddle) and installs the hook wherever a Paddle is installed (a broken or
unsupported one too: the gate names what is wrong). Where none is, the import succeeds and the gate runs on the first
use of a public name that needs Paddle (PEP 562 ``__getattr__``), so :mod:`paddle_acp.format`, :mod:`paddle_acp.storage`
and :mod:`paddle_acp.tools` work without Paddle. The ``paddle-acp`` console script (:mod:`paddle_acp_cli`) defers the
gate, so the operator tools never import Paddle; ``paddle-acp run`` calls :func:`_activate`.

Where everything lives (one subpackage per layer; imports only go down; README "Architecture"):

* :mod:`paddle_acp.runtime` – the training process: the hook, epoch ranges, the saver, preemption.
* :mod:`paddle_acp.adapter` – the only code that touches Paddle's internals.
* :mod:`paddle_acp.format` – what a checkpoint is on storage: the on-disk formats (layout, manifests) at its
  top, then :mod:`~paddle_acp.format.engine` (moving bytes: writer, THE reader), :mod:`~paddle_acp.format.commit`
  (commit, fencing, retention) and :mod:`~paddle_acp.format.checkpoints` (the checkpointer, index, restart).
* :mod:`paddle_acp.storage` – one interface, a class per backend chosen by URI scheme.
* :mod:`paddle_acp.tools` – the operator commands (never import Paddle); :mod:`paddle_acp.cli` – the command line.
* :mod:`paddle_acp.compat` – Paddle's ``auto_checkpoint`` and ``checkpoint_saver`` surfaces (also at the top level).
* below every layer: :mod:`~paddle_acp.errors`, :mod:`~paddle_acp.secrets`, :mod:`~paddle_acp.threads`,
  :mod:`~paddle_acp.config` (every environment variable).

A save flows runtime -> adapter (tensor views) -> format (arena, writer, commit) -> storage; a
restore storage -> format (the reader verifies every byte) -> adapter (writes into scopes).
"""

import importlib as _importlib
import importlib.util as _importlib_util
import logging as _logging
import sys as _sys
from typing import Any as _Any

from paddle_acp import config as _config
from paddle_acp.config import CheckpointConfig
from paddle_acp.config import from_env as config_from_env
from paddle_acp.config import names as _config_names
from paddle_acp.errors import (
    AcpError,
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    NoUsableCheckpointError,
    RestartRequiredError,
    StorageError,
    UnknownFormatError,
    UnsupportedPaddleError,
)

__version__ = "0.1.0"

__all__ = [
    "train_epoch_range",
    "resumable",
    "track",
    "Value",
    "Counter",
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
    "RestartRequiredError",
    "NoUsableCheckpointError",
    "UnknownFormatError",
    "StorageError",
    "UnsupportedPaddleError",
    "PADDLE_VERSION",
    "CONST_CHECKPOINT",
    "CONST_MEMORYINIT",
]

# The public names that need Paddle: name -> (module, attribute), imported on first use, after the gate.
_LAZY = {
    "train_epoch_range": ("paddle_acp.runtime.api", "train_epoch_range"),
    "resumable": ("paddle_acp.runtime.api", "resumable"),
    "track": ("paddle_acp.runtime.objects", "track"),
    "Value": ("paddle_acp.runtime.values", "Value"),
    "Counter": ("paddle_acp.runtime.values", "Counter"),
    "active_range": ("paddle_acp.runtime.api", "active_range"),
    "CONST_CHECKPOINT": ("paddle_acp.runtime.api", "CONST_CHECKPOINT"),
    "CONST_MEMORYINIT": ("paddle_acp.runtime.api", "CONST_MEMORYINIT"),
    "Preempted": ("paddle_acp.runtime.preemption", "Preempted"),
    "install": ("paddle_acp.runtime.hook", "install"),
    "uninstall": ("paddle_acp.runtime.hook", "uninstall"),
    "installed": ("paddle_acp.runtime.hook", "installed"),
    "is_training_program": ("paddle_acp.adapter.programs", "is_training_program"),
}

_active = False


def _gate_deferred() -> bool:
    """True only inside the ``paddle-acp`` console script, which runs the gate itself when it needs Paddle."""
    return getattr(_sys.modules.get("paddle_acp_cli"), "DEFER_PADDLE", False) is True


def _paddle_installed() -> bool:
    """Whether a ``paddle`` is there to import; a failing lookup counts as installed (the gate names it)."""
    try:
        return _importlib_util.find_spec("paddle") is not None
    except (ImportError, ValueError):
        return True


def _setup_logging(deferred: bool) -> None:
    # checked before anything imports Paddle; deferred, the command line reports a bad value itself
    try:
        level = _config.log_level_from_env()
    except ConfigError:
        if not deferred:
            raise
        level = "INFO"
    logger = _logging.getLogger("paddle_acp")
    if logger.level == _logging.NOTSET:
        logger.setLevel(level)
    if not logger.handlers and not _logging.getLogger().handlers:
        handler = _logging.StreamHandler()
        handler.setFormatter(_logging.Formatter("[paddle_acp] %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


def _activate() -> str:
    """Version gate (UnsupportedPaddleError before Paddle is used), then the hook; idempotent; Paddle's version."""
    global _active
    if _active:
        return str(globals()["PADDLE_VERSION"])
    _config.log_level_from_env()
    # Paddle's own logger would fail on PADDLE_TRAINER_ID=x with a bare ValueError: a ConfigError first.
    _config.trainer_id_from_env()
    from paddle_acp.adapter import version as paddle_version

    version = paddle_version.check()
    from paddle_acp.runtime.hook import install

    install()
    from paddle_acp.runtime import early

    early.start()  # an HDFS location: its client starts while the script builds its programs
    globals()["PADDLE_VERSION"] = version
    _active = True
    return version


def __getattr__(name: str) -> _Any:  # PEP 562: the Paddle-dependent public names, on first use
    if name == "PADDLE_VERSION":
        return _activate()
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'paddle_acp' has no attribute {name!r}")
    _activate()
    value = getattr(_importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def simulate_restart() -> None:
    """Reset paddle-acp's process state as a restart would (ranges numbered from 0 again), after the active
    range's save in flight. Paddle's scopes are not touched: resume into a fresh scope and programs."""
    from paddle_acp.runtime.state import STATE

    STATE.reset()


_setup_logging(_gate_deferred())
# a misspelled PADDLE_ACP_* variable is not ignored without a word: one warning naming the closest known one
_config_names.warn_unknown()
if not _gate_deferred() and _paddle_installed():
    _activate()
