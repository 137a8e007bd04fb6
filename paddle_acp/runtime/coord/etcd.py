"""Coordination through the etcd server of Paddle's elastic launcher: decisions, arrivals and liveness as keys.

Under ``paddle.distributed.launch --master etcd://...`` (or the fleet launcher's ``--elastic_server``) the job has a
server outside every rank (:mod:`paddle_acp.adapter.elastic` finds it), so a dying rank 0 takes no store with it.
Keys live under ``paddle_acp/{job}/{range}/{incarnation}/`` (beside the launcher's ``/paddle/...``; the
incarnation, :func:`paddle_acp.adapter.elastic.incarnation`, keeps each start of the job apart; ``-`` if none):

* ``d/{key}``: a decision (the save plan), replaced by each post;
* ``a/{key}/{rank}``: rank ``rank`` reached ``key`` (counted once however often it arrives, so retries are safe);
  ``n/{rank}``: its newest note, put in the same transaction;
* ``alive``: rank 0's liveness; ``ended`` once rank 0's range closed.

Every key but ``ended`` hangs on its putter's lease (:data:`LEASE_TTL` s), so etcd drops a dead rank's keys and
keeps of a finished job only ``ended`` (lease :data:`ENDED_TTL` s). Nothing committed lives in etcd.

Liveness (:class:`EtcdLink`, one per process and server): a thread beats every :data:`BEAT` s, renewing the lease
and, on ranks other than 0, reading rank 0's ``alive``. The link is lost (said once at ERROR; every call then raises
:class:`~paddle_acp.runtime.coord.CoordinationError`, so no rank waits on it) when etcd has not answered for
:data:`LOST_AFTER` s, when this process's lease expired, when rank 0's ``alive`` vanished without ``ended`` (rank 0
killed: within :data:`LEASE_TTL` s), or when no rank 0 announced itself within ``PADDLE_ACP_PART_TIMEOUT``. Every
connect and read is bounded by :data:`CALL_TIMEOUT`, retried for :data:`CALL_RETRY` s; a call that fails before the
link is lost fails alone (its caller goes on as without a coordinator).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.runtime.coord.base import CoordinationError, Link, Links, ServerCoordinator
from paddle_acp.storage.etcd import EtcdClient, EtcdError

logger = logging.getLogger("paddle_acp")

KEY_PREFIX = "paddle_acp/"
CALL_TIMEOUT = 5.0  # seconds for one connect or read of one etcd call
LOST_AFTER = 10.0  # seconds without an answer from etcd before it counts as lost
CALL_RETRY = 2.0  # seconds one call is retried while etcd fails (a leader election, a restart)
BEAT = 1.0  # seconds between two beats of the liveness thread
LEASE_TTL = 10  # seconds a process's keys outlive its last keep-alive
ENDED_TTL = 3600  # seconds rank 0's ``ended`` outlives it

_Call = Callable[[EtcdClient], Any]


class EtcdLink(Link):
    """This process's coordination through one etcd server."""

    LOST_SAID = "the ranks' coordination through {where} is lost: {why}"
    LOST_ERROR = ("the ranks' coordination through {where} is lost: {why}. No checkpoint of this job can be committed "
                  "through it any more; nothing committed is touched: restart the job, it resumes from its last "
                  "committed checkpoint (or set PADDLE_ACP_COORDINATION=storage)")

    def __init__(self, client: EtcdClient, rank: int, open_timeout: float) -> None:
        super().__init__(rank, client)
        self.client = client
        self.open_timeout = open_timeout
        self._lease = 0
        self._watched: Dict[bytes, Tuple[bytes, float, bool]] = {}  # rank > 0: alive -> (ended, since, seen)
        self._last_ok = time.monotonic()
        self._beating = False

    def call(self, what: str, fn: _Call) -> Any:
        """``fn(client)``, retried while etcd fails for at most :data:`CALL_RETRY` s, then CoordinationError; the
        link is lost once etcd has not answered for :data:`LOST_AFTER` s."""
        deadline = time.monotonic() + CALL_RETRY
        while True:
            self.check()
            try:
                value = fn(self.client)
                self._last_ok = time.monotonic()
                return value
            except EtcdError as exc:
                now = time.monotonic()
                if now - self._last_ok > LOST_AFTER:
                    raise self._lose(f"etcd has not answered for {LOST_AFTER:g} s ({exc})") from None
                if now + 0.2 >= deadline:
                    raise CoordinationError(f"rank {self.rank}: {self.client} did not answer {what} within "
                                            f"{CALL_RETRY:g} s ({exc})") from None
                time.sleep(0.2)

    def lease(self, c: EtcdClient) -> int:
        """This process's lease, granted at first need and kept alive by the beat."""
        with self._lock:
            if self._lease:
                return self._lease
        lease = c.grant(LEASE_TTL)
        with self._lock:
            self._lease = self._lease or lease
            start = not self._beating
            self._beating = True
        if start:
            threading.Thread(target=self._beat, name="paddle-acp-etcd", daemon=True).start()
        return self._lease

    def watch(self, key: bytes, ended: bytes) -> None:
        """Rank > 0: look for rank 0's ``alive`` under ``key`` (or its ``ended``) at every beat."""
        with self._lock:
            self._watched.setdefault(key, (ended, time.monotonic(), False))
        self.call("to start beating", self.lease)

    def unwatch(self, key: bytes) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def _beat(self) -> None:
        renew_at = time.monotonic() + LEASE_TTL / 3
        while self.lost is None:
            time.sleep(BEAT)
            try:
                if time.monotonic() >= renew_at:
                    if self.client.keepalive(self._lease) <= 0:
                        self._lose(f"this process's lease expired (etcd did not hear from it for {LEASE_TTL} s)")
                        return
                    renew_at = time.monotonic() + LEASE_TTL / 3
                    self._last_ok = time.monotonic()
                if self.rank != 0:
                    self._look_for_rank0()
            except EtcdError as exc:
                if time.monotonic() - self._last_ok > LOST_AFTER:
                    self._lose(f"etcd has not answered for {LOST_AFTER:g} s ({exc})")
                    return

    def _look_for_rank0(self) -> None:
        with self._lock:
            watched = dict(self._watched)
        if not watched:
            return
        values = self.client.gets([k for key, (ended, _, _) in watched.items() for k in (key, ended)])
        self._last_ok = time.monotonic()
        for i, (key, (ended, since, seen)) in enumerate(watched.items()):
            alive, done = values[2 * i], values[2 * i + 1]
            if done is not None:  # rank 0's range ended: its process may exit
                self.unwatch(key)
            elif alive is not None:
                if not seen:
                    with self._lock:
                        if key in self._watched:
                            self._watched[key] = (ended, since, True)
            elif seen:
                self._lose(f"rank 0's liveness key {key.decode()} expired: rank 0 is gone or cut off from etcd (its "
                           f"lease lasts {LEASE_TTL} s)")
            elif time.monotonic() - since > self.open_timeout:
                self._lose(f"no rank 0 announced itself under {key.decode()} within {self.open_timeout:g} s "
                           "(PADDLE_ACP_PART_TIMEOUT)")


