"""Operator tools: ``paddle-acp ls / inspect / verify / gc / export / stats``.

Everything here goes through :class:`paddle_acp.storage.Storage`, so the
commands work on every root :func:`paddle_acp.storage.open_storage` accepts
(local paths and ``file://`` today; HDFS and S3 through the same function).
Only ``gc`` modifies the storage; ``export`` writes only under its ``--to``
directory.

Errors that the operator can fix (a wrong URI, a missing job, an unreadable
checkpoint) raise :class:`ToolError` (an :class:`AcpError`): the command line
prints it and exits with status 2. ``verify`` exits with 1 when the checkpoint
a restart would load is bad.

Long transfers show progress on stderr when it is a terminal
(``PADDLE_ACP_PROGRESS=1`` forces it on, ``=0`` off).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pickle
import re
import statistics
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit, urlunsplit

from paddle_acp.errors import AcpError, CorruptCheckpointError, StorageError
from paddle_acp.format import atomic
from paddle_acp.format.checkpointer import Checkpointer
from paddle_acp.format.layout import JOB_MARKER, final_name, range_dir
from paddle_acp.format.manifest import DATA_NAME, DTYPES, MANIFEST_NAME, Manifest
from paddle_acp.storage.base import Storage, open_storage, redact, scrub

METRICS_DIR = "metrics"
_METRICS_RE = re.compile(r"trainer-(0|[1-9][0-9]{0,8})\.jsonl", re.ASCII)  # fullmatch
_CHUNK = 16 << 20
_JOB_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}", re.ASCII)  # fullmatch: no trailing newline


class ToolError(AcpError):
    """An operator-facing error: printed by the command line, exit status 2."""


# =============================================================================
# formatting
# =============================================================================
def human_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def fmt_time(t: Optional[float]) -> str:
    if t is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):  # not a time a calendar can show
        return f"{t!r} (not a valid time)"


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[int] = (), indent: str = "") -> str:
    """A plain-text table; columns in ``right`` are right-aligned."""
    rows = [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(cells):
        out = []
        for i, c in enumerate(cells):
            out.append(c.rjust(widths[i]) if i in right else c.ljust(widths[i]))
        return (indent + "  ".join(out)).rstrip()

    return "\n".join([line(headers)] + [line(r) for r in rows])


def natural_key(s: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def uri_join(uri: str, rel: str) -> str:
    """``uri`` + '/' + ``rel``, keeping a query string (``s3://b/p?endpoint=..``) at the end."""
    if not rel:
        return uri
    if "://" in uri:
        parts = urlsplit(uri)
        path = parts.path.rstrip("/") + "/" + rel
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))
    return uri.rstrip("/") + "/" + rel


