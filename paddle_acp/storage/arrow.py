"""The part of every backend that goes through a ``pyarrow.fs.FileSystem``.

:class:`ArrowStorage` implements the :class:`~paddle_acp.storage.base.Storage` primitives on any pyarrow filesystem
and turns every client error into a StorageError; the backends add what is their own."""

from __future__ import annotations

import os
from typing import Any, Callable, List, Tuple, Type, cast

import pyarrow
import pyarrow.fs as pafs

from paddle_acp.errors import StorageError
from paddle_acp.storage import forks
from paddle_acp.storage.base import Entry, InputFile, OutputStream, Storage

_KINDS = {pafs.FileType.File: "file", pafs.FileType.Directory: "dir", pafs.FileType.NotFound: "missing"}


class ArrowStorage(Storage):
    """A directory tree under ``root`` on a ``pyarrow.fs.FileSystem``."""

    errors: Tuple[Type[BaseException], ...] = (OSError, pyarrow.ArrowException)
    fork_safe = True  # False where the client has threads: a forked child never touches it (storage.forks)

    def __init__(self, fs: Any, root: str, uri: str):
        super().__init__(root, uri)
        self._fs = fs
        self._pid = os.getpid()
        if not self.fork_safe:
            forks.track(fs)  # the client itself: copies (``sub``) share it

    @property
    def fs(self) -> Any:
        """The client; in a forked child, a client that is not fork-safe is refused (a call would hang)."""
        if not self.fork_safe and not forks.opened_here(self._pid):
            raise StorageError(f"{self.uri}: this storage was opened by process {self._pid} and this process "
                               f"({os.getpid()}) is a fork of it; its client's threads did not survive the fork, so "
                               "it cannot be used here (open the location again in this process)")
        return self._fs

    def _info(self, path: str) -> Any:
        try:
            return self.fs.get_file_info(self.full(path))
        except self.errors as exc:
            raise self.wrap("checking", path, exc) from exc

    def makedirs(self, path: str) -> None:
        try:
            self.fs.create_dir(self.full(path), recursive=True)
        except self.errors as exc:
            raise self.wrap("creating directory", path, exc) from exc

    def open_output(self, path: str) -> OutputStream:
        try:
            return cast(OutputStream, self.fs.open_output_stream(self.full(path)))
        except self.errors as exc:
            raise self.wrap("opening for write", path, exc) from exc

    def append_bytes(self, path: str, data: bytes) -> None:
        try:
            with self.fs.open_append_stream(self.full(path)) as out:
                out.write(data)
        except (NotImplementedError,) + self.errors as exc:  # object stores cannot append
            raise self.wrap("appending to", path, exc) from exc

    def open_input(self, path: str) -> InputFile:
        try:
            return cast(InputFile, self.fs.open_input_file(self.full(path)))
        except FileNotFoundError:
            raise
        except self.errors as exc:
            raise self.wrap("opening for read", path, exc) from exc

    def stat(self, path: str) -> Tuple[str, int]:
        info = self._info(path)
        kind = _KINDS.get(info.type, "other")
        return kind, (info.size or 0) if kind == "file" else 0

    def exists(self, path: str) -> bool:
        return bool(self._info(path).type != pafs.FileType.NotFound)

    def size(self, path: str) -> int:
        info = self._info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{self.uri}/{path}")
        return int(info.size or 0)

    def listdir(self, path: str) -> List[Entry]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.full(path), allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError) as exc:
            # a directory being created meanwhile (libhdfs: "No such file" despite allow_not_found, hdfs-native:
            # NotADirectoryError), looked at again: missing lists empty, a directory is listed, a file is an error
            kind = self._info(path).type
            if kind == pafs.FileType.NotFound:
                return []
            if kind != pafs.FileType.Directory:
                raise self.wrap("listing", path, exc) from exc
            try:
                infos = self.fs.get_file_info(pafs.FileSelector(self.full(path), allow_not_found=True))
            except self.errors as exc2:
                raise self.wrap("listing", path, exc2) from exc2
        except self.errors as exc:
            raise self.wrap("listing", path, exc) from exc
        out = []
        for info in infos:
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            out.append(Entry(info.base_name, info.type == pafs.FileType.Directory, info.size or 0, mtime))
        return sorted(out, key=lambda e: e.name)

    def _missing(self, path: str) -> bool:
        try:
            return bool(self.fs.get_file_info(self.full(path)).type == pafs.FileType.NotFound)
        except self.errors:
            return False

    def _delete(self, delete: Callable[[str], None], path: str) -> None:
        """``delete`` (the filesystem's delete_dir or delete_file) of ``path``; a missing path is no error."""
        try:
            delete(self.full(path))
        except FileNotFoundError:
            pass
        except self.errors as exc:
            if self._missing(path):  # libhdfs reports a missing path as a plain I/O error
                return
            raise self.wrap("deleting", path, exc) from exc

    def _delete_dir(self, path: str) -> None:
        self._delete(self.fs.delete_dir, path)

    def _delete_file(self, path: str) -> None:
        self._delete(self.fs.delete_file, path)

    def _rename(self, src: str, dst: str) -> None:
        try:
            self.fs.move(self.full(src), self.full(dst))
        except self.errors as exc:
            raise self.wrap(f"renaming to {dst}:", src, exc) from exc

    def forget_cached(self, path: str) -> None:
        handler = getattr(self.fs, "handler", None)
        forget = getattr(handler, "forget", None)
        if forget is not None:
            forget(self.full(path))

