"""Whether a node-local cache copy can be trusted: nobody but the job's user could have written it.

A checkpoint's CRC32C checksums catch damage, not edits: anyone who can write a cached copy can
change its tensors and fix the checksums up. So a copy is restored from only when, like ssh's
``StrictModes`` for its keys, every path from the cache root down to the copy's files is owned
by the effective user (or root), writable by nobody else (no group or other write bit), and no
symbolic link (the cache root itself is resolved once: it is the user's own setting). Otherwise
the remote is read; :func:`untrusted` says why, for the one log line.
"""

from __future__ import annotations

import os
import stat
from typing import Iterable, Optional


def _why(path: str, euid: int) -> Optional[str]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:  # nothing to trust or distrust: the reader finds the copy incomplete
        return None  # (and nobody else can add it: its directory passed this check first)
    except OSError as exc:
        return f"{path} cannot be checked ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid not in (euid, 0):
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {euid}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit)
        return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def untrusted(root: str, rel_dir: str, files: Iterable[str]) -> Optional[str]:
    """None when the copy ``root/rel_dir`` and its ``files`` could have been written by this user
    only; otherwise why not (the first path that fails, and how). ``root``: the cache root
    (``PADDLE_ACP_LOCAL_CACHE``); ``rel_dir``: the copy's directory below it, ``/``-separated."""
    euid = os.geteuid()
    path = os.path.realpath(root)
    why = _why(path, euid)
    if why is not None:
        return why
    for part in [p for p in rel_dir.split("/") if p]:
        if part in (".", ".."):
            return f"{rel_dir!r} is not a plain path below the cache root"
        path = os.path.join(path, part)
        why = _why(path, euid)
        if why is not None:
            return why
    for name in files:
        why = _why(os.path.join(path, name), euid)
        if why is not None:
            return why
    return None


def _harden_one(path: str, euid: int) -> bool:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return False
    if st.st_uid == euid and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
    return True


def harden(root: str, rel_dir: str, files: Iterable[str] = ()) -> None:
    """Take group and other write bits off what this user owns below ``root`` down to ``rel_dir`` and its ``files``
    (a umask of 002 must not make every copy untrusted). Best effort: :func:`untrusted` refuses what is left."""
    euid = os.geteuid()
    path = root
    try:
        for part in [p for p in rel_dir.split("/") if p]:
            path = os.path.join(path, part)
            if not _harden_one(path, euid):
                return
        for name in files:
            _harden_one(os.path.join(path, name), euid)
    except OSError:
        return
