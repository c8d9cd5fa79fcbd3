"""The TUI through Textual's Pilot, plus its pure helpers (tree, rows, chunked statistics).

Fixtures come from ``fixtures/gen_tui.py``; expected values are recomputed here with numpy from
the same arrays the generator wrote (the generator is imported, so they cannot drift apart).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorscope
from tensorscope.reader import tensor_stats
from tensorscope.tui import compute
from tensorscope.tui.app import make_app
from tensorscope.tui.model_index import build_tree, select_rows, tensor_path
from tensorscope.tui.screens.browse import GROUP_ABOVE, MAX_CHILDREN, BrowseScreen
from tensorscope.tui.screens.diff import DiffScreen
from tensorscope.tui.screens.misc import ErrorScreen, HelpScreen
from tensorscope.tui.screens.scan import ScanScreen
from tensorscope.tui.screens.values import ValuesScreen
from tensorscope.tui.widgets.banner import SafetyBanner

from helpers import settle  # shared with the snapshot suite

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures" / "tui"

A = FIX / "model_a.safetensors"
B = FIX / "model_b.safetensors"
GARBAGE = FIX / "garbage.bin"
MALICIOUS = FIX / "malicious.pt"
SIZE = (80, 24)


def plain(renderable) -> str:
    """Plain text of what a Static shows (a str, Text, Table, Syntax ...)."""
    import io

    from rich.console import Console

    if isinstance(renderable, str):
        return renderable
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def static_text(screen, selector: str) -> str:
    return plain(screen.query_one(selector).content)


def run_async(fn):
    """Run an async test with asyncio.run (no async pytest plugin is a test dependency)."""
    import asyncio
    import functools
    import inspect

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    wrapper.__signature__ = inspect.signature(fn)
    return wrapper



def table_names(screen) -> list[str]:
    table = screen.query_one("#tensors")
    return [str(table.get_row_at(r)[0]) for r in range(table.row_count)]


# -- pure helpers ---------------------------------------------------------------------------------
def test_tree_totals_match_tensors():
    model = tensorscope.open(A)
    root = build_tree(model.tensors, "m")
    assert root.params == sum(t.numel for t in model.tensors) == 5217
    assert root.nbytes == sum(t.nbytes for t in model.tensors)
    assert list(root.children) == ["embed", "layers", "norm"]
    layer0 = root.children["layers"].children["0"]
    expected = [i for i, t in enumerate(model.tensors) if t.name.startswith("layers.0.")]
    assert layer0.tensor_indices() == expected
    assert layer0.params == sum(model.tensors[i].numel for i in expected)
    assert layer0.children["attn"].count == 4
    # "step" sits at the root: no module of its own
    assert [model.tensors[i].name for i in root.direct] == ["step"]


@pytest.mark.parametrize("pattern,expected", [
    ("up", ["layers.0.mlp.up.bias", "layers.0.mlp.up.weight", "layers.1.mlp.up.bias",
            "layers.1.mlp.up.weight"]),
    ("*.bias", ["layers.0.mlp.up.bias", "layers.1.mlp.up.bias", "norm.bias"]),
    ("LAYERS.1.ATTN.*", ["layers.1.attn.k_proj.weight", "layers.1.attn.o_proj.weight",
                         "layers.1.attn.q_proj.weight", "layers.1.attn.v_proj.weight"]),
    ("nomatch", []),
])
def test_select_rows_filter(pattern, expected):
    model = tensorscope.open(A)
    rows = select_rows(model.tensors, range(len(model.tensors)), pattern, sort="name")
    assert [model.tensors[i].name for i in rows] == expected


def test_select_rows_sort():
    model = tensorscope.open(A)
    rows = select_rows(model.tensors, range(len(model.tensors)), "", sort="params", reverse=True)
    numels = [model.tensors[i].numel for i in rows]
    assert numels == sorted(numels, reverse=True) and numels[0] == 1024


def test_tensor_path_prefers_given_path():
    t = tensorscope.TensorInfo("a.b", "float32", (1,), path=("a.b",))
    assert tensor_path(t) == ("a", "b")
    t = tensorscope.TensorInfo("x", "float32", (1,), path=("state", "a.b", "w"))
    assert tensor_path(t) == ("state", "a.b", "w")


@pytest.mark.parametrize("arr", [
    np.arange(1000, dtype=np.float32).reshape(10, 100),
    np.array([1.0, np.nan, np.inf, -2.0, 0.0] * 301, dtype=np.float64),
    np.asfortranarray(np.linspace(-3, 7, 600).reshape(20, 30)),
    np.zeros((0, 4), dtype=np.float32),
    np.array(3.5),
    np.array([1 + 2j, 3 - 4j] * 50, dtype=np.complex64),
])
def test_chunked_stats_equal_library_stats(arr, monkeypatch):
    monkeypatch.setattr(compute, "_CHUNK", 64)  # force many chunks
    got = compute.chunked_stats(arr)
    want = tensor_stats(arr)
    assert (got.numel, got.nan, got.inf, got.zeros) == (want.numel, want.nan, want.inf, want.zeros)
    for field in ("min", "max", "mean", "std"):
        g, w = getattr(got, field), getattr(want, field)
        assert (g is None and w is None) or g == pytest.approx(w, rel=1e-12, abs=1e-12)


def test_chunked_stats_cancel():
    with pytest.raises(compute.Cancelled):
        compute.chunked_stats(np.ones(10), cancelled=lambda: True)


def test_histogram_counts_finite_values(monkeypatch):
    monkeypatch.setattr(compute, "_CHUNK", 80)
    arr = np.array([0.0, 1.0, 2.0, 3.0, np.nan, np.inf] * 50)
    counts = compute.histogram(arr, 0.0, 3.0, bins=3)
    assert counts == np.histogram(arr[np.isfinite(arr)], bins=3, range=(0, 3))[0].tolist()


def test_diff_histogram_matches_numpy():
    a = np.arange(600, dtype=np.float32).reshape(20, 30)
    b = np.asfortranarray(a * 0.5)
    counts, lo, hi = compute.diff_histogram(a, b, bins=10)
    d = a.astype(np.float64) - b.astype(np.float64)
    assert (lo, hi) == (d.min(), d.max())
    assert counts == np.histogram(d, bins=10, range=(lo, hi))[0].tolist()


def test_preview_window_shapes():
    arr = np.arange(2 * 3 * 50, dtype=np.int32).reshape(2, 3, 50)
    rows, cols, cells = compute.preview_window(arr, 0, 40, 100, 20)
    assert rows == [0, 1, 2] and cols == list(range(40, 50))
    assert cells[1] == arr[0, 1, 40:50].tolist()
    rows, cols, cells = compute.preview_window(np.arange(25), 2, 0, 100, 20)
    assert rows == [20] and cells == [[20, 21, 22, 23, 24, None, None, None, None, None]]


# -- the app ----------------------------------------------------------------------------------------
@run_async
async def test_browse_tree_table_and_statistics():
    app = make_app(A)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, BrowseScreen)
        assert len(table_names(screen)) == 18
        assert "model_a.safetensors" in static_text(screen, "#titlebar")
        # move through the tree: root -> embed -> layers; expand layers -> 0 -> mlp
        tree = screen.query_one("#modules")
        tree.focus()
        await pilot.press("down")
        assert table_names(screen) == ["weight"]
        await pilot.press("down", "space", "down", "space", "down", "down")
        assert tree.cursor_node.data.dotted == "layers.0.mlp"
        await settle(pilot)
        assert table_names(screen) == ["down.weight", "up.bias", "up.weight"]
        # select layers.0.mlp.up.weight (values 0..511) in the table and see its statistics
        await pilot.press("tab", "down", "down")
        await settle(pilot)
        assert screen.selected_info().name == "layers.0.mlp.up.weight"
        stats = static_text(screen, "#d-stats")
        want = np.arange(512, dtype=np.float64)
        for label, value in (("min", "0"), ("max", "511"), ("mean", "255.5"),
                             ("std", f"{want.std():.6g}"), ("zeros", "1 (0.20%)")):
            assert f"{label} " in stats and value in stats, (label, value, stats)
        hist = static_text(screen, "#d-hist")
        assert "█" in hist and "511" in hist
        assert "byte_offset" in static_text(screen, "#d-meta")


@run_async
async def test_filter_with_slash_substring_and_glob():
    app = make_app(A)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        await pilot.press("slash", "u", "p")
        assert table_names(screen) == ["layers.0.mlp.up.bias", "layers.0.mlp.up.weight",
                                       "layers.1.mlp.up.bias", "layers.1.mlp.up.weight"]
        await pilot.press("enter")
        assert screen.query_one("#tensors").has_focus
        await pilot.press("slash", *("backspace",) * 2, *"*.bias")
        assert table_names(screen) == ["layers.0.mlp.up.bias", "layers.1.mlp.up.bias", "norm.bias"]
        assert "filter '*.bias'" in static_text(screen, "#table-status")
        await pilot.press("escape")
        assert len(table_names(screen)) == 18 and not screen.has_class("-filtering")
        # keys that are also bindings (q quits, s scans, t toggles the theme) type into the filter
        await pilot.press("slash", "q", "s", "t", "question_mark")
        assert screen.query_one("#filter").value == "qst?" and app.screen is screen
        assert app.current_theme.dark


@run_async
async def test_sort_by_key_and_header_click():
    app = make_app(A)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = app.screen
        await pilot.press("o")  # first sort column: name
        names = table_names(screen)
        assert names == sorted(names)
        await pilot.press("r")
        assert table_names(screen) == sorted(names, reverse=True)
        # a click on a header sorts by that column
        table = screen.query_one("#tensors")
        x = 1 + sum(w + 1 for c, w in table._fit()[:3])  # the 4th column: params
        assert table._fit()[3][0].key == "params"
        await pilot.click("#tensors", offset=(x + 1, 0))
        await pilot.pause()
        model = screen.model
        params = [model.tensor(n).numel for n in table_names(screen)]
        assert params == sorted(params)


@run_async
async def test_values_preview_window_moves():
    app = make_app(A)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("slash", *"mlp.up.weight", "enter", "down")
        await pilot.press("v")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ValuesScreen)
        assert screen.info.name == "layers.1.mlp.up.weight"
        await pilot.press("escape")
        await pilot.press("up", "v")
        await pilot.pause()
        screen = app.screen
        assert screen.info.name == "layers.0.mlp.up.weight"
        table = screen.query_one("#values")
        # index + the columns that fit 80 cells whole (16 would cut the last numbers)
        fitted = len(table.columns) - 1
        assert table.row_count == 32 and 8 <= fitted < 16
        assert f"cols 0–{fitted - 1} of 16" in static_text(screen, "#values-status")
        assert [str(c) for c in table.get_row_at(1)[1:4]] == ["16", "17", "18"]
        await pilot.press("right_square_bracket")  # only 32 rows: the window stays
        assert "rows 0–31 of 32" in static_text(screen, "#values-status")
        await pilot.press("escape")
        assert isinstance(app.screen, BrowseScreen)


@run_async
async def test_large_model_table_is_virtual_and_tree_capped(tmp_path):
    from safetensors.numpy import save_file

    n = 2500
    path = tmp_path / "many.safetensors"
    save_file({f"blocks.{i // 2}.p{i % 2}": np.full((2,), i, dtype=np.float32) for i in range(n)},
              str(path))
    app = make_app(path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        table = screen.query_one("#tensors")
        assert table.row_count == n and len(screen.rows) == n
        # End and Home move the cursor to the last and first row; the last row is drawn
        await pilot.press("end")
        await settle(pilot)
        last = screen.model.tensors[-1].name
        assert table.cursor_row == n - 1 and screen.selected_info().name == last
        assert last in app.export_screenshot()
        await pilot.press("home")
        await settle(pilot)
        assert table.cursor_row == 0 and screen.selected_info() is screen.model.tensors[0]
        # the tree caps children per node and says how many it left out
        tree = screen.query_one("#modules")
        blocks = tree.root.children[0]
        blocks.expand()
        await pilot.pause()
        assert len(blocks.children) == MAX_CHILDREN + 1
        assert f"{1250 - MAX_CHILDREN:,} more" in str(blocks.children[-1].label)


def _moe(tmp_path, layers: int, experts: int):
    from safetensors.numpy import save_file

    names = [f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight"
             for i in range(layers) for e in range(experts) for p in ("gate", "up", "down")]
    path = tmp_path / "moe.safetensors"
    save_file({k: np.zeros((2, 2), dtype=np.float16) for k in names}
              | {"model.embed_tokens.weight": np.zeros((4, 2), dtype=np.float16)}, str(path))
    return path, names


@run_async
async def test_big_model_opens_in_grouped_tree(tmp_path):
    path, names = _moe(tmp_path, layers=30, experts=60)  # 5,400 + 1 tensors
    assert len(names) + 1 > GROUP_ABOVE
    app = make_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = app.screen
        assert screen.grouped
        tree = screen.query_one("#modules")
        model_node = tree.root.children[0]
        model_node.expand()
        await pilot.pause()
        labels = {str(c.label).split(" ")[0]: c for c in model_node.children}
        assert set(labels) == {"layers.#", "embed_tokens"}
        layers = labels["layers.#"]
        assert "×30 (0–29)" in str(layers.label)
        assert layers.data.count == len(names)
        layers.expand()
        await pilot.pause()
        mlp = layers.children[0]
        mlp.expand()
        await pilot.pause()
        experts = mlp.children[0]
        assert str(experts.label).startswith("experts.# ×60 (0–59)")
        experts.expand()
        await pilot.pause()
        up = next(c for c in experts.children if str(c.label).startswith("up_proj"))
        tree.move_cursor(up)
        await settle(pilot)
        shown = [screen.model.tensors[i].name for i in screen.rows]
        assert shown == [t.name for t in screen.model.tensors if ".up_proj." in t.name]
        assert len(shown) == 30 * 60
        # g: back to the module tree, one node per layer
        await pilot.press("g")
        await settle(pilot)
        assert not screen.grouped and len(screen.rows) == len(names) + 1
        layers_plain = screen.root.children["model"].children["layers"]
        assert len(layers_plain.children) == 30


def test_index_select_matches_a_plain_filter():
    """TensorIndex (lowercase index, incremental filtering, cached sort orders) against the
    straightforward select_rows over the same tensors, for every sort and growing queries."""
    from tensorscope.tui.model_index import TensorIndex

    model = tensorscope.open(A)
    tensors = model.tensors
    index = TensorIndex(tensors)
    root = build_tree(tensors, "m")
    node = root.children["layers"].children["1"]
    for sort in ("#", "name", "params", "shape", "offset"):
        for reverse in (False, True):
            for where, indices in ((None, range(len(tensors))), (node, node.tensor_indices())):
                for pattern in ("", "L", "la", "lay", "laYers.1", "s.1", "*.weight", "*proj*", "zz",
                                "layers.1.*", "*", "**", "*.*", "l*s.1*", "*.?_proj.*", "[ln]*",
                                "*bias", "norm*"):
                    want = select_rows(tensors, indices, pattern, sort, reverse)
                    got = index.select(where, pattern, sort, reverse)
                    if sort != "#":  # ties may order differently: compare the sort keys
                        from tensorscope.tui.model_index import SORT_KEYS
                        key = SORT_KEYS[sort]
                        assert [key(tensors[i]) for i in got] == [key(tensors[i]) for i in want]
                        assert sorted(got) == sorted(want)
                    else:
                        assert got == want, (sort, reverse, pattern)


@run_async
async def test_diff_shows_changed_pair_and_histogram():
    app = make_app(A, B)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, DiffScreen)
        by_name = {e.name: e.status for e in screen.result.entries}
        assert by_name["layers.1.attn.k_proj.weight"] == "changed"
        assert by_name["norm.bias"] == "removed" and by_name["head.weight"] == "added"
        summary = static_text(screen, "#diff-summary")
        assert "1 changed" in summary and "1 added" in summary and "1 removed" in summary
        await pilot.press("c")  # changed only
        await settle(pilot)
        table = screen.query_one("#diff-table")
        shown = [str(table.get_row_at(r)[1]) for r in range(table.row_count)]
        assert shown == ["layers.1.attn.k_proj.weight", "norm.bias", "head.weight"] or \
            sorted(shown) == sorted(["layers.1.attn.k_proj.weight", "norm.bias", "head.weight"])
        table.move_cursor(row=shown.index("layers.1.attn.k_proj.weight"))
        await settle(pilot)
        info = static_text(screen, "#dd-info")
        assert "changed" in info and "|a-b| 0.5" in info and "outside tolerance" in info
        hist = static_text(screen, "#dd-hist")
        assert "histogram of a - b" in hist and "-0.5" in hist
        await pilot.press("c")
        assert table.row_count == 19
        # browse side B from the diff, and come back
        await pilot.press("b")
        await settle(pilot)
        assert isinstance(app.screen, BrowseScreen) and "head.weight" in table_names(app.screen)
        await pilot.press("escape")
        assert isinstance(app.screen, DiffScreen)


@run_async
async def test_garbage_shows_error_screen():
    app = make_app(GARBAGE)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        text = static_text(app.screen, "#error-message")
        assert "cannot open garbage.bin" in text
        assert "not a model file this tool recognises" in text
        assert str(FIX) not in text  # basenames only
        assert app.load_error and "\n" not in app.load_error


@run_async
async def test_missing_file_shows_error_screen(tmp_path):
    app = make_app(tmp_path / "nope.pt")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, ErrorScreen)
        assert "nope.pt: no such file or directory" in static_text(app.screen, "#error-message")


@run_async
async def test_malicious_file_banner_and_scan_screen():
    app = make_app(MALICIOUS)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.scan_done and app.scan_error is None, app.scan_error
        banner = app.screen.query_one(SafetyBanner)
        assert banner.display and "UNSAFE TO LOAD" in plain(banner.content)
        await pilot.press("s")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ScanScreen)
        table = screen.query_one("#findings")
        rows = [[str(c) for c in table.get_row_at(r)] for r in range(table.row_count)]
        assert rows and rows[0][0] in ("high", "critical")
        assert any("system" in " ".join(r) for r in rows)
        assert "UNSAFE" in static_text(screen, "#scan-summary")
        await pilot.press("escape")
        assert not isinstance(app.screen, ScanScreen)


@run_async
async def test_clean_file_has_no_banner_and_scan_reachable_everywhere():
    app = make_app(A)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert not app.screen.query_one(SafetyBanner).display
        for key in ("v", "m"):
            await pilot.press(key)
            await pilot.pause()
            await pilot.press("s")
            await pilot.pause()
            assert isinstance(app.screen, ScanScreen)
            await pilot.press("escape", "escape")
            await pilot.pause()
            assert isinstance(app.screen, BrowseScreen)


@run_async
async def test_help_theme_and_palette():
    app = make_app(A)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        keys = dict(app.screen.bindings)
        assert "Filter" in keys.values() and "Scan" in keys.values()
        assert "Diff" not in keys.values()  # one file: nothing to diff
        await pilot.press("escape")
        assert app.current_theme.dark
        await pilot.press("t")
        assert not app.current_theme.dark
        await pilot.press("t")
        assert app.current_theme.dark
        # the command palette finds our commands and runs them
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"file info")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "FileInfoScreen"


def test_file_info_renders_metadata_and_code(tmp_path):
    from tensorscope.tui.screens.fileinfo import op_counts, render_value

    assert op_counts([("a", "Conv", ""), ("b", "Relu", ""), ("c", "Conv", ""),
                      ("d", "Attention", "com.microsoft")]) == \
        {"Conv": 2, "Relu": 1, "com.microsoft.Attention": 1}
    text = plain(render_value({"__metadata__": {"format": "np"}, "list": list(range(300))}))
    assert "format" in text and "np" in text and "100 more" in text


@run_async
async def test_torchscript_code_tab():
    model = tensorscope.open(A)
    model.extras["code"] = {"code/__torch__.py": "def forward(self, x):\n    return x\n"}
    from tensorscope.tui.screens.fileinfo import FileInfoScreen

    app = make_app(A)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        app.push_screen(FileInfoScreen(model))
        await pilot.pause()
        assert "def forward" in plain(app.screen.query_one("#code-text").content)
        option = app.screen.query_one("#code-files").get_option_at_index(0)
        assert option.id == "code/__torch__.py"


def test_cli_command_is_lazy_and_documented():
    code = ("import sys, tensorscope.cli as c; p = c.build_parser(); "
            "c.main(['inspect', '--help']) if False else None; "
            "print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from tensorscope.commands import tui

    assert "Example:" in tui.DESCRIPTION and tui.HELP
    import argparse

    p = argparse.ArgumentParser()
    tui.add_arguments(p)
    args = p.parse_args(["a.pt", "b.pt"])
    assert (args.path, args.other, args.no_scan) == ("a.pt", "b.pt", False)


@pytest.mark.parametrize("names", [
    [f"model.layers.{i}.mlp.experts.{e}.{p}.weight" for i in (0, 1, 12, 130) for e in (0, 7, 63)
     for p in ("gate_proj", "up_proj")] + ["model.embed_tokens.weight", "lm_head.weight"],
    ["features.0.conv2.weight", "features.10.conv2.weight", "layer1.0.conv1.weight",
     "layer1.1.conv1.weight", "layer2.0.downsample.0.weight", "0.bias", "fc.weight", "w"],
])
def test_group_tree_agrees_with_grouping(names):
    """Every tensor sits under the grouped node whose dotted prefix is its parent's
    `grouping.group_key` (`layers.#` merged into one node), with the index values seen."""
    from tensorscope.grouping import group_indices, group_key
    from tensorscope.tui.model_index import build_group_tree

    tensors = [tensorscope.TensorInfo(n, "float32", (2,)) for n in names]
    root = build_group_tree(tensors, "r")
    where = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for i in node.direct:
            where[i] = node
        stack.extend(node.children.values())
    assert sorted(where) == list(range(len(names))) and root.count == len(names)
    for i, name in enumerate(names):
        node = where[i]
        assert ".".join(node.prefix) == group_key(name).rpartition(".")[0], name
        # each `#` node on the way knows the index it stands for
        hashes = [n for n in _ancestors(root, node) if n.name.endswith("#")]
        assert [idx in n.seen for n, idx in zip(hashes, group_indices(name))] == [True] * len(hashes)


def _ancestors(root, node):
    out, cur = [], root
    for comp in node.prefix:
        cur = cur.children[comp]
        out.append(cur)
    return out


# -- issue 15: a new user's first hour --------------------------------------------------------------
sys.path.insert(0, str(ROOT / "fixtures"))
import gen_tui  # noqa: E402  (the generator of the TUI fixtures: review.pt, hostile text)


@pytest.fixture
def review(tmp_path):
    return gen_tui.write_review(tmp_path / "review.pt")


@pytest.fixture
def hostile(tmp_path):
    return gen_tui.write_hostile_text(tmp_path / "hostile_text.safetensors")


@pytest.mark.parametrize("make", ["missing", "empty_dir", "truncated", "garbage"])
def test_cli_checks_the_input_before_the_app_starts(tmp_path, make):
    """A bad path never opens the full-screen app: one line on stderr, exit 2, as `inspect` does."""
    if make == "missing":
        target = tmp_path / "missing.pt"
    elif make == "empty_dir":
        target = tmp_path / "empty"
        target.mkdir()
    elif make == "truncated":
        target = tmp_path / "cut.safetensors"
        target.write_bytes(A.read_bytes()[:300])
    else:
        target = GARBAGE
    tui = subprocess.run([sys.executable, "-m", "tensorscope", "tui", str(target)],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    inspect = subprocess.run([sys.executable, "-m", "tensorscope", "inspect", str(target)],
                             capture_output=True, text=True, timeout=60)
    assert tui.returncode == 2 and tui.stdout == ""
    assert len(tui.stderr.splitlines()) == 1 and "\x1b" not in tui.stderr
    # the same line as every other command: "tensorscope <command>: error: <file>: <reason>"
    assert tui.stderr.startswith("tensorscope tui: error: ")
    assert tui.stderr == inspect.stderr.replace("tensorscope inspect:", "tensorscope tui:", 1)
    assert target.name in tui.stderr


@run_async
async def test_medium_finding_shows_the_cli_verdict(review):
    """The CLI's default threshold (--fail-on medium): `scan` says "review before loading" and
    exits 1 for this file; the TUI shows the same verdict in its banner and scan view."""
    cli = subprocess.run([sys.executable, "-m", "tensorscope", "scan", str(review)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and "review before loading" in cli.stdout
    app = make_app(review)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        banner = app.screen.query_one(SafetyBanner)
        text = plain(banner.content)
        assert banner.display and banner.has_class("-review") and not banner.has_class("-unsafe")
        assert "review before loading" in text and "mypkg.layers.build" in text
        await pilot.press("s")
        await pilot.pause()
        summary = static_text(app.screen, "#scan-summary")
        assert "review before loading" in summary and "worst medium" in summary


@run_async
async def test_values_of_a_4d_tensor_move_along_leading_dimensions(tmp_path):
    from safetensors.numpy import save_file

    arr = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    path = tmp_path / "conv.safetensors"
    save_file({"conv.weight": arr}, str(path))
    app = make_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        await pilot.pause()
        screen = app.screen
        table = screen.query_one("#values")

        def shown_slice():
            return [[float(str(c)) for c in table.get_row_at(r)[1:]] for r in range(table.row_count)]

        assert shown_slice() == arr[0, 0].tolist()
        assert "[0, 0, :, :] of [2, 3, :, :]" in static_text(screen, "#values-status")
        await pilot.press("full_stop")        # next slice: [0, 1]
        assert shown_slice() == arr[0, 1].tolist()
        for _ in range(2):
            await pilot.press("full_stop")    # [0, 2] then carry to [1, 0]
        assert shown_slice() == arr[1, 0].tolist()
        assert "[1, 0, :, :]" in static_text(screen, "#values-status")
        for _ in range(5):
            await pilot.press("full_stop")    # stops at the last slice [1, 2]
        assert shown_slice() == arr[1, 2].tolist()
        await pilot.press("less_than_sign")   # back along axis 0: [0, 2]
        assert shown_slice() == arr[0, 2].tolist()
        await pilot.press("comma")            # previous slice: [0, 1]
        assert shown_slice() == arr[0, 1].tolist()
        # ? lists every key of this screen, the slice keys and q included
        await pilot.press("question_mark")
        await pilot.pause()
        keys = dict(app.screen.bindings)
        for key in ("[", "]", "{", "}", ".", ",", "<", ">"):
            assert key in keys, (key, keys)
        assert any("q" in k.split(", ") for k in keys), keys


def test_step_lead_walks_every_slice():
    shape = (2, 3, 4, 5)
    seen, lead = [], (0, 0)
    while True:
        seen.append(lead)
        nxt = compute.step_lead(lead, shape, 1)
        if nxt == lead:
            break
        lead = nxt
    assert seen == [(i, j) for i in range(2) for j in range(3)]
    assert compute.step_lead((1, 2), shape, -1, axis=0) == (0, 2)
    assert compute.step_lead((0, 2), shape, -1, axis=0) == (0, 2)


@run_async
async def test_narrow_table_keeps_whole_headers():
    """At 80×24 the columns that do not fit yield whole (offset first, then params); the headers
    shown are never cut."""
    app = make_app(A)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        table = app.screen.query_one("#tensors")
        shown = table.visible_columns()
        assert shown[0] == "name" and "bytes" in shown and "offset" not in shown
        header = app.export_screenshot()
        for col in shown:
            assert f">{col}" in header or f" {col} " in header.replace("&#160;", " "), col
    app = make_app(A)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.screen.query_one("#tensors").visible_columns() == list(
            ("name", "dtype", "shape", "params", "bytes", "offset"))


@run_async
async def test_one_tensor_says_tensor(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "one.safetensors"
    save_file({"w": np.ones(3, dtype=np.float32)}, str(path))
    app = make_app(path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert "· 1 tensor ·" in static_text(app.screen, "#titlebar")
        assert "1 tensor" in static_text(app.screen, "#table-status")
        assert "1 tensors" not in app.export_screenshot()


def test_onnx_default_domain_reads_ai_onnx():
    from tensorscope.tui.screens.fileinfo import render_value

    text = plain(render_value({"opset_import": {"": 20, "com.microsoft": 1}}))
    assert "ai.onnx" in text and "20" in text and "(default)" not in text


def _screen_text(app) -> str:
    strips = app.screen._compositor.render_strips()
    return "\n".join("".join(seg.text for seg in s) for s in strips)


@run_async
async def test_hostile_text_is_shown_inert(hostile):
    """Names, metadata keys and values with escape sequences, bidi overrides and Rich markup:
    nothing raw reaches the screen, and markup is shown literally, on every browse screen."""
    from tensorscope.safetext import is_clean, shown

    HOSTILE_METADATA, HOSTILE_NAMES = gen_tui.HOSTILE_METADATA, gen_tui.HOSTILE_NAMES

    model = tensorscope.open(hostile)
    assert sorted(t.name for t in model.tensors) == sorted(HOSTILE_NAMES)  # the file holds them raw
    app = make_app(hostile)
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        screens = {}
        screens["browse"] = (_screen_text(app), app.export_screenshot())
        table = app.screen.query_one("#tensors")
        names_in_table = [table.get_row_at(r)[0] for r in range(table.row_count)]
        for k in range(table.row_count):  # every row through the details pane
            table.move_cursor(row=k)
            await settle(pilot)
            screens[f"row{k}"] = (_screen_text(app), app.export_screenshot())
        await pilot.press("v")
        await settle(pilot)
        screens["values"] = (_screen_text(app), app.export_screenshot())
        await pilot.press("escape", "m")
        await settle(pilot)
        await pilot.press("right")  # the metadata tab
        await settle(pilot)
        screens["metadata"] = (_screen_text(app), app.export_screenshot())
        for name, (text, svg) in screens.items():
            assert is_clean(text) and is_clean(svg), name
        # every name is listed, escaped, with its markup literal
        assert sorted(names_in_table) == sorted(shown(n) for n in HOSTILE_NAMES)
        everything = "\n".join(t for t, _ in screens.values())
        assert "[bold red]evil[/bold red].weight" in everything
        assert "\\x1b]0;pwned\\x07" in everything and "\\u202e" in everything
        meta = screens["metadata"][0]
        for key, value in HOSTILE_METADATA.items():
            assert shown(key) in meta, key
            assert shown(value)[:20] in meta, value


@run_async
async def test_app_uses_the_models_the_cli_opened():
    model = tensorscope.open(A)
    app = make_app(A, models=[model])
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.models == [model] and app.screen.model is model


def test_fit_and_fit_columns():
    from rich.cells import cell_len

    from tensorscope.tui.screens.browse import YIELD_ORDER, table_columns
    from tensorscope.tui.model_index import TensorIndex
    from tensorscope.tui.widgets.tensor_table import fit, fit_columns

    name = "model.layers.3.mlp.experts.7.up_proj.weight"
    for text in (name, "层.权重.weight", "x"):
        for width in (1, 5, 9, 20, 60):
            out = fit(text, width, middle=True)
            assert cell_len(out) == width
            if cell_len(text) > width:
                assert "…" in out
    assert fit(name, 20, middle=True).rstrip().endswith("7.up_proj.weight")  # indices and leaf survive
    columns = table_columns(TensorIndex(tensorscope.open(A).tensors))
    for width, gone in ((120, []), (70, ["offset"]), (55, ["offset", "params"])):
        fitted = fit_columns(columns, width, YIELD_ORDER)
        assert {c.key for c in columns} - {f.key for f, _ in fitted} == set(gone)
        assert sum(w for _, w in fitted) + len(fitted) + 1 <= width
        assert all(w >= len(c.key) + 2 for c, w in fitted)  # whole headers, room for the arrow