# =============================================================================
# progress
# =============================================================================
def progress_enabled(stream=None) -> bool:
    env = os.environ.get("PADDLE_ACP_PROGRESS", "").strip().lower()
    if env in ("1", "true", "yes", "on", "always"):
        return True
    if env in ("0", "false", "no", "off", "never"):
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A one-line byte counter on stderr, shown only on a terminal."""

    def __init__(self, label: str, total: int, stream=None, enabled: Optional[bool] = None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress_enabled(self.stream) if enabled is None else enabled
        self.label = label
        self.total = max(0, int(total))
        self.done = 0
        self._t0 = time.monotonic()
        self._last = 0.0
        self._width = 0

    def update(self, n: int) -> None:
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now - self._last >= 0.1:
                self._last = now
                self._render()

    def _render(self) -> None:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        dt = time.monotonic() - self._t0
        rate = f", {self.done / dt / 1e6:.1f} MB/s" if dt > 0.05 else ""
        text = f"{self.label}: {pct:3.0f}% {human_bytes(self.done)} / {human_bytes(self.total)}{rate}"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        if not self.enabled:
            return
        self._render()
        try:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        except (OSError, ValueError):
            pass
        self.enabled = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# =============================================================================
# finding jobs, ranges and checkpoints
# =============================================================================
def open_root(uri: str) -> Storage:
    """Open a storage root that must exist."""
    storage = open_storage(uri)  # ConfigError (an AcpError) names the URI
    try:
        exists = storage.exists("")
    except StorageError as exc:
        raise ToolError(f"cannot reach storage root {redact(uri)!r}: {exc}") from exc
    if not exists:
        raise ToolError(f"storage root {redact(uri)!r} does not exist")
    return storage


def _is_job_dir(storage: Storage, name: str) -> bool:
    return storage.exists(f"{name}/{JOB_MARKER}") or storage.exists(f"{name}/range")


def list_jobs(storage: Storage) -> List[str]:
    jobs = []
    for e in storage.listdir(""):
        # a job directory may be a link the operator made (links inside a job are never followed)
        if (e.is_dir or e.is_link) and _JOB_RE.fullmatch(e.name) and _is_job_dir(storage, e.name):
            jobs.append(e.name)
    return sorted(jobs, key=natural_key)


def _no_jobs_error(storage: Storage) -> ToolError:
    hint = ""
    if storage.exists(JOB_MARKER) or storage.exists("range"):
        hint = " (it looks like a job directory itself: pass its parent as URI and its name as --job)"
    elif storage.exists(MANIFEST_NAME):
        hint = " (it looks like a checkpoint directory: use `paddle-acp inspect` on it)"
    return ToolError(f"no paddle-acp jobs under {storage.uri!r} (expected URI/JOB_ID/{JOB_MARKER}){hint}")


def select_jobs(storage: Storage, job: Optional[str]) -> List[str]:
    """[job] when it exists, every job without ``job``; ToolError otherwise."""
    if job is not None:
        if not _JOB_RE.fullmatch(job) or ".." in job:
            raise ToolError(f"{job!r} is not a valid job id")
        if not _is_job_dir(storage, job):
            jobs = list_jobs(storage)
            have = f"; jobs there: {', '.join(jobs)}" if jobs else "; there are no jobs there"
            raise ToolError(f"job {job!r} not found under {storage.uri!r}{have}")
        return [job]
    jobs = list_jobs(storage)
    if not jobs:
        raise _no_jobs_error(storage)
    return jobs


def single_job(storage: Storage, job: Optional[str]) -> str:
    jobs = select_jobs(storage, job)
    if len(jobs) > 1:
        raise ToolError(f"{storage.uri!r} holds several jobs ({', '.join(jobs)}): choose one with --job")
    return jobs[0]


def list_ranges(storage: Storage, job: str) -> List[str]:
    """The range directories of a job (symbolic links are not followed: not listed)."""
    if storage.kind(f"{job}/range") == "link":
        logging.getLogger("paddle_acp").warning(
            "ignoring %s/%s/range: a symbolic link (links inside a job are never followed)", storage.uri, job)
        return []
    return sorted((e.name for e in storage.listdir(f"{job}/range") if e.is_dir), key=natural_key)


def read_job_marker(storage: Storage, job: str) -> Dict[str, Any]:
    try:
        d = json.loads(storage.read_bytes(f"{job}/{JOB_MARKER}").decode("utf-8"))
        return d if isinstance(d, dict) else {}
    except (FileNotFoundError, AcpError, OSError, ValueError, UnicodeDecodeError):
        return {}


@dataclasses.dataclass
class CkptInfo:
    """What ``ls`` knows about one checkpoint directory."""

    job: str
    range: str
    name: str
    number: int
    committed: bool
    path: str  # relative to the storage root
    bytes: int = 0
    mtime: Optional[float] = None
    manifest: Optional[Manifest] = None
    status: str = "uncommitted"  # ok | verified | corrupt | uncommitted
    reason: str = ""
    restart: bool = False
    position: Optional[Tuple[int, int]] = None  # checkpoints of several ranks: (epoch, step) order

    @property
    def valid(self) -> bool:
        return self.status in ("ok", "verified")

    def to_json(self) -> Dict[str, Any]:
        m = self.manifest
        return {
            "name": self.name,
            "number": self.number,
            "path": self.path,
            "committed": self.committed,
            "status": self.status,
            "valid": self.valid,
            "reason": self.reason or None,
            "restart": self.restart,
            "bytes": self.bytes,
            "created": m.created if m is not None else self.mtime,
            "epoch": m.range.epoch_no if m is not None else None,
            "step": m.range.step if m is not None else None,
            "max_epoch_num": m.range.max_epoch_num if m is not None else None,
            "paddle_version": m.paddle_version if m is not None else None,
            "ir": m.ir if m is not None else None,
        }


def _dir_stats(storage: Storage, path: str) -> Tuple[int, Dict[str, int], Optional[float]]:
    """(total bytes, file name -> size, newest mtime) of one checkpoint directory."""
    files, newest = {}, None
    for e in storage.listdir(path):
        if not e.is_dir:
            files[e.name] = e.size
        if e.mtime is not None:
            newest = e.mtime if newest is None else max(newest, e.mtime)
    return sum(files.values()), files, newest


def scan_range(
    storage: Storage, job: str, range_name: str, verify: bool = False, quiet_progress: bool = False
) -> List[CkptInfo]:
    """Every checkpoint directory of a range, newest first, with its status.

    Without ``verify`` a committed checkpoint is "ok" when its manifest is valid
    and its data file has the size the manifest gives (no data is read); with
    ``verify`` every checksum is checked ("verified"). The newest valid one is
    marked ``restart``: it is the one a restart loads (restarts skip corrupt
    checkpoints).
    """
    parent = range_dir(job, range_name)
    ck = Checkpointer(storage, job, range_name)
    ck.check_no_links()
    listing = storage.listdir(parent)
    mtimes = {e.name: e.mtime for e in listing}
    infos: List[CkptInfo] = []
    for d in atomic.scan(storage, parent, listing):
        path = f"{parent}/{d.name}"
        info = CkptInfo(job, range_name, d.name, d.number, d.committed, path)
        try:
            info.bytes, files, newest = _dir_stats(storage, path)
        except StorageError as exc:  # this checkpoint only: the others are still listed
            files, newest = {}, None
            if d.committed:
                info.status, info.reason = "corrupt", f"cannot be read: {_short_reason(exc, path)}"
        info.mtime = newest if newest is not None else mtimes.get(d.name)
        if d.committed and info.status != "corrupt":
            try:
                if verify:
                    info.manifest = verify_checkpoint(storage, job, range_name, d.number, quiet=quiet_progress)
                    info.status = "verified"
                else:
                    info.manifest = ck.read_manifest(d.number)
                    size = files.get(DATA_NAME)
                    if size is None:
                        raise CorruptCheckpointError(f"{DATA_NAME} is missing")
                    if size != info.manifest.data_size:
                        raise CorruptCheckpointError(
                            f"{DATA_NAME} has {size} bytes, manifest says {info.manifest.data_size}"
                        )
                    info.status = "ok"
            except CorruptCheckpointError as exc:
                info.status, info.reason = "corrupt", _short_reason(exc, path)
            except StorageError as exc:
                info.status, info.reason = "corrupt", f"cannot be read: {_short_reason(exc, path)}"
        elif not d.committed:
            info.reason = "leftover of an interrupted save" if ".tmp-" in d.name else "no manifest (not committed)"
        infos.append(info)
    glob = _scan_global(storage, job, range_name, verify, quiet_progress, mtimes)
    if glob:  # both layouts: order by training position, as a restart does
        def pos(i: CkptInfo):
            m = i.manifest
            if i.position is not None:
                return i.position
            return (m.range.epoch_no, m.range.step if m.range.step is not None else (1 << 32) - 1) if m is not None else (-2, i.number)

        infos += glob
        infos.sort(key=lambda i: (pos(i), i.committed), reverse=True)
    else:
        infos.sort(key=lambda i: (i.number, i.committed), reverse=True)
    for i in infos:
        if i.committed and i.valid:
            i.restart = True
            break
    return infos


def _scan_global(storage: Storage, job: str, range_name: str, verify: bool, quiet: bool, mtimes) -> List[CkptInfo]:
    """The checkpoints of a job of several ranks (``ckpt-e<E>[-s<S>]/``, per-rank parts, ``global.json``):
    "ok" when the global manifest and every part's manifest verify (and the data files have their
    sizes); with ``verify`` every part's checksums are read too."""
    from paddle_acp.format.layout import position_key
    from paddle_acp.format.multirank import GlobalCheckpointer

    out = []
    for g in GlobalCheckpointer(storage, job, range_name, 0, 1).scan():
        path = f"{range_dir(job, range_name)}/{g.name}"
        gck = GlobalCheckpointer(storage, job, range_name, 0, 1)
        info = CkptInfo(job, range_name, g.name, 0, g.committed, path)
        info.position = position_key(g.epoch_no, g.step)
        info.bytes, newest = 0, mtimes.get(g.name)
        try:
            for e in storage.listdir(path):
                if e.is_dir:
                    n, _files, t = _dir_stats(storage, f"{path}/{e.name}")
                    info.bytes += n
                    newest = t if t is not None and (newest is None or t > newest) else newest
        except StorageError as exc:  # this checkpoint only
            info.status, info.reason = "corrupt", f"cannot be read: {_short_reason(exc, path)}"
        info.mtime = newest
        if g.committed and info.status != "corrupt":
            try:
                gm, raws = gck.check_global(g.name)
                info.number = gm.number
                info.manifest = Manifest.loads(raws[0])
                info.status = "ok"
                info.reason = f"{gm.world_size} ranks, {gm.mode}"
                if verify:
                    for rank in raws:
                        Checkpointer(storage, job, range_name).load(gm.number, f"{path}/rank-{rank}", raws[rank]).close()
                    info.status = "verified"
            except CorruptCheckpointError as exc:
                info.status, info.reason = "corrupt", _short_reason(exc, path)
            except StorageError as exc:
                info.status, info.reason = "corrupt", f"cannot be read: {_short_reason(exc, path)}"
        elif not g.committed:
            info.reason = "no global manifest (not committed, or abandoned)"
        out.append(info)
    return out


def restart_checkpoint(storage: Storage, job: str, range_name: str, infos: List[CkptInfo], quiet: bool = False) -> Optional[int]:
    """The checkpoint a restart loads, as a restart finds it: the newest committed one
    whose data verifies (every checksum read); those that fail are marked corrupt."""
    for i in infos:  # newest first
        if not i.committed or not i.valid:
            continue
        if i.status != "verified":
            try:
                if i.position is not None:  # a checkpoint of several ranks: every part
                    _verify_global(storage, job, range_name, i.name, i.path)
                else:
                    verify_checkpoint(storage, job, range_name, i.number, quiet=quiet)
            except (CorruptCheckpointError, StorageError) as exc:
                i.status, i.reason, i.restart = "corrupt", _short_reason(exc, i.path), False
                continue
            i.status = "verified"
        for j in infos:
            j.restart = j is i
        return i.number
    for j in infos:
        j.restart = False
    return None


