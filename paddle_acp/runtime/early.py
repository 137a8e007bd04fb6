"""Early connection: owns the storage a process opens in the background from its import, for its first range.

Opening HDFS (libhdfs's JVM) takes about a second per process. :func:`start` (when the package activates, after
Paddle's import, so the JVM installs its signal handlers after Paddle's) opens the configured location on a
background thread while the script builds its programs; :func:`take` hands it to the first range that opens the
same location with the same settings. A failed connection raises the error the range's own open would; one to
another location is dropped unused. ``PADDLE_ACP_CONNECT_EARLY=0`` switches it off; only
:data:`~paddle_acp.storage.schemes.SLOW_TO_OPEN` schemes are opened early. At exit a connection still being
made is waited for at most :data:`EXIT_WAIT` seconds; a forked child forgets it without dropping it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Optional

from paddle_acp import config as _config
from paddle_acp.errors import AcpError
from paddle_acp.storage import forks
from paddle_acp.storage.base import Storage
from paddle_acp.storage.schemes import open_storage, slow_to_open

logger = logging.getLogger("paddle_acp")


class _Early:
    """One background connection: the location and settings it was opened with, its storage once opened."""

    def __init__(self, cfg: _config.CheckpointConfig) -> None:
        self.key = (cfg.uri, cfg.storage)  # what must match for a range to use it: location, every setting
        self.timeout = cfg.storage.connect_timeout
        self.storage: Optional[Storage] = None
        self.error: Optional[AcpError] = None  # the open's own error (the range's open would raise the same)
        self.thread = threading.Thread(target=self._open, args=(cfg,), name="paddle-acp-connect-early", daemon=True)

    def _open(self, cfg: _config.CheckpointConfig) -> None:
        try:
            assert cfg.uri is not None
            self.storage = open_storage(cfg.uri, cfg.storage)
        except AcpError as exc:  # a StorageError naming the location: the range raises it
            self.error = exc
        except Exception:  # anything else: the range opens the storage itself and reports its own error
            logger.debug("the early connection failed unexpectedly; the first range connects itself")


_lock = threading.Lock()
_slot: Optional[_Early] = None  # not taken yet
_started: Optional[_Early] = None  # the last one started, taken or not (waited for at exit)


def start() -> bool:
    """Open the environment's checkpoint location in the background where it is slow to open (whether one was
    started). Never raises: a bad setting is the range's to report."""
    global _slot, _started
    try:
        if not _config.connect_early_from_env():
            return False
        cfg = _config.from_env()
    except Exception:  # a ConfigError: reported by the range that reads it
        return False
    if cfg.uri is None or not slow_to_open(cfg.uri):
        return False
    with _lock:
        if _slot is not None:
            return False
        _slot = _started = _Early(cfg)
        _slot.thread.start()
    logger.debug("connecting to the checkpoint location in the background")
    return True


def take(cfg: _config.CheckpointConfig) -> Optional[Storage]:
    """The early connection for ``cfg`` (taken once), or None; raises the storage error its open raised (a retry
    would double the wait). Always waits for a connection still being made, even one not used: the JVM's
    signal handlers must be installed before the range's."""
    global _slot
    with _lock:
        early, _slot = _slot, None
    if early is None:
        return None
    early.thread.join()
    if early.key != (cfg.uri, cfg.storage):
        return None
    if early.error is not None:
        raise early.error
    return early.storage


def forget() -> None:
    """Drop an early connection not taken yet (a restart's reset, a forked child)."""
    global _slot
    with _lock:
        _slot = None


# the longest exit waits for a connection still being made: a JVM's start finishes, a mute NameNode does not hold it
EXIT_WAIT = 1.5


def _wait_at_exit() -> None:
    early = _started
    if early is not None and early.thread.is_alive():
        early.thread.join(min(EXIT_WAIT, early.timeout))
        if early.thread.is_alive():
            logger.debug("exiting while the early connection is still being made (no answer within %g s)", EXIT_WAIT)


def _after_fork_in_child() -> None:
    # no lock taken (another thread may have held it at the fork); the parent's connection is never dropped
    global _lock, _slot, _started
    for early in {id(e): e for e in (_slot, _started) if e is not None}.values():
        forks.keep_forever(early)
    _lock, _slot, _started = threading.Lock(), None, None


atexit.register(_wait_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
