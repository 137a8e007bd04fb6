"""HDFS through the ``hadoop fs`` command line, as Paddle's ``HDFSClient`` used it.

The last-resort HDFS client (no libhdfs/JVM in-process, no ``hdfs-native``), a pyarrow filesystem handler: every
operation runs ``$HADOOP_HOME/bin/hadoop fs``; writes are staged in a local file (under ``PADDLE_EDL_FS_CACHE``)
uploaded by ``-put -f`` on close (``-put`` writes ``NAME._COPYING_`` and renames it: never a torn file), reads ``-get``
a local copy, metadata is from ``-stat`` / ``-ls``. Each command starts a JVM (1-2 s): paths are batched where possible,
and metadata is cached (:mod:`.hadoop_cli_cache`: other processes' changes may go unseen for ``metadata_ttl`` s).

Command-line limits: listed mtimes are to the minute; glob characters ``* ? [ ] { } \\`` in paths are refused; writing
onto a directory is refused only where known; ``move`` onto a directory moves into it (like HDFS rename). The user goes
as ``HADOOP_USER_NAME``, a PaddleCloud UGI ``user,password`` in a ``-conf`` file of mode 0600 (never on the command
line, never shown in errors)."""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import shutil
import time
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

import pyarrow as pa
from pyarrow.fs import FileInfo, FileSelector, FileSystemHandler, FileType

from paddle_acp.storage.fsshell import META_TIMEOUT, FsShell, data_timeout
from paddle_acp.storage.hadoop_cli_cache import FileInfoT, MetadataCache, _parent, as_path, parse_ls
from paddle_acp.storage.hadoop_cli_io import StagedOutput, staging_dir

logger = logging.getLogger("paddle_acp")

GLOB_CHARS = set("*?[]{}\\")
_MAX_PREFETCH_DIRS = 100


