"""The node-local cache tier of remote checkpoints (``PADDLE_ACP_LOCAL_CACHE=DIR``).

Layout: ``DIR/<key>/`` per remote location (:mod:`~paddle_acp.format.checkpoints.cache_key`), holding
``origin.json`` (the location, never credentials) and, mirroring the remote::

      <job>/range/<range>/ckpt-<N>/{tensors.bin,manifest.json}              one writer
      <job>/range/<range>/rank-<k>/ckpt-e<E>[-s<S>]/{tensors.bin,manifest.json}   rank k's part

A copy's data file is written under ``*.tmp-<id>`` while the upload runs (:meth:`RangeCache.begin`) and committed
(the remote's manifest bytes, then a rename) only after the remote commit succeeded. Retention keeps the newest
``keep`` copies; those at a later position than the one just committed are of another history and go.

Correctness never depends on the cache: restore picks its checkpoint on the remote and reads a local copy
(:meth:`RangeCache.load`) only when its manifest is byte for byte the remote's committed one (for a part: the bytes
``global.json`` records), it passes the normal verifier, and nobody but this user could have written it
(:mod:`~paddle_acp.format.checkpoints.cache_trust`: checksums catch damage, not edits). So a stale, foreign,
damaged or tampered copy costs a remote read (one log line says why), never a wrong resume; a corrupt copy is
removed. Keys keep locations apart, so one location's retention never deletes another's copies.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import threading
import uuid
from typing import List, Optional, Tuple

from paddle_acp.config import StorageOptions
from paddle_acp.errors import CheckpointError, CorruptCheckpointError, StorageError
from paddle_acp.format.checkpoints.cache_key import cache_key, canonical_location
from paddle_acp.format.checkpoints.cache_trust import harden, untrusted
from paddle_acp.format.commit.retention import preserve, to_delete
from paddle_acp.format.engine import reader
from paddle_acp.format.engine.reader import Landing, LoadedCheckpoint
from paddle_acp.format.engine.snapshot import Snapshot
from paddle_acp.format.layout import parse_final, parse_name, position_key
from paddle_acp.format.manifest import DATA_NAME, MANIFEST_NAME
from paddle_acp.storage.base import Storage, redact
from paddle_acp.storage.local import open_regular
from paddle_acp.storage.schemes import open_storage

logger = logging.getLogger("paddle_acp")

ORIGIN_NAME = "origin.json"
ORIGIN_FORMAT = "paddle-acp/local-cache"
ORIGIN_VERSION = 1
DEFAULT_KEEP = 2  # copies kept per writer: the newest is what a restart uses
_TMP_RE = re.compile(r".+\.tmp-[0-9a-f]{12}", re.ASCII)
_HEADROOM = 64 << 20  # free bytes left on the cache's disk after a copy


def cache_keep(max_to_keep: int) -> int:
    """Copies kept per writer: ``PADDLE_ACP_MAX_TO_KEEP``, at most :data:`DEFAULT_KEEP` (0: that)."""
    return DEFAULT_KEEP if max_to_keep <= 0 else min(max_to_keep, DEFAULT_KEEP)


def _position(name: str) -> Optional[Tuple[int, int]]:
    """Sort key of a committed copy's directory name (``ckpt-N`` or ``ckpt-eE[-sS]``), or None."""
    n = parse_final(name)
    if n is not None:
        return (n, 0)
    pos = parse_name(name)
    if pos is not None:
        return position_key(*pos)
    return None


