"""safetensors parser: differential against `safetensors.safe_open`, and hostile headers.

The oracle is the real library reading the same bytes; bad inputs are checked for the exact
reason and byte offset, and each is also confirmed to be rejected by safetensors itself.
"""
from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open

from helpers import assert_mutants_fail_cleanly
import tensorscope
from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.parsers import safetensors as st
from tensorscope.source import ByteSource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "formats"
ST_FILES = ["st_numpy.safetensors", "st_torch.safetensors", "st_subbyte.safetensors"]

# torch dtype -> our name is torch's name without "torch."; F4 loads as float4_e2m1fn_x2.


def _open(path) -> tensorscope.ModelFile:
    return st.open_source(ByteSource(path))


def _raw_bytes(t: torch.Tensor) -> bytes:
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("name", ST_FILES)
def test_header_matches_safe_open(name):
    path = FIXTURES / name
    model = _open(path)
    with safe_open(str(path), "np") as f:
        assert [t.name for t in model.tensors] == f.offset_keys()  # data order
        assert model.metadata.get("__metadata__") == f.metadata()
        for t in model.tensors:
            sl = f.get_slice(t.name)
            assert t.extras["safetensors_dtype"] == sl.get_dtype()
            assert list(t.extras["header_shape"]) == sl.get_shape()
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    for t in model.tensors:
        begin, end = header[t.name]["data_offsets"]
        assert (t.byte_offset, t.nbytes) == (8 + n + begin, end - begin)
        assert t.source_format == "safetensors" and t.file == str(path)


@pytest.mark.parametrize("name", ["st_torch.safetensors", "st_numpy.safetensors"])
def test_values_match_torch_bit_exact(name):
    path = FIXTURES / name
    model = _open(path)
    with safe_open(str(path), "pt") as f:
        assert sorted(model.names) == sorted(f.keys())
        for t in model.tensors:
            ref = f.get_tensor(t.name)
            assert t.dtype == str(ref.dtype).removeprefix("torch."), t.name
            assert t.shape == tuple(ref.shape), t.name
            arr = model.read(t)
            assert arr.tobytes() == _raw_bytes(ref), t.name
            if t.numel and not t.extras["safetensors_dtype"] == "F4":
                assert arr.shape == t.shape


def test_numpy_values_and_dtypes():
    path = FIXTURES / "st_numpy.safetensors"
    model = _open(path)
    with safe_open(str(path), "np") as f:
        for t in model.tensors:
            ref = f.get_tensor(t.name)
            arr = model.read(t)
            assert arr.dtype == ref.dtype and arr.shape == ref.shape, t.name
            assert arr.tobytes() == ref.tobytes(), t.name


def test_subbyte_dtypes():
    path = FIXTURES / "st_subbyte.safetensors"
    model = _open(path)
    got = {t.name: (t.dtype, t.shape, t.nbytes) for t in model.tensors}
    assert got == {"f6a": ("float6_e2m3fn", (2, 4), 6), "f6b": ("float6_e3m2fn", (4,), 3),
                   "f4odd": ("float4_e2m1fn", (2, 3), 3)}
    raw = path.read_bytes()
    for t in model.tensors:  # packed types read as their raw bytes
        assert model.read(t).tobytes() == raw[t.byte_offset:t.byte_offset + t.nbytes]


def test_f4_shape_follows_torch():
    model = _open(FIXTURES / "st_torch.safetensors")
    t = model.tensor("f4_x2")
    assert (t.dtype, t.shape, t.extras["header_shape"]) == ("float4_e2m1fn_x2", (3, 4), (3, 8))


def test_zero_copy_and_read_only():
    model = _open(FIXTURES / "st_torch.safetensors")
    src = ByteSource(FIXTURES / "st_torch.safetensors")
    model.sources[src.path] = src
    arr = model.read("f32")
    assert isinstance(arr.base, mmap.mmap) and arr.base is src.raw
    assert arr.flags.writeable is False
    with pytest.raises(ValueError):
        arr[0, 0] = 1


def test_open_through_registry():
    path = FIXTURES / "st_numpy.safetensors"
    assert "safetensors" in tensorscope.identify(path)
    with tensorscope.open(path) as model:
        assert model.format == "safetensors"
        assert model.metadata["__metadata__"]["unicode"] == "é✓"
        assert model.read("scalar").shape == () and float(model.read("scalar")) == 3.5
        assert model.read("empty").shape == (0, 4)


