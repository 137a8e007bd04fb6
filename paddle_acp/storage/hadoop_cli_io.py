"""Pieces of the ``hadoop fs`` client (:mod:`paddle_acp.storage.hadoop_cli`) around a command: what its stderr
means, the local staging directory, and the write stream uploaded when closed."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from typing import Any, Callable, Tuple, Type


class HadoopCliError(OSError):
    """A ``hadoop fs`` command failed; ``args[1]`` holds the command and its stderr tail."""


def classify(stderr: str) -> Tuple[Type[OSError], int]:
    """The OSError subclass (and errno) that fits FsShell's message."""
    s = stderr
    if "No such file or directory" in s or "FileNotFoundException" in s or "does not exist" in s:
        return FileNotFoundError, errno.ENOENT
    if "File exists" in s or "FileAlreadyExistsException" in s or "already exists" in s:
        return FileExistsError, errno.EEXIST
    if "Is a directory" in s:
        return IsADirectoryError, errno.EISDIR
    if "Not a directory" in s or "ParentNotDirectoryException" in s:
        return NotADirectoryError, errno.ENOTDIR
    if "Permission denied" in s or "AccessControlException" in s:
        return PermissionError, errno.EACCES
    if "Connection refused" in s or "ConnectException" in s or "connection exception" in s:
        return ConnectionRefusedError, errno.ECONNREFUSED
    if "No space left" in s or "DSQuotaExceededException" in s or "could only be replicated to 0 nodes" in s:
        return HadoopCliError, errno.ENOSPC
    return HadoopCliError, errno.EIO


def stderr_tail(stderr: str, lines: int = 8) -> str:
    """The informative end of a JVM's stderr: no stack frames, no log4j noise."""
    keep = []
    for line in stderr.splitlines():
        t = line.strip()
        if not t or t.startswith(("at ", "... ", "log4j:")) or "util.NativeCodeLoader" in t:
            continue
        keep.append(t)
    return " | ".join(keep[-lines:]) if keep else "(no output on stderr)"


def staging_dir(cache_dir: str) -> str:
    """A fresh local directory for one transfer's file, under ``cache_dir`` (``PADDLE_EDL_FS_CACHE``)."""
    base = os.path.join(cache_dir, "hdfs-cli")
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        raise HadoopCliError(exc.errno or errno.EIO,
                             f"cannot create the local staging directory {base} (PADDLE_EDL_FS_CACHE): {exc}") from None
    return tempfile.mkdtemp(prefix="stage-", dir=base)


class StagedOutput:
    """A write-only stream into a local temporary file; ``upload(local_file, size)`` stores it on close."""

    def __init__(self, staging_dir: str, upload: Callable[[str, int], None]):
        self.closed = True
        self._upload = upload
        self._dir = staging_dir
        self._local = os.path.join(self._dir, "data")
        try:
            self._f = open(self._local, "wb")
        except OSError:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._pos = 0
        self.closed = False

    # the file-like protocol pyarrow.PythonFile uses
    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    def write(self, data: Any) -> int:
        n = self._f.write(data)
        self._pos += n
        return n

    def flush(self) -> None:
        if not self.closed:
            self._f.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._f.close()
            self._upload(self._local, os.path.getsize(self._local))
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __del__(self) -> None:  # an abandoned stream must not leave its staging file behind
        if not getattr(self, "closed", True):
            try:
                self._f.close()
            finally:
                shutil.rmtree(self._dir, ignore_errors=True)
