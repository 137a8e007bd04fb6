"""HDFS (``hdfs://host:port/path``, ``viewfs://``) through the first client that connects.

Clients, in order (``PADDLE_ACP_HDFS_CLIENT`` forces one): ``pyarrow`` (libhdfs and a JVM in this process; fastest),
``hdfs-native`` (the Rust client, no JVM), ``cli`` (the ``hadoop fs`` command line, :mod:`.hadoop_cli`), all tried
within one ``PADDLE_ACP_CONNECT_TIMEOUT`` (a dead NameNode fails at open, not in a save); a port that refuses
connections all that time fails before any client starts. Checkpoints commit by an atomic directory rename. A forked
child never uses or drops the parent's client (:mod:`.forks`). libhdfs's JVM gets ``DEFAULT_LIBHDFS_OPTS`` unless the
user set ``LIBHDFS_OPTS`` (:func:`libhdfs_jvm_options`)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import ParseResult, unquote

import pyarrow
import pyarrow.fs as pafs

from paddle_acp.config import HDFS_CLIENTS as CLIENTS
from paddle_acp.config import StorageOptions
from paddle_acp.errors import StorageError
from paddle_acp.storage import forks
from paddle_acp.storage.arrow import ArrowStorage
from paddle_acp.storage.base import Entry, redact, scrub
from paddle_acp.storage.libhdfs import LibhdfsCalls

logger = logging.getLogger("paddle_acp")


class HdfsStorage(ArrowStorage):
    """A directory tree on HDFS; ``client`` names the client in use."""

    overlap_writes = True  # closing a file waits for the namenode to see its last block
    small_write_s = 0.4  # a close's first ``complete`` usually precedes the block report: retried 400 ms later
    ranged_readers = 2  # 4 were slower than 2 against one DataNode on 2 cores (ci/bench/profile_restore_remote.py)
    errors = ArrowStorage.errors + (RuntimeError,)  # hdfs-native's NameNode refusals (safe mode, quota, permissions)
    fork_safe = False  # libhdfs's JVM, hdfs-native's runtime, the command line client's locks

    def __init__(self, fs: Any, root: str, uri: str, client: str = "pyarrow",
                 libhdfs: Optional[LibhdfsCalls] = None):
        super().__init__(fs, root, uri)
        self.client = client
        self._libhdfs = libhdfs  # pyarrow's libhdfs called directly: one RPC where pyarrow makes 2 or 3
        # libhdfs and hdfs-native make missing parents in the one Create RPC; ``hadoop fs -put`` refuses them
        self.creates_parents = client in ("pyarrow", "hdfs-native")

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """As :meth:`Storage.create_exclusive`; the NameNode decides, in one rename refusing a taken name: hdfs-native's
        never overwrites; libhdfs and ``hadoop fs -mv`` replace a file (two writers would both "create" it), so they
        write it in a directory of its own and move it *into* the parent, which every client refuses when taken."""
        self.forget_cached(path)
        parent, _, name = path.rpartition("/")
        tag = uuid.uuid4().hex[:12]
        if self.client == "hdfs-native":
            stage, tmp, dst = None, f"{path}.tmp-{tag}", path
        else:
            stage = f"{parent}/.tmp-{tag}" if parent else f".tmp-{tag}"
            tmp, dst = f"{stage}/{name}", parent
            if not self.creates_parents:
                self.makedirs(stage)
        moved = False
        try:
            self.write_bytes(tmp, data)
            try:
                self.rename(tmp, dst)
                moved = True
                return True
            except StorageError:
                self.forget_cached(path)
                if self.exists(path):
                    return False  # taken: by another process, or earlier
                raise
        finally:
            try:
                if stage is not None:  # (empty once the file moved; ours, a directory: one RPC)
                    direct = self._direct()
                    if direct is None or not direct.delete(self.full(stage)):
                        self.delete_dir(stage)
                elif not moved and self.exists(tmp):
                    self.delete_file(tmp)
            except (StorageError, OSError) as exc:
                logger.debug("could not remove %s: %s", stage or tmp, exc)

    def _direct(self) -> Optional[LibhdfsCalls]:
        """libhdfs to call directly, where it is (never in a forked child: refused there)."""
        return self._libhdfs if forks.opened_here(self._pid) else None

    def exists(self, path: str) -> bool:
        direct = self._direct()
        if direct is None:
            return super().exists(path)
        try:
            return direct.exists(self.full(path))
        except OSError as exc:
            raise self.wrap("checking", path, exc) from exc

    def listdir(self, path: str) -> List[Entry]:
        direct = self._direct()
        if direct is None:
            return super().listdir(path)
        try:
            entries = direct.list(self.full(path))
        except OSError as exc:  # (NotADirectoryError: a file)
            raise self.wrap("listing", path, exc) from exc
        return sorted(entries, key=lambda e: e.name) if entries is not None else super().listdir(path)

    def hint(self, exc: BaseException) -> str:
        text = str(exc)
        if "HDFS" in text and "errno 255" in text:  # libhdfs: the Java exception went to stderr
            return " (the HDFS client printed the Java exception with the cause on stderr)"
        return ""

    @classmethod
    def from_uri(cls, uri: str, parsed: ParseResult, options: StorageOptions) -> "HdfsStorage":
        host = parsed.hostname or "default"
        port = parsed.port or 8020
        user = options.hdfs_user or (unquote(parsed.username) if parsed.username else None)
        root = parsed.path.rstrip("/") or "/"
        display = redact(uri)
        forced = options.hdfs_client  # one of CLIENTS (validated in config), or None
        timeout = options.connect_timeout
        deadline = time.monotonic() + timeout
        bound = f" (connection attempts are bounded by PADDLE_ACP_CONNECT_TIMEOUT={timeout:g} s)"
        refused = _refused_until(host, port, deadline) if parsed.scheme.lower() == "hdfs" else None
        if refused is not None:
            raise StorageError(f"cannot reach HDFS at {display}: {refused}{bound}")
        why: List[str] = []
        for client in [forced] if forced else CLIENTS:
            left = deadline - time.monotonic()
            if left <= 0:
                why.append(f"{client}: not tried (PADDLE_ACP_CONNECT_TIMEOUT={timeout:g} s spent)")
                continue
            try:
                fs, reason = _connect(client, host, port, user, options)
                forks.track(fs)  # a child forked while it connects never drops it either
                _probe(fs, root, max(left, 1.0), client)
            except Exception as exc:  # each client fails differently (OSError, ImportError, Arrow errors)
                why.append(scrub(f"{client}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"))
                continue
            if forced:
                reason = "chosen by PADDLE_ACP_HDFS_CLIENT"
            elif why:
                reason += " (" + "; ".join(why) + ")"
            logger.info("HDFS %s: using the %s client: %s", display, client, reason)
            direct = LibhdfsCalls.connect(host, port, user, hdfs_ipc_conf(timeout)) if client == "pyarrow" else None
            return cls(fs, root, display, client, direct)
        raise StorageError(f"cannot reach HDFS at {display}: " + " | ".join(why) + bound)


def _refused_until(host: str, port: int, deadline: float) -> Optional[str]:
    """Why no client is tried: the NameNode's port refused every connection until ``deadline`` (tried every
    0.25 s: a restart is waited for). None: it accepted, or the address is no plain host (HA nameservice, no
    such name, no route): the clients decide. (A client's call left running aborts the process at exit.)"""
    if host == "default":
        return None
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(0.1, min(1.0, left))):
                return None
        except ConnectionRefusedError:
            if left <= 0.25:
                return f"{host}:{port} refused every connection (nothing listens there)"
            time.sleep(0.25)
        except OSError:
            return None


