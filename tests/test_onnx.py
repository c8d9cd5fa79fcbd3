"""ONNX wire walker (`tensorscope.parsers.onnx_pb`) against onnx 1.23 as the oracle.

Fixture tests compare every tensor with ``onnx.load`` + ``onnx.numpy_helper.to_array`` (names,
dtypes, shapes, values bit-exact, raw_data offsets byte-exact) and external data with
``onnx.load(load_external_data=False)``. Hand-built protobuf (a ten-line encoder below) covers
what onnx's writer never produces: non-packed repeated fields, reordered fields, hostile input.
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tensorscope
from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.model import contiguous_stride
from tensorscope.parsers import onnx_pb
from tensorscope.source import ByteSource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "onnx"
MODEL_FILES = sorted(p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*.onnx"))


# -- a tiny protobuf encoder for hand-built files ------------------------------------------------
def _v(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _f(num: int, wire: int, payload: bytes = b"", value: int = 0) -> bytes:
    tag = _v(num << 3 | wire)
    if wire == 0:
        return tag + _v(value)
    if wire == 2:
        return tag + _v(len(payload)) + payload
    return tag + payload


def _s(num: int, text: str) -> bytes:
    return _f(num, 2, text.encode())


def _tensor(name: str, data_type: int, dims, *fields: bytes) -> bytes:
    return b"".join([_s(8, name), _f(2, 0, value=data_type)] + [_f(1, 0, value=d) for d in dims]
                    + list(fields))


def _model(*graph_fields: bytes, head: bytes = b"") -> bytes:
    return head + _f(1, 0, value=9) + _f(8, 2, _f(2, 0, value=20)) + _f(7, 2, b"".join(graph_fields))


def _init(tensor: bytes) -> bytes:
    return _f(5, 2, tensor)


def _open_bytes(tmp_path: Path, data: bytes, name: str = "m.onnx", **kw):
    path = tmp_path / name
    path.write_bytes(data)
    return onnx_pb.open_source(ByteSource(path), **kw)


# -- the oracle: onnx's view of every tensor, named as tensorscope names them ---------------------
def _oracle(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    base = str(path.parent)
    out: dict[str, np.ndarray] = {}

    def put(name, arr):
        out.setdefault(name, arr)

    def sparse(sp, fallback):
        name = sp.values.name or fallback
        put(f"{name}.values", numpy_helper.to_array(sp.values, base))
        put(f"{name}.indices", numpy_helper.to_array(sp.indices, base))

    def nodes(node_list, sub):
        for i, node in enumerate(node_list):
            label = node.name or f"{node.op_type}_{i}"
            const = node.op_type == "Constant" and node.domain in ("", "ai.onnx")
            for a in node.attribute:
                if a.HasField("t"):
                    name = node.output[0] if const and a.name == "value" else a.t.name or f"{label}.{a.name}"
                    put(name, numpy_helper.to_array(a.t, base))
                for k, t in enumerate(a.tensors):
                    put(t.name or f"{label}.{a.name}.{k}", numpy_helper.to_array(t, base))
                if a.HasField("sparse_tensor"):  # a sparse Constant is named by its output
                    name = node.output[0] if const and a.name == "sparse_value" else \
                        a.sparse_tensor.values.name or f"{label}.{a.name}"
                    put(f"{name}.values", numpy_helper.to_array(a.sparse_tensor.values, base))
                    put(f"{name}.indices", numpy_helper.to_array(a.sparse_tensor.indices, base))
                if const and a.name == "value_float":
                    put(node.output[0], np.float32(a.f))
                if const and a.name == "value_int":
                    put(node.output[0], np.int64(a.i))
                if const and a.name == "value_floats":
                    put(node.output[0], np.array(a.floats, dtype=np.float32))
                if const and a.name == "value_ints":
                    put(node.output[0], np.array(a.ints, dtype=np.int64))
                if a.HasField("g"):
                    sub.append(a.g)
                sub.extend(a.graphs)

    graphs = [model.graph]
    while graphs:
        g = graphs.pop(0)
        for t in g.initializer:
            put(t.name, numpy_helper.to_array(t, base))
        for sp in g.sparse_initializer:
            sparse(sp, "")
        sub: list = []
        nodes(g.node, sub)
        graphs.extend(sub)
    for fn in model.functions:
        nodes(fn.node, [])
    return out


_UNPACK = {"int4": onnx.numpy_helper._unpack_4bit, "uint4": onnx.numpy_helper._unpack_4bit,
           "float4_e2m1fn": onnx.numpy_helper._unpack_4bit, "int2": onnx.numpy_helper._unpack_2bit,
           "uint2": onnx.numpy_helper._unpack_2bit,
           "float6_e2m3fn": onnx.numpy_helper._unpack_6bit,
           "float6_e3m2fn": onnx.numpy_helper._unpack_6bit}


def _as_values(info, arr: np.ndarray) -> np.ndarray:
    """Our read() result in onnx.numpy_helper's form (packed sub-byte types unpacked)."""
    if info.dtype in _UNPACK:
        assert arr.dtype == np.uint8 and arr.size == info.nbytes
        return _UNPACK[info.dtype](arr, info.shape).view(getattr(ml_dtypes, info.dtype))
    if info.dtype == "string":
        return np.array([b.decode() for b in arr.reshape(-1)], dtype=object).reshape(arr.shape)
    return arr


