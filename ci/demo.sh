#!/usr/bin/env bash
# The main job: a real training run that is SIGKILLed mid-way and resumes from its checkpoint.
# Sets up .venv on a fresh machine first. Extra arguments go to ci/demo.py (try --help).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/ci/env.sh"
cd "$ROOT"
exec "$PYTHON" ci/demo.py "$@"
