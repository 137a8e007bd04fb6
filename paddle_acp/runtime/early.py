"""Early connection: owns the storage a process opens in the background from its import, for its first range.

Opening HDFS starts libhdfs's JVM and connects: about a second per process, on the training thread
when a range opens (``docs/performance.md``, issue 28). A script imports paddle-acp, then builds its
programs and runs its startup program before its epoch loop; :func:`start` (called when the package
activates, after the version gate has imported Paddle, so the JVM installs its signal handlers after
Paddle's, in the order a range's own connection has them) opens the configured location on a
background thread meanwhile, and :func:`take` hands that storage to the first range that opens the
same location with the same settings.

Nothing here changes what a range does with its storage or reports: a connection that failed raises
the error the range's own open would (the same call), and one to another location or with other
settings is dropped unused (the range opens its storage itself). Until the range opens, Ctrl-C and
SIGTERM reach the JVM's handlers once it has started (it ends the process, as their default would);
the range installs its own handlers after it, as it does after its own connection.
``PADDLE_ACP_CONNECT_EARLY=0`` switches it off. Only the schemes of
:data:`~paddle_acp.storage.schemes.SLOW_TO_OPEN` are opened early (a local directory or S3 opens in
milliseconds). At interpreter exit a connection still being made is waited for at most :data:`EXIT_WAIT` seconds, so a
short script does not exit in the middle of a JVM's start, nor waits for a NameNode that never answers; a
forked child forgets the parent's connection without dropping it (:mod:`paddle_acp.storage.forks`: its
client's threads do not exist in the child).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any, Optional, Tuple

from paddle_acp import config as _config
from paddle_acp.errors import AcpError
from paddle_acp.storage import forks
from paddle_acp.storage.base import Storage
from paddle_acp.storage.schemes import open_storage, slow_to_open

logger = logging.getLogger("paddle_acp")


class _Early:
    """One background connection: the location and settings it was opened with, its storage once opened."""

    def __init__(self, cfg: _config.CheckpointConfig) -> None:
        self.key = key_of(cfg)
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


def key_of(cfg: _config.CheckpointConfig) -> Tuple[Any, ...]:
    """What must match for a range to use an early connection: the location and every storage setting."""
    return (cfg.uri, cfg.storage)


def start() -> bool:
    """Open the environment's checkpoint location in the background, where it is remote and slow to open
    and early connections are on. Never raises (a bad setting is the range's to report). Whether one
    was started."""
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
    """The early connection for ``cfg``, or None: none was started, it is for another location or other
    settings, or it failed unexpectedly. Taken once; raises the storage error its open raised (the same
    call with the same settings: retrying would double the wait for a server that does not answer).

    Always waits for a connection still being made (bounded by ``PADDLE_ACP_CONNECT_TIMEOUT``), even one
    not used: libhdfs's JVM installs its handlers of SIGTERM and SIGINT when it starts, and the range
    installs its own after it (a JVM starting later would take the preemption signal from the range)."""
    global _slot
    with _lock:
        early, _slot = _slot, None
    if early is None:
        return None
    early.thread.join()
    if early.key != key_of(cfg):
        return None
    if early.error is not None:
        raise early.error
    return early.storage


def forget() -> None:
    """Drop an early connection not taken yet (a restart's reset, a forked child)."""
    global _slot
    with _lock:
        _slot = None


# the longest exit waits for a connection still being made: long enough for a JVM's start in progress to
# finish (a short script never exits in its middle), short enough that a NameNode that accepts and never
# answers does not hold the exit (the connection's own bound, PADDLE_ACP_CONNECT_TIMEOUT, is 30 s)
EXIT_WAIT = 1.5


def _wait_at_exit() -> None:
    early = _started
    if early is not None and early.thread.is_alive():
        early.thread.join(min(EXIT_WAIT, early.timeout))
        if early.thread.is_alive():
            logger.debug("exiting while the early connection is still being made (no answer within %g s)", EXIT_WAIT)


def _after_fork_in_child() -> None:
    # no lock taken here: another thread of the parent may have held it at the fork; the parent's connection
    # is kept, never dropped (its client's destructor would wait for threads the child does not have)
    global _lock, _slot, _started
    for early in {id(e): e for e in (_slot, _started) if e is not None}.values():
        forks.keep_forever(early)
    _lock, _slot, _started = threading.Lock(), None, None


atexit.register(_wait_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