def _same(ours: np.ndarray, theirs: np.ndarray) -> bool:
    if theirs.dtype == object or theirs.dtype.kind == "U":
        return ours.shape == theirs.shape and [str(x) for x in ours.reshape(-1)] == \
            [str(x) for x in theirs.reshape(-1)]
    theirs = np.asarray(theirs)
    return (ours.dtype == theirs.dtype and ours.shape == theirs.shape
            and ours.tobytes() == theirs.tobytes())  # bit-exact, NaN payloads included


# -- field tables and dtype table against onnx's descriptors ---------------------------------------
_WIRE_OF_TYPE = {1: 1, 2: 5, 3: 0, 4: 0, 5: 0, 6: 1, 7: 5, 8: 0, 9: 2, 11: 2, 12: 2, 13: 0,
                 14: 0, 15: 5, 16: 1, 17: 0, 18: 0}


def _descriptor(name: str):
    outer, _, inner = name.partition(".")
    d = getattr(onnx, outer).DESCRIPTOR
    return d.nested_types_by_name[inner] if inner else d


@pytest.mark.parametrize("message", sorted(onnx_pb.MESSAGES))
def test_field_table_matches_onnx_descriptor(message):
    desc = _descriptor(message)
    table = onnx_pb.MESSAGES[message]
    assert {f.number: f.name for f in desc.fields} == {n: f.name for n, f in table.items()}
    for f in desc.fields:
        ours = table[f.number]
        assert ours.wire == _WIRE_OF_TYPE[f.type], f.name
        assert ours.packable == (f.is_repeated and f.type not in (9, 11, 12)), f.name


def test_dtype_table_matches_onnx():
    codes = {v for k, v in TensorProto.DataType.items() if k != "UNDEFINED"}
    assert set(onnx_pb.ONNX_DTYPES) == codes
    for code in codes - {TensorProto.STRING}:
        assert onnx_pb.ONNX_DTYPES[code] == helper.tensor_dtype_to_np_dtype(code).name
    assert onnx_pb.ONNX_DTYPES[TensorProto.STRING] == "string"


# -- fixtures against onnx.load --------------------------------------------------------------------
@pytest.mark.parametrize("rel", MODEL_FILES)
def test_tensors_match_onnx(rel):
    path = FIXTURES / rel
    expected = _oracle(path)
    with tensorscope.open(path) as model:
        assert model.format == "onnx"
        assert sorted(model.names) == sorted(expected)
        for info in model.tensors:
            arr = model.read(info)
            assert not arr.flags.writeable or arr.size == 0  # the core reader makes fresh empties
            theirs = expected[info.name]
            assert info.shape == tuple(np.shape(theirs)), info.name
            assert _same(_as_values(info, arr), theirs), info.name
            assert info.nbytes == tensorscope.dtypes.nbytes_for(info.dtype, info.numel)


def _onnx_tensor_protos(model: onnx.ModelProto):
    """Every TensorProto onnx itself considers (initializers + attribute tensors)."""
    from onnx.external_data_helper import _get_all_tensors
    return {t.name: t for t in _get_all_tensors(model)}


