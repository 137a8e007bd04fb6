"""tests/support/spawn.py: limits set by an exec wrapper, not a preexec_fn (which can deadlock a fork
from a process that runs threads, as a test's rank-0 thread and the HDFS client's do)."""
import os
import signal
import subprocess
import sys
import threading

import pytest
from support.spawn import wrapped


def test_the_file_size_cap_holds_in_the_child_and_the_pid_is_the_commands(tmp_path):
    code = ("import os, sys\n"
            "print(os.getpid(), flush=True)\n"
            "try:\n"
            "    open(sys.argv[1], 'wb').write(b'x' * 20000)\n"
            "except OSError as e:\n"
            "    print('EFBIG' if e.errno == 27 else e)\n")
    p = subprocess.Popen(wrapped([sys.executable, "-c", code, str(tmp_path / "f")], fsize=8192),
                         stdout=subprocess.PIPE, text=True)
    out = p.communicate(timeout=60)[0].split()
    assert p.returncode == 0 and out == [str(p.pid), "EFBIG"], out
    assert (tmp_path / "f").stat().st_size == 8192


def test_the_death_signal_reaches_the_child_when_its_starting_thread_ends(tmp_path):
    started = {}

    def start():
        started["p"] = subprocess.Popen(wrapped([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"],
                                                death_signal=int(signal.SIGKILL)), stdout=subprocess.PIPE, text=True,
                                        start_new_session=True)
        assert started["p"].stdout.readline().strip() == "up"  # the wrapper set the signal before it exec'd this

    t = threading.Thread(target=start)
    t.start()
    t.join()
    p = started["p"]
    try:
        assert p.wait(timeout=60) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)


def test_a_relative_program_is_refused():
    with pytest.raises(ValueError, match="absolute program path"):
        wrapped(["python3", "-c", "pass"])
