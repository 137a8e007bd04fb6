"""Coordination through Paddle's TCP store: decisions and arrivals as keys, every call bounded.

The store lives in rank 0's process (:mod:`paddle_acp.adapter.store` says which: the job's own, shared, or ours).
A :class:`StoreLink` is this process's connection: opened once, in the background, within
``PADDLE_ACP_PART_TIMEOUT`` (the open is a rendezvous: rank 0's waits until every rank connected); each call runs on
its one thread, waited for at most :data:`CALL_TIMEOUT` s (a store ``get`` or a stopped host can block forever). The
first failure (rank 0 killed: a broken connection; a stopped or partitioned host: a timeout) ends the link for good,
said once at ERROR; every later call raises :class:`~paddle_acp.runtime.coord.CoordinationError` at once, so no rank
waits on a dead store.

Keys, under ``paddle_acp/{job}/{range}/``: a decision ``d/{key}`` with its counter ``d/{key}#n`` (the value is read
only once the counter says it exists: a ``get`` of a missing key blocks); an arrival counter ``a/{key}``; a rank's
newest note ``n/{rank}`` with counter ``n/{rank}#n`` (the manifest of its newest part, read by rank 0's commit
instead of storage); ``alive``, probed without waiting by ranks other than 0 at their due points, at most every
:data:`PROBE_EVERY` s (:meth:`StoreLink.probe`).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from paddle_acp.adapter.store import KEY_PREFIX, KeyValueStore, StoreEndpoint, open_store
from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.runtime.coord.base import Link, Links, ServerCoordinator

logger = logging.getLogger("paddle_acp")

CALL_TIMEOUT = 20.0  # seconds one store call may take before the store counts as lost
PROBE_EVERY = 1.0  # min seconds between probes (one per due point cost ~15 ms each on a loaded machine)

_Job = Tuple[Callable[[KeyValueStore], Any], List[Tuple[bool, Any]], threading.Event]


class StoreLink(Link):
    """This process's connection to the job's store."""

    LOST_SAID = "the job's store at {where} {why}; rank 0 hosts it: it is gone or unreachable"
    LOST_ERROR = ("the job's store at {where}, hosted by rank 0, {why}: rank 0 is gone or unreachable, so no checkpoint "
                  "of this job can be committed any more. Nothing committed is touched: restart the job, it resumes "
                  "from its last committed checkpoint (or set PADDLE_ACP_COORDINATION=storage)")

    def __init__(self, ep: StoreEndpoint, rank: int, world_size: int, open_timeout: float) -> None:
        super().__init__(rank, ep)
        self.ep = ep
        self.world_size = world_size
        self.open_timeout = open_timeout
        self._jobs: "queue.Queue[_Job]" = queue.Queue()
        self._opened = threading.Event()
        self._open_error: Optional[BaseException] = None
        self._started = time.monotonic()
        self._probe: Optional[Tuple[_Job, float]] = None
        self._sent: Optional[_Job] = None  # the last call sent without waiting (send)
        threading.Thread(target=self._serve, name="paddle-acp-store", daemon=True).start()

    def _listening(self) -> bool:
        """Whether rank 0's store accepts a TCP connect, tried every 20 ms until the open's deadline (Paddle's
        client retries a refused connect only every 3 s)."""
        deadline = self._started + self.open_timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.ep.host, self.ep.port), timeout=1.0):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def _serve(self) -> None:
        try:
            if self.rank != 0 and not self._listening():
                raise ConnectionError(f"nothing listens at {self.ep.host}:{self.ep.port}")
            store = open_store(self.ep, self.rank, self.world_size, int(self.open_timeout))
        except BaseException as exc:  # told by the next call
            self._open_error = exc
            self._opened.set()
            return
        self._opened.set()
        while True:
            fn, box, done = self._jobs.get()
            try:
                box.append((True, fn(store)))
            except BaseException as exc:
                box.append((False, exc))
            done.set()

    def _submit(self, fn: Callable[[KeyValueStore], Any]) -> _Job:
        job: _Job = (fn, [], threading.Event())
        self._jobs.put(job)
        return job

    @staticmethod
    def _failed(what: str, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()
        return f"failed {what} ({type(exc).__name__}: {text[0] if text else ''})"

    def call(self, what: str, fn: Callable[[KeyValueStore], Any]) -> Any:
        """``fn(store)`` on the link's thread, bounded; CoordinationError once the store is lost."""
        self.check()
        left = self.open_timeout - (time.monotonic() - self._started)
        if not self._opened.wait(max(0.0, left)):
            raise self._lose(f"was not open within {self.open_timeout:g} s (PADDLE_ACP_PART_TIMEOUT): a rank "
                             "never reached it")
        if self._open_error is not None:
            raise self._lose(self._failed("to open", self._open_error))
        _, box, done = self._submit(fn)
        if not done.wait(CALL_TIMEOUT):
            raise self._lose(f"did not answer {what} within {CALL_TIMEOUT:g} s")
        ok, value = box[0]
        if not ok:
            raise self._lose(self._failed(what, value))
        return value

    def send(self, fn: Callable[[KeyValueStore], Any]) -> None:
        """``fn(store)`` on the link's thread once open, outcome ignored; :meth:`settle` waits for it (a call still
        in Paddle's code at process exit aborts the process)."""
        self._sent = self._submit(fn)

    def settle(self) -> None:
        """Wait (never raising, at most until the open's deadline) for the open and the last :meth:`send`: a rank
        leaving before it joined the open's rendezvous stalls rank 0 for the open's timeout, and a rank 0 leaving
        mid-open is aborted by Paddle 3.3.1 (``terminate called without an active exception``)."""
        if self.lost is None:
            self._opened.wait(max(0.0, self._started + self.open_timeout - time.monotonic()))
        if self._sent is not None and self._opened.is_set() and self._open_error is None:
            self._sent[2].wait(CALL_TIMEOUT)

    def probe(self, key: str) -> None:
        """The liveness signal, never blocking: CoordinationError if the previous probe failed or went unanswered
        for :data:`CALL_TIMEOUT` s; once it answered, a new one is sent (at most every :data:`PROBE_EVERY` s)."""
        self.check()
        if not self._opened.is_set():
            return  # still opening: the calls that need it bound that wait
        if self._open_error is not None:
            raise self._lose(self._failed("to open", self._open_error))
        if self._probe is not None:
            (_, box, done), sent = self._probe
            if not done.is_set():
                if time.monotonic() - sent > CALL_TIMEOUT:
                    raise self._lose(f"did not answer a liveness probe within {CALL_TIMEOUT:g} s")
                return
            ok, value = box[0]
            if not ok:
                raise self._lose(self._failed("a liveness probe", value))
            if time.monotonic() - sent < PROBE_EVERY:
                return
        self._probe = (self._submit(lambda s: s.add(key, 0)), time.monotonic())


