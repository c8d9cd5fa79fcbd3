"""`tensorscope graph` on damaged and hostile files: a clear TensorscopeError (exit 2, one line)
or a graph, never another exception; limits hold."""
from __future__ import annotations

import json
import random
import zipfile

import onnx
import pytest
from onnx import TensorProto, helper

import graph_models as gm
import tensorscope
from tensorscope import cli
from tensorscope.errors import TensorscopeError
from tensorscope.graph import build_graph


@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory):
    module, inputs = gm.build("mlp")
    path = tmp_path_factory.mktemp("hostile") / "mlp.onnx"
    gm.export_onnx(module, inputs, path)
    return path


def _graph_or_error(path):
    try:
        with tensorscope.open(str(path)) as m:
            build_graph(m)
    except TensorscopeError:
        pass


def test_flipped_and_cut_onnx_bytes(mlp_onnx, tmp_path):
    data = mlp_onnx.read_bytes()
    rng = random.Random(7)
    for k in range(60):
        b = bytearray(data)
        if k % 3 == 0:
            b = b[: rng.randrange(1, len(b))]
        else:
            for _ in range(rng.randrange(1, 6)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        path = tmp_path / f"bad{k}.onnx"
        path.write_bytes(bytes(b))
        _graph_or_error(path)      # anything but a TensorscopeError fails the test


def test_packed_floats_of_odd_length(tmp_path):
    node = helper.make_node("Foo", ["x"], ["y"], domain="custom", scales=[1.0])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    good = model.SerializeToString()
    one = bytes([0x3D]) + b"\x00\x00\x80\x3f"    # floats (7, fixed32): one float32, unpacked
    assert one in good
    path = tmp_path / "odd.onnx"
    # the same 5 bytes as a packed run (7, LEN) of 3 bytes: every enclosing length still holds
    path.write_bytes(good.replace(one, bytes([0x3A, 3]) + b"\x00\x00\x80", 1))
    with tensorscope.open(str(path)) as m, pytest.raises(TensorscopeError, match="multiple of 4"):
        build_graph(m)


def test_deep_subgraph_nesting_is_bounded(tmp_path):
    # written on the wire by hand: protobuf's own parser refuses this depth
    from tensorscope.parsers.onnx_graph import _len_field, _varint_bytes

    graph = _len_field(1, _len_field(4, b"Identity") + _len_field(1, b"x") + _len_field(2, b"y"))
    for _ in range(80):
        attr = _len_field(1, b"then_branch") + _varint_bytes(20 << 3) + b"\x05" + _len_field(6, graph)
        graph = _len_field(1, _len_field(4, b"If") + _len_field(1, b"c") + _len_field(2, b"y")
                           + _len_field(5, attr))
    path = tmp_path / "deep.onnx"
    path.write_bytes(b"\x08\x08" + _len_field(7, graph))
    with pytest.raises(TensorscopeError, match="nesting"):   # the listing stops it already
        with tensorscope.open(str(path)) as m:
            build_graph(m)
    from tensorscope.parsers.onnx_graph import read_graphs
    from tensorscope.remote import open_source
    with pytest.raises(TensorscopeError, match="nesting"):   # and so does the graph walker
        read_graphs(open_source(str(path)))
    assert cli.main(["graph", str(path)]) == 2


def test_pt2_with_odd_program_json(tmp_path):
    module, inputs = gm.build("mlp")
    good = tmp_path / "good.pt2"
    gm.export_pt2(module, inputs, good)
    with zipfile.ZipFile(good) as z:
        names = z.namelist()
        program = next(n for n in names if n.endswith("models/model.json"))
        doc = json.loads(z.read(program))
        members = {n: z.read(n) for n in names}
    variants = []
    g = doc["graph_module"]["graph"]
    for mutate in (lambda d: d["graph_module"]["graph"].__setitem__("nodes", {"a": 1}),
                   lambda d: d["graph_module"]["graph"]["nodes"][0].__setitem__("inputs", "x"),
                   lambda d: d["graph_module"]["graph"].__setitem__("tensor_values", [1, 2]),
                   lambda d: d["graph_module"]["graph"]["tensor_values"][
                       next(iter(g["tensor_values"]))].__setitem__("sizes", [{"as_int": "x"}, 7]),
                   lambda d: d["graph_module"].__setitem__("signature", None),
                   lambda d: d["graph_module"]["graph"]["nodes"].append("node")):
        d = json.loads(json.dumps(doc))
        mutate(d)
        variants.append(d)
    for k, d in enumerate(variants):
        path = tmp_path / f"odd{k}.pt2"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            for n, data in members.items():
                z.writestr(n, json.dumps(d) if n == program else data)
        _graph_or_error(path)
