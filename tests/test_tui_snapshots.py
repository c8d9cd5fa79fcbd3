"""SVG snapshots of the main TUI screens at 80×24 and 120×40 (pytest-textual-snapshot).

Regenerate with ``pytest tests/test_tui_snapshots.py --snapshot-update`` only after looking at
the report. The screens show basenames only and no timings, so the output is deterministic once
the workers (parse, scan, statistics, diff) have finished.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tensorscope.tui.app import make_app

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "tui"
A = FIX / "model_a.safetensors"
B = FIX / "model_b.safetensors"
SIZES = [(80, 24), (120, 40)]


def _busy(app) -> bool:
    """Something is still on its way: parsing, the scan, a worker, a pane saying "computing"."""
    from textual.worker import WorkerState

    screen = app.screen
    if type(screen).__name__ == "LoadingScreen" or not app.scan_done or not screen.is_mounted:
        return True
    if any(w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in app.workers):
        return True
    if type(screen).__name__ == "DiffScreen" and screen.result is None and screen.error is None:
        return True
    for static in screen.query("#d-stats, #dd-hist"):
        if "computing" in str(static.content):
            return True
    return False


async def _settle(pilot) -> None:
    """Wait until parsing, the scan (it starts after the first paint) and every worker are done."""
    import asyncio

    app = pilot.app
    for _ in range(2000):
        await pilot.pause()
        await app.workers.wait_for_complete()
        if not _busy(app):
            break
        await asyncio.sleep(0.01)
    await pilot.pause()


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