def _verify_global(storage: Storage, job: str, range_name: str, name: str, path: str) -> None:
    from paddle_acp.format.multirank import GlobalCheckpointer

    gm, raws = GlobalCheckpointer(storage, job, range_name, 0, 1).check_global(name)
    for rank in raws:
        Checkpointer(storage, job, range_name).load(gm.number, f"{path}/rank-{rank}", raws[rank]).close()


def _short_reason(exc: BaseException, path: str) -> str:
    msg = str(exc)
    for prefix in (f"{path}/", f"{path}: "):
        msg = msg.replace(prefix, "")
    return msg


def verify_checkpoint(storage: Storage, job: str, range_name: str, number: int, quiet: bool = False) -> Manifest:
    """Check one committed checkpoint completely, streaming (constant memory).

    The same checks as :meth:`Checkpointer.load`: manifest, RNG state, data
    size and every tensor's CRC32. Raises CorruptCheckpointError.
    """
    manifest, _ = _read_checkpoint(storage, job, range_name, number, want=None, quiet=quiet, verb="verifying")
    return manifest


def _read_checkpoint(storage, job, range_name, number, want, quiet=False, verb="reading"):
    """Verify a checkpoint; return (manifest, {(key, name): ndarray} for the tensors in ``want``)."""
    import numpy as np

    m, base, data_path = Checkpointer(storage, job, range_name).check_header(number)
    records = sorted(((t.offset, p.key, t) for p in m.programs for t in p.tensors), key=lambda x: x[0])
    checksum = m.checksum
    out = {}
    total = sum(t.nbytes for _, _, t in records)
    label = f"{verb} {uri_join(storage.uri, base)}"
    try:
        f = storage.open_input(data_path)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{data_path} is missing") from None
    with f, Progress(label, total, enabled=False if quiet else None) as prog:
        for off, key, t in records:
            keep = want is not None and (key, t.name) in want
            arr = np.empty(t.shape, DTYPES[t.dtype]) if keep else None
            buf = memoryview(arr).cast("B") if keep and t.nbytes else None
            crc, pos = 0, 0
            if t.nbytes:
                f.seek(off)
            while pos < t.nbytes:
                n = min(_CHUNK, t.nbytes - pos)
                chunk = f.read(n)
                if len(chunk) != n:
                    raise CorruptCheckpointError(f"{data_path}: short read of tensor {t.name!r}")
                crc = checksum(chunk, crc)
                if buf is not None:
                    buf[pos : pos + n] = chunk
                pos += n
                prog.update(n)
            if crc != t.checksum:
                raise CorruptCheckpointError(f"{data_path}: checksum mismatch in tensor {t.name!r} of program {key}")
            if keep:
                out[(key, t.name)] = arr
    return m, out


# =============================================================================
# checkpoint references (inspect, export)
# =============================================================================
_REF_RE = re.compile(r"(?P<root>.*?)/?(?P<job>[^/]+)/range/(?P<range>[^/]+)/ckpt-(?P<n>0|[1-9][0-9]{0,14})/?", re.ASCII | re.DOTALL)  # fullmatch


@dataclasses.dataclass
class CkptRef:
    storage: Storage
    job: str
    range: str
    number: int

    @property
    def path(self) -> str:
        return f"{range_dir(self.job, self.range)}/{final_name(self.number)}"

    @property
    def uri(self) -> str:
        return uri_join(self.storage.uri, self.path)


def resolve_checkpoint(ref: str, job: Optional[str] = None, range_name: Optional[str] = None, number: Optional[int] = None) -> CkptRef:
    """A checkpoint from ``URI/JOB/range/RANGE/ckpt-N`` or from ``URI`` plus job/range/number.

    With ``URI``, the job (and range) may be left out when there is only one;
    the number defaults to the checkpoint a restart would load.
    """
    if job is None and range_name is None and number is None:
        if re.search(r"/ckpt-\d+\.tmp-[0-9a-f]+/?$", ref):
            raise ToolError(f"{redact(ref)} is the leftover of an interrupted save (never committed; `paddle-acp gc` removes it)")
        if "://" in ref:
            parts = urlsplit(ref)
            m = _REF_RE.fullmatch(parts.path)
            if m:
                root = urlunsplit((parts.scheme, parts.netloc, m.group("root") or "/", parts.query, parts.fragment))
        else:
            m = _REF_RE.fullmatch(ref)
            if m:
                root = m.group("root") or ("/" if ref.startswith("/") else ".")
        if m:
            storage = open_root(root)
            ref_obj = CkptRef(storage, m.group("job"), m.group("range"), int(m.group("n")))
            _check_ref(ref_obj)
            return ref_obj
    storage = open_root(ref)
    if job is None and range_name is None and number is None and storage.exists(MANIFEST_NAME):
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
        raise ToolError(f"cannot read checkpoint {ref.uri}: {_short_reason(exc, ref.path)}") from exc
    except StorageError as exc:
        raise ToolError(f"cannot read checkpoint {ref.uri}: {exc}") from exc


# =============================================================================
# tensor kinds (parameter or optimizer state)
# =============================================================================
_LR_RE = re.compile(r"^(learning_rate(_\d+)?|.*@.*)$")
_ACC_TAIL_RE = re.compile(r"^_[A-Za-z][A-Za-z0-9_]*_\d+$")


def tensor_kinds(names: Sequence[str]) -> Dict[str, str]:
    """name -> "param", "optimizer" or "lr", from Paddle's naming of optimizer variables.

    Paddle names an optimizer accumulator ``<parameter>_<accumulator>_<n>``
    (Adam's ``w_moment1_0``, ``w_beta1_pow_acc_0``, AMP's ``w_fp32_master_0``)
    and the learning-rate variable ``learning_rate_<n>`` ("lr"; counters with
    an '@' count as "lr" too). A variable is optimizer state when it is named
    so after another variable of the same program; everything else (weights,
    biases, batch-norm statistics) is a parameter.
    """
    present = set(names)
    kinds = {}
    for n in names:
        kind = "param"
        if _LR_RE.match(n):
            kind = "lr"
        else:
            for i, ch in enumerate(n):
                if ch == "_" and i and n[:i] in present and _ACC_TAIL_RE.match(n[i:]):
                    kind = "optimizer"
                    break
        kinds[n] = kind
    return kinds


def program_ir(label: str, manifest_ir: str) -> str:
    """The IR of one program: its label starts with it ("pir: 61 ops, ...")."""
    head = label.split(":", 1)[0].strip()
    if head in ("pir", "legacy"):
        return head
    return "legacy" if manifest_ir == "legacy" else "pir"


def export_split(names: Sequence[str], ir: str) -> Dict[str, str]:
    """name -> "pdparams" or "pdopt", as ``paddle.static.save`` splits them.

    Under PIR the learning-rate variable is a parameter (``builtin.parameter``)
    and goes to ``.pdparams``; under the legacy IR it goes to ``.pdopt``.
    """
    out = {}
    for n, kind in tensor_kinds(names).items():
        if kind == "param" or (kind == "lr" and ir == "pir"):
            out[n] = "pdparams"
        else:
            out[n] = "pdopt"
    return out


# =============================================================================
# metrics
# =============================================================================
METRIC_FIELDS = ("event", "time", "pid", "range", "number", "epoch", "step", "bytes", "stall_s", "waited_s",
                 "persist_s", "throughput_mb_s", "ok", "policy")
