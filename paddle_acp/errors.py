"""Exception types: every error paddle-acp raises derives from AcpError."""


class AcpError(Exception):
    """Base class of all paddle-acp errors."""


class ConfigError(AcpError, ValueError):
    """A configuration value (environment variable or argument) is invalid.

    The message names the variable and the offending value.
    """


class StorageError(AcpError, OSError):
    """Storage could not be reached, read or written."""


class CheckpointError(AcpError, RuntimeError):
    """Checkpointing cannot proceed (wrong thread, mismatched program, ...)."""


class CorruptCheckpointError(AcpError):
    """A checkpoint is incomplete or fails verification; it is never loaded."""


class UnsupportedPaddleError(AcpError, ImportError):
    """No Paddle, or a Paddle version paddle-acp does not support (raised on import).

    The message names the installed version, the supported range and how to install Paddle.
    """


class RestartRequiredError(CheckpointError):
    """The ranks of a job would go on from different checkpoints (a rank rejected data the others
    accepted): every rank stops, and the job's restart falls back alike. Never swallowed as a
    failed save: it stops training on the training thread."""
