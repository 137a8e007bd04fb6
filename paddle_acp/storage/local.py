"""Local disks (``file://`` URIs and plain paths).

A ``file://`` URI is read as RFC 8089 says (``file:///abs/path``, ``file://localhost/abs/path``, its path
percent-decoded); another host, user info, a query or fragment, or a ``%00`` is a ConfigError. A plain path is taken
literally. pyarrow's ``LocalFileSystem`` does the rest, except where the OS does better or safer: page-aligned images
bypass the page cache (``O_DIRECT``, buffered where refused); written files and renamed-into directories are
``fsync``-ed; whole-file reads (``read_bytes``), listings and ``stat`` never follow a symbolic link (``O_NOFOLLOW``,
``lstat``), nor do deletes; exclusive creation is ``O_EXCL``. Every read opens without blocking (``O_NONBLOCK``) and
reads only a regular file: a named pipe or device where a file should be is a StorageError, never a hang."""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import stat
from typing import Any, List, Optional, Tuple
from urllib.parse import ParseResult, unquote_to_bytes

import pyarrow.fs as pafs

from paddle_acp.errors import ConfigError, StorageError
from paddle_acp.storage.arrow import ArrowStorage
from paddle_acp.storage.base import Entry, kind_of, read_pieces, redact

logger = logging.getLogger("paddle_acp")

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_PAGE = 4096


def sync_to(fd: int, size: int) -> None:
    """Make the file open at ``fd`` ``size`` bytes long (``O_DIRECT`` wrote whole pages) and durable."""
    os.ftruncate(fd, size)
    os.fsync(fd)


