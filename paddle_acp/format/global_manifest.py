"""The global manifest (``global.json``): the commit of a checkpoint of several ranks.

Written last, by rank 0, once every rank's part is committed: each part's manifest CRC32 and size, data size and program
keys, and the topology. Untrusted input like every manifest (:mod:`.untrusted_json`)."""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.config.values import MAX_WORLD
from paddle_acp.format.layout import parse_name, position_key, position_number
from paddle_acp.format.manifest import MAX_TIME, max_manifest_size
from paddle_acp.format.untrusted_json import (
    MAX_INT,
    _fail,
    _get,
    check_newer_version,
    check_text,
    parse_json,
    seal,
    unseal,
)

GLOBAL_FORMAT = "paddle-acp/global-checkpoint"
GLOBAL_VERSION = 4  # the newest this paddle-acp reads
SINGLE_WRITER_VERSION = 3  # what it writes when rank 0 writes every replicated tensor (read by older builds)
SPREAD_VERSION = 4  # what it writes when the ranks write shares of replicated tensors ("writers": "all")
MODES = ("replicated", "per-rank")
MAX_PROGRAMS = 1024  # program keys one part may list
MAX_GLOBAL_SIZE = 16 << 20  # bytes of global.json (a part record is ~200 bytes plus its program keys)


@dataclasses.dataclass
class PartRecord:
    rank: int
    manifest_crc32: int
    manifest_size: int
    data_size: int
    programs: List[str]  # fingerprints (program keys) of the rank's programs

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any, where: str) -> "PartRecord":
        rank = _get(d, "rank", int, where)
        crc = _get(d, "manifest_crc32", int, where)
        msize = _get(d, "manifest_size", int, where)
        dsize = _get(d, "data_size", int, where)
        programs = _get(d, "programs", list, where)
        if not 0 <= rank < MAX_WORLD or not 0 <= crc < 2**32 or not 0 < msize <= max_manifest_size(dsize) or not 0 <= dsize < 2**62:
            raise _fail(f"{where}: bad rank, checksum or size")
        if len(programs) > MAX_PROGRAMS or not all(isinstance(p, str) and 0 < len(p) <= 200 for p in programs):
            raise _fail(f"{where}.programs must be a list of program keys")
        return cls(rank, crc, msize, dsize, list(programs))