_LINKS: Links[Tuple[str, int, int], EtcdLink] = Links()


def link_for(endpoint: str, rank: int, open_timeout: float) -> EtcdLink:
    """This process's link to the etcd at ``endpoint`` (one per process and server); ValueError unless HOST:PORT."""
    client = EtcdClient(endpoint, CALL_TIMEOUT)
    return _LINKS.get((client.host, client.port, rank), lambda: EtcdLink(client, rank, open_timeout))


class EtcdCoordinator(ServerCoordinator[EtcdLink]):
    """One range's coordination through etcd; ``scope``: ``{job}/{range}/{incarnation}``."""

    kind = "etcd"

    def __init__(self, link: EtcdLink, scope: str) -> None:
        super().__init__(link, f"{KEY_PREFIX}{scope}/")
        self.alive = f"{self.prefix}alive".encode()
        self.ended = f"{self.prefix}ended".encode()
        if link.rank == 0:
            link.call("to announce rank 0", lambda c: c.put(self.alive, b"", link.lease(c)))
        else:
            link.watch(self.alive, self.ended)

    def _key(self, *parts: object) -> bytes:
        return (self.prefix + "/".join(str(p) for p in parts)).encode()

    def post(self, key: str, value: bytes) -> None:
        k = self._key("d", key)
        self.link.call(f"to post {key}", lambda c: c.put(k, value, self.link.lease(c)))

    def latest(self, key: str, limit: int) -> Optional[bytes]:
        k = self._key("d", key)
        raw: Optional[bytes] = self.link.call(f"to read {key}", lambda c: c.get(k))
        if raw is not None and len(raw) > limit:
            raise CorruptCheckpointError(f"etcd holds {len(raw)} bytes under {key}, more than {limit}")
        return raw

    def arrive(self, key: str, note: Optional[bytes] = None, rank: int = 0) -> None:
        items = [] if note is None else [(self._key("n", rank), note)]
        items.append((self._key("a", key, rank), b""))  # one transaction: the note is there when counted
        self.link.call(f"to count {key}", lambda c: c.puts(items, self.link.lease(c)))

    def arrive_soon(self, key: str) -> None:
        """:meth:`arrive` on its own thread, not waited for (a failure is logged at DEBUG: the caller arrives again)."""
        if self.link.lost is None:
            threading.Thread(target=self._arrive_quietly, args=(key,), name="paddle-acp-etcd-arrive",
                             daemon=True).start()

    def _arrive_quietly(self, key: str) -> None:
        try:
            self.arrive(key)
        except CoordinationError as exc:
            logger.debug("could not count %s in through etcd: %s", key, exc)

    def arrivals(self, key: str) -> Optional[int]:
        counts = self.counts([key])
        return None if counts is None else counts[0]

    def counts(self, keys: Sequence[str]) -> Optional[List[int]]:
        prefixes = [self._key("a", key, "") for key in keys]
        got: List[int] = self.link.call(f"to count {len(prefixes)} keys", lambda c: c.counts(prefixes))
        return got

    def notes(self, ranks: Sequence[int], limit: int) -> Optional[List[Optional[bytes]]]:
        keys = [self._key("n", r) for r in ranks]
        got: List[Optional[bytes]] = self.link.call(f"to read {len(keys)} notes", lambda c: c.gets(keys))
        return [None if v is None or len(v) > limit else v for v in got]

    def check(self) -> None:
        self.link.check()

    def close(self) -> None:
        """Rank 0: put ``ended`` (so a rank at its last due points does not take rank 0's exit for a death); the
        others stop watching rank 0. Bounded, never raises."""
        if self.link.rank != 0:
            self.link.unwatch(self.alive)
            return
        if self.link.lost is None:
            try:
                self.link.call("to say rank 0's range ended",
                               lambda c: c.put(self.ended, b"", c.grant(ENDED_TTL)))
            except CoordinationError:
                pass  # said once by the link