EVENTS = ("saved", "failed", "skipped", "start")
# Numeric fields and the range a real record keeps them in; a line outside it is skipped
# (a hand-edited or corrupted file must never make the tool fail).
_TIME_MAX = 32503680000.0  # year 3000
_BOUNDS = {"time": (0.0, _TIME_MAX), "stall_s": (0.0, 1e7), "waited_s": (0.0, 1e7), "persist_s": (0.0, 1e7),
           "throughput_mb_s": (0.0, 1e9), "bytes": (0, 1 << 60), "number": (0, 10 ** 18), "epoch": (-1, 1 << 62),
           "step": (0, 1 << 62), "pid": (0, 1 << 31), "skipped_before": (0, 1 << 62)}


def _num(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def clean_record(rec) -> Optional[Dict[str, Any]]:
    """A metrics record with its fields checked, or None when it is unusable.

    Every numeric field present must be a finite number within a real record's range
    (``null`` stands for absent); ``event`` is one of :data:`EVENTS` (records written
    before events existed are ``saved`` or, with ``ok: false``, ``failed``).
    """
    if not isinstance(rec, dict):
        return None
    for key, (lo, hi) in _BOUNDS.items():
        v = rec.get(key)
        if v is None and key != "time":
            continue
        if not _num(v) or not lo <= v <= hi:
            return None
    event = rec.get("event")
    if event is None:
        event = "failed" if rec.get("ok", True) is False else "saved"
    if event not in EVENTS:
        return None
    out = dict(rec)
    out["event"] = event
    out["range"] = str(rec.get("range"))[:200] if rec.get("range") is not None else "-"
    if rec.get("error") is not None:
        out["error"] = str(rec["error"])[:500]
    return out


def read_metrics(storage: Storage, job: str) -> Tuple[List[Dict[str, Any]], int]:
    """The records of a job's metrics files, oldest first, and how many lines were unusable.

    Files: ``JOB/metrics/trainer-<i>.jsonl``, one JSON object per line: saves
    (``event`` saved/failed: ``time, pid, range, number, epoch, step, bytes, stall_s,
    waited_s, persist_s, throughput_mb_s, ok``), skipped saves (``event: skipped``) and
    process starts (``event: start``); each record gets a ``trainer`` field. A torn,
    malformed or out-of-range line is skipped and counted.
    """
    records: List[Dict[str, Any]] = []
    bad = 0
    for e in storage.listdir(f"{job}/{METRICS_DIR}"):
        m = _METRICS_RE.fullmatch(e.name)
        if e.is_dir or not m:
            continue
        try:
            raw = storage.read_bytes(f"{job}/{METRICS_DIR}/{e.name}")
        except FileNotFoundError:
            continue
        for line in raw.decode("utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                rec = clean_record(json.loads(line))
            except (ValueError, RecursionError):
                rec = None
            if rec is None:
                bad += 1
                continue
            rec["trainer"] = int(m.group(1))
            records.append(rec)
    records.sort(key=lambda r: r["time"])
    return records, bad


def saves_of(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in records if r["event"] in ("saved", "failed")]


def restarts_of(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The first record of every process after the first one (a restart): a ``start``
    record, or for files without them the first record with a new ``pid``."""
    out, seen, prev = [], set(), None
    for r in records:
        pid = (r.get("trainer"), r.get("pid"))
        if r.get("pid") is None:
            continue
        if pid != prev and pid not in seen:
            if prev is not None:
                out.append(r)
            seen.add(pid)
        prev = pid
    return out


def summarize_metrics(records: List[Dict[str, Any]], now: Optional[float] = None) -> Dict[str, Any]:
    """Saves, failures, skipped saves, restarts; the time the training thread was blocked per
    save (median/worst, and of it waiting for the previous save), persist time, throughput,
    total bytes, time since the last save."""
    now = time.time() if now is None else now

    def vals(key, recs):
        return [r[key] for r in recs if _num(r.get(key))]

    def block(all_recs):
        recs = saves_of(all_recs)
        skipped = [r for r in all_recs if r["event"] == "skipped"]
        stall, persist = vals("stall_s", recs), vals("persist_s", recs)
        waited = vals("waited_s", recs)
        # throughput only of checkpoints large enough for it to mean something
        thr = [r["throughput_mb_s"] for r in recs if _num(r.get("throughput_mb_s")) and _num(r.get("bytes"))
               and r["bytes"] >= THROUGHPUT_MIN_BYTES]
        ok = [r for r in recs if r["event"] == "saved"]
        failed = [r for r in recs if r["event"] == "failed"]
        worst = max((r for r in recs if _num(r.get("stall_s"))), key=lambda r: r["stall_s"], default=None)
        last = recs[-1]["time"] if recs else None
        return {
            "count": len(recs),
            "ok": len(ok),
            "failed": len(failed),
            "skipped": len(skipped),
            "restarts": len(restarts_of(all_recs)),
            "stall_median_s": statistics.median(stall) if stall else None,
            "stall_worst_s": max(stall) if stall else None,
            "stall_worst_at": {"range": worst.get("range"), "number": worst.get("number"), "time": worst["time"]} if worst else None,
            "waited_median_s": statistics.median(waited) if waited else None,
            "waited_worst_s": max(waited) if waited else None,
            "waited_saves": sum(1 for w in waited if w > 0),
            "persist_median_s": statistics.median(persist) if persist else None,
            "persist_worst_s": max(persist) if persist else None,
            "throughput_median_mb_s": statistics.median(thr) if thr else None,
            "throughput_min_mb_s": min(thr) if thr else None,
            "total_bytes": int(sum(vals("bytes", ok))),
            "first_save": recs[0]["time"] if recs else None,
            "last_failure": (
                {"time": failed[-1]["time"], "range": failed[-1].get("range"), "error": failed[-1].get("error")}
                if failed else None
            ),
            "last_save": last,
            "since_last_save_s": (now - last) if last is not None else None,
        }

    out = block(records)
    ranges = sorted({r["range"] for r in records if r["event"] != "start"}, key=natural_key)
    out["ranges"] = {name: block([r for r in records if r["range"] == name]) for name in ranges}
    return out


THROUGHPUT_MIN_BYTES = 64 << 20  # below this a checkpoint's time is its fixed cost, not bandwidth


def _time_axis(span: float):
    """(unit name, seconds per unit) for an elapsed-time axis of ``span`` seconds."""
    if span < 180:
        return "seconds", 1.0
    if span < 3 * 3600:
        return "minutes", 60.0
    if span < 3 * 86400:
        return "hours", 3600.0
    return "days", 86400.0


def plot_metrics(records: List[Dict[str, Any]], path: str, title: str) -> None:
    """Saves over wall time, as an image (needs matplotlib): per save the time the training
    thread was blocked and the time the write took; failed saves, skipped saves and
    (re)starts of the training process marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker as mticker
        import matplotlib.transforms as mtransforms
    except ImportError:
        raise ToolError(
            "--plot needs matplotlib, which is not installed here: `pip install matplotlib` "
            "(or `pip install paddle-acp[plot]`), or leave out --plot for the text summary"
        ) from None
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise ToolError(f"cannot write the plot to {path!r}: directory {d!r} does not exist")
    t0 = records[0]["time"]
    span = max(records[-1]["time"] - t0, 1.0)
    unit, per = _time_axis(span)

    def x(r):
        return (r["time"] - t0) / per

    floor = 1e-4  # log axes: 0.1 ms stands for "no time at all"

    def y(r, key):
        v = r.get(key)
        return max(float(v), floor) if _num(v) else None

    s = summarize_metrics(records)
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5))
    saved = [r for r in records if r["event"] == "saved"]
    failed = [r for r in records if r["event"] == "failed"]
    skipped = [r for r in records if r["event"] == "skipped"]
    restarts = restarts_of(records)
    # one line per process and range: lines never join across a restart
    segments: Dict[Tuple[Any, Any, str], List[Dict[str, Any]]] = {}
    for r in saved:
        segments.setdefault((r.get("trainer"), r.get("pid"), r["range"]), []).append(r)
    ranges = sorted({r["range"] for r in saved}, key=natural_key)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {name: colors[i % len(colors)] for i, name in enumerate(ranges)}
    labelled = set()
    for (_tr, _pid, name), recs in segments.items():
        label = None if name in labelled else f"saved, range {name.lstrip('_')}"  # '_' hides a label
        labelled.add(name)
        for ax, key in ((ax1, "stall_s"), (ax2, "persist_s")):
            pts = [(x(r), y(r, key)) for r in recs if y(r, key) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, lw=0.8,
                        color=color[name], label=label if ax is ax1 else None)
    for ax, key in ((ax1, "stall_s"), (ax2, "persist_s")):
        pts = [(x(r), y(r, key) or floor) for r in failed]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "x", color="red", ms=9, mew=2,
                    label=f"failed save ({len(failed)})" if ax is ax1 else None)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_locator(mticker.NullLocator())
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _pos: fmt_seconds(v)))
        ax.grid(True, which="major", alpha=0.3)
        # restarts: a dashed line through both panels
        for i, r in enumerate(restarts):
            ax.axvline(x(r), color="0.3", ls="--", lw=1,
                       label=(f"restart ({len(restarts)})" if i == 0 and ax is ax1 else None))
    if skipped:
        trans = mtransforms.blended_transform_factory(ax1.transData, ax1.transAxes)
        ax1.plot([x(r) for r in skipped], [0.03] * len(skipped), "|", color="darkorange", ms=12, mew=1.5,
                 transform=trans, label=f"skipped save ({len(skipped)}): previous one still being written")
    ax1.set_ylabel("training thread blocked per save")
    ax2.set_ylabel("write + commit time per save")
    ax2.set_xlabel(f"{unit} since {fmt_time(t0)}")
    ax2.set_xlim(left=min(0.0, ax2.get_xlim()[0]))
    parts = [f"{s['count']} saves"]
    if s["failed"]:
        parts.append(f"{s['failed']} failed")
    if s["skipped"]:
        parts.append(f"{s['skipped']} skipped")
    if restarts:
        parts.append(f"{len(restarts)} restart(s)")
    ax1.set_title(title + "\n" + ", ".join(p for p in parts if p), fontsize=11)
    ax1.legend(loc="upper left", fontsize="small", framealpha=0.85)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# =============================================================================
