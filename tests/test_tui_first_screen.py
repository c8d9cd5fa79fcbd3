"""The first screen comes before the module tree: a large model's table is listed and usable while
the tree (groups) is still being built behind it, with an indicator, then the tree arrives."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

pytest.importorskip("textual")
from safetensors.numpy import save_file  # noqa: E402

from tensorscope.tui.app import make_app  # noqa: E402
from tensorscope.tui.screens import browse  # noqa: E402
from tensorscope.tui.screens.browse import BrowseScreen  # noqa: E402
from tensorscope.tui.widgets.tensor_table import VirtualTable  # noqa: E402

N = browse.BEHIND_ABOVE + 1_000


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    value = np.zeros((2,), dtype=np.float16)
    save_file({f"model.layers.{i // 64}.experts.{i % 64}.weight": value for i in range(N)}, str(path))
    return path


async def _wait(pred, pilot, limit=2000):
    for _ in range(limit):
        if pred():
            return True
        await pilot.pause(0.01)
    return False


def test_first_screen_before_tree(big_model, monkeypatch):
    release, started = threading.Event(), threading.Event()
    real = browse.build_group_tree

    def held(tensors, root_name="model"):  # the tree builder, held until the test lets it go
        started.set()
        assert release.wait(30)
        return real(tensors, root_name=root_name)

    monkeypatch.setattr(browse, "build_group_tree", held)

    async def run():
        app = make_app(big_model, scan=False)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await _wait(lambda: isinstance(app.screen, BrowseScreen) and app.screen.is_mounted
                               and started.is_set(), pilot)
            screen = app.screen
            await pilot.pause()
            table = screen.query_one("#tensors", VirtualTable)
            # drawn and listed while the builder is held
            assert table.row_count == N and not release.is_set()
            assert "grouping" in str(screen.query_one("#modules").root.label)
            assert "building the module tree" in str(screen.query_one("#table-status").content)
            first = screen.model.tensors[0].name
            assert first in "".join(s.text for s in (table.render_line(y) for y in range(5)))
            # the filter works before the tree exists
            screen.pattern = "experts.63."
            screen.refresh_table()
            expected = sum(1 for t in screen.model.tensors if "experts.63." in t.name)
            assert table.row_count == expected > 0
            release.set()
            assert await _wait(lambda: not screen._pending, pilot)
            await pilot.pause()
            tree = screen.query_one("#modules")
            assert "grouping" not in str(tree.root.label)
            assert [c.data.name for c in tree.root.children] == ["model"]
            assert screen.root.count == N
            assert "params" in str(screen.query_one("#titlebar").content)
            # the filter typed meanwhile still holds
            assert table.row_count == expected
        return True

    try:
        assert asyncio.run(run())
    finally:
        release.set()
