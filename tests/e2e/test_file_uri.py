"""``file://`` URIs are read as RFC 8089 says: the path percent-decoded, on this host only.

They were taken literally (``file:///data/pct%20dir`` wrote to a directory named ``pct%20dir``)
while pyarrow and every URL library decode them: one URI named two directories. A plain path (no
scheme) is taken literally.
"""
import os
import signal
import subprocess
import sys
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.e2e import JOB_ID, REPO, describe, is_done, run_script, script_env

from paddle_acp.errors import ConfigError
from paddle_acp.storage import open_storage

ARGS = ("--epochs", 3, "--steps-per-epoch", 2)


def _ckpts(job_dir):
    return sorted(n for _, dirs, _ in os.walk(job_dir) for n in dirs if n.startswith("ckpt-"))


def test_a_percent_encoded_file_uri_names_the_decoded_directory_for_save_resume_and_the_tools(tmp_path):
    uri = "file://" + quote(str(tmp_path)) + "/pct%20dir"
    decoded, literal = tmp_path / "pct dir", tmp_path / "pct%20dir"
    out = tmp_path / "out"
    p1 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", 2, env={"PADDLE_ACP_ASYNC": "0"})
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    assert not literal.exists()
    assert _ckpts(decoded / JOB_ID), sorted(os.listdir(tmp_path))
    # the restart reads what the first run wrote there
    p2 = run_script(out, uri, "pir", *ARGS, "--kill-at-epoch", 2, env={"PADDLE_ACP_ASYNC": "0"})
    assert p2.returncode == 0 and is_done(out), describe(p2)
    assert "resumed at epoch 2" in p2.stdout + p2.stderr, describe(p2)
    assert not literal.exists()
    # the tools read the same directory, by the URI or by its plain path
    for where in (uri, str(decoded)):
        ls = subprocess.run([sys.executable, "-m", "paddle_acp", "ls", where], cwd=REPO, env=script_env(None),
                            capture_output=True, text=True, timeout=120)
        assert ls.returncode == 0 and "ckpt-e1 " in ls.stdout and "ckpt-e2 " in ls.stdout, ls.stdout + ls.stderr


def test_a_plain_path_is_never_decoded(tmp_path):
    out = tmp_path / "out"
    p = run_script(out, tmp_path / "pct%20dir", "pir", "--epochs", 1, "--steps-per-epoch", 1)
    assert p.returncode == 0, describe(p)
    assert _ckpts(tmp_path / "pct%20dir" / JOB_ID) and not (tmp_path / "pct dir").exists()


def test_a_file_uri_naming_another_host_stops_the_job_at_start(tmp_path):
    out = tmp_path / "out"
    p = run_script(out, "file://fileserver" + str(tmp_path) + "/ckpt", "pir", "--epochs", 1, "--steps-per-epoch", 1,
                   timeout=120)
    assert p.returncode != 0, describe(p)
    assert "ConfigError" in p.stderr and "must not name the host 'fileserver'" in p.stderr, describe(p)
    assert not (out / "losses.jsonl").exists()


@pytest.mark.parametrize("uri, needle", [
    ("file://fileserver/data/x", "must not name the host 'fileserver'"),
    ("file:///data/x?v=1", "no query or fragment"),
    ("file:///data/x#frag", "no query or fragment"),
    ("file:///data/x%00y", "NUL byte"),
    ("file:relative/x", "absolute path"),
])
def test_malformed_file_uris_are_config_errors(uri, needle):
    with pytest.raises(ConfigError, match=needle):
        open_storage(uri)


def test_file_uri_forms_of_this_host():
    assert open_storage("file:///data/pct%20dir").root == "/data/pct dir"
    assert open_storage("file://localhost/data/a%25b").root == "/data/a%b"
    assert open_storage("FILE://LOCALHOST/data/x").root == "/data/x"
    assert open_storage("file:/data/%C3%A9t%C3%A9").root == "/data/été"
    assert open_storage("/data/pct%20dir").root == "/data/pct%20dir"  # a plain path: literal


_SEGMENT = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1,
                   max_size=12).filter(lambda s: s not in (".", ".."))


@settings(max_examples=200, deadline=None)
@given(st.lists(_SEGMENT, min_size=1, max_size=4))
def test_any_path_round_trips_through_its_file_uri(segments):
    """The URI that urllib (and pyarrow) build for a path names that path again."""
    path = "/" + "/".join(segments)
    assert open_storage("file://" + quote(path)).root == path
    assert open_storage("file://localhost" + quote(path, safe="/")).root == path