# commands
# =============================================================================
def _out(text: str = "") -> None:
    sys.stdout.write(scrub(text) + "\n")


def _epoch_cell(m: Optional[Manifest]) -> str:
    return "-" if m is None else str(m.range.epoch_no)


def _step_cell(m: Optional[Manifest]) -> str:
    return "-" if m is None or m.range.step is None else str(m.range.step)


def _status_cell(i: CkptInfo) -> str:
    if i.status in ("ok", "verified"):
        return i.status + (f" ({i.reason})" if i.position is not None and i.reason else "")
    if i.status == "corrupt":
        return f"CORRUPT: {i.reason}"
    return f"uncommitted ({i.reason})"


def cmd_ls(args) -> int:
    storage = open_root(args.uri)
    jobs = select_jobs(storage, args.job)
    result = []
    for job in jobs:
        marker = read_job_marker(storage, job)
        ranges = []
        for r in list_ranges(storage, job):
            infos = scan_range(storage, job, r, verify=args.verify)
            restart = next((i.number for i in infos if i.restart), None)
            restart_name = next((i.name for i in infos if i.restart), None)
            ranges.append({"range": r, "restart": restart, "restart_name": restart_name, "checkpoints": infos})
        result.append({"job": job, "created": marker.get("created"), "ranges": ranges})
    if args.json:
        doc = {
            "uri": storage.uri,
            "verified": bool(args.verify),
            "jobs": [
                {
                    "job": j["job"],
                    "created": j["created"],
                    "ranges": [
                        {"range": r["range"], "restart": r["restart"], "checkpoints": [i.to_json() for i in r["checkpoints"]]}
                        for r in j["ranges"]
                    ],
                }
                for j in result
            ],
        }
        _out(json.dumps(doc, indent=2))
        return 0
    _out(f"storage {storage.uri}")
    for j in result:
        n_ck = sum(1 for r in j["ranges"] for i in r["checkpoints"] if i.committed)
        created = f", created {fmt_time(j['created'])}" if j["created"] else ""
        _out("")
        _out(f"job {j['job']}: {len(j['ranges'])} range(s), {n_ck} checkpoint(s){created}")
        if not j["ranges"]:
            _out("  (no checkpoints yet)")
        for r in j["ranges"]:
            restart = r["restart_name"] if r["restart"] is not None else "nothing (would start from scratch)"
            _out(f"  range {r['range']}: a restart loads {restart}")
            rows = []
            for i in r["checkpoints"]:
                m = i.manifest
                created = m.created if m is not None else i.mtime
                rows.append(
                    [
                        "*" if i.restart else "",
                        i.name,
                        _epoch_cell(m),
                        _step_cell(m),
                        human_bytes(i.bytes),
                        fmt_time(created),
                        _status_cell(i),
                    ]
                )
            if rows:
                _out(table(["", "CHECKPOINT", "EPOCH", "STEP", "SIZE", "CREATED", "STATUS"], rows, right=(2, 3, 4), indent="    "))
            else:
                _out("    (no checkpoints)")
    _out("")
    if args.verify:
        _out("* = the checkpoint a restart loads (every checksum verified)")
    else:
        _out("* = the checkpoint a restart loads (checksums not read: run `paddle-acp verify` to check them)")
    return 0


def _rng_summary(rng: Optional[dict]) -> Dict[str, Any]:
    if not rng:
        return {"saved": False}
    return {
        "saved": True,
        "paddle_generators": len(rng.get("paddle") or []),
        "numpy": rng.get("numpy") is not None,
        "python": rng.get("python") is not None,
    }


