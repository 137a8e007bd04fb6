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


class UnknownFormatError(CorruptCheckpointError):
    """A checkpoint in a format version this paddle-acp does not know (a newer paddle-acp wrote it).

    Never loaded, like a corrupt one, and never deleted or withdrawn by this paddle-acp
    (retention, ``paddle-acp gc``, making space, a restart's clean-up): a newer paddle-acp resumes from it.
    """


class NoUsableCheckpointError(CheckpointError):
    """A range has committed checkpoints but none of them can be restored (corrupt, unreadable or of a
    newer format). The restart stops instead of training from scratch; nothing is deleted.

    ``rejected``: (checkpoint name, reason) of each checkpoint, newest first; ``newer_format``: the
    names of those written in a format this paddle-acp does not know."""

    def __init__(self, message: str, rejected: "list[tuple[str, str]]", newer_format: "list[str]") -> None:
        super().__init__(message)
        self.rejected = rejected
        self.newer_format = newer_format
