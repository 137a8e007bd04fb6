"""Storage faults for ci/kill_anywhere.py: the storage server SIGKILLed and restarted, what was committed.

Three parts, each used by the kill-anywhere harness when the checkpoints go to a
real server (``--hdfs``, ``--s3``):

* :class:`ServerFaults` SIGKILLs the server process at a drawn moment of a
  restart round (HDFS: the NameNode, the DataNode or both; S3: the SeaweedFS
  ``weed`` process), leaves it down for a drawn while, and restarts it on the
  same ports with the same data directory, so clients reconnect to the same
  URI. The restarts run on one long-lived worker thread: the servers are
  spawned with a parent-death signal bound to the thread that forked them
  (tests/support/servers.py), so a short-lived thread would take its server down with it.
* :class:`CommittedLog` records every checkpoint the harness saw committed
  (``paddle-acp ls --json`` between two rounds, when no training process runs)
  and at the end checks, with ``ls --verify``, that each is still there and
  valid, unless retention removed it legitimately (at least ``max_to_keep``
  newer committed checkpoints of the same range remain); it also gives the
  newest committed checkpoint, which the next process must resume from (or
  from a newer one): resuming from an older one, or from scratch, is a silent
  wrong resume.
* :func:`clear_error` tells a process that stopped with a clear error (it
  exited with status 1 and its last traceback ends in a CheckpointError or
  StorageError with a message) from any other failure.
"""
import importlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))  # tests/support -> the checkout
CLI = [sys.executable, os.path.join(REPO, "paddle_acp_cli.py")]

#: The library's errors that count as a clear error (a process that stops with one, naming its cause).
CLEAR_ERRORS = ("CheckpointError", "StorageError", "CorruptCheckpointError")
_EXC_LINE = re.compile(r"^((?:[\w.]+\.)?\w+): (\S.*)$")
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")


def _final_chain(lines):
    """Exception names of the last chain of tracebacks in ``lines`` (oldest first) and the
    final exception line."""
    chain, final, prev, in_tb = [], None, "", False
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            if prev not in _CHAINED:
                chain = []
            in_tb = True
        elif in_tb and line and not line[0].isspace():  # the first unindented line ends a traceback
            in_tb = False
            m = _EXC_LINE.match(line)
            chain.append(m.group(1) if m else line)
            final = line if m else None
        if line.strip():
            prev = line.strip()
    return chain, final


def clear_error(returncode, stderr_text):
    """The final exception line when the process stopped with a clear error, else None.

    A clear error: exit status 1 (an uncaught Python exception), and the last traceback in
    stderr ends in one of :data:`CLEAR_ERRORS` with a message, or in a ConfigError raised
    from a StorageError (the library's "checkpoint location ... is not reachable" at start).
    A process killed by a signal, one that exited otherwise, or one whose last exception is
    anything else (a raw OSError of a storage client, a Paddle error) did not stop clearly.
    """
    if returncode != 1:
        return None
    chain, final = _final_chain(stderr_text.splitlines())
    if not final or not chain:
        return None
    if _is_clear(chain[-1]) or (chain[-1].rsplit(".", 1)[-1] == "ConfigError"
                                and any(_is_clear(x, ("StorageError",)) for x in chain)):
        return final
    return None


def _is_clear(qualname, bases=CLEAR_ERRORS):
    """``qualname`` (as a traceback prints it) names one of the library's ``bases`` or a subclass
    (e.g. ``RestartRequiredError``, a CheckpointError)."""
    module, _, name = qualname.rpartition(".")
    if name in bases:
        return True
    if not module.startswith("paddle_acp"):
        return False
    try:
        importlib.import_module("paddle_acp_cli")  # first: defers the Paddle import and the Executor hook
        errors = importlib.import_module("paddle_acp.errors")
        cls = getattr(importlib.import_module(module), name)
        return isinstance(cls, type) and issubclass(cls, tuple(getattr(errors, b) for b in bases))
    except Exception:  # noqa: BLE001 - an unknown class is no clear error
        return False


