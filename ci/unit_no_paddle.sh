#!/usr/bin/env bash
# The Paddle-free unit tests (tests/unit/{config,format,storage,tools}/: the layers that never import Paddle, and
# tests/unit/test_without_paddle.py; tests/conftest.py's PADDLE_FREE) in a virtual environment
# WITHOUT Paddle, which proves they need none. `pip install -e .[test]` never pulls Paddle (it is not a
# dependency; this script fails if it ever did). The venv is kept in .cache/venv-no-paddle and pip's
# cache serves its wheels (pyarrow included): ~35 s the first time on a quiet machine, seconds after.
# Run by ci/test.sh; extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VENV="$ROOT/.cache/venv-no-paddle"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >"$VENV/install.log" 2>&1; then
  cat "$VENV/install.log" >&2
  exit 1
fi
if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('paddle') is None)"; then
  echo "ci/unit_no_paddle.sh: $VENV has a Paddle: installing paddle-acp must never pull it" >&2
  exit 1
fi
cd "$ROOT"
# The HDFS and S3 cases of these tests run in the main suite (ci/test.sh, real servers); here the local ones
# (tests/conftest.py's --unit-cases: the main run then leaves them out, one rule decides for both runs).
# The paths are tests/conftest.py's PADDLE_FREE, read from there: one list for both runs.
paths="$("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "tests"); import conftest; print(" ".join(conftest.PADDLE_FREE))')"
# shellcheck disable=SC2086  # (the paths have no spaces)
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --unit-cases local "$@" $paths
