#!/usr/bin/env bash
# The whole test suite: sets up .venv on a fresh machine, then runs pytest.
# Extra arguments go to pytest (e.g. `bash ci/test.sh -k checkpointer`).
# The default run leaves out the tests marked `long` (pytest -m "not long": many real processes, kill-and-resume
# rounds, benchmark smoke runs; ~15 more minutes); `bash ci/test.sh --long` runs every test.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
step_t0=$SECONDS
step_done() {  # "[ci] step X took N s": where the time goes (.ci/run prints the same for its steps)
  echo "[ci] step $1 took $((SECONDS - step_t0)) s" >&2
  step_t0=$SECONDS
}
source "$ROOT/ci/env.sh"
cd "$ROOT"
export PYTHONUNBUFFERED=1
step_done "test.sh env (ci/env.sh)"
# Lint and import order first (seconds): a layer rule broken is a failed test run.
"$PYTHON" -m ruff check paddle_acp paddle_acp_cli.py tests ci examples
step_done "test.sh ruff"
# Types: the whole package, with mypy's strict flags for every module (pyproject.toml).
"$PYTHON" -m mypy
step_done "test.sh mypy"
select=(-m "not long")
if [ "${1:-}" = "--long" ]; then
  shift
  select=()
fi
# Two workers (pytest-xdist), each test file on one of them (--dist loadfile: a module's own servers and
# fixtures stay in one process). Most tests wait on real processes and servers: the serial run kept about one
# core of two busy (27 min against 18.5 on two workers). PADDLE_ACP_TEST_WORKERS=0 runs them one after another.
workers=(-n "${PADDLE_ACP_TEST_WORKERS:-2}" --dist loadfile)
# The Paddle-free unit tests (tests/unit/{config,format,storage,tools}/): their local cases in a venv without
# Paddle (~1 min; ci/unit_no_paddle.sh; the same selection of `long` tests as the main run); the main run below
# then runs only their HDFS and S3 cases (--unit-cases servers), where the servers are.
bash "$ROOT/ci/unit_no_paddle.sh" "${workers[@]}" "${select[@]}"
step_done "test.sh Paddle-free unit tests (ci/unit_no_paddle.sh)"
# --durations: the slowest tests are printed at the end, to keep the default run fast
"$PYTHON" -m pytest -q -p no:cacheprovider --durations=40 "${workers[@]}" --unit-cases servers "${select[@]}" "$@" tests
step_done "test.sh pytest"