def open_regular(full: str, shown: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of the regular file ``full`` (``shown``: its name in errors), opened with ``flags`` (read-only)
    without following a link and without blocking (a FIFO's open waits for its other end), refused (StorageError)
    unless a regular file, then made blocking again. FileNotFoundError when missing, OSError when it cannot be opened."""
    fd = os.open(full, flags | _NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KIND_NAMES.get(stat.S_IFMT(mode), "special file")
            raise StorageError(f"refusing to read {shown}: it is a {kind}, not a regular file (paddle-acp writes "
                               "only regular files; remove it)")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return fd
    except BaseException:
        os.close(fd)
        raise


_KIND_NAMES = {stat.S_IFIFO: "named pipe", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
               stat.S_IFSOCK: "socket", stat.S_IFDIR: "directory"}


class LocalInput(io.BufferedReader):
    """A random-access reader of a local file (what :meth:`LocalStorage.open_input` returns)."""

    def size(self) -> int:
        return os.fstat(self.fileno()).st_size

    def read_at(self, nbytes: int, offset: int) -> bytes:
        """``nbytes`` bytes from ``offset`` (fewer at the end), the position unchanged (pyarrow's ``read_at``)."""
        pieces, got = [], 0
        while got < nbytes:
            piece = os.pread(self.fileno(), nbytes - got, offset + got)
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces)


def file_uri_path(uri: str, parsed: ParseResult) -> str:
    """The absolute local path a ``file:`` URI names (RFC 8089): percent-decoded, on this host."""
    shown = redact(uri)
    if parsed.netloc.lower() not in ("", "localhost"):
        what = "user info (credentials)" if "@" in parsed.netloc else f"the host {parsed.netloc!r}"
        raise ConfigError(f"checkpoint URI {shown!r}: a file:// URI names a path on this machine and must not "
                          f"name {what}; use file:///path, file://localhost/path or a plain path")
    if parsed.query or parsed.fragment or "?" in uri or "#" in uri:
        raise ConfigError(f"checkpoint URI {shown!r}: a file:// URI has no query or fragment; write a '?' or "
                          "'#' of the path as %3F or %23, or give a plain path (taken literally)")
    path = os.fsdecode(unquote_to_bytes(parsed.path))
    if "\0" in path:
        raise ConfigError(f"checkpoint URI {shown!r}: the path holds a NUL byte (%00)")
    if not path.startswith("/"):
        raise ConfigError(f"checkpoint URI {shown!r}: a file: URI names an absolute path (file:///abs/path); "
                          "give a relative path without the scheme")
    return os.path.abspath(path)


class LocalStorage(ArrowStorage):
    """A directory tree on a local disk."""

    direct_io = hasattr(os, "O_DIRECT")
    has_symlinks = True

    def __init__(self, root: str, uri: str):
        super().__init__(pafs.LocalFileSystem(), root, uri)

    @classmethod
    def from_uri(cls, uri: str, parsed: ParseResult, options: object = None) -> "LocalStorage":
        if parsed.scheme.lower() != "file":
            return cls(os.path.abspath(os.path.expanduser(uri)), uri)
        return cls(file_uri_path(uri, parsed), uri)

    def local_path(self, path: str) -> Optional[str]:
        return self.full(path)

    def write_image(self, path: str, image: Any, size: int) -> int:
        """``O_DIRECT`` (no page-cache copy), buffered where the filesystem refuses it."""
        mv = memoryview(image).cast("B")
        if self.direct_io:
            try:
                return self._write_direct(path, mv, size)
            except OSError as exc:
                logger.debug("O_DIRECT write of %s failed (%s); using buffered writes", path, exc)
        return self.write_buffers(path, [mv[:size]])

    def _write_direct(self, path: str, mv: memoryview, size: int) -> int:
        padded = min(len(mv), (size + _PAGE - 1) // _PAGE * _PAGE)
        fd = os.open(self.full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            pos, chunk = 0, 64 << 20
            while pos < padded:
                n = os.write(fd, mv[pos:min(pos + chunk, padded)])
                if n <= 0:
                    raise OSError("O_DIRECT write made no progress")
                pos += n
            sync_to(fd, size)
        finally:
            os.close(fd)
        return size

    def create_exclusive(self, path: str, data: bytes) -> bool:
        try:
            fd = os.open(self.full(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        except OSError as exc:
            raise self.wrap("creating", path, exc) from exc
        try:
            os.write(fd, data)
            os.fsync(fd)
        except OSError as exc:
            raise self.wrap("writing", path, exc) from exc
        finally:
            os.close(fd)
        self.sync_dir(path.rsplit("/", 1)[0])
        return True

    def _open_regular(self, path: str, flags: int = os.O_RDONLY, what: str = "opening for read") -> int:
        """:func:`open_regular` of ``path``; its OSError wrapped (``what``), FileNotFoundError when reading."""
        try:
            return open_regular(self.full(path), f"{self.uri}/{path}", flags)
        except StorageError:
            raise  # not a regular file
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) and not flags & os.O_CREAT:
                raise FileNotFoundError(f"{self.uri}/{path}") from None
            raise self.wrap(what, path, exc) from exc

    def open_output(self, path: str) -> Any:
        """Never blocks on (nor writes into) a named pipe or device found at ``path``."""
        fd = self._open_regular(path, os.O_WRONLY | os.O_CREAT, "opening for write")
        try:
            os.ftruncate(fd, 0)
        except OSError as exc:
            os.close(fd)
            raise self.wrap("opening for write", path, exc) from exc
        return io.BufferedWriter(io.FileIO(fd, "wb", closefd=True))

    def append_bytes(self, path: str, data: bytes) -> None:
        fd = self._open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "appending to")
        try:
            with io.FileIO(fd, "wb", closefd=True) as f:
                view = memoryview(data).cast("B")
                while view:
                    view = view[f.write(view) or 0:]
        except OSError as exc:
            raise self.wrap("appending to", path, exc) from exc

    def open_input(self, path: str) -> Any:
        return LocalInput(io.FileIO(self._open_regular(path), "rb", closefd=True))

    def read_bytes(self, path: str, limit: Optional[int] = None) -> bytes:
        fd = self._open_regular(path)
        try:
            with os.fdopen(fd, "rb", closefd=True) as f:
                return read_pieces(f, None if limit is None else limit + 1)
        except OSError as exc:
            raise self.wrap("reading", path, exc) from exc

    def stat(self, path: str) -> Tuple[str, int]:
        try:
            st = os.lstat(self.full(path))
        except (FileNotFoundError, NotADirectoryError):
            return "missing", 0
        except OSError as exc:
            raise self.wrap("checking", path, exc) from exc
        kind = kind_of(st.st_mode)
        return kind, st.st_size if kind == "file" else 0

    def listdir(self, path: str) -> List[Entry]:
        out = []
        try:
            with os.scandir(self.full(path)) as it:
                for de in it:
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed while listing
                        continue
                    kind = kind_of(st.st_mode)
                    out.append(Entry(de.name, kind == "dir", st.st_size if kind == "file" else 0, st.st_mtime,
                                     kind == "link"))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self.wrap("listing", path, exc) from exc
        return sorted(out, key=lambda e: e.name)

    def sync(self, path: str) -> None:
        try:
            fd = os.open(self.full(path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self.wrap("syncing", path, exc) from exc

    def sync_dir(self, path: str) -> None:
        with contextlib.suppress(OSError):  # best effort
            fd = os.open(self.full(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
