"""libhdfs's own calls, through ctypes on the library (and JVM) pyarrow loaded: one NameNode RPC each.

pyarrow's listing costs 3 NameNode RPCs (``exists``, ``getFileInfo``, ``getListing``), ``hdfsListDirectory`` one;
its look-up 2 (``exists``, then ``getFileInfo``), ``hdfsExists`` one; its directory delete 3 (a look-up, then
``delete``), ``hdfsDelete`` one. Made only where pyarrow's libhdfs is loaded in this process; any surprise (no such
library, a name that is not UTF-8) leaves the call to pyarrow."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.storage.base import Entry

logger = logging.getLogger("paddle_acp")


class _FileInfo(ctypes.Structure):
    """libhdfs's ``hdfsFileInfo`` (hdfs.h, unchanged since Hadoop 2)."""

    _fields_ = [("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("last_mod", ctypes.c_long),
                ("size", ctypes.c_int64), ("replication", ctypes.c_short), ("block_size", ctypes.c_int64),
                ("owner", ctypes.c_char_p), ("group", ctypes.c_char_p), ("permissions", ctypes.c_short),
                ("last_access", ctypes.c_long)]


class LibhdfsCalls:
    """Listings, look-ups and deletes on one NameNode as one user, one RPC each (a restart lists 3 times)."""

    _cache: Dict[Tuple[int, str, int, Optional[str]], Optional["LibhdfsCalls"]] = {}
    _cache_lock = threading.Lock()

    def __init__(self, lib: Any, handle: int):
        self._lib = lib
        self._handle = ctypes.c_void_p(handle)

    @classmethod
    def connect(cls, host: str, port: int, user: Optional[str], conf: Dict[str, str]) -> Optional["LibhdfsCalls"]:
        """The process's lister for this NameNode and user (never disconnected: Hadoop's FileSystem cache shares
        its client), or None where none can be made. A forked child makes its own (:mod:`.forks`)."""
        key = (os.getpid(), host, port, user)
        with cls._cache_lock:
            if key not in cls._cache:
                try:
                    cls._cache[key] = cls._connect(host, port, user, conf)
                except (OSError, AttributeError, ValueError) as exc:
                    logger.debug("HDFS listings go through pyarrow: %s", exc)
                    cls._cache[key] = None
            return cls._cache[key]

    @classmethod
    def _connect(cls, host: str, port: int, user: Optional[str], conf: Dict[str, str]) -> Optional["LibhdfsCalls"]:
        path = _loaded_libhdfs()
        if path is None:
            return None
        lib = ctypes.CDLL(path, use_errno=True)  # the loaded library itself (dlopen of a loaded path)
        lib.hdfsNewBuilder.restype = ctypes.c_void_p
        lib.hdfsBuilderSetNameNode.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.hdfsBuilderSetNameNodePort.argtypes = [ctypes.c_void_p, ctypes.c_uint16]
        lib.hdfsBuilderSetUserName.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.hdfsBuilderConfSetStr.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
        lib.hdfsBuilderConnect.argtypes = [ctypes.c_void_p]
        lib.hdfsBuilderConnect.restype = ctypes.c_void_p
        lib.hdfsListDirectory.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
        lib.hdfsListDirectory.restype = ctypes.POINTER(_FileInfo)
        lib.hdfsFreeFileInfo.argtypes = [ctypes.POINTER(_FileInfo), ctypes.c_int]
        lib.hdfsExists.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.hdfsDelete.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        builder = lib.hdfsNewBuilder()
        if not builder:
            return None
        strings = [host.encode(), user.encode() if user else b""]  # (shallow-copied: alive until the connect)
        lib.hdfsBuilderSetNameNode(builder, strings[0])
        lib.hdfsBuilderSetNameNodePort(builder, port)
        if user:
            lib.hdfsBuilderSetUserName(builder, strings[1])
        for k, v in conf.items():
            strings += [k.encode(), v.encode()]
            lib.hdfsBuilderConfSetStr(builder, strings[-2], strings[-1])
        handle = lib.hdfsBuilderConnect(builder)  # (frees the builder)
        return cls(lib, handle) if handle else None

    def list(self, full: str) -> Optional[List[Entry]]:
        """The entries of directory ``full``: [] when it is missing or empty; None where pyarrow should list it."""
        count = ctypes.c_int(0)
        ctypes.set_errno(0)
        infos = self._lib.hdfsListDirectory(self._handle, full.encode(), ctypes.byref(count))
        if not infos:
            err = ctypes.get_errno()
            if err in (0, errno.ENOENT):
                return []
            raise OSError(err, f"libhdfs could not list it: {os.strerror(err)}")
        try:
            got = [infos[i] for i in range(count.value)]
            names = [(info.name or b"").decode() for info in got]
            base = full.rstrip("/") or "/"
            if len(got) == 1 and got[0].kind != ord("D") and _path_of(names[0]) == base:
                raise NotADirectoryError(f"{full} is a file")  # HDFS lists a file as itself
            return [Entry(name.rstrip("/").rpartition("/")[2], info.kind == ord("D"),
                          0 if info.kind == ord("D") else int(info.size), float(info.last_mod))
                    for name, info in zip(names, got)]
        except UnicodeDecodeError:
            return None
        finally:
            self._lib.hdfsFreeFileInfo(infos, count.value)


    def exists(self, full: str) -> bool:
        """Whether anything is at ``full`` (``hdfsExists``: -1 with ENOENT when nothing is; another errno: the
        call failed, raised, where pyarrow would read an outage as absence)."""
        ctypes.set_errno(0)
        if self._lib.hdfsExists(self._handle, full.encode()) == 0:
            return True
        err = ctypes.get_errno()
        if err in (0, errno.ENOENT):
            return False
        raise OSError(err, f"libhdfs could not look it up: {os.strerror(err)}")

    def delete(self, full: str) -> bool:
        """Delete ``full`` and all below it; False when nothing was deleted (missing, or the call failed: the
        caller looks, as for pyarrow's delete)."""
        return int(self._lib.hdfsDelete(self._handle, full.encode(), 1)) == 0


def _path_of(name: str) -> str:
    """The path of a listed name (``hdfs://host:port/a/b`` -> ``/a/b``)."""
    if "://" in name:
        name = name.split("://", 1)[1]
        name = "/" + name.split("/", 1)[1] if "/" in name else "/"
    return name.rstrip("/") or "/"


def _loaded_libhdfs() -> Optional[str]:
    """The path of the libhdfs this process loaded (pyarrow's), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if os.path.basename(path).startswith("libhdfs.so"):
                    return path
    except OSError:
        return None
    return None
