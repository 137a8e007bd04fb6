"""PADDLE_ACP_HOST_MEMORY: the parser (hypothesis) and the budget it gives."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.config import MIN_HOST_MEMORY, HostMemory, from_env, parse_host_memory
from paddle_acp.errors import ConfigError
from paddle_acp.runtime import budget

UNITS = {"": 1, "b": 1, "kb": 10**3, "k": 10**3, "mb": 10**6, "m": 10**6, "gb": 10**9, "g": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=10**13), st.sampled_from(sorted(UNITS)), st.sampled_from(["", " "]),
       st.booleans())
def test_integer_amounts_with_units(n, unit, space, upper):
    text = f"{n}{space}{unit.upper() if upper else unit}"
    want = n * UNITS[unit]
    if want < MIN_HOST_MEMORY or want >= 2**62:
        with pytest.raises(ConfigError, match="PADDLE_ACP_HOST_MEMORY"):
            parse_host_memory(text)
    else:
        assert parse_host_memory(text) == HostMemory(nbytes=want)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0, max_value=200, allow_nan=False).map(lambda x: round(x, 3)))
def test_percentages(p):
    text = f"{p}%"
    if 0 < p <= 90:
        hm = parse_host_memory(text)
        assert hm.percent == pytest.approx(p) and hm.nbytes is None
        assert hm.resolve(64 << 30) == max(MIN_HOST_MEMORY, int((64 << 30) * hm.percent / 100))
    else:
        with pytest.raises(ConfigError, match="percentage"):
            parse_host_memory(text)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=20))
def test_any_text_parses_or_names_the_variable(text):
    try:
        hm = parse_host_memory(text)
    except ConfigError as exc:
        assert "PADDLE_ACP_HOST_MEMORY" in str(exc) and ("amount of memory" in str(exc) or "25%" in str(exc))
        return
    assert (hm.nbytes is None) != (hm.percent is None)
    assert hm.nbytes is None or MIN_HOST_MEMORY <= hm.nbytes < 2**62


@pytest.mark.parametrize("text,want", [("512MiB", 512 << 20), ("2GB", 2 * 10**9), ("1.5GiB", 3 << 29),
                                       (" 64 mib ", 64 << 20), ("1073741824", 1 << 30), ("0.5g", 5 * 10**8)])
def test_examples(text, want):
    assert parse_host_memory(text).nbytes == want


@pytest.mark.parametrize("text", ["", "abc", "1 MiB", "-1G", "12XB", "1e9", "nan", "inf", "0%", "95%", "5 %%"])
def test_rejected(text):
    with pytest.raises(ConfigError, match="PADDLE_ACP_HOST_MEMORY"):
        parse_host_memory(text)


def test_from_env():
    assert from_env({}).host_memory is None
    assert from_env({"PADDLE_ACP_HOST_MEMORY": " "}).host_memory is None
    assert from_env({"PADDLE_ACP_HOST_MEMORY": "25%"}).host_memory == HostMemory(percent=25.0)
    with pytest.raises(ConfigError, match=r"PADDLE_ACP_HOST_MEMORY='lots'"):
        from_env({"PADDLE_ACP_CHECKPOINT_URI": "/tmp/x", "PADDLE_ACP_HOST_MEMORY": "lots"})


def test_budget_decisions():
    assert budget.decide(HostMemory(nbytes=100 << 20)).nbytes == 100 << 20
    assert budget.decide(HostMemory(percent=25.0), total=8 << 30).nbytes == 2 << 30
    # unset: half of MemAvailable, at least 1 GiB left free, never below the minimum
    assert budget.decide(None, available=16 << 30).nbytes == 8 << 30
    assert budget.decide(None, available=(3 << 29)).nbytes == 1 << 29
    assert budget.decide(None, available=512 << 20).nbytes == MIN_HOST_MEMORY
    assert budget.decide(None, available=0).nbytes == MIN_HOST_MEMORY
    live = budget.decide(None)
    assert live.nbytes is None or live.nbytes >= MIN_HOST_MEMORY
