"""RankWrites: owns what this rank writes of a checkpoint of several ranks (its state's mode, its share).

A rank's state is ``per-rank`` (every rank writes its own) or ``replicated`` (rank 0 writes it, or, with
``PADDLE_ACP_REPLICATED_WRITERS``, the share writers each write a share, :mod:`paddle_acp.format.engine.shares`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple

from paddle_acp import config as _config
from paddle_acp.adapter.fleet import decide_mode
from paddle_acp.config import writer_cap
from paddle_acp.format.engine import shares
from paddle_acp.runtime.registry import Registry

logger = logging.getLogger("paddle_acp")

# (program key, name) of the tensors this rank writes -> the piece (None: whole); None: all of them
Only = Optional[Dict[Tuple[str, str], shares.Piece]]


class RankWrites:
    """Which of the registered tensors this rank writes (several ranks; one writer writes them all)."""

    def __init__(self, name: str, cfg: _config.CheckpointConfig, registry: Registry, world_size: int) -> None:
        self.name = name
        self.cfg = cfg
        self.registry = registry
        self.world_size = world_size  # of the global checkpoints
        self.several_ranks = cfg.multi_rank
        self.rank = cfg.trainer_id
        self._mode_logged: Optional[str] = None

    def choose(self) -> Tuple[Optional[str], Only, Optional[Dict[str, Any]]]:
        """At a save: (the state's mode, the tensors this rank takes (None: all), the share record of a spread
        checkpoint). The mode is logged when it changes."""
        if not self.several_ranks:
            return "replicated", None, None
        mode, why = decide_mode(self.cfg.rank_state, self.registry.entries)
        if mode != self._mode_logged:
            logger.info("range %s: rank %d of %d saves %s state (%s)", self.name, self.rank, self.cfg.world_size, mode, why)
            self._mode_logged = mode
        if self._spread(mode):  # the share writers each write a share, chosen from metadata
            items = [i for e in self.registry.entries for i in e.items()]
            return mode, shares.owned(items, self.rank, self._share_writers()), shares.record(items, self._share_writers())
        if mode == "replicated" and self.rank != 0:  # one copy of the tensors: rank 0's
            return mode, {}, None
        return mode, None, None

    def follower(self) -> bool:
        """A rank other than 0 whose replicated tensors other ranks write: its part holds no tensors."""
        if not self.several_ranks or self.rank == 0 or decide_mode(self.cfg.rank_state, self.registry.entries)[0] != "replicated":
            return False
        return writer_cap(self.cfg.replicated_writers) is None or self.rank >= self._share_writers()

    def nbytes(self) -> int:
        """The bytes of the tensors this rank writes, from metadata alone."""
        size = sum(e.nbytes() for e in self.registry.entries)
        if self._spread(decide_mode(self.cfg.rank_state, self.registry.entries)[0]):  # this rank's share of it
            items = [i for e in self.registry.entries for i in e.items()]
            size = shares.share_layout_nbytes(items, self.rank, self._share_writers())
        return size

    def _spread(self, mode: Optional[str]) -> bool:
        """The ranks write shares of the replicated state (PADDLE_ACP_REPLICATED_WRITERS)."""
        return self.several_ranks and mode == "replicated" and writer_cap(self.cfg.replicated_writers) is not None

    def _share_writers(self) -> int:
        """Spread writes: how many ranks write shares (ranks 0..n-1)."""
        cap = writer_cap(self.cfg.replicated_writers)
        return shares.share_writers(self.world_size, cap if cap is not None else 1)
