"""Checkpoint references of ``inspect`` and ``export``: ``URI/JOB/range/RANGE/ckpt-N`` (or ``ckpt-e<E>[-s<S>]``), or
a storage root with ``--job``/``--range``/``--number`` (each optional where there is only one; the number defaults to
the checkpoint a restart loads)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format.checkpoints import index
from paddle_acp.format.engine import reader
from paddle_acp.format.layout import MANIFEST_NAME, final_name, range_dir
from paddle_acp.format.manifest import Manifest
from paddle_acp.storage.base import Storage, redact
from paddle_acp.storage.schemes import parse_uri
from paddle_acp.tools.discovery import ToolError, list_ranges, open_root, short_reason, single_job, uri_join
from paddle_acp.tools.scan import CkptInfo, restart_checkpoint, restart_outcome, scan_range

if TYPE_CHECKING:
    from paddle_acp.format.global_manifest import GlobalManifest

REF_RE = re.compile(
    r"(?P<root>.*?)/?(?P<job>[^/]+)/range/(?P<range>[^/]+)/"
    r"(?P<name>ckpt-(?:(?P<n>0|[1-9][0-9]{0,14})|e(?:0|[1-9][0-9]{0,11})(?:-s(?:0|[1-9][0-9]{0,11}))?))/?",
    re.ASCII | re.DOTALL,
)  # fullmatch: ckpt-N (one writer) or ckpt-e<E>[-s<S>] (several ranks)


@dataclasses.dataclass
class CkptRef:
    """One checkpoint: ``ckpt-<number>`` of one writer, or ``name`` (``ckpt-e<E>[-s<S>]``) of several
    ranks, of which ``rank``'s part is read (``inspect``/``export`` show one part at a time)."""

    storage: Storage
    job: str
    range: str
    number: int
    name: Optional[str] = None  # several ranks: the checkpoint's directory name
    rank: int = 0
    scanned: Optional[List[CkptInfo]] = None  # resolved to the one a restart loads: the range's scan, data read

    @property
    def multirank(self) -> bool:
        return self.name is not None

    @property
    def dir_name(self) -> str:
        return self.name if self.name is not None else final_name(self.number)

    @property
    def path(self) -> str:
        return f"{range_dir(self.job, self.range)}/{self.dir_name}"

    @property
    def part_path(self) -> str:
        """The directory holding the manifest and data file this reference reads."""
        return f"{self.path}/rank-{self.rank}" if self.multirank else self.path

    @property
    def uri(self) -> str:
        return uri_join(self.storage.uri, self.path)


def _parse_ref(ref: str) -> Optional[CkptRef]:
    """``URI/JOB/range/RANGE/ckpt-N`` as a reference, or None when ``ref`` is not one."""
    if re.search(r"/ckpt-[0-9]+\.tmp-[0-9a-f]+/?\Z", ref, re.ASCII):
        raise ToolError(f"{redact(ref)} is the leftover of an interrupted save (never committed; `paddle-acp gc` removes it)")
    if "://" in ref:
        parse_uri(ref)  # ConfigError for a malformed one (urlsplit's ValueError may quote a password)
        parts = urlsplit(ref)
        m = REF_RE.fullmatch(parts.path)
        if not m:
            return None
        root = urlunsplit((parts.scheme, parts.netloc, m.group("root") or "/", parts.query, parts.fragment))
    else:
        m = REF_RE.fullmatch(ref)
        if not m:
            return None
        root = m.group("root") or ("/" if ref.startswith("/") else ".")
    if m.group("n") is None:  # a checkpoint of several ranks
        return CkptRef(open_root(root), m.group("job"), m.group("range"), 0, name=m.group("name"))
    return CkptRef(open_root(root), m.group("job"), m.group("range"), int(m.group("n")))


