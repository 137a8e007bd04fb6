"""The script's own state: what is captured, its serialized form (hypothesis), validation, in-place restore."""

import json
import logging
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import paddle_acp as acp
from paddle_acp.errors import CheckpointError, ConfigError, CorruptCheckpointError
from paddle_acp.format import objstate
from paddle_acp.format.manifest import Manifest, ProgramRecord, RangeRecord, TensorRecord, seal
from paddle_acp.runtime.capture import capturable, find_captured, rng_kind
from paddle_acp.runtime.objects import ScriptState, check_state

# -- values and their encoding ----------------------------------------------------------------------
ints = st.one_of(st.integers(-(2**70), 2**70), st.integers(-(10**78), 10**78))
floats = st.floats(allow_nan=True, allow_infinity=True)
arrays = st.builds(
    lambda dt, shape, seed: np.random.RandomState(seed).randint(0, 255, size=shape).astype(dt),
    st.sampled_from(objstate.DTYPES), st.lists(st.integers(0, 4), max_size=3), st.integers(0, 2**31 - 1),
)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=12), arrays,
                    arrays.map(lambda a: a.reshape(-1)[0] if a.size else np.float32(1.5)))
values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=4), st.tuples(c, c), st.dictionaries(st.text(max_size=8), c, max_size=4)),
    max_leaves=12,
)


def same(a, b) -> bool:
    """Equal in value and type, NaN equal to NaN, arrays equal in dtype, shape and bytes."""
    if isinstance(a, np.ndarray) or isinstance(a, np.generic):
        return type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=300, deadline=None)
@given(values)
def test_encode_decode_round_trip_through_json(v):
    enc = objstate.encode(v)
    text = json.dumps(enc, allow_nan=False)  # plain JSON: no NaN, nothing pickled
    assert same(objstate.decode(json.loads(text)), v)


@pytest.mark.parametrize("bad", [object(), {1: "int key"}, np.array(["a"]), b"bytes", {1, 2}, 10**100, "deep"])
def test_values_without_a_serialized_form_are_refused_naming_where(bad):
    if bad == "deep":
        bad = 0
        for _ in range(objstate.MAX_DEPTH + 1):
            bad = [bad]
    with pytest.raises(objstate.EncodeError):
        objstate.encode({"inner": bad}, "state 'x'")


rng_factories = {
    "numpy.Generator": lambda s: np.random.default_rng(s),
    "numpy.Generator[Philox]": lambda s: np.random.Generator(np.random.Philox(s)),
    "numpy.Generator[MT19937]": lambda s: np.random.Generator(np.random.MT19937(s)),
    "numpy.BitGenerator": lambda s: np.random.SFC64(s),
    "numpy.RandomState": lambda s: np.random.RandomState(s),
    "random.Random": lambda s: random.Random(s),
}


def draw_some(obj, n):
    if isinstance(obj, np.random.BitGenerator):
        return [int(x) for x in obj.random_raw(n)]
    if isinstance(obj, random.Random):
        return [obj.random() for _ in range(n)] + [obj.gauss(0, 1)]
    return list(obj.standard_normal(n)) + [float(obj.random())]


def section_of(objs, state=None):
    return ScriptState("_range_0", objs, state or {}).capture()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(rng_factories)), st.integers(0, 2**32 - 1), st.integers(0, 20))
def test_every_rng_kind_round_trips_through_a_manifest_and_restores_in_place(label, seed, burn):
    obj = rng_factories[label](seed)
    draw_some(obj, burn)  # (a cached gaussian too)
    section = section_of({"module_global:rng": obj})
    t = TensorRecord("w", "float32", [1], 0, 4, 0)
    m = Manifest(1, 0.0, RangeRecord("_range_0", 0, 3), [ProgramRecord("k", "l", [t])], 4, extra={"objects": section})
    loaded = Manifest.loads(m.dumps())
    expect = draw_some(obj, 7)  # what the object draws after the checkpoint
    ident = id(obj)
    ScriptState("_range_0", {"module_global:rng": obj}, {}).restore(loaded.extra["objects"], "test")
    assert id(obj) == ident and draw_some(obj, 7) == expect


def test_capturable_is_the_one_decision():
    assert capturable(np.random.default_rng(0)) and capturable(np.random.RandomState(0))
    assert capturable(random.Random(0)) and capturable(np.random.PCG64(0))
    assert not capturable(random.SystemRandom()) and not capturable(random) and not capturable(np.random)
    assert not capturable(np.random.SeedSequence(0)) and not capturable(3) and not capturable([np.random.default_rng(0)])
    assert rng_kind(np.random.default_rng(0)) == "numpy.Generator"


