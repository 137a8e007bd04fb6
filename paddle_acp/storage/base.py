"""The storage interface: a directory tree under a root, whatever the backend.

Paths are relative, '/'-separated and resolved under the storage root (never ``os.path``). A backend is a subclass
chosen by the URI's scheme (:mod:`paddle_acp.storage.schemes`); what differs between backends is stated by
capabilities (the class attributes of :class:`Storage`, :meth:`Storage.local_path`), never by asking which backend it
is. Every failure is a :class:`~paddle_acp.errors.StorageError` with secrets removed, except a missing file:
``FileNotFoundError`` (callers treat it as "absent")."""

from __future__ import annotations

import abc
import copy
import dataclasses
import posixpath
import stat as _stat
import uuid
from typing import Any, Iterable, Iterator, List, Optional, Protocol, Tuple, Type

from paddle_acp.errors import StorageError
from paddle_acp.secrets import redact, register_secret, register_uri, scrub

__all__ = ["WRITE_CHUNK", "RENAME", "MANIFEST_LAST", "Entry", "Storage",
           "redact", "register_secret", "register_uri", "scrub"]

WRITE_CHUNK = 16 << 20  # largest single write handed to a filesystem (see Storage.write_buffers)


def pieces(buffers: Iterable[Any]) -> Iterator[Any]:
    """``buffers`` as writes of at most ``WRITE_CHUNK`` bytes (a larger one in slices of its bytes)."""
    for buf in buffers:
        mv = memoryview(buf)
        if mv.nbytes <= WRITE_CHUNK:
            yield buf
            continue
        mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
        for i in range(0, mv.nbytes, WRITE_CHUNK):
            yield mv[i:i + WRITE_CHUNK]
RENAME = "rename"  # commit by an atomic rename of a temporary directory into place
MANIFEST_LAST = "manifest-last"  # commit by writing the manifest after the data (object stores)


class OutputStream(Protocol):
    """What :meth:`Storage.open_output` returns (a ``pyarrow.NativeFile`` opened for writing)."""

    def write(self, data: Any) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> Any: ...


class InputFile(Protocol):
    """What :meth:`Storage.open_input` returns (a ``pyarrow.NativeFile`` opened for random access)."""

    def read(self, nbytes: Optional[int] = None) -> bytes: ...
    def readinto(self, buf: Any) -> int: ...
    def seek(self, position: int) -> int: ...
    def size(self) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: object) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    is_dir: bool
    size: int
    mtime: Optional[float]
    is_link: bool = False  # a symbolic link (local disks): never followed, is_dir is False


def kind_of(mode: int) -> str:
    """"file", "dir", "link" or "other" for an ``lstat`` mode."""
    if _stat.S_ISLNK(mode):
        return "link"
    if _stat.S_ISDIR(mode):
        return "dir"
    if _stat.S_ISREG(mode):
        return "file"
    return "other"


READ_PIECE = 1 << 20  # bytes asked of a reader at a time by Storage.read_bytes


class _Reads(Protocol):
    def read(self, nbytes: int, /) -> bytes: ...


def read_pieces(f: _Reads, want: Optional[int]) -> bytes:
    """All of ``f``, or its first ``want`` bytes, read :data:`READ_PIECE` at a time: pyarrow's ``read(n)`` allocates
    ``n`` bytes first (a 64 MB limit for a 30 KB manifest); ``read()`` asks the store for the size (one more call)."""
    pieces: List[bytes] = []
    got = 0
    while want is None or got < want:
        piece = f.read(READ_PIECE if want is None else min(READ_PIECE, want - got))
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)  # b"" when there were none


