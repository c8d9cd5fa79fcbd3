"""The compiled safetensors header step (tensorscope/_stheader.c) against its Python twin
(`parsers.safetensors._fast` after `json.loads`): on every safetensors fixture and on generated
and damaged headers, whatever the C returns must be exactly what the Python path returns (every
field of every record, the user metadata), and where it declines (None) the Python path decides.
A header safetensors itself writes must never be declined (the C would then be dead code)."""
from __future__ import annotations

import json
import math
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorscope
from tensorscope.errors import FormatError
from tensorscope.model import TensorInfo
from tensorscope.parsers import safetensors as sf
from torch_oracle import FIXTURES

needs_c = pytest.mark.skipif(sf._HEADER is None, reason="the compiled step is not built")
FILES = sorted(p for p in FIXTURES.rglob("*.safetensors") if p.is_file())
FIELDS = ("name", "dtype", "shape", "stride", "storage_offset", "byte_offset", "nbytes", "file",
          "storage_key", "storage_nbytes", "path", "source_format", "role", "chunks", "has_data")


def _records(got):
    if got is None:
        return None
    tensors, meta = got
    return ([tuple(getattr(t, f) for f in FIELDS) + (dict(t.extras), type(t)) for t in tensors],
            meta)


def _python(raw: bytes, data_start: int, path="p.safetensors"):
    try:
        text = raw.decode("utf-8")
        header = sf._loads(text, path, False)
    except (UnicodeDecodeError, FormatError):
        return None
    return sf._fast(header, text, path, data_start)


def _compiled(raw: bytes, data_start: int, path="p.safetensors"):
    return sf._compiled(raw, path, data_start)


def _same(raw: bytes, data_start: int | None = None) -> tuple:
    data_start = 8 + len(raw) if data_start is None else data_start
    c, p = _records(_compiled(raw, data_start)), _records(_python(raw, data_start))
    if c is not None:
        assert c == p, raw[:200]
    return c, p


def test_the_compiled_step_is_built_where_a_compiler_is():
    # `pip install` builds tensorscope/_stheader.c (optional: without a compiler `_fast` runs).
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python path is the one in use")
    assert sf._HEADER is not None, ("tensorscope/_stheader.c is not built, or its build is "
                                    "stale (ABI): run pip install -e . again")
    import dataclasses
    assert tuple(f.name for f in dataclasses.fields(TensorInfo)) == sf._HEADER.FIELDS


@needs_c
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_as_python_reads_it(path):
    data = path.read_bytes()
    if len(data) < 8:
        return
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        return
    raw = data[8:8 + n]
    c, p = _same(raw)
    if p is not None and b"\\" not in raw:   # what safetensors writes: the C must take it
        assert c is not None


@needs_c
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_open_is_the_same_with_and_without_it(path, monkeypatch):
    def picture():
        try:
            with tensorscope.open(path) as m:
                return ([tuple(getattr(t, f) for f in FIELDS) + (dict(t.extras),)
                         for t in m.tensors], m.metadata,
                        [(a.kind, a.message, a.offset) for a in m.evidence.anomalies])
        except tensorscope.TensorscopeError as e:
            return ("error", type(e).__name__, str(e))
    compiled = picture()
    monkeypatch.setattr(sf, "_HEADER", None)
    assert picture() == compiled


def _entry(dtype="F16", shape=(4, 4), begin=0, end=32, order=("dtype", "shape", "data_offsets")):
    fields = {"dtype": json.dumps(dtype), "shape": json.dumps(list(shape)),
              "data_offsets": json.dumps([begin, end])}
    return "{" + ",".join(f'"{k}":{fields[k]}' for k in order) + "}"


def _header(entries: list[tuple[str, str]], meta: str | None = None) -> bytes:
    items = ([f'"__metadata__":{meta}'] if meta is not None else []) + \
        [f"{json.dumps(k, ensure_ascii=False)}:{v}" for k, v in entries]
    return ("{" + ",".join(items) + "}").encode()


