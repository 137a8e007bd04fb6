"""Manifest: hypothesis round trips and hostile inputs."""

import copy
import json
import math
import random
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paddle_acp.errors import CorruptCheckpointError, UnknownFormatError
from paddle_acp.format.manifest import (
    DTYPES,
    FORMAT,
    PIECES_VERSION,
    TENSOR_CHECKSUMS,
    VERSION,
    Manifest,
    ProgramRecord,
    RangeRecord,
    TensorRecord,
    checksum_function,
    seal,
)

names = st.text(min_size=1, max_size=40)
dtype_names = st.sampled_from(sorted(DTYPES))
shapes = st.lists(st.integers(0, 6), max_size=4)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10))
json_values = st.recursive(json_scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)), max_leaves=10)


@st.composite
def rng_states(draw):
    """RNG states as rng_state.capture() writes them (3-tuples: Paddle 2.6; 4: Paddle 3.x)."""
    r = random.Random(draw(st.integers(0, 2**32)))
    words = [r.getrandbits(64) for _ in range(312)] + [draw(st.integers(0, 312))]
    paddle_states = [[-1, draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**64 - 1)), " ".join(map(str, words))]]
    for dev in range(draw(st.integers(0, 2))):
        paddle_states.append([dev, draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**64 - 1)), ""])
    if draw(st.booleans()):
        paddle_states = [s[:3] for s in paddle_states]
    return {
        "paddle": paddle_states,
        "numpy": ["MT19937", [r.getrandbits(32) for _ in range(624)], draw(st.integers(0, 624)), draw(st.integers(0, 1)),
                  draw(st.floats(allow_nan=False, allow_infinity=False))],
        "python": [3, [r.getrandbits(32) for _ in range(624)] + [draw(st.integers(0, 624))],
                   draw(st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)))],
    }


lr_states = st.fixed_dictionaries(
    {"last_epoch": st.integers(-1, 10**6), "last_lr": st.floats(0, 10)},
    optional={"base_lr": st.floats(0, 10), "step_size": st.integers(1, 100), "milestones": st.lists(st.integers(0, 100), max_size=3)},
)


@st.composite
def manifests(draw):
    version = draw(st.sampled_from(sorted(TENSOR_CHECKSUMS)))
    spread = draw(st.booleans())  # a part of a spread checkpoint (extra.part.share): it may hold pieces
    offset = 0
    programs = []
    keys = draw(st.lists(st.text("0123456789abcdef.", min_size=1, max_size=18), unique=True, max_size=3))
    for key in keys:
        tensors = []
        for name in draw(st.lists(names, unique=True, max_size=4)):
            dt = draw(dtype_names)
            shape = draw(shapes)
            nbytes = math.prod(shape) * DTYPES[dt].itemsize
            piece = None
            if version >= PIECES_VERSION and spread and nbytes and draw(st.booleans()):  # a byte range of the tensor
                lo = draw(st.integers(0, nbytes - 1))
                piece = (lo, draw(st.integers(lo + 1, nbytes)))
                nbytes = piece[1] - piece[0]
            tensors.append(TensorRecord(name, dt, shape, offset, nbytes, draw(st.integers(0, 2**32 - 1)), piece))
            offset += nbytes + draw(st.integers(0, 64))
        sched = draw(st.one_of(st.none(), lr_states))
        programs.append(ProgramRecord(key, draw(st.text(max_size=20)), tensors, sched))
    rng = draw(st.one_of(st.none(), rng_states()))
    return Manifest(
        number=draw(st.integers(0, 10**9)),
        created=draw(st.floats(0, 2e9)),
        range=RangeRecord(draw(names), draw(st.integers(-1, 10**6)), draw(st.integers(-1, 10**6)), draw(st.one_of(st.none(), st.integers(0, 10**6)))),
        programs=programs,
        data_size=offset + draw(st.integers(0, 100)),
        rng=rng,
        paddle_version=draw(st.text(max_size=10)),
        ir=draw(st.sampled_from(["pir", "legacy", "legacy+pir", ""])),
        extra={**draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3)),
               **({"part": {"rank": 0, "share": dict(SHARE)}} if spread else {})},
        version=version,
    )


