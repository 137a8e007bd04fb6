"""Exception types: every error paddle-acp raises derives from AcpError."""


class AcpError(Exception):
    """Base class of all paddle-acp errors."""


class ConfigError(AcpError, ValueError):
    """A configuration value (environment variable or argument) is invalid; the message names it."""


class StorageError(AcpError, OSError):
    """Storage could not be reached, read or written."""


class CheckpointError(AcpError, RuntimeError):
    """Checkpointing cannot proceed (wrong thread, mismatched program, ...)."""


class CorruptCheckpointError(AcpError):
    """A checkpoint is incomplete or fails verification; it is never loaded."""


class UnsupportedPaddleError(AcpError, ImportError):
    """No Paddle, or a Paddle version paddle-acp does not support; the message says how to install one."""


class RestartRequiredError(CheckpointError):
    """The ranks of a job would go on from different checkpoints: every rank stops, and the restart falls back
    alike. Never swallowed as a failed save."""


class UnknownFormatError(CorruptCheckpointError):
    """A checkpoint in a format version a newer paddle-acp wrote: never loaded, and never deleted or withdrawn
    by this paddle-acp (retention, ``paddle-acp gc``, a restart's clean-up): the newer one resumes from it."""


class NoUsableCheckpointError(CheckpointError):
    """A range has committed checkpoints but none can be restored: the restart stops instead of training from
    scratch. ``rejected``: (name, reason) of each, newest first; ``newer_format``: those of a newer format."""

    def __init__(self, message: str, rejected: "list[tuple[str, str]]", newer_format: "list[str]") -> None:
        super().__init__(message)
        self.rejected = rejected
        self.newer_format = newer_format
