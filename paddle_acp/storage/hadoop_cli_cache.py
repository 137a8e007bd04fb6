"""The metadata cache of the ``hadoop fs`` client (:mod:`paddle_acp.storage.hadoop_cli`).

Each command starts a JVM (1-2 s), so listings and ``stat`` results are kept ``metadata_ttl`` seconds ("list a
directory, then look at each child" costs one or two commands). The handler's own changes update the cache at
once (:meth:`MetadataCache._note`); a failed command drops what it may have changed (``_invalidate``)."""

from __future__ import annotations

import posixpath
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from pyarrow.fs import FileInfo, FileType

FileInfoT = Any  # pyarrow.fs.FileInfo (pyarrow has no type information)


def _parent(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) or "/"


def _is_under(path: str, top: str) -> bool:
    return path == top or top == "/" or path.startswith(top.rstrip("/") + "/")


def parse_ls(stdout: bytes) -> List[FileInfoT]:
    """Lines of ``hadoop fs -ls``: ``perm repl owner group size date time path``."""
    out = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        if not line or line.startswith("Found ") or line[0] not in "d-l":
            continue
        parts = line.split(None, 7)
        if len(parts) < 8:
            continue
        perm, _repl, _owner, _group, size, day, hm, path = parts
        try:
            mtime = time.mktime(time.strptime(f"{day} {hm}", "%Y-%m-%d %H:%M"))
            mtime_ns = int(mtime) * 1_000_000_000
        except (ValueError, OverflowError):
            mtime_ns = None
        is_dir = perm.startswith("d")
        out.append(FileInfo(path, FileType.Directory if is_dir else FileType.File,
                            size=None if is_dir else int(size), mtime_ns=mtime_ns))
    return out


def as_path(info: FileInfoT, path: str) -> FileInfoT:
    """``info`` about ``path`` (the same entry named as the caller named it)."""
    return info if info.path == path else FileInfo(path, info.type, size=info.size, mtime_ns=info.mtime_ns)


