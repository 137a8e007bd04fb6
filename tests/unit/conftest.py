"""tests/unit/<layer>/: one layer's code in-process, a folder per layer of paddle_acp/.

The layers that never touch Paddle (config, format, storage, tools: tests/conftest.py's PADDLE_FREE) are tested
without it: CI runs those folders' local cases in a virtual environment without Paddle (ci/test.sh:
ci/unit_no_paddle.sh, then the HDFS and S3 cases in the main run; tests/conftest.py's --unit-cases), so a test
there must not import Paddle, the adapter or the runtime (tests/conftest.py, which applies here too, imports
Paddle only inside its Paddle fixture). tests/unit/runtime, adapter and compat run with Paddle, in the main run.
The header of a run says which case it is.
"""

import importlib.util


def pytest_report_header(config):
    spec = importlib.util.find_spec("paddle")
    return "paddle-acp unit tests: Paddle %s" % ("installed" if spec is not None else "NOT installed (the Paddle-free run)")
