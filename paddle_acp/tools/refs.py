"""Checkpoint references of ``inspect`` and ``export``: ``URI/JOB/range/RANGE/ckpt-N``, or a storage
root with ``--job``/``--range``/``--number`` (each optional where there is only one; the number
defaults to the checkpoint a restart loads)."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

from paddle_acp.errors import CorruptCheckpointError, StorageError
from paddle_acp.format import atomic
from paddle_acp.format.checkpointer import Checkpointer, range_dir
from paddle_acp.format.manifest import MANIFEST_NAME, Manifest
from paddle_acp.storage.base import Storage, redact
from paddle_acp.tools.discovery import ToolError, list_ranges, open_root, short_reason, single_job, uri_join
from paddle_acp.tools.scan import scan_range

REF_RE = re.compile(
    r"(?P<root>.*?)/?(?P<job>[^/]+)/range/(?P<range>[^/]+)/ckpt-(?P<n>0|[1-9][0-9]{0,14})/?", re.ASCII | re.DOTALL
)  # fullmatch


@dataclasses.dataclass
class CkptRef:
    storage: Storage
    job: str
    range: str
    number: int

    @property
    def path(self) -> str:
        return f"{range_dir(self.job, self.range)}/{atomic.final_name(self.number)}"

    @property
    def uri(self) -> str:
        return uri_join(self.storage.uri, self.path)


def _parse_ref(ref: str) -> Optional[CkptRef]:
    """``URI/JOB/range/RANGE/ckpt-N`` as a reference, or None when ``ref`` is not one."""
    if re.search(r"/ckpt-\d+\.tmp-[0-9a-f]+/?$", ref):
        raise ToolError(f"{redact(ref)} is the leftover of an interrupted save (never committed; `paddle-acp gc` removes it)")
    if "://" in ref:
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
    return CkptRef(open_root(root), m.group("job"), m.group("range"), int(m.group("n")))


def resolve_checkpoint(ref: str, job: Optional[str] = None, range_name: Optional[str] = None,
                       number: Optional[int] = None) -> CkptRef:
    """A checkpoint from ``URI/JOB/range/RANGE/ckpt-N`` or from ``URI`` plus job/range/number.

    With ``URI``, the job (and range) may be left out when there is only one;
    the number defaults to the checkpoint a restart would load.
    """
    bare = job is None and range_name is None and number is None
    if bare:
        parsed = _parse_ref(ref)
        if parsed is not None:
            _check_ref(parsed)
            return parsed
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
    if number is None:
        infos = scan_range(storage, job, range_name)
        pick = next((i for i in infos if i.restart), None)
        if pick is None:
            raise ToolError(f"range {range_name!r} of job {job!r} under {storage.uri!r} has no valid checkpoint")
        number = pick.number
    ref_obj = CkptRef(storage, job, range_name, number)
    _check_ref(ref_obj)
    return ref_obj


def _check_ref(ref: CkptRef) -> None:
    st = ref.storage
    if not st.exists(ref.path):
        have = Checkpointer(st, ref.job, ref.range).committed_numbers() if st.exists(range_dir(ref.job, ref.range)) else []
        extra = f" (committed checkpoints of that range: {', '.join(map(str, reversed(have)))})" if have else ""
        if not st.exists(ref.job):
            extra = f" (no job {ref.job!r} under {st.uri!r})"
        raise ToolError(f"checkpoint {ref.uri} does not exist{extra}")


def load_manifest(ref: CkptRef) -> Manifest:
    try:
        return Checkpointer(ref.storage, ref.job, ref.range).read_manifest(ref.number)
    except CorruptCheckpointError as exc:
        raise ToolError(f"cannot read checkpoint {ref.uri}: {short_reason(exc, ref.path)}") from exc
    except StorageError as exc:
        raise ToolError(f"cannot read checkpoint {ref.uri}: {exc}") from exc
