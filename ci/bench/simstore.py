"""A simulated remote store for BENCHMARKS ONLY (``sim://`` URIs); not a product backend.

Why: this project's machine has 2 cores, and a real HDFS or S3 server on it takes the training's
cores (its JVMs write every byte a second time on the same CPUs). A store on other hosts costs the
training host nothing but waiting. This backend keeps the bytes in a local directory and makes every
call wait like a remote one, without using CPU (``time.sleep`` releases the GIL and burns nothing):

* ``latency_ms``: every storage call (open, close, stat, list, rename, delete, mkdir, a ranged read)
  waits this long first (one round trip);
* ``client_mbps``: each client (one process: a rank) moves at most this many MB/s (10**6 bytes),
  shared by all its threads, each direction (read, write) on its own;
* ``aggregate_mbps``: all clients of one store together move at most this many MB/s per direction
  (the store's or network's limit), coordinated between processes through a small file beside the
  store's directory (``<dir>.simlink``: two big-endian doubles, the times at which the link is
  free next for writes and for reads, on the host's monotonic clock; guarded by ``flock``);
* ``commit``: ``rename`` (a directory rename is the atomic commit, like HDFS; appends work) or
  ``manifest-last`` (like S3: the manifest written after the data is the commit, appends fail,
  exclusive creation is look-then-write, as pyarrow's S3 offers it).

A transfer is cut into pieces of ``CHUNK`` bytes; each piece reserves its slot on the client's and
the aggregate link (first free time, FIFO), does the real local I/O, then sleeps until the later of
its two slots ends. The local disk's own time is thus hidden inside the simulated time whenever the
simulated link is slower than the disk. The data file of a checkpoint is written with ``O_DIRECT``
underneath (little CPU), small files through the page cache; nothing is fsync-ed (a remote store's
durability is its own business; its time is the simulated one). Restores read through
``open_input`` (no local path is offered), as from a remote store.

With ``ACP_SIM_TRACE=<dir>`` in a process's environment every storage call it makes is appended to
``<dir>/trace-<rank>-<pid>.jsonl`` (operation, path, wall-clock start and end, thread):
``ci/bench/persist_trace.py`` splits a benchmark's persists into their steps from it.

Options come from the environment (``ACP_SIM_LATENCY_MS``, ``ACP_SIM_CLIENT_MBPS``,
``ACP_SIM_AGGREGATE_MBPS``, ``ACP_SIM_COMMIT``; 0 = no limit) and may be overridden per URI by its
query (``sim:///abs/dir?latency_ms=2&client_mbps=500``). Register it in every process that opens
such URIs: ``simstore.register()`` (benchmark scripts), or run any training script through
``python ci/bench/simstore.py run SCRIPT ARGS...``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import runpy
import struct
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple
from urllib.parse import ParseResult, parse_qsl, unquote, urlencode

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from paddle_acp.errors import ConfigError  # noqa: E402
from paddle_acp.storage.base import MANIFEST_LAST, RENAME, Entry, InputFile, OutputStream, Storage  # noqa: E402
from paddle_acp.storage.local import LocalStorage  # noqa: E402

SCHEME = "sim"
_PAGE = 4096
CHUNK = 4 << 20  # bytes per reserved slot (small enough that concurrent clients interleave fairly)
ENV = {"latency_ms": "ACP_SIM_LATENCY_MS", "client_mbps": "ACP_SIM_CLIENT_MBPS",
       "aggregate_mbps": "ACP_SIM_AGGREGATE_MBPS", "commit": "ACP_SIM_COMMIT"}
WRITE, READ = 0, 1
_LINK = struct.Struct(">dd")  # the aggregate link file: next free time for writes, for reads


@dataclasses.dataclass(frozen=True)
class SimOptions:
    latency_ms: float = 0.0
    client_mbps: float = 0.0  # 0: no per-client cap
    aggregate_mbps: float = 0.0  # 0: no aggregate cap
    commit: str = RENAME

    def __post_init__(self) -> None:
        for name in ("latency_ms", "client_mbps", "aggregate_mbps"):
            v = getattr(self, name)
            if not isinstance(v, float) or not v >= 0.0 or v == float("inf"):
                raise ConfigError(f"sim store option {name}={v!r}: a finite number >= 0")
        if self.commit not in (RENAME, MANIFEST_LAST):
            raise ConfigError(f"sim store option commit={self.commit!r}: {RENAME!r} or {MANIFEST_LAST!r}")

    def query(self) -> str:
        """These options as a URI query (``parse_options`` reads it back)."""
        return urlencode([(k, repr(getattr(self, k)) if k != "commit" else self.commit) for k in ENV])

    def describe(self) -> str:
        """One line for a figure's caption."""
        def mbps(v: float) -> str:
            return "unlimited" if v == 0 else f"{v:g} MB/s"
        return (f"simulated remote store (ci/bench/simstore.py): {self.latency_ms:g} ms per call, per-client "
                f"{mbps(self.client_mbps)}, aggregate {mbps(self.aggregate_mbps)}, {self.commit} commits")


