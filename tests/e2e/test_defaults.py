"""What the environment's variables do when they are wrong (issue 42, items 4 and 5), with real processes
(the default busy policy, item 1: tests/e2e/test_busy_policy.py and tests/e2e/test_examples.py):

* a misspelled ``PADDLE_ACP_*`` variable gets one warning naming the closest known one, and no variable the
  tests and CI of this repository set is unknown (item 4);
* a bad ``PADDLE_TRAINER_ID`` is a ConfigError naming it under ``paddle-acp run`` even when the script imports
  Paddle first; a plain ``python script.py`` that imports Paddle first fails inside Paddle's own import, as
  README.md says (item 5).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support
from support.e2e import REPO, describe, script_env  # noqa: E402

from paddle_acp.config import names  # noqa: E402

CLI = os.path.join(os.path.dirname(sys.executable), "paddle-acp")


# -- item 4: unknown PADDLE_ACP_* variables -------------------------------------------------------
MISSPELLED = {"PADDLE_ACP_CHECKPOINT_URL": "PADDLE_ACP_CHECKPOINT_URI",
              "PADDLE_ACP_SAVE_INTERVALL": "PADDLE_ACP_SAVE_INTERVAL",
              "PADDLE_ACP_BUSY_POLCY": "PADDLE_ACP_BUSY_POLICY"}


def _import_acp(env_extra, code="import paddle_acp"):
    env = script_env(None, "pir", env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_a_misspelled_variable_is_named_once_with_the_closest_known_one():
    proc = _import_acp(dict(MISSPELLED, PADDLE_ACP_ZZZ_NOTHING_LIKE_IT="secret-value",
                            PADDLE_ACP_CHECKPOINT_URI="/tmp/acp-unused", PADDLE_ACP_REQUIRE_SERVERS="1"),
                       "import paddle_acp\nfrom paddle_acp.config import names\nassert names.warn_unknown() == []")
    assert proc.returncode == 0, describe(proc)
    for wrong, right in MISSPELLED.items():
        line = f"{wrong} is set but is not a paddle-acp variable, so it is ignored: did you mean {right}?"
        assert proc.stderr.count(line) == 1, proc.stderr  # once per process: a second call warns no more
    assert proc.stderr.count("PADDLE_ACP_ZZZ_NOTHING_LIKE_IT is set but is not a paddle-acp variable, so it is "
                             "ignored (the variables: README.md, Configuration)") == 1, proc.stderr
    assert "secret-value" not in proc.stderr  # a value is never shown
    assert "PADDLE_ACP_CHECKPOINT_URI is set" not in proc.stderr and "REQUIRE_SERVERS is set" not in proc.stderr


def test_known_variables_warn_nothing():
    proc = _import_acp({"PADDLE_ACP_CHECKPOINT_URI": "/tmp/acp-unused", "PADDLE_ACP_BUSY_POLICY": "auto",
                        **{n: "1" for n in names.TOOLING_VARS}})
    assert proc.returncode == 0, describe(proc)
    assert "is not a paddle-acp variable" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("tree", ["tests", "ci", ".ci", "examples", "docs"])
def test_every_variable_the_repository_sets_or_reads_is_known(tree):
    """No test or CI run warns about its own variables: every PADDLE_ACP_* name in those trees is known
    (the misspellings above excepted, and a name passed to a parser in a unit test, never set)."""
    known = set(names.known_names())
    not_set = set(MISSPELLED) | {"PADDLE_ACP_SOMETHING", "PADDLE_ACP_ZZZ_NOTHING_LIKE_IT", "PADDLE_ACP_ZZZZ",
                                 "PADDLE_ACP_ASYNK"}
    found = {}
    for root, dirs, files in os.walk(os.path.join(REPO, tree)):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".hypothesis")]
        for f in files:
            path = os.path.join(root, f)
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            for n in re.findall(r"\bPADDLE_ACP_[A-Z0-9_]*[A-Z0-9]\b", text):
                found.setdefault(n, os.path.relpath(path, REPO))
    unknown = {n: p for n, p in found.items() if n not in known and n not in not_set}
    assert not unknown, f"PADDLE_ACP_* names the package does not know (add them to config.names.TOOLING_VARS " \
                        f"or config.ENV_VARS): {unknown}"


def test_closest_name_ignores_the_common_prefix():
    assert names.closest("PADDLE_ACP_CHECKPOINT_URL") == "PADDLE_ACP_CHECKPOINT_URI"
    assert names.closest("PADDLE_ACP_ZZZZ") is None  # not "PADDLE_ACP_WEED" for the shared prefix
    assert names.unknown_names({"PADDLE_ACP_ASYNC": "1", "PADDLE_ACP_ASYNK": "1", "PADDLE_JOB": "x"}) == \
        ["PADDLE_ACP_ASYNK"]


# -- item 5: PADDLE_TRAINER_ID=abc with Paddle imported first -------------------------------------
PADDLE_FIRST = "import paddle\nimport paddle_acp\nprint('trained')\n"


@pytest.mark.parametrize("runner", ["console script", "python -m"])
def test_bad_trainer_id_is_named_by_the_runner_even_when_the_script_imports_paddle_first(tmp_path, runner):
    script = tmp_path / "paddle_first.py"
    script.write_text(PADDLE_FIRST)
    env = script_env(None, "pir", {"PADDLE_TRAINER_ID": "abc"})
    cmd = [CLI] if runner == "console script" else [sys.executable, "-m", "paddle_acp"]
    proc = subprocess.run(cmd + ["run", "--checkpoint", str(tmp_path / "ckpt"), str(script)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "ValueError" not in proc.stderr and "trained" not in proc.stdout, describe(proc)
    if runner == "console script":  # one line, status 2
        assert proc.returncode == 2, describe(proc)
        assert "paddle-acp: error: PADDLE_TRAINER_ID='abc' is not an integer" in proc.stderr, describe(proc)
    else:  # the package's import (before the runner's code) raises it
        assert proc.returncode == 1, describe(proc)
        assert "ConfigError: PADDLE_TRAINER_ID='abc' is not an integer" in proc.stderr, describe(proc)


def test_bad_trainer_id_with_paddle_imported_first_fails_in_paddle_as_documented(tmp_path):
    """Nothing of paddle-acp runs before ``import paddle`` in a plain ``python script.py``: Paddle's own logger
    fails first. README.md says when the clear error applies; this holds it to what happens."""
    script = tmp_path / "paddle_first.py"
    script.write_text(PADDLE_FIRST)
    proc = subprocess.run([sys.executable, str(script)], env=script_env(None, "pir", {"PADDLE_TRAINER_ID": "abc"}),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "trained" not in proc.stdout, describe(proc)
    assert "ValueError: invalid literal for int() with base 10: 'abc'" in proc.stderr, describe(proc)
    readme = open(os.path.join(REPO, "README.md")).read()
    assert "imports Paddle before paddle_acp" in readme and "paddle-acp run" in readme


# -- a world size above the largest global.json records (the limit itself: tests/unit/config/test_config.py) --
def test_world_size_above_the_limit_stops_a_real_job_at_start(tmp_path):
    from support.e2e import run_script

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    p = run_script(out, ckpt, "pir", "--epochs", 2, "--steps-per-epoch", 2,
                   env={"PADDLE_TRAINER_ID": 0, "PADDLE_TRAINERS_NUM": 65537, "PADDLE_ACP_PART_TIMEOUT": 5},
                   timeout=120)
    assert p.returncode != 0, describe(p)
    assert "ConfigError: PADDLE_TRAINERS_NUM='65537' is above the largest world size" in p.stderr, describe(p)
    assert not (out / "losses.jsonl").exists()  # not one epoch trained
    assert not any(n.startswith("ckpt-") for _, dirs, names in os.walk(ckpt) for n in dirs + names)
