"""One Python floor: pyproject's requires-python, ruff's target-version and mypy's python_version agree.

Read from pyproject.toml's text (tomllib is 3.11+, and the floor is 3.10), so a raised or lowered
floor that forgets a tool fails here.
"""

import pathlib
import re

PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


def _section(text: str, name: str) -> str:
    """The body of ``[name]`` up to the next table header."""
    m = re.search(rf"^\[{re.escape(name)}\]\s*$(.*?)(?=^\[)", text, re.M | re.S)
    assert m is not None, f"pyproject.toml has no [{name}] table"
    return m.group(1)


def _value(body: str, key: str, table: str) -> str:
    m = re.search(rf'^{re.escape(key)}\s*=\s*"([^"]*)"', body, re.M)
    assert m is not None, f"[{table}] declares no {key}"
    return m.group(1)


def test_requires_python_ruff_and_mypy_name_the_same_floor():
    text = PYPROJECT.read_text()
    requires = _value(_section(text, "project"), "requires-python", "project")
    m = re.fullmatch(r">=\s*3\.(\d+)", requires.strip())
    assert m is not None, f"requires-python = {requires!r}: expected '>=3.N'"
    minor = int(m.group(1))
    assert _value(_section(text, "tool.ruff"), "target-version", "tool.ruff") == f"py3{minor}"
    assert _value(_section(text, "tool.mypy"), "python_version", "tool.mypy") == f"3.{minor}"