class Storage(abc.ABC):
    """A directory tree under ``root``; subclasses implement the primitives for one backend."""

    commit_style: str = RENAME  # or MANIFEST_LAST
    errors: Tuple[Type[BaseException], ...] = (OSError,)  # what the backend's client raises on failure
    direct_io: bool = False  # write_image of a page-aligned image bypasses the page cache
    has_symlinks: bool = False  # entries may be symbolic links (never followed inside a job)
    overlap_writes: bool = False  # closing a file waits on a remote acknowledgement: write files at once
    creates_parents: bool = False  # creating a file creates its missing parents (no makedirs needed)
    ranged_readers: int = 4  # connections a restore reads one file on in parallel (ranged reads)
    small_write_s: float = 0.0  # a small write's known wait beyond its round trips (runtime/agree.py's estimate)

    def __init__(self, root: str, uri: str):
        self.root = root.rstrip("/") or "/"
        self.uri = redact(uri)  # what messages show: never the user info or query

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    # -- paths ---------------------------------------------------------------
    def full(self, path: str) -> str:
        """``path`` resolved under the root, as the backend's own client names it."""
        if path in ("", "."):
            return self.root
        if path.startswith("/") or ".." in path.split("/"):
            raise StorageError(f"refusing path outside the storage root: {path!r}")
        return self.root + "/" + path if self.root != "/" else "/" + path

    def local_path(self, path: str) -> Optional[str]:
        """A path the operating system can open for ``path``; None unless a local disk."""
        return None

    def sub(self, path: str) -> "Storage":
        """The same storage (and connection) rooted at ``path`` below this root."""
        other = copy.copy(self)
        other.root = self.full(path)
        other.uri = f"{self.uri}/{path}"
        return other

    def wrap(self, what: str, path: str, exc: BaseException) -> StorageError:
        """A backend failure as the StorageError callers see: what failed, where, why; no secret."""
        return StorageError(scrub(f"{what} {self.uri}/{path} failed: {exc}{self.hint(exc)}"))

    def hint(self, exc: BaseException) -> str:
        """A backend's explanation of an obscure client error (" (...)" or "")."""
        return ""

    # -- primitives every backend implements ----------------------------------
    @abc.abstractmethod
    def makedirs(self, path: str) -> None:
        """Create a directory and its parents; an existing one is fine."""

    @abc.abstractmethod
    def open_output(self, path: str) -> OutputStream:
        """A stream that replaces the file's contents; closing it makes the data durable on the server."""

    @abc.abstractmethod
    def append_bytes(self, path: str, data: bytes) -> None:
        """Append ``data`` to the file; StorageError where that fails or cannot be done (object stores)."""

    @abc.abstractmethod
    def open_input(self, path: str) -> InputFile:
        """A random-access reader (``read``, ``readinto``, ``seek``); FileNotFoundError if missing."""

    @abc.abstractmethod
    def stat(self, path: str) -> Tuple[str, int]:
        """(kind, size) in one call; kind as :meth:`kind` gives it, size 0 unless a file."""

    @abc.abstractmethod
    def listdir(self, path: str) -> List[Entry]:
        """Direct children of ``path``, sorted by name; an empty list when it does not exist."""

    @abc.abstractmethod
    def _delete_dir(self, path: str) -> None:
        """Delete a directory tree; a missing one is fine."""

    @abc.abstractmethod
    def _delete_file(self, path: str) -> None:
        """Delete a file; a missing one is fine."""

    @abc.abstractmethod
    def _rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` (atomic for directories where ``commit_style`` is "rename")."""

    # -- built on the primitives ----------------------------------------------
    def read_bytes(self, path: str, limit: Optional[int] = None) -> bytes:
        """The file's bytes; with ``limit``, at most ``limit + 1`` of them (more: the file is larger)."""
        with self.open_input(path) as f:
            try:
                return read_pieces(f, None if limit is None else limit + 1)
            except self.errors as exc:
                if self._vanished(path):
                    raise FileNotFoundError(scrub(f"{self.uri}/{path} was deleted while it was read")) from None
                raise self.wrap("reading", path, exc) from exc

    def _vanished(self, path: str) -> bool:
        """Whether a file whose read failed was deleted since its open while its directory remains (it then
        reads as missing). Any doubt keeps the read error: libhdfs reports an unanswered call as "not found",
        and an outage must never read as a missing file."""
        doubt: Tuple[Type[BaseException], ...] = (StorageError,) + self.errors
        try:
            return not self.exists(path) and self.exists(posixpath.dirname(path))
        except doubt:
            return False

    def write_bytes(self, path: str, data: bytes) -> None:
        self.write_buffers(path, [data])

    def write_buffers(self, path: str, buffers: Iterable[Any]) -> int:
        """Stream several buffers into one file; returns the bytes written. Writes are at most ``WRITE_CHUNK``
        bytes: libhdfs copies each into one Java byte[] (a 1 GB write on a 256 MB heap: OutOfMemoryError)."""
        total = 0
        out = self.open_output(path)
        try:
            with out:  # closing uploads the rest (remote stores): it fails like a write
                for piece in pieces(buffers):
                    total += out.write(piece)
        except StorageError:
            raise
        except self.errors as exc:
            raise self.wrap("writing", path, exc) from exc
        self.sync(path)
        return total

    def write_image(self, path: str, image: Any, size: int) -> int:
        """Write the first ``size`` bytes of a page-aligned buffer (see :attr:`direct_io`)."""
        return self.write_buffers(path, [memoryview(image).cast("B")[:size]])

    def kind(self, path: str) -> str:
        """"file", "dir", "link" (where :attr:`has_symlinks`), "other" or "missing"."""
        return self.stat(path)[0]

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether anything is at ``path`` (local disks: a link counts as what it points to)."""

    @abc.abstractmethod
    def size(self, path: str) -> int:
        """The size of the file at ``path``; FileNotFoundError when nothing is there."""

    def _refuse_links(self, path: str) -> None:
        """Refuse to delete through (or a) symbolic link below the job directory (the first component, maybe a link)."""
        if not self.has_symlinks or path in ("", "."):
            return
        parts = path.split("/")
        for i in range(2, len(parts) + 1):
            link = "/".join(parts[:i])
            if self.kind(link) == "link":
                raise StorageError(f"refusing to delete {self.uri}/{path}: {link} is a symbolic link "
                                   "(paddle-acp never follows links inside a job; remove the link)")

    def delete_dir(self, path: str) -> None:
        """Delete a directory tree; never through (or below) a symbolic link."""
        self._refuse_links(path)
        self._delete_dir(path)

    def delete_file(self, path: str) -> None:
        """Delete a file; never through a symbolic link (nor the link itself)."""
        self._refuse_links(path)
        self._delete_file(path)

    def rename(self, src: str, dst: str) -> None:
        self._rename(src, dst)
        self.sync_dir(posixpath.dirname(dst))

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists; True when this call created it. Rename-committing
        stores write a temporary file and rename it (a rename that replaces a file is overridden: O_EXCL, HDFS's
        move into the directory); object stores see an existing object, not a concurrent creation (documented)."""
        self.forget_cached(path)
        if self.exists(path):
            return False
        if self.commit_style != RENAME:
            self.write_bytes(path, data)
            return True
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
        self.write_bytes(tmp, data)
        try:
            self.rename(tmp, path)
        except StorageError:
            self.delete_file(tmp)
            self.forget_cached(path)
            if self.exists(path):
                return False
            raise
        return True

    def forget_cached(self, path: str) -> None:
        """Make the next look-up at or under ``path`` bypass a client-side metadata cache (the hadoop CLI's)."""
        return None

    # -- durability (remote stores persist on close) --
    def sync(self, path: str) -> None:
        """Make a written file durable (local disks: fsync)."""
        return None

    def sync_dir(self, path: str) -> None:
        """Make a directory's entries durable (local disks: fsync of the directory)."""
        return None

