"""What the ranks tell rank 0 through the job's store about one position (issue 43): each rank's arrival, with
its part's manifest or its absence, and each rank's generation, posted once per open.

The store (:class:`Arrivals`, :mod:`paddle_acp.runtime.coord`) gives hints checked against storage, never a commit:
a part counts once the position's listing shows it, a note only when of this position and incarnation, a
generation only when the part's writer posted it and no newer process of its rank did (else it is looked up on
storage: a superseded process's part never commits). Without a store, or when it fails, storage alone tells.

Keys, per arrival key ``{base}/{name}``: ``a/{key}`` (ranks counted in), ``a/x/{key}`` (those without a part),
``n/{rank}`` (each rank's newest note: a part's manifest or an absence), ``a/g/{rank}/{generation}`` (the
processes of a rank holding that generation).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Protocol, Sequence, Set, Tuple

from paddle_acp.errors import AcpError, CorruptCheckpointError
from paddle_acp.format.commit import absence
from paddle_acp.format.layout import absent_mark, parse_name, parse_part, position_key
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Entry, Storage

MAX_NOTE = 1 << 20  # bytes: a larger part manifest is read from storage, not carried by the store


class Arrivals(Protocol):
    """The coordinator's verbs this needs (:class:`paddle_acp.runtime.coord.Coordinator`); each returns None
    where only storage can tell, and raises an AcpError when the store failed; ``kind`` "storage": it counts nothing."""

    kind: str

    def arrive(self, key: str, note: Optional[bytes] = None, rank: int = 0) -> None: ...

    def arrive_soon(self, key: str) -> None: ...

    def arrivals(self, key: str) -> Optional[int]: ...

    def counts(self, keys: Sequence[str]) -> Optional[List[int]]: ...

    def notes(self, ranks: Sequence[int], limit: int) -> Optional[List[Optional[bytes]]]: ...


def generation_key(rank: int, generation: int) -> str:
    """The store's count of the processes of ``rank`` that hold ``generation`` (each posts its own once)."""
    return f"g/{rank}/{generation}"


def vouches(coord: Optional[Arrivals], rank: int, generation: int) -> bool:
    """Whether the job's store says ``generation`` is still rank ``rank``'s newest: posted there, and no newer one
    (False where it cannot tell, or failed: storage tells)."""
    if coord is None or coord.kind == "storage":
        return False
    try:
        got = coord.counts([generation_key(rank, generation), generation_key(rank, generation + 1)])
    except AcpError:
        return False
    return got is not None and got[0] > 0 and got[1] == 0


def absent_key(key: str) -> str:
    """The store's count of the ranks that have no part at arrival key ``key``."""
    return f"x/{key}"


def part_generation(m: Manifest) -> Optional[int]:
    """The writer generation a part's manifest records (-1: written without a fence; None: not recorded)."""
    part = m.extra.get("part") if isinstance(m.extra, dict) else None
    gen = part.get("generation", -1) if isinstance(part, dict) else None
    return None if isinstance(gen, bool) or not isinstance(gen, int) else gen


def arrive(coord: Arrivals, key: str, rank: int, note: Optional[bytes], generation: Optional[Tuple[int, int]],
           absent: bool = False) -> None:
    """Rank ``rank`` counts itself in at ``key`` (``note``: its part's manifest, or its absence with ``absent``;
    ``generation``: (rank, generation) to post first, once per open). Raises what the coordinator raises."""
    if generation is not None:
        coord.arrive(generation_key(*generation))
    coord.arrive(key, note if note is not None and len(note) <= MAX_NOTE else None, rank)
    if absent:
        coord.arrive(absent_key(key))


def counted(coord: Arrivals, key: str) -> Optional[Tuple[int, int]]:
    """(ranks counted in at ``key``, of them without a part), one round trip; None where only storage can tell."""
    got = coord.counts([key, absent_key(key)])
    return None if got is None else (got[0], got[1])


def parts_and_generations(coord: Arrivals, ranks: Sequence[int], number: int,
                          parse: Callable[[bytes, int], Optional[Manifest]], absences: bool = False
                          ) -> Tuple[Dict[int, Tuple[bytes, Manifest]], Dict[int, int], Dict[int, absence.Absence]]:
    """What the store holds of ``ranks`` at position ``number``: their parts (rank -> (bytes, manifest), when
    ``parse`` accepts the rank's newest note), the generations it vouches for (as :func:`vouches`) and, with
    ``absences``, the absences noted (not yet judged: :func:`.absence.counts`). Two round trips."""
    raws = coord.notes(ranks, MAX_NOTE)
    parts: Dict[int, Tuple[bytes, Manifest]] = {}
    absent: Dict[int, absence.Absence] = {}
    for k, raw in zip(ranks, raws or []):
        if raw is None:
            continue
        if absences and len(raw) <= absence.MAX_ABSENT_SIZE:  # some rank said it has no part: this one?
            try:
                absent[k] = absence.Absence.loads(raw, absent_mark(k))
                continue
            except CorruptCheckpointError:
                pass  # not an absence document: a part's manifest
        m = parse(raw, k)
        if m is not None and m.number == number:
            parts[k] = (raw, m)
    gens = [(k, g) for k, (_, m) in parts.items() if (g := part_generation(m)) is not None and g >= 0]
    counts = coord.counts([key for k, g in gens for key in (generation_key(k, g), generation_key(k, g + 1))]) if gens else []
    if counts is None:
        return parts, {}, absent
    return parts, {k: g for i, (k, g) in enumerate(gens) if counts[2 * i] > 0 and counts[2 * i + 1] == 0}, absent


def moved_on(storage: Storage, range_dir: str, name: str, ranks: Sequence[int]) -> Tuple[List[int], Optional[List[Entry]]]:
    """Those of ``ranks`` with a part at a position after ``name`` (they will not write this one), and the range's
    listing (None when not listed): one listing of the range and one per later position, never one per rank."""
    pos = parse_name(name)
    if pos is None or not ranks:
        return [], None
    key = position_key(*pos)
    listing = storage.listdir(range_dir)
    later = [e.name for e in listing if e.is_dir and (p := parse_name(e.name)) is not None and position_key(*p) > key]
    found: Set[int] = set()
    for n in later:
        for e in storage.listdir(f"{range_dir}/{n}"):
            k = parse_part(e.name) if e.is_dir else None
            if k is not None and k in ranks:
                found.add(k)
        if len(found) == len(ranks):
            break
    return sorted(found), listing