def test_find_captured_names_globals_locals_and_one_level_into_containers():
    g, r, rs = np.random.default_rng(1), random.Random(2), np.random.RandomState(3)
    inner = np.random.default_rng(4)
    deep = np.random.default_rng(5)
    module = {"__builtins__": {"x": random.Random(9)}, "rng": g, "alias": g, "n": 3, "rngs": {"train": r, 0: rs},
              "pair": (1, inner), "nested": [[deep]], "np": np}
    local = {"rng": g, "local_rng": rs, "lst": [random.Random(6)]}
    found = find_captured(module, local)
    assert list(found) == ["module_global:rng", "module_global:rngs['train']", "module_global:rngs[0]",
                           "module_global:pair[1]", "local:lst[0]"]
    assert found["module_global:rng"] is g and found["module_global:rngs[0]"] is rs
    # a loop at module level: its locals are its globals
    assert list(find_captured(module, module)) == list(find_captured(module))


def test_registered_state_restores_in_place_and_rejects_kind_changes(caplog):
    counter, value, d, lst, arr = acp.Counter(5), acp.Value(0.25), {"a": 1, "b": [1.5]}, [1, 2], np.arange(4.0)

    class Ema:
        def __init__(self):
            self.w = np.zeros(3, "float32")

        def state_dict(self):
            return {"w": self.w}

        def set_state_dict(self, st):
            self.w = st["w"]

    ema = Ema()
    ema.w += 2
    state = check_state({"step": counter, "lr": value, "d": d, "lst": lst, "arr": arr, "ema": ema})
    section = json.loads(json.dumps(section_of({}, state)))
    ids = [id(o) for _, o in state.values()]
    counter += 3
    value.value = 9.0
    d["c"] = 4
    lst.append(3)
    arr[:] = -1
    ema.w = np.ones(3, "float32")
    ScriptState("_range_0", {}, state).restore(section, "ckpt-1")
    assert counter == 5 and value.value == 0.25 and d == {"a": 1, "b": [1.5]} and lst == [1, 2]
    assert arr.tolist() == [0.0, 1.0, 2.0, 3.0] and ema.w.tolist() == [2.0, 2.0, 2.0] and ema.w.dtype == np.float32
    assert [id(o) for _, o in state.values()] == ids
    # this run has another object and lacks one: one warning each, naming them
    other = check_state({"step": acp.Counter(0), "new": acp.Value(1)})
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        ScriptState("_range_0", {}, other).restore(section, "ckpt-1")
    text = caplog.text
    assert "new" in text and "does not hold" in text and "lr" in text and "no such object" in text
    # an array of another shape cannot be restored in place: a clear error naming it
    with pytest.raises(CheckpointError, match="'arr'"):
        ScriptState("_range_0", {}, check_state({"arr": np.zeros(3)})).restore(section, "ckpt-1")


@pytest.mark.parametrize("obj,match", [
    (0, "int.*Counter"), (1.5, "float.*Value"), ("s", "str"), ((1, 2), "tuple"), (None, "NoneType"),
    (object(), "cannot save"), ({"t": object()}, "'t'"), ("read-only array", "read-only"),
])
def test_unsupported_state_is_a_config_error_at_train_epoch_range_naming_key_and_type(obj, match):
    if obj == "read-only array":
        obj = np.zeros(2)
        obj.setflags(write=False)
    gen = acp.train_epoch_range(2, state={"step": obj})
    with pytest.raises(ConfigError, match=match) as info:
        next(gen)
    assert "'step'" in str(info.value)