class ServerFaults:
    """SIGKILL a storage server at drawn moments and restart it on the same ports and data.

    ``schedule()`` arms one fault for the current round (no-op while the previous one is still
    restarting the server); ``cancel()`` disarms one that has not fired; ``settle()`` waits
    until the server is up again (restarting it once more if a restart failed) and says why
    not. ``close()`` ends the worker thread.
    """

    HDFS_PARTS = ("namenode", "datanode", "both")

    def __init__(self, srv, max_down_s=2.0, restart_tries=3):
        self.srv = srv
        self.kind = srv.kind
        self.max_down_s = max_down_s
        self.restart_tries = restart_tries
        self.events = []  # one dict per fault that fired
        self._jobs = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._armed = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._worker, name="server-faults", daemon=True)
        self._thread.start()

    # -- main thread
    def schedule(self, rng, window_s):
        """Arm a fault ``uniform(0, window_s)`` seconds from now; returns its record (None: busy)."""
        delay = rng.uniform(0.0, max(window_s, 0.01))
        down = rng.uniform(0.0, self.max_down_s)
        part = rng.choice(self.HDFS_PARTS) if self.kind == "hdfs" else "weed"
        if not self._idle.is_set():
            return None
        job = {"part": part, "delay_s": round(delay, 3), "down_s": round(down, 3),
               "fired": False, "cancel": threading.Event()}
        with self._lock:
            self._idle.clear()
            self._armed = job
        self._jobs.put(job)
        return job

    def cancel(self):
        """Disarm the armed fault unless it already fired (then its restart goes on)."""
        with self._lock:
            if self._armed is not None:
                self._armed["cancel"].set()

    def settle(self, timeout=300.0):
        """Wait for the server to be up; None when it is, else why not."""
        if not self._idle.wait(timeout):
            return "the storage server's restart did not finish within %.0f s" % timeout
        if self.up():
            return None
        job = {"part": "restart", "delay_s": 0.0, "down_s": 0.0, "fired": True,
               "cancel": threading.Event()}
        self._idle.clear()
        self._jobs.put(job)
        if not self._idle.wait(timeout):
            return "the storage server's restart did not finish within %.0f s" % timeout
        return None if self.up() else "the storage server did not come back: %s" % job.get("error")

    def up(self):
        if self.kind == "hdfs":
            return bool(self.srv.namenode_pid and self.srv.datanode_pid)
        return bool(self.srv.pid)

    def close(self):
        self.cancel()
        self._jobs.put(None)
        self._thread.join(60)

    # -- worker thread
    def _worker(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                if job["part"] != "restart":
                    if job["cancel"].wait(job["delay_s"]):
                        continue
                    self._kill(job["part"])
                    job["fired"] = True
                    job["killed_at"] = time.time()
                    self.events.append(job)
                    time.sleep(job["down_s"])
                self._restart(job)
            finally:
                with self._lock:
                    self._armed = None
                self._idle.set()

    def _kill(self, part):
        srv = self.srv
        if self.kind == "s3":
            srv.stop(kill=True)
            return
        # SIGKILL first, then reap: both die at the same moment when both are drawn
        procs = {"namenode": [srv._nn], "datanode": [srv._dn], "both": [srv._nn, srv._dn]}[part]
        for p in procs:
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
        if part in ("datanode", "both"):
            srv.stop_datanode()
        if part in ("namenode", "both"):
            srv.stop_namenode()

    def _restart(self, job):
        t0 = time.monotonic()
        errors = []
        for _ in range(self.restart_tries):
            try:
                if self.kind == "s3":
                    self.srv.start()
                else:
                    # NameNode first (the DataNode registers with it), then wait for both
                    self.srv.start_namenode(wait=self.srv.datanode_pid is not None)
                    self.srv.start_datanode(wait=True)
                break
            except Exception as e:  # noqa: BLE001 - a server that does not start is reported, not raised
                errors.append("%s: %s" % (type(e).__name__, str(e)[-1500:]))
                time.sleep(1.0)
        job["restart_s"] = round(time.monotonic() - t0, 2)
        if errors:
            job["error"] = "\n".join(errors)

    def records(self):
        """The faults that fired (JSON-ready)."""
        return [{k: v for k, v in e.items() if k != "cancel"} for e in self.events]


def _run_cli(args, timeout):
    try:
        r = subprocess.run(CLI + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None, "paddle-acp %s: no answer within %.0f s" % (args[0], timeout)
    if r.returncode != 0:
        return None, "paddle-acp %s exited %d: %s" % (args[0], r.returncode, r.stderr[-1500:])
    try:
        return json.loads(r.stdout), None
    except ValueError:
        return None, "paddle-acp %s: no JSON: %s" % (args[0], r.stdout[-500:])


# what `paddle-acp ls` says of a root where nothing (no job marker) was written yet
_EMPTY = re.compile(r"does not exist|no paddle-acp jobs under")


def _checkpoints(listing):
    """{(job, range, name): entry} of a ``paddle-acp ls --json`` answer."""
    out = {}
    for job in listing.get("jobs", []):
        for rng in job.get("ranges", []):
            for c in rng.get("checkpoints", []):
                out[(job["job"], rng["range"], c["name"])] = c
    return out


class CommittedLog:
    """What the harness saw committed under one checkpoint URI, and the checks on it."""

    FIELDS = ("number", "epoch", "step", "bytes", "created")

    def __init__(self, uri, max_to_keep=3, timeout=120.0):
        self.uri = uri
        self.max_to_keep = max_to_keep
        self.timeout = timeout
        self.seen = {}  # (job, range, name) -> the entry when first seen committed and valid
        self.observations = 0
        self.failed_observations = []

    def observe(self):
        """List the URI and record every committed, valid checkpoint; the listing's error or None."""
        listing, err = _run_cli(["ls", "--json", self.uri], self.timeout)
        if err and _EMPTY.search(err):  # nothing written yet
            listing, err = {}, None
        if err:
            self.failed_observations.append(err)
            return err
        self.observations += 1
        for key, c in _checkpoints(listing).items():
            if c.get("committed") and c.get("valid") and key not in self.seen:
                self.seen[key] = {f: c.get(f) for f in self.FIELDS}
        return None

    def newest(self, job=None, range_name=None):
        """(name, entry) of the newest checkpoint seen committed (by number), or None."""
        best = None
        for (j, r, name), e in self.seen.items():
            if (job is None or j == job) and (range_name is None or r == range_name):
                if best is None or e["number"] > best[1]["number"]:
                    best = (name, e)
        return best

    def final_check(self):
        """Problems (strings): every checkpoint seen committed must still verify, unless
        retention removed it legitimately."""
        listing, err = _run_cli(["ls", "--json", "--verify", self.uri], self.timeout)
        if err and _EMPTY.search(err):  # nothing was ever written (or everything is gone)
            listing, err = {}, None
        if err:
            return ["cannot verify the checkpoints at the end: %s" % err]
        now = _checkpoints(listing)
        problems = []
        for key, seen in sorted(self.seen.items()):
            cur = now.get(key)
            where = "%s/%s/%s (epoch %s, step %s)" % (key + (seen["epoch"], seen["step"]))
            if cur is None or not cur.get("committed"):
                # retention deletes the commit file first, then the rest: a half-deleted
                # checkpoint (killed in between) is a legitimate leftover as well
                newer = sorted(c["number"] for k, c in now.items() if k[:2] == key[:2] and c.get("committed")
                               and c["number"] > seen["number"])
                if len(newer) < self.max_to_keep:
                    problems.append("committed checkpoint %s, seen committed, is %s and only %d newer committed "
                                    "checkpoint(s) remain (retention keeps %d): lost; committed now: %s"
                                    % (where, "gone" if cur is None else "no longer committed (%s)" % cur.get("reason"),
                                       len(newer), self.max_to_keep, self._committed_names(now, key)))
                continue
            if not cur.get("valid"):
                problems.append("committed checkpoint %s no longer verifies: status %s, %s"
                                % (where, cur.get("status"), cur.get("reason")))
            changed = [f for f in self.FIELDS if cur.get(f) != seen[f]]
            if changed:
                problems.append("committed checkpoint %s was rewritten: %s" % (where, ", ".join(
                    "%s %r -> %r" % (f, seen[f], cur.get(f)) for f in changed)))
        return problems

    @staticmethod
    def _committed_names(now, key):
        return sorted((c["number"], k[2]) for k, c in now.items() if k[:2] == key[:2] and c.get("committed"))


_NOT_CACHE = re.compile(r"from the remote, not the local cache: (.*)")


class TrialStorage:
    """One trial's view of remote storage: its node-local cache, its server faults, its
    committed-checkpoint bookkeeping. The harness calls :meth:`before_round` before it
    starts a round's processes, :meth:`arm` once they run, :meth:`after_round` once they
    are gone, and :meth:`finish` at the trial's end."""

    def __init__(self, a, faults, uri, tdir, rng):
        self.faults = faults if a.server_faults else None
        self.rng = rng
        self.cache = os.path.join(tdir, "cache") if a.local_cache else None
        self.log = CommittedLog(uri) if uri and "://" in uri and (a.server_faults or a.local_cache) else None
        self.fired = []
        self.cache_restores = 0
        self.remote_restores = []

    def env(self):
        return {"PADDLE_ACP_LOCAL_CACHE": self.cache} if self.cache else {}

    def before_round(self, unkilled):
        """Observe what is committed now (no process runs); before an unkilled round, make sure
        the server is up (progress is guaranteed). Returns a liveness problem or None."""
        if self.faults is not None:
            self.faults.cancel()
            if unkilled:
                err = self.faults.settle()
                if err:
                    return err
        if self.log is not None:
            self.log.observe()
        return None

    def newest(self):
        return self.log.newest() if self.log is not None else None

    def arm(self, window_s, unkilled):
        """Arm a server fault somewhere in the next ``window_s`` seconds (never in an unkilled round)."""
        if self.faults is not None and not unkilled:
            job = self.faults.schedule(self.rng, window_s)
            if job is not None:
                self.fired.append(job)

    def after_round(self, stderr_paths=()):
        if self.faults is not None:
            self.faults.cancel()
        for path in stderr_paths:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                continue
            self.cache_restores += "from the local cache" in text
            # the cache's one line on why the remote was read instead (its first words)
            self.remote_restores += [m.group(1)[:60] for m in _NOT_CACHE.finditer(text)]

    def finish(self):
        """(problems, liveness): the server must come back; every checkpoint seen committed must
        still verify."""
        if self.faults is not None:
            self.faults.cancel()
            err = self.faults.settle()
            if err:
                return [], [err]
        if self.log is None:
            return [], []
        self.log.observe()
        return self.log.final_check(), []

    def record(self):
        rec = {"server_faults": [{k: v for k, v in j.items() if k != "cancel"} for j in self.fired
                                 if j.get("fired")],
               "cache_restores": self.cache_restores, "remote_restores": self.remote_restores}
        if self.log is not None:
            rec.update(committed_seen=len(self.log.seen), observations=self.log.observations,
                       failed_observations=self.log.failed_observations[-3:])
        return rec