@pytest.mark.parametrize("rel", [r for r in MODEL_FILES if not r.startswith("external")])
def test_raw_data_offsets_are_exact_and_zero_copy(rel):
    path = FIXTURES / rel
    protos = _onnx_tensor_protos(onnx.load(str(path)))
    data = path.read_bytes()
    with tensorscope.open(path) as model:
        checked = 0
        for info in model.tensors:
            enc = info.extras["encoding"]
            if "copy" not in info.extras:
                assert info.byte_offset is not None and "copy" not in info.extras
                assert info.stride == contiguous_stride(info.shape)
                arr = model.read(info)
                if arr.size:
                    assert not arr.flags.owndata  # a view over the map
                proto = protos.get(info.name)
                if enc == "raw_data" and proto is not None and proto.HasField("raw_data"):
                    start = info.byte_offset
                    assert data[start:start + info.storage_nbytes] == proto.raw_data
                    checked += 1
            else:
                assert info.byte_offset is None and info.extras["copy"] is True
        if rel in ("mlp.onnx", "all_types_raw.onnx", "torch_mlp.onnx"):
            assert checked == len(model.tensors)


def test_typed_encodings_are_reported():
    with tensorscope.open(FIXTURES / "typed.onnx") as model:
        enc = {t.name: t.extras["encoding"] for t in model}
    assert enc["typed.float"] == "float_data" and enc["typed.double"] == "double_data"
    assert enc["typed.complex64"] == "float_data" and enc["typed.complex128"] == "double_data"
    for n in ("float16", "bfloat16", "int8", "bool", "uint16", "int4", "float8e4m3fn"):
        assert enc[f"typed.{n}"] == "int32_data"
    assert (enc["typed.int64"], enc["typed.uint64"], enc["typed.uint32"], enc["typed.string"]) == \
        ("int64_data", "uint64_data", "uint64_data", "string_data")


@pytest.mark.parametrize("folder", ["external_one", "external_many"])
def test_external_data_matches_onnx_entries(folder):
    path = FIXTURES / folder / "model.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    with tensorscope.open(path) as model:
        assert model.files[0] == str(path)
        for t in proto.graph.initializer:
            info = model.tensor(t.name)
            entries = {e.key: e.value for e in t.external_data}
            assert info.extras["location"] == entries["location"]
            assert info.file == str(path.parent / entries["location"])
            assert info.byte_offset == int(entries.get("offset", 0))
            assert info.storage_nbytes == int(entries.get("length", info.nbytes))
            assert info.file in model.files
        assert len(set(model.files)) == (2 if folder == "external_one" else 7)


def test_external_listing_does_not_open_data_files(monkeypatch):
    path = FIXTURES / "external_one" / "model.onnx"
    opened = []
    real_open = open

    def spy(file, *a, **kw):
        opened.append(os.fspath(file))
        return real_open(file, *a, **kw)
    monkeypatch.setattr("builtins.open", spy)
    with tensorscope.open(path) as model:
        assert len(model) == 6
    assert all(not p.endswith("weights.bin") for p in opened)


@pytest.mark.parametrize("rel", MODEL_FILES)
def test_metadata_matches_onnx(rel):
    path = FIXTURES / rel
    proto = onnx.load(str(path), load_external_data=False)
    with tensorscope.open(path) as model:
        md = model.metadata
        assert md["ir_version"] == proto.ir_version
        assert md["opset_import"] == {o.domain: o.version for o in proto.opset_import}
        assert md.get("producer_name", "") == proto.producer_name
        assert md.get("producer_version", "") == proto.producer_version
        assert md.get("model_version", 0) == proto.model_version
        assert md.get("doc_string", "") == proto.doc_string
        assert md["metadata_props"] == {p.key: p.value for p in proto.metadata_props}
        assert md["graph_name"] == proto.graph.name

        def io(values):
            out = []
            for v in values:
                tt = v.type.tensor_type
                dims = [d.dim_param if d.HasField("dim_param") else d.dim_value
                        for d in tt.shape.dim]
                out.append((v.name, onnx_pb.ONNX_DTYPES[tt.elem_type], dims))
            return out
        assert [(v["name"], v["elem_type"], v["shape"]) for v in md["inputs"]] == io(proto.graph.input)
        assert [(v["name"], v["elem_type"], v["shape"]) for v in md["outputs"]] == io(proto.graph.output)
        assert model.extras["nodes"] == [(n.name, n.op_type, n.domain) for n in proto.graph.node]
        counts = collections.Counter()
        graphs = [proto.graph] + [f for f in proto.functions]
        while graphs:
            g = graphs.pop()
            for n in g.node:
                counts[n.op_type] += 1
                for a in n.attribute:
                    if a.HasField("g"):
                        graphs.append(a.g)
                    graphs.extend(a.graphs)
        assert md["op_counts"] == dict(counts)


