"""A sharded checkpoint's first screen comes after its first shard: the table lists that shard's
tensors (and filters them) while the other shards are still being read, with a progress
indicator; each later shard joins the table as it is parsed; then the whole model (the one
`tensorscope.open` returns, in its order: an index file's when there is one) replaces the growing
one, the tree is built and the scan runs. The reader of shard 2 is held by the test, so what is on
screen is provably drawn before the model is complete."""
from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

pytest.importorskip("textual")
from safetensors.numpy import save_file  # noqa: E402

import tensorscope  # noqa: E402
from tensorscope.parsers import sharded  # noqa: E402
from tensorscope.tui.app import make_app  # noqa: E402
from tensorscope.tui.screens.browse import BrowseScreen  # noqa: E402
from tensorscope.tui.screens.misc import ErrorScreen  # noqa: E402
from tensorscope.tui.widgets.tensor_table import VirtualTable  # noqa: E402

from tensorscope.tui import app as tui_app  # noqa: E402

SHARDS, PER = 3, 7_000
assert SHARDS * PER > tui_app.STREAM_ABOVE   # large enough to stream (a small model is shown whole)


def _write(folder, index: bool):
    folder.mkdir()
    names = [f"model.layers.{k // 64}.mlp.experts.{k % 64}.up_proj.weight" for k in range(SHARDS * PER)]
    weight_map = {}
    for s in range(SHARDS):
        fname = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
        chunk = names[s * PER:(s + 1) * PER]
        # distinct values per tensor: the statistics say which tensor the pane shows
        save_file({n: np.full((2, 2), s * PER + i, dtype=np.float32) for i, n in enumerate(chunk)},
                  str(folder / fname))
        weight_map.update(dict.fromkeys(chunk, fname))
    if index:   # the map in another order than the shards': the model's order is the map's
        ordered = dict(sorted(weight_map.items(), key=lambda kv: kv[0], reverse=True))
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ordered}))
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("stream") / "numbered", index=False)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("stream") / "indexed", index=True)


@pytest.fixture
def hold(monkeypatch):
    """Shard 2's reader in the app's opener thread, held until the test sets the event."""
    release, started = threading.Event(), threading.Event()
    real = sharded._open_shard

    def held(folder, root, name, origin, why):
        if "-00002-of-" in name and threading.current_thread().name == "tensorscope-open":
            started.set()
            assert release.wait(30)
        return real(folder, root, name, origin, why)

    monkeypatch.setattr(sharded, "_open_shard", held)
    yield release, started
    release.set()


async def _wait(pred, pilot, limit=3000):
    for _ in range(limit):
        if pred():
            return True
        await pilot.pause(0.01)
    return False


def _plain(widget) -> str:
    import io

    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return " ".join(console.export_text().split())


def _visible(table, rows=6):
    return "".join(s.text for s in (table.render_line(y) for y in range(1, rows)))


def _first_screen(app):
    screen = app.screen
    if not (isinstance(screen, BrowseScreen) and screen.is_mounted):
        return False
    stats = screen.query_one("#d-stats").content
    return screen.query_one("#tensors", VirtualTable).row_count > 0 and "computing" not in str(stats)


