"""Manifest: hypothesis round trips and hostile inputs."""

import json
import math
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.errors import CorruptCheckpointError
from paddle_acp.manifest import DTYPES, TENSOR_CHECKSUMS, VERSION, Manifest, ProgramRecord, RangeRecord, TensorRecord, checksum_function, seal

names = st.text(min_size=1, max_size=40)
dtype_names = st.sampled_from(sorted(DTYPES))
shapes = st.lists(st.integers(0, 6), max_size=4)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10))
json_values = st.recursive(json_scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)), max_leaves=10)


@st.composite
def manifests(draw):
    offset = 0
    programs = []
    keys = draw(st.lists(st.text("0123456789abcdef.", min_size=1, max_size=18), unique=True, max_size=3))
    for key in keys:
        tensors = []
        for name in draw(st.lists(names, unique=True, max_size=4)):
            dt = draw(dtype_names)
            shape = draw(shapes)
            nbytes = math.prod(shape) * DTYPES[dt].itemsize
            tensors.append(TensorRecord(name, dt, shape, offset, nbytes, draw(st.integers(0, 2**32 - 1))))
            offset += nbytes + draw(st.integers(0, 64))
        sched = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=8), json_values, max_size=3)))
        programs.append(ProgramRecord(key, draw(st.text(max_size=20)), tensors, sched))
    rng = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=8), json_values, max_size=3)))
    return Manifest(
        number=draw(st.integers(0, 10**9)),
        created=draw(st.floats(0, 2e9)),
        range=RangeRecord(draw(names), draw(st.integers(-1, 10**6)), draw(st.integers(-1, 10**6)), draw(st.one_of(st.none(), st.integers(0, 10**6)))),
        programs=programs,
        data_size=offset + draw(st.integers(0, 100)),
        rng=rng,
        paddle_version=draw(st.text(max_size=10)),
        ir=draw(st.sampled_from(["pir", "legacy", "legacy+pir", ""])),
        extra=draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3)),
        version=draw(st.sampled_from(sorted(TENSOR_CHECKSUMS))),
    )


@settings(max_examples=200, deadline=None)
@given(manifests())
def test_round_trip(m):
    again = Manifest.loads(m.dumps())
    assert again == m
    assert again.dumps() == m.dumps()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes_raise_corrupt_only(raw):
    with pytest.raises(CorruptCheckpointError):
        Manifest.loads(raw)


@settings(max_examples=300, deadline=None)
@given(manifests(), st.data())
def test_mutated_documents_never_crash(m, data):
    """Any field replaced by any JSON value either loads or raises CorruptCheckpointError."""
    doc = m.to_json()
    path = []
    node = doc
    while isinstance(node, (dict, list)) and node and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        node = node[key]
    if not path:
        return
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = data.draw(json_values)
    raw = seal(doc)
    try:
        Manifest.loads(raw)
    except CorruptCheckpointError:
        pass


def _valid_doc(version=VERSION):
    t = TensorRecord("w", "float32", [2, 2], 0, 16, 1)
    return Manifest(1, 0.0, RangeRecord("_range_0", 0, 3), [ProgramRecord("k", "l", [t])], 16, version=version).to_json()


def test_checksum_key_follows_the_version():
    """Version 1 (written before the switch to CRC32C) keys each tensor's zlib CRC32 as "crc32";
    version 2 keys its CRC32C as "crc32c". Each is read back with its own algorithm."""
    assert TENSOR_CHECKSUMS == {1: "crc32", 2: "crc32c"} and VERSION == 2
    for version, key in TENSOR_CHECKSUMS.items():
        doc = _valid_doc(version)
        assert doc["version"] == version and doc["programs"][0]["tensors"][0][key] == 1
        m = Manifest.loads(seal(doc))
        assert m.version == version and m.programs[0].tensors[0].checksum == 1
        other = TENSOR_CHECKSUMS[3 - version]
        doc["programs"][0]["tensors"][0][other] = doc["programs"][0]["tensors"][0].pop(key)
        with pytest.raises(CorruptCheckpointError, match=f"{key} is missing"):
            Manifest.loads(seal(doc))


def test_checksum_functions_are_the_standard_ones():
    # the catalogued check values of CRC-32 (zlib) and CRC-32C (Castagnoli) for "123456789"
    assert checksum_function(1)(b"123456789", 0) == 0xCBF43926
    assert checksum_function(2)(b"123456789", 0) == 0xE3069283


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.data(), st.sampled_from(sorted(TENSOR_CHECKSUMS)))
def test_checksums_chain_across_any_split(data, draw, version):
    """The restore path checksums a tensor piecewise as it streams: any split gives the same value."""
    fn = checksum_function(version)
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=5)))
    value, prev = 0, 0
    for c in cuts + [len(data)]:
        value = fn(data[prev:c], value)
        prev = c
    assert value == fn(data, 0)
    if version == 1:
        assert value == zlib.crc32(data)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["files"].update({"../../x": {"size": 1}}), "files must list exactly"),
        (lambda d: d.update(files={"/etc/passwd": {"size": 16}}), "files must list exactly"),
        (lambda d: d["programs"][0]["tensors"][0].update(dtype="object"), "not an allowed dtype"),
        (lambda d: d["programs"][0]["tensors"][0].update(shape=[3, 3]), "does not match shape"),
        (lambda d: d["programs"][0]["tensors"][0].update(shape=[-2, -8]), "non-negative"),
        (lambda d: d["programs"][0]["tensors"][0].update(offset=10), "lies outside"),
        (lambda d: d["programs"][0]["tensors"][0].update(nbytes=True), "wrong type"),
        (lambda d: d.update(version=99), "not supported"),
        (lambda d: d.update(format="pickle"), "format"),
        (lambda d: d["range"].update(epoch_no=-5), "epoch_no"),
        (lambda d: d["programs"].append(d["programs"][0]), "listed twice"),
        (lambda d: d.pop("range"), "range is missing"),
    ],
)
def test_hostile_manifests_rejected(mutate, message):
    doc = _valid_doc()
    Manifest.loads(seal(doc))  # the base is valid
    mutate(doc)
    with pytest.raises(CorruptCheckpointError, match=message):
        Manifest.loads(seal(doc))


def test_any_unsealed_edit_is_detected():
    doc = _valid_doc()
    raw = seal(doc)
    edited = raw.replace(b'"float32"', b'"int32"')
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        Manifest.loads(edited)
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        Manifest.loads(json.dumps(doc).encode())  # no checksum at all
