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
import re
import stat as _stat
from typing import Iterable, List, Optional, Tuple
from urllib.parse import parse_qsl, quote, unquote, urlparse

import pyarrow
import pyarrow.fs as pafs

from paddle_acp.errors import ConfigError, StorageError

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
        self.uri = redact(uri)  # what messages show: never the user info or query
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
        return StorageError(scrub(f"{what} {self.uri}/{path} failed: {exc}{_hint(exc)}"))

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

    def forget_cached(self, path: str) -> None:
        """Make the next look-up at or under ``path`` ask the storage itself, not a client-side
        metadata cache (the hadoop CLI client keeps one): for state other processes change."""
        handler = getattr(self.fs, "handler", None)
        forget = getattr(handler, "forget", None)
        if forget is not None:
            forget(self.full(path))

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
    if "NETWORK_CONNECTION" in text or "curlCode: 28" in text:  # S3: no connection, or it timed out
        from paddle_acp.config import connect_timeout_from_env

        return (f" (cannot connect to the S3 endpoint; each attempt is bounded by "
                f"PADDLE_ACP_CONNECT_TIMEOUT={connect_timeout_from_env():g} s)")
    return ""


def redact(uri: str) -> str:
    """The URI without query parameters, fragment or user info (they may hold credentials)."""
    if not isinstance(uri, str):
        return repr(uri)
    if "://" not in uri:
        return uri
    p = urlparse(uri)
    if not p.scheme or len(p.scheme) == 1:
        return uri
    netloc = p.netloc.rpartition("@")[2]  # not .hostname: that lowercases the bucket
    return f"{p.scheme}://{netloc}{p.path}"


# Strings that must never reach a message, log line, file or metrics record: the user info and the
# query values of every URI seen, PaddleCloud's UGI password, AWS_SECRET_ACCESS_KEY. Registered by
# open_storage and config.from_env; scrub() replaces them, the log filter below applies it to
# every record of the "paddle_acp" logger.
_SECRETS: set = set()
_MIN_SECRET = 3  # shorter values (an "x") would mangle every message; nothing that short is a secret


def register_secret(value: Optional[str]) -> None:
    if isinstance(value, str) and len(value) >= _MIN_SECRET:
        _SECRETS.add(value)
        q = quote(value, safe="")
        if q != value:
            _SECRETS.add(q)


_SECRET_KEY_RE = re.compile(r"key|secret|token|pass|pwd|sig|cred|auth|session", re.IGNORECASE)


def uri_secrets(uri: str) -> List[str]:
    """The parts of ``uri`` that may hold credentials: its user info (and the password alone) and
    the values of query parameters named like credentials (access_key, secret_key, session_token...)."""
    if not isinstance(uri, str) or "://" not in uri:
        return []
    p = urlparse(uri)
    out = []
    userinfo = p.netloc.rpartition("@")[0]
    if userinfo:
        out.append(userinfo)
        user, _, password = userinfo.partition(":")
        out += [password, unquote(password), unquote(user) if password else ""]
    for key, value in parse_qsl(p.query, keep_blank_values=True):
        if _SECRET_KEY_RE.search(key):  # not endpoint_override or scheme: "http" is no secret
            out.append(value)
    return [x for x in out if x]


def register_uri(uri: str) -> None:
    for value in uri_secrets(uri):
        register_secret(value)


def scrub(text) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    text = str(text)
    for value in sorted(_SECRETS, key=len, reverse=True):
        if value in text:
            text = text.replace(value, "***")
    return text


