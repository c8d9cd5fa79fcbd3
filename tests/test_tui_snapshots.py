"""SVG snapshots of the main TUI screens at 80×24 and 120×40 (pytest-textual-snapshot).

Regenerate with ``pytest tests/test_tui_snapshots.py --snapshot-update`` only after looking at
the report. The screens show basenames only and no timings, so the output is deterministic once
the workers (parse, scan, statistics, diff) have finished.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tensorscope.tui.app import make_app

from helpers import settle as _settle

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "tui"
A = FIX / "model_a.safetensors"
B = FIX / "model_b.safetensors"
SIZES = [(80, 24), (120, 40)]



def _then(*keys: str):
    """run_before: wait for the workers, press keys, wait again."""
    async def run_before(pilot) -> None:
        await _settle(pilot)
        for key in keys:
            await pilot.press(key)
            await _settle(pilot)
    return run_before


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_browse(snap_compare, size):
    assert snap_compare(make_app(A), terminal_size=size, run_before=_then())


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_details(snap_compare, size):
    # layers.0.mlp.up.weight: values 0..511, a flat histogram
    keys = ("slash", *"0.mlp.up.w", "enter")
    assert snap_compare(make_app(A), terminal_size=size, run_before=_then(*keys))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_tree_expanded(snap_compare, size):
    keys = ("shift+tab", "down", "down", "space", "down", "space", "down", "down", "space")
    assert snap_compare(make_app(A), terminal_size=size, run_before=_then(*keys))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_values(snap_compare, size):
    keys = ("slash", *"0.mlp.up.w", "enter", "v")
    assert snap_compare(make_app(A), terminal_size=size, run_before=_then(*keys))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_diff(snap_compare, size):
    assert snap_compare(make_app(A, B), terminal_size=size, run_before=_then("c"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_scan(snap_compare, size):
    assert snap_compare(make_app(FIX / "malicious.pt"), terminal_size=size, run_before=_then("s"))


def test_error(snap_compare):
    assert snap_compare(make_app(FIX / "garbage.bin"), terminal_size=(80, 24), run_before=_then())


def test_review_banner(snap_compare, tmp_path):
    # a medium finding: the CLI's "review before loading" verdict, in the yellow banner
    import sys

    sys.path.insert(0, str(FIX.parent))
    import gen_tui

    path = gen_tui.write_review(tmp_path / "review.pt")
    assert snap_compare(make_app(path), terminal_size=(80, 24), run_before=_then())