def test_first_screen_before_the_model_is_whole(shards, hold):
    release, started = hold
    whole = tensorscope.open(shards)
    first = tensorscope.open(shards / f"model-00001-of-{SHARDS:05d}.safetensors")

    async def run():
        app = make_app(shards)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await _wait(lambda: _first_screen(app) and started.is_set(), pilot)
            screen = app.screen
            await pilot.pause()
            table = screen.query_one("#tensors", VirtualTable)
            # drawn while shard 2 is held: shard 1's tensors, in its order, with the indicator
            assert not release.is_set()
            assert table.row_count == len(first.tensors) == PER
            assert [screen.model.tensors[i].name for i in table.keys] == first.names
            assert first.tensors[0].name.split(".", 4)[-1] in _visible(table)
            assert "reading shard 2 of 3" in str(screen.query_one("#modules").root.label)
            assert "reading shard 2 of 3" in str(screen.query_one("#table-status").content)
            # the first tensor's statistics (its values are all 0)
            assert "max 0 " in _plain(screen.query_one("#d-stats")) + " "
            assert not app.scan_done   # the scan waits for the whole model
            # the filter works on the part that is there
            screen.pattern = "experts.63."
            screen.refresh_table()
            assert table.row_count == sum("experts.63." in n for n in first.names) > 0
            table.move_cursor(3)
            await pilot.pause()
            on = screen.model.tensors[table.keys[3]].name
            release.set()
            assert await _wait(lambda: screen.stream is None and not screen._pending, pilot)
            await pilot.pause()
            # the whole model: every shard, the order and records `tensorscope.open` gives
            assert screen.model.names == whole.names
            assert screen.model.format == "sharded" and screen.model.metadata["shards"]
            expected = [n for n in whole.names if "experts.63." in n]
            assert [screen.model.tensors[i].name for i in table.keys] == expected
            assert screen.model.tensors[table.keys[table.cursor_row]].name == on
            assert "reading" not in str(screen.query_one("#table-status").content)
            tree = screen.query_one("#modules")
            assert [c.data.name for c in tree.root.children] == ["model"]
            assert screen.root.count == SHARDS * PER
            assert app.models == [screen.model]
            assert await _wait(lambda: app.scan_done, pilot)
            assert app.scan_reports and app.scan_reports[0][1] is not None
        return True

    assert asyncio.run(run())


def test_index_order_replaces_the_shards_order(indexed, hold):
    release, started = hold
    whole = tensorscope.open(indexed)
    assert whole.names != sorted(whole.names)   # the map's order, not the shards'

    async def run():
        app = make_app(indexed, scan=False)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await _wait(lambda: _first_screen(app) and started.is_set(), pilot)
            screen = app.screen
            table = screen.query_one("#tensors", VirtualTable)
            # the shards are read in the map's first-mapped order; those before shard 2 are shown
            wm = json.loads((indexed / "model.safetensors.index.json").read_text())["weight_map"]
            order = list(dict.fromkeys(wm.values()))
            before = order[:order.index(f"model-00002-of-{SHARDS:05d}.safetensors")]
            assert before   # the map starts elsewhere: shard 2 is not read first
            shown = [n for f in before for n in tensorscope.open(indexed / f).names]
            assert await _wait(lambda: table.row_count == len(shown), pilot)
            assert [screen.model.tensors[i].name for i in table.keys] == shown
            assert screen.stream is not None
            table.move_cursor(7)
            await pilot.pause()
            on = screen.model.tensors[table.keys[7]]
            release.set()
            assert await _wait(lambda: screen.stream is None and not screen._pending, pilot)
            await pilot.pause()
            assert [screen.model.tensors[i].name for i in table.keys] == whole.names
            # the cursor and the details pane stay on the tensor they were on
            now = screen.model.tensors[table.keys[table.cursor_row]]
            assert now.name == on.name and screen.selected_info().name == on.name
            value = float(np.asarray(whole.read(on.name)).max())
            assert value > 0
            assert await _wait(lambda: f"max {value:g} " in _plain(screen.query_one("#d-stats")) + " ",
                               pilot)
        return True

    assert asyncio.run(run())


@pytest.fixture
def hold_index(monkeypatch):
    """The index read in the app's opener thread, held until the test sets the event."""
    release, started = threading.Event(), threading.Event()
    real = sharded._index_columns

    def held(path):
        if threading.current_thread().name == "tensorscope-open":
            started.set()
            assert release.wait(30)
        return real(path)

    monkeypatch.setattr(sharded, "_index_columns", held)
    yield release, started
    release.set()


