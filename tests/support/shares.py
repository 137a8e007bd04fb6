"""A rank's share of replicated state built from whole snapshots, for tests and ci/bench/spread_writes.py.

The runtime selects its share from metadata before it takes views
(:func:`paddle_acp.format.engine.shares.owned`, :func:`~paddle_acp.format.engine.shares.record`); these
helpers do the same from full snapshots, so a test can write the parts of a spread checkpoint.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from paddle_acp.format.engine.shares import Item, Piece, owned, record, share_writers
from paddle_acp.format.engine.snapshot import ProgramSnapshot


def snapshot_items(programs: Sequence[ProgramSnapshot]) -> List[Item]:
    return [(p.key, t.name, t.dtype, tuple(int(x) for x in t.array.shape), int(t.array.nbytes))
            for p in programs for t in p.tensors]


def take(program: ProgramSnapshot, mine: Mapping[Tuple[str, str], Piece]) -> ProgramSnapshot:
    """``program`` with only the tensors (whole, or the pieces: views) that ``mine`` names."""
    tensors = []
    for t in program.tensors:
        if (program.key, t.name) not in mine:
            continue
        piece = mine[(program.key, t.name)]
        tensors.append(t if piece is None else t.cut(*piece))
    return ProgramSnapshot(program.key, program.label, tensors, program.lr_scheduler)


def own_share(programs: Sequence[ProgramSnapshot], rank: int, world: int,
              writers: Optional[int] = None) -> Tuple[List[ProgramSnapshot], Dict[str, Any]]:
    """This rank's share of the replicated state ``programs`` (every program, only the share's tensors
    and pieces) and the record its part carries (``extra.part.share``); ``writers``: the share writers
    (default: all ``world`` ranks)."""
    n = world if writers is None else share_writers(world, writers)
    items = snapshot_items(programs)
    mine = owned(items, rank, n)
    return [take(p, mine) for p in programs], record(items, n)


def share_nbytes(sizes: Sequence[Tuple[str, str, int]], rank: int, world: int) -> int:
    """The bytes of ``rank``'s share of tensors given as (program key, name, bytes) among ``world`` writers."""
    mine = owned([(k, n, "", (), b) for k, n, b in sizes], rank, world)
    pieces = [(mine[(k, n)], b) for k, n, b in sizes if (k, n) in mine]
    return sum(b if piece is None else piece[1] - piece[0] for piece, b in pieces)