def _connect(client: str, host: str, port: int, user: Optional[str], options: StorageOptions) -> Tuple[Any, str]:
    """A pyarrow filesystem of ``client`` (not yet connected) and why it is the one used."""
    timeout = options.connect_timeout
    if client == "pyarrow":
        with libhdfs_jvm_options(options.libhdfs_opts):
            fs = pafs.HadoopFileSystem(host, port, user=user, extra_conf=hdfs_ipc_conf(timeout))
        return fs, "libhdfs and a JVM are available"
    if client == "hdfs-native":
        try:
            from hdfs_native.fsspec import HdfsFileSystem
        except ImportError:
            raise StorageError("the hdfs-native package is not installed (pip install paddle-acp[hdfs])") from None
        # never in fsspec's instance cache: its fork hook drops the cache's clients in a child (a hang: see forks)
        fs = pafs.PyFileSystem(_HdfsNativeHandler(HdfsFileSystem(host=host, port=port, skip_instance_cache=True,
                                                                 **hdfs_native_conf(timeout))))
        return fs, "no usable libhdfs/JVM; hdfs-native needs neither"
    from paddle_acp.storage.hadoop_cli import HadoopCliHandler

    ugi = options.hdfs_ugi  # PaddleCloud's user,password: only for its own user
    if ugi and user is not None and ugi.split(",", 1)[0] != user:
        ugi = None
    fs = pafs.PyFileSystem(HadoopCliHandler(options.hadoop_home, f"hdfs://{host}:{port}", user, options.cache_dir,
                                            extra_conf=hdfs_ipc_conf(timeout), ugi=ugi))
    return fs, "neither libhdfs nor hdfs-native is usable; using the hadoop command line"


