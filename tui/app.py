"""The tensorscope Textual app and the `make_app` factory shared by the CLI and the tests.

Startup: the file(s) are parsed in a thread worker (a loading screen shows meanwhile), then the
browse screen (one path) or the diff screen (two paths) is pushed; a file that fails to parse
gets the error screen with its one-line message (``tensorscope tui`` opens the files before the
app starts, so from the command line a bad file is one line and exit 2 instead). A sharded
checkpoint of more than `STREAM_ABOVE` tensors is shown from its first shard on, the other shards
streaming in behind the first screen (`tui.streaming`); a later shard that fails to parse gets
the error screen. Then a second worker runs the static scan (`tensorscope.scan`) on every path
(a streamed model once it is whole); its result feeds the safety banner on every screen and
the scan screen (``s`` from anywhere). Nothing here reads past the public `tensorscope` API.
"""
from __future__ import annotations

import gc
import os
import threading

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.signal import Signal

from .commands import TensorscopeCommands
from .formatting import basename, one_line
from .messages import LoadFailed, ModelComplete, ModelsLoaded, ScanFinished, ShardLoaded

__all__ = ["TensorscopeApp", "make_app"]

FREEZE_ABOVE = 20_000  # tensors above which the parsed model is frozen out of the cyclic GC
STREAM_ABOVE = 20_000  # tensors (first shard x shards) above which a sharded model streams in
FIRST_SCREEN_WAIT = 3.0  # seconds a streamed model's next shard waits at most for the first screen