@pytest.mark.parametrize("head,size,expected", [
    (struct.pack("<Q", 2) + b"{}", 10, True),
    (struct.pack("<Q", 4) + b"  {}", 12, True),
    (struct.pack("<Q", 2) + b"[]", 10, False),
    (struct.pack("<Q", 3) + b"{}", 10, False),          # N runs past the end
    (struct.pack("<Q", 2**63) + b"{}", 10, False),
    (b"PK\x03\x04" + b"\0" * 8, 12, False),
])
def test_sniff(head, size, expected):
    assert st.sniff(head, size) is expected


# -- hostile / malformed input -------------------------------------------------------------------------
def _file(header, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


_CUT = _file({"t": _t("U8", [4], 0, 4)}, b"\0\0")
BAD = [
    ("tiny", b"\x02\x00", 0, "file has 2 bytes; the header length alone needs 8"),
    ("huge_length", struct.pack("<Q", 2**63) + b"{}", 0,
     "header length exceeds the limit of 100000000 (got 9223372036854775808)"),
    ("length_past_end", struct.pack("<Q", 100) + b"{}", 0,
     "truncated: the header (length 100) needs 108 bytes, the file ends at 10"),
    ("bad_utf8", _file(b'{"\xff":1}'), 10, "header is not valid UTF-8 (invalid start byte)"),
    ("bad_json", _file(b'{"a":'), 13, "header is not valid JSON: Expecting value"),
    ("nul_padding", _file(b"{}\0\0"), 10, "header is not valid JSON: Extra data"),
    ("nan", _file(b'{"x":NaN}'), 8, "header is not valid JSON: NaN is not valid JSON"),
    ("surrogate", _file(b'{"\\ud800":{}}'), 8,
     "header is not valid JSON: lone surrogate escape in string '\\ud800'"),
    ("not_object", _file(b"[]"), 8, "header must be a JSON object, not an array"),
    ("meta_not_str", _file({"__metadata__": {"a": 1}}), 8,
     "__metadata__['a'] must be a string, not a number (1)"),
    ("meta_twice", _file(b'{"__metadata__":{},"__metadata__":{}}'), 8,
     "key '__metadata__' appears twice"),
    ("unknown_dtype", _file({"t": _t("C128", [1], 0, 16)}, b"\0" * 16), 8,
     "tensor 't': unknown dtype 'C128' (known: " + ", ".join(st.DTYPES) + ")"),
    ("missing_offsets", _file({"t": {"dtype": "U8", "shape": [1]}}, b"\0"), 8,
     "tensor 't': missing field 'data_offsets'"),
    ("negative_dim", _file({"t": _t("U8", [-1], 0, 1)}, b"\0"), 8,
     "tensor 't': shape must be an array of unsigned integers, not [-1]"),
    ("bool_dim", _file({"t": _t("U8", [True], 0, 1)}, b"\0"), 8,
     "tensor 't': shape must be an array of unsigned integers, not [true]"),
    ("three_offsets", _file({"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 1]}}, b"\0"), 8,
     "tensor 't': data_offsets must be [begin, end] unsigned integers, not [0, 1, 1]"),
    ("duplicate_field", _file(b'{"t":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}}', b"\0"), 8,
     "tensor 't': field 'dtype' appears twice"),
    ("end_before_begin", _file({"t": _t("U8", [0], 1, 0)}, b"\0"), None,
     "tensor 't': invalid offsets, end 0 < begin 1"),
    ("hole", _file({"a": _t("U8", [1], 0, 1), "b": _t("U8", [1], 2, 3)}, b"\0" * 3), None,
     "tensor 'b': invalid offsets, data begins at 2 but the previous tensor ends at 1: a hole of "
     "1 bytes (the data must be entirely indexed)"),
    ("overlap", _file({"a": _t("U8", [2], 0, 2), "b": _t("U8", [1], 1, 2)}, b"\0" * 2), None,
     "tensor 'b': invalid offsets, data [1, 2) overlaps tensor 'a' which ends at 2"),
    ("size_mismatch", _file({"t": _t("F32", [2], 0, 4)}, b"\0" * 4), None,
     "tensor 't': shape [2] x F32 needs 8 bytes but data_offsets [0, 4) span 4"),
    ("overflow", _file({"t": _t("F32", [2**62, 2**62], 0, 4)}, b"\0" * 4), None,
     "tensor 't': shape [4611686018427387904, 4611686018427387904] x F32 overflows u64"),
    ("f4_half_byte", _file({"t": _t("F4", [3], 0, 2)}, b"\0" * 2), None,
     "tensor 't': 3 values of F4 take 12 bits, not a whole number of bytes"),
    ("trailing_bytes", _file({"t": _t("U8", [1], 0, 1)}, b"\0\0"), None,
     "incomplete metadata, file not fully covered: 1 bytes after the last tensor are not indexed by any tensor"),
    ("truncated_data", _CUT, None,   # 2 of the 4 data bytes: a cut download
     f"truncated: the tensors need {len(_CUT) + 2} bytes, the file ends at {len(_CUT)}"),
]


@pytest.mark.parametrize("label,blob,offset,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exact_message(tmp_path, label, blob, offset, reason):
    path = tmp_path / f"{label}.safetensors"
    path.write_bytes(blob)
    with pytest.raises(FormatError) as info:
        _open(path)
    err = info.value
    assert err.reason == reason
    assert err.format == "safetensors" and err.file == str(path)
    if offset is not None:
        assert err.offset == offset
    assert str(err).startswith(f"safetensors: {path} at byte {err.offset}: ")
    if label == "huge_length":
        assert isinstance(err, LimitExceeded)
    # The reference reader rejects the same bytes.
    with pytest.raises(SafetensorError):
        with safe_open(str(path), "np"):
            pass


def test_data_offsets_place_the_error(tmp_path):
    blob = _file({"a": _t("U8", [1], 0, 1), "b": _t("U8", [1], 2, 3)}, b"\0" * 3)
    path = tmp_path / "hole.safetensors"
    path.write_bytes(blob)
    n = struct.unpack("<Q", blob[:8])[0]
    with pytest.raises(FormatError) as info:
        _open(path)
    assert info.value.offset == 8 + n + 1  # where the hole starts


def test_duplicate_name_keeps_last_and_is_recorded(tmp_path):
    blob = _file(b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                 b'"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"\1\2")
    path = tmp_path / "dup.safetensors"
    path.write_bytes(blob)
    model = _open(path)
    assert [(t.name, t.shape) for t in model.tensors] == [("t", (2,))]
    with safe_open(str(path), "np") as f:  # the reference reader also keeps the last entry
        assert f.get_slice("t").get_shape() == [2]
    assert [a.kind for a in model.evidence.anomalies] == ["safetensors.duplicate_name"]


# -- the fast path (whole columns checked at once) and the general one agree -----------------------
def _general(path) -> tensorscope.ModelFile:
    """The model read by the general path only (the fast one declines every header)."""
    fast = st._fast
    st._fast = lambda *a: None
    try:
        return _open(path)
    finally:
        st._fast = fast


def _fields(model):
    return [(*(getattr(t, f) for f in t.__slots__), dict(t.extras)) for t in model.tensors], \
        model.metadata, [(a.kind, a.message) for a in model.evidence.anomalies]


ODD_NAMES = ['q"uote', "back\\slash", "tab\t", "é", "\u00e9x", "__metadata__x", "a:b", "{}"]


@pytest.mark.parametrize("name", ST_FILES)
def test_fast_path_lists_what_the_general_path_lists(name):
    assert _fields(_open(FIXTURES / name)) == _fields(_general(FIXTURES / name))


@pytest.mark.parametrize("label,header,fast", [
    ("odd_names", {n: _t("U8", [1], i, i + 1) for i, n in enumerate(ODD_NAMES)}, True),
    ("metadata", {"__metadata__": {"k\"": "v\\"}, "a": _t("BF16", [2, 0], 0, 0),
                  "b": _t("F4", [2, 4], 0, 4), "c": _t("F4", [2, 2], 4, 6)}, True),
    ("f4_12_bits", {"b": _t("F4", [2, 4], 0, 4), "c": _t("F4", [3], 4, 6)}, False),
    ("name_order", {"b": _t("U8", [1], 1, 2), "a": _t("U8", [1], 0, 1)}, True),
    ("empty_ties", {"c": _t("U8", [1], 0, 1), "b": _t("U8", [0], 0, 0), "a": _t("U8", [0], 1, 1),
                    "d": _t("U8", [0], 0, 0)}, True),
    ("overlap", {"a": _t("U8", [2], 0, 2), "b": _t("U8", [1], 1, 2)}, False),
    ("zero_d", {"a": _t("F32", [], 0, 4), "b": _t("I64", [1, 1], 4, 12)}, True),
])
def test_fast_and_general_paths_agree_with_safe_open(tmp_path, label, header, fast):
    """Headers the fast path takes or hands to the general path: both give the same records,
    and what safe_open reads (names, data order, dtype, shape)."""
    size = max((e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"), default=0)
    raw = json.dumps(header).encode()
    path = tmp_path / f"{label}.safetensors"
    path.write_bytes(_file(raw, b"\0" * size))
    try:
        with safe_open(str(path), "np") as f:
            ref = [(k, f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.offset_keys()]
    except SafetensorError:
        ref = None
    assert (ref is None) == (label in ("f4_12_bits", "overlap"))
    if ref is None:   # both of ours refuse it too, with one message
        with pytest.raises(FormatError) as a:
            _open(path)
        with pytest.raises(FormatError) as b:
            _general(path)
        assert a.value.reason == b.value.reason
        return
    assert _fields(_open(path)) == _fields(_general(path))
    model = _open(path)
    ours = [(t.name, t.extras["safetensors_dtype"], list(t.extras["header_shape"]))
            for t in model.tensors]
    # data order; tensors of one offset (empty ones) come in hash order from safe_open
    assert sorted(ours) == sorted(ref)
    assert [t.byte_offset for t in model.tensors] == sorted(t.byte_offset for t in model.tensors)
    assert (st._fast(st._loads(path.read_bytes()[8:8 + len(raw)].decode(), "p", False),
                     path.read_bytes()[8:8 + len(raw)].decode(), "p", 8 + len(raw)) is not None) == fast


@pytest.mark.parametrize("header", [
    b'{"t":5,"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',       # first value no object
    b'{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    b'{"t":[],"\\u0074":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',   # "t" escaped
])
def test_duplicates_the_fast_path_cannot_see_are_still_recorded(tmp_path, header):
    """json keeps the last of a repeated key: the fast path counts the strings of the text
    against those parsed and hands such headers to the general path, which names them."""
    path = tmp_path / "dup.safetensors"
    path.write_bytes(_file(header, b"\1"))
    model = _open(path)
    assert [t.name for t in model.tensors] == ["t"]
    assert [a.kind for a in model.evidence.anomalies] == ["safetensors.duplicate_name"]


def test_duplicate_metadata_key_is_recorded_by_the_fast_reader(tmp_path):
    path = tmp_path / "dupmeta.safetensors"
    path.write_bytes(_file(b'{"__metadata__":{"k":"a","k":"b"},'
                           b'"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"))
    model = _open(path)
    assert model.metadata["__metadata__"] == {"k": "b"}
    assert [a.kind for a in model.evidence.anomalies] == ["safetensors.duplicate_metadata_key"]


def test_extras_are_shared_per_kind_and_read_only():
    model = _open(FIXTURES / "st_torch.safetensors")
    kinds = {}
    for t in model.tensors:
        kinds.setdefault((t.extras["safetensors_dtype"], t.extras["header_shape"]), t.extras)
        assert t.extras is kinds[(t.extras["safetensors_dtype"], t.extras["header_shape"])]
    with pytest.raises(TypeError):
        model.tensors[0].extras["header_shape"] = (1,)


def test_unknown_fields_are_recorded(tmp_path):
    path = tmp_path / "extra.safetensors"
    path.write_bytes(_file({"t": {**_t("U8", [1], 0, 1), "payload": "x"}}, b"\0"))
    model = _open(path)
    [anomaly] = model.evidence.anomalies
    assert anomaly.kind == "safetensors.unknown_field" and "'payload'" in anomaly.message


def test_header_order_differs_from_data_order(tmp_path):
    path = tmp_path / "order.safetensors"
    path.write_bytes(_file({"b": _t("U8", [1], 1, 2), "a": _t("U8", [1], 0, 1)}, b"\1\2"))
    model = _open(path)
    assert model.names == ["a", "b"]
    assert model.read("b").tolist() == [2]


def test_deep_nesting_is_a_format_error(tmp_path):
    path = tmp_path / "deep.safetensors"
    path.write_bytes(_file(b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"))
    with pytest.raises(FormatError):
        _open(path)


def test_empty_header_and_only_metadata(tmp_path):
    path = tmp_path / "meta.safetensors"
    path.write_bytes(_file({"__metadata__": {"k": "v"}}))
    model = _open(path)
    assert model.tensors == [] and model.metadata["__metadata__"] == {"k": "v"}


@pytest.mark.parametrize("seed", range(3))
def test_mutated_fixtures_never_raise_raw_exceptions(seed):
    assert_mutants_fail_cleanly(st.open_source, sorted(FIXTURES.glob("*.safetensors")), seed)
