"""Paddle's TCP store: which store a job of several ranks has, and opening it (the job's own, or one of ours).

Read in Paddle 3.3.1 (docs/design.md, "Coordinating ranks through Paddle's store"):

* ``paddle.distributed.launch`` exports ``PADDLE_MASTER``, a port reserved for the job's store, which
  ``core.create_or_get_global_tcp_store()`` binds in rank 0 (created once per process: ``init_parallel_env``
  shares it, so no port is bound twice; our keys carry :data:`KEY_PREFIX`). That call holds the GIL for its
  whole rendezvous, so ``PADDLE_ACP_COORDINATION=auto`` does not take it; ``store`` does.
* With ``--ips``/``--start_port``, ``PADDLE_MASTER`` is rank 0's own trainer endpoint, which the job's
  collective initialisation may bind itself (``shared_with_trainer``).
* ``MASTER_ADDR``/``MASTER_PORT`` alone: Paddle binds nothing there, so a store of our own is opened
  (``core.TCPStore``, which releases the GIL while it waits).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from typing import Any, Mapping, Optional, Protocol, Set

from paddle_acp.errors import ConfigError
from paddle_acp.secrets import only_host_port

KEY_PREFIX = "paddle_acp/"
logger = logging.getLogger("paddle_acp")


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
    try:
        only_host_port(endpoint.strip())
    except ValueError as exc:
        raise ConfigError(f"the store named by {name}: {exc}") from None
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return StoreEndpoint(host, int(port), name)


def job_store_endpoint(env: Mapping[str, str]) -> Optional[StoreEndpoint]:
    """The store endpoint the job's environment names, or None (no master: storage-only coordination); ConfigError
    for one with user info, a path or a query."""
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
    """Open (rank 0: host) the store at ``ep``; blocks until it is reached (bounded by ``timeout_s`` for a store
    of ours, by ``FLAGS_stop_check_timeout`` for the job's). Raises what Paddle raises."""
    from paddle.base import core

    before = _sockets_to(ep.port)
    if ep.source == "PADDLE_MASTER":
        store: Any = core.create_or_get_global_tcp_store()
    else:
        store = core.TCPStore(ep.host, ep.port, rank == 0, world_size, max(1, int(timeout_s)))
    for fd in _sockets_to(ep.port) - before:
        _no_delay(fd)
    kv: KeyValueStore = store
    return kv


def _sockets_to(port: int) -> Set[int]:
    """This process's TCP sockets connected to ``port`` (their descriptors; Linux: ``/proc/self/fd``)."""
    found: Set[int] = set()
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return found
    for fd in fds:
        sk = _socket(fd)
        if sk is None:
            continue
        with sk:
            try:
                if sk.type == socket.SOCK_STREAM and sk.getpeername()[1] == port:
                    found.add(fd)
            except (OSError, IndexError, TypeError):
                continue  # not connected, or not an IP socket
    return found


def _socket(fd: int) -> Optional[socket.socket]:
    """A socket object on a copy of ``fd`` (closing it leaves ``fd`` open); None: not a socket, or closed."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        return socket.socket(fileno=dup)
    except OSError:
        os.close(dup)
        return None


def _no_delay(fd: int) -> None:
    """``TCP_NODELAY`` on the store client's socket ``fd`` (best effort): Paddle's client sends a request in several
    writes, so Nagle holds each tail until the delayed ACK: 44 ms per ``add`` without, ~0.05 ms with it."""
    sk = _socket(fd)
    if sk is None:
        return
    with sk:  # the option is the socket's, shared by every descriptor of it
        try:
            sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            logger.debug("could not set TCP_NODELAY on the store's connection: %s", exc)