class TensorscopeApp(App):
    """Browse, diff and scan model files in the terminal."""

    CSS_PATH = "tensorscope.tcss"
    TITLE = "tensorscope"
    COMMANDS = App.COMMANDS | {TensorscopeCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    BINDINGS = [
        Binding("s", "scan", "Scan"),
        Binding("d", "diff", "Diff", show=False),
        Binding("t", "toggle_theme", "Theme"),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, path: str | os.PathLike, other: str | os.PathLike | None = None,
                 *, scan: bool = True, models: list | None = None):
        super().__init__()
        self.path = os.fspath(path)
        self.other = os.fspath(other) if other is not None else None
        self.models: list = []
        self.load_error: str | None = None
        self.scan_enabled = scan
        self.scan_reports: list = []   # [(path, ScanReport)]
        self.scan_error: str | None = None
        self.scan_done = False
        self.scan_updated: Signal = Signal(self, "scan-updated")
        self._browse = None   # the browse screen (one path)
        # Parsing (unless the caller passed the opened ``models``, as the CLI does for a diff) and
        # the tree and name index start now, in a plain thread, so they overlap Textual's own startup
        # (driver, CSS, first compose); the load worker only waits for it.
        self._opened: list = list(models or [])  # already opened by the CLI (input checked first)
        self._open_error: tuple[str, BaseException] | None = None
        self._tree = None
        self._index = None
        # A sharded checkpoint browsed on its own is shown from its first shard on: the rest
        # streams in behind the first screen (`streaming.ShardStream`). ``_first_ready`` is set
        # once the first screen's model is there (its first shard, or the whole of it, or an error).
        self._stream = None
        self._complete = False   # the model on screen is the whole model
        self._first_ready = threading.Event()
        self._mounted_evt = threading.Event()   # mounted: the opener's messages may be posted
        self._first_drawn = threading.Event()   # the first screen is up, with its statistics
        self._opener = threading.Thread(target=self._open_all, name="tensorscope-open", daemon=True)
        self._opener.start()

    def _open_all(self) -> None:
        try:
            self._open_each()
        finally:
            self._first_ready.set()

    def _open_each(self) -> None:
        import tensorscope

        from tensorscope.formats import gc_paused, open_model_by_shard

        from .messages import LoadFailed, ModelComplete
        from .model_index import TensorIndex, build_group_tree, build_tree
        from .screens.browse import BEHIND_ABOVE, GROUP_ABOVE

        given = list(self._opened)
        self._opened.clear()
        for k, p in enumerate(self.paths):
            try:
                # The app owns its process: the collector is paused while the records are made
                # (10^6 of them, walked again by every collection: 9.9 s -> 4.0 s at 1M tensors).
                with gc_paused():
                    if k < len(given):
                        model = given[k]
                    elif self.other is None:
                        model = open_model_by_shard(p, lambda *a: self._on_shard(p, *a))
                    else:
                        model = tensorscope.open(p)
                stream = self._stream
                if stream is not None:
                    # streamed: the first screen is up; the whole model replaces the growing one
                    index = stream.index_of(model)
                else:
                    self._opened.append(model)
                if self.other is None and stream is None:  # the browse screen's index, off the UI thread
                    self._index = TensorIndex(model.tensors)
                    # a small model's tree too; a large one's is built behind the first screen
                    if len(model.tensors) <= BEHIND_ABOVE:
                        build = build_group_tree if len(model.tensors) > GROUP_ABOVE else build_tree
                        self._tree = build(model.tensors, root_name=basename(p))
                if len(model.tensors) > FREEZE_ABOVE:
                    # The model lives as long as the app: move its objects out of the cyclic GC's
                    # reach, or every full collection walks them again (seconds at 100k tensors).
                    gc.freeze()
                if stream is not None:
                    self._post(ModelComplete(model, index))
            except BaseException as err:  # reported on the error screen by load_models
                self._open_error = (p, err)
                if self._stream is not None:  # the first screen is up: it gives way to the error
                    self._post(LoadFailed(p, one_line(err, *self.paths)))
                return

    def _on_shard(self, path: str, name: str, shard, k: int, total: int) -> None:
        """Each shard of the browsed model as soon as it is parsed (the opener thread)."""
        from .messages import ShardLoaded
        from .streaming import ShardStream

        if self._stream is None:
            if k != 1 or total < 2 or len(shard.tensors) * total <= STREAM_ABOVE:
                return   # one shard, or a small model: shown whole, its tree with it
            stream = ShardStream(path, total)
            stream.first(shard)
            self._stream = stream
            self._opened.append(stream.model)
            self._index = stream.index
            self._first_ready.set()   # the first screen can be drawn now
            # ... and is, before the next shard is read: both would share one GIL (on a busy
            # machine the first screen then came no sooner than the whole model)
            self._first_drawn.wait(FIRST_SCREEN_WAIT)
            return
        self._post(ShardLoaded(shard, self._stream.parsed(shard), k, total))

    def _post(self, message) -> None:
        # from the opener thread, which may run ahead of the app (the CLI starts it first)
        self._mounted_evt.wait()
        self.post_message(message)

    def first_screen_drawn(self) -> None:
        """The browse screen is drawn with its first tensor's statistics: the next shard may be read."""
        self._first_drawn.set()

    def wait_opened(self) -> None:
        """Block until the first screen's model is there; raise the error if opening failed
        (the CLI checks its input this way before the full-screen app starts)."""
        self._first_ready.wait()
        if self._open_error is not None:
            err = self._open_error[1]
            for m in self._opened:
                m.close()
            raise err

    @property
    def paths(self) -> list[str]:
        return [self.path] + ([self.other] if self.other else [])

    def on_mount(self) -> None:
        from .screens.misc import LoadingScreen

        self.push_screen(LoadingScreen([basename(p) for p in self.paths]))
        self._mounted_evt.set()
        self.load_models()
        if not self.scan_enabled:
            self.scan_done, self.scan_error = True, "disabled"

    def _start_scan(self) -> None:
        # The scan starts once parsing is over: run together they would share one GIL and
        # both finish later; this way the first screen comes first and the banner follows.
        if self.scan_enabled and not self.scan_done:
            self.run_scan()

    # -- workers ----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load")
    def load_models(self) -> None:
        self._first_ready.wait()
        if self._open_error is not None:
            path, err = self._open_error
            for m in self._opened:
                m.close()
            self.post_message(LoadFailed(path, one_line(err, *self.paths)))
            return
        self.post_message(ModelsLoaded(*self._opened))

    @work(thread=True, exclusive=True, group="scan")
    def run_scan(self) -> None:
        import tensorscope

        reports = []
        try:
            from tensorscope.scanning import scan_opened
            # the models already parsed for browsing are scanned without a second parse
            opened = dict(zip(self.paths, self._opened))
            for p in self.paths:
                m = opened.get(p)
                reports.append((p, scan_opened(p, m) if m is not None else tensorscope.scan(p)))
        except ImportError as err:
            self.post_message(ScanFinished([], f"scanner not available ({err})"))
            return
        except BaseException as err:
            self.post_message(ScanFinished(reports, one_line(err, *self.paths)))
            return
        self.post_message(ScanFinished(reports))

    # -- results ----------------------------------------------------------------------------------
    def on_models_loaded(self, message: ModelsLoaded) -> None:
        from .screens.browse import BrowseScreen
        from .screens.diff import DiffScreen

        self.models = [m for m in (message.a, message.b) if m is not None]
        if message.b is not None:
            self.switch_screen(DiffScreen(message.a, message.b))
        else:
            stream = self._stream if not self._complete else None
            self._browse = BrowseScreen(message.a, root=self._tree, index=self._index, stream=stream)
            self.switch_screen(self._browse)
        if self._stream is None:   # a streamed model is scanned once it is whole
            # after the new screen has painted
            self.set_timer(0.05, lambda: self.call_after_refresh(self._start_scan))

    def on_shard_loaded(self, message: ShardLoaded) -> None:
        if self._complete:
            return
        self._stream.total = message.total   # the index's count (the first shard's name gave one)
        wider = self._stream.add(message.shard, message.chunk)
        screen = self._browse
        if screen is not None and screen.is_mounted:
            screen.shard_added(wider)

    def on_model_complete(self, message: ModelComplete) -> None:
        self._complete = True
        model = message.model
        self._opened = [model]
        self.models = [model]
        if self._browse is not None:
            self._browse.model_complete(model, message.index)
        self._stream.release()
        self.set_timer(0.05, lambda: self.call_after_refresh(self._start_scan))

    def on_load_failed(self, message: LoadFailed) -> None:
        from .screens.misc import ErrorScreen

        self.load_error = message.message
        if self._stream is not None:
            self._opened = []   # only part of it was read: the scan opens the path itself
        self._start_scan()
        self.switch_screen(ErrorScreen(basename(message.path), message.message))

    def on_scan_finished(self, message: ScanFinished) -> None:
        self.scan_reports = message.reports
        self.scan_error = message.error
        self.scan_done = True
        self.scan_updated.publish(None)

    # -- actions ----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "diff" and not self.other:
            return False  # no second file: no diff to go back to
        return True

    def action_scan(self) -> None:
        from .screens.scan import ScanScreen

        if not isinstance(self.screen, ScanScreen):
            self.push_screen(ScanScreen())

    def action_diff(self) -> None:
        from .screens.diff import DiffScreen

        # Return to the diff screen (the base of the stack when two files are open).
        while len(self.screen_stack) > 2 and not isinstance(self.screen, DiffScreen):
            self.pop_screen()

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_help(self) -> None:
        from .screens.misc import HelpScreen

        if isinstance(self.screen, HelpScreen):
            return
        # Every key active on this screen, one row per action: keys bound to the same action
        # share the row ("q, ^q  Quit"); this screen's keys first, then the app's, then the
        # focused widget's.
        by_action: dict[tuple[str, str], list] = {}
        for key, active in self.screen.active_bindings.items():
            b = active.binding
            if not b.description or not active.enabled:
                continue
            rank = 0 if active.node is self.screen else 1 if active.node is self else 2
            entry = by_action.setdefault((b.action, b.description), [rank, [], b.description])
            shown_key = b.key_display or self.get_key_display(b)
            if shown_key not in entry[1]:
                entry[1].append(shown_key)
            entry[0] = min(entry[0], rank)
        ordered = sorted(by_action.values(), key=lambda e: e[0])
        rows = [(", ".join(keys), desc) for _, keys, desc in ordered]
        self.push_screen(HelpScreen(rows))

    def on_unmount(self) -> None:
        for m in self.models:
            try:
                m.close()
            except Exception:
                pass


def make_app(path: str | os.PathLike, other: str | os.PathLike | None = None, *,
             scan: bool = True, models: list | None = None) -> TensorscopeApp:
    """The app for one file (browse) or two (diff); used by ``tensorscope tui`` and the tests.
    ``models``: the `ModelFile`s of the paths when the caller opened them already."""
    return TensorscopeApp(path, other, scan=scan, models=models)
