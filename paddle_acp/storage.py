"""Storage: one small interface over ``pyarrow.fs``; the backend is chosen from the URI.

All paths given to :class:`Storage` methods are relative, '/'-separated and
resolved under the storage root; nothing here uses ``os.path`` on them, so the
same code runs on local disks, HDFS and S3.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import stat as _stat
from typing import Iterable, List, Optional, Tuple
from urllib.parse import urlparse

import pyarrow
import pyarrow.fs as pafs

from .errors import ConfigError, StorageError

logger = logging.getLogger("paddle_acp")

WRITE_CHUNK = 16 << 20  # largest single write handed to a filesystem (see Storage.write_buffers)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool
    size: int
    mtime: Optional[float]
    is_link: bool = False  # a symbolic link (local disks): never followed, is_dir is False


def _kind_of(mode: int) -> str:
    if _stat.S_ISLNK(mode):
        return "link"
    if _stat.S_ISDIR(mode):
        return "dir"
    if _stat.S_ISREG(mode):
        return "file"
    return "other"


class Storage:
    """A directory tree under ``root`` on a ``pyarrow.fs.FileSystem``.

    ``atomic_rename``: True where renaming a directory is atomic (local, HDFS);
    on object stores a checkpoint is committed by writing its manifest last.
    """

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str, atomic_rename: bool, local: bool = False):
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self.uri = uri
        self.atomic_rename = atomic_rename
        self.local = local

    def __repr__(self):
        return f"Storage({self.uri!r})"

    # -- paths ---------------------------------------------------------------
    def full(self, path: str) -> str:
        if path in ("", "."):
            return self.root
        if path.startswith("/") or ".." in path.split("/"):
            raise StorageError(f"refusing path outside the storage root: {path!r}")
        return self.root + "/" + path if self.root != "/" else "/" + path

    @staticmethod
    def join(*parts: str) -> str:
        return posixpath.join(*parts)

    def _wrap(self, what: str, path: str, exc: BaseException) -> StorageError:
        return StorageError(f"{what} {self.uri}/{path} failed: {exc}{_hint(exc)}")

    # -- operations ----------------------------------------------------------
    def makedirs(self, path: str) -> None:
        try:
            self.fs.create_dir(self.full(path), recursive=True)
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap("creating directory", path, exc) from exc

    def open_output(self, path: str):
        try:
            return self.fs.open_output_stream(self.full(path))
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap("opening for write", path, exc) from exc

    def open_input(self, path: str):
        try:
            return self.fs.open_input_file(self.full(path))
        except FileNotFoundError:
            raise
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap("opening for read", path, exc) from exc

    def write_bytes(self, path: str, data: bytes) -> None:
        self.write_buffers(path, [data])

    def write_buffers(self, path: str, buffers: Iterable) -> int:
        """Stream several buffers into one file; returns the bytes written.

        Large buffers are written in pieces of at most ``WRITE_CHUNK`` bytes: libhdfs
        copies each write into one Java byte[] (a 1 GB write is a 1 GB array on a
        client heap that is often 256 MB: OutOfMemoryError)."""
        total = 0
        out = self.open_output(path)
        try:
            with out:  # closing uploads the rest (remote stores): it fails like a write
                for buf in buffers:
                    mv = memoryview(buf)
                    if mv.nbytes <= WRITE_CHUNK:
                        total += out.write(buf)
                        continue
                    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
                    for i in range(0, mv.nbytes, WRITE_CHUNK):
                        total += out.write(mv[i:i + WRITE_CHUNK])
        except StorageError:
            raise
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap("writing", path, exc) from exc
        self.sync(path)
        return total

    def write_image(self, path: str, image, size: int) -> int:
        """Write the first ``size`` bytes of a page-aligned buffer (padded to a page).

        Local disks: ``O_DIRECT`` (no page-cache copy, a fraction of the CPU),
        falling back to buffered writes where the filesystem refuses it.
        """
        mv = memoryview(image).cast("B")
        if self.local and hasattr(os, "O_DIRECT"):
            try:
                return self._write_direct(path, mv, size)
            except OSError as exc:
                logger.debug("O_DIRECT write of %s failed (%s); using buffered writes", path, exc)
        return self.write_buffers(path, [mv[:size]])

    def _write_direct(self, path: str, mv: memoryview, size: int) -> int:
        padded = min(len(mv), (size + 4095) // 4096 * 4096)
        fd = os.open(self.full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            pos, chunk = 0, 64 << 20
            while pos < padded:
                n = os.write(fd, mv[pos:min(pos + chunk, padded)])
                if n <= 0:
                    raise OSError("O_DIRECT write made no progress")
                pos += n
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
        return size

    def read_bytes(self, path: str, limit: Optional[int] = None) -> bytes:
        """The file's bytes; with ``limit``, at most ``limit + 1`` of them (more than
        ``limit`` returned means the file is larger). Local files are opened without
        following a symbolic link."""
        if self.local:
            return self._read_local(path, limit)
        with self.open_input(path) as f:
            try:
                return f.read() if limit is None else f.read(limit + 1)
            except (OSError, pyarrow.ArrowException) as exc:
                raise self._wrap("reading", path, exc) from exc

    def _read_local(self, path: str, limit: Optional[int]) -> bytes:
        try:
            fd = os.open(self.full(path), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.uri}/{path}") from None
        except OSError as exc:
            raise self._wrap("opening for read", path, exc) from exc
        try:
            with os.fdopen(fd, "rb", closefd=True) as f:
                return f.read() if limit is None else f.read(limit + 1)
        except OSError as exc:
            raise self._wrap("reading", path, exc) from exc

    def kind(self, path: str) -> str:
        """"file", "dir", "link" (a symbolic link, local disks only: never followed),
        "other" or "missing"."""
        return self.stat(path)[0]

    def stat(self, path: str) -> Tuple[str, int]:
        """(kind, size) in one call; kind as :meth:`kind` gives it, size 0 unless a file."""
        if self.local:
            try:
                st = os.lstat(self.full(path))
            except (FileNotFoundError, NotADirectoryError):
                return "missing", 0
            except OSError as exc:
                raise self._wrap("checking", path, exc) from exc
            kind = _kind_of(st.st_mode)
            return kind, st.st_size if kind == "file" else 0
        try:
            info = self.fs.get_file_info(self.full(path))
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap("checking", path, exc) from exc
        kind = {pafs.FileType.File: "file", pafs.FileType.Directory: "dir", pafs.FileType.NotFound: "missing"}.get(info.type, "other")
        return kind, (info.size or 0) if kind == "file" else 0

    def link_below_root(self, path: str) -> Optional[str]:
        """The first component of ``path`` below its first one (the job directory, which
        may be a link the operator made) that is a symbolic link, or None.

        Remote stores have no links. Used before deleting: nothing inside a job is
        ever deleted through a link, nor a link itself."""
        if not self.local or path in ("", "."):
            return None
        parts = path.split("/")
        for i in range(2, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if self.kind(prefix) == "link":
                return prefix
        return None

    def _refuse_links(self, what: str, path: str) -> None:
        link = self.link_below_root(path)
        if link is not None:
            raise StorageError(
                f"refusing to {what} {self.uri}/{path}: {link} is a symbolic link "
                "(paddle-acp never follows links inside a job; remove the link)"
            )

    def size(self, path: str) -> int:
        info = self.fs.get_file_info(self.full(path))
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{self.uri}/{path}")
        return info.size

    def exists(self, path: str) -> bool:
        try:
            return self.fs.get_file_info(self.full(path)).type != pafs.FileType.NotFound
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap("checking", path, exc) from exc

    def listdir(self, path: str) -> List[Entry]:
        """Direct children of ``path``; an empty list when it does not exist.

        On local disks a symbolic link is reported as such (``is_link``, not a
        directory), whatever it points to."""
        if self.local:
            return self._listdir_local(path)
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.full(path), allow_not_found=True))
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap("listing", path, exc) from exc
        out = []
        for info in infos:
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            out.append(Entry(info.base_name, info.type == pafs.FileType.Directory, info.size or 0, mtime))
        return sorted(out, key=lambda e: e.name)

    def _listdir_local(self, path: str) -> List[Entry]:
        out = []
        try:
            with os.scandir(self.full(path)) as it:
                for de in it:
                    try:
                        st = de.stat(follow_symlinks=False)
                    except FileNotFoundError:  # removed while listing
                        continue
                    kind = _kind_of(st.st_mode)
                    out.append(Entry(de.name, kind == "dir", st.st_size if kind == "file" else 0, st.st_mtime, kind == "link"))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self._wrap("listing", path, exc) from exc
        return sorted(out, key=lambda e: e.name)

    def _missing(self, path: str) -> bool:
        try:
            return self.fs.get_file_info(self.full(path)).type == pafs.FileType.NotFound
        except (OSError, pyarrow.ArrowException):
            return False

    def delete_dir(self, path: str) -> None:
        """Delete a directory tree; never through (or below) a symbolic link."""
        self._refuse_links("delete", path)
        try:
            self.fs.delete_dir(self.full(path))
        except FileNotFoundError:
            pass
        except (OSError, pyarrow.ArrowException) as exc:
            if self._missing(path):  # libhdfs reports a missing path as a plain I/O error
                return
            raise self._wrap("deleting", path, exc) from exc

    def delete_file(self, path: str) -> None:
        """Delete a file; never through a symbolic link (a link itself is not deleted either)."""
        self._refuse_links("delete", path)
        try:
            self.fs.delete_file(self.full(path))
        except FileNotFoundError:
            pass
        except (OSError, pyarrow.ArrowException) as exc:
            if self._missing(path):  # libhdfs reports a missing path as a plain I/O error
                return
            raise self._wrap("deleting", path, exc) from exc

    def rename(self, src: str, dst: str) -> None:
        try:
            self.fs.move(self.full(src), self.full(dst))
        except (OSError, pyarrow.ArrowException) as exc:
            raise self._wrap(f"renaming to {dst}:", src, exc) from exc
        self.sync_dir(posixpath.dirname(dst))

    # -- durability (local disks only; remote stores persist on close) -------
    def sync(self, path: str) -> None:
        if not self.local:
            return
        fd = os.open(self.full(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def sync_dir(self, path: str) -> None:
        if not self.local:
            return
        try:
            fd = os.open(self.full(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


# S3 error codes (as pyarrow reports them) that mean "these credentials are not
# accepted"; a HEAD request's 403 carries no body, so say what it usually means.
_S3_AUTH_HINTS = (
    ("SIGNATURE_DOES_NOT_MATCH", "the S3 secret key is wrong (AWS_SECRET_ACCESS_KEY or the URI's secret_key)"),
    ("INVALID_ACCESS_KEY_ID", "the S3 access key id is unknown to the server (AWS_ACCESS_KEY_ID or the URI's access_key)"),
    ("ACCESS_DENIED", "S3 denied access: wrong credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) "
                      "or no permission on this bucket for this key"),
)


def _hint(exc: BaseException) -> str:
    text = str(exc)
    for code, hint in _S3_AUTH_HINTS:
        if code in text:
            return f" ({hint})"
    if "HDFS" in text and "errno 255" in text:  # libhdfs: the Java exception went to stderr
        return " (the HDFS client printed the Java exception with the cause on stderr)"
    return ""


def redact(uri: str) -> str:
    """The URI without query parameters or user info (they may hold credentials)."""
    p = urlparse(uri)
    if not p.scheme or len(p.scheme) == 1:
        return uri
    netloc = p.hostname or ""
    if p.port:
        netloc += f":{p.port}"
    return f"{p.scheme}://{netloc}{p.path}"


def open_storage(uri: str, hdfs_user: Optional[str] = None, hadoop_home: Optional[str] = None,
                 cache_dir: Optional[str] = None) -> Storage:
    """Pick the backend from the URI's scheme (the one place that does).

    ``file://`` or a plain path: the local filesystem. ``hdfs://host:port/path``:
    HDFS (see :func:`_open_hdfs` for the client choice). ``s3://bucket/prefix``:
    S3 (credentials and endpoint from the AWS variables or the URI's query).
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"checkpoint URI {uri!r} is empty")
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        path = parsed.path if scheme == "file" else uri
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"checkpoint URI {uri!r}: file:// URIs must not name a host")
        root = os.path.abspath(os.path.expanduser(path))
        return Storage(pafs.LocalFileSystem(), root, uri, atomic_rename=True, local=True)
    if scheme == "s3":
        return _open_s3(uri, parsed)
    if scheme in ("hdfs", "viewfs"):
        return _open_hdfs(uri, parsed, hdfs_user, hadoop_home, cache_dir)
    raise ConfigError(
        f"checkpoint URI {redact(uri)!r}: unsupported scheme {scheme!r} (supported: a local path, file://, hdfs://, s3://)"
    )


