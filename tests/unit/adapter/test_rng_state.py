"""RNG state capture/restore: JSON-safe and exact."""

import json
import logging
import random

import numpy as np
import paddle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.paddle_compat import CARRIES_CPU_RNG

from paddle_acp.adapter import rng as rng_state
from paddle_acp.errors import CorruptCheckpointError


@pytest.fixture(autouse=True)
def dynamic_mode():
    """Draw with eager tensors even when another test module switched Paddle to static mode."""
    was_static = not paddle.in_dynamic_mode()
    paddle.disable_static()
    yield
    if was_static:
        paddle.enable_static()


def _draws():
    return (
        paddle.rand([4]).numpy().tolist(),
        np.random.rand(3).tolist(),
        np.random.randn(2).tolist(),
        [random.random() for _ in range(3)],
    )


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 50))
def test_round_trip_through_json_is_exact(seed, burn):
    paddle.seed(seed)
    from_seed = paddle.rand([4]).numpy().tolist()  # what a CPU engine freshly seeded with `seed` draws
    paddle.seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    for _ in range(burn):
        paddle.rand([1])
        np.random.randn()
        random.random()
    state = json.loads(json.dumps(rng_state.capture()))
    expected = _draws()
    _draws()  # move every generator on
    rng_state.restore(state)
    after = _draws()
    if CARRIES_CPU_RNG:  # Paddle 3.x: every generator exactly
        assert rng_state.carries_cpu_engine()
        assert after == expected
    else:  # Paddle 2.6: no engine state to save; the CPU engine restarts from its seed
        assert not rng_state.carries_cpu_engine()
        assert [s[3] for s in state["paddle"]] == [""]
        assert after[1:] == expected[1:]
        assert after[0] == from_seed
        assert (after[0] == expected[0]) == (burn == 0)


@pytest.mark.skipif(not CARRIES_CPU_RNG, reason="the Paddle 3.x branch (2.6 never has an engine state)")
def test_state_without_engine_restarts_from_seed_and_warns(caplog):
    """A checkpoint made by Paddle 2.6 (empty engine state) restored on 3.x: seed and offset are
    restored, the CPU engine restarts from the seed, and a warning names the consequence."""
    paddle.seed(1234)
    from_seed = paddle.rand([4]).numpy().tolist()
    paddle.rand([100])
    state = json.loads(json.dumps(rng_state.capture()))
    state["paddle"] = [s[:3] + [""] for s in state["paddle"]]
    paddle.rand([7])
    rng_state._warned_missing = False
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        rng_state.restore(state)
    assert paddle.rand([4]).numpy().tolist() == from_seed
    assert any("dropout draw a different random stream" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.pop("paddle"),
        lambda s: s["numpy"].__setitem__(0, "PCG64"),
        lambda s: s["numpy"][1].pop(),
        lambda s: s["numpy"][1].__setitem__(0, -1),
        lambda s: s["python"].__setitem__(1, [1, 2]),
        lambda s: s["paddle"].__setitem__(0, ["x", 1, 2, "abc"]),
        lambda s: s["paddle"][0].__setitem__(3, "é"),
        # issue 19 item 4: values that passed validation and crashed the restore
        lambda s: s["paddle"][0].__setitem__(1, 2**70),
        lambda s: s["paddle"][0].__setitem__(2, -1),
        lambda s: s["paddle"][0].__setitem__(0, 10**9),
        lambda s: s["paddle"][0].__setitem__(3, "x"),
        lambda s: s["paddle"][0].__setitem__(3, s["paddle"][0][3] + " 5"),
        lambda s: s["python"][1].__setitem__(624, 10**6),
        lambda s: s["python"].__setitem__(0, 2),
        lambda s: s["python"].__setitem__(2, "x"),
        lambda s: s["numpy"].__setitem__(4, "x"),
        lambda s: s["numpy"].__setitem__(3, 7),
        lambda s: s["numpy"].__setitem__(2, 625),
        lambda s: s["paddle"].clear(),
        lambda s: s.update(extra=1),
    ],
)
def test_malformed_state_rejected(mutate):
    state = json.loads(json.dumps(rng_state.capture()))
    mutate(state)
    with pytest.raises(CorruptCheckpointError):
        rng_state.restore(state)


def test_validate_accepts_paddle_2_6_states():
    """Paddle 2.6 generator states have no engine text: (device, seed, offset)."""
    state = json.loads(json.dumps(rng_state.capture()))
    state["paddle"] = [s[:3] for s in state["paddle"]]
    rng_state.validate(state)


def test_another_generator_count_restores_what_matches_and_says_what_did_not(caplog):
    """A checkpoint saved with other devices visible: the generators that match (by position
    and device) are restored, the checkpoint's extra ones are ignored, and a warning names both."""
    import paddle

    paddle.seed(123)
    state = json.loads(json.dumps(rng_state.capture()))
    state["paddle"].append([0] + state["paddle"][0][1:])  # as if a GPU 0 had been visible too
    rng_state.validate(state)
    before = [s.__getstate__() for s in paddle.get_rng_state()]
    paddle.seed(7)  # move away, so the restore has something to do
    with caplog.at_level("WARNING", logger="paddle_acp"):
        rng_state.restore(state)
    assert [s.__getstate__() for s in paddle.get_rng_state()] == before
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "generator states for cpu, device 0; this process has cpu" in msg
    assert "Restored: cpu. Not restored here: none" in msg and "Ignored from the checkpoint: device 0" in msg


def test_a_generator_this_process_has_but_the_checkpoint_lacks_keeps_its_state(caplog):
    import paddle

    state = json.loads(json.dumps(rng_state.capture()))
    state["paddle"][0][0] = 3  # the checkpoint's only generator was device 3's, not the CPU's
    paddle.seed(5)
    current = [s.__getstate__() for s in paddle.get_rng_state()]
    with caplog.at_level("WARNING", logger="paddle_acp"):
        rng_state.restore(state)
    assert [s.__getstate__() for s in paddle.get_rng_state()] == current
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "Not restored here: cpu" in msg and "Ignored from the checkpoint: device 3" in msg
