"""`tensorscope graph` on torch.export archives: nodes equal torch.export.load's graph node for
node, FLOPs equal FlopCounterMode's, parameters equal sum(p.numel())."""
from __future__ import annotations

import pytest
import torch

import graph_models as gm
import tensorscope
from tensorscope.graph import build_graph

CASES = ["mlp", "cnn", "transformer", "sdpa", "multi"]


class Multi(torch.nn.Module):
    """Ops returning several values (chunk, topk): one getitem node per value in the graph."""

    def forward(self, x):
        a, b = x.chunk(2, -1)
        v, i = x.topk(2)
        return a @ b.T, v, i


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_pt2")
    out = {}
    for name in CASES:
        if name == "sdpa":
            torch.manual_seed(0)
            module, inputs = gm.SDPA(), (torch.randn(2, 5, 32),)
        elif name == "multi":
            torch.manual_seed(0)
            module, inputs = Multi(), (torch.randn(3, 8),)
        else:
            module, inputs = gm.build(name)
        path = root / f"{name}.pt2"
        gm.export_pt2(module, inputs, path)
        out[name] = (module, inputs, path)
    return out


def _target(t) -> str:
    """A call_function target as the serialized program names it."""
    if isinstance(t, torch._ops.OpOverload) or isinstance(t, torch._ops.HigherOrderOperator):
        return f"torch.ops.{t}"
    return f"{t.__module__}.{t.__name__}"      # operator.getitem


def _graph(path):
    with tensorscope.open(str(path)) as m:
        return build_graph(m)


@pytest.mark.parametrize("name", CASES)
def test_nodes_equal_torch_export_load(exported, name):
    _, _, path = exported[name]
    ep = torch.export.load(str(path))
    want = [(n.name, _target(n.target)) for n in ep.graph.nodes if n.op == "call_function"]
    g = _graph(path)
    assert [(n.name, n.domain) for n in g.main.nodes] == want
    placeholders = [n.name for n in ep.graph.nodes if n.op == "placeholder"]
    assert [v.name for v in g.main.inputs] == placeholders
    for ours, theirs in zip(g.main.nodes, [n for n in ep.graph.nodes if n.op == "call_function"]):
        val = theirs.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert ours.outputs[0].shape == tuple(val.shape)


@pytest.mark.parametrize("name", CASES)
def test_flops_and_params(exported, name):
    module, inputs, path = exported[name]
    want, _ = gm.flop_counter(module, inputs)
    t = _graph(path).totals()
    assert t["flop_counter_flops"] == want
    assert t["params"] == sum(p.numel() for p in module.parameters())


def test_parameters_linked_and_blocks(exported):
    module, _, path = exported["transformer"]
    g = _graph(path)
    with tensorscope.open(str(path)) as m:
        names = set(m.names)
    linear = [n for n in g.main.nodes if n.op == "linear"]
    assert linear[0].parameters == ["layers.0.attn.q_proj.weight", "layers.0.attn.q_proj.bias"]
    assert {p for n in g.main.nodes for p in n.parameters} <= names
    blocks = {b["pattern"]: b for b in g.blocks()}
    layer = sum(p.numel() for p in module.layers[0].parameters())
    assert blocks["layers.#"]["count"] == 3 and blocks["layers.#"]["params"] == 3 * layer


def test_symbolic_sizes_stay_symbols(tmp_path):
    module, inputs = gm.build("mlp")
    batch = torch.export.Dim("batch")
    path = tmp_path / "dynamic.pt2"
    torch.export.save(torch.export.export(module.eval(), inputs, dynamic_shapes=({0: batch},)),
                      str(path))
    g = _graph(path)
    first = g.main.nodes[0]
    assert isinstance(first.outputs[0].shape[0], str) and first.outputs[0].shape[1] == 32
    assert first.flops is None and "not static" in first.uncounted   # never guessed
    assert g.totals()["params"] == sum(p.numel() for p in module.parameters())


def test_core_aten_after_decompositions(tmp_path):
    module, inputs = gm.build("transformer")
    path = tmp_path / "core.pt2"
    torch.export.save(torch.export.export(module.eval(), inputs).run_decompositions(), str(path))
    want, _ = gm.flop_counter(module, inputs)
    assert _graph(path).totals()["flop_counter_flops"] == want


def test_cond_branches_are_subgraphs(tmp_path):
    torch.manual_seed(0)
    module, x = gm.Cond().eval(), torch.ones(4, 8)
    path = tmp_path / "cond.pt2"
    gm.export_pt2(module, (x,), path)
    ep = torch.export.load(str(path))
    g = _graph(path)
    by_path = {s.path: s for s in g.graphs}
    for branch in ("true_graph_0", "false_graph_0"):
        sub = getattr(ep.graph_module, branch).graph
        want = [(n.name, _target(n.target)) for n in sub.nodes if n.op == "call_function"]
        assert [(n.name, n.domain) for n in by_path[f"main/{branch}"].nodes] == want
    want_then, _ = gm.flop_counter(module, (x,))       # x.sum() > 0: the true branch ran
    want_else, _ = gm.flop_counter(module, (-x,))
    assert by_path["main/true_graph_0"].totals(g.numel)["flop_counter_flops"] == want_then
    assert by_path["main/false_graph_0"].totals(g.numel)["flop_counter_flops"] == want_else
    cond = next(n for n in g.main.nodes if n.op == "higher_order.cond")
    assert cond.subgraphs == ["main/true_graph_0", "main/false_graph_0"] and cond.flops is None
    assert g.totals()["params"] == sum(p.numel() for p in module.parameters())


def test_tied_parameters_counted_once(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))
    module, x = Tied(), torch.randint(0, 10, (2, 3))
    path = tmp_path / "tied.pt2"
    gm.export_pt2(module, (x,), path)
    g = _graph(path)
    assert g.totals()["params"] == sum(p.numel() for p in module.parameters()) == 40
    linear = next(n for n in g.main.nodes if n.op == "linear")
    assert linear.parameters == ["head.weight"] and linear.params == 40
