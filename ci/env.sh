#!/usr/bin/env bash
# Create (once) the project's virtual environment in .venv and install paddle-acp into it.
# Sourced by ci/demo.sh and ci/test.sh; needs only Python 3.11 (or 3.10+) on PATH.
# Paddle is not a dependency of paddle-acp: a venv without Paddle gets the CPU wheel
# (PADDLE_ACP_PADDLE_SPEC, default paddlepaddle==3.3.1); a Paddle already there (any supported
# version, CPU or GPU) is never replaced, and the install fails if anything tried to.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VENV="${PADDLE_ACP_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
fi
_paddle_dists() {  # "name==version" of the installed Paddle distributions (none: empty)
  "$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md
print(" ".join(sorted(f"{d.metadata['Name'].lower()}=={d.version}" for d in md.distributions()
                      if (d.metadata["Name"] or "").lower() in ("paddlepaddle", "paddlepaddle-gpu"))))
PYEOF
}
if ! "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('paddle') is None)"; then
  if ! "$VENV/bin/python" -m pip install -q "${PADDLE_ACP_PADDLE_SPEC:-paddlepaddle==3.3.1}" >"$VENV/install.log" 2>&1; then
    cat "$VENV/install.log" >&2
    exit 1
  fi
fi
BEFORE="$(_paddle_dists)"
# Editable install with test extras; quick when everything is already there.
if ! "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >"$VENV/install.log" 2>&1; then
  cat "$VENV/install.log" >&2
  exit 1
fi
AFTER="$(_paddle_dists)"
if [ "$BEFORE" != "$AFTER" ]; then
  echo "ci/env.sh: installing paddle-acp changed Paddle in $VENV: '$BEFORE' -> '$AFTER'" >&2
  exit 1
fi
"$VENV/bin/python" -c "import paddle_acp, pytest, hypothesis, vulture" >/dev/null
export PATH="$VENV/bin:$PATH"
export PYTHON="$VENV/bin/python"
