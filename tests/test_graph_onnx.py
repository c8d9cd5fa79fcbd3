"""`tensorscope graph` on ONNX files written by torch's exporter from real modules: node lists
equal onnx.load's, FLOPs equal FlopCounterMode's on the same module and inputs, parameter
totals equal sum(p.numel())."""
from __future__ import annotations

import contextlib
import io
import json
import warnings
from types import SimpleNamespace

import onnx
import pytest
import torch
from onnx import helper

import graph_models as gm
import tensorscope
from tensorscope.graph import NoGraph, build_graph
from tensorscope.safetext import is_clean

MODELS = ["mlp", "cnn", "transformer"]


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_onnx")
    out = {}
    for name in MODELS:
        module, inputs = gm.build(name)
        path = root / f"{name}.onnx"
        gm.export_onnx(module, inputs, path)
        out[name] = (module, inputs, path)
    torch.manual_seed(0)
    branchy = torch.jit.script(gm.Branchy())
    x = torch.ones(4, 8)
    gm.export_onnx(branchy, (x,), root / "if.onnx")
    out["if"] = (branchy, (x,), root / "if.onnx")
    module, inputs = gm.build("transformer")
    gm.export_onnx(module, inputs, root / "functions.onnx",
                   export_modules_as_functions={gm.Block})
    out["functions"] = (module, inputs, root / "functions.onnx")
    return out


def _graph(path):
    with tensorscope.open(str(path)) as m:
        return build_graph(m)


def _attr(a):
    v = helper.get_attribute_value(a)
    if a.type in (onnx.AttributeProto.TENSOR,):
        return {"tensor": onnx.helper.tensor_dtype_to_np_dtype(v.data_type).name, "shape": list(v.dims)}
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def _same_nodes(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert (a.name, a.op, a.domain, [v.name for v in a.inputs], [v.name for v in a.outputs]) \
            == (b.name, b.op_type, b.domain, list(b.input), list(b.output))
        for attr in b.attribute:
            if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                continue
            want = _attr(attr)
            got = a.attributes[attr.name]
            if isinstance(want, dict):
                assert got["shape"] == want["shape"]
            elif isinstance(want, float):
                assert got == pytest.approx(want)
            else:
                assert got == want


@pytest.mark.parametrize("name", MODELS + ["if", "functions"])
def test_nodes_equal_onnx_load(exported, name):
    _, _, path = exported[name]
    g = _graph(path)
    proto = onnx.load(str(path))
    _same_nodes(g.main.nodes, proto.graph.node)
    by_path = {x.path: x for x in g.graphs}
    for i, node in enumerate(proto.graph.node):   # subgraphs, by the parser's paths
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _same_nodes(by_path[f"main/{node.name or f'{node.op_type}_{i}'}.{a.name}"].nodes,
                            a.g.node)
    for f in proto.functions:
        _same_nodes(by_path[f"functions/{f.domain}.{f.name}"].nodes, f.node)
    assert sum(x.kind == "subgraph" for x in g.graphs) == sum(
        a.type == onnx.AttributeProto.GRAPH for n in proto.graph.node for a in n.attribute)


@pytest.mark.parametrize("name", MODELS + ["functions"])
def test_flops_equal_flop_counter(exported, name):
    module, inputs, path = exported[name]
    want, _ = gm.flop_counter(module, inputs)
    totals = _graph(path).totals()
    assert totals["flop_counter_flops"] == want
    assert totals["params"] == sum(p.numel() for p in module.parameters())


def test_if_branches_counted_on_their_own(exported):
    module, (x,), path = exported["if"]
    g = _graph(path)
    want, _ = gm.flop_counter(module, (x,))          # x.sum() > 0: the then branch ran
    then = next(s for s in g.graphs if s.path.endswith(".then_branch"))
    assert then.totals(g.numel)["flop_counter_flops"] == want
    els = next(s for s in g.graphs if s.path.endswith(".else_branch"))
    want_else, _ = gm.flop_counter(module, (-x,))
    assert els.totals(g.numel)["flop_counter_flops"] == want_else
    if_node = next(n for n in g.main.nodes if n.op == "If")
    assert if_node.flops is None and "control flow" in if_node.uncounted
    assert g.totals()["params"] == sum(p.numel() for p in module.parameters())


def test_parameters_linked_to_tensorinfo(exported):
    module, inputs, path = exported["mlp"]
    g = _graph(path)
    with tensorscope.open(str(path)) as m:
        names = set(m.names)
    linked = [p for n in g.main.nodes for p in n.parameters]
    assert linked and set(linked) <= names
    gemm = [n for n in g.main.nodes if n.op in ("Gemm", "MatMul")]
    assert [n.params for n in gemm] == [16 * 32 + 32, 32 * 8 + 8, 8 * 4]


def test_shapes_inferred_where_the_file_has_none(exported):
    module, (ids,), path = exported["transformer"]
    proto = onnx.load(str(path))
    assert len(proto.graph.value_info) == 0            # the exporter wrote none
    g = _graph(path)
    assert g.shapes_from == "file+inference"
    inferred = onnx.shape_inference.infer_shapes(proto)
    want = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in inferred.graph.value_info}
    got = {v.name: list(v.shape) for n in g.main.nodes for v in n.outputs if v.shape is not None}
    assert {k: got[k] for k in want} == want