def parse_options(query: str, env: Optional[Mapping[str, str]] = None) -> SimOptions:
    """Options from ``env`` (default: os.environ), overridden by the URI ``query``."""
    env = os.environ if env is None else env
    raw: Dict[str, str] = {k: env[v] for k, v in ENV.items() if env.get(v, "").strip()}
    for k, v in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if k not in ENV:
            raise ConfigError(f"sim store: unknown option {k!r} (known: {', '.join(ENV)})")
        raw[k] = v
    vals: Dict[str, Any] = {}
    for k, v in raw.items():
        if k == "commit":
            vals[k] = v.strip()
            continue
        try:
            vals[k] = float(v)
        except ValueError:
            raise ConfigError(f"sim store option {k}={v!r}: not a number") from None
    return SimOptions(**vals)


# -- the links: when may the next piece go ----------------------------------------------------
_client_lock = threading.Lock()
_client_next = [0.0, 0.0]  # this process's link, per direction


def pack_link(next_write: float, next_read: float) -> bytes:
    return _LINK.pack(next_write, next_read)


def unpack_link(raw: bytes) -> Tuple[float, float]:
    """The aggregate link's state; anything but one well-formed record (a new or torn file) reads as
    "free now" (0.0): the simulation then under-delays once, never blocks for ever."""
    if len(raw) != _LINK.size:
        return 0.0, 0.0
    a, b = _LINK.unpack(raw)
    ok = [v if v == v and 0.0 <= v < float("inf") else 0.0 for v in (a, b)]
    return ok[0], ok[1]