def test_nested_model_roles_and_graph_paths():
    with tensorscope.open(FIXTURES / "nested.onnx") as model:
        by = {t.name: t for t in model}
        assert by["sp.values"].role == "sparse_initializer"
        assert by["sp.indices"].extras["sparse_dims"] == [3, 4]
        assert by["c_value"].role == "constant" and by["c_value"].extras["node"] == "const_tensor"
        assert by["then_c"].extras["graph"] == "main/If_0.then_branch"
        assert by["deep_c"].extras["graph"] == "main/If_0.then_branch/If_inner.then_branch"
        assert by["loop.step"].role == "initializer"
        assert by["loop.step"].extras["graph"] == "main/Loop_0.body"
        assert by["two"].extras["graph"] == "functions/custom.ops.Scale2"
        assert by["c_float"].byte_offset is not None  # a fixed32 scalar is viewable in place
        assert model.read("c_ints").tolist() == [3, -1, 1 << 40]
        assert model.metadata["domains"] == ["custom.ops"]
        # main-graph initializers first, then node tensors in node order, subgraphs in place
        assert model.names.index("sp.values") < model.names.index("c_value") < \
            model.names.index("else_c") < model.names.index("loop.step") < model.names.index("two")


# -- sniffing ---------------------------------------------------------------------------------------
def _head(data: bytes) -> tuple[bytes, int]:
    return data[:4096], len(data)


@pytest.mark.parametrize("rel", MODEL_FILES)
def test_sniff_accepts_fixtures(rel):
    assert onnx_pb.sniff(*_head((FIXTURES / rel).read_bytes()))


def _zip_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"a": 1}))
    return buf.getvalue()


NOT_ONNX = {
    "zip": _zip_bytes(),
    "pickle": pickle.dumps({"weight": [1.0, 2.0]}, protocol=2),
    "pickle5": pickle.dumps(list(range(100)), protocol=5),
    "safetensors": struct.pack("<Q", 64) + b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' + b" " * 9 + b"\0" * 4,
    "gguf": b"GGUF\x03\x00\x00\x00" + b"\0" * 32,
    "npy": b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
    "text": b"Hello, this is just a README file with some words in it.\n" * 20,
    "json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}',
    "B-text": b"Bonjour: a line of text that starts with a field-like letter\n" * 10,
    "empty": b"",
    "zeros": b"\0" * 100,
}


@pytest.mark.parametrize("name", sorted(NOT_ONNX))
def test_sniff_rejects_other_formats(name):
    assert not onnx_pb.sniff(*_head(NOT_ONNX[name]))


def test_sniff_rejects_random_bytes():
    rng = np.random.default_rng(7)
    hits = [i for i in range(2000) if onnx_pb.sniff(rng.bytes(4096), 1 << 20)]
    assert hits == []


def test_sniff_and_open_accept_any_field_order(tmp_path):
    """Reverse the top-level fields of mlp.onnx: still ONNX to onnx.load and to us."""
    data = (FIXTURES / "mlp.onnx").read_bytes()
    fields = [(at, b) for _, _, _, b, at in onnx_pb._fields(memoryview(data), 0, len(data), "ModelProto")]
    shuffled = b"".join(data[at:b] for at, b in reversed(fields))
    assert shuffled != data and shuffled[0] != data[0]
    (tmp_path / "r.onnx").write_bytes(shuffled)
    theirs, original = onnx.load(str(tmp_path / "r.onnx")), onnx.load(str(FIXTURES / "mlp.onnx"))
    assert theirs.graph == original.graph and theirs.ir_version == original.ir_version
    assert onnx_pb.sniff(*_head(shuffled))
    expected = _oracle(tmp_path / "r.onnx")
    with tensorscope.open(tmp_path / "r.onnx") as model:
        assert model.names == list(expected)
        for info in model:
            assert _same(model.read(info), expected[info.name])