# -- the cache of one remote location ------------------------------------------------------------
class LocalCache:
    """``DIR/<key>``: the local copies of one remote checkpoint location."""

    def __init__(self, storage: Storage, directory: str, remote_uri: str, keep: int):
        self.storage = storage  # a local Storage rooted at DIR/<key>
        self.directory = directory
        self.remote_uri = redact(remote_uri)
        self.keep = keep

    @classmethod
    def open(cls, directory: str, remote_uri: str, max_to_keep: int,
             options: Optional[StorageOptions] = None) -> Optional["LocalCache"]:
        """The cache of ``remote_uri`` under ``directory``; None, with one warning, when it cannot be used
        (checkpoints then go to the remote alone)."""
        endpoint = (options or StorageOptions()).s3.endpoint
        canon = canonical_location(remote_uri, endpoint)
        root = os.path.join(directory, cache_key(remote_uri, endpoint))
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.makedirs(root, mode=0o700, exist_ok=True)
            if not os.access(root, os.W_OK | os.X_OK):
                raise PermissionError(f"{root} is not writable by this user")
            origin = os.path.join(root, ORIGIN_NAME)
            if os.path.lexists(origin):
                with os.fdopen(open_regular(origin, origin), "rb") as f:  # never blocks on a named pipe
                    doc = json.loads(f.read(1 << 16) or b"null")
                if not isinstance(doc, dict) or doc.get("location") != canon:
                    raise CheckpointError(f"{origin} names another location; move that directory away")
            else:
                tmp = f"{origin}.tmp-{uuid.uuid4().hex[:12]}"
                with open(tmp, "w") as f:
                    json.dump({"format": ORIGIN_FORMAT, "version": ORIGIN_VERSION, "location": canon}, f)
                os.replace(tmp, origin)
            probe = os.path.join(root, f".probe.tmp-{uuid.uuid4().hex[:12]}")
            with open(probe, "wb") as f:
                f.write(b"ok")
            os.remove(probe)
            storage = open_storage(root, StorageOptions())  # a local directory: no setting applies
        except (OSError, ValueError, RecursionError, CheckpointError, StorageError) as exc:
            logger.warning(
                "PADDLE_ACP_LOCAL_CACHE=%s cannot be used (%s): checkpoints go to %s only, and restarts read them "
                "from there; make the directory writable (or unset the variable) to keep local copies",
                directory, exc, redact(remote_uri),
            )
            return None
        return cls(storage, directory, remote_uri, cache_keep(max_to_keep))

    def for_range(self, job_id: str, range_name: str, rank: Optional[int] = None) -> "RangeCache":
        """The copies of one range: written by one writer (``rank`` None) or by rank ``rank`` of several."""
        return RangeCache(self, job_id, range_name, rank)


@dataclasses.dataclass
class _Outcome:
    error: Optional[BaseException] = None
    skipped: Optional[str] = None  # why no copy is written (no space): said once per streak