@dataclasses.dataclass
class GlobalManifest:
    name: str
    range_name: str
    epoch_no: int
    step: Optional[int]
    world_size: int
    mode: str
    parts: List[PartRecord]
    created: float = 0.0
    generation: int = -1
    base: Optional[str] = None  # the checkpoint the writing incarnation resumed from
    # who wrote the replicated tensors: "one" (rank 0, version 3) or "all" (each rank its share, version 4)
    writers: str = "one"
    share_writers: int = 0  # "all": ranks 0..share_writers-1 wrote shares; 0 with "one"
    version: int = 0  # 0: the version ``writers`` calls for
    # the CRC32 of the bytes it was read from (None when built here): names this copy (verdict marks)
    crc32: Optional[int] = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.version:
            self.version = SPREAD_VERSION if self.writers == "all" else SINGLE_WRITER_VERSION

    @property
    def number(self) -> int:
        return position_number(self.epoch_no, self.step)

    @property
    def key(self) -> Tuple[int, int]:
        return position_key(self.epoch_no, self.step)

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": GLOBAL_FORMAT,
            "version": self.version,
            "name": self.name,
            "range": self.range_name,
            "position": {"epoch_no": self.epoch_no, "step": self.step},
            "created": self.created,
            "generation": self.generation,
            "base": self.base,
            "topology": {"world_size": self.world_size, "mode": self.mode},
            "parts": [p.to_json() for p in self.parts],
            **({"writers": self.writers, "share_writers": self.share_writers} if self.version >= SPREAD_VERSION else {}),
        }

    def dumps(self) -> bytes:
        return seal(self.to_json())

    def topology(self) -> str:
        return describe_topology(self.world_size, self.mode)

    @classmethod
    def loads(cls, raw: bytes) -> "GlobalManifest":
        if len(raw) > MAX_GLOBAL_SIZE:
            raise _fail(f"global manifest is larger than {MAX_GLOBAL_SIZE} bytes")
        d = parse_json(raw, "global manifest", max_size=MAX_GLOBAL_SIZE)
        if not isinstance(d, dict):
            raise _fail("global manifest: top level must be an object")
        check_newer_version(d, GLOBAL_FORMAT, GLOBAL_VERSION, "global manifest")
        unseal(d, "global manifest ", "the file")
        if d.get("format") != GLOBAL_FORMAT:
            raise _fail(f"format is {d.get('format')!r}, expected {GLOBAL_FORMAT!r}")
        version = _get(d, "version", int, "global")
        if version not in (SINGLE_WRITER_VERSION, SPREAD_VERSION):
            raise _fail(f"global manifest version {version} is not supported (this paddle-acp reads "
                        f"{SINGLE_WRITER_VERSION} and {SPREAD_VERSION})")
        writers, share_writers = "one", 0
        if version >= SPREAD_VERSION:
            writers = _get(d, "writers", str, "global")
            if writers != "all":
                raise _fail(f"global.writers {writers[:40]!r} must be 'all' in version {version}")
            share_writers = _get(d, "share_writers", int, "global")
        else:
            for field in ("writers", "share_writers"):
                if field in d:
                    raise _fail(f"global.{field} is not a field of version {version}")
        name = _get(d, "name", str, "global")
        pos = _get(d, "position", dict, "global")
        epoch_no = _get(pos, "epoch_no", int, "global.position")
        step = _get(pos, "step", int, "global.position", optional=True)
        check_text(name, "global.name")
        if parse_name(name) != (epoch_no, step):
            raise _fail(f"global manifest name {name!r} does not match its position ({epoch_no}, {step})")
        topo = _get(d, "topology", dict, "global")
        world = _get(topo, "world_size", int, "global.topology")
        mode = _get(topo, "mode", str, "global.topology")
        if not 1 <= world <= MAX_WORLD:
            raise _fail(f"world size {world} out of range")
        if mode not in MODES:
            raise _fail(f"mode {mode!r} is not one of {MODES}")
        if version >= SPREAD_VERSION and mode != "replicated":
            raise _fail(f"shares of replicated tensors in a {mode} checkpoint")
        if version >= SPREAD_VERSION and not 1 <= share_writers <= world:
            raise _fail(f"global.share_writers {share_writers} must be from 1 to the world size {world}")
        raw_parts = _get(d, "parts", list, "global")
        if len(raw_parts) > MAX_WORLD:
            raise _fail(f"global manifest lists {len(raw_parts)} parts (at most {MAX_WORLD})")
        created = _get(d, "created", (int, float), "global")
        generation = _get(d, "generation", int, "global")
        if isinstance(created, bool) or not 0 <= created <= MAX_TIME:
            raise _fail(f"global.created {created!r} is not a time")
        if not -1 <= generation < MAX_INT:
            raise _fail(f"global.generation {generation!r} out of range")
        range_name = check_text(_get(d, "range", str, "global"), "global.range")
        parts = [PartRecord.from_json(p, f"global.parts[{i}]") for i, p in enumerate(raw_parts)]
        if [p.rank for p in parts] != list(range(world)):
            raise _fail(f"parts must list ranks 0..{world - 1} once each, in order")
        base = _get(d, "base", str, "global", optional=True)
        if base is not None:
            check_text(base, "global.base")
        return cls(
            name=name, range_name=range_name, epoch_no=epoch_no, step=step,
            world_size=world, mode=mode, parts=parts, created=float(created),
            generation=generation, base=base, writers=writers, share_writers=share_writers, version=version, crc32=zlib.crc32(raw) & 0xFFFFFFFF,
        )


def describe_topology(world_size: int, mode: str) -> str:
    return f"world size {world_size}, {mode}"
