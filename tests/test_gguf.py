"""GGUF parser: differential against gguf-py's `GGUFReader`, and hostile headers built byte by byte."""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from helpers import assert_mutants_fail_cleanly
import tensorscope
from tensorscope import dtypes
from tensorscope.errors import FormatError
from tensorscope.parsers import gguf as G
from tensorscope.source import ByteSource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "formats"
GGUF_FILES = ["gguf_v3.gguf", "gguf_alltypes.gguf", "gguf_be.gguf"]
READER_PSEUDO_FIELDS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}


def _open(path) -> tensorscope.ModelFile:
    return G.open_source(ByteSource(path))


def test_type_table_matches_gguf_package():
    oracle = {int(q): (q.name, *gguf.GGML_QUANT_SIZES[q]) for q in gguf.GGMLQuantizationType}
    ours = {code: (t.name, t.block_elems, t.block_bytes) for code, t in G.GGML_TYPES.items()}
    assert ours == oracle
    for t in G.GGML_TYPES.values():
        spec = dtypes.spec(t.dtype)
        if not t.is_plain:
            assert (spec.kind, spec.block_elems, spec.block_bytes) == ("block", t.block_elems, t.block_bytes)
        else:
            assert spec.itemsize == t.block_bytes


@pytest.mark.parametrize("name", GGUF_FILES)
def test_tensors_match_reader(name):
    path = FIXTURES / name
    model = _open(path)
    reader = gguf.GGUFReader(path)
    assert model.metadata["gguf"]["data_offset"] == reader.data_offset
    assert model.metadata["gguf"]["alignment"] == reader.alignment
    assert [t.name for t in model.tensors] == [t.name for t in reader.tensors]
    for ours, ref in zip(model.tensors, reader.tensors):
        assert ours.extras["ggml_type_code"] == int(ref.tensor_type)
        assert ours.extras["ne"] == ref.shape.tolist()
        assert ours.shape == tuple(reversed(ref.shape.tolist()))  # numpy order
        assert ours.byte_offset == ref.data_offset
        assert ours.nbytes == ref.n_bytes
        assert ours.numel == ref.n_elements


@pytest.mark.parametrize("name", GGUF_FILES)
def test_values_match_reader(name):
    path = FIXTURES / name
    model = _open(path)
    reader = gguf.GGUFReader(path)
    for ours, ref in zip(model.tensors, reader.tensors):
        arr = model.read(ours)
        if ours.dtype in ("float32", "float16", "float64", "int8", "int16", "int32", "int64"):
            assert arr.shape == ref.data.shape, ours.name
            assert arr.dtype == ref.data.dtype.newbyteorder("="), ours.name
            np.testing.assert_array_equal(arr, ref.data)
        elif ours.dtype == "bfloat16":  # GGUFReader exposes BF16 as bytes
            assert arr.shape == ours.shape
            assert arr.tobytes() == ref.data.tobytes()
        else:  # block-quantized: raw bytes
            assert arr.dtype == np.uint8 and arr.tobytes() == ref.data.tobytes(), ours.name


def _flat(v):
    if isinstance(v, (list, np.ndarray)):
        return [x for item in v for x in _flat(item)] if isinstance(v, list) else list(np.asarray(v).tolist())
    return [v]


@pytest.mark.parametrize("name", GGUF_FILES)
def test_metadata_matches_reader(name):
    path = FIXTURES / name
    model = _open(path)
    reader = gguf.GGUFReader(path)
    fields = model.extras["gguf_kv"]
    assert list(fields) == [k for k in reader.fields if k not in READER_PSEUDO_FIELDS]
    for key, f in fields.items():
        ref = reader.fields[key]
        assert f.offset == ref.offset
        assert f.type == ref.types[0].name.lower()
        if f.type == "array":
            assert f.item_type == ref.types[1].name.lower()
            # GGUFReader flattens nested arrays; compare flattened values.
            assert _flat(f.value) == ref.contents(), key
        else:
            assert f.value == ref.contents(), key


def test_metadata_view_truncates_long_arrays():
    model = _open(FIXTURES / "gguf_v3.gguf")
    kv = model.metadata["gguf"]["kv"]
    tokens = kv["tokenizer.ggml.tokens"]
    assert tokens == {"count": 40, "items": [f"tok{i}" for i in range(16)], "truncated": True}
    assert len(model.extras["gguf_kv"]["tokenizer.ggml.tokens"].value) == 40
    assert kv["test.nested"] == [[1, 2], [3, 4, 5]]
    assert kv["test.u64"] == 2**63 + 5 and kv["test.bool"] is True
    assert model.metadata["gguf"]["kv_types"]["test.arr_str"] == "array[string]"
    assert [a.kind for a in model.evidence.anomalies] == ["gguf.nested_array"]


def test_big_endian_file():
    model = _open(FIXTURES / "gguf_be.gguf")
    assert model.metadata["gguf"]["byteorder"] == "big"
    assert model.metadata["gguf"]["kv"]["test.u32"] == 7
    assert model.read("be.i16").tolist() == [[0, 1, 2], [3, 4, 5]]
    assert "be.f32" in model.custom_readers  # byte-swapped copy