def cmd_inspect(args) -> int:
    ref = resolve_checkpoint(args.checkpoint, args.job, args.range, args.number)
    m = load_manifest(ref)
    data_size = None
    try:
        data_size = ref.storage.size(f"{ref.path}/{DATA_NAME}")
    except FileNotFoundError:
        pass
    infos = scan_range(ref.storage, ref.job, ref.range)
    restart = restart_checkpoint(ref.storage, ref.job, ref.range, infos)
    this = next((i for i in infos if i.number == m.number and i.committed), None)
    rng = _rng_summary(m.rng)
    programs = []
    for p in m.programs:
        kinds = tensor_kinds([t.name for t in p.tensors])
        kinds = {n: {"lr": "learning rate"}.get(k, k) for n, k in kinds.items()}
        programs.append(
            {
                "key": p.key,
                "label": p.label,
                "lr_scheduler": p.lr_scheduler,
                "tensors": [dict(t.to_json(), kind=kinds[t.name]) for t in p.tensors],
            }
        )
    if args.json:
        doc = {
            "checkpoint": ref.uri,
            "job": ref.job,
            "range": m.range.to_json(),
            "number": m.number,
            "created": m.created,
            "paddle_version": m.paddle_version,
            "ir": m.ir,
            "rng": rng,
            "data_size": m.data_size,
            "data_file_size": data_size,
            "restart": restart == m.number,
            "data_status": this.status if this is not None else None,
            "data_problem": (this.reason or None) if this is not None else None,
            "extra_keys": sorted(m.extra),
            "programs": programs,
        }
        _out(json.dumps(doc, indent=2))
        return 0
    r = m.range
    where = "end of epoch" if r.step is None else f"mid-epoch, after {r.step} step(s) of epoch {r.epoch_no}"
    if restart == m.number:
        loads = "yes"
    elif restart is None:
        loads = "no (no valid checkpoint in this range)"
    else:
        loads = f"no (a restart loads ckpt-{restart})"
    if rng["saved"]:
        rng_text = f"yes (Paddle: {rng['paddle_generators']} generator(s), NumPy: {'yes' if rng['numpy'] else 'no'}, Python: {'yes' if rng['python'] else 'no'})"
    else:
        rng_text = "no"
    if data_size is None:
        data_text = f"{DATA_NAME} MISSING (manifest says {m.data_size} bytes)"
    elif data_size != m.data_size:
        data_text = f"{DATA_NAME} {data_size} bytes, manifest says {m.data_size}: CORRUPT"
    elif this is not None and this.status == "corrupt":
        data_text = f"{DATA_NAME} {human_bytes(data_size)}: CORRUPT ({this.reason})"
    elif this is not None and this.status == "verified":
        data_text = f"{DATA_NAME} {human_bytes(data_size)} ({data_size} bytes; every checksum verified)"
    else:
        data_text = f"{DATA_NAME} {human_bytes(data_size)} ({data_size} bytes; checksums: run `paddle-acp verify`)"
    rows = [
        ("checkpoint", ref.uri),
        ("number", str(m.number)),
        ("created", fmt_time(m.created)),
        ("job / range", f"{ref.job} / {r.name}"),
        ("epoch", f"{r.epoch_no} (max_epoch_num {r.max_epoch_num}), {where}"),
        ("restart loads it", loads),
        ("made with", f"Paddle {m.paddle_version or '?'}, IR {m.ir or '?'}"),
        ("RNG saved", rng_text),
        ("data", data_text),
    ]
    if m.extra:
        rows.append(("extra", ", ".join(sorted(m.extra))))
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        _out(f"{k.ljust(w)}  {v}")
    for p in programs:
        _out("")
        n_param = sum(1 for t in p["tensors"] if t["kind"] == "param")
        _out(f"program {p['key']}  ({p['label']})")
        if p["lr_scheduler"] is not None:
            sched = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(p["lr_scheduler"].items()))
            _out(f"  LR scheduler: {sched}")
        else:
            _out("  LR scheduler: none saved")
        rows = [
            [t["name"], t["kind"], t["dtype"], "[" + ", ".join(map(str, t["shape"])) + "]", t["nbytes"]]
            for t in p["tensors"]
        ]
        _out(table(["VARIABLE", "KIND", "DTYPE", "SHAPE", "BYTES"], rows, right=(4,), indent="  "))
        total = sum(t["nbytes"] for t in p["tensors"])
        _out(
            f"  {len(p['tensors'])} variables, {human_bytes(total)}; "
            f"{n_param} parameters, {len(p['tensors']) - n_param} optimizer variables (learning rate included)"
        )
    return 0


def cmd_verify(args) -> int:
    storage = open_root(args.uri)
    jobs = select_jobs(storage, args.job)
    rows, failures, warnings_, n_checked, n_valid = [], [], [], 0, 0
    for job in jobs:
        ranges = list_ranges(storage, job)
        for r in ranges:
            try:
                infos = scan_range(storage, job, r, verify=True)
            except StorageError as exc:
                raise ToolError(f"cannot read job {job!r} range {r!r} under {storage.uri!r}: {exc}") from exc
            committed = [i for i in infos if i.committed]
            n_checked += len(committed)
            n_valid += sum(1 for i in committed if i.valid)
            for i in infos:
                if i.committed:
                    status = "ok" if i.valid else f"BAD: {i.reason}"
                else:
                    status = f"ignored: {i.reason}"
                rows.append([job, r, i.name, _epoch_cell(i.manifest), "*" if i.restart else "", status])
            if committed and not committed[0].valid:
                newest = committed[0]
                fallback = next((i for i in committed if i.valid), None)
                then = f"fall back to {fallback.name}" if fallback else "START FROM SCRATCH (no valid checkpoint)"
                failures.append(
                    f"{uri_join(storage.uri, newest.path)} is bad ({newest.reason}): a restart of job {job!r} range {r!r} would {then}"
                )
            elif infos and not any(i.valid for i in committed):
                failures.append(
                    f"job {job!r} range {r!r} has {len(infos)} checkpoint director{'y' if len(infos) == 1 else 'ies'} "
                    "but no valid (committed) checkpoint: a restart would START FROM SCRATCH"
                )
            for i in committed[1:]:
                if not i.valid:
                    warnings_.append(f"{uri_join(storage.uri, i.path)} is bad ({i.reason})")
    if n_valid == 0 and not failures:
        which = f"job {args.job!r}" if args.job else f"{len(jobs)} job(s)"
        failures.append(f"no valid checkpoint in {which} under {storage.uri}: a restart would START FROM SCRATCH")
    if args.json:
        doc = {"uri": storage.uri, "ok": not failures, "failures": failures, "bad_older": warnings_,
               "checked": n_checked, "rows": [dict(zip(["job", "range", "checkpoint", "epoch", "restart", "status"], r)) for r in rows]}
        _out(json.dumps(doc, indent=2))
        return 1 if failures else 0
    _out(f"verifying {storage.uri}")
    if rows:
        _out(table(["JOB", "RANGE", "CHECKPOINT", "EPOCH", "", "STATUS"], rows, right=(3,)))
    for w in warnings_:
        _out(f"warning: older checkpoint {w}")
    if failures:
        for f in failures:
            _out(f"FAILED: {f}")
        return 1
    _out(f"OK: {n_checked} checkpoint(s) verified; every checkpoint a restart loads (*) is intact")
    return 0


@dataclasses.dataclass
class GcAction:
    job: str
    range: str
    info: CkptInfo
    action: str  # keep | delete | skip
    why: str


def plan_gc(storage: Storage, jobs: List[str], keep: int, leftover_age: float, now: Optional[float] = None) -> List[GcAction]:
    """What ``gc`` keeps and deletes; reads (and verifies) but changes nothing."""
    now = time.time() if now is None else now
    plan: List[GcAction] = []
    for job in jobs:
        for r in list_ranges(storage, job):
            infos = scan_range(storage, job, r)
            committed = [i for i in infos if i.committed]
            newest_k = {i.number for i in committed[:keep]}
            newest_valid = restart_checkpoint(storage, job, r, infos)
            for i in infos:
                if not i.committed:
                    age = now - i.mtime if i.mtime is not None else None
                    if age is not None and age < leftover_age:
                        plan.append(GcAction(job, r, i, "skip", f"{i.reason}, but modified {fmt_duration(age)} ago: may be a save in progress"))
                    else:
                        plan.append(GcAction(job, r, i, "delete", i.reason))
                elif newest_valid is None:
                    plan.append(GcAction(job, r, i, "keep", "no valid checkpoint in this range: nothing deleted"))
                elif i.number == newest_valid and i.number not in newest_k:
                    plan.append(GcAction(job, r, i, "keep", "newest valid checkpoint (a restart loads it)"))
                elif i.number in newest_k:
                    why = f"among the newest {keep}"
                    if i.number == newest_valid:
                        why += ", a restart loads it"
                    elif i.status == "corrupt":
                        why += f" (CORRUPT: {i.reason})"
                    plan.append(GcAction(job, r, i, "keep", why))
                else:
                    why = f"older than the newest {keep}"
                    if i.status == "corrupt":
                        why += f" (CORRUPT: {i.reason})"
                    plan.append(GcAction(job, r, i, "delete", why))
    return plan


