"""`tensorscope graph` on TorchScript archives: ops read from the code/ sources equal the aten
ops of torch.jit.load(...).inlined_graph; parameters linked to the module's own."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import graph_models as gm
import tensorscope
from tensorscope.graph import build_graph

# scalar plumbing the printer writes as Python (int(b), x.size(0)): not compared
_PLUMBING = {"Int", "size", "Float", "ScalarImplicit"}


@pytest.fixture(scope="session")
def traced(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_ts")
    out = {}
    for name in ("mlp", "cnn", "transformer"):
        module, inputs = gm.build(name)
        path = root / f"{name}.pt"
        torch.jit.trace(module.eval(), inputs).save(str(path))
        out[name] = (module, path)
    module, _ = gm.build("mlp")
    path = root / "scripted.pt"
    torch.jit.script(module).save(str(path))
    out["scripted"] = (module, path)
    return out


def _graph(path):
    with tensorscope.open(str(path)) as m:
        return build_graph(m)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_ops_equal_inlined_graph(traced, name):
    module, path = traced[name]
    want = Counter(n.kind()[6:] for n in torch.jit.load(str(path)).inlined_graph.nodes()
                   if n.kind().startswith("aten::") and n.kind()[6:] not in _PLUMBING)
    g = _graph(path)
    got = Counter(n.op for n in g.main.nodes
                  if n.op not in _PLUMBING and not n.op.startswith("prim."))
    assert got == want
    assert g.totals()["params"] == sum(p.numel() for p in module.parameters())


def test_parameters_by_module_path(traced):
    module, path = traced["transformer"]
    g = _graph(path)
    linears = [n for n in g.main.nodes if n.op == "linear"]
    assert linears[0].module == "layers.0.attn.q_proj"
    assert linears[0].parameters == ["layers.0.attn.q_proj.weight", "layers.0.attn.q_proj.bias"]
    assert sum(n.params for n in linears) == sum(
        p.numel() for n, p in module.named_parameters() if "proj" in n or "mlp" in n or "head" in n)
    blocks = g.blocks()
    assert blocks[0]["pattern"] == "layers.#" and blocks[0]["count"] == 3
    assert all(n.flops is None and n.uncounted for n in linears)   # no shapes in the file


def test_scripted_lists_both_branches(traced):
    module, path = traced["scripted"]
    g = _graph(path)
    assert [n.op for n in g.main.nodes if n.op == "linear"] == ["linear"] * 3
    relus = [n for n in g.main.nodes if n.op in ("relu", "relu_")]
    assert sorted(n.attributes.get("branch") for n in relus) == ["else", "then"]
    assert g.totals()["params"] == sum(p.numel() for p in module.parameters())


def test_self_calling_classes_are_bounded(traced, tmp_path, monkeypatch):
    """Code where a module calls two children of its own class at every level (2^depth calls,
    no op among them) ends at the call budget, with a note, instead of running for ever."""
    import zipfile
    from tensorscope.graph import torchscript as ts
    monkeypatch.setattr(ts, "MAX_CALLS", 5000)
    _, path = traced["mlp"]
    bad = tmp_path / "loop.pt"
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as out:
        for info in z.infolist():
            data = z.read(info.filename)
            if info.filename.endswith("graph_models.py") or "/graph_models/" in info.filename:
                text = data.decode()
                cls = text.split("class ", 1)[1].split("(", 1)[0]
                mod = info.filename.split("/code/", 1)[1][:-3].replace("/", ".")
                text = text.replace("    fc3 = self.fc3\n", "    fc3 = self.fc3\n"
                                    "    _a = (self.fc1).forward(x, )\n", 1)
                text = text.replace(f"  fc1 : __torch__.torch.nn.modules.linear",
                                    f"  fc1 : {mod}.{cls}\n  fc0 : __torch__.torch.nn.modules.linear", 1)
                text = text.replace("    input = torch.relu((fc1).forward(x, ))",
                                    "    _b = (fc1).forward(x, )\n    input = torch.relu((fc1).forward(x, ))", 1)
                data = text.encode()
            out.writestr(info, data)
    g = _graph(bad)
    assert any("calls, listed in part" in n for n in g.notes)
