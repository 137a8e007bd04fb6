"""The Paddle version gate and the Paddle-version-specific branches.

ci/matrix.py runs this file on every Paddle of the matrix (2.6.2, 3.0.0, 3.2.2, 3.3.1): the tests
marked for one Paddle series run there, on the version their branch is for.
"""
import os
import signal
import subprocess
import sys
import venv

import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.e2e import (
    REPO,
    assert_same_as_reference,
    describe,
    is_done,
    key_of,
    load_result,
    read_log,
    run_script,
    strip_pid,
)
from support.paddle_compat import MAJOR

import paddle_acp
from paddle_acp.adapter import version as pv
from paddle_acp.adapter.programs import is_training_program, program_info
from paddle_acp.errors import CheckpointError, UnsupportedPaddleError

RNG_WARNING = "cannot save the CPU random generator's engine state"
on_26 = pytest.mark.skipif(MAJOR != 2, reason="the Paddle 2.6 branch (ci/matrix.py runs it on 2.6.2)")
on_3x = pytest.mark.skipif(MAJOR < 3, reason="the Paddle 3.x branch")


# -- the verdict for a version string ------------------------------------------------------------
@pytest.mark.parametrize("version,verdict", [
    ("2.6.2", pv.OK), ("2.6.2.post117", pv.OK), ("3.0.0", pv.OK), ("3.1.1", pv.OK), ("3.2.2", pv.OK),
    ("3.3.0", pv.OK), ("3.3.1", pv.OK), ("3.3.9", pv.OK), ("3.3.1-gpu", pv.OK),
    ("2.6.1", pv.UNSUPPORTED), ("2.6.0", pv.UNSUPPORTED), ("2.5.2", pv.UNSUPPORTED), ("1.8.5", pv.UNSUPPORTED),
    ("2.7.0", pv.UNSUPPORTED), ("2.6.1rc1", pv.UNSUPPORTED), ("2.7.0.dev20240101", pv.UNSUPPORTED),
    ("banana", pv.UNSUPPORTED), ("", pv.UNSUPPORTED), ("3", pv.UNSUPPORTED),
    ("3.4.0", pv.NEWER), ("3.4.0rc1", pv.NEWER), ("3.10.0", pv.NEWER), ("4.0.0", pv.NEWER),
    ("0.0.0", pv.DEV),
    # a pre-release or dev build of a supported release: used, with one warning
    ("3.2.0.dev20250901", pv.DEV), ("3.0.0rc1", pv.DEV), ("3.0.0b2", pv.DEV), ("3.0.0.dev20240101", pv.DEV),
    ("3.0.0-rc1", pv.DEV), ("2.6.2rc0", pv.DEV),
])
def test_classify(version, verdict):
    got, message = pv.classify(version)
    assert got == verdict, message
    if verdict != pv.OK:
        assert repr(version) in message or version in message
        assert pv.SUPPORTED_TEXT in message
    if verdict == pv.UNSUPPORTED:
        assert "pip install" in message or "not a version number" in message


def _oracle(release, pre):
    if release == (0, 0, 0):
        return pv.DEV
    if release >= (3, 4, 0):
        return pv.NEWER
    if (2, 6, 2) <= release < (2, 7, 0) or (3, 0, 0) <= release < (3, 4, 0):
        return pv.DEV if pre else pv.OK
    return pv.UNSUPPORTED


@settings(max_examples=300, deadline=None)
@given(st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 12)),
       st.sampled_from(["", "rc1", "b2", "a0", ".dev20250101", "-rc3", ".post1", "+cu118", "-gpu"]))
def test_classify_agrees_with_the_documented_ranges(release, suffix):
    version = "%d.%d.%d%s" % (release + (suffix,))
    pre = suffix.lstrip(".-")[:1] in ("r", "b", "a", "d")
    assert pv.parse(version) == (release, pre)
    assert pv.classify(version)[0] == _oracle(release, pre)