# -- hand-built encodings onnx accepts too ----------------------------------------------------------
def test_non_packed_and_split_repeated_fields(tmp_path):
    f32 = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    tensors = [
        # float_data one tagged fixed32 per element (valid protobuf, never written by onnx)
        _tensor("np.float", 1, [3], *[_f(4, 5, x.tobytes()) for x in f32]),
        # float_data packed, but in two runs: still float32 values, now a copy
        _tensor("split.float", 1, [3], _f(4, 2, f32[:1].tobytes()), _f(4, 2, f32[1:].tobytes())),
        # int32_data varints one by one, for float16 bit patterns and a negative int8
        _tensor("np.half", 10, [2], _f(5, 0, value=0x3C00), _f(5, 0, value=0xC000)),
        _tensor("np.int8", 3, [2], _f(5, 0, value=-5), _f(5, 0, value=7)),
        # int64_data packed, dims packed
        _s(8, "p.int64") + _f(2, 0, value=7) + _f(1, 2, _v(2) + _v(2))
        + _f(7, 2, b"".join(_v(x) for x in [-1, 1 << 62, 0, 5])),
        # double_data non-packed, uint64_data mixed packed + single
        _tensor("np.double", 11, [2], _f(10, 1, struct.pack("<d", 0.5)), _f(10, 1, struct.pack("<d", -4))),
        _tensor("mix.uint64", 13, [3], _f(11, 2, _v(1) + _v(2)), _f(11, 0, value=(1 << 64) - 1)),
        _tensor("np.int4", 22, [3], _f(5, 0, value=0x9F), _f(5, 0, value=0x03)),
    ]
    path = tmp_path / "m.onnx"
    path.write_bytes(_model(*[_init(t) for t in tensors]))
    expected = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    with tensorscope.open(path) as model:
        assert model.names == list(expected)
        for info in model:
            assert _same(_as_values(info, model.read(info)), expected[info.name]), info.name
        assert model.tensor("np.float").extras["copy"] is True
        assert model.tensor("split.float").byte_offset is None


def test_merged_graph_messages_and_last_wins(tmp_path):
    """Two ``graph`` fields merge (protobuf semantics); a repeated singular field keeps the last."""
    t1 = _init(_tensor("a", 1, [1], _f(9, 2, struct.pack("<f", 1.0))))
    t2 = _init(_tensor("b", 1, [1], _f(9, 2, struct.pack("<f", 9.0)), _f(9, 2, struct.pack("<f", 2.0))))
    data = _f(1, 0, value=9) + _f(7, 2, t1 + _s(2, "g1")) + _f(7, 2, t2 + _s(2, "g2"))
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    proto = onnx.load(str(path))
    with tensorscope.open(path) as model:
        assert model.names == [t.name for t in proto.graph.initializer] == ["a", "b"]
        assert model.read("b").tolist() == numpy_helper.to_array(proto.graph.initializer[1]).tolist() == [2.0]
        assert model.metadata["graph_name"] == proto.graph.name == "g2"
        assert [a.kind for a in model.evidence.anomalies] == ["onnx.repeated_raw_data"]


def test_unknown_fields_are_skipped_and_reported(tmp_path):
    junk = _f(99, 2, b"hidden payload") + _f(98, 0, value=1)
    group = _f(97, 3) + _f(96, 0, value=5) + _f(97, 4)  # an obsolete group, skipped whole
    t = _init(_tensor("w", 1, [1], _f(9, 2, struct.pack("<f", 1.0)), junk, group))
    path = tmp_path / "m.onnx"
    path.write_bytes(_model(t, head=junk))
    onnx.load(str(path))  # protobuf skips them too
    assert not onnx_pb.sniff(*_head(path.read_bytes()))  # sniffing refuses groups
    with tensorscope.open(path, format="onnx") as model:
        assert model.read("w").tolist() == [1.0]
        kinds = collections.Counter(a.kind for a in model.evidence.anomalies)
        assert kinds == {"onnx.unknown_field": 5}


def test_duplicate_names_are_disambiguated(tmp_path):
    inner = _init(_tensor("w", 1, [1], _f(9, 2, struct.pack("<f", 2.0))))
    node = _s(4, "If") + _f(5, 2, _s(1, "then_branch") + _f(6, 2, inner) + _f(20, 0, value=5))
    path = tmp_path / "m.onnx"
    path.write_bytes(_model(_init(_tensor("w", 1, [1], _f(9, 2, struct.pack("<f", 1.0)))), _f(1, 2, node)))
    with tensorscope.open(path) as model:
        assert model.names == ["w", "main/If_0.then_branch/w"]
        assert model.read("main/If_0.then_branch/w").tolist() == [2.0]
        assert [a.kind for a in model.evidence.anomalies] == ["onnx.duplicate_name"]


# -- bad input: one-line FormatError with the place -------------------------------------------------
def _raw(name, dt, dims, payload):
    return _init(_tensor(name, dt, dims, _f(9, 2, payload)))