@needs_c
@pytest.mark.parametrize("raw, taken", [
    (_header([("a", _entry())]), True),
    (_header([("a", _entry())], '{"format":"pt","x":"y"}'), True),
    (_header([("a", _entry())], "null"), True),
    (_header([("a", _entry())], "{}"), True),
    (b' \t\r\n{ "a" : { "shape" : [ 4 , 4 ] , "data_offsets" : [ 0 , 32 ] , "dtype" : "F16" } }  ',
     True),
    (_header([("\u00e9t\u00e9.\u4e2d", _entry())]), True),                  # UTF-8 names
    (_header([("b", _entry(begin=32, end=64)), ("a", _entry())]), True),    # name order
    (_header([("z", _entry("U8", (0,), 0, 0)), ("a", _entry("U8", (2,), 0, 2)),
              ("m", _entry("U8", (0,), 0, 0))]), True),                     # ties: header order
    (_header([("s", _entry("F32", (), 0, 4))]), True),                      # 0-d
    (_header([("f", _entry("F4", (3, 8), 0, 12))]), True),                  # F4 -> x2
    (_header([("f", _entry("F4", (3, 3), 0, 5))]), False),                  # 36 bits
    (_header([("a", _entry())], '{"k":1}'), False),                         # a non-string value
    (_header([("a", _entry())], '{"k":"1","k":"2"}'), False),               # duplicate meta key
    (_header([("a", _entry()), ("a", _entry(begin=32, end=64))]), False),   # duplicate name
    (_header([("a\\u0062", _entry())]).replace(b"\\\\", b"\\"), False),     # an escape
    (_header([("a", _entry(begin=1, end=33))]), False),                     # a hole
    (_header([("a", _entry(end=31))]), False),                              # size
    (_header([("a", _entry("X9"))]), False),                                # unknown dtype
    (_header([("a", _entry(shape=(2 ** 64, 1)))]), False),
    (_header([("a", _entry(shape=(2 ** 63, 4)))]), False),                  # numel overflow
    (b'{"a":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32],"x":1}}', False),
    (b'{"a":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32],"dtype":"F16"}}', False),
    (b'{"a":{"dtype":"F16","shape":[4.0,4],"data_offsets":[0,32]}}', False),
    (b'{"a":{"dtype":"F16","shape":[04,4],"data_offsets":[0,32]}}', False),
    (b'{"a":{"dtype":"F16","shape":[-4,4],"data_offsets":[0,32]}}', False),
    (b'{"a":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32,5]}}', False),
    (b'{"a":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32]}} x', False),
    (b'{"a":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32]},}', False),
    (b'{"a":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32]}', False),
    (b'{"a\x01":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32]}}', False),
    (b'{"a\xff":{"dtype":"F16","shape":[4,4],"data_offsets":[0,32]}}', False),
    (b'{}', False), (b'{"__metadata__":{}}', False), (b'[]', False), (b'', False),
])
def test_the_subset_it_takes(raw, taken):
    c, p = _same(raw)
    assert (c is not None) == taken, (c, p)


@needs_c
def test_names_are_the_index_strings_where_given():
    raw = _header([("layer.0.w", _entry()), ("layer.1.w", _entry(begin=32, end=64))])
    names = {n: n for n in ("".join(["layer.0", ".w"]), "".join(["layer.1", ".w"]))}
    with sf.sharing_names(names):
        tensors, _ = _compiled(raw, 8 + len(raw))
    assert [t.name for t in tensors] == ["layer.0.w", "layer.1.w"]
    assert all(t.name is names[t.name] and t.path[0] is names[t.name] for t in tensors)


@needs_c
def test_bind_refuses_a_class_without_the_slots():
    class NotInfo:
        __slots__ = ("name",)
    with pytest.raises(TypeError):
        sf._HEADER.bind(NotInfo)
    raw = _header([("a", _entry())])
    assert _compiled(raw, 8 + len(raw)) is not None   # still bound to TensorInfo


_DTYPES = st.sampled_from(["F16", "BF16", "F32", "U8", "I64", "F4", "F8_E4M3", "BOOL"] * 8 + ["Q4"])
_WS = st.sampled_from(["", " ", "\n", "\t ", "\r\n"])


