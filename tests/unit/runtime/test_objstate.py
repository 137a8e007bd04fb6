"""The script's own state: what is captured, its serialized form (hypothesis), validation, in-place restore."""

import json
import logging
import math
import random
import sys

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
    "numpy.SeedSequence": lambda s: np.random.SeedSequence(s),
    "numpy.SeedSequence[spawned]": lambda s: np.random.SeedSequence([s, 2**80 + s], pool_size=8).spawn(3)[2],
}


def draw_some(obj, n):
    """What ``obj`` draws (and, for NumPy's Generators and BitGenerators, what the children it spawns draw)."""
    if isinstance(obj, np.random.SeedSequence):
        return [[int(x) for x in c.generate_state(2)] for c in obj.spawn(n)]
    if isinstance(obj, np.random.BitGenerator):
        return [int(x) for x in obj.random_raw(n)] + [int(c.random_raw()) for c in obj.spawn(n % 3)]
    if isinstance(obj, np.random.Generator):
        return list(obj.standard_normal(n)) + [float(obj.random())] + [float(c.random()) for c in obj.spawn(n % 3)]
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


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["numpy.Generator", "numpy.Generator[Philox]", "numpy.BitGenerator"]), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 5))
def test_a_generator_restores_into_another_generator_of_its_type_spawn_count_and_seed_sequence_included(label, seed, other, n):
    """A name rebound in the loop: a restart restores the saved object's state into the one the name holds then."""
    saved = rng_factories[label](seed)
    draw_some(saved, n)
    section = json.loads(json.dumps(section_of({"module_global:rng": saved})))
    expect = draw_some(saved, 4)
    target = rng_factories[label](other)
    ScriptState("_range_0", {"module_global:rng": target}, {}).restore(section, "test")
    assert draw_some(target, 4) == expect


def test_a_version_1_section_restores_as_before():
    """Checkpoints written before seed sequences were saved: the bit state restores, the spawn count is left."""
    g = np.random.default_rng(5)
    g.random()
    section = json.loads(json.dumps(section_of({"module_global:rng": g})))
    section["version"] = 1
    del section["rng"]["module_global:rng"]["value"]["$dict"]["seed_seq"]
    expect = g.random()
    target = np.random.default_rng(5)
    target.spawn(2)
    ScriptState("_range_0", {"module_global:rng": target}, {}).restore(section, "old")
    assert target.random() == expect and target.bit_generator.seed_seq.n_children_spawned == 2


def test_a_seed_sequence_of_another_entropy_spawn_key_or_pool_size_is_refused_naming_what_differs():
    ss = np.random.SeedSequence(7)
    ss.spawn(3)
    section = section_of({"module_global:ss": ss})
    for other, field in ((np.random.SeedSequence(8), "entropy"), (np.random.SeedSequence(7).spawn(1)[0], "spawn_key"),
                         (np.random.SeedSequence(7, pool_size=8), "pool_size")):
        with pytest.raises(CheckpointError, match=f"'module_global:ss'.*SeedSequence's {field} differs"):
            ScriptState("_range_0", {"module_global:ss": other}, {}).restore(section, "ckpt-3")
    same = np.random.SeedSequence(7)
    ScriptState("_range_0", {"module_global:ss": same}, {}).restore(section, "ckpt-3")
    assert same.n_children_spawned == 3


def test_a_generator_shares_its_seed_sequence_with_a_captured_one_after_a_restore():
    ss = np.random.SeedSequence(11)
    g = np.random.default_rng(ss)
    g.spawn(2)
    ss.spawn(1)
    section = section_of({"module_global:ss": ss, "module_global:g": g})
    ss2 = np.random.SeedSequence(11)
    g2 = np.random.default_rng(ss2)
    ScriptState("_range_0", {"module_global:ss": ss2, "module_global:g": g2}, {}).restore(section, "ckpt")
    assert g2.bit_generator.seed_seq is ss2 and ss2.n_children_spawned == 3


def test_a_captured_name_rebound_after_the_open_is_saved_as_it_holds_at_each_save(caplog):
    from paddle_acp.runtime.capture import Site

    rng = np.random.default_rng(1)
    alias = rng
    site = Site(sys._getframe())
    assert "local:rng" in site.found and "local:alias" not in site.found
    script = ScriptState("_range_0", site.found, {}, site)
    with caplog.at_level(logging.WARNING, logger="paddle_acp"):
        rng = np.random.default_rng(2)
        rng.random()
        first = script.capture()
        assert first["rng"]["local:rng"]["value"]["$dict"]["seed_seq"]["$dict"]["entropy"] == 2
        rng = np.random.default_rng(3)
        script.capture()
        assert alias is not rng
        del rng  # gone: the object it held last goes on being saved
        assert script.capture()["rng"]["local:rng"]["value"]["$dict"]["seed_seq"]["$dict"]["entropy"] == 3
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "local:rng holds another numpy.Generator" in m]) == 1, said
    assert len([m for m in said if "local:alias held the same object as local:rng" in m]) == 1, said
    assert len([m for m in said if "local:rng no longer holds an RNG object since the loop opened (deleted)" in m]) == 1, said
    script.release()  # the loop ended: the frame is dropped, the last object found goes on being saved
    assert script.site is None and script.capture()["rng"]["local:rng"]["value"]["$dict"]["seed_seq"]["$dict"]["entropy"] == 3


