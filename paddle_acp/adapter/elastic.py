"""Paddle's elastic launchers: whether this trainer runs under one with an etcd server, and which.

Read in Paddle 3.3.1: ``paddle.distributed.launch --master etcd://HOST:PORT`` keeps the job's pods in that etcd but
exports to its trainers only ``PADDLE_MASTER`` = this incarnation's collective master, never the etcd address; the
legacy fleet launcher (``--elastic_server HOST:PORT``) exports ``PADDLE_ELASTIC_SERVER``. The trainers are the
launcher's own children, so the address is read from its command line or environment in ``/proc/<parent pid>/``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import List, Mapping, Optional, Sequence

LAUNCHER_MODULES = ("paddle.distributed.launch", "paddle.distributed.fleet.launch")
MAX_ANCESTORS = 3  # a trainer started through a shell or a wrapper still finds its launcher
ETCD_SCHEME = "etcd://"


@dataclasses.dataclass(frozen=True)
class ElasticServer:
    endpoint: str  # HOST:PORT (or etcd://HOST:PORT as given)
    source: str  # where it was found, for the log line

    def __str__(self) -> str:
        return f"{self.endpoint} ({self.source})"


def _proc_read(pid: int, name: str) -> Optional[bytes]:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _parent(pid: int) -> int:
    stat = _proc_read(pid, "stat")
    if stat is None:
        return 0
    fields = stat.rsplit(b")", 1)[-1].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def _arg(argv: Sequence[str], name: str) -> Optional[str]:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a[len(name) + 1:]
    return None


def launcher_etcd(argv: Sequence[str], its_env: Mapping[str, str]) -> Optional[str]:
    """The etcd endpoint of a process with ``argv`` and ``its_env`` that is one of Paddle's launchers, else None."""
    if not any(m in argv for m in LAUNCHER_MODULES):
        return None
    master = _arg(argv, "--master") or its_env.get("PADDLE_MASTER", "")
    if master.strip().startswith(ETCD_SCHEME):
        return master.strip()
    server = _arg(argv, "--elastic_server") or its_env.get("PADDLE_ELASTIC_SERVER", "")
    return server.strip() or None


def _split0(raw: Optional[bytes]) -> List[str]:
    return [] if raw is None else [x.decode("utf-8", "replace") for x in raw.split(b"\0") if x]


def _from_proc(pid: int) -> Optional[str]:
    argv = _split0(_proc_read(pid, "cmdline"))
    env = dict(kv.partition("=")[::2] for kv in _split0(_proc_read(pid, "environ")))
    return launcher_etcd(argv, env)


def elastic_etcd(env: Mapping[str, str]) -> Optional[ElasticServer]:
    """The etcd server named by ``PADDLE_ELASTIC_SERVER``, else by the nearest of this process's ancestors
    (:data:`MAX_ANCESTORS`) that is one of Paddle's elastic launchers; None under none."""
    server = env.get("PADDLE_ELASTIC_SERVER", "").strip()
    if server:
        return ElasticServer(server, "PADDLE_ELASTIC_SERVER")
    p = os.getpid()
    for _ in range(MAX_ANCESTORS):
        p = _parent(p)
        if p <= 1:
            return None
        found = _from_proc(p)
        if found:
            return ElasticServer(found, f"the launcher (pid {p})")
    return None


def incarnation(env: Mapping[str, str]) -> str:
    """A token every trainer of this start of the job shares, and no later start (launcher endpoints), or ``""``."""
    parts = [env.get(k, "").strip() for k in ("PADDLE_MASTER", "PADDLE_TRAINER_ENDPOINTS")]
    if not any(parts):
        return ""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
