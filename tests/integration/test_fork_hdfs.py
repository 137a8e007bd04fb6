"""A forked child never touches, drops or waits for its parent's HDFS client (issue 42 item 6).

An HDFS client has threads (libhdfs's JVM, hdfs-native's tokio runtime) that a forked child does not:
dropping the parent's client in the child, or calling it, waited forever (hdfs-native: the early
connection's fork hook dropped it; libhdfs: Pool workers hung, orphaned, after their parent was gone).
Each client runs tests/scripts/fork_children.py against the real HDFS in its own session: a Pool,
DataLoader workers and raw forks (exiting through the interpreter's exit) before the loop, and a child
refused the range's storage inside it. A hang is a failure (a hard timeout, then the whole session
killed), and no process of the session may outlive the script (an orphaned worker).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from support.server_fixtures import hdfs_server  # noqa: F401  (fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "fork_children.py")
HANG = 150  # seconds: the script needs ~5-20 s (a JVM per hadoop command for the command line client)


def _alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def run_forks(server, client, **extra):
    env = dict(os.environ, **server.client_env(), PYTHONPATH=REPO, PADDLE_ACP_HDFS_CLIENT=client,
               PADDLE_ACP_CHECKPOINT_URI=f"{server.uri}/forks/{uuid.uuid4().hex}", **extra)
    env.pop("PADDLE_ACP_CONNECT_EARLY", None)
    proc = subprocess.Popen([sys.executable, SCRIPT], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=HANG)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{client}: the script (its forks) still ran after {HANG} s: a hang\n{err[-3000:]}")
    finally:
        deadline = time.monotonic() + 10  # multiprocessing's workers end right after their parent
        while _alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphans = _alive(proc.pid)
        if orphans:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not orphans, f"{client}: a forked child outlived the script (orphaned, hung)"
    assert proc.returncode == 0, f"{client}: rc {proc.returncode}\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


BEFORE = {"pool": [0, 1, 4, 9], "loader": [12.0, 44.0], "fork": 0}
IN_LOOP = {"same": True, "in_loop_fork": 0, "in_loop_pool": [0, 1, 4, 9]}


@pytest.mark.parametrize("client", ["pyarrow", "hdfs-native"])
def test_children_forked_before_and_inside_the_loop_never_touch_the_parents_client(hdfs_server, client):  # noqa: F811
    seen = run_forks(hdfs_server, client, FORK_AFTER_CONNECT="1")
    assert seen == {"early": True, **BEFORE, **IN_LOOP}, seen


def test_children_forked_while_the_connection_is_made(hdfs_server):  # noqa: F811
    seen = run_forks(hdfs_server, "pyarrow", NO_LOOP="1")
    assert seen == BEFORE, seen


def test_children_of_the_command_line_client(hdfs_server):  # noqa: F811
    seen = run_forks(hdfs_server, "cli", FORK_AFTER_CONNECT="1", NO_LOOP="1")
    assert seen == {"early": True, **BEFORE}, seen


@pytest.mark.parametrize("client", ["hdfs-native", "pyarrow"])
def test_a_fork_after_a_storage_was_dropped(hdfs_server, client):  # noqa: F811
    """A storage opened and dropped before a fork (an ended range's): the child starts and exits (hdfs-native: it
    hung in fsspec's fork hook, which emptied the instance cache that alone still held the dropped client)."""
    seen = run_forks(hdfs_server, client, FORK_AFTER_CONNECT="1", NO_LOOP="1", DROPPED="1")
    assert seen == {"early": True, **BEFORE, "after_dropped": 0}, seen
