"""The TUI's graph screen (Pilot): node list with op, shapes, params and FLOPs; subgraphs
expandable; the filter; Enter on a node shows its parameters in the tensor table; the
architecture summary on the file screen."""
from __future__ import annotations

import asyncio
import functools
import inspect

import pytest
import torch

import graph_models as gm
from helpers import settle
from tensorscope.tui.app import make_app
from tensorscope.tui.screens.browse import BrowseScreen
from tensorscope.tui.screens.graph import GraphScreen, parameter_filter

SIZE = (120, 40)


def run_async(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    wrapper.__signature__ = inspect.signature(fn)
    return wrapper


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("graph_tui")
    module, inputs = gm.build("mlp")
    gm.export_onnx(module, inputs, root / "mlp.onnx")
    torch.manual_seed(0)
    gm.export_onnx(torch.jit.script(gm.Branchy()), (torch.ones(4, 8),), root / "if.onnx")
    return root


def _tree_labels(tnode) -> list[str]:
    return [str(c.label) for c in tnode.children]


def table_names(screen) -> list[str]:
    table = screen.query_one("#tensors")
    return [str(table.get_row_at(r)[0]) for r in range(table.row_count)]


def test_parameter_filter():
    assert parameter_filter(["a.b.weight", "a.b.bias"]) == "a.b.*"
    assert parameter_filter(["w"]) == "w"
    assert parameter_filter(["onnx::MatMul_1", "q.bias"]) == "onnx::MatMul_1"


@run_async
async def test_graph_screen_nodes_and_jump(files):
    app = make_app(files / "mlp.onnx", scan=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, GraphScreen)
        tree = screen.query_one("#graph-tree")
        main = tree.root.children[0]
        labels = _tree_labels(main)
        assert labels[0].startswith("Gemm") and "[5,32]" in labels[0] and "544 params" in labels[0]
        assert "FLOPs" in labels[0]
        assert "FlopCounterMode" in str(screen.query_one("#graph-status").content)
        # Enter on the first Gemm: back to the table, filtered to that node's parameters
        tree.focus()
        tree.move_cursor(main.children[0])
        await pilot.press("enter")
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)
        assert table_names(app.screen) == ["fc1.weight", "fc1.bias"] or \
            sorted(table_names(app.screen)) == ["fc1.bias", "fc1.weight"]


@run_async
async def test_subgraphs_expand_and_filter(files):
    app = make_app(files / "if.onnx", scan=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G")
        await settle(pilot)
        screen = app.screen
        tree = screen.query_one("#graph-tree")
        graphs = tree.root.children
        assert len(graphs) == 3 and "then_branch" in str(graphs[1].label)
        assert not graphs[1].children          # added when expanded
        graphs[1].expand()
        await settle(pilot)
        assert _tree_labels(graphs[1])[0].startswith("Gemm")
        await pilot.press("slash", *"gemm", "enter")
        await settle(pilot)
        main = screen.query_one("#graph-tree").root.children[0]
        assert "0 nodes" in str(main.label)    # the main graph holds no Gemm


@run_async
async def test_no_graph_binding_for_tensor_files(tmp_path):
    from safetensors.numpy import save_file
    import numpy as np
    path = tmp_path / "w.safetensors"
    save_file({"a": np.zeros(3, np.float32)}, str(path))
    app = make_app(path, scan=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("G")
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen)


@run_async
async def test_file_screen_architecture(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                     num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(tmp_path / "m"))
    app = make_app(tmp_path / "m", scan=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("m")
        await settle(pilot)
        import io
        from rich.console import Console
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(app.screen._summary())
        text = console.export_text()
        assert "architecture" in text and "experts 4" in text and "active per token" in text