def test_more_objects_or_bytes_than_a_checkpoint_holds_are_refused_at_the_open_naming_the_limit():
    many = {f"local:rngs[{i}]": np.random.default_rng(i) for i in range(objstate.MAX_OBJECTS + 1)}
    with pytest.raises(ConfigError, match=f"{objstate.MAX_OBJECTS + 1} captured RNG objects, more than the {objstate.MAX_OBJECTS}.*local:rngs\\[0\\]"):
        ScriptState("_range_0", many, {}).check()
    states = {f"local:rs[{i}]": np.random.RandomState(i) for i in range(400)}  # ~3.4 kB each
    with pytest.raises(ConfigError, match="bytes serialized"):
        ScriptState("_range_0", states, {}).check()
    ok = dict(list(many.items())[:1000])
    ScriptState("_range_0", ok, {}).check()
    section = json.loads(json.dumps(section_of(ok)))
    assert len(objstate.validate(section)[0]) == 1000


# -- in-place restore of nested containers -----------------------------------------------------------
plain = st.recursive(
    st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3),
              st.builds(lambda n, k: np.arange(n, dtype="float32") + k, st.integers(0, 3), st.integers(0, 3))),
    lambda c: st.one_of(st.lists(c, max_size=4), st.tuples(c, c), st.dictionaries(st.sampled_from("abcd"), c, max_size=4)),
    max_leaves=14,
)


def containers(v):
    """Every list, dict and array inside ``v`` (with ``v``), by path: the keys and the types they are taken from."""
    out = {}

    def walk(x, path):
        if isinstance(x, (list, dict, np.ndarray)):
            out[path + (type(x).__name__, getattr(x, "shape", None))] = x
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, (list, tuple)) else ()
        for k, y in items:
            walk(y, path + (type(x).__name__, k))
    walk(v, ())
    return out


@settings(max_examples=300, deadline=None)
@given(plain, plain)
def test_restore_into_gives_the_saved_value_keeping_every_container_both_sides_have(live, saved):
    from paddle_acp.runtime.inplace import restore_into

    saved = objstate.decode(json.loads(json.dumps(objstate.encode(saved))))
    before = containers(live)
    got = restore_into(live, saved)
    assert same(got, saved)
    for path, obj in containers(got).items():
        if path in before:
            assert obj is before[path], path  # the container the script holds is the restored one


def test_nested_containers_of_registered_state_and_of_a_value_are_restored_in_place():
    metrics = {"hist": [1.0, 2.0], "best": {"loss": 0.5}, "w": np.zeros(2)}
    v = acp.Value([[1], {"a": [2]}])
    state = check_state({"metrics": metrics, "v": v})
    section = json.loads(json.dumps(section_of({}, state)))
    hist, best, w, lst, inner = metrics["hist"], metrics["best"], metrics["w"], v.value, v.value[1]["a"]
    hist.append(3.0)
    best["loss"] = 0.1
    w += 1
    lst.append(9)
    inner.clear()
    ScriptState("_range_0", {}, state).restore(section, "ckpt")
    assert metrics["hist"] is hist and hist == [1.0, 2.0] and metrics["best"] is best and best == {"loss": 0.5}
    assert metrics["w"] is w and w.tolist() == [0.0, 0.0]
    assert v.value is lst and lst == [[1], {"a": [2]}] and lst[1]["a"] is inner


def test_capturable_is_the_one_decision():
    assert capturable(np.random.default_rng(0)) and capturable(np.random.RandomState(0))
    assert capturable(random.Random(0)) and capturable(np.random.PCG64(0))
    assert not capturable(random.SystemRandom()) and not capturable(random) and not capturable(np.random)
    assert not capturable(3) and not capturable([np.random.default_rng(0)])
    assert rng_kind(np.random.default_rng(0)) == "numpy.Generator"
    assert rng_kind(np.random.SeedSequence(0)) == "numpy.SeedSequence"


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
    # an object of another kind than saved: refused before anything is restored
    fresh = acp.Counter(0)
    with pytest.raises(CheckpointError, match=r"lr \(a state_dict in the checkpoint, a list here\).*PADDLE_JOB_ID"):
        ScriptState("_range_0", {}, check_state({"step": fresh, "lr": [0.1]})).restore(section, "ckpt-1")
    assert fresh == 0
    rng_section = section_of({"module_global:rng": np.random.default_rng(0)})
    with pytest.raises(CheckpointError, match="module_global:rng .a numpy.Generator in the checkpoint, a numpy.RandomState here"):
        ScriptState("_range_0", {"module_global:rng": np.random.RandomState(0)}, {}).restore(rng_section, "ckpt-2")


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
    g = np.random.default_rng([0, 2**70])
    g.spawn(2)
    return section_of({"module_global:rng": g, "local:r": random.Random(1), "local:rs": np.random.RandomState(2),
                       "local:ss": np.random.SeedSequence(9).spawn(1)[0]},
                      check_state({"step": acp.Counter(3), "arr": np.arange(3.0)}))


