"""Child processes with a file-size cap or a parent-death signal, set without a Python ``preexec_fn``.

A ``preexec_fn`` runs Python in the forked child before ``exec``; in a process that already runs threads (a
libhdfs JVM, Arrow's pools, rank 0's committer) the child can block for ever on a lock another thread held at
the fork, and ``Popen`` waits for that exec with no timeout. So the child execs a tiny wrapper first
(``python -S -c``: no site, no imports but the standard library's), which sets the limits and execs the
command: the same PID, the limits kept across ``exec``.
"""
import os
import sys
from typing import List, Optional, Sequence

_WRAPPER = (
    "import os, sys\n"
    "fsize, sig, parent = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])\n"
    "if fsize >= 0:\n"
    "    import resource\n"
    "    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))\n"
    "if sig:\n"
    "    import ctypes\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, sig, 0, 0, 0)\n"
    "    os.getppid() == parent or os._exit(70)\n"
    "os.execv(sys.argv[4], sys.argv[4:])\n"
)


def wrapped(cmd: Sequence[str], fsize: Optional[int] = None, death_signal: int = 0) -> List[str]:
    """``cmd`` run through the wrapper: files of the process capped at ``fsize`` bytes (RLIMIT_FSIZE: the
    kernel refuses to grow one past it, EFBIG), and ``death_signal`` sent to it when the thread that
    started it ends (PR_SET_PDEATHSIG, Linux). Start it with ``start_new_session=True`` for its own group."""
    cmd = [str(c) for c in cmd]
    if not os.path.isabs(cmd[0]):
        raise ValueError(f"wrapped() needs an absolute program path, got {cmd[0]!r}")
    if not sys.platform.startswith("linux"):
        death_signal = 0
    return [sys.executable, "-S", "-c", _WRAPPER, str(-1 if fsize is None else int(fsize)), str(int(death_signal)),
            str(os.getpid()), *cmd]