class _ScrubFilter(logging.Filter):
    """Replaces registered secrets in a record's message and traceback (a backstop: messages
    are built from redacted URIs in the first place)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _SECRETS:
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error path
            return True
        record.msg, record.args = scrub(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


if not any(isinstance(f, _ScrubFilter) for f in logger.filters):
    logger.addFilter(_ScrubFilter())


def open_storage(uri: str, hdfs_user: Optional[str] = None, hadoop_home: Optional[str] = None,
                 cache_dir: Optional[str] = None) -> Storage:
    """Pick the backend from the URI's scheme (the one place that does).

    ``file://`` or a plain path: the local filesystem. ``hdfs://host:port/path``:
    HDFS (see :func:`_open_hdfs` for the client choice). ``s3://bucket/prefix``:
    S3 (credentials and endpoint from the AWS variables or the URI's query).
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"checkpoint URI {uri!r} is empty")
    register_uri(uri)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        path = parsed.path if scheme == "file" else uri
        if scheme == "file" and parsed.netloc not in ("", "localhost"):
            what = "user info (credentials)" if "@" in parsed.netloc else "a host"
            raise ConfigError(f"checkpoint URI {redact(uri)!r}: file:// URIs must not name {what}; "
                              "use file:///path or a plain path")
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
    register_secret(os.environ.get("AWS_SECRET_ACCESS_KEY"))
    register_secret(os.environ.get("AWS_SESSION_TOKEN"))
    bucket = parsed.netloc.rpartition("@")[2]  # user info never becomes part of a path
    timeouts = _s3_timeouts()
    try:
        if parsed.query or not endpoint:
            fs, root = pafs.FileSystem.from_uri(uri)
            if timeouts and isinstance(fs, pafs.S3FileSystem):
                fs = _with_s3_timeouts(uri, parsed, timeouts)
        else:
            ep = urlparse(endpoint)
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
            creds = {}
            if parsed.password is not None:  # s3://KEY:SECRET@bucket/... (pyarrow's own URI form)
                creds = dict(access_key=unquote(parsed.username or ""), secret_key=unquote(parsed.password))
            fs = pafs.S3FileSystem(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https",
                                   region=region, **creds, **timeouts)
            root = (bucket + parsed.path).rstrip("/")
    except (pyarrow.ArrowException, OSError, ValueError, TypeError) as exc:
        # from None: the original text may quote the URI, credentials included
        raise ConfigError(f"checkpoint URI {redact(uri)!r}: cannot configure S3: {scrub(exc)}{_CREDENTIALS_HINT}") from None
    return Storage(fs, root, uri, atomic_rename=False)


_CREDENTIALS_HINT = (" (credentials belong in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, not in the URI: "
                     "a URI is copied into logs, shell histories and job specs)")


def _s3_timeouts() -> dict:
    from paddle_acp.config import connect_timeout_from_env

    t = connect_timeout_from_env()
    return dict(connect_timeout=t, request_timeout=max(t, 60.0))


def _with_s3_timeouts(uri: str, parsed, timeouts: dict):
    """``FileSystem.from_uri`` cannot set timeouts: rebuild the S3 filesystem from the URI's
    options (as pyarrow parses them) with ``PADDLE_ACP_CONNECT_TIMEOUT`` added."""
    opts = {}
    for key, value in parse_qsl(parsed.query, keep_blank_values=True):
        if key in ("region", "scheme", "endpoint_override", "access_key", "secret_key", "session_token",
                   "role_arn", "session_name", "external_id"):
            opts[key] = value
        elif key in ("allow_bucket_creation", "allow_bucket_deletion", "force_virtual_addressing"):
            opts[key] = value.lower() in ("1", "true", "yes")
    if parsed.password is not None and "access_key" not in opts:
        opts.update(access_key=unquote(parsed.username or ""), secret_key=unquote(parsed.password))
    return pafs.S3FileSystem(**opts, **timeouts)


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