def cmd_gc(args) -> int:
    if args.keep < 1:
        raise ToolError(f"--keep must be at least 1, got {args.keep}")
    storage = open_root(args.uri)
    jobs = select_jobs(storage, args.job)
    try:
        plan = plan_gc(storage, jobs, args.keep, args.leftover_age)
    except StorageError as exc:
        raise ToolError(f"gc of {storage.uri!r} stopped before deleting anything: {exc}") from exc
    doomed = [a for a in plan if a.action == "delete"]
    freed = sum(a.info.bytes for a in doomed)
    done: List[GcAction] = []
    errors: List[str] = []
    if not args.dry_run:
        for a in doomed:
            try:
                if a.info.committed:
                    # the manifest first: a half-deleted checkpoint never looks committed
                    storage.delete_file(f"{a.info.path}/{MANIFEST_NAME}")
                storage.delete_dir(a.info.path)
                done.append(a)
            except StorageError as exc:
                errors.append(str(exc))
    if args.json:
        doc = {
            "uri": storage.uri,
            "dry_run": bool(args.dry_run),
            "keep": args.keep,
            "actions": [
                {"job": a.job, "range": a.range, "checkpoint": a.info.name, "action": a.action, "why": a.why, "bytes": a.info.bytes}
                for a in plan
            ],
            "deleted": [] if args.dry_run else [a.info.path for a in done],
            "freed_bytes": 0 if args.dry_run else sum(a.info.bytes for a in done),
            "errors": errors,
        }
        _out(json.dumps(doc, indent=2))
        return 2 if errors else 0
    verb = "would delete" if args.dry_run else "delete"
    _out(f"gc {storage.uri} --keep {args.keep}" + (" (dry run: nothing is changed)" if args.dry_run else ""))
    rows = [[a.job, a.range, a.info.name, verb if a.action == "delete" else a.action, human_bytes(a.info.bytes), a.why] for a in plan]
    if rows:
        _out(table(["JOB", "RANGE", "CHECKPOINT", "ACTION", "SIZE", "WHY"], rows, right=(4,)))
    if args.dry_run:
        _out(f"dry run: {len(doomed)} director{'y' if len(doomed) == 1 else 'ies'} ({human_bytes(freed)}) would be deleted; nothing was changed")
    else:
        _out(f"deleted {len(done)} director{'y' if len(done) == 1 else 'ies'}, freed {human_bytes(sum(a.info.bytes for a in done))}")
    for e in errors:
        print(f"paddle-acp: error: {scrub(e)}", file=sys.stderr)
    return 2 if errors else 0


def _pick_program(m: Manifest, key: Optional[str], ref: CkptRef):
    keys = [p.key for p in m.programs]
    if not keys:
        raise ToolError(f"checkpoint {ref.uri} holds no programs")
    if key is None:
        if len(keys) == 1:
            return m.programs[0]
        raise ToolError(f"checkpoint {ref.uri} holds {len(keys)} programs ({', '.join(keys)}): choose one with --program")
    matches = [p for p in m.programs if p.key == key] or [p for p in m.programs if p.key.startswith(key)]
    if len(matches) != 1:
        what = "matches several" if matches else "matches none"
        raise ToolError(f"--program {key!r} {what} of the programs in {ref.uri} ({', '.join(keys)})")
    return matches[0]


def _write_pickle(path: str, obj) -> int:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=4)  # what paddle.save / paddle.static.save write
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return os.path.getsize(path)


def cmd_export(args) -> int:
    ref = resolve_checkpoint(args.checkpoint, args.job, args.range, args.number)
    m = load_manifest(ref)
    prog = _pick_program(m, args.program, ref)
    ir = program_ir(prog.label, m.ir)
    split = export_split([t.name for t in prog.tensors], ir)
    if not args.name or "/" in args.name or args.name in (".", ".."):
        raise ToolError(f"--name {args.name!r} must be a plain file name prefix")
    want = {(prog.key, t.name) for t in prog.tensors if args.optimizer_state or split[t.name] == "pdparams"}
    try:
        _, arrays = _read_checkpoint(ref.storage, ref.job, ref.range, ref.number, want, verb="exporting")
    except CorruptCheckpointError as exc:
        raise ToolError(f"cannot export checkpoint {ref.uri}: it is corrupt ({_short_reason(exc, ref.path)})") from exc
    except StorageError as exc:
        raise ToolError(f"cannot read checkpoint {ref.uri}: {exc}") from exc
    params = {t.name: arrays[(prog.key, t.name)] for t in prog.tensors if split[t.name] == "pdparams"}
    opt = {t.name: arrays[(prog.key, t.name)] for t in prog.tensors if split[t.name] == "pdopt" and (prog.key, t.name) in arrays}
    try:
        os.makedirs(args.to, exist_ok=True)
    except OSError as exc:
        raise ToolError(f"cannot create --to directory {args.to!r}: {exc}") from exc
    prefix = os.path.join(args.to, args.name)
    written = []
    try:
        written.append((prefix + ".pdparams", len(params), _write_pickle(prefix + ".pdparams", params)))
        if args.optimizer_state:
            written.append((prefix + ".pdopt", len(opt), _write_pickle(prefix + ".pdopt", opt)))
        info = {
            "source": ref.uri,
            "number": m.number,
            "range": m.range.to_json(),
            "program": prog.key,
            "label": prog.label,
            "paddle_version": m.paddle_version,
            "ir": ir,
            "created": m.created,
            "exported": time.time(),
            "parameters": sorted(params),
            "optimizer_state": sorted(opt) if args.optimizer_state else None,
            "lr_scheduler": prog.lr_scheduler,
        }
        info_path = prefix + ".export.json"
        with open(info_path, "w") as f:
            json.dump(info, f, indent=2)
    except OSError as exc:
        raise ToolError(f"cannot write to {args.to!r}: {exc}") from exc
    _out(f"exported program {prog.key} of checkpoint {ref.uri} (epoch {m.range.epoch_no})")
    _out(table(["FILE", "VARIABLES", "SIZE"], [[p, n, human_bytes(s)] for p, n, s in written] + [[info_path, "-", "(provenance, LR scheduler state)"]], right=(1,)))
    _out("")
    _out("load it with plain Paddle (static graph):")
    _out(f"  paddle.static.set_program_state(program, paddle.load({prefix + '.pdparams'!r}, return_numpy=True))")
    if args.optimizer_state:
        _out(f"  paddle.static.load(program, {prefix!r})   # parameters and optimizer state")
    else:
        _out(f"  paddle.static.load_program_state({prefix!r})   # name -> numpy array")
    return 0