# -- the gate on import, for real ----------------------------------------------------------------
def _bare_env_with_checkout(tmp_path):
    """A fresh virtual environment without Paddle (or anything else) that sees this checkout."""
    d = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(str(d))
    site = subprocess.run([str(d / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "checkout.pth"), "w") as f:
        f.write(REPO + "\n")
    return str(d / "bin" / "python")


def test_without_paddle_the_first_use_raises_one_clear_error(tmp_path):
    """No Paddle installed at all: `import paddle_acp` succeeds (the format, storage and tools layers work
    without it: tests/unit/), and the first use that needs Paddle raises the gate's one clear error."""
    py = _bare_env_with_checkout(tmp_path)
    code = "import paddle_acp\npaddle_acp.train_epoch_range\n"  # (this venv has nothing else: tests/unit/ imports the layers)
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("paddle_acp.errors.UnsupportedPaddleError: paddle-acp needs PaddlePaddle"), p.stderr
    assert pv.SUPPORTED_TEXT in last and "pip install paddlepaddle==3.3.1" in last, last
    assert 'line 2, in <module>' in p.stderr, p.stderr  # at the use, not at the import
    # an ImportError: `try: ... except ImportError` works
    code = ("import paddle_acp\ntry:\n    paddle_acp.resumable\nexcept ImportError as e:\n    print(type(e).__name__)\n")
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
    assert p.stdout.strip() == "UnsupportedPaddleError", p.stderr


def _not_paddle(tmp_path, body):
    """A directory holding a package named ``paddle`` that is not Paddle: it reaches the gate's branches
    that no installable wheel does (there is no Paddle 2.5 wheel for Python 3.11, nor a broken one)."""
    d = tmp_path / "fake"
    (d / "paddle").mkdir(parents=True)
    (d / "paddle" / "__init__.py").write_text(body)
    return str(d)


@pytest.mark.parametrize("body,expected", [
    ("__version__ = '2.5.2'\n",
     "paddle_acp.errors.UnsupportedPaddleError: installed Paddle 2.5.2 is not supported: paddle-acp supports "
     "Paddle " + pv.SUPPORTED_TEXT),
    ("__version__ = '2.6.1rc1'\n", "installed Paddle 2.6.1rc1 is not supported"),
    ("import paddle_missing_dependency\n",
     "Paddle is installed but failed to import (missing module 'paddle_missing_dependency')"),
    ("raise ImportError('libcudart.so.12: cannot open shared object file')\n",
     "Paddle is installed but failed to import: libcudart.so.12: cannot open shared object file"),
    # whatever Paddle's import raises becomes the one clear error, naming the cause (they passed through raw)
    ("raise RuntimeError('(PreconditionNotMet) Cannot load cudnn shared library')\n",
     "paddle_acp.errors.UnsupportedPaddleError: Paddle is installed but failed to import (RuntimeError): "
     "(PreconditionNotMet) Cannot load cudnn shared library"),
    ("raise OSError(12, 'Cannot allocate memory')\n",
     "paddle_acp.errors.UnsupportedPaddleError: Paddle is installed but failed to import (OSError): "
     "[Errno 12] Cannot allocate memory"),
    ("raise ValueError('bad flag FLAGS_x')\n",
     "paddle_acp.errors.UnsupportedPaddleError: Paddle is installed but failed to import (ValueError): bad flag"),
])
def test_import_with_an_unusable_paddle_raises_one_clear_error(tmp_path, body, expected):
    py = _bare_env_with_checkout(tmp_path)
    env = dict(os.environ, PYTHONPATH=_not_paddle(tmp_path, body))
    p = subprocess.run([py, "-c", "import paddle_acp"], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert p.returncode == 1
    assert expected in p.stderr.strip().splitlines()[-1], p.stderr


_RELABEL = """import importlib, os, sys
sys.path.remove(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
del sys.modules["paddle"]
real = importlib.import_module("paddle")
real.__version__ = %r
sys.modules["paddle"] = real
"""


@pytest.mark.parametrize("version", ["3.2.0.dev20250901", "3.0.0rc1"])
def test_import_of_a_prerelease_of_a_supported_paddle_is_accepted_with_one_warning(tmp_path, version):
    """The installed Paddle relabelled as a dev/pre build of a supported release: `import paddle_acp`
    works (it was refused) with exactly one warning, naming the version."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_ACP_")}
    env["PYTHONPATH"] = _not_paddle(tmp_path, _RELABEL % version) + os.pathsep + REPO
    code = "import paddle_acp\nprint('version', paddle_acp.PADDLE_VERSION)\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "version " + version, p.stdout
    warnings = [line for line in p.stderr.splitlines() if "[paddle_acp] WARNING" in line]
    assert len(warnings) == 1, p.stderr
    assert version in warnings[0] and "pre-release or development build of a supported release" in warnings[0]


def test_zlib_works_after_importing_paddle_acp_then_paddle():
    """Paddle 2.6.2 exports its own zlib; paddle_acp loads Python's first, so zlib and NumPy 2's
    numpy.random (which inflates at import) keep working (they crashed: `python -m paddle_acp run`)."""
    code = ("import paddle_acp, paddle, zlib\n"
            "assert zlib.decompress(zlib.compress(b'paddle' * 100)) == b'paddle' * 100\n"
            "import numpy.random\n"
            "print(numpy.random.default_rng(1).integers(0, 100, 3).tolist())\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_ACP_")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(os.path.dirname(REPO)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1].startswith("["), p.stdout


def test_import_on_this_paddle_is_quiet_and_records_the_version():
    assert paddle_acp.PADDLE_VERSION == paddle.__version__
    assert pv.classify(paddle.__version__)[0] == pv.OK  # every Paddle of the matrix is in range
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_ACP_")}
    p = subprocess.run([sys.executable, "-c", "import paddle_acp"], capture_output=True, text=True, env=env,
                       cwd=os.path.dirname(REPO) if os.environ.get("PADDLE_ACP_TEST_INSTALLED") == "1" else REPO)
    assert p.returncode == 0, p.stderr
    assert "WARNING" not in p.stdout + p.stderr, p.stderr  # nothing to warn about on a supported Paddle
    assert RNG_WARNING not in p.stdout + p.stderr  # the 2.6 RNG warning comes when checkpointing starts


def test_unsupported_paddle_error_is_an_import_error():
    assert issubclass(UnsupportedPaddleError, ImportError)
    assert issubclass(UnsupportedPaddleError, paddle_acp.AcpError)


# -- Paddle 2.6: PIR is refused, never silently skipped ------------------------------------------
def _pir_sgd_program():
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("vx", [-1, 4], "float32")
        w = paddle.create_parameter([4, 1], "float32")
        loss = paddle.mean(paddle.matmul(x, w))
        paddle.optimizer.SGD(0.1).minimize(loss)
    return main, startup, loss


@on_26
def test_pir_is_refused_on_paddle_26(tmp_path, monkeypatch):
    paddle.enable_static()
    assert pv.pir_refusal() is not None
    with paddle.pir_utils.IrGuard():
        main, startup, loss = _pir_sgd_program()
        assert isinstance(main, paddle.pir.Program)
        for probe in (program_info, is_training_program):
            with pytest.raises(CheckpointError, match="does not support on Paddle 2.6.*legacy IR"):
                probe(main)
        monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path / "ckpt"))
        monkeypatch.setenv("PADDLE_JOB_ID", "pir26")
        with pytest.raises(CheckpointError, match="runs the training loop in PIR.*FLAGS_enable_pir_api"):
            for _ in paddle_acp.train_epoch_range(2):
                pass
    assert not (tmp_path / "ckpt" / "pir26" / "range").exists()


@on_3x
def test_pir_is_accepted_on_paddle_3():
    paddle.enable_static()
    assert pv.pir_refusal() is None
    pv.refuse_pir_mode()  # no error
    with paddle.pir_utils.IrGuard():
        main, _, _ = _pir_sgd_program()
        assert is_training_program(main) is True


# -- Paddle 2.6: dropout after a resume (the documented limitation) -------------------------------
@on_26
def test_dropout_resume_on_paddle_26_restores_the_rest_and_warns(tmp_path):
    """Everything but the CPU engine is restored: the run resumes at the killed epoch with the epochs
    before it untouched, the warning names the consequence once per process, and the dropout stream
    after the resume does differ (so the warning is no false alarm). Bit-identity without dropout is
    tests/e2e/test_e2e_resume.py's job on 2.6 (it runs there with --dropout 0)."""
    args = ("--epochs", 4, "--steps-per-epoch", 3)
    ref_out = tmp_path / "ref"
    ref = run_script(ref_out, None, "legacy", *args)
    assert ref.returncode == 0, describe(ref)
    assert RNG_WARNING not in ref.stdout + ref.stderr  # checkpointing off: nothing to warn about
    reference = load_result(ref_out)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = {"PADDLE_ACP_ASYNC": "0"}
    p1 = run_script(out, ckpt, "legacy", *args, "--kill-at-epoch", 2, env=env)
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    p2 = run_script(out, ckpt, "legacy", *args, "--kill-at-epoch", 2, env=env)
    assert p2.returncode == 0 and is_done(out), describe(p2)
    for p in (p1, p2):
        assert (p.stdout + p.stderr).count(RNG_WARNING) == 1, describe(p)
        assert "random ops such as dropout draw a different random stream" in p.stdout + p.stderr
    assert "resumed at epoch 2" in p2.stdout + p2.stderr, describe(p2)
    entries = read_log(out)
    assert [key_of(e) for e in entries] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    losses, _ = load_result(out)
    ref_losses, _ = reference
    for k in ((0, 0), (0, 1)):
        assert strip_pid(losses[k]) == strip_pid(ref_losses[k])
    assert strip_pid(losses[(0, 2)]) != strip_pid(ref_losses[(0, 2)]), \
        "dropout after the resume matched the uninterrupted run: does this Paddle carry the engine state now?"


@on_26
def test_no_dropout_resume_on_paddle_26_is_bit_identical(tmp_path):
    """The same kill and resume without dropout: bit-identical (parameters, Adam moments, the LR
    scheduler, NumPy's and Python's RNG all restored)."""
    args = ("--epochs", 4, "--steps-per-epoch", 3, "--dropout", 0)
    ref = run_script(tmp_path / "ref", None, "legacy", *args)
    assert ref.returncode == 0, describe(ref)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    env = {"PADDLE_ACP_ASYNC": "0"}
    p1 = run_script(out, ckpt, "legacy", *args, "--kill-at-epoch", 2, env=env)
    assert p1.returncode == -signal.SIGKILL, describe(p1)
    p2 = run_script(out, ckpt, "legacy", *args, "--kill-at-epoch", 2, env=env)
    assert p2.returncode == 0, describe(p2)
    assert "resumed at epoch 2" in p2.stdout + p2.stderr, describe(p2)
    assert_same_as_reference(load_result(out), load_result(tmp_path / "ref"))
    assert len({e["pid"] for e in read_log(out)}) == 2