BAD = {
    "truncated varint": (_f(1, 0, value=9) + b"\x28\x80",
                         "at byte 3: truncated varint (ModelProto field 5): 1 bytes before the end at byte 4"),
    "varint too long": (_f(1, 0, value=9) + b"\x08" + b"\xff" * 11,
                        "at byte 3: varint (ModelProto field 1) longer than 10 bytes"),
    "length past end": (_f(1, 0, value=9) + b"\x3a\x10abc",
                        "at byte 2: ModelProto.graph wants 16 bytes at byte 4, 3 remain before the end of its message at byte 7"),
    "length past parent": (_model(_f(5, 2, b"\x42\x05ab")),
                           "at byte 10: TensorProto.name wants 5 bytes at byte 12, 2 remain before the end of its message at byte 14"),
    "wrong wire type": (_model(_f(5, 0, value=3)),
                        "at byte 8: GraphProto.initializer (field 5) has wire type varint, expected length-delimited"),
    "wrong wire type in tensor": (_model(_init(_f(8, 0, value=1))),
                                  "at byte 10: TensorProto.name (field 8) has wire type varint, expected length-delimited"),
    "field zero": (_f(1, 0, value=9) + b"\x00\x00", "at byte 2: invalid field tag 0x0 in ModelProto (field 0, wire type 0)"),
    "wire type 7": (_f(1, 0, value=9) + b"\x0f", "at byte 2: invalid field tag 0xf in ModelProto (field 1, wire type 7)"),
    "unknown data type": (_model(_raw("w", 99, [1], b"\0")),
                          "at byte 10: tensor 'w' (TensorProto at byte 10): unknown data_type 99"),
    "undefined data type": (_model(_raw("w", 0, [1], b"\0")),
                            "at byte 10: tensor 'w' (TensorProto at byte 10): unknown data_type 0"),
    "raw too short": (_model(_raw("w", 1, [2, 3], b"\0" * 20)),
                      "at byte 21: tensor 'w' (TensorProto at byte 10): raw_data holds 20 bytes at byte 21, dims [2, 3] of float32 need 24"),
    "raw int4 padding": (_model(_raw("w", 22, [5], b"\0" * 2)),
                         "at byte 19: tensor 'w' (TensorProto at byte 10): raw_data holds 2 bytes at byte 19, dims [5] of int4 need 3"),
    "no data": (_model(_init(_tensor("w", 1, [2]))),
                "at byte 10: tensor 'w' (TensorProto at byte 10): no data (dims [2] of float32 need 8 bytes and no raw_data, float_data or external data is present)"),
    "float_data count": (_model(_init(_tensor("w", 1, [3], _f(4, 2, b"\0" * 8)))),
                         "at byte 17: tensor 'w' (TensorProto at byte 10): float_data has 2 values, dims [3] of float32 need 3"),
    "float_data ragged": (_model(_init(_tensor("w", 1, [3], _f(4, 2, b"\0" * 7)))),
                          "at byte 19: tensor 'w' (TensorProto at byte 10): packed float_data of 7 bytes is not a multiple of 4"),
    "negative dim": (_model(_init(_tensor("w", 1, [-1], _f(9, 2, b"")))),
                     "at byte 15: TensorProto.dims holds a negative dimension -1"),
    "string raw": (_model(_raw("w", 8, [1], b"a")),
                   "at byte 19: tensor 'w' (TensorProto at byte 10): a string tensor cannot use raw_data"),
    "string count": (_model(_init(_tensor("w", 8, [2], _s(6, "a")))),
                     "at byte 17: tensor 'w' (TensorProto at byte 10): string_data has 1 entries, dims [2] need 2"),
    "unbalanced group": (_f(1, 0, value=9) + _f(90, 3) + _f(91, 4),
                         "at byte 4: unbalanced end-group tag for field 91 in ModelProto"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_exact_errors(tmp_path, case):
    data, message = BAD[case]
    path = tmp_path / "bad.onnx"
    path.write_bytes(data)
    with pytest.raises(FormatError) as info:
        onnx_pb.open_source(ByteSource(path))
    assert isinstance(info.value, onnx_pb.OnnxFormatError)
    assert str(info.value) == f"onnx: {path} {message}"
    assert "\n" not in str(info.value) and info.value.offset is not None


def test_varint_count_checked_on_read(tmp_path):
    # 3 packed bytes can hold 1..3 varints: listing accepts, decoding finds 2 values for 3.
    t = _init(_tensor("w", 6, [3], _f(5, 2, _v(300) + _v(1))))
    model = _open_bytes(tmp_path, _model(t))
    with pytest.raises(FormatError, match=r"int32_data decodes to 2 values, dims \[3\] of int32 need 3"):
        model.read("w")
    t = _init(_tensor("w", 6, [1], _f(5, 2, b"\x80\x80")))
    model = _open_bytes(tmp_path, _model(t))
    with pytest.raises(FormatError, match="packed varints end inside a varint"):
        model.read("w")


def _nested_if(depth: int) -> bytes:
    graph = _init(_tensor("leaf", 1, [1], _f(9, 2, b"\0" * 4)))
    for _ in range(depth):
        node = _s(4, "If") + _f(5, 2, _s(1, "then_branch") + _f(6, 2, graph) + _f(20, 0, value=5))
        graph = _f(1, 2, node)
    return _model(graph)


def test_nesting_within_limit_and_beyond(tmp_path):
    model = _open_bytes(tmp_path, _nested_if(63))
    assert model.names == ["leaf"]
    assert model.tensor("leaf").extras["graph"].count("If_0.then_branch") == 63
    with pytest.raises(LimitExceeded, match="subgraph nesting exceeds the limit of 64 \\(got 65\\)"):
        _open_bytes(tmp_path, _nested_if(64), name="deep.onnx")
    # deep enough that a recursive walker would hit Python's recursion limit
    with pytest.raises(LimitExceeded):
        _open_bytes(tmp_path, _nested_if(400), name="deeper.onnx")
    small = onnx_pb.Limits(max_graph_depth=3)
    with pytest.raises(LimitExceeded):
        _open_bytes(tmp_path, _nested_if(3), name="d3.onnx", limits=small)


def test_truncations_never_raise_anything_else():
    """Every prefix of a real model is either a valid message or a FormatError."""
    data = (FIXTURES / "nested.onnx").read_bytes()
    for n in range(0, len(data), 7):
        try:
            onnx_pb.open_source(ByteSource.from_bytes(data[:n], "cut.onnx"))
        except FormatError as e:
            assert "\n" not in str(e)


def test_byte_flips_never_raise_anything_else():
    data = bytearray((FIXTURES / "typed.onnx").read_bytes())
    rng = np.random.default_rng(3)
    for _ in range(300):
        mutated = bytearray(data)
        for i in rng.integers(0, len(data), 3):
            mutated[i] = int(rng.integers(0, 256))
        try:
            model = onnx_pb.open_source(ByteSource.from_bytes(bytes(mutated), "flip.onnx"))
            for info in model:
                model.read(info)
        except FormatError as e:
            assert "\n" not in str(e)


# -- external data: traversal and bounds ------------------------------------------------------------
def _ext(name: str, dims, **entries) -> bytes:
    ext = b"".join(_f(13, 2, _s(1, k) + _s(2, str(v))) for k, v in entries.items())
    return _init(_tensor(name, 1, dims, ext, _f(14, 0, value=1)))


def _ext_model(tmp_path, *tensors) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    path = folder / "m.onnx"
    path.write_bytes(_model(*tensors))
    return path


@pytest.mark.parametrize("location,reason", [
    ("/etc/passwd", "is an absolute path"),
    ("../secret.bin", "climbs out of the model's folder with '..'"),
    ("sub/../../secret.bin", "climbs out of the model's folder with '..'"),
    ("..\\secret.bin", "climbs out of the model's folder with '..'"),
    ("link.bin", "resolves outside the model's folder"),
])
def test_external_path_escape(tmp_path, location, reason):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 8)
    path = _ext_model(tmp_path, _ext("w", [2], location=location))
    os.symlink(tmp_path / "secret.bin", path.parent / "link.bin")
    with pytest.raises(onnx_pb.OnnxFormatError) as info:
        tensorscope.open(path)
    assert f"external data location {location!r} {reason}" in str(info.value)
    assert info.value.anomaly.kind == "onnx.external_path_escape"
    with pytest.raises(Exception):
        onnx.load(str(path))  # onnx refuses them too
    # non-strict: listed, the anomaly recorded, reading raises
    model = onnx_pb.open_source(ByteSource(path), strict=False)
    assert [a.kind for a in model.evidence.anomalies] == ["onnx.external_path_escape"]
    assert reason in model.tensor("w").extras["error"]
    with pytest.raises(onnx_pb.OnnxFormatError):
        model.read("w")


def test_external_dotdot_inside_folder_is_fine(tmp_path):
    path = _ext_model(tmp_path, _ext("w", [2], location="sub/../w.bin"))
    (path.parent / "sub").mkdir()
    (path.parent / "w.bin").write_bytes(np.array([1, 2], dtype=np.float32).tobytes())
    with tensorscope.open(path) as model:
        assert model.read("w").tolist() == [1.0, 2.0]
        assert model.tensor("w").file == str(path.parent / "w.bin")


@pytest.mark.parametrize("entries,message", [
    (dict(location="w.bin", offset=20), "External data offset (20) exceeds file size (16) for tensor 'w'"),
    (dict(location="w.bin", offset=8, length=16),
     "External data length (16) exceeds available data (8 bytes from offset 8) for tensor 'w'"),
    (dict(location="w.bin"), "external data 'w.bin' holds 16 bytes from offset 0, dims [2] of float32 need 8"),
    (dict(location="w.bin", offset=-1), "external data offset must be non-negative, got -1"),
    (dict(location="w.bin", length="x1"), "external data length 'x1' is not an integer"),
    (dict(location="missing.bin"), "external data file 'missing.bin' cannot be opened: No such file or directory"),
    (dict(offset=0), "external data without a location"),
])
def test_external_bounds(tmp_path, entries, message):
    path = _ext_model(tmp_path, _ext("w", [2], **entries))
    (path.parent / "w.bin").write_bytes(b"\0" * 16)
    with pytest.raises(onnx_pb.OnnxFormatError) as info:
        tensorscope.open(path)
    assert message in str(info.value) and str(info.value).startswith(f"onnx: {path} at byte 10: ")


def test_external_offsets_length_optional_and_unknown_keys(tmp_path):
    data = np.arange(6, dtype=np.float32)
    path = _ext_model(tmp_path, _ext("a", [2], location="w.bin", offset=8, length=8),
                      _ext("b", [2], location="w.bin", offset=16, evil="1", another="2"),
                      _ext("c", [6], location="w.bin", checksum="abc"))
    (path.parent / "w.bin").write_bytes(data.tobytes())
    proto = onnx.load(str(path))
    with tensorscope.open(path) as model:
        for t in proto.graph.initializer:
            assert _same(model.read(t.name), numpy_helper.to_array(t))
        assert model.tensor("c").extras["checksum"] == "abc"
        [anomaly] = model.evidence.anomalies
        assert anomaly.kind == "onnx.unknown_external_key"
        assert "['another', 'evil']" in anomaly.message


# -- > 2 GiB: protobuf's own limit -------------------------------------------------------------------
@pytest.mark.slow
def test_model_over_2gib_opens_while_onnx_load_fails(tmp_path):
    n = (1 << 31) + 100  # uint8 elements: raw_data longer than protobuf's 2 GiB limit
    big = _s(8, "huge") + _f(2, 0, value=2) + _f(1, 0, value=n) + _v(9 << 3 | 2) + _v(n)
    small = _init(_tensor("tail", 1, [2], _f(9, 2, np.array([1.5, -3], dtype=np.float32).tobytes())))
    graph_len = len(_v(5 << 3 | 2)) + len(_v(len(big) + n)) + len(big) + n + len(small)
    head = _f(1, 0, value=9) + _v(7 << 3 | 2) + _v(graph_len) + _v(5 << 3 | 2) + _v(len(big) + n) + big
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as f:
        f.write(head)
        f.seek(len(head) + n)  # a hole: no disk blocks for the 2 GiB payload
        f.write(small)
    if os.stat(path).st_blocks * 512 > 64 << 20:
        pytest.skip("filesystem without sparse files")
    with open(path, "rb") as f:
        assert onnx_pb.sniff(f.read(4096), os.path.getsize(path))
    with tensorscope.open(path) as model:
        huge, tail = model.tensors
        assert (huge.name, huge.dtype, huge.shape, huge.byte_offset) == ("huge", "uint8", (n,), len(head))
        assert model.read("tail").tolist() == [1.5, -3.0]
        assert model.read("huge")[-4:].tolist() == [0, 0, 0, 0]
    code = "import onnx, sys; onnx.load(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert done.returncode != 0
    assert "DecodeError" in done.stderr, done.stderr[-500:]
