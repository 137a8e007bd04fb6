"""No dead code in the package (issue 43): vulture finds no unused function, class, method, attribute,
variable or import in paddle_acp/ and paddle_acp_cli.py, beyond the short allowlist ci/vulture_allow.py
(names used by Paddle, pyarrow, the CI scripts or the public API, each with its user)."""

import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "vulture", "--min-confidence", "60"]


def _vulture(*paths: str, cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess:
    proc = subprocess.run(COMMAND + list(paths), cwd=cwd, capture_output=True, text=True, timeout=120)
    assert "No module named vulture" not in proc.stderr, "vulture is missing: pip install -e '.[test]' (ci/env.sh does)"
    return proc


def test_the_package_has_no_dead_code():
    proc = _vulture("paddle_acp", "paddle_acp_cli.py", "ci/vulture_allow.py")
    dead = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0 and not dead, (
        "dead code (remove it; if something outside the package uses it, add it to ci/vulture_allow.py "
        "saying who):\n" + "\n".join(dead) + proc.stderr)


def test_the_check_sees_dead_code(tmp_path):
    """The command above reports what it should: an unused function, method and import."""
    (tmp_path / "m.py").write_text("import os\n\n\ndef used():\n    return 1\n\n\ndef unused():\n    return used()\n\n\n"
                                   "class C:\n    def never(self):\n        return 2\n")
    out = _vulture("m.py", cwd=tmp_path).stdout
    assert "unused import 'os'" in out and "unused function 'unused'" in out and "unused method 'never'" in out, out
    assert "'used'" not in out