class MetadataCache:
    """Listings and file infos of the last ``metadata_ttl`` seconds (0: no cache), thread-safe."""

    def __init__(self, metadata_ttl: float):
        self.metadata_ttl = float(metadata_ttl)
        self._lock = threading.Lock()
        # dir -> (time, {name: FileInfo}): complete listings; path -> (time, FileInfo)
        self._listings: Dict[str, Tuple[float, Dict[str, FileInfoT]]] = {}
        self._infos: Dict[str, Tuple[float, FileInfoT]] = {}
        # changes this handler made: what a command read is stored only when none happened while it ran (a
        # listing begun before another thread's mkdir returned would replace what that mkdir recorded)
        self._changes = 0

    def __getstate__(self) -> Dict[str, Any]:  # pickled (a handler sent to a process) without the lock and cache
        d = dict(self.__dict__)
        d.pop("_lock", None)
        d["_listings"], d["_infos"] = {}, {}
        return d

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()

    def _token(self) -> int:
        """Taken before a command that reads metadata: :meth:`_unchanged_since` says whether to store it."""
        with self._lock:
            return self._changes

    def _unchanged_since(self, token: int) -> bool:
        """For callers holding the lock."""
        return self._changes == token

    def _fresh(self, t: float) -> bool:
        return self.metadata_ttl > 0 and time.monotonic() - t <= self.metadata_ttl

    def _store_listing(self, d: str, entries: Dict[str, FileInfoT], token: int) -> None:
        """Cache what a command begun at ``token`` (:meth:`_token`) listed, if this handler changed nothing since."""
        if self.metadata_ttl <= 0:
            return
        with self._lock:
            if self._unchanged_since(token):
                self._listings[d] = (time.monotonic(), entries)

    def _cached_listing(self, d: str) -> Optional[Dict[str, FileInfoT]]:
        with self._lock:
            hit = self._listings.get(d)
        if hit is not None and self._fresh(hit[0]):
            return hit[1]
        return None

    def _known_locked(self, path: str) -> Optional[FileInfoT]:
        """_cached_info for callers holding the lock."""
        hit = self._infos.get(path)
        if hit is not None and self._fresh(hit[0]):
            return hit[1]
        if path != "/":
            lst = self._listings.get(_parent(path))
            if lst is not None and self._fresh(lst[0]):
                return lst[1].get(posixpath.basename(path)) or FileInfo(path, FileType.NotFound)
        return None

    def _cached_info(self, path: str) -> Optional[FileInfoT]:
        with self._lock:
            return self._known_locked(path)

    def _invalidate(self, *paths: str) -> None:
        """Forget what a change at ``paths`` (whose outcome is unknown) may have changed: the paths, what is
        under them, and their ancestors (``mkdir -p`` creates parents)."""
        with self._lock:
            self._changes += 1
            for p in paths:
                for cache in (self._listings, self._infos):
                    for k in [k for k in cache if _is_under(k, p) or _is_under(p, k)]:
                        del cache[k]

    def _move_cached(self, src: str, dst: str) -> None:
        """After renaming ``src`` to ``dst`` (which did not exist): what was known under ``src`` is under ``dst``."""
        if self.metadata_ttl <= 0:
            return
        with self._lock:
            self._changes += 1
            moved = []
            for cache in (self._listings, self._infos):
                for k in [k for k in cache if _is_under(k, src)]:
                    t, v = cache.pop(k)
                    nk = dst + k[len(src):]
                    if cache is self._listings:
                        v = {n: as_path(i, posixpath.join(nk, n)) for n, i in v.items()}
                    else:
                        v = as_path(v, nk)
                    moved.append((cache, nk, (t, v)))
            for cache, nk, tv in moved:
                cache[nk] = tv

    def _note(self, path: str, info: FileInfoT, token: Optional[int] = None) -> None:
        """Record a fact this handler just caused (a file written, a directory made, a path removed): ``path``
        and what is under it are replaced, the parent's cached listing updated. With ``token`` (:meth:`_token`):
        a fact a command begun then observed, recorded only if this handler changed nothing since."""
        if self.metadata_ttl <= 0:
            return
        now = time.monotonic()
        with self._lock:
            if token is not None and not self._unchanged_since(token):
                return
            self._changes += 1
            for cache in (self._listings, self._infos):
                for k in [k for k in cache if _is_under(k, path) and k != path]:
                    del cache[k]
            self._listings.pop(path, None)
            old = self._known_locked(path)
            if info.type == FileType.Directory and old is not None:
                if old.type == FileType.Directory:
                    info = old  # keep what is known (mtime)
                elif old.type == FileType.NotFound:
                    self._listings[path] = (now, {})  # created just now: empty
            self._infos[path] = (now, info)
            if path == "/":
                return
            parent = _parent(path)
            hit = self._listings.get(parent)
            if hit is not None:
                entries = dict(hit[1])
                name = posixpath.basename(path)
                if info.type == FileType.NotFound:
                    entries.pop(name, None)
                elif not (info.type == FileType.Directory and name in entries
                          and entries[name].type == FileType.Directory):
                    entries[name] = info
                self._listings[parent] = (hit[0], entries)
            if info.type == FileType.NotFound:
                return
            # the parent exists (as a directory) now, and so does every ancestor
            a, child = parent, path
            while True:
                old = self._known_locked(a)
                if old is None or old.type != FileType.Directory:
                    self._infos[a] = (now, FileInfo(a, FileType.Directory))
                    if old is not None and old.type == FileType.NotFound:  # created just now
                        self._listings[a] = (now, {posixpath.basename(child): info if child == path else FileInfo(child, FileType.Directory)})
                if a == "/":
                    break
                gp = _parent(a)
                hit = self._listings.get(gp)
                name = posixpath.basename(a)
                if hit is not None and (name not in hit[1] or hit[1][name].type != FileType.Directory):
                    entries = dict(hit[1])
                    entries[name] = FileInfo(a, FileType.Directory)
                    self._listings[gp] = (hit[0], entries)
                a, child = gp, a