def resolve_checkpoint(ref: str, job: Optional[str] = None, range_name: Optional[str] = None,
                       number: Optional[int] = None, rank: Optional[int] = None) -> CkptRef:
    """A checkpoint from ``URI/JOB/range/RANGE/ckpt-N`` (or ``.../ckpt-e<E>[-s<S>]``) or from ``URI`` plus
    job/range/number; ``rank``: which part of a checkpoint of several ranks (default 0)."""
    bare = job is None and range_name is None and number is None
    if bare:
        parsed = _parse_ref(ref)
        if parsed is not None:
            return _with_rank(parsed, rank)
    storage = open_root(ref)
    if bare and storage.exists(MANIFEST_NAME):
        raise ToolError(
            f"{redact(ref)!r} does not look like URI/JOB/range/RANGE/ckpt-N; give the storage root with --job, --range and --number"
        )
    job = single_job(storage, job)
    ranges = list_ranges(storage, job)
    if range_name is None:
        if not ranges:
            raise ToolError(f"job {job!r} under {storage.uri!r} has no checkpoints")
        if len(ranges) > 1:
            raise ToolError(f"job {job!r} under {storage.uri!r} has several ranges ({', '.join(ranges)}): choose one with --range")
        range_name = ranges[0]
    elif range_name not in ranges:
        raise ToolError(
            f"range {range_name!r} not found in job {job!r} under {storage.uri!r}"
            + (f"; ranges there: {', '.join(ranges)}" if ranges else "")
        )
    if number is None:  # the one a restart loads: found as a restart finds it, data read
        infos = scan_range(storage, job, range_name)
        pick = restart_checkpoint(storage, job, range_name, infos, quiet=True)
        if pick is None:
            raise ToolError(f"range {range_name!r} of job {job!r} under {storage.uri!r}: a restart "
                            f"{restart_outcome(infos, True)}")
        name = pick.name if pick.multirank else None
        return _with_rank(CkptRef(storage, job, range_name, pick.number, name=name, scanned=infos), rank)
    return _with_rank(CkptRef(storage, job, range_name, number), rank)


def _with_rank(ref: CkptRef, rank: Optional[int]) -> CkptRef:
    """``ref``, checked to exist, reading the part of ``rank`` (refused for a checkpoint of one writer)."""
    st = ref.storage
    if not st.exists(ref.path):
        have = index.entries(st, ref.job, ref.range) if st.exists(range_dir(ref.job, ref.range)) else []
        extra = f" (committed checkpoints of that range: {', '.join(e.name for e in have)})" if have else ""
        if not st.exists(ref.job):
            extra = f" (no job {ref.job!r} under {st.uri!r})"
        raise ToolError(f"checkpoint {ref.uri} does not exist{extra}")
    if rank is not None:
        if not ref.multirank:
            raise ToolError(f"--rank {rank}: checkpoint {ref.uri} was written by one process (it has no parts of "
                            "ranks)")
        ref.rank = rank
    return ref


def read_part(ref: CkptRef) -> Tuple[GlobalManifest, Dict[int, bytes]]:
    """A checkpoint of several ranks: its global manifest and every part's manifest bytes, each checked
    against it; CorruptCheckpointError otherwise."""
    from paddle_acp.format.checkpoints.global_reader import GlobalReader

    return GlobalReader(ref.storage, ref.job, ref.range).check_global(ref.dir_name)


@contextlib.contextmanager
def reading(ref: CkptRef, corrupt: str = "cannot read checkpoint {uri}: {reason}") -> Iterator[None]:
    """A CorruptCheckpointError (worded by ``corrupt``) or StorageError reading ``ref`` as a ToolError."""
    try:
        yield
    except CorruptCheckpointError as exc:
        raise ToolError(corrupt.format(uri=ref.uri, reason=short_reason(exc, ref.path))) from exc
    except StorageError as exc:
        raise ToolError(f"cannot read checkpoint {ref.uri}: {exc}") from exc


def load_manifest(ref: CkptRef) -> Manifest:
    """The manifest ``ref`` reads (several ranks: its rank's part); ToolError when it is unreadable or corrupt."""
    with reading(ref):
        if ref.multirank:
            g, raws = read_part(ref)
            if ref.rank not in raws:
                raise ToolError(f"checkpoint {ref.uri} has no part of rank {ref.rank} (it has the parts of ranks "
                                f"{', '.join(map(str, sorted(raws)))}): choose one with --rank")
            ref.number = g.number
            return reader.read_manifest(ref.storage, ref.part_path, g.number, ref.range, raws[ref.rank])
        return reader.read_manifest(ref.storage, ref.path, ref.number, ref.range)