def test_first_screen_before_the_index_is_read(indexed, hold_index):
    """With an index (10^6 names: ~90 MB of JSON), the first numbered shard is shown before the
    index is read; the index then decides the model and its order."""
    release, started = hold_index
    whole = tensorscope.open(indexed)
    first = tensorscope.open(indexed / f"model-00001-of-{SHARDS:05d}.safetensors")

    async def run():
        app = make_app(indexed, scan=False)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await _wait(lambda: _first_screen(app) and started.is_set(), pilot)
            screen = app.screen
            table = screen.query_one("#tensors", VirtualTable)
            assert not release.is_set()
            assert [screen.model.tensors[i].name for i in table.keys] == first.names
            assert "reading shard 2 of 3" in str(screen.query_one("#table-status").content)
            release.set()
            assert await _wait(lambda: screen.stream is None and not screen._pending, pilot)
            assert [screen.model.tensors[i].name for i in table.keys] == whole.names
            assert screen.model.metadata["index"] == "model.safetensors.index.json"
        return True

    assert asyncio.run(run())


def test_a_numbered_file_the_index_does_not_name(tmp_path):
    """The shard read before the index is shown, then dropped: the index decides the model."""
    folder = _write(tmp_path / "stale", index=True)
    stale = f"model-00001-of-{SHARDS:05d}.safetensors"
    doc = json.loads((folder / "model.safetensors.index.json").read_text())
    doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if v != stale}
    (folder / "model.safetensors.index.json").write_text(json.dumps(doc))
    whole = tensorscope.open(folder)
    assert stale not in {t.file.rsplit("/", 1)[-1] for t in whole.tensors}
    told = []
    model = tensorscope.formats.open_model_by_shard(folder, lambda n, sh, k, t: told.append((n, k)))
    assert told[0] == (stale, 1) and model.names == whole.names

    async def run():
        app = make_app(folder, scan=False)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await _wait(lambda: _first_screen(app) and app.screen.stream is None
                               and not app.screen._pending, pilot)
            screen = app.screen
            table = screen.query_one("#tensors", VirtualTable)
            assert [screen.model.tensors[i].name for i in table.keys] == whole.names
        return True

    assert asyncio.run(run())


def test_a_later_shard_that_fails_gets_the_error_screen(tmp_path, hold):
    release, started = hold
    folder = _write(tmp_path / "bad", index=False)
    last = folder / f"model-{SHARDS:05d}-of-{SHARDS:05d}.safetensors"
    last.write_bytes(last.read_bytes()[:-7])   # truncated: the parse of shard 3 fails

    async def run():
        app = make_app(folder, scan=False)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await _wait(lambda: _first_screen(app) and started.is_set(), pilot)
            release.set()
            assert await _wait(lambda: isinstance(app.screen, ErrorScreen), pilot)
            assert "truncated" in app.load_error
        return True

    assert asyncio.run(run())


def test_a_small_sharded_model_is_shown_whole(tmp_path, hold):
    release, started = hold
    folder = tmp_path / "small"
    folder.mkdir()
    for s in range(2):
        save_file({f"w{s}.{i}": np.zeros(2, dtype=np.float32) for i in range(10)},
                  str(folder / f"model-{s + 1:05d}-of-00002.safetensors"))

    async def run():
        app = make_app(folder, scan=False)
        async with app.run_test(size=(120, 40)) as pilot:
            assert await _wait(started.is_set, pilot)
            await pilot.pause(0.2)
            assert not isinstance(app.screen, BrowseScreen)   # the first screen waits for shard 2
            release.set()
            assert await _wait(lambda: _first_screen(app), pilot)
            screen = app.screen
            assert screen.stream is None and not screen._pending
            assert screen.model.names == tensorscope.open(folder).names
        return True

    assert asyncio.run(run())


def test_one_file_is_not_streamed(tmp_path):
    path = tmp_path / "one.safetensors"
    save_file({"a": np.zeros(3, dtype=np.float32)}, str(path))
    seen = []
    model = tensorscope.formats.open_model_by_shard(path, lambda *a: seen.append(a))
    assert seen == [] and model.names == ["a"]


def test_open_model_by_shard_tells_each_shard_in_order(shards):
    seen = []
    model = tensorscope.formats.open_model_by_shard(
        shards, lambda name, shard, k, total: seen.append((name, len(shard.tensors), k, total)))
    assert seen == [(f"model-{k:05d}-of-{SHARDS:05d}.safetensors", PER, k, SHARDS)
                    for k in range(1, SHARDS + 1)]
    assert model.names == tensorscope.open(shards).names
