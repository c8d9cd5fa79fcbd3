"""The first day in the TUI (issue 27), through Textual's Pilot at 80×24: names cut keeping the
layer index and the leaf, Esc leaving the diff's layer view, nothing of "opening" left behind."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tensorscope.tui.app import make_app
from tensorscope.tui.screens.diff import DiffScreen
from tensorscope.tui.widgets.tensor_table import fit, shorten_name

from helpers import settle
from test_diff_tui import _pair, screen_text
from test_tui import run_async

safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.mark.parametrize("name, width, expected", [
    ("model.layers.13.mlp.down_proj.weight", 30, "…layers.13…down_proj.weight"),
    ("model.layers.13.mlp.down_proj.weight", 22, "…13…down_proj.weight"),
    ("model.layers.3.mlp.experts.17.up_proj.weight", 30, "…3…experts.17.up_proj.weight"),
    ("transformer.h.11.attn.c_attn.weight", 20, "…h.11…c_attn.weight"),
])
def test_a_cut_name_keeps_its_indices_and_leaf(name, width, expected):
    assert shorten_name(name, width) == expected
    assert fit(name, width, middle=True).rstrip() == expected and len(fit(name, width, middle=True)) == width


@run_async
async def test_rows_of_different_layers_stay_apart_at_80x24(tmp_path):
    sd = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq_projection.weight":
          np.full((2, 2), i, dtype=np.float32) for i in range(12)}
    safetensors_numpy.save_file(sd, str(tmp_path / "m.safetensors"))
    app = make_app(tmp_path / "m.safetensors", scan=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        import re
        found = re.findall(r"…(\d+)…weight", text)
        assert len(found) >= 8, text                 # every visible row says which layer
        assert len(set(found)) == len(found)         # no two rows alike


@run_async
async def test_esc_leaves_the_diffs_layer_view(tmp_path):
    pa, pb = _pair(tmp_path)
    app = make_app(pa, pb)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, DiffScreen)
        await pilot.press("l")
        await settle(pilot)
        assert screen.layers_view
        await pilot.press("escape")
        await settle(pilot)
        assert not screen.layers_view and app.screen is screen
        assert "l or Esc: back" not in screen_text(app)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="needs a pty")
def test_nothing_of_opening_is_left_on_the_terminal(tmp_path):
    """`tensorscope tui` in a real terminal (a pty): open, quit with q; the last thing written is
    not an "opening …" or "reading …" line."""
    import pty
    import select
    import time

    safetensors_numpy.save_file({"w": np.ones(4, dtype=np.float32)}, str(tmp_path / "m.safetensors"))
    pid, fd = pty.fork()
    if pid == 0:   # the child: the CLI as a user runs it
        os.environ.update(TERM="xterm-256color", COLUMNS="80", LINES="24")
        os.execv(sys.executable, [sys.executable, "-m", "tensorscope", "tui", "--no-scan",
                                  str(tmp_path / "m.safetensors")])
    out = b""
    deadline = time.monotonic() + 60
    sent = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if not sent and b"tensorscope" in out and len(out) > 2000:
            time.sleep(1.0)
            os.write(fd, b"q")
            sent = True
    os.waitpid(pid, 0)
    assert sent, out[-2000:]
    text = out.decode("utf-8", "replace")
    before, _, rest = text.partition("\x1b[?1049h")      # the app's own screen starts
    after = rest.rpartition("\x1b[?1049l")[2]             # ... and ends
    assert rest and "opening " not in before and "opening " not in after
    at = before.find("reading ")   # a slow open's notice is wiped before the app draws
    assert at < 0 or "\x1b[2K" in before[at:], before[at:at + 200]


@run_async
async def test_values_grid_shows_the_columns_that_fit_whole(tmp_path):
    from tensorscope.tui.screens.values import ValuesScreen
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((8, 128)) * 1000).astype(np.float32)
    safetensors_numpy.save_file({"w": arr}, str(tmp_path / "m.safetensors"))
    app = make_app(tmp_path / "m.safetensors", scan=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("v")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ValuesScreen)
        table = screen.query_one("#values")
        shown_cols = len(table.columns) - 1
        status = " ".join(screen.query_one("#values-status").content.plain.split())
        assert f"cols 0–{shown_cols - 1} of 128" in status and 1 < shown_cols < 20
        text = screen_text(app)
        first = [str(c) for c in table.get_row_at(0)[1:]]
        row = next(line for line in text.splitlines() if line.lstrip().startswith("0 ") and first[0] in line)
        assert first[-1] in row   # the last column's number is whole on the screen
        await pilot.press("right_curly_bracket")
        await pilot.pause()
        status = " ".join(screen.query_one("#values-status").content.plain.split())
        assert f"cols {shown_cols}–" in status   # the next page starts after the last shown