_LINKS: Links[Tuple[str, int, str, int, int], StoreLink] = Links()


def link_for(ep: StoreEndpoint, rank: int, world_size: int, open_timeout: float) -> StoreLink:
    """This process's link to the store at ``ep`` (opened once per process; a lost one stays lost)."""
    return _LINKS.get((ep.host, ep.port, ep.source, rank, world_size),
                      lambda: StoreLink(ep, rank, world_size, open_timeout))


class StoreCoordinator(ServerCoordinator[StoreLink]):
    """One range's coordination through the job's store."""

    kind = "store"

    def __init__(self, link: StoreLink, scope: str) -> None:
        super().__init__(link, f"{KEY_PREFIX}{scope}/")

    def post(self, key: str, value: bytes) -> None:
        k = f"{self.prefix}d/{key}"

        def post(s: KeyValueStore) -> None:
            s.set(k, value)
            s.add(f"{k}#n", 1)  # after the value: a reader that sees the count gets the value without waiting
        self.link.call(f"to post {key}", post)

    def latest(self, key: str, limit: int) -> Optional[bytes]:
        k = f"{self.prefix}d/{key}"

        def get(s: KeyValueStore) -> Optional[bytes]:
            return bytes(s.get(k)) if s.add(f"{k}#n", 0) > 0 else None
        raw: Optional[bytes] = self.link.call(f"to read {key}", get)
        if raw is not None and len(raw) > limit:
            raise CorruptCheckpointError(f"the job's store holds {len(raw)} bytes under {key}, more than {limit}")
        return raw

    def arrive(self, key: str, note: Optional[bytes] = None, rank: int = 0) -> None:
        k, n = f"{self.prefix}a/{key}", f"{self.prefix}n/{rank}"

        def arrive(s: KeyValueStore) -> None:
            if note is not None:  # before the count: rank 0 reads the notes of those counted in
                s.set(n, note)
                s.add(f"{n}#n", 1)
            s.add(k, 1)
        self.link.call(f"to count {key}", arrive)

    def arrive_soon(self, key: str) -> None:
        k = f"{self.prefix}a/{key}"
        if self.link.lost is None:
            self.link.send(lambda s: s.add(k, 1))

    def arrivals(self, key: str) -> Optional[int]:
        k = f"{self.prefix}a/{key}"
        n: int = self.link.call(f"to count {key}", lambda s: s.add(k, 0))
        return n

    def counts(self, keys: Sequence[str]) -> Optional[List[int]]:
        ks = [f"{self.prefix}a/{key}" for key in keys]
        got: List[int] = self.link.call(f"to count {len(ks)} keys", lambda s: [s.add(k, 0) for k in ks])
        return got

    def notes(self, ranks: Sequence[int], limit: int) -> Optional[List[Optional[bytes]]]:
        ns = [f"{self.prefix}n/{r}" for r in ranks]

        def read(s: KeyValueStore) -> List[Optional[bytes]]:
            return [bytes(s.get(n)) if s.add(f"{n}#n", 0) > 0 else None for n in ns]
        got: List[Optional[bytes]] = self.link.call(f"to read {len(ns)} notes", read)
        return [None if v is None or len(v) > limit else v for v in got]

    def close(self) -> None:
        self.link.settle()

    def check(self) -> None:
        if self.link.rank != 0:  # rank 0 hosts the store: it has nothing to lose but the other ranks
            self.link.probe(f"{self.prefix}alive")
