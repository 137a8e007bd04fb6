#!/usr/bin/env bash
# Create (once) the project's virtual environment in .venv and install paddle-acp into it.
# Sourced by ci/demo.sh and ci/test.sh; needs only Python 3.11 (or 3.9+) on PATH.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VENV="${PADDLE_ACP_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
fi
# Editable install with test extras; quick when everything is already there.
if ! "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >"$VENV/install.log" 2>&1; then
  cat "$VENV/install.log" >&2
  exit 1
fi
"$VENV/bin/python" -c "import paddle_acp, pytest, hypothesis" >/dev/null
export PATH="$VENV/bin:$PATH"
export PYTHON="$VENV/bin/python"