def hdfs_ipc_conf(timeout: float) -> dict:
    """Hadoop client settings (libhdfs, the hadoop CLI) that bound connection attempts to about
    ``timeout`` seconds (Hadoop's defaults retry a refused connection 10 times and a timed-out one
    45 times, 20 s each)."""
    retries = max(1, int(timeout // 2))
    return {
        "ipc.client.connect.timeout": str(max(1000, int(timeout * 1000 / 3))),
        "ipc.client.connect.max.retries": str(retries),
        "ipc.client.connect.retry.interval": "1000",
        "ipc.client.connect.max.retries.on.timeouts": "2",
        "dfs.client.retry.policy.enabled": "false",
    }


def hdfs_native_conf(timeout: float) -> dict:
    """hdfs-native's settings: 3 attempts with short sleeps between them (its defaults take about
    3 minutes to give up on a namenode that refuses connections)."""
    return {
        "dfs.client.failover.max.attempts": "3",
        "dfs.client.failover.sleep.base.millis": "500",
        "dfs.client.failover.sleep.max.millis": str(max(500, int(timeout * 1000 / 4))),
        "dfs.client.socket-timeout": str(max(1000, int(timeout * 1000))),
    }


def _probe(fs, root: str, timeout: float, client: str) -> None:
    """Connect now (a dead server fails here, not in the middle of a save), within ``timeout``
    seconds whatever the client's own retry settings do."""
    import threading

    box: list = []

    def run():
        try:
            if fs.get_file_info(root).type == pafs.FileType.NotFound and fs.get_file_info("/").type == pafs.FileType.NotFound:
                # libhdfs reports a failed call as "not found" (the cause goes to stderr); "/" always exists
                raise OSError("the namenode did not answer: even / reports missing (the client printed the cause on stderr)")
            box.append(None)
        except BaseException as exc:  # handed to the calling thread
            box.append(exc)

    t = threading.Thread(target=run, name=f"paddle-acp-connect-{client}", daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"no answer within {timeout:g} s (PADDLE_ACP_CONNECT_TIMEOUT)")
    if box[0] is not None:
        raise box[0]


def _open_hdfs(uri: str, parsed, hdfs_user, hadoop_home, cache_dir) -> Storage:
    import time

    from paddle_acp.config import connect_timeout_from_env

    host = parsed.hostname or "default"
    port = parsed.port or 8020
    user = hdfs_user or (unquote(parsed.username) if parsed.username else None)
    root = parsed.path.rstrip("/") or "/"
    display = redact(uri)
    hadoop_home = hadoop_home or os.environ.get("PADDLE_EDL_HDFS_HOME") or os.environ.get("HADOOP_HOME")
    timeout = connect_timeout_from_env()
    deadline = time.monotonic() + timeout
    why = []
    for client in _hdfs_clients(os.environ.get("PADDLE_ACP_HDFS_CLIENT")):
        left = deadline - time.monotonic()
        if left <= 0:
            why.append(f"{client}: not tried (PADDLE_ACP_CONNECT_TIMEOUT={timeout:g} s spent)")
            continue
        try:
            if client == "pyarrow":
                fs = pafs.HadoopFileSystem(host, port, user=user, extra_conf=hdfs_ipc_conf(timeout))
                reason = "libhdfs and a JVM are available"
            elif client == "hdfs-native":
                try:
                    from hdfs_native.fsspec import HdfsFileSystem
                except ImportError:
                    raise StorageError("the hdfs-native package is not installed (pip install paddle-acp[hdfs])") from None
                fs = pafs.PyFileSystem(_HdfsNativeHandler(HdfsFileSystem(host=host, port=port, **hdfs_native_conf(timeout))))
                reason = "no usable libhdfs/JVM; hdfs-native needs neither"
            else:
                from paddle_acp.storage.hadoop_cli import HadoopCliHandler

                fs = pafs.PyFileSystem(HadoopCliHandler(hadoop_home, f"hdfs://{host}:{port}", user, cache_dir,
                                                        extra_conf=hdfs_ipc_conf(timeout)))
                reason = "neither libhdfs nor hdfs-native is usable; using the hadoop command line"
            _probe(fs, root, max(left, 1.0), client)
        except Exception as exc:  # each client fails differently (OSError, ImportError, Arrow errors)
            why.append(scrub(f"{client}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"))
            continue
        if os.environ.get("PADDLE_ACP_HDFS_CLIENT"):
            reason = "chosen by PADDLE_ACP_HDFS_CLIENT"
        elif why:
            reason += " (" + "; ".join(why) + ")"
        logger.info("HDFS %s: using the %s client: %s", display, client, reason)
        return Storage(fs, root, display, atomic_rename=True)
    raise StorageError(f"cannot reach HDFS at {display}: " + " | ".join(why)
                       + f" (connection attempts are bounded by PADDLE_ACP_CONNECT_TIMEOUT={timeout:g} s)")
