#!/usr/bin/env python3
"""A real etcd on 127.0.0.1 for paddle-acp's elastic tests and demo.

``paddle.distributed.launch --master etcd://HOST:PORT`` needs an etcd server
and, in the launcher's Python, the PyPI client ``etcd3``. This module provides
both:

* :func:`find_etcd` returns the ``etcd`` binary; when there is none it runs
  ``apt-get update`` once and ``apt-get install etcd-server`` (Debian's etcd
  3.4; needs root). ``PADDLE_ACP_ETCD`` may name a binary instead.
* :func:`ensure_etcd3` makes ``import etcd3`` work in a Python (default: this
  one), ``pip install etcd3`` if needed. With the protobuf that paddlepaddle
  3.3.1 brings, etcd3's generated modules import only with
  ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``, and the launcher wants
  ``GRPC_ENABLE_FORK_SUPPORT=false`` (:data:`LAUNCHER_ENV`, explained there).
* :class:`EtcdServer` starts ``etcd`` on two free 127.0.0.1 ports (client,
  peer) with a temporary data dir, in its own session, with ``PDEATHSIG`` so
  it cannot outlive its parent, and stops it by PID (``stop()``, a ``with``
  block, or at interpreter exit).
* :func:`launcher_env` / :func:`launch_command` build a launcher's
  environment (job id in ``PADDLE_JOB_ID``, stray launcher variables removed)
  and command line; :class:`LaunchGroup` runs a job's launchers, restarts a
  launcher that dies while its peers wait (Paddle 3.3.1 race, see there) and
  kills them all on ``close()``.

Library use (tests)::

    from support import etcd   # tests/ on sys.path: pytest puts it there; ci/ scripts insert it
    with etcd.EtcdServer() as srv:                    # srv.master_url: etcd://127.0.0.1:PORT
        env = etcd.launcher_env("my-job", PADDLE_ACP_CHECKPOINT_URI=ckpt)
        group = etcd.LaunchGroup(workdir, env)
        group.add("node0", etcd.launch_command(srv.master_url, "train.py", nproc_per_node=2))
        try:
            codes = group.wait(300)                   # {"node0": 0}
        finally:
            group.close()

CLI::

    python tests/support/etcd.py prepare     # install etcd / etcd3 if missing, print versions
    python tests/support/etcd.py run         # start etcd, print its URL, wait for Ctrl-C

Failures raise :class:`EtcdUnavailable`; tests call :func:`require_or_skip`,
which skips, or fails when ``PADDLE_ACP_REQUIRE_SERVERS=1``.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import weakref
from pathlib import Path
from typing import Dict, List, Optional, Sequence

try:  # the ports: below the kernel's ephemeral range (see free_ports there)
    from support.servers import free_ports
except ImportError:  # run as a script: python tests/support/etcd.py
    from servers import free_ports  # type: ignore[no-redef]

try:
    from .spawn import wrapped
except ImportError:  # run as a script (python tests/support/etcd.py)
    from spawn import wrapped  # type: ignore[no-redef]

__all__ = [
    "EtcdUnavailable",
    "LAUNCHER_VARS",
    "launcher_env",
    "launch_command",
    "LaunchGroup",
    "kill_group",
    "LAUNCHER_ENV",
    "ENV_REQUIRE",
    "servers_required",
    "require_or_skip",
    "find_etcd",
    "ensure_etcd3",
    "free_ports",
    "child_cmd",
    "EtcdServer",
]

ENV_REQUIRE = "PADDLE_ACP_REQUIRE_SERVERS"
APT_PACKAGE = "etcd-server"
PIP_PACKAGE = "etcd3"
#: What ``python -m paddle.distributed.launch --master etcd://...`` needs in its environment:
#: etcd3's generated protobuf modules import only with the pure-Python protobuf, and
#: gRPC's fork handlers must stay out of the launcher's fork+exec of trainers (with
#: the etcd client's threads running they can abort the child: "epoll_wait error:
#: Bad file descriptor", trainer exit -6, a spurious pod restart).
LAUNCHER_ENV: Dict[str, str] = {
    "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
    "GRPC_ENABLE_FORK_SUPPORT": "false",
}

_lock = threading.Lock()
_apt_updated = False


class EtcdUnavailable(RuntimeError):
    """etcd or the etcd3 client could not be installed or started here."""


def servers_required() -> bool:
    return os.environ.get(ENV_REQUIRE, "").strip().lower() in ("1", "true", "yes", "on")


def require_or_skip(exc: BaseException):
    """In pytest: skip because of ``exc``, or fail if PADDLE_ACP_REQUIRE_SERVERS=1."""
    import pytest

    msg = f"etcd for the elastic launcher is unavailable: {exc}"
    if servers_required():
        pytest.fail(f"{msg} ({ENV_REQUIRE}=1)", pytrace=False)
    pytest.skip(msg)


def _log(msg: str) -> None:
    print(f"[etcd] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# processes that die with their parent


def child_cmd(cmd: Sequence[str]) -> List[str]:
    """``cmd`` through an exec wrapper that makes the child get SIGKILL when the thread that started it ends
    (PR_SET_PDEATHSIG); start it with ``start_new_session=True`` for its own process group. Not a Python
    ``preexec_fn``: one can deadlock a fork from a process that already runs threads (support/spawn.py)."""
    return wrapped([shutil.which(str(cmd[0])) or str(cmd[0]), *cmd[1:]], death_signal=int(signal.SIGKILL))


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by ``pid`` (started with a new session), then ``pid`` itself."""
    for target in (lambda: os.killpg(pid, sig), lambda: os.kill(pid, sig)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass


# ---------------------------------------------------------------------------
# installing


def _run(cmd: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def _apt_install(package: str) -> None:
    global _apt_updated
    if shutil.which("apt-get") is None:
        raise EtcdUnavailable(f"no etcd binary and no apt-get to install {package}")
    if os.geteuid() != 0:
        raise EtcdUnavailable(f"no etcd binary; installing {package} with apt-get needs root")
    try:
        if not _apt_updated:
            _log("apt-get update")
            p = _run(["apt-get", "update", "-q"], timeout=600)
            if p.returncode != 0:
                raise EtcdUnavailable(f"apt-get update failed:\n{p.stdout[-2000:]}")
            _apt_updated = True
        _log(f"apt-get install {package}")
        p = _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package], timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise EtcdUnavailable(f"{' '.join(exc.cmd)} timed out") from exc
    if p.returncode != 0:
        raise EtcdUnavailable(f"apt-get install {package} failed:\n{p.stdout[-2000:]}")


def find_etcd(install: bool = True) -> str:
    """Path of the ``etcd`` server binary; installs Debian's ``etcd-server`` if missing."""
    with _lock:
        env_bin = os.environ.get("PADDLE_ACP_ETCD")
        if env_bin:
            if not os.access(env_bin, os.X_OK):
                raise EtcdUnavailable(f"PADDLE_ACP_ETCD={env_bin!r} is not executable")
            return env_bin
        found = shutil.which("etcd") or next(
            (p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None)
        if found:
            return found
        if not install:
            raise EtcdUnavailable("no etcd binary on PATH")
        _apt_install(APT_PACKAGE)
        found = shutil.which("etcd") or ("/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)
        if not found:
            raise EtcdUnavailable(f"apt-get installed {APT_PACKAGE} but no etcd binary appeared")
        return found


def _etcd3_importable(python: str) -> Optional[str]:
    env = dict(os.environ, **LAUNCHER_ENV)
    p = subprocess.run([python, "-c", "import etcd3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    return None if p.returncode == 0 else p.stdout.strip()[-1500:]


def ensure_etcd3(python: Optional[str] = None, install: bool = True) -> None:
    """Make ``import etcd3`` work in ``python`` (with :data:`LAUNCHER_ENV`); pip-installs it if missing."""
    python = python or sys.executable
    with _lock:
        err = _etcd3_importable(python)
        if err is None:
            return
        if not install:
            raise EtcdUnavailable(f"{python} cannot import etcd3: {err}")
        _log(f"pip install {PIP_PACKAGE} into {python}")
        try:
            p = _run([python, "-m", "pip", "install", "-q", PIP_PACKAGE], timeout=600)
        except subprocess.TimeoutExpired as exc:
            raise EtcdUnavailable("pip install etcd3 timed out") from exc
        if p.returncode != 0:
            raise EtcdUnavailable(f"pip install {PIP_PACKAGE} failed:\n{p.stdout[-2000:]}")
        err = _etcd3_importable(python)
        if err is not None:
            raise EtcdUnavailable(f"etcd3 installed but does not import: {err}")


# ---------------------------------------------------------------------------
# the server


_live: "weakref.WeakSet[EtcdServer]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for srv in list(_live):
        srv.stop()


class EtcdServer:
    """One etcd member on 127.0.0.1; ``start()``/``stop()`` or ``with``."""

    def __init__(self, data_dir: Optional[str] = None, log_path: Optional[str] = None, name: str = "acp"):
        self._own_dir = data_dir is None
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="acp-etcd-")
        self.log_path = log_path or os.path.join(self.data_dir, "etcd.log")
        self.name = name
        self.host = "127.0.0.1"
        self.port: Optional[int] = None
        self.peer_port: Optional[int] = None
        self.proc: Optional[subprocess.Popen] = None
        self.binary: Optional[str] = None

    # -- addresses -----------------------------------------------------------
    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def master_url(self) -> str:
        """What ``paddle.distributed.launch --master`` takes."""
        return f"etcd://{self.endpoint}"

    def __repr__(self):
        return f"EtcdServer({self.endpoint if self.port else 'not started'}, pid={self.pid})"

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    # -- life ----------------------------------------------------------------
    def start(self, timeout: float = 30.0, attempts: int = 3) -> "EtcdServer":
        if self.proc is not None:
            return self
        self.binary = find_etcd()
        last = "?"
        for _ in range(attempts):
            self.port, self.peer_port = free_ports(2)
            member_dir = os.path.join(self.data_dir, f"member-{self.port}")
            peer = f"http://{self.host}:{self.peer_port}"
            cmd = [
                self.binary,
                "--name", self.name,
                "--data-dir", member_dir,
                "--listen-client-urls", self.client_url,
                "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{self.name}={peer}",
                "--initial-cluster-state", "new",
                "--initial-cluster-token", f"acp-{os.getpid()}-{self.port}",
            ]
            env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
            log = open(self.log_path, "ab")
            try:
                self.proc = subprocess.Popen(child_cmd(cmd), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            finally:
                log.close()
            _live.add(self)
            ok, last = self._wait_healthy(timeout)
            if ok:
                return self
            self.stop(remove=False)
        raise EtcdUnavailable(f"etcd did not become healthy on 127.0.0.1 ({last}); log: {self._log_tail()}")

    def _wait_healthy(self, timeout: float):
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False, f"etcd exited with {self.proc.returncode}"
            try:
                with urllib.request.urlopen(self.client_url + "/health", timeout=2) as r:
                    body = json.loads(r.read().decode() or "{}")
                if str(body.get("health")).lower() == "true":
                    return True, "healthy"
                last = f"/health said {body}"
            except Exception as exc:  # noqa: BLE001 - connection refused while starting
                last = str(exc)
            time.sleep(0.1)
        return False, f"timeout after {timeout:.0f} s: {last}"

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")[-n:]
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, remove: bool = True) -> None:
        """Stop etcd by PID (SIGTERM, then SIGKILL) and remove its temporary data dir."""
        p, self.proc = self.proc, None
        if p is not None:
            if p.poll() is None:
                kill_group(p.pid, signal.SIGTERM)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    kill_group(p.pid, signal.SIGKILL)
                    p.wait(5)
        _live.discard(self)
        if remove and self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    cleanup = stop

    def __enter__(self) -> "EtcdServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------
# the launcher

#: Variables that ``paddle.distributed.launch`` reads as its own arguments (or that
#: steer its rank/master detection); a launcher inherits none of them from its caller.
LAUNCHER_VARS = (
    "POD_IP", "POD_NAME", "PADDLE_MASTER", "PADDLE_DEVICES", "PADDLE_NNODES", "PADDLE_RUN_MODE",
    "PADDLE_LOG_LEVEL", "PADDLE_LOG_OVERWRITE", "PADDLE_SORT_IP", "PADDLE_NPROC_PER_NODE", "PADDLE_JOB_ID",
    "PADDLE_RANK", "PADDLE_LOG_DIR", "PADDLE_MAX_RESTART", "PADDLE_ELASTIC_LEVEL", "PADDLE_ELASTIC_TIMEOUT",
    "PADDLE_SERVER_NUM", "PADDLE_TRAINER_NUM", "PADDLE_SERVERS_ENDPOINTS", "PADDLE_TRAINERS_ENDPOINTS",
    "PADDLE_GLOO_PORT", "PADDLE_WITH_GLOO", "PADDLE_START_PORT", "PADDLE_IPS", "PADDLE_AUTO_PARALLEL_CONFIG",
    "PADDLE_AUTO_CLUSTER", "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
    "DISTRIBUTED_TRAINER_ENDPOINTS", "PADDLE_LAUNCH_WITH_ARGS", "PADDLE_CURRENT_ENDPOINT", "PADDLE_GLOBAL_RANK",
    "PADDLE_LOCAL_RANK", "PADDLE_GLOBAL_SIZE", "PADDLE_LOCAL_SIZE", "PADDLE_RANK_IN_NODE", "FLAGS_FIXED_PORT",
)


def launcher_env(job_id: str, base: Optional[Dict[str, str]] = None, **extra: str) -> Dict[str, str]:
    """The environment for ``python -m paddle.distributed.launch --master etcd://...``.

    ``PADDLE_JOB_ID`` is the job id of both the launcher (it overrides
    ``--job_id``: the launcher maps the variable onto that argument) and
    paddle-acp in every trainer (trainers inherit the launcher's environment;
    the launcher never exports ``--job_id`` to them).
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in LAUNCHER_VARS and not k.startswith("PADDLE_ACP_")}
    env.update(LAUNCHER_ENV)
    env["PADDLE_JOB_ID"] = job_id
    env.update(extra)
    return env


def launch_command(master_url: str, script: str, script_args: Sequence[str] = (), *, nnodes: str = "1",
                   nproc_per_node: int = 1, rank: Optional[int] = None, max_restart: int = 3,
                   elastic_level: int = 1, log_dir: Optional[str] = None,
                   python: Optional[str] = None) -> List[str]:
    cmd = [python or sys.executable, "-m", "paddle.distributed.launch", "--master", master_url,
           "--nnodes", str(nnodes), "--nproc_per_node", str(nproc_per_node),
           "--elastic_level", str(elastic_level), "--max_restart", str(max_restart)]
    if rank is not None:
        cmd += ["--rank", str(rank)]
    if log_dir:
        cmd += ["--log_dir", log_dir]
    return cmd + [script] + [str(a) for a in script_args]


class LaunchGroup:
    """The launcher processes of one job (one per "node"), supervised like pods of a cluster.

    Every launcher runs in its own session with ``PDEATHSIG``; its output goes to
    ``workdir/launcher.<name>[.<attempt>].out``. :meth:`close` kills them all.

    ``relaunch``: how often a node's launcher is started again when it exits
    non-zero while another launcher of the job still runs (a cluster's restart
    policy). Paddle 3.3.1's launcher needs it now and then: the launcher whose
    own trainer failed marks itself FAILED, deletes the heartbeats and, when its
    pod has no other trainer to stop, reaches ``wait_peer_ready`` before etcd's
    watch callback has turned FAILED into RESTARTING; ``wait_peer_ready`` then
    skips its wait loop, finds no peer alive and the launcher exits ("peer not
    ready", the trainer's exit code) while its peers wait for it.
    """

    def __init__(self, workdir: str, env: Dict[str, str], relaunch: int = 1):
        self.workdir = Path(workdir)
        self.env = env
        self.relaunch = relaunch
        self.nodes: Dict[str, dict] = {}
        self.relaunched: List[tuple] = []  # (name, exit code of the launcher that was replaced)

    def add(self, name: str, cmd: List[str]) -> subprocess.Popen:
        self.nodes[name] = {"cmd": cmd, "procs": [], "logs": [], "left": self.relaunch}
        return self._start(name)

    def _start(self, name: str) -> subprocess.Popen:
        node = self.nodes[name]
        n = len(node["procs"])
        log = self.workdir / (f"launcher.{name}.out" if n == 0 else f"launcher.{name}.{n}.out")
        with open(log, "wb") as f:
            p = subprocess.Popen(child_cmd(node["cmd"]), env=self.env, cwd=self.workdir, stdout=f,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        node["procs"].append(p)
        node["logs"].append(log)
        return p

    def current(self, name: str) -> subprocess.Popen:
        return self.nodes[name]["procs"][-1]

    def running(self) -> bool:
        return any(self.current(n).poll() is None for n in self.nodes)

    def poll(self) -> Optional[Dict[str, int]]:
        """Relaunch per the policy; the exit codes once every launcher has exited, else None."""
        codes = {n: self.current(n).poll() for n in self.nodes}
        for name, rc in codes.items():
            node = self.nodes[name]
            others = any(c is None for n, c in codes.items() if n != name)
            if rc not in (None, 0) and others and node["left"] > 0:
                node["left"] -= 1
                self.relaunched.append((name, rc))
                _log(f"launcher {name} exited {rc} while its peers run: starting it again")
                self._start(name)
                codes[name] = None
        return None if any(c is None for c in codes.values()) else codes

    def wait(self, timeout: float, tick: float = 0.2) -> Optional[Dict[str, int]]:
        """Exit codes by node, or None on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = self.poll()
            if codes is not None:
                return codes
            time.sleep(tick)
        return None

    def log_text(self, name: str) -> str:
        return "".join(p.read_text(errors="replace") for p in self.nodes[name]["logs"] if p.exists())

    def close(self) -> None:
        for node in self.nodes.values():
            for p in node["procs"]:
                if p.poll() is None:
                    kill_group(p.pid, signal.SIGKILL)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass


# ---------------------------------------------------------------------------
# CLI


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="install etcd-server and etcd3 if missing")
    sub.add_parser("run", help="start etcd on 127.0.0.1, print its URL, wait for Ctrl-C")
    args = ap.parse_args(argv)
    try:
        binary = find_etcd()
        ensure_etcd3()
        if args.cmd == "prepare":
            v = subprocess.run([binary, "--version"], stdout=subprocess.PIPE, text=True).stdout.splitlines()
            print(f"etcd: {binary} ({v[0] if v else '?'})")
            print(f"etcd3: importable in {sys.executable} with "
                  + " ".join(f"{k}={v}" for k, v in LAUNCHER_ENV.items()))
            return 0
        with EtcdServer() as srv:
            print(f"etcd pid {srv.pid} listening at {srv.client_url}", flush=True)
            print(f"export PADDLE_ACP_ETCD_MASTER={srv.master_url}", flush=True)
            for k, v in LAUNCHER_ENV.items():
                print(f"export {k}={v}", flush=True)
            try:
                while srv.alive():
                    time.sleep(1)
            except KeyboardInterrupt:
                pass
        return 0
    except EtcdUnavailable as exc:
        print(f"etcd unavailable: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
