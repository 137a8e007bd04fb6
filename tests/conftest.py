"""Fixtures shared by several test modules."""

import paddle
import pytest


@pytest.fixture(scope="module")
def static_mode():
    """Static-graph mode for a module's tests; the previous mode is restored after them."""
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    yield
    if was_dynamic:
        paddle.disable_static()
