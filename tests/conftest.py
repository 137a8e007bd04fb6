"""Fixtures shared by several test modules; Paddle-free (tests/unit/ runs in a venv without Paddle)."""

import os

import pytest

if os.environ.get("PADDLE_ACP_TEST_INSTALLED") == "1":  # ci/matrix.py tests the pip-installed copy
    import paddle_acp

    assert "site-packages" in paddle_acp.__file__, "expected the installed paddle_acp, got %s" % paddle_acp.__file__


@pytest.fixture(scope="module")
def static_mode():
    """Static-graph mode for a module's tests; the previous mode is restored after them."""
    import paddle  # here, not at the top: this file applies to the Paddle-free tests/unit/ too

    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    yield
    if was_dynamic:
        paddle.disable_static()
