"""Fixtures shared by several test modules; Paddle-free (the Paddle-free part of tests/unit/, PADDLE_FREE below,
runs in a venv without Paddle).

The layout: tests/unit/<layer>/ (one layer's code in-process), tests/integration/ (several layers together in-process,
or with a real local server), tests/e2e/ (real training processes); tests/support/, tests/scripts/ and
tests/paddle_ported/ serve all three. tests/ is on sys.path (pytest's default import mode puts this file's folder
there), so every test imports ``support`` alike; test file names are unique across the folders (no __init__.py).
"""

import os
import signal
import sys

import pytest

# A run started in the background by a shell without job control (`nohup bash .ci/run &`) inherits SIGINT ignored
# (and SIGHUP, SIGQUIT), and so would every process the tests start: the Ctrl-C tests would then see the launcher's
# choice, which paddle-acp rightly keeps, instead of a Ctrl-C. The tests' processes start with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if os.environ.get("PADDLE_ACP_TEST_INSTALLED") == "1":  # ci/matrix.py tests the pip-installed copy
    import paddle_acp

    assert "site-packages" in paddle_acp.__file__, "expected the installed paddle_acp, got %s" % paddle_acp.__file__


@pytest.fixture(autouse=True)
def _secrets_of_this_test_only():
    """The secrets a test registers (paddle_acp.secrets keeps them per process, and masks them in every later
    message) end with it: a user name another test registered once masked "someone-else" in a test of job names
    run after it in the same worker."""
    from paddle_acp import secrets

    before = set(secrets._SECRETS)
    yield
    secrets._SECRETS.clear()
    secrets._SECRETS.update(before)


# Single cases of a parametrized test that belong to the long run (`bash ci/test.sh --long`): the multi-writer
# protocol tests through the hadoop CLI backend, a JVM per call (20-80 s each); the same tests run on the other
# four backends by default, and the CLI backend's other contract tests too.
LONG_CASES = {
    f"tests/unit/storage/test_storage_contract.py::{name}[hdfs-cli]"
    for name in ("test_per_rank_fencing_on_every_backend", "test_listing_a_directory_while_others_create_it",
                 "test_global_commit_and_writer_fencing_on_every_backend",
                 "test_checkpointer_round_trip_retention_and_leftovers")
} | {  # ~17 s on S3 (its local and HDFS cases stay in the default run)
    "tests/unit/storage/test_storage_contract.py::test_listing_a_directory_while_others_create_it[s3]"}


# The Paddle-free unit tests: the folders of the layers that never import Paddle (tests/unit/test_without_paddle.py
# holds them so) and that test itself; tests/unit/runtime, adapter and compat need Paddle. They run twice in CI
# (ci/test.sh): their local cases in a venv without Paddle (ci/unit_no_paddle.sh runs exactly these paths, read
# from here, with `--unit-cases local`), then their HDFS and S3 cases in the main run (`--unit-cases servers`),
# where the real servers are. A case is a server case when a -k "hdfs or s3" would pick it (its name, its
# parametrize id or its module's name says hdfs or s3): one rule for both runs, so between them every case runs once.
PADDLE_FREE = ("tests/unit/config/", "tests/unit/format/", "tests/unit/storage/", "tests/unit/tools/",
               "tests/unit/test_without_paddle.py")
SERVER_WORDS = ("hdfs", "s3")


def pytest_addoption(parser):
    parser.addoption("--unit-cases", choices=("all", "local", "servers"), default="all",
                     help="which cases of the Paddle-free unit tests (PADDLE_FREE) run: all (default), the local ones only "
                     "(ci/unit_no_paddle.sh), or the HDFS/S3 ones only (ci/test.sh's main run, after "
                     "ci/unit_no_paddle.sh ran the local ones)")


def _server_case(item):
    return any(w in str(k).lower() for k in item.keywords for w in SERVER_WORDS)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in LONG_CASES:
            item.add_marker(pytest.mark.long)
    which = config.getoption("unit_cases")
    if which == "all":
        return
    keep, drop = [], []
    for item in items:
        unit = item.nodeid.startswith(PADDLE_FREE)
        (drop if unit and _server_case(item) != (which == "servers") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_sessionfinish(session, exitstatus):
    """Stop the session's shared HDFS and S3 servers (tests/support/server_fixtures.py), if any was started."""
    fixtures = sys.modules.get("support.server_fixtures")
    if fixtures is not None:
        fixtures.discard_shared()


@pytest.fixture(scope="module")
def static_mode():
    """Static-graph mode for a module's tests; the previous mode is restored after them."""
    import paddle  # here, not at the top: this file applies to the Paddle-free unit tests too

    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    yield
    if was_dynamic:
        paddle.disable_static()