class RangeCache:
    """The local copies of one range's checkpoints, written by this process's writer."""

    def __init__(self, cache: LocalCache, job_id: str, range_name: str, rank: Optional[int]):
        self.cache = cache
        self.storage = cache.storage
        self.job_id = job_id
        self.range_name = range_name
        self.rank = rank
        self.range_dir = f"{job_id}/range/{range_name}"
        self.dir = self.own_dir(rank)
        self._failing = False  # a copy failed or was skipped: the next failure is not logged again

    def own_dir(self, rank: Optional[int]) -> str:
        return self.range_dir if rank is None else f"{self.range_dir}/rank-{rank}"

    def location(self, path: str) -> str:
        return f"{self.storage.root}/{path}"

    def below_root(self, path: str) -> str:
        """``path`` (in this cache's key directory) relative to the cache root."""
        return f"{os.path.basename(self.storage.root)}/{path}"

    # -- writing -----------------------------------------------------------------------------
    def begin(self, snap: Snapshot) -> "CacheWrite":
        """Start writing the local copy of ``snap``'s data file (a thread); commit it with
        :meth:`CacheWrite.commit` after the remote commit, or :meth:`CacheWrite.abort`."""
        return CacheWrite(self, snap)  # (the snapshot was laid out when it was made)

    def committed(self, rank: Optional[int] = None) -> List[Tuple[Tuple[int, int], str]]:
        """(position, name) of the committed copies in ``rank``'s directory, oldest first."""
        d = self.own_dir(rank)
        out = []
        for e in self.storage.listdir(d):
            pos = _position(e.name)
            if pos is not None and e.is_dir and self.storage.kind(f"{d}/{e.name}/{MANIFEST_NAME}") == "file":
                out.append((pos, e.name))
        return sorted(out)

    def _remove_leftovers(self) -> None:
        for e in self.storage.listdir(self.dir):
            if _TMP_RE.fullmatch(e.name) or (_position(e.name) is not None and e.is_dir and
                                             self.storage.kind(f"{self.dir}/{e.name}/{MANIFEST_NAME}") == "missing"):
                self.storage.delete_dir(f"{self.dir}/{e.name}")

    def _delete(self, name: str) -> None:
        # the manifest first: a half-deleted copy is never taken for a committed one
        self.storage.delete_file(f"{self.dir}/{name}/{MANIFEST_NAME}")
        self.storage.delete_dir(f"{self.dir}/{name}")

    def _make_room(self, size: int) -> Optional[str]:
        """None when ``size`` bytes fit with headroom (older copies are deleted if that makes
        them fit: a new copy supersedes them); otherwise why not."""
        root = self.storage.root

        def free() -> int:
            return shutil.disk_usage(root).free

        need = size + _HEADROOM
        if free() >= need:
            return None
        for _pos, name in self.committed(self.rank):
            self._delete(name)
            logger.debug("local cache: deleted %s/%s to make room", self.dir, name)
        have = free()
        if have >= need:
            return None
        return f"{have} bytes free on the disk of {root}, a copy needs {size} (+{_HEADROOM >> 20} MiB kept free)"

    def _retain(self, name: str) -> None:
        """After committing ``name``: keep it and the newest ``keep - 1`` older copies; copies at a later position
        are of another history and go (:func:`~paddle_acp.format.commit.retention.preserve`)."""
        new = _position(name)
        if new is None:
            return
        copies = self.committed(self.rank)[::-1]
        restart = next((c for c in copies if c[1] == name), None)
        for _pos, other in to_delete(copies, preserve(copies, self.cache.keep, stale=lambda c: c[0] > new,
                                                      restart=restart)):
            self._delete(other)
            logger.debug("local cache: retention deleted %s/%s", self.dir, other)

    def _report(self, what: str) -> None:
        if not self._failing:
            logger.warning("local cache %s: %s; the checkpoint is on %s all the same, and restarts read it from there "
                           "(further failures in a row are not logged)", self.cache.directory, what,
                           self.cache.remote_uri)
        self._failing = True

    # -- reading ------------------------------------------------------------------------------
    def load(self, name: str, number: int, raw: bytes, src_rank: Optional[int] = None,
             memory_budget: Optional[int] = None, landing: Optional[Landing] = None) -> Optional[LoadedCheckpoint]:
        """Checkpoint ``name`` (manifest ``number``) from its local copy, or None: the caller reads the remote.
        ``raw``: the remote's committed manifest bytes, just read; ``src_rank``: whose part (looked for in that
        rank's directory); ``memory_budget``, ``landing``: as for :func:`reader.load`. Logs one line saying why."""
        d = self.own_dir(src_rank)
        base = f"{d}/{name}"
        what = f"checkpoint {name}" + ("" if src_rank is None else f" (part of rank {src_rank})")
        where = f"{self.cache.remote_uri}/{self.range_dir}"

        def remote(why: str, level: int = logging.INFO) -> None:
            logger.log(level, "restoring %s of %s from the remote, not the local cache: %s", what, where, why)

        try:
            kind, size = self.storage.stat(f"{base}/{MANIFEST_NAME}")
            if kind != "file" or self.storage.kind(base) != "dir":
                newest = self.committed(src_rank)
                held = f"it holds {newest[-1][1]}" if newest else "it holds no copy of this range"
                remote(f"no local copy of it in {self.location(d)} ({held}: the remote moved on, e.g. another "
                       "writer, or this copy was never committed)")
                return None
            why = untrusted(self.cache.directory, self.below_root(base), (MANIFEST_NAME, DATA_NAME))
            if why is not None:
                remote(f"the local copy in {self.location(base)} could have been written by another user ({why}); "
                       "checksums catch damage, not edits, so only copies that this user alone can write are used: "
                       "make the cache directory and everything in it owned by this user and not writable by "
                       "group or others (chmod -R go-w)", logging.WARNING)
                return None
            cached = self.storage.read_bytes(f"{base}/{MANIFEST_NAME}", limit=len(raw)) if size == len(raw) else b""
            if cached != raw:
                remote(f"the local copy in {self.location(base)} is not the remote's committed checkpoint (its manifest "
                       "differs: another writer or another run wrote this name)")
                return None
            loaded = reader.load(self.storage, base, number, self.range_name, raw, memory_budget, landing)
        except CorruptCheckpointError as exc:
            remote(f"the local copy failed verification ({exc}); it is removed", logging.WARNING)
            if src_rank == self.rank:
                try:
                    self._delete(name)
                except StorageError as err:
                    logger.debug("could not remove %s: %s", base, err)
            return None
        except (StorageError, OSError) as exc:
            remote(f"the local copy cannot be read ({exc})", logging.WARNING)
            return None
        logger.info("restoring %s of %s from the local cache %s: its manifest is the remote's committed manifest, "
                    "byte for byte, and every checksum verified", what, where, self.location(base))
        loaded.source = "cache"
        return loaded


