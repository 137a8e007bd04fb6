"""The coordination interface (what each verb is for: :mod:`paddle_acp.runtime.coord`) and its error."""

from __future__ import annotations

from typing import List, Optional, Sequence

from paddle_acp.errors import CheckpointError


class CoordinationError(CheckpointError):
    """This rank lost the job's store (rank 0 gone or unreachable): it stops; nothing committed is touched."""


class Coordinator:
    """One range's coordination on one rank (the module docstring says what each verb is for)."""

    kind = "storage"

    def post(self, key: str, value: bytes) -> None:
        """Rank 0: the newest decision under ``key`` (replaces the one before)."""
        raise NotImplementedError

    def latest(self, key: str, limit: int) -> Optional[bytes]:
        """The newest decision posted under ``key`` (at most ``limit`` bytes), or None when none was."""
        raise NotImplementedError

    def arrive(self, key: str, note: Optional[bytes] = None, rank: int = 0) -> None:
        """Rank ``rank`` reached ``key`` (counted once per call); ``note``: a small record of that rank's, which
        rank 0 reads with :meth:`notes` (its newest note replaces the one before; with the count, one round trip)."""

    def arrive_soon(self, key: str) -> None:
        """Count in at ``key`` without waiting (sent once the store is open; a failure is told by a later call)."""

    def arrivals(self, key: str) -> Optional[int]:
        """How many ranks reached ``key``, or None when only storage can tell."""
        return None

    def counts(self, keys: Sequence[str]) -> Optional[List[int]]:
        """How many ranks reached each of ``keys`` (one round trip), or None when only storage can tell."""
        return None

    def notes(self, ranks: Sequence[int], limit: int) -> Optional[List[Optional[bytes]]]:
        """The newest note of each of ``ranks`` (None for a rank that left none or one over ``limit`` bytes; one
        round trip), or None when only storage can tell."""
        return None

    def check(self) -> None:
        """CoordinationError once this rank lost the job's store (never blocks)."""

    def close(self) -> None:
        """The range ended: this rank's part of whatever its coordination started is done (bounded, never raises)."""
