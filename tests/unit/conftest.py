"""tests/unit/: the tests that need no Paddle, the format, storage and tools layers on real files and servers.

CI runs this folder's local cases in a virtual environment without Paddle (ci/test.sh: ci/unit_no_paddle.sh,
then the HDFS and S3 cases in the main run; tests/conftest.py's --unit-cases), so a test here
must not import Paddle, the adapter or the runtime (tests/conftest.py, which applies here too, imports
Paddle only inside its Paddle fixture). The header of a run says which case it is.
"""

import importlib.util


def pytest_report_header(config):
    spec = importlib.util.find_spec("paddle")
    return "paddle-acp unit tests: Paddle %s" % ("installed" if spec is not None else "NOT installed (the Paddle-free run)")