@st.composite
def _headers(draw) -> bytes:
    n = draw(st.integers(1, 8))
    names = draw(st.lists(st.one_of(st.from_regex(r"[a-z]{1,3}(\.[0-9]{1,2}){0,2}", fullmatch=True),
                                    st.text(st.characters(blacklist_categories=("Cs",)), max_size=6)),
                          min_size=n, max_size=n))
    entries, at = [], 0
    for name in names:
        dtype = draw(_DTYPES)
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        bits = sf.DTYPES.get(dtype, ("", 8))[1]
        size = -(-(bits * math.prod(shape)) // 8)
        size += draw(st.sampled_from([0] * 30 + [1, -1]))
        begin = at + draw(st.sampled_from([0] * 30 + [1]))
        at = begin + max(size, 0)
        order = draw(st.permutations(["dtype", "shape", "data_offsets"]))
        entries.append((name, _entry(dtype, shape, begin, at, order)))
    if draw(st.booleans()):
        entries.reverse()
    meta = draw(st.sampled_from([None, None, "null", "{}", '{"format":"pt"}', '{"a":"b","c":"d"}',
                                 '{"a":1}', '"x"']))
    ws = draw(_WS)
    text = _header(entries, meta).decode()
    if ws:
        text = text.replace(",", ws + "," + ws).replace(":", ws + ":")
    raw = text.encode()
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):   # damage: a byte changed, or the text cut
        if draw(st.booleans()) and raw:
            i = draw(st.integers(0, len(raw) - 1))
            raw = raw[:i] + bytes([draw(st.integers(0, 255))]) + raw[i + 1:]
        else:
            raw = raw[:draw(st.integers(0, len(raw)))]
    return raw


@needs_c
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_headers(), st.sampled_from([None, 0, 2 ** 64 - 4]))
def test_generated_and_damaged_headers(raw, data_start):
    _same(raw, data_start)


# -- a sharded checkpoint's index (``index_map``) ---------------------------------------------------
from tensorscope.parsers import sharded  # noqa: E402


def _index_same(raw: bytes):
    """The compiled columns, when given, are the Python parse's."""
    got = sharded._compiled_index(raw)
    try:
        wm, meta, dups = sharded._parse_index(raw, "i.json")
    except FormatError:
        assert got is None
        return None
    if got is not None:
        names, shards, doc = got
        assert list(names) == list(wm) and all(k is v for k, v in names.items())
        assert shards == list(wm.values()) and dups == []
        assert (doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}) == meta
        assert len(set(map(id, shards))) == len(set(shards))     # one string per shard
    return got


@needs_c
@pytest.mark.parametrize("raw, taken", [
    (b'{"metadata": {"total_size": 96}, "weight_map": {"a.0": "s1", "a.1": "s2", "b": "s1"}}', True),
    (b'{"weight_map": {"a": "s"}}', True),
    (b' {"weight_map" : { "a" : "s" } , "metadata" : {"x": [1, 2.5, {"y": null}], "z": "\\u00e9"},'
     b' "other": [true, false, NaN]} \n', True),
    ('{"weight_map": {"\u00e9": "s"}}'.encode(), True),
    (b'{"weight_map": {}}', True),
    (b'{"weight_map": {"a\\u0062": "s"}}', False),                    # an escape in the map
    (b'{"weight_map": {"a": "s", "a": "t"}}', False),                 # a name twice
    (b'{"weight_map": {"a": "s"}, "weight_map": {"b": "s"}}', False),
    (b'{"metadata": {"k": 1, "k": 2}, "weight_map": {"a": "s"}}', False),   # twice inside
    (b'{"weight_map": {"a": 5}}', False),
    (b'{"metadata": {"total_size": 9}}', False),                      # no map
    (b'{"metadata": 01, "weight_map": {"a": "s"}}', False),
    (b'{"metadata": tru, "weight_map": {"a": "s"}}', False),
    (b'{"metadata": {"a" 1}, "weight_map": {"a": "s"}}', False),
    (b'{"weight_map": {"a": "s"}} x', False),
    (b'{"weight_map": {"a": "s"},}', False),
    (b'\xef\xbb\xbf{"weight_map": {"a": "s"}}', False),               # BOM: Python's
    (b'{"weight_map": {"a\xff": "s"}}', False),
    (b'[' * 100 + b']' * 100, False),
])
def test_index_subset(raw, taken):
    assert (_index_same(raw) is not None) == taken


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.sampled_from(["s1", "s2", "s\u00e9"]), max_size=8),
       st.sampled_from(['{"total_size": 5}', "null", "[1, {}]", '{"a": "\\"q"}', '{"a": 1, "a": 2}']),
       st.integers(0, 3), st.integers(0, 255))
def test_index_generated_and_damaged(wm, meta, damage, byte):
    raw = f'{{"metadata": {meta}, "weight_map": {json.dumps(wm, ensure_ascii=False)}}}'.encode()
    _index_same(raw)
    if damage:
        i = (byte * 7919) % len(raw)
        _index_same(raw[:i] + bytes([byte]) + raw[i + 1:])
        _index_same(raw[:i])
