"""Variable names: the ``PADDLE_ACP_*`` names known here, and one warning for an unknown (misspelled) one.

Known: :data:`paddle_acp.config.ENV_VARS` (the library's) and :data:`TOOLING_VARS` (this repository's tests and CI's).
"""

from __future__ import annotations

import difflib
import logging
import os
from typing import List, Mapping, Optional

from paddle_acp.config import ENV_VARS

logger = logging.getLogger("paddle_acp")

PREFIX = "PADDLE_ACP_"

# Read by this repository's tests, CI scripts and benchmarks, never by the library (tests/e2e/test_defaults.py).
TOOLING_VARS = (
    "PADDLE_ACP_REQUIRE_SERVERS",  # tests/support/server_fixtures.py: fail instead of skip without servers
    "PADDLE_ACP_TEST_INSTALLED",  # ci/matrix.py: the tests run against the installed copy
    "PADDLE_ACP_CI_CACHE",  # tests/support/servers.py: downloads and builds of the test servers
    "PADDLE_ACP_CI_QUIET",  # tests/support/servers.py
    "PADDLE_ACP_CI_KEEP_DOWNLOADS",  # tests/support/servers.py
    "PADDLE_ACP_WEED",  # tests/support/servers.py: a SeaweedFS binary
    "PADDLE_ACP_ETCD",  # tests/support/etcd.py: an etcd binary
    "PADDLE_ACP_ETCD_MASTER",  # tests/support/etcd.py prints it for a shell
    "PADDLE_ACP_VENV",  # ci/env.sh
    "PADDLE_ACP_PADDLE_SPEC",  # ci/env.sh
    "PADDLE_ACP_MATRIX_CACHE",  # ci/matrix.py
    "PADDLE_ACP_TEST_WORKERS",  # ci/test.sh, ci/matrix.py: pytest-xdist's workers (0: one after another)
)

_warned = False


def known_names() -> List[str]:
    """Every ``PADDLE_ACP_*`` name known, the library's and the tooling's."""
    return sorted({n for n in ENV_VARS if n.startswith(PREFIX)} | set(TOOLING_VARS))


def unknown_names(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The ``PADDLE_ACP_*`` names in ``env`` (``os.environ``) that are not known, sorted."""
    env = os.environ if env is None else env
    known = set(known_names())
    return sorted(n for n in env if n.startswith(PREFIX) and n not in known)


def closest(name: str) -> Optional[str]:
    """The known name closest to ``name`` (difflib), or None when none is close."""
    # compared without the common prefix, which would make every name look alike
    found = difflib.get_close_matches(name[len(PREFIX):], [k[len(PREFIX):] for k in known_names()], n=1, cutoff=0.6)
    return PREFIX + found[0] if found else None


def warn_unknown(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """Warn once per process for each unknown ``PADDLE_ACP_*`` name, naming the closest known one (never its value:
    it may be a secret); returns the names warned about (none on a later call)."""
    global _warned
    if _warned:
        return []
    _warned = True
    names = unknown_names(env)
    for name in names:
        near = closest(name)
        logger.warning("%s is set but is not a paddle-acp variable, so it is ignored%s", name,
                       f": did you mean {near}?" if near else " (the variables: README.md, Configuration)")
    return names