SHARE = {"writers": "all", "share_writers": 2, "items": 1, "digest": 0}


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
    version 2 keys its CRC32C as "crc32c"; so does version 3 (a part that may hold pieces of tensors).
    Each is read back with its own algorithm."""
    assert TENSOR_CHECKSUMS == {1: "crc32", 2: "crc32c", 3: "crc32c"} and VERSION == 2 and PIECES_VERSION == 3
    for version, key in TENSOR_CHECKSUMS.items():
        doc = _valid_doc(version)
        assert doc["version"] == version and doc["programs"][0]["tensors"][0][key] == 1
        m = Manifest.loads(seal(doc))
        assert m.version == version and m.programs[0].tensors[0].checksum == 1
        other = "crc32" if key == "crc32c" else "crc32c"
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


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.data(), st.sampled_from(sorted(TENSOR_CHECKSUMS)))
def test_checksums_of_pieces_from_zero_combine_to_the_whole(data, draw, version):
    """A restore checksums a tensor's chunks on two threads, each piece from 0, and joins them in order
    (format/engine/crc.combine): any split, any algorithm of the format, gives the whole tensor's value."""
    from paddle_acp.format.engine.crc import combine

    fn = checksum_function(version)
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=5)))
    value, prev = 0, 0
    for c in cuts + [len(data)]:
        value = combine(TENSOR_CHECKSUMS[version], value, fn(data[prev:c], 0), c - prev)
        prev = c
    assert value == fn(data, 0)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["files"].update({"../../x": {"size": 1}}), "files must list exactly"),
        (lambda d: d.update(files={"/etc/passwd": {"size": 16}}), "files must list exactly"),
        (lambda d: d["programs"][0]["tensors"][0].update(dtype="object"), "not an allowed dtype"),
        (lambda d: d["programs"][0]["tensors"][0].update(shape=[3, 3]), "does not match shape"),
        (lambda d: d["programs"][0]["tensors"][0].update(shape=[-2, -8]), "non-negative"),
        (lambda d: d["programs"][0]["tensors"][0].update(shape=[0, 10**19]), "non-negative integers"),
        (lambda d: d["programs"][0]["tensors"][0].update(shape=[0, 2**40, 2**40]), "too large"),
        (lambda d: d.update(created=1e300), "not a time"),
        (lambda d: d.update(created=-1), "not a time"),
        (lambda d: d.update(number=10**15), "out of range"),
        (lambda d: d["range"].update(step=2**63), "out of range"),
        (lambda d: d["programs"][0]["tensors"][0].update(offset=2**63), "out of range"),
        (lambda d: d["programs"][0].update(lr_scheduler={"last_epoch": "x", "last_lr": 0.1}), "last_epoch has the wrong type"),
        (lambda d: d["programs"][0].update(lr_scheduler={"last_epoch": 1, "last_lr": "0.1"}), "last_lr has the wrong type"),
        (lambda d: d["programs"][0].update(lr_scheduler={"last_epoch": 1, "gamma": 10**30}), "out of range"),
        (lambda d: d["extra"].update(loader_state={"pos": -(2**64)}), "out of range"),
        (lambda d: d["programs"][0].update(lr_scheduler=[1]), "wrong type"),
        (lambda d: d["programs"][0].update(label="\ud800"), "lone surrogate"),
        (lambda d: d["programs"][0]["tensors"][0].update(offset=10), "lies outside"),
        (lambda d: d["programs"][0]["tensors"][0].update(nbytes=True), "wrong type"),
        (lambda d: d.update(version=99), "format version 99 is newer than this paddle-acp reads"),
        (lambda d: d.update(version=0), "not supported"),
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


# -- crafted manifests: the checksum recomputed, as an attacker would (issue 19, items 1-4, 6) ---------
def _sealed_text(doc_text: str) -> bytes:
    """A manifest document given as JSON text (e.g. absurdly nested), sealed with a valid checksum."""
    doc = json.loads(doc_text) if doc_text.count("[") < 500 else None
    if doc is not None:
        return seal(doc)
    # too deep for json (the point): compute the checksum over the canonical text by hand
    body = doc_text[:-1] + ',"checksum":%d}'
    canon = doc_text.encode()
    return (body % (zlib.crc32(canon) & 0xFFFFFFFF)).encode()


@pytest.mark.parametrize("where", ["extra", "rng", "top"])
def test_deep_nesting_is_corrupt_not_recursion_error(where):
    deep = "[" * 100_000 + "]" * 100_000
    doc = _valid_doc()
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    if where == "extra":
        text = text.replace('"extra":{}', '"extra":{"x":%s}' % deep)
    elif where == "rng":
        text = text.replace('"rng":null', '"rng":%s' % deep)
    else:
        text = deep
    with pytest.raises(CorruptCheckpointError, match="nested|not valid JSON|top level"):
        Manifest.loads(_sealed_text(text))