def test_zero_copy_and_read_only():
    path = FIXTURES / "gguf_v3.gguf"
    model = _open(path)
    src = ByteSource(path)
    model.sources[src.path] = src
    arr = model.read("plain.f32")
    assert isinstance(arr.base, mmap.mmap) and arr.flags.writeable is False
    q = model.read("quant.q8_0")
    assert q.flags.writeable is False and np.shares_memory(q, np.frombuffer(src.raw, np.uint8))


def test_open_through_registry():
    path = FIXTURES / "gguf_alltypes.gguf"
    assert "gguf" in tensorscope.identify(path)
    with tensorscope.open(path) as model:
        assert model.format == "gguf" and len(model) == len(gguf.GGMLQuantizationType)
        assert model.tensor("t.q4_k").dtype == "q4_k"


# -- hostile / malformed input, built byte by byte ----------------------------------------------------
def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _kv(key, vtype, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def _ti(name, ne, ggml_type=0, offset=0, n_dims=None) -> bytes:
    n = len(ne) if n_dims is None else n_dims
    return (_s(name) + struct.pack("<I", n) + b"".join(struct.pack("<Q", d) for d in ne)
            + struct.pack("<IQ", ggml_type, offset))


def _gguf(kvs=(), tis=(), data=b"", *, version=3, align=32, counts=None, magic=b"GGUF") -> bytes:
    n_t, n_kv = counts if counts is not None else (len(tis), len(kvs))
    head = magic + struct.pack("<IQQ", version, n_t, n_kv) + b"".join(kvs) + b"".join(tis)
    head += b"\0" * (-len(head) % align)
    return head + data


F32x8 = np.arange(8, dtype=np.float32).tobytes()  # 32 bytes: one aligned tensor

BAD = [
    ("bad_magic", _gguf(magic=b"GGUX"), 0, "bad magic b'GGUX', expected b'GGUF'"),
    ("short", b"GGUF\x03\x00", 0, "truncated: the GGUF header needs 24 bytes, the file has 6"),
    ("version1", _gguf(version=1), 4,
     "GGUF version 1 is not supported (it used 32-bit counts and lengths, and llama.cpp no longer "
     "reads it); convert the file to version 3"),
    ("version4", _gguf(version=4), 4, "unsupported GGUF version 4 (this reader handles versions 2 and 3)"),
    ("version0", _gguf(version=0), 4, "unsupported GGUF version 0 (this reader handles versions 2 and 3)"),
    ("huge_kv_count", _gguf(counts=(0, 2**63)), 16,
     f"truncated: {2**63} key/values (kv_count) need at least {24 + 2**63 * 13} bytes, the file ends at 32"),
    ("huge_tensor_count", _gguf(counts=(2**63, 0)), 8,
     f"truncated: {2**63} tensor descriptors (tensor_count) need at least {24 + 2**63 * 24} bytes, the file ends at 32"),
    ("key_length_past_end", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"k" * 8,
     24, f"truncated: key #0 (a string of {2**62} bytes) needs {32 + 2**62} bytes, the file ends at 40"),
    ("truncated_value", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _s("k") + struct.pack("<I", 10) + b"\0\0",
     37, "truncated: key 'k' needs 45 bytes, the file ends at 39"),
    ("invalid_value_type", _gguf([_kv("k", 13, b"\0" * 8)]), 37, "key 'k' has invalid value type 13"),
    ("huge_array", _gguf([_kv("k", 9, struct.pack("<IQ", 4, 2**40))]), 49,
     f"truncated: key 'k' (an array of {2**40} uint32) needs {49 + 2**42} bytes, the file ends at 64"),
    ("huge_string_array", _gguf([_kv("k", 9, struct.pack("<IQ", 8, 2**40))]), 49,
     f"truncated: key 'k' (an array of {2**40} strings) needs at least {49 + 2**43} bytes, the file ends at 64"),
    ("bad_array_item_type", _gguf([_kv("k", 9, struct.pack("<IQ", 99, 1))]), 37,
     "key 'k' is an array of invalid value type 99"),
    ("duplicate_key", _gguf([_kv("k", 4, b"\1\0\0\0"), _kv("k", 4, b"\2\0\0\0")]), 41,
     "duplicate key 'k' (first at byte 24)"),
    ("alignment_type", _gguf([_kv("general.alignment", 10, struct.pack("<Q", 64))]), 24,
     "general.alignment must be uint32, not uint64"),
    ("alignment_not_pow2", _gguf([_kv("general.alignment", 4, struct.pack("<I", 48))]), 24,
     "general.alignment 48 is not a power of two"),
    ("too_many_dims", _gguf(tis=[_ti("t", [1] * 5)]), 33,
     "tensor 't' has 5 dimensions; ggml allows at most 4"),
    ("removed_type", _gguf(tis=[_ti("t", [32], ggml_type=4)]), 45,
     "tensor 't' has unknown ggml type 4 (Q4_2, removed from ggml)"),
    ("unknown_type", _gguf(tis=[_ti("t", [32], ggml_type=1000)]), 45,
     "tensor 't' has unknown ggml type 1000"),
    ("row_not_blocks", _gguf(tis=[_ti("t", [33], ggml_type=8)]), 24,
     "tensor 't' of type Q8_0 has 33 elements per row, not a multiple of the block size 32"),
    ("huge_numel", _gguf(tis=[_ti("t", [2**32, 2**32])]), 24,
     f"tensor 't': dimensions {[2**32, 2**32]} hold 2**63 elements or more"),
    ("duplicate_tensor", _gguf(tis=[_ti("t", [8]), _ti("t", [8], offset=32)], data=F32x8 * 2), 57,
     "duplicate tensor name 't' (tensors #0 and #1)"),
    ("misaligned", _gguf(tis=[_ti("t", [4], offset=4)], data=F32x8), 24,
     "tensor 't': data offset 4 is not a multiple of the alignment 32"),
    ("past_eof", _gguf(tis=[_ti("t", [16])], data=F32x8), 24,
     "truncated: tensor 't' (data [64, 128)) needs 128 bytes, the file ends at 96"),
    ("truncated_infos", _gguf(tis=[_ti("t", [8])])[:50], 49,
     "truncated: data offset of tensor 't' needs 57 bytes, the file ends at 50"),
]


@pytest.mark.parametrize("label,blob,offset,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exact_message(tmp_path, label, blob, offset, reason):
    path = tmp_path / f"{label}.gguf"
    path.write_bytes(blob)
    with pytest.raises(FormatError) as info:
        _open(path)
    err = info.value
    assert (err.reason, err.offset) == (reason, offset)
    assert err.format == "gguf" and err.file == str(path)
    assert str(err) == f"gguf: {path} at byte {offset}: {reason}"


def test_huge_counts_fail_fast(tmp_path):
    # Must not loop 2**63 times nor allocate: the check happens before any key is read.
    path = tmp_path / "huge.gguf"
    path.write_bytes(_gguf(counts=(2**64 - 1, 2**64 - 1)))
    with pytest.raises(FormatError, match="kv_count"):
        _open(path)


def test_anomalies_layout(tmp_path):
    # b overlaps a; c is not where llama.cpp expects; bytes trail the last tensor.
    tis = [_ti("a", [16]), _ti("b", [8], offset=32), _ti("c", [8], offset=128)]
    blob = _gguf(tis=tis, data=F32x8 * 6)
    path = tmp_path / "layout.gguf"
    path.write_bytes(blob)
    model = _open(path)
    kinds = [(a.kind, a.message) for a in model.evidence.anomalies]
    data = model.metadata["gguf"]["data_offset"]
    assert kinds == [
        ("gguf.unexpected_offset", "tensor 'b' is at data offset 32, llama.cpp expects 64 (tensors "
                                   "back to back in descriptor order) and refuses the file"),
        ("gguf.unexpected_offset", "tensor 'c' is at data offset 128, llama.cpp expects 64 (tensors "
                                   "back to back in descriptor order) and refuses the file"),
        ("gguf.overlap", f"tensor 'b' [{data + 32}, {data + 64}) overlaps tensor 'a' [{data}, {data + 64})"),
        ("gguf.trailing_bytes", "32 bytes after the last tensor belong to no tensor"),
    ]


def test_long_name_and_bad_utf8_are_recorded(tmp_path):
    tis = [_ti("x" * 64, [8]), _ti(b"\xff", [8], offset=32)]
    path = tmp_path / "names.gguf"
    path.write_bytes(_gguf(tis=tis, data=F32x8 * 2))
    model = _open(path)
    assert [a.kind for a in model.evidence.anomalies] == ["gguf.long_name", "gguf.invalid_utf8"]
    assert model.names[1] == "\ufffd"


def test_v2_and_empty_array(tmp_path):
    kvs = [_kv("k", 9, struct.pack("<IQ", 4, 0)), _kv("s", 8, _s(""))]
    path = tmp_path / "v2.gguf"
    path.write_bytes(_gguf(kvs, [_ti("t", [8])], F32x8, version=2))
    model = _open(path)
    assert model.metadata["gguf"]["version"] == 2
    assert model.metadata["gguf"]["kv"] == {"k": [], "s": ""}
    assert model.read("t").tolist() == list(range(8))
    ref = gguf.GGUFReader(path)  # the oracle agrees on this hand-built file
    assert ref.tensors[0].data.tolist() == list(range(8))


@pytest.mark.parametrize("head,size,expected", [
    (b"GGUF\x03\0\0\0" + b"\0" * 16, 24, True),
    (b"GGUF\x03\0\0\0", 8, False),
    (b"GGML" + b"\0" * 20, 24, False),
])
def test_sniff(head, size, expected):
    assert G.sniff(head, size) is expected


@pytest.mark.parametrize("seed", range(3))
def test_mutated_fixtures_never_raise_raw_exceptions(seed):
    assert_mutants_fail_cleanly(G.open_source, sorted(FIXTURES.glob("*.gguf")), seed)
