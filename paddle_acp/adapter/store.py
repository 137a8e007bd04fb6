"""Paddle's TCP store: which store a job of several ranks has, and opening it (the job's own, or one of ours).

Read in Paddle 3.3.1 (docs/design.md, "Coordinating ranks through Paddle's store"):

* ``python -m paddle.distributed.launch`` exports ``PADDLE_MASTER`` to every trainer: a port the
  launcher reserved for the job's store (``launch/controllers/collective.py``, ``_build_pod_with_master``:
  ``port = self.ctx.node.get_free_port()``, ``"PADDLE_MASTER": collective_master``), which
  ``core.create_or_get_global_tcp_store()`` binds in rank 0's process and every other rank connects to
  (``phi/core/distributed/store/store_utils.cc``: ``PADDLE_MASTER``, else the first of
  ``PADDLE_TRAINER_ENDPOINTS``; created once per process). ``init_parallel_env`` calls the same function
  (``distributed/parallel.py`` ~1162), so sharing it never binds a port twice: whoever calls first creates
  it, the other gets the same object. Our keys carry their own prefix (:data:`KEY_PREFIX`). Measured: that
  function holds the GIL for its whole rendezvous (no other thread of the process runs until every rank
  connected), so ``PADDLE_ACP_COORDINATION=auto`` does not take it; ``store`` does.
* With ``--ips``/``--start_port`` the launcher sets ``PADDLE_MASTER`` to rank 0's own trainer endpoint
  (``_build_pod_with_args``: ``self.ctx.args.master = job_endpoints[0]``), which a static-graph job's
  collective initialisation may bind itself: :func:`job_store_endpoint` reports that (``shared_with_trainer``).
* ``MASTER_ADDR``/``MASTER_PORT`` alone: Paddle's global store ignores them (store_utils.cc reads only the two
  variables above), so nothing of Paddle binds that port: a store of our own is opened there
  (``core.TCPStore(host, port, is_master=rank 0, world_size, timeout)``, which releases the GIL while it waits).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Protocol

KEY_PREFIX = "paddle_acp/"


class KeyValueStore(Protocol):
    """What paddle-acp uses of a Paddle store (``core.TCPStore``): ``get`` of a missing key blocks until the
    store's own timeout, so callers ``get`` only keys an ``add`` counter says are there."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def add(self, key: str, value: int) -> int: ...


@dataclasses.dataclass(frozen=True)
class StoreEndpoint:
    host: str
    port: int
    source: str  # "PADDLE_MASTER" (the job's global store, shared) or "MASTER_ADDR" (a store of our own)
    shared_with_trainer: bool = False  # PADDLE_MASTER is rank 0's own trainer endpoint (launch --ips/--start_port)

    def __str__(self) -> str:
        return f"{self.host}:{self.port} ({self.source})"


def _split(endpoint: str, name: str) -> Optional[StoreEndpoint]:
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return StoreEndpoint(host, int(port), name)


def job_store_endpoint(env: Mapping[str, str]) -> Optional[StoreEndpoint]:
    """The store endpoint the job's environment names, or None (no master: storage-only coordination)."""
    master = env.get("PADDLE_MASTER", "").strip()
    if master:
        ep = _split(master, "PADDLE_MASTER")
        if ep is None:
            return None
        trainers = [e.strip() for e in env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if e.strip()]
        return dataclasses.replace(ep, shared_with_trainer=master in trainers)
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if addr and port:
        return _split(f"{addr}:{port}", "MASTER_ADDR")
    return None


def open_store(ep: StoreEndpoint, rank: int, world_size: int, timeout_s: int) -> KeyValueStore:
    """Open (rank 0: host) the store at ``ep``; blocks until it is reached (Paddle's own retries, bounded by
    ``timeout_s`` for a store of ours, by ``FLAGS_stop_check_timeout`` for the job's). Raises what Paddle raises."""
    from paddle.base import core  # (only here: the adapter is the one layer that touches Paddle's internals)

    # (Paddle's stubs type ``set``'s value as str; its binding takes bytes, which the plan's JSON is)
    if ep.source == "PADDLE_MASTER":
        store: Any = core.create_or_get_global_tcp_store()
    else:
        store = core.TCPStore(ep.host, ep.port, rank == 0, world_size, max(1, int(timeout_s)))
    kv: KeyValueStore = store
    return kv
