"""Process state: everything paddle-acp remembers between ranges of one process, in one object.

A restart (and :func:`paddle_acp.simulate_restart`) starts from a fresh :class:`ProcessState`. Not here: the
``Executor.run`` patch (:mod:`paddle_acp.runtime.hook`), which a restart does not undo.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

from paddle_acp.config import CheckpointConfig
from paddle_acp.errors import CheckpointError
from paddle_acp.format.checkpoints.cache import LocalCache
from paddle_acp.format.checkpoints.cache_key import canonical_location
from paddle_acp.format.commit.fencing import Fence
from paddle_acp.storage.base import Storage

logger = logging.getLogger("paddle_acp")


def location_of(storage: Storage) -> str:
    """One name per place, however its URI is spelled: a local root's real path, else the URI's canonical form."""
    local = storage.local_path("")
    return os.path.realpath(local) if local is not None else canonical_location(storage.uri)


class ProcessState:
    """The process-wide state of the runtime layer (one instance: :data:`STATE`)."""

    def __init__(self) -> None:
        # the range whose loop runs now (typed Any: an EpochRange, whose module imports this one)
        self.active: Optional[Any] = None
        # the range the hook feeds: the active one, or an ended one whose restored programs have not run yet
        self.hooked: Optional[Any] = None
        self.range_counter = 0
        self.logged_inactive = False  # "checkpointing is off" was logged
        self.final_save_failures: List[str] = []
        # (storage URI, job id, rank) -> this process's writer Fence (one generation of its rank per start)
        self.fences: Dict[Tuple[str, str, int], Fence] = {}
        # (storage URI, job id) whose job marker this process wrote or found (once per process, not per range)
        self.marked_jobs: Set[Tuple[str, str]] = set()
        # (PADDLE_ACP_LOCAL_CACHE, storage URI) -> its LocalCache, or None (a local URI, or unusable)
        self.caches: Dict[Tuple[str, str], Optional[LocalCache]] = {}
        # paddle_acp.track's objects: name -> (kind, object), saved by every range opened after
        self.tracked: Dict[str, Tuple[str, Any]] = {}

    def next_range_name(self) -> str:
        name = f"_range_{self.range_counter}"
        self.range_counter += 1
        return name

    def fence_for(self, storage: Storage, job_id: str, rank: int) -> Fence:
        """This process's writer fence as rank ``rank`` of ``job_id`` on ``storage`` (taken once per process and
        place, however its URI is spelled: a second generation would fence the first)."""
        key = (location_of(storage), job_id, rank)
        f = self.fences.get(key)
        if f is None:
            f = self.fences[key] = Fence.take(storage, job_id, rank)
        return f

    def local_cache(self, cfg: CheckpointConfig, storage: Storage) -> Optional[LocalCache]:
        """The node-local cache of a remote checkpoint location (``PADDLE_ACP_LOCAL_CACHE``), or None."""
        if cfg.local_cache is None:
            return None
        key = (cfg.local_cache, storage.uri)
        if key not in self.caches:
            if storage.local_path("") is not None:
                logger.info("PADDLE_ACP_LOCAL_CACHE is not used: the checkpoints are on a local disk already (%s)",
                            storage.uri)
                self.caches[key] = None
            else:
                self.caches[key] = LocalCache.open(cfg.local_cache, cfg.uri or storage.uri, cfg.max_to_keep, cfg.storage)
        return self.caches[key]

    def reset(self) -> None:
        """Forget everything, as a restart would (waits for the active range's save first)."""
        if self.active is not None:
            self.active.close()
        self.active = self.hooked = None
        self.fences.clear()
        self.range_counter = 0
        self.logged_inactive = False
        self.final_save_failures.clear()  # cleared in place: callers may hold the list
        self.marked_jobs.clear()
        self.caches.clear()
        self.tracked.clear()


STATE = ProcessState()


def check_main_thread(what: str) -> None:
    """Ranges, saves and program registration run on the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        raise CheckpointError(
            f"paddle-acp {what} must run on the main thread, not in thread "
            f"{threading.current_thread().name!r}"
        )