def test_function_calls_carry_their_bodies(exported):
    module, inputs, path = exported["functions"]
    g = _graph(path)
    calls = [n for n in g.main.nodes if n.op == "Block"]
    assert len(calls) == 3 and all(n.flops_kind == "function" for n in calls)
    blocks = g.blocks()
    assert [(b["pattern"], b["count"]) for b in blocks] == [("layers.#", 3)]
    per_layer = sum(p.numel() for p in module.layers[0].parameters())
    assert blocks[0]["params"] == 3 * per_layer


def _cli(*args):
    """``tensorscope graph ARGS`` in this process (what it prints is tested, not the process): its
    exit status, stdout, and stderr with any warning raised meanwhile, as a child would print it."""
    from tensorscope.cli import main
    out, err = io.StringIO(), io.StringIO()
    with warnings.catch_warnings(record=True) as seen, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        warnings.simplefilter("default")
        code = main(["graph", *map(str, args)])
    text = err.getvalue() + "".join(warnings.formatwarning(w.message, w.category, w.filename,
                                                           w.lineno) for w in seen)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=text)


def test_cli_json_schema(exported):
    _, _, path = exported["cnn"]
    r = _cli(path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tensorscope.graph/1"
    assert {"name", "op", "inputs", "outputs", "params", "flops"} <= set(doc["nodes"][0])
    assert {"params", "flops"} <= set(doc["totals"])
    assert len(doc["nodes"]) == len(onnx.load(str(path)).graph.node)


def test_cli_table_dot_mermaid(exported):
    _, _, path = exported["if"]
    for flag in ((), ("--dot",), ("--mermaid",), ("--group",)):
        r = _cli(path, *flag)
        assert r.returncode == 0, r.stderr
        assert "Gemm" in r.stdout
    assert _cli(path, "--dot").stdout.startswith("digraph")
    assert _cli(path, "--mermaid").stdout.startswith("flowchart")


def test_hostile_names_escaped(tmp_path):
    evil = "\x1b]0;pwned\x07[bold red]x[/]\u202e\"};\n"
    x = helper.make_tensor_value_info(evil, onnx.TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor("w" + evil, onnx.TensorProto.FLOAT, [3, 4], [0.0] * 12)
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
    node = helper.make_node("MatMul", [evil, "w" + evil], ["y"], name=evil)
    model = helper.make_model(helper.make_graph([node], evil, [x], [y], [w]))
    path = tmp_path / "evil.onnx"
    onnx.save(model, str(path))
    for flag in ((), ("--dot",), ("--mermaid",), ("--group",)):
        r = _cli(path, *flag)
        assert r.returncode == 0, r.stderr
        assert is_clean(r.stdout) and is_clean(r.stderr)
        assert "\\x1b" in r.stdout or flag == ("--group",)   # grouped rows name no node
    assert "[bold red]" in _cli(path).stdout         # printed, not interpreted
    dot = _cli(path, "--dot").stdout
    assert '"};' not in dot.replace('\\"};', "")     # a quote in a name cannot end a label
    assert json.loads(_cli(path, "--json").stdout)["nodes"][0]["name"] == evil
    assert _graph(path).totals()["flop_counter_flops"] == 2 * 2 * 3 * 4


def test_no_graph_is_an_error(tmp_path):
    from safetensors.numpy import save_file
    import numpy as np
    path = tmp_path / "w.safetensors"
    save_file({"a": np.zeros(3, np.float32)}, str(path))
    with tensorscope.open(str(path)) as m, pytest.raises(NoGraph):
        build_graph(m)
    r = _cli(path)
    assert r.returncode == 2 and "not a graph" in r.stderr and "Traceback" not in r.stderr


def test_malformed_onnx_is_one_line(tmp_path, exported):
    _, _, path = exported["mlp"]
    data = path.read_bytes()
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(data[: len(data) // 2])
    r = _cli(bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_hostile_symbolic_dimensions_escaped(tmp_path):
    evil = "\x1b[2J\"];\n}"
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [evil, 3])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [evil, 3])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [x], [y]))
    path = tmp_path / "dims.onnx"
    onnx.save(model, str(path))
    for flag in ((), ("--dot",), ("--mermaid",)):
        r = _cli(path, *flag)
        assert r.returncode == 0, r.stderr
        assert is_clean(r.stdout) and "\\x1b[2J" in r.stdout
    dot = _cli(path, "--dot").stdout
    assert '\\"];' in dot and '"];\\x0a' not in dot.replace('\\"];', "")
    node = _graph(path).main.nodes[0]
    assert node.flops is None and "not static" in node.uncounted