def test_nesting_depth_ignores_brackets_in_strings():
    from paddle_acp.format.untrusted_json import nesting_depth

    assert nesting_depth(b'{"a": "[[[[{{{{", "b": [[1]], "c": "\\"]]]"}') == 3
    assert nesting_depth(b"[" * 40 + b"]" * 40) == 40
    doc = _valid_doc()
    doc["extra"] = {"k": "[" * 1000}
    Manifest.loads(seal(doc))  # brackets in a string are text, not nesting


@pytest.mark.parametrize("created", ["1" + "0" * 400, "1e400", "-1e400", "1" + "0" * 5000])
def test_absurd_numbers_are_corrupt(created):
    doc = _valid_doc()
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).replace('"created":0.0', '"created":' + created)
    assert '"created":' + created in text
    canon = text.encode()
    raw = (text[:-1] + ',"checksum":%d}' % (zlib.crc32(canon) & 0xFFFFFFFF)).encode()
    with pytest.raises(CorruptCheckpointError):
        Manifest.loads(raw)


def test_manifest_size_is_capped_relative_to_the_data():
    from paddle_acp.format.manifest import MAX_MANIFEST_SIZE, max_manifest_size

    doc = _valid_doc()
    doc["extra"] = {"pad": ["x" * 1000] * 5300}  # 5 MB of padding for 16 bytes of tensors
    raw = seal(doc)
    assert len(raw) > max_manifest_size(16)
    with pytest.raises(CorruptCheckpointError, match="more than the .* allowed"):
        Manifest.loads(raw)
    with pytest.raises(CorruptCheckpointError, match="more than the .* allowed"):
        Manifest.loads(raw, data_file_size=16)
    assert max_manifest_size(10**12) == MAX_MANIFEST_SIZE
    with pytest.raises(CorruptCheckpointError, match="more than the .* allowed"):
        Manifest.loads(b" " * (MAX_MANIFEST_SIZE + 1))


_PATHS_CACHE = {}


def _leaf_paths(node, path=()):
    """Every path to a value in a JSON document."""
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaf_paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaf_paths(v, path + (i,))


hostile_values = st.one_of(
    json_values,
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**30, -(10**30), 2**64, 2**63, -1, 0, 1e300, -1e300, 1e-300, "", "x", "\u00e9", [], {}, None, True, 1.5]),
    st.lists(st.integers(-(2**65), 2**65), max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(manifests(), st.data())
def test_crafted_edits_load_exactly_or_are_corrupt(m, data):
    """An attacker's edit (any value anywhere replaced, a key dropped or added, the checksum
    recomputed) is either accepted as a manifest whose every value is in range and that
    serializes back to the same document, or rejected with CorruptCheckpointError: never
    another exception."""
    doc = copy.deepcopy(m.to_json())  # edited below: never the strategy's own objects (SHARE)
    paths = [p for p in _leaf_paths(doc) if p]
    path = data.draw(st.sampled_from(paths))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    action = data.draw(st.sampled_from(["replace", "drop", "add"]))
    if action == "replace" or not isinstance(parent, dict):
        parent[path[-1]] = data.draw(hostile_values)
    elif action == "drop":
        del parent[path[-1]]
    else:
        parent[data.draw(st.text(max_size=8))] = data.draw(hostile_values)
    try:
        raw = seal(doc)
    except (ValueError, TypeError):
        return  # not a JSON document at all (cannot be written)
    try:
        again = Manifest.loads(raw)
    except CorruptCheckpointError:
        return
    # accepted: it means exactly what it says, and every number is one the restore path can use
    assert Manifest.loads(again.dumps()) == again
    assert 0 <= again.created <= 253402300799.0 and 0 <= again.number < 10**15
    for p in again.programs:
        for t in p.tensors:
            whole = math.prod(t.shape) * DTYPES[t.dtype].itemsize
            if t.piece is None:
                assert whole == t.nbytes
            else:  # a byte range of the tensor, only in a manifest that may hold pieces
                assert again.version >= PIECES_VERSION and 0 <= t.piece[0] < t.piece[1] <= whole
                assert t.nbytes == t.piece[1] - t.piece[0]
            assert t.offset + t.nbytes <= again.data_size
            np.empty(*t.stored()) if t.nbytes == 0 else None  # a zero-size tensor can be made
    if again.rng is not None:
        from paddle_acp.adapter import rng as rng_state

        rng_state.validate(again.rng)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-(2**70), 2**70), st.booleans(), st.text(max_size=5), st.none()),
       st.one_of(st.none(), st.integers(0, 2**32 - 1)), st.booleans())
