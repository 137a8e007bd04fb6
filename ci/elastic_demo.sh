#!/usr/bin/env bash
# Elastic training under paddle.distributed.launch with a real etcd: a trainer is SIGKILLed,
# the launcher restarts the job, paddle-acp resumes it. Sets up .venv first; extra arguments
# go to ci/elastic_demo.py (try --help; --nnodes 2 runs two launcher processes).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/ci/env.sh"
cd "$ROOT"
exec "$PYTHON" ci/elastic_demo.py "$@"