class HadoopCliHandler(FileSystemHandler, MetadataCache):  # type: ignore[misc]  # pyarrow is untyped
    """A ``pyarrow.fs.FileSystemHandler`` running ``hadoop fs`` commands (see the module doc)."""

    def __init__(self, hadoop_home: Optional[str], default_fs: str, user: Optional[str] = None,
                 cache_dir: Optional[str] = None, ugi: Optional[str] = None, metadata_ttl: float = 10.0,
                 extra_conf: Optional[Dict[str, str]] = None):
        self.shell = FsShell(hadoop_home, default_fs, user, ugi, extra_conf)
        self.hadoop_home, self.default_fs, self.user = self.shell.hadoop_home, self.shell.default_fs, self.shell.user
        self.cache_dir = os.path.abspath(os.path.expanduser(cache_dir or ".cache"))
        MetadataCache.__init__(self, metadata_ttl)

    @property
    def commands_run(self) -> int:
        """``hadoop fs`` commands run so far (ci/bench/storage_backends.py counts a save's and a restore's)."""
        return self.shell.commands_run

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HadoopCliHandler):
            return (self.hadoop_home, self.default_fs, self.user) == (other.hadoop_home, other.default_fs, other.user)
        return NotImplemented

    def __repr__(self) -> str:
        return f"HadoopCliHandler({self.hadoop_home!r}, {self.default_fs!r}, user={self.user!r})"

    # -- paths ------------------------------------------------------------------
    def _path(self, path: str) -> str:
        p = self.normalize_path(path)
        if not p.startswith("/"):
            p = "/" + p
        if len(p) > 1:
            p = p.rstrip("/")
        bad = sorted(GLOB_CHARS & set(p))
        if bad:
            raise ValueError(
                f"{p!r}: the hadoop command line treats {' '.join(bad)} as glob characters; "
                "use a path without them (or the pyarrow / hdfs-native HDFS client)"
            )
        return p

    # -- metadata cache (see MetadataCache) ---------------------------------------
    def forget(self, path: str) -> None:
        """Drop what the metadata cache holds at and under ``path`` (state other processes change)."""
        self._invalidate(self._path(path))

    def _known(self, p: str) -> Optional[FileInfo]:
        """What the cache knows of ``p``; FileNotFoundError where it knows ``p`` is missing."""
        known = self._cached_info(p)
        if known is not None and known.type == FileType.NotFound:
            raise FileNotFoundError(errno.ENOENT, f"{self.default_fs}{p}: No such file or directory")
        return known

    # -- FileSystemHandler: metadata -----------------------------------------------
    def get_type_name(self) -> str:
        return "hadoop-cli"

    def normalize_path(self, path: str) -> str:
        p = urlparse(path)
        if p.scheme in ("hdfs", "viewfs"):
            if p.netloc and f"{p.scheme}://{p.netloc}" != self.default_fs:
                raise ValueError(f"{path!r} is not on {self.default_fs}")
            return p.path or "/"
        return path

    def equals(self, other: object) -> bool:
        return isinstance(other, HadoopCliHandler) and self == other

    def get_file_info(self, paths: List[str]) -> List[FileInfoT]:
        norm = [self._path(p) for p in paths]
        result: Dict[str, FileInfo] = {}
        todo = []
        for p in norm:
            hit = self._cached_info(p)
            if hit is None:
                hit = self._prefetch_for(p)
            if hit is not None:
                result[p] = hit
            elif p not in todo:
                todo.append(p)
        if todo:
            result.update(self._stat(todo))
        return [as_path(result[p], orig) for p, orig in zip(norm, paths)]

    def _prefetch_for(self, path: str) -> Optional[FileInfo]:
        """``path`` is in a child directory of a freshly listed one ("list, then look inside each entry"):
        list all those children with one ``-ls GRANDPARENT/*`` and answer from that."""
        if path == "/":
            return None
        parent = _parent(path)
        if parent == "/":
            return None
        grand = _parent(parent)
        listing = self._cached_listing(grand)
        if listing is None:
            return None
        dirs = [n for n, i in listing.items() if i.type == FileType.Directory]
        if posixpath.basename(parent) not in dirs or len(dirs) > _MAX_PREFETCH_DIRS:
            return None
        glob = (grand.rstrip("/") or "") + "/*"
        token = self._token()
        r = self.shell.exec(["-ls", glob], META_TIMEOUT)
        if r.returncode != 0:
            return None  # changed meanwhile, or a transient error: stat instead
        children: Dict[str, Dict[str, FileInfo]] = {posixpath.join(grand, n): {} for n in dirs}
        for info in parse_ls(r.stdout):
            d = _parent(info.path)
            if d in children:
                children[d][posixpath.basename(info.path)] = info
        for d, entries in children.items():
            self._store_listing(d, entries, token)
        return self._cached_info(path)

    def _stat(self, paths: List[str]) -> Dict[str, FileInfo]:
        """One ``-stat`` for all ``paths`` (missing ones are reported on stderr, in order)."""
        token = self._token()
        r = self.shell.exec(["-stat", "%F\t%b\t%Y\t%n", *paths], META_TIMEOUT)
        stderr = r.stderr.decode("utf-8", "replace")
        missing = set()
        for line in stderr.splitlines():
            if "No such file or directory" in line and "`" in line:
                missing.add(line.split("`", 1)[1].rsplit("'", 1)[0])
        lines = [ln for ln in r.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
        found = [p for p in paths if p not in missing]
        # (not a missing path: the command failed; or one path whose output does not match)
        if (r.returncode != 0 and not missing) or (len(lines) != len(found) and len(paths) == 1):
            raise self.shell.error(r, ["-stat", "%F %b %Y %n", *paths], "checking", paths)
        if len(lines) != len(found):
            out: Dict[str, FileInfo] = {}
            for p in paths:  # could not match the output to the paths: one at a time
                out.update(self._stat([p]))
            return out
        now = time.monotonic()
        out = {p: FileInfo(p, FileType.NotFound) for p in missing}
        for p, line in zip(found, lines):
            kind, size, mtime_ms, _name = (line.split("\t", 3) + ["", "", "", ""])[:4]
            mtime_ns = int(mtime_ms) * 1_000_000 if mtime_ms.strip().isdigit() else None
            ftype = {"directory": FileType.Directory, "regular file": FileType.File}.get(kind, FileType.Unknown)
            out[p] = FileInfo(p, ftype, size=int(size) if ftype == FileType.File else None, mtime_ns=mtime_ns)
        if self.metadata_ttl > 0:
            with self._lock:
                if self._unchanged_since(token):  # else stale: a change of this handler raced the command
                    for p, info in out.items():
                        self._infos[p] = (now, info)
        return out

    def get_file_info_selector(self, selector: Any) -> List[FileInfoT]:
        base = self._path(selector.base_dir)
        if not selector.recursive:
            cached = self._cached_listing(base)
            if cached is not None:
                return list(cached.values())
        try:
            self._known(base)
        except FileNotFoundError:
            if selector.allow_not_found:
                return []
            raise
        args = ["-ls", "-R", base] if selector.recursive else ["-ls", base]
        token = self._token()
        r = self.shell.exec(args, META_TIMEOUT)
        if r.returncode != 0:
            err = self.shell.error(r, args, "listing", [base])
            if isinstance(err, FileNotFoundError):
                self._note(base, FileInfo(base, FileType.NotFound), token)  # unless it was made meanwhile
                if selector.allow_not_found:
                    return []
            raise err
        infos = parse_ls(r.stdout)
        if len(infos) == 1 and infos[0].path == base and infos[0].type != FileType.Directory:
            raise NotADirectoryError(errno.ENOTDIR, f"{self.default_fs}{base} is not a directory")
        if not selector.recursive:
            infos = [i for i in infos if _parent(i.path) == base]
            self._store_listing(base, {i.base_name: i for i in infos}, token)
        return infos

    # -- FileSystemHandler: changes ------------------------------------------------
    def create_dir(self, path: str, recursive: bool) -> None:
        p = self._path(path)
        if recursive:
            self.shell.run(["-mkdir", "-p", p], "creating directory", [p])
        else:
            r = self.shell.exec(["-mkdir", p], META_TIMEOUT)
            if r.returncode != 0:
                err = self.shell.error(r, ["-mkdir", p], "creating directory", [p])
                if not isinstance(err, FileExistsError) or self._stat([p])[p].type != FileType.Directory:
                    raise err
        self._note(p, FileInfo(p, FileType.Directory))

    def _rm(self, path: str, args: List[str], what: str) -> None:
        p = self._path(path)
        self._known(p)
        try:
            self.shell.run([*args, p], what, [p])
        except BaseException:
            self._invalidate(p)
            raise
        self._note(p, FileInfo(p, FileType.NotFound))

    def delete_dir(self, path: str) -> None:
        if self._path(path) == "/":
            raise ValueError("refusing to delete the root directory")
        self._rm(path, ["-rm", "-r", "-skipTrash"], "deleting directory")

    def _delete_contents(self, p: str, missing_dir_ok: bool) -> None:
        try:
            children = self.get_file_info_selector(FileSelector(p, allow_not_found=False))
        except FileNotFoundError:
            if missing_dir_ok:
                return
            raise
        if children:
            paths = [self._path(c.path) for c in children]
            try:
                self.shell.run(["-rm", "-r", "-skipTrash", *paths], "deleting the contents of", [p])
            except BaseException:
                self._invalidate(p)
                raise
            for c in paths:
                self._note(c, FileInfo(c, FileType.NotFound))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        p = self._path(path)
        if p == "/":
            raise ValueError("delete_dir_contents called on the root directory; use delete_root_dir_contents")
        self._delete_contents(p, missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self._delete_contents("/", False)

    def delete_file(self, path: str) -> None:
        self._rm(path, ["-rm", "-skipTrash"], "deleting file")

    def move(self, src: str, dest: str) -> None:
        s, d = self._path(src), self._path(dest)
        # like pyarrow's libhdfs move: an existing destination file is replaced, a directory receives the source
        before_src, before_dst = self._cached_info(s), self._cached_info(d)
        try:
            r = self.shell.exec(["-mv", s, d], META_TIMEOUT)
            if r.returncode != 0:
                err = self.shell.error(r, ["-mv", s, d], f"renaming {self.default_fs}{s} to", [d])
                if not isinstance(err, FileExistsError):
                    raise err
                infos = self._stat([s, d])
                if infos[s].type != FileType.File or infos[d].type != FileType.File:
                    raise err
                self.shell.run(["-rm", "-skipTrash", d], "replacing", [d])
                self.shell.run(["-mv", s, d], f"renaming {self.default_fs}{s} to", [d])
                before_dst = FileInfo(d, FileType.NotFound)
        except BaseException:
            self._invalidate(s, d)
            raise
        if before_src is not None and before_dst is not None and before_dst.type == FileType.NotFound:
            self._note(d, as_path(before_src, d))
            self._move_cached(s, d)
            self._note(s, FileInfo(s, FileType.NotFound))
        else:
            self._note(s, FileInfo(s, FileType.NotFound))
            self._invalidate(d)

    def copy_file(self, src: str, dest: str) -> None:
        s, d = self._path(src), self._path(dest)
        try:
            self.shell.run(["-cp", "-f", s, d], f"copying {self.default_fs}{s} to", [d])
        finally:
            self._invalidate(d)

    # -- FileSystemHandler: data ------------------------------------------------------
    def _download(self, path: str) -> Any:
        p = self._path(path)
        d = staging_dir(self.cache_dir)
        local = os.path.join(d, "data")
        try:
            info = self._known(p)
            size = info.size if info is not None and info.size else 0
            self.shell.run(["-get", p, local], "downloading", [p], timeout=data_timeout(size))
            if os.path.isdir(local):
                raise IsADirectoryError(errno.EISDIR, f"{self.default_fs}{p} is a directory")
            f = pa.OSFile(local, "r")
        finally:
            shutil.rmtree(d, ignore_errors=True)  # the open file stays readable
        return f

    open_input_file = _download
    open_input_stream = _download

    def _staged(self, path: str, append: bool) -> Any:
        p = self._path(path)
        # `-put SRC DIR` would store the file *inside* an existing directory: refused where known (a check costs a JVM)
        known = self._cached_info(p)
        if known is not None and known.type == FileType.Directory:
            raise IsADirectoryError(errno.EISDIR, f"{self.default_fs}{p} is a directory")
        return pa.PythonFile(StagedOutput(staging_dir(self.cache_dir),
                                          lambda local, size: self._upload(local, p, size, append)), mode="w")

    def open_output_stream(self, path: str, metadata: Any = None) -> Any:
        return self._staged(path, False)

    def open_append_stream(self, path: str, metadata: Any = None) -> Any:
        return self._staged(path, True)

    def _upload(self, local: str, path: str, size: int, append: bool) -> None:
        """Store a staged stream's local file at ``path`` (``-put -f`` or ``-appendToFile``), noting the result."""
        cmd, what = (["-appendToFile"], "appending to") if append else (["-put", "-f"], "uploading to")
        try:
            self.shell.run([*cmd, local, path], what=what, paths=[path], timeout=data_timeout(size))
        except BaseException:
            self._invalidate(path)
            raise
        if append:
            old = self._cached_info(path)
            if old is not None and old.type == FileType.File and old.size is not None:
                self._note(path, FileInfo(path, FileType.File, size=old.size + size))
            else:
                self._invalidate(path)
        else:
            self._note(path, FileInfo(path, FileType.File, size=size))
