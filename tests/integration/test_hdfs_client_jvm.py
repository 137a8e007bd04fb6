"""The JVM that libhdfs starts in a training process: paddle-acp's options unless the user set LIBHDFS_OPTS.

Observed from outside the JVM, in a fresh process per case: a JVM started with ``-XX:TieredStopAtLevel=1``
has no C2 compiler thread, and one with the serial collector no G1 threads (the JVM names its threads).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.server_fixtures import hdfs_server  # noqa: F401  (fixture)

from paddle_acp.config.components import DEFAULT_LIBHDFS_OPTS
from paddle_acp.storage.hdfs import FirstJvm, libhdfs_jvm_options

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = r"""
import json, os, sys
from paddle_acp.storage import open_storage
st = open_storage(sys.argv[1])
st.makedirs("jvm-probe")
names = sorted({open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")})
print(json.dumps({"threads": names, "env": os.environ.get("LIBHDFS_OPTS")}))
"""


def probe(server, libhdfs_opts):
    env = dict(os.environ, **server.client_env(), PYTHONPATH=REPO)
    env.pop("LIBHDFS_OPTS", None)
    if libhdfs_opts is not None:
        env["LIBHDFS_OPTS"] = libhdfs_opts
    out = subprocess.run([sys.executable, "-c", PROBE, f"{server.uri}/jvm"], env=env, capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_client_jvm_runs_c1_alone_and_the_serial_collector(hdfs_server):  # noqa: F811
    seen = probe(hdfs_server, None)
    threads = seen["threads"]
    assert any(t.startswith("C1 CompilerThre") for t in threads), threads
    assert not any(t.startswith("C2 CompilerThre") for t in threads), threads
    assert not any(t.startswith("G1 ") for t in threads), threads
    assert seen["env"] is None  # the script's environment is as it set it


@pytest.mark.parametrize("given", ["-Xmx300m", ""])
def test_the_users_libhdfs_opts_are_left_alone(hdfs_server, given):  # noqa: F811
    seen = probe(hdfs_server, given)
    assert any(t.startswith("C2 CompilerThre") for t in seen["threads"]), seen["threads"]  # the JVM's defaults
    assert seen["env"] == given


def test_the_options_are_set_only_while_the_first_client_connects(monkeypatch):
    monkeypatch.delenv("LIBHDFS_OPTS", raising=False)
    first = FirstJvm()
    with libhdfs_jvm_options(None, first):
        assert "LIBHDFS_OPTS" not in os.environ
    monkeypatch.setenv("LIBHDFS_OPTS", "-Xmx1g")
    with libhdfs_jvm_options(DEFAULT_LIBHDFS_OPTS, first):
        assert os.environ["LIBHDFS_OPTS"] == "-Xmx1g"  # the user's
    assert os.environ["LIBHDFS_OPTS"] == "-Xmx1g"
    monkeypatch.delenv("LIBHDFS_OPTS")
    with libhdfs_jvm_options(DEFAULT_LIBHDFS_OPTS, first):
        assert os.environ["LIBHDFS_OPTS"] == DEFAULT_LIBHDFS_OPTS
    assert "LIBHDFS_OPTS" not in os.environ
    with libhdfs_jvm_options(DEFAULT_LIBHDFS_OPTS, first):  # the JVM was asked for: its options are fixed
        assert "LIBHDFS_OPTS" not in os.environ
