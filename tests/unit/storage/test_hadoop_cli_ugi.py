"""The hadoop CLI client's PaddleCloud UGI (``user,password``): in a private ``-conf`` file, never on a command line
(which every local user reads with ``ps``). A fake ``bin/hadoop`` records what it was given; a real ``hadoop fs``
(the session's HDFS server) reads the file."""

import gc
import os
import stat
import subprocess
import sys
import uuid

import pytest
from support.server_fixtures import hdfs_server, servers  # noqa: F401  (fixtures)

from paddle_acp.config import StorageOptions
from paddle_acp.storage import open_storage
from paddle_acp.storage.fsshell import FsShell

SECRET = "UgiPw<&>" + uuid.uuid4().hex[:8]

FAKE = r"""#!/bin/bash
# record the argv (what `ps` shows every user) and the -conf file as this command saw it, then fail
seen="$FAKE_SEEN"
tr '\0' ' ' < /proc/$$/cmdline >> "$seen/argv"; echo >> "$seen/argv"
ps -eo args >> "$seen/ps"
while [ $# -gt 0 ]; do
  if [ "$1" = -conf ]; then
    cp "$2" "$seen/conf.xml"; stat -c %a "$2" > "$seen/conf.mode"; stat -c %a "$(dirname "$2")" > "$seen/dir.mode"
    echo "$2" > "$seen/conf.path"
  fi
  shift
done
echo "ls: Call From x to nosuch.invalid:9000 failed on connection exception" >&2
exit 1
"""


@pytest.fixture
def fake_hadoop(tmp_path, monkeypatch):
    home, seen = tmp_path / "hadoop", tmp_path / "seen"
    (home / "bin").mkdir(parents=True)
    seen.mkdir()
    (home / "bin" / "hadoop").write_text(FAKE)
    (home / "bin" / "hadoop").chmod(0o755)
    monkeypatch.setenv("FAKE_SEEN", str(seen))
    return home, seen


def test_the_ugi_goes_in_a_private_conf_file_not_on_the_command_line(fake_hadoop):
    """Before: ``-D hadoop.job.ugi=user,password`` on the hadoop command line, for every local user to read."""
    home, seen = fake_hadoop
    shell = FsShell(str(home), "hdfs://nosuch.invalid:9000", ugi=f"someone,{SECRET}")
    for _ in range(2):
        with pytest.raises(OSError) as e:
            shell.run(["-stat", "/x"], "checking", ["/x"])
        assert SECRET not in str(e.value)
    argv = (seen / "argv").read_text()
    assert SECRET not in argv and "hadoop.job.ugi" not in argv and SECRET not in (seen / "ps").read_text()
    assert argv.count(" -conf ") == 2 and argv.split("\n")[0].split()[:4][2:] == ["fs", "-conf"]
    conf = (seen / "conf.xml").read_text()
    assert "<name>hadoop.job.ugi</name><value>someone,UgiPw&lt;&amp;&gt;" in conf  # XML-escaped
    assert (seen / "conf.mode").read_text().strip() == "600" and (seen / "dir.mode").read_text().strip() == "700"
    path = (seen / "conf.path").read_text().strip()
    assert argv.count(path) == 2  # written once per shell
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    del shell, e
    gc.collect()
    assert not os.path.exists(os.path.dirname(path))  # removed with the shell


def test_no_ugi_no_conf_file(fake_hadoop):
    home, seen = fake_hadoop
    shell = FsShell(str(home), "hdfs://nosuch.invalid:9000")
    assert shell.conf_file() is None and "-conf" not in shell.base()


def test_a_tool_never_shows_the_ugi_to_other_users_and_leaves_no_file(fake_hadoop, tmp_path):
    home, seen = fake_hadoop
    env = dict(os.environ, PADDLE_ACP_HDFS_CLIENT="cli", PADDLE_EDL_HDFS_HOME=str(home),
               PADDLE_EDL_HDFS_UGI=f"someone,{SECRET}", PADDLE_ACP_CONNECT_TIMEOUT="5", TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-m", "paddle_acp", "ls", "hdfs://nosuch.invalid:9000/ckpt"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "cannot reach HDFS" in p.stderr, p.stderr[-2000:]
    assert SECRET not in p.stdout + p.stderr
    assert "-conf" in (seen / "argv").read_text()
    assert SECRET not in (seen / "argv").read_text() + (seen / "ps").read_text()
    assert [n for n in os.listdir(tmp_path) if n.startswith("paddle-acp-hadoop-")] == []  # removed at exit


def test_a_real_hadoop_fs_reads_the_ugi_conf_file(hdfs_server, tmp_path, monkeypatch):  # noqa: F811
    """The generic option -conf is accepted by the real launcher's FsShell, before the -D options."""
    monkeypatch.setenv("PADDLE_ACP_HDFS_CLIENT", "cli")
    options = StorageOptions(hdfs_client="cli", hadoop_home=str(hdfs_server.hadoop_home),
                             hdfs_ugi=f"{os.environ.get('USER') or 'root'},{SECRET}", cache_dir=str(tmp_path / "c"))
    st = open_storage(f"{hdfs_server.uri}/ugi-{uuid.uuid4().hex[:8]}", options)
    st.makedirs("a")
    st.write_bytes("a/b.bin", b"payload")
    assert st.read_bytes("a/b.bin") == b"payload"