class CacheWrite:
    """One checkpoint's local copy being written (its data file, on a thread of its own)."""

    def __init__(self, rc: RangeCache, snap: Snapshot):
        self._rc = rc
        self._tmp: Optional[str] = None
        self._out = _Outcome()
        self._thread = threading.Thread(target=self._run, args=(snap,), name="paddle-acp-cache", daemon=True)
        self._thread.start()

    def _run(self, snap: Snapshot) -> None:
        rc, st = self._rc, self._rc.storage
        try:
            size = int(snap.data_size)
            rc._remove_leftovers()
            why = rc._make_room(size)
            if why is not None:
                self._out.skipped = why
                return
            tmp = f"{rc.dir}/ckpt.tmp-{uuid.uuid4().hex[:12]}"
            st.makedirs(tmp)
            self._tmp = tmp
            path = f"{tmp}/{DATA_NAME}"
            if snap.image is not None:
                written = st.write_image(path, snap.image, size)
            else:
                written = st.write_buffers(path, snap.buffers())
            if written != size:
                raise StorageError(f"short write of {path}: {written} of {size} bytes")
        except BaseException as exc:  # reported by commit (the remote save is what matters)
            self._out.error = exc

    def commit(self, name: str, manifest: bytes) -> bool:
        """The remote committed checkpoint ``name`` with ``manifest``: commit the copy. Never
        raises for a failed copy (one warning per streak); True when committed."""
        self._thread.join()
        rc, st = self._rc, self._rc.storage
        if self._out.skipped is not None:
            rc._report(f"no local copy of {name}: {self._out.skipped}")
            self.abort()
            return False
        try:
            if self._out.error is not None:
                raise self._out.error
            assert self._tmp is not None
            st.write_bytes(f"{self._tmp}/{MANIFEST_NAME}", manifest)
            # writable by this user only, whatever the umask: restore uses no copy others could have written
            harden(rc.cache.directory, rc.below_root(self._tmp), (MANIFEST_NAME, DATA_NAME))
            st.sync_dir(self._tmp)
            final = f"{rc.dir}/{name}"
            if st.kind(final) != "missing":  # an older copy of the same name (another history)
                rc._delete(name)
            st.rename(self._tmp, final)
            self._tmp = None
            rc._failing = False
            rc._retain(name)
        except Exception as exc:
            rc._report(f"writing the local copy of {name} failed ({exc})")
            self.abort()
            return False
        logger.debug("local cache: committed %s/%s", rc.dir, name)
        return True

    def abort(self) -> None:
        """The remote commit did not happen: remove what was written."""
        self._thread.join()
        if self._tmp is not None:
            try:
                self._rc.storage.delete_dir(self._tmp)
            except StorageError as exc:  # removed before the next copy
                logger.debug("could not remove %s: %s", self._tmp, exc)
            self._tmp = None