class Links:
    """The per-client and the aggregate link of one store, for one process."""

    def __init__(self, opts: SimOptions, link_file: str):
        self.opts = opts
        self.link_file = link_file

    def reserve(self, direction: int, nbytes: int) -> float:
        """Reserve the slots of a piece of ``nbytes``; returns when it has arrived (monotonic)."""
        now = time.monotonic()
        end = now
        if self.opts.client_mbps > 0:
            with _client_lock:
                start = max(now, _client_next[direction])
                _client_next[direction] = start + nbytes / (self.opts.client_mbps * 1e6)
                end = max(end, _client_next[direction])
        if self.opts.aggregate_mbps > 0:
            fd = os.open(self.link_file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                state = list(unpack_link(os.pread(fd, _LINK.size, 0)))
                start = max(now, state[direction])
                state[direction] = start + nbytes / (self.opts.aggregate_mbps * 1e6)
                os.pwrite(fd, pack_link(state[0], state[1]), 0)
                end = max(end, state[direction])
            finally:
                os.close(fd)  # releases the lock
        return end

    def round_trip(self) -> None:
        if self.opts.latency_ms > 0:
            time.sleep(self.opts.latency_ms / 1000.0)


def sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def pieces(data: Any) -> Iterator[memoryview]:
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    for i in range(0, mv.nbytes, CHUNK):
        yield mv[i:i + CHUNK]


class SimOutput:
    """A write stream whose bytes arrive at the simulated link's speed; closing costs a round trip."""

    def __init__(self, inner: Any, links: Links):
        self.inner, self.links = inner, links

    def write(self, data: Any) -> int:
        n = 0
        for piece in pieces(data):
            end = self.links.reserve(WRITE, piece.nbytes)
            n += self.inner.write(piece)
            sleep_until(end)
        return n

    def close(self) -> None:
        self.inner.close()
        self.links.round_trip()  # the store acknowledges the file

    def __enter__(self) -> "SimOutput":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SimInput:
    """A random-access reader at the simulated link's speed (a ranged read costs a round trip)."""

    def __init__(self, inner: Any, links: Links):
        self.inner, self.links = inner, links

    def _paced(self, nbytes: int, offset: Optional[int] = None) -> float:
        """Reserve the link for the bytes a read of ``nbytes`` (at ``offset``; default: the position)
        gets: never past the file's end (a remote store sends what there is, not what was asked for;
        charging the ask cost every small file's read ~30 ms at 100 MB/s: read_bytes asks for 1 MB pieces)."""
        at = self.inner.tell() if offset is None else offset
        nbytes = max(0, min(nbytes, self.inner.size() - at))
        return self.links.reserve(READ, nbytes) if nbytes else time.monotonic()

    def read(self, nbytes: Optional[int] = None) -> bytes:
        if nbytes is None:
            nbytes = self.inner.size() - self.inner.tell()
        out = []
        while nbytes > 0:
            end = self._paced(min(nbytes, CHUNK))
            b = self.inner.read(min(nbytes, CHUNK))
            sleep_until(end)
            if not b:
                break
            out.append(b)
            nbytes -= len(b)
        return b"".join(out)

    def readinto(self, buf: Any) -> int:
        total = 0
        for piece in pieces(buf):
            end = self._paced(piece.nbytes)
            n = self.inner.readinto(piece)
            sleep_until(end)
            total += n
            if n < piece.nbytes:
                break
        return total

    def read_at(self, nbytes: int, offset: int) -> bytes:
        self.links.round_trip()
        end = self._paced(nbytes, offset)
        b = self.inner.read_at(nbytes, offset)
        sleep_until(end)
        return bytes(b)

    def seek(self, position: int, whence: int = 0) -> int:
        return int(self.inner.seek(position, whence))

    def tell(self) -> int:
        return int(self.inner.tell())

    def size(self) -> int:
        return int(self.inner.size())

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> "SimInput":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SimStorage(LocalStorage):
    """Bytes in a local directory; calls and transfers timed like a store on other hosts."""

    direct_io = False  # as a remote store: no page cache to bypass (the data file still goes O_DIRECT below)
    has_symlinks = False
    overlap_writes = True  # closing a file waits for the store's acknowledgement (a round trip)

    def __init__(self, root: str, uri: str, opts: SimOptions):
        super().__init__(root, uri)
        self.opts = opts
        self.commit_style = opts.commit
        self.links = Links(opts, root.rstrip("/") + ".simlink")

    @classmethod
    def from_uri(cls, uri: str, parsed: ParseResult, options: object = None) -> "SimStorage":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ConfigError("sim store URI: sim:///absolute/dir[?options] (a directory on this machine)")
        if parsed.fragment:
            raise ConfigError("sim store URI: no fragment")
        root = os.path.abspath(unquote(parsed.path))
        os.makedirs(root, exist_ok=True)
        return cls(root, uri, parse_options(parsed.query))

    def local_path(self, path: str) -> Optional[str]:
        return None  # remote: read through streams, never mapped

    # -- calls: one round trip each ------------------------------------------------------
    def makedirs(self, path: str) -> None:
        self.links.round_trip()
        super().makedirs(path)

    def _parents(self, path: str) -> None:
        """An object store has no directories: a key's "parents" exist once it does."""
        if self.commit_style != RENAME and "/" in path:
            os.makedirs(os.path.dirname(self.full(path)), exist_ok=True)

    def open_output(self, path: str) -> OutputStream:
        self.links.round_trip()
        self._parents(path)
        return SimOutput(super().open_output(path), self.links)  # type: ignore[return-value]

    def open_input(self, path: str) -> InputFile:
        self.links.round_trip()
        return SimInput(super().open_input(path), self.links)  # type: ignore[return-value]

    def append_bytes(self, path: str, data: bytes) -> None:
        self.links.round_trip()
        if self.commit_style != RENAME:
            raise self.wrap("appending to", path, NotImplementedError("an object store cannot append"))
        end = self.links.reserve(WRITE, len(data))
        super().append_bytes(path, data)
        sleep_until(end)

    def read_bytes(self, path: str, limit: Optional[int] = None) -> bytes:
        return Storage.read_bytes(self, path, limit)  # through open_input: timed

    def stat(self, path: str) -> Tuple[str, int]:
        self.links.round_trip()
        return super().stat(path)

    def exists(self, path: str) -> bool:
        self.links.round_trip()
        return super().exists(path)

    def size(self, path: str) -> int:
        self.links.round_trip()
        return super().size(path)

    def listdir(self, path: str) -> List[Entry]:
        self.links.round_trip()
        return super().listdir(path)

    def _delete_dir(self, path: str) -> None:
        self.links.round_trip()
        super()._delete_dir(path)

    def _delete_file(self, path: str) -> None:
        self.links.round_trip()
        super()._delete_file(path)

    def _rename(self, src: str, dst: str) -> None:
        self.links.round_trip()
        super()._rename(src, dst)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        if self.commit_style != RENAME:  # what pyarrow's S3 offers: look, then write
            return Storage.create_exclusive(self, path, data)
        self.links.round_trip()
        return super().create_exclusive(path, data)

    # -- data: paced; the big image goes O_DIRECT underneath -------------------------------
    def write_image(self, path: str, image: Any, size: int) -> int:
        """Piece by piece at the link's pace; underneath ``O_DIRECT`` where the buffer allows it
        (a checkpoint's arena is page-aligned), so the local copy costs little CPU."""
        self.links.round_trip()  # open
        self._parents(path)
        mv = memoryview(image).cast("B")
        try:
            written = self._paced_image(self.full(path), mv, size)
        except OSError as exc:
            raise self.wrap("writing", path, exc) from exc
        self.links.round_trip()  # close: the store acknowledges
        return written

    @staticmethod
    def _open_image(full: str, direct: bool, truncate: bool) -> int:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0) | (os.O_DIRECT if direct else 0)
        return os.open(full, flags, 0o644)

    def _paced_image(self, full: str, mv: memoryview, size: int) -> int:
        padded = min(len(mv), (size + _PAGE - 1) // _PAGE * _PAGE)
        direct = hasattr(os, "O_DIRECT")
        try:
            fd = self._open_image(full, direct, True)
        except OSError:
            direct = False
            fd = self._open_image(full, False, True)
        try:
            pos = 0
            while pos < size:
                n = min(CHUNK, (padded if direct else size) - pos)
                end = self.links.reserve(WRITE, min(n, size - pos))
                try:
                    w = os.pwrite(fd, mv[pos:pos + n], pos)
                except OSError:
                    if not direct:
                        raise
                    os.close(fd)  # the buffer or filesystem refuses O_DIRECT: buffered from here on
                    direct, fd = False, self._open_image(full, False, False)
                    w = os.pwrite(fd, mv[pos:pos + min(n, size - pos)], pos)
                if w <= 0:
                    raise OSError("write made no progress")
                sleep_until(end)
                pos += w
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        return size

    def sync(self, path: str) -> None:
        return None  # durable on close at the store (simulated)

    def sync_dir(self, path: str) -> None:
        return None


# -- a trace of every call, for benchmarks that split a persist into its steps ------------------
TRACE_ENV = "ACP_SIM_TRACE"  # a directory: each process appends one JSON line per storage call to a file there
_TRACED = {SimStorage: ("makedirs", "open_output", "open_input", "append_bytes", "stat", "exists", "size", "listdir",
                        "_delete_dir", "_delete_file", "_rename", "create_exclusive", "write_image"),
           SimOutput: ("close",), SimInput: ("read_at",)}
_trace_lock = threading.Lock()


def _traced(op: str, fn: Any, out: str) -> Any:
    def call(self: Any, *a: Any, **k: Any) -> Any:
        t0 = time.time()
        try:
            return fn(self, *a, **k)
        finally:
            t1 = time.time()
            line = json.dumps({"op": op, "path": str(a[0]) if a and isinstance(a[0], str) else "", "t0": t0, "t1": t1,
                               "thread": threading.current_thread().name}) + "\n"
            with _trace_lock, open(out, "a") as f:
                f.write(line)
    return call


def trace_calls(directory: str) -> None:
    """Record every storage call of this process (``op``, ``path``, wall-clock ``t0``/``t1``, ``thread``)
    in ``directory/trace-<rank>-<pid>.jsonl`` (``ACP_SIM_TRACE``): cheap (one small append per call)."""
    os.makedirs(directory, exist_ok=True)
    out = os.path.join(directory, f"trace-{os.environ.get('PADDLE_TRAINER_ID', '0')}-{os.getpid()}.jsonl")
    for cls, names in _TRACED.items():
        for name in names:
            if not getattr(getattr(cls, name), "_acp_traced", False):
                fn = _traced(name.lstrip("_") if cls is SimStorage else f"{cls.__name__}.{name}", getattr(cls, name), out)
                fn._acp_traced = True
                setattr(cls, name, fn)


def register() -> None:
    """Serve ``sim://`` URIs in this process (``ACP_SIM_TRACE`` set: with a trace of every call, :func:`trace_calls`)."""
    from paddle_acp.storage.schemes import register_backend

    register_backend(SCHEME, SimStorage.from_uri)
    if os.environ.get(TRACE_ENV):
        trace_calls(os.environ[TRACE_ENV])


def uri(directory: str, opts: Optional[SimOptions] = None) -> str:
    """A ``sim://`` URI for ``directory`` (with ``opts`` as its query)."""
    base = f"{SCHEME}://{os.path.abspath(directory)}"
    return f"{base}?{opts.query()}" if opts is not None else base


def run_script(argv: List[str]) -> None:
    """``python ci/bench/simstore.py run SCRIPT ARGS...``: run a training script with ``sim://`` registered."""
    if not argv:
        raise SystemExit("usage: python ci/bench/simstore.py run SCRIPT [ARGS...]")
    register()
    script = os.path.abspath(argv[0])
    sys.argv = [script] + argv[1:]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "run":
        run_script(sys.argv[2:])
    else:
        raise SystemExit(__doc__)