def test_a_newer_format_version_is_told_from_a_corrupt_manifest(version, checksum, global_doc):
    """Only a document of paddle-acp's own format with an integer version above the newest this build
    reads is of a newer format (UnknownFormatError, whatever its checksum: a newer format may checksum
    otherwise); any other version is corrupt, and a known one stays valid."""
    from paddle_acp.format.global_manifest import GLOBAL_FORMAT, GLOBAL_VERSION, GlobalManifest

    if global_doc:
        doc, known, load = {"format": GLOBAL_FORMAT, "version": version}, GLOBAL_VERSION, GlobalManifest.loads
    else:
        doc, known, load = _valid_doc(), max(TENSOR_CHECKSUMS), Manifest.loads
        doc["version"] = version
    assert doc["format"] in (GLOBAL_FORMAT, FORMAT)
    raw = seal(doc) if checksum is None else json.dumps(dict(doc, checksum=checksum)).encode()
    newer = isinstance(version, int) and not isinstance(version, bool) and known < version < 2**64
    try:
        load(raw)
    except UnknownFormatError as exc:
        assert newer and f"version {version} is newer" in str(exc)
    except CorruptCheckpointError:
        assert not newer
    else:
        assert not global_doc and version in TENSOR_CHECKSUMS and checksum is None
    doc["format"] = "something-else"
    with pytest.raises(CorruptCheckpointError) as err:
        load(seal(doc))
    assert not isinstance(err.value, UnknownFormatError)


@pytest.mark.parametrize("version, piece, message", [
    (2, [0, 4], "a manifest of version 2 holds whole tensors only"),
    (1, [0, 4], "a manifest of version 1 holds whole tensors only"),
    (3, [4, 4], "is not a byte range"),
    (3, [8, 4], "is not a byte range"),
    (3, [-1, 3], "is not a byte range"),
    (3, [0, 17], "is not a byte range"),
    (3, [0, True], "is not a byte range"),
    (3, [0, 4, 8], "is not a byte range"),
    (3, "0:4", "is not a byte range"),
    (3, [0, 8], "nbytes 4 does not match its piece"),
])
def test_a_crafted_piece_is_refused(version, piece, message):
    """A tensor record's ``piece`` (spread writes: bytes [start, stop) of the tensor) exists only in
    manifests of version 3 and must be a non-empty byte range of the tensor that ``nbytes`` matches."""
    doc = _valid_doc(version)
    doc["programs"][0]["tensors"][0].update(piece=piece, nbytes=4)
    with pytest.raises(CorruptCheckpointError, match=message):
        Manifest.loads(seal(doc))


def test_a_piece_round_trips_and_stores_raw_bytes():
    t = TensorRecord("w", "float32", [2, 2], 0, 6, 1, (4, 10))
    m = Manifest(1, 0.0, RangeRecord("_range_0", 0, 3), [ProgramRecord("k", "l", [t])], 16, version=PIECES_VERSION,
                 extra={"part": {"rank": 1, "share": SHARE}})
    back = Manifest.loads(m.dumps())
    assert back == m and back.programs[0].tensors[0].piece == (4, 10)
    assert t.stored() == ([6], np.dtype(np.uint8)) and t.whole_nbytes == 16
    whole = TensorRecord("w", "float32", [2, 2], 0, 16, 1)
    assert "piece" not in whole.to_json() and whole.stored() == ([2, 2], np.dtype("float32"))


@pytest.mark.parametrize("extra", [{}, {"part": {"rank": 0}}, {"part": {"rank": 0, "share": None}}, {"part": "x"}])
def test_a_piece_outside_a_share_is_refused(extra):
    """Only the part of a spread checkpoint (one that carries ``extra.part.share``) may hold pieces: a
    single process's checkpoint or a whole-tensor part with a piece would restore part of a tensor."""
    t = TensorRecord("w", "float32", [2, 2], 0, 6, 1, (4, 10))
    m = Manifest(1, 0.0, RangeRecord("_range_0", 0, 3), [ProgramRecord("k", "l", [t])], 16, version=PIECES_VERSION,
                 extra=extra)
    with pytest.raises(CorruptCheckpointError, match="is a piece of a tensor, but this is no part of a checkpoint whose"):
        Manifest.loads(m.dumps())


@given(rng_states(), st.sampled_from([("numpy", 4), ("python", 2)]), st.sampled_from([10**400, -(10**309), 2**1024]))
@settings(max_examples=20, deadline=None)
def test_a_cached_gaussian_past_floats_range_is_refused_not_a_crash(state, where, huge):
    """An integer no float holds as the cached gaussian of NumPy or Python (a crafted manifest): a clear
    CorruptCheckpointError naming it, never an OverflowError from the check itself."""
    from paddle_acp.format import rng_schema
    rng_schema.validate(state)  # as written: valid
    state[where[0]][where[1]] = huge
    with pytest.raises(CorruptCheckpointError, match="gauss"):
        rng_schema.validate(state)