def test_state_too_large_is_refused_before_anything_is_written():
    big = {"a": np.zeros(objstate.MAX_BYTES // 8 + 16)}
    with pytest.raises(ConfigError, match="'big'"):
        check_state({"big": big})
    with pytest.raises(ConfigError, match="bytes serialized"):  # under the array bound, over the total
        check_state({"big": np.zeros(objstate.MAX_BYTES * 3 // 4 + 1, np.uint8)})
    grows = {"a": np.zeros(8)}
    s = ScriptState("_range_0", {}, check_state({"g": grows}))
    grows["a"] = [np.zeros(objstate.MAX_BYTES // 16) for _ in range(4)]
    with pytest.raises(CheckpointError, match="bytes serialized"):
        s.capture()


def test_value_and_counter_behave_like_their_value():
    c = acp.Counter()
    same_obj = c
    c += 2
    assert c is same_obj and int(c) == 2 and c.increment() == 3 and c + 1 == 4 and 1 + c == 4 and c < 4 and c >= 3
    assert [10, 11, 12, 13][c] == 13 and (c + 1) / 8 == 0.5 and c.state_dict() == {"value": 3}
    v = acp.Value(0.5)
    v *= 2
    assert float(v) == 1.0 and repr(v) == "Value(1.0)"


def test_track_registers_for_the_next_ranges_and_a_restart_forgets_it():
    from paddle_acp.runtime.objects import tracked

    c = acp.Counter()
    assert acp.track("steps", c) is c and tracked()["steps"] == ("state_dict", c)
    with pytest.raises(ConfigError, match="'steps'"):
        next(acp.train_epoch_range(1, state={"steps": acp.Counter()}))
    with pytest.raises(ConfigError, match="x"):
        acp.track("x", 3)
    acp.simulate_restart()
    assert tracked() == {}


# -- hostile sections ---------------------------------------------------------------------------------
def _valid_section():
    g = np.random.default_rng(0)
    return section_of({"module_global:rng": g, "local:r": random.Random(1), "local:rs": np.random.RandomState(2)},
                      check_state({"step": acp.Counter(3), "arr": np.arange(3.0)}))


@pytest.mark.parametrize("mutate", [
    lambda s: s.update(version=2),
    lambda s: s.pop("state"),
    lambda s: s["rng"].update({"": s["rng"]["local:r"]}),
    lambda s: s["rng"].update({"x" * 600: s["rng"]["local:r"]}),
    lambda s: s["rng"]["local:r"].update(kind="os.urandom"),
    lambda s: s["rng"]["local:r"].update(kind="state_dict"),
    lambda s: s["rng"]["local:r"]["value"]["$tuple"][1]["$tuple"].pop(),
    lambda s: s["rng"]["local:r"]["value"]["$tuple"].__setitem__(0, 99),
    lambda s: s["rng"]["module_global:rng"]["value"]["$dict"].update(bit_generator="Evil"),
    lambda s: s["rng"]["module_global:rng"]["value"]["$dict"]["state"]["$dict"].pop("inc"),
    lambda s: s["rng"]["local:rs"]["value"]["$dict"]["state"]["$dict"]["key"]["$array"].update(shape=[623]),
    lambda s: s["rng"]["local:rs"]["value"]["$dict"]["state"]["$dict"]["key"]["$array"].update(data="!!"),
    lambda s: s["rng"]["local:rs"]["value"]["$dict"]["state"]["$dict"]["key"]["$array"].update(dtype="object"),
    lambda s: s["state"]["arr"]["value"].update({"$pickle": "x"}),
    lambda s: s["state"]["step"]["value"]["$dict"].update(value={"$int": "1" * 100}),
    lambda s: s["state"]["step"]["value"]["$dict"].update(value=2**64),
    lambda s: s["state"].update({f"k{i}": s["state"]["step"] for i in range(300)}),
])
def test_malformed_sections_are_refused_when_the_manifest_is_read(mutate):
    section = _valid_section()
    mutate(section)
    t = TensorRecord("w", "float32", [1], 0, 4, 0)
    doc = Manifest(1, 0.0, RangeRecord("_range_0", 0, 3), [ProgramRecord("k", "l", [t])], 4).to_json()
    doc["extra"] = {"objects": section}
    with pytest.raises(CorruptCheckpointError):
        Manifest.loads(seal(doc))


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=6), st.sampled_from(["$dict", "$int", "$array", "MT19937", "PCG64"])),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.sampled_from(["$dict", "$tuple", "$int", "$float", "$array", "$scalar", "dtype", "shape", "data", "kind", "value", "x"]), c, max_size=3)),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_field_replaced_by_any_json_loads_or_raises_corrupt_only(data):
    section = _valid_section()
    node, path = section, []
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        node = node[key]
    if not path:
        return
    parent = section
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = data.draw(json_values)
    try:
        rngs, state = objstate.validate(json.loads(json.dumps(section)))
    except CorruptCheckpointError:
        return
    # accepted: it restores without an exception into objects of the kinds it names
    for kind, value in list(rngs.values()) + [v for v in state.values() if v[0] in objstate.RNG_KINDS]:
        if kind in ("numpy.Generator", "numpy.BitGenerator"):
            bitgen = getattr(np.random, value["bit_generator"])(0)
            obj = np.random.Generator(bitgen) if kind == "numpy.Generator" else bitgen
        else:
            obj = np.random.RandomState(0) if kind == "numpy.RandomState" else random.Random()
        objstate.apply_rng(kind, obj, value)