def cmd_stats(args) -> int:
    storage = open_root(args.uri)
    job = single_job(storage, args.job)
    records, bad = read_metrics(storage, job)
    where = uri_join(storage.uri, f"{job}/{METRICS_DIR}/trainer-*.jsonl")
    if not saves_of(records) and not any(r["event"] == "skipped" for r in records):
        extra = f" ({bad} unusable line(s) skipped)" if bad else ""
        raise ToolError(f"job {job!r} under {storage.uri!r} has no save metrics ({where} is missing or empty){extra}")
    s = summarize_metrics(records)
    if args.plot:
        plot_metrics(records, args.plot, f"paddle-acp saves of job {job}")
    if args.json:
        doc = dict(s, uri=storage.uri, job=job, skipped_lines=bad, plot=args.plot)
        _out(json.dumps(doc, indent=2))
        return 0
    failed = f", {s['failed']} FAILED" if s["failed"] else ""
    skipped = f", {s['skipped']} skipped (the previous checkpoint was still being written)" if s["skipped"] else ""
    restarts = f", {s['restarts']} restart(s)" if s["restarts"] else ""
    _out(f"job {job} at {storage.uri}: {s['count']} save(s){failed}{skipped}{restarts}")
    w = s["stall_worst_at"]
    worst_where = f" (ckpt-{w['number']} of {w['range']}, {fmt_time(w['time'])})" if w and w.get("number") is not None else (
        f" ({w['range']}, {fmt_time(w['time'])})" if w else "")
    waited = "-"
    if s["waited_median_s"] is not None:
        waited = (f"{s['waited_saves']} save(s) waited for the previous one, worst {fmt_seconds(s['waited_worst_s'])}"
                  if s["waited_saves"] else "no save waited for the previous one")
    thr = "-" if s["throughput_median_mb_s"] is None else (
        f"median {s['throughput_median_mb_s']:.1f} MB/s, slowest {s['throughput_min_mb_s']:.1f} MB/s")
    if s["throughput_median_mb_s"] is None and s["count"]:
        thr = f"- (no checkpoint of {human_bytes(THROUGHPUT_MIN_BYTES)} or more: smaller ones measure fixed cost)"
    rows = [
        ("blocked", f"median {fmt_seconds(s['stall_median_s'])}, worst {fmt_seconds(s['stall_worst_s'])}{worst_where}"
                    "  (training thread, per save)"),
        ("waited", waited),
        ("persist", f"median {fmt_seconds(s['persist_median_s'])}, worst {fmt_seconds(s['persist_worst_s'])}"),
        ("throughput", thr),
        ("total written", human_bytes(s["total_bytes"])),
        ("first save", fmt_time(s["first_save"])),
        ("last save", f"{fmt_time(s['last_save'])} ({fmt_duration(s['since_last_save_s'])} ago)"
                      if s["last_save"] is not None else "-"),
    ]
    if s["last_failure"]:
        f = s["last_failure"]
        rows.append(("last failure", f"{fmt_time(f['time'])} in {f['range']}: {f['error'] or 'no error recorded'}"))
    wk = max(len(k) for k, _ in rows)
    for k, v in rows:
        _out(f"  {k.ljust(wk)}  {v}")
    if s["ranges"]:
        _out("")
        trows = []
        for name, b in s["ranges"].items():
            trows.append([name, b["count"], b["failed"], b["skipped"], fmt_seconds(b["stall_median_s"]),
                          fmt_seconds(b["stall_worst_s"]), human_bytes(b["total_bytes"]), fmt_time(b["last_save"])])
        _out(table(["RANGE", "SAVES", "FAILED", "SKIPPED", "MEDIAN BLOCKED", "WORST BLOCKED", "BYTES", "LAST SAVE"],
                   trows, right=(1, 2, 3, 4, 5, 6), indent="  "))
    if bad:
        _out(f"\nnote: {bad} unreadable or out-of-range line(s) in {where} were skipped")
    if args.plot:
        _out(f"\nplot written to {args.plot}")
    return 0


# =============================================================================
# command line
# =============================================================================
def _guard(fn):
    """Wrap a command: stdout closed early (``| head``) is not an error."""

    def run(args):
        try:
            return fn(args)
        except BrokenPipeError:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except OSError:
                pass
            return 0

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


def _add_ref_args(p) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="URI/JOB/range/RANGE/ckpt-N, or the storage root URI with --job/--range/--number")
    p.add_argument("--job", help="job id (with a storage root URI; optional when there is one job)")
    p.add_argument("--range", help="range name, e.g. _range_0 (optional when the job has one range)")
    p.add_argument("--number", type=int, help="checkpoint number (default: the one a restart loads)")


def add_subcommands(sub) -> None:
    """Register ls, inspect, verify, gc, export and stats on an argparse subparsers object."""
    p = sub.add_parser("ls", help="list jobs, ranges and checkpoints (newest first) under a storage root",
                       description="List jobs, ranges and checkpoints under a storage root, newest first, "
                       "and mark (*) the checkpoint a restart would load.")
    p.add_argument("uri", metavar="URI", help="storage root (the PADDLE_ACP_CHECKPOINT_URI of the job)")
    p.add_argument("--job", help="only this job")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verify", action="store_true", help="also read the data and check every checksum (slower)")
    p.set_defaults(func=_guard(cmd_ls))

    p = sub.add_parser("inspect", help="show one checkpoint's manifest",
                       description="Show a checkpoint's programs, variables, LR scheduler, RNG and the Paddle version/IR it was made with.")
    _add_ref_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_guard(cmd_inspect))

    p = sub.add_parser("verify", help="check every checkpoint's checksums (exit 1 if the one a restart loads is bad)",
                       description="Read every committed checkpoint and check its manifest and checksums. Exit status 1 "
                       "when the newest committed checkpoint of a range (the one a restart loads) is bad.")
    p.add_argument("uri", metavar="URI", help="storage root")
    p.add_argument("--job", help="only this job")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_guard(cmd_verify))

    p = sub.add_parser("gc", help="delete old checkpoints and leftovers by hand (keeps the newest valid one)",
                       description="Keep the newest K committed checkpoints of every range (and always the newest valid "
                       "one) and delete the older ones and the leftovers of interrupted saves.")
    p.add_argument("uri", metavar="URI", help="storage root")
    p.add_argument("--keep", type=int, required=True, metavar="K", help="committed checkpoints to keep per range (>= 1)")
    p.add_argument("--dry-run", action="store_true", help="only show what would be deleted")
    p.add_argument("--job", help="only this job")
    p.add_argument("--leftover-age", type=float, default=600.0, metavar="SECONDS",
                   help="delete uncommitted leftovers only when untouched this long (default 600: a save may be in progress)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_guard(cmd_gc))

    p = sub.add_parser("export", help="write a program's parameters in Paddle's own format (.pdparams/.pdopt)",
                       description="Write the parameters of one program of a checkpoint (and with --optimizer-state the "
                       "optimizer variables) as DIR/NAME.pdparams (and NAME.pdopt), the format of paddle.static.save: "
                       "load them with paddle.static.load, paddle.static.set_program_state or paddle.load, without paddle-acp.")
    _add_ref_args(p)
    p.add_argument("--program", metavar="KEY", help="program key (or a unique prefix); see `paddle-acp inspect`")
    p.add_argument("--to", required=True, metavar="DIR", help="local output directory")
    p.add_argument("--name", default="model", help="file name prefix (default: model)")
    p.add_argument("--optimizer-state", action="store_true", help="also write the optimizer variables to NAME.pdopt")
    p.set_defaults(func=_guard(cmd_export))

    p = sub.add_parser("stats", help="summarize the save metrics of a job (blocked time, skipped saves, persist time)",
                       description="Summarize the metrics the saves write (JOB/metrics/trainer-*.jsonl).")
    p.add_argument("uri", metavar="URI", help="storage root")
    p.add_argument("--job", help="job id (optional when there is one job)")
    p.add_argument("--plot", metavar="PNG", help="draw the saves over wall time, with failed and skipped saves "
                   "and restarts marked (needs matplotlib: pip install paddle-acp[plot])")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_guard(cmd_stats))
