"""The layers that never touch Paddle work without it: ``import paddle_acp`` and every module of format/,
storage/ and tools/ import with Paddle absent, and the public names that need Paddle say so clearly.

Each check runs in a fresh interpreter where ``paddle`` cannot be imported (``sys.modules["paddle"] =
None``, as an environment without it; in CI's venv without Paddle it is not installed at all).
"""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_NO_PADDLE = "import sys\nsys.modules['paddle'] = None  # import paddle -> ModuleNotFoundError\n"


def _run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    p = subprocess.run([sys.executable, "-c", _NO_PADDLE + code], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_format_storage_and_tools_import_without_paddle():
    out = _run(
        "import importlib, json, pkgutil\n"
        "import paddle_acp\n"
        "names = []\n"
        "for pkg in ('paddle_acp.format', 'paddle_acp.storage', 'paddle_acp.tools', 'paddle_acp.config'):\n"
        "    mod = importlib.import_module(pkg)\n"
        "    names.append(pkg)\n"
        "    for info in pkgutil.walk_packages(mod.__path__, pkg + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "        names.append(info.name)\n"
        "print(json.dumps({'names': names, 'paddle': sys.modules.get('paddle') is not None,\n"
        "                  'hooked': 'paddle_acp.runtime.hook' in sys.modules}))\n")
    assert not out["paddle"] and not out["hooked"], out
    assert {"paddle_acp.format.manifest", "paddle_acp.format.engine.reader", "paddle_acp.storage.local",
            "paddle_acp.storage.s3", "paddle_acp.tools.verify"} <= set(out["names"]), out["names"]


def test_the_public_names_that_need_paddle_say_so(tmp_path):
    out = _run(
        "import json\n"
        "import paddle_acp\n"
        "errors = {}\n"
        "for name in ('train_epoch_range', 'resumable', 'PADDLE_VERSION'):\n"
        "    try:\n"
        "        getattr(paddle_acp, name)\n"
        "    except ImportError as e:\n"
        "        errors[name] = [type(e).__name__, str(e)]\n"
        "print(json.dumps(errors))\n")
    assert set(out) == {"train_epoch_range", "resumable", "PADDLE_VERSION"}, out
    for kind, message in out.values():
        assert kind == "UnsupportedPaddleError", out
        assert message.startswith("paddle-acp needs PaddlePaddle, and none is installed"), message
