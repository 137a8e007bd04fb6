"""Running ``hadoop fs`` commands for :mod:`paddle_acp.storage.hadoop_cli`: their installation, environment and
options (user, UGI, UTF-8 paths), timeouts, and the error each failure becomes (the UGI never shown).

The UGI (``user,password``) never goes on a command line, which every local user can read (``ps``,
``/proc/PID/cmdline``): each process's shell writes it once into a Hadoop configuration file of its own (mode 0600,
in a private directory of ``tempfile.mkdtemp``) that every command reads through the generic option ``-conf FILE``;
the directory is removed when the shell is collected or the process exits."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlparse
from xml.sax.saxutils import escape

from paddle_acp.storage.hadoop_cli_io import HadoopCliError, classify, stderr_tail

logger = logging.getLogger("paddle_acp")

META_TIMEOUT = 300.0  # seconds a metadata command may take (a dead NameNode makes the client retry)
DATA_TIMEOUT = 600.0  # minimum seconds for a data transfer; 1 s per 8 MB on top


def data_timeout(size: int) -> float:
    return DATA_TIMEOUT + size / (8 << 20)


def _remove_dir(directory: str, pid: int) -> None:
    """Remove a shell's -conf directory, in the process that wrote it only (not in a forked child at its exit)."""
    if os.getpid() == pid:
        shutil.rmtree(directory, ignore_errors=True)


class FsShell:
    """``$HADOOP_HOME/bin/hadoop fs -D fs.defaultFS=<default_fs> ...`` for one filesystem and user."""

    def __init__(self, hadoop_home: Optional[str], default_fs: str, user: Optional[str] = None,
                 ugi: Optional[str] = None, extra_conf: Optional[Dict[str, str]] = None):
        if not hadoop_home:
            raise HadoopCliError(
                errno.ENOENT,
                "the hadoop command line client needs a Hadoop installation: set PADDLE_EDL_HDFS_HOME "
                "or HADOOP_HOME to the directory holding bin/hadoop",
            )
        self.hadoop_home = os.path.abspath(os.path.expanduser(str(hadoop_home)))
        self.hadoop = os.path.join(self.hadoop_home, "bin", "hadoop")
        if not os.path.isfile(self.hadoop):
            raise HadoopCliError(errno.ENOENT, f"hadoop command line client: {self.hadoop} does not exist "
                                 f"(PADDLE_EDL_HDFS_HOME/HADOOP_HOME={self.hadoop_home!r})")
        if not os.access(self.hadoop, os.X_OK):
            raise HadoopCliError(errno.EACCES, f"hadoop command line client: {self.hadoop} is not executable")
        p = urlparse(default_fs)
        if p.scheme not in ("hdfs", "viewfs") or not p.netloc:
            raise ValueError(f"default_fs must look like hdfs://host:port, not {default_fs!r}")
        self.default_fs = f"{p.scheme}://{p.hostname}" + (f":{p.port}" if p.port else "")
        self.user = user or None
        self._ugi = ugi or None
        if self.user is None and self._ugi:
            self.user = self._ugi.split(",", 1)[0] or None
        self.extra_conf = dict(extra_conf or {})
        self.commands_run = 0
        self._lock = threading.Lock()
        self._conf: Optional[Tuple[int, str]] = None  # (the process, its -conf file holding the UGI)

    def __getstate__(self) -> Dict[str, Any]:  # the lock cannot be pickled; the -conf file is this process's
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_conf")}

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()
        self._conf = None

    def conf_file(self) -> Optional[str]:
        """The ``-conf`` file holding the UGI (None without one), written once per process."""
        if not self._ugi:
            return None
        pid = os.getpid()
        with self._lock:
            if self._conf is None or self._conf[0] != pid:  # (a forked child writes its own)
                directory = tempfile.mkdtemp(prefix="paddle-acp-hadoop-")  # mode 0700
                path = os.path.join(directory, "ugi.xml")
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write('<?xml version="1.0" encoding="UTF-8"?>\n<configuration>\n  <property>'
                            f"<name>hadoop.job.ugi</name><value>{escape(self._ugi)}</value></property>\n"
                            "</configuration>\n")
                weakref.finalize(self, _remove_dir, directory, pid)  # (kept by weakref's registry)
                self._conf = (pid, path)
            return self._conf[1]

    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        if self.user:
            env["HADOOP_USER_NAME"] = self.user
        # paths with non-ASCII characters: the JVM takes its charset from the locale
        if "UTF-8" not in (env.get("LC_ALL") or env.get("LANG") or "").upper().replace("UTF8", "UTF-8"):
            env["LC_ALL"] = "C.UTF-8"
        opts = env.get("HADOOP_CLIENT_OPTS", "")
        if "-Dfile.encoding" not in opts:
            env["HADOOP_CLIENT_OPTS"] = (opts + " -Dfile.encoding=UTF-8").strip()
        return env

    def base(self) -> List[str]:
        cmd = [self.hadoop, "fs"]
        conf = self.conf_file()
        if conf is not None:  # the UGI: in a file only this user can read, never on the command line
            cmd += ["-conf", conf]
        cmd += ["-D", f"fs.defaultFS={self.default_fs}"]
        for k, v in self.extra_conf.items():
            cmd += ["-D", f"{k}={v}"]
        return cmd

    def display(self, args: Sequence[str]) -> str:
        return "hadoop fs " + " ".join(args)

    def exec(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
        cmd = self.base() + list(args)
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                               env=self.env(), timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(errno.ETIMEDOUT, f"{self.display(args)} on {self.default_fs} did not finish "
                               f"within {timeout:.0f} s (killed)") from None
        except OSError as exc:
            raise HadoopCliError(exc.errno or errno.EIO, f"cannot run {self.hadoop}: {exc}") from None
        with self._lock:
            self.commands_run += 1
        logger.debug("%s: exit %d in %.2f s", self.display(args), r.returncode, time.perf_counter() - t0)
        return r

    def run(self, args: Sequence[str], what: str, paths: Sequence[str],
            timeout: float = META_TIMEOUT) -> subprocess.CompletedProcess[bytes]:
        r = self.exec(args, timeout)
        if r.returncode != 0:
            raise self.error(r, args, what, paths)
        return r

    def error(self, r: subprocess.CompletedProcess[bytes], args: Sequence[str], what: str,
               paths: Sequence[str]) -> OSError:
        stderr = r.stderr.decode("utf-8", "replace")
        cls, code = classify(stderr)
        where = ", ".join(f"{self.default_fs}{p}" for p in paths)
        msg = f"{what} {where} failed: `{self.display(args)}` exited with {r.returncode}: {stderr_tail(stderr)}"
        if self._ugi:
            msg = msg.replace(self._ugi, "***")
        return cls(code, msg)
