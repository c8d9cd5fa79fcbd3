"""The TUI diff screen through Textual's Pilot: ranked by relative change, a reason on every row,
the layers view with its bars, the histogram kept at 80×24, cosine explained, names escaped."""
from __future__ import annotations

import html
import re

import numpy as np

from tensorscope import safetext
from tensorscope.diffing import group_changes
from tensorscope.tui.app import make_app
from tensorscope.tui.screens.diff import DiffScreen, bar

from helpers import settle
from test_diff_where import _evil_pair, _llama
from test_tui import A, B, run_async, static_text


def screen_text(app) -> str:
    """What the terminal shows, as text (the screenshot's SVG, tags dropped)."""
    svg = app.export_screenshot()
    rows: dict[str, list[tuple[float, str]]] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg):
        rows.setdefault(m.group(2), []).append((float(m.group(1)), html.unescape(m.group(3))))
    return "\n".join("".join(t for _, t in sorted(r)) for _, r in
                     sorted(rows.items(), key=lambda kv: float(kv[0]))).replace("\xa0", " ")


def cells(screen, col: int) -> list[str]:
    table = screen.query_one("#diff-table")
    return [str(table.get_row_at(r)[col]) for r in range(table.row_count)]


def _pair(tmp_path):
    from safetensors.numpy import save_file
    a, b = _llama(np.random.default_rng(7))
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors"


@run_async
async def test_ranked_by_relative_change_with_layers_bars(tmp_path):
    pa, pb = _pair(tmp_path)
    app = make_app(pa, pb)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, DiffScreen)
        rel = [float(x) if x not in ("—", "0") else 0.0 for x in cells(screen, 2)]
        changed = [r for r, s in zip(rel, cells(screen, 0)) if s == "changed"]
        assert changed == sorted(changed, reverse=True) and changed[0] > 0.1
        assert all(".1." in n for n in cells(screen, 1)[:4])  # layer 1 changed most
        assert "most changed: model.layers.1" in static_text(screen, "#diff-summary")
        await pilot.press("l")
        await settle(pilot)
        groups = group_changes(screen.result.entries, "layer")
        assert cells(screen, 0) == [g.key for g in groups]
        top = groups[0].rel_change
        assert cells(screen, 4) == [bar(g.rel_change / top) if g.rel_change else ""
                                    for g in groups]
        assert cells(screen, 4)[0] == "█" * 16
        assert "model.layers.1" in screen_text(app)
        await pilot.press("l")
        await settle(pilot)
        assert cells(screen, 1)[0] == screen.shown[0].name


@run_async
async def test_histogram_stays_on_screen_at_80x24():
    app = make_app(A, B)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.screen
        names = cells(screen, 1)
        screen.query_one("#diff-table").move_cursor(row=names.index("layers.1.attn.k_proj.weight"))
        await settle(pilot)
        text = screen_text(app)
        lines = text.splitlines()
        assert "histogram of a - b" in text and "|a-b| 0.5" in text
        assert any(ln.startswith("-0.5") for ln in lines)  # the whole histogram, axis included
        assert "values: 4 of 256 outside tolerance" in text


@run_async
async def test_identical_pair_shows_cosine_one_and_a_reason():
    app = make_app(A, A)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = app.screen
        assert set(cells(screen, 3)) == {"identical"}
        info = static_text(screen, "#dd-info")
        assert "cosine 1" in info and "None" not in info


@run_async
async def test_names_from_the_file_are_escaped(tmp_path):
    pa, pb = _evil_pair(tmp_path)
    app = make_app(pa, pb)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = app.screen
        names = cells(screen, 1)
        assert all(safetext.is_clean(n) for n in names)
        assert any("[bold red]x[/bold red]" in n and "\\x1b" in n for n in names)
        assert safetext.is_clean(static_text(screen, "#dd-info"))
        assert safetext.is_clean(static_text(screen, "#diff-summary"))
