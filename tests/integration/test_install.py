"""Installing paddle-acp never installs, upgrades or replaces the user's Paddle.

Each test asks pip itself (``pip install --dry-run --report``, the resolver a user's install goes
through) what installing this checkout would change, in a real environment holding a Paddle other
than the newest one (3.0.0, the environment ci/matrix.py keeps under .cache/matrix/, made on first
use), and in one holding no Paddle at all. ci/matrix.py then does the real installs.
"""
import json
import os
import shutil
import subprocess
import sys
import venv

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
REPO = os.path.dirname(HERE)
PADDLE_DISTS = ("paddlepaddle", "paddlepaddle-gpu")
OTHER_PADDLE = "3.0.0"


def _matrix_env(version):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "ci", "matrix.py"), "--prepare", version],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return os.path.join(proc.stdout.strip().splitlines()[-1], "bin", "python")


@pytest.fixture(scope="module")
def paddle_300_python():
    return _matrix_env(OTHER_PADDLE)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A fresh environment without Paddle; pip runs from this interpreter's pip (``--python``)."""
    d = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False).create(str(d))
    return str(d / "bin" / "python")


def dry_run(target_python, requirement, tmp_path):
    """{name: version} pip would install for ``requirement`` into ``target_python``'s environment."""
    report = tmp_path / ("report-%d.json" % len(list(tmp_path.iterdir())))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", target_python, "install", "--dry-run", "--quiet",
         "--disable-pip-version-check", "--report", str(report), requirement],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(report) as f:
        data = json.load(f)
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in data["install"]}


def installed_paddle(python):
    code = ("import importlib.metadata as md\n"
            "print(sorted((d.metadata['Name'].lower(), d.version) for d in md.distributions()"
            " if d.metadata['Name'].lower() in %r))" % (PADDLE_DISTS,))
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_install_keeps_an_installed_older_paddle(paddle_300_python, tmp_path):
    before = installed_paddle(paddle_300_python)
    assert "'%s'" % OTHER_PADDLE in before
    plan = dry_run(paddle_300_python, REPO, tmp_path)
    assert "paddle-acp" in plan
    assert not set(plan) & set(PADDLE_DISTS), "pip would change Paddle: %s" % plan
    # the [cpu] extra is satisfied by the Paddle that is there
    plan = dry_run(paddle_300_python, REPO + "[cpu]", tmp_path)
    assert not set(plan) & set(PADDLE_DISTS), "pip would change Paddle: %s" % plan
    assert installed_paddle(paddle_300_python) == before


def test_install_without_paddle_installs_none_and_the_cpu_extra_the_newest(bare_python, tmp_path):
    plan = dry_run(bare_python, REPO, tmp_path)
    assert "paddle-acp" in plan
    assert not set(plan) & set(PADDLE_DISTS), "pip would install Paddle: %s" % plan
    plan = dry_run(bare_python, REPO + "[cpu]", tmp_path)
    assert plan.get("paddlepaddle", "").startswith("3.3."), plan


def test_the_check_catches_a_pinned_paddle(paddle_300_python, tmp_path):
    """The same check against a copy of the project that pins Paddle (as this project once did):
    pip's plan replaces 3.0.0, so the tests above would fail on such a regression."""
    copy = tmp_path / "pinned"
    shutil.copytree(os.path.join(REPO, "paddle_acp"), str(copy / "paddle_acp"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "README.md"), str(copy / "README.md"))
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        text = f.read()
    assert "dependencies = [\n" in text
    with open(str(copy / "pyproject.toml"), "w") as f:
        f.write(text.replace("dependencies = [\n", 'dependencies = [\n    "paddlepaddle==3.3.1",\n', 1))
    plan = dry_run(paddle_300_python, str(copy), tmp_path)
    assert plan.get("paddlepaddle") == "3.3.1", plan


def _matrix_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_matrix", os.path.join(REPO, "ci", "matrix.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _wheel(project, out):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(project)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (whl,) = out.glob("*.whl")
    return str(whl)


def test_matrix_checks_the_main_environments_version_with_pips_dry_run(tmp_path, monkeypatch):
    """ci/matrix.py --main-python (.ci/run): the version this environment holds (ci/test.sh's) gets no environment of
    its own; pip's resolver, asked what a plain install of the wheel would change here, must leave Paddle alone.
    The real wheel passes; one that pins another Paddle (as this project once did) fails, naming the change."""
    matrix = _matrix_module()
    monkeypatch.setattr(matrix, "CACHE", str(tmp_path))
    (version,) = [v for k, v in matrix.paddle_dists(sys.executable).items() if k == "paddlepaddle"]
    res = matrix.main_version(version, _wheel(REPO, tmp_path / "dist"), sys.executable)
    assert res["ok"] and res["main"] and not res["problems"], res
    copy = tmp_path / "pinned"
    shutil.copytree(os.path.join(REPO, "paddle_acp"), str(copy / "paddle_acp"), ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "README.md"), str(copy / "README.md"))
    with open(os.path.join(REPO, "pyproject.toml")) as f:
        text = f.read()
    other = OTHER_PADDLE if version != OTHER_PADDLE else "3.3.1"
    with open(str(copy / "pyproject.toml"), "w") as f:
        f.write(text.replace("dependencies = [\n", f'dependencies = [\n    "paddlepaddle=={other}",\n', 1))
    res = matrix.main_version(version, _wheel(copy, tmp_path / "pinned-dist"), sys.executable)
    assert not res["ok"] and res["problems"] == [f"a plain pip install would change Paddle: {{'paddlepaddle': '{other}'}}"], res
    assert matrix.paddle_dists(sys.executable) == {"paddlepaddle": version}  # a dry run: nothing changed