def _seq(section, name):
    """The encoded seed sequence of RNG ``name`` (a Generator's or a SeedSequence's), as a dict of encoded fields."""
    value = section["rng"][name]["value"]["$dict"]
    return value["seed_seq"]["$dict"] if "seed_seq" in value else value


@pytest.mark.parametrize("mutate", [
    lambda s: s.update(version=3),
    lambda s: s.update(version=True),
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
    lambda s: s["state"].update({f"k{i}": s["state"]["step"] for i in range(objstate.MAX_OBJECTS + 1)}),
    lambda s: s["rng"]["module_global:rng"]["value"]["$dict"].update(seed_seq=None),
    lambda s: _seq(s, "module_global:rng")["entropy"].__setitem__(0, -1),
    lambda s: _seq(s, "module_global:rng").update(pool_size=2),
    lambda s: _seq(s, "module_global:rng").update(pool_size=10**6),
    lambda s: _seq(s, "module_global:rng").update(n_children_spawned=2**32),
    lambda s: _seq(s, "module_global:rng").update(n_children_spawned=True),
    lambda s: _seq(s, "module_global:rng").update(spawn_key=list(range(300))),
    lambda s: _seq(s, "module_global:rng").update(extra=1),
    lambda s: _seq(s, "local:ss").pop("entropy"),
    lambda s: _seq(s, "local:ss").update(entropy=[]),
    lambda s: _seq(s, "local:ss").update(entropy="7"),
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
        elif kind == "numpy.SeedSequence":
            obj = np.random.SeedSequence(value["entropy"], spawn_key=value["spawn_key"], pool_size=value["pool_size"])
        else:
            obj = np.random.RandomState(0) if kind == "numpy.RandomState" else random.Random()
        objstate.apply_rng(kind, obj, value)


def test_more_captured_objects_than_a_checkpoint_holds_are_a_config_error_when_the_loop_opens(tmp_path, monkeypatch):
    """Not a failure at every save with no checkpoint ever committed: the loop does not start, nothing is written."""
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path / "ckpt"))
    a, b, c, d, e = ([np.random.default_rng(i * 1000 + j) for j in range(1000)] for i in range(5))  # noqa: F841
    with pytest.raises(ConfigError, match=r"5000 captured RNG objects, more than the 4096 a checkpoint holds: local:a\[0\]"):
        next(acp.train_epoch_range(2, 0))
    del a, b, c, d, e
    big = [np.random.RandomState(i) for i in range(400)]  # noqa: F841  (~3.4 kB each)
    with pytest.raises(ConfigError, match="bytes serialized, more than the 1048576"):
        next(acp.train_epoch_range(2, 0))
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").rglob("manifest.json"))


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.integers(0, 2**128), st.lists(st.integers(0, 2**70), min_size=1, max_size=6)),
       st.lists(st.integers(0, 2**64 - 1), max_size=4), st.integers(4, 16), st.integers(0, 50), st.integers(0, 50))
def test_a_seed_sequence_round_trips_through_a_manifest_and_restores_its_count_in_place(entropy, key, pool, count, other):
    ss = np.random.SeedSequence(entropy, spawn_key=tuple(key), pool_size=pool, n_children_spawned=count)
    section = section_of({"module_global:ss": ss})
    t = TensorRecord("w", "float32", [1], 0, 4, 0)
    m = Manifest(1, 0.0, RangeRecord("_range_0", 0, 3), [ProgramRecord("k", "l", [t])], 4, extra={"objects": section})
    loaded = Manifest.loads(m.dumps())
    live = np.random.SeedSequence(entropy, spawn_key=tuple(key), pool_size=pool, n_children_spawned=other)
    ident = id(live)
    ScriptState("_range_0", {"module_global:ss": live}, {}).restore(loaded.extra["objects"], "test")
    assert id(live) == ident and live.n_children_spawned == count
    assert [c.generate_state(2).tolist() for c in live.spawn(2)] == [c.generate_state(2).tolist() for c in ss.spawn(2)]


def test_a_generator_of_another_bit_generator_than_saved_is_refused_naming_it():
    section = section_of({"module_global:rng": np.random.default_rng(0)})
    with pytest.raises(CheckpointError, match="cannot restore 'module_global:rng' from ckpt-1: ValueError: its bit generator is a Philox, the checkpoint's a PCG64.*PADDLE_JOB_ID"):
        ScriptState("_range_0", {"module_global:rng": np.random.Generator(np.random.Philox(0))}, {}).restore(section, "ckpt-1")
