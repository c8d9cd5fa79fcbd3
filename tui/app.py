"""The tensorscope Textual app and the `make_app` factory shared by the CLI and the tests.

Startup: the file(s) are parsed in a thread worker (a loading screen shows meanwhile), then the
browse screen (one path) or the diff screen (two paths) is pushed; a file that fails to parse
gets the error screen with its one-line message (``tensorscope tui`` opens the files before the
app starts, so from the command line a bad file is one line and exit 2 instead). Then a second worker runs the static scan
(`tensorscope.scan`) on every path; its result feeds the safety banner on every screen and
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
from .messages import LoadFailed, ModelsLoaded, ScanFinished

__all__ = ["TensorscopeApp", "make_app"]

FREEZE_ABOVE = 20_000  # tensors above which the parsed model is frozen out of the cyclic GC


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
        # Parsing (unless the caller passed the opened ``models``, as the CLI does) and the tree
        # and name index start now, in a plain thread, so they overlap Textual's own startup
        # (driver, CSS, first compose); the load worker only waits for it.
        self._opened: list = list(models or [])  # already opened by the CLI (input checked first)
        self._open_error: tuple[str, BaseException] | None = None
        self._tree = None
        self._index = None
        self._opener = threading.Thread(target=self._open_all, name="tensorscope-open", daemon=True)
        self._opener.start()

    def _open_all(self) -> None:
        import tensorscope

        from tensorscope.formats import gc_paused

        from .model_index import TensorIndex, build_group_tree, build_tree
        from .screens.browse import BEHIND_ABOVE, GROUP_ABOVE

        given = list(self._opened)
        self._opened.clear()
        for k, p in enumerate(self.paths):
            try:
                # The app owns its process: the collector is paused while the records are made
                # (10^6 of them, walked again by every collection: 9.9 s -> 4.0 s at 1M tensors).
                with gc_paused():
                    model = given[k] if k < len(given) else tensorscope.open(p)
                self._opened.append(model)
                if self.other is None:  # the browse screen's index, built off the UI thread
                    self._index = TensorIndex(model.tensors)
                    # a small model's tree too; a large one's is built behind the first screen
                    if len(model.tensors) <= BEHIND_ABOVE:
                        build = build_group_tree if len(model.tensors) > GROUP_ABOVE else build_tree
                        self._tree = build(model.tensors, root_name=basename(p))
                if len(model.tensors) > FREEZE_ABOVE:
                    # The model lives as long as the app: move its objects out of the cyclic GC's
                    # reach, or every full collection walks them again (seconds at 100k tensors).
                    gc.freeze()
            except BaseException as err:  # reported on the error screen by load_models
                self._open_error = (p, err)
                return

    @property
    def paths(self) -> list[str]:
        return [self.path] + ([self.other] if self.other else [])

    def on_mount(self) -> None:
        from .screens.misc import LoadingScreen

        self.push_screen(LoadingScreen([basename(p) for p in self.paths]))
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
        self._opener.join()
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
            self.switch_screen(BrowseScreen(message.a, root=self._tree, index=self._index))
        # after the new screen has painted
        self.set_timer(0.05, lambda: self.call_after_refresh(self._start_scan))

    def on_load_failed(self, message: LoadFailed) -> None:
        from .screens.misc import ErrorScreen

        self.load_error = message.message
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