def _open_s3(uri: str, parsed) -> Storage:
    if not parsed.netloc:
        raise ConfigError(f"checkpoint URI {redact(uri)!r}: an s3:// URI needs a bucket (s3://bucket/prefix)")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    try:
        if parsed.query or not endpoint:
            fs, root = pafs.FileSystem.from_uri(uri)
        else:
            ep = urlparse(endpoint)
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            fs = pafs.S3FileSystem(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https", region=region)
            root = (parsed.netloc + parsed.path).rstrip("/")
    except (pyarrow.ArrowException, OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint URI {redact(uri)!r}: cannot configure S3: {exc}") from exc
    return Storage(fs, root, redact(uri), atomic_rename=False)


class _BytesWriter:
    """hdfs-native's ``FileWriter.write`` copies a ``pyarrow.Buffer`` (what
    ``pyarrow.PythonFile`` hands it) element by element, at ~6 MB/s; given
    ``bytes`` it runs at network speed. One memcpy per write call is cheaper."""

    def __init__(self, f):
        self._f = f

    def write(self, data) -> int:
        return self._f.write(data if isinstance(data, bytes) else bytes(data))

    def __getattr__(self, name):
        return getattr(self._f, name)


class _HdfsNativeHandler(pafs.FSSpecHandler):
    def open_output_stream(self, path, metadata):
        return pyarrow.PythonFile(_BytesWriter(self.fs.open(path, mode="wb")), mode="w")

    def open_append_stream(self, path, metadata):
        return pyarrow.PythonFile(_BytesWriter(self.fs.open(path, mode="ab")), mode="w")


def _hdfs_clients(forced: Optional[str]):
    order = ["pyarrow", "hdfs-native", "cli"]
    if forced:
        if forced not in order:
            raise ConfigError(f"PADDLE_ACP_HDFS_CLIENT={forced!r} must be one of {', '.join(order)}")
        return [forced]
    return order


def _open_hdfs(uri: str, parsed, hdfs_user, hadoop_home, cache_dir) -> Storage:
    host = parsed.hostname or "default"
    port = parsed.port or 8020
    user = hdfs_user or parsed.username or None
    root = parsed.path.rstrip("/") or "/"
    display = redact(uri)
    hadoop_home = hadoop_home or os.environ.get("PADDLE_EDL_HDFS_HOME") or os.environ.get("HADOOP_HOME")
    why = []
    for client in _hdfs_clients(os.environ.get("PADDLE_ACP_HDFS_CLIENT")):
        try:
            if client == "pyarrow":
                fs = pafs.HadoopFileSystem(host, port, user=user)
                reason = "libhdfs and a JVM are available"
            elif client == "hdfs-native":
                try:
                    from hdfs_native.fsspec import HdfsFileSystem
                except ImportError:
                    raise StorageError("the hdfs-native package is not installed (pip install paddle-acp[hdfs])") from None
                fs = pafs.PyFileSystem(_HdfsNativeHandler(HdfsFileSystem(host=host, port=port)))
                reason = "no usable libhdfs/JVM; hdfs-native needs neither"
            else:
                from .hdfs_cli import HadoopCliHandler

                fs = pafs.PyFileSystem(HadoopCliHandler(hadoop_home, f"hdfs://{host}:{port}", user, cache_dir))
                reason = "neither libhdfs nor hdfs-native is usable; using the hadoop command line"
            fs.get_file_info(root)  # connect now: a dead server fails here, not in the middle of a save
        except Exception as exc:  # each client fails differently (OSError, ImportError, Arrow errors)
            why.append(f"{client}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            continue
        if os.environ.get("PADDLE_ACP_HDFS_CLIENT"):
            reason = "chosen by PADDLE_ACP_HDFS_CLIENT"
        elif why:
            reason += " (" + "; ".join(why) + ")"
        logger.info("HDFS %s: using the %s client: %s", display, client, reason)
        return Storage(fs, root, display, atomic_rename=True)
    raise StorageError(f"cannot reach HDFS at {display}: " + " | ".join(why))