class FirstJvm:
    """Whether this process's libhdfs JVM was asked for (its options are fixed from then on)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked = False


_FIRST_JVM = FirstJvm()


@contextlib.contextmanager
def libhdfs_jvm_options(opts: Optional[str], first: FirstJvm = _FIRST_JVM) -> Iterator[None]:
    """``opts`` as ``LIBHDFS_OPTS`` while libhdfs starts this process's JVM (its first connection), unless the
    user set ``LIBHDFS_OPTS``; removed afterwards (subprocesses see the script's environment)."""
    if not opts:
        yield
        return
    with first.lock:
        if first.asked or "LIBHDFS_OPTS" in os.environ:  # (the user's: read only to leave it alone)
            yield
            return
        os.environ["LIBHDFS_OPTS"] = opts
        try:
            yield
        finally:
            os.environ.pop("LIBHDFS_OPTS", None)
            first.asked = True


def hdfs_ipc_conf(timeout: float) -> Dict[str, str]:
    """Hadoop client settings (libhdfs, the hadoop CLI) bounding connection attempts to about ``timeout`` s
    (the defaults retry a refused connection 10 times, a timed-out one 45 times, 20 s each)."""
    retries = max(1, int(timeout // 2))
    return {
        "ipc.client.connect.timeout": str(max(1000, int(timeout * 1000 / 3))),
        "ipc.client.connect.max.retries": str(retries),
        "ipc.client.connect.retry.interval": "1000",
        "ipc.client.connect.max.retries.on.timeouts": "2",
        "dfs.client.retry.policy.enabled": "false",
    }


def hdfs_native_conf(timeout: float) -> Dict[str, str]:
    """hdfs-native's settings: 3 attempts, short sleeps (its defaults give up on a refusing namenode in ~3 min)."""
    return {
        "dfs.client.failover.max.attempts": "3",
        "dfs.client.failover.sleep.base.millis": "500",
        "dfs.client.failover.sleep.max.millis": str(max(500, int(timeout * 1000 / 4))),
        "dfs.client.socket-timeout": str(max(1000, int(timeout * 1000))),
    }


# Probe threads still in a client's call after their caller gave up: one that comes back from native code while the
# interpreter finalizes aborts the process ("FATAL: exception not rethrown"), so the exit waits PROBE_EXIT_WAIT s
_CALLS: "set[threading.Thread]" = set()
_CALLS_LOCK = threading.Lock()
PROBE_EXIT_WAIT = 1.0


def _wait_for_calls_at_exit() -> None:
    deadline = time.monotonic() + PROBE_EXIT_WAIT
    with _CALLS_LOCK:
        calls = list(_CALLS)
    for t in calls:
        t.join(max(0.0, deadline - time.monotonic()))


def _forget_calls_in_child() -> None:  # their threads do not exist in a forked child
    global _CALLS, _CALLS_LOCK
    _CALLS, _CALLS_LOCK = set(), threading.Lock()


atexit.register(_wait_for_calls_at_exit)
os.register_at_fork(after_in_child=_forget_calls_in_child)


def _probe(fs: Any, root: str, timeout: float, client: str) -> None:
    """Connect now (a dead server fails here, not in a save), within ``timeout`` s whatever the client retries."""
    box: List[Optional[BaseException]] = []

    def run() -> None:
        try:
            if fs.get_file_info(root).type == pafs.FileType.NotFound and fs.get_file_info("/").type == pafs.FileType.NotFound:
                # libhdfs reports a failed call as "not found" (the cause goes to stderr); "/" always exists
                raise OSError("the namenode did not answer: even / reports missing (the client printed the cause on stderr)")
            box.append(None)
        except BaseException as exc:  # handed to the calling thread
            box.append(exc)
        finally:
            with _CALLS_LOCK:
                _CALLS.discard(threading.current_thread())

    t = threading.Thread(target=run, name=f"paddle-acp-connect-{client}", daemon=True)
    with _CALLS_LOCK:
        _CALLS.add(t)
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"no answer within {timeout:g} s (PADDLE_ACP_CONNECT_TIMEOUT)")
    if box[0] is not None:
        raise box[0]


class _BytesWriter:
    """hdfs-native's ``write`` copies a ``pyarrow.Buffer`` element by element (~6 MB/s): it gets ``bytes``."""

    def __init__(self, f: Any):
        self._f = f

    def write(self, data: Any) -> int:
        return int(self._f.write(data if isinstance(data, bytes) else bytes(data)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class _HdfsNativeHandler(pafs.FSSpecHandler):  # type: ignore[misc]  # pyarrow is untyped
    """hdfs-native as a pyarrow filesystem; a listing and an open are one NameNode RPC each (fsspec's: 4 and 2)."""

    def get_file_info_selector(self, selector: Any) -> Any:
        if selector.recursive:
            return super().get_file_info_selector(selector)
        base = self.fs._strip_protocol(selector.base_dir).rstrip("/") or "/"
        try:
            listing = list(self.fs.client.list_status(base, False))
        except FileNotFoundError:
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(selector.base_dir) from None
        if len(listing) == 1 and not listing[0].isdir and listing[0].path.rstrip("/") == base:
            raise NotADirectoryError(selector.base_dir)  # HDFS lists a file as itself
        return [pafs.FileInfo(s.path, pafs.FileType.Directory if s.isdir else pafs.FileType.File,
                              size=None if s.isdir else s.length, mtime_ns=int(s.modification_time) * 1_000_000)
                for s in listing]

    def open_input_file(self, path: str) -> Any:
        try:
            reader = self.fs.client.read(self.fs._strip_protocol(path))
        except FileNotFoundError:  # missing, or a directory (its message: the NameNode's Java stack trace)
            raise FileNotFoundError(path) from None
        return pyarrow.PythonFile(reader, mode="r")

    open_input_stream = open_input_file

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return pyarrow.PythonFile(_BytesWriter(self.fs.open(path, mode="wb")), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return pyarrow.PythonFile(_BytesWriter(self.fs.open(path, mode="ab")), mode="w")
