"""Two models side by side: aligned tensors coloured by status, value differences per pair.

`tensorscope.diff` runs in a worker when the screen mounts. For the highlighted pair the pane
shows what changed (dtype, shape, values) and the `ValueDiff` statistics; a second worker
computes a histogram of ``a - b`` in float64, chunk by chunk over the two zero-copy views.
"""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static
from textual.worker import get_current_worker

from ..compute import HIST_BINS, Cancelled, diff_histogram, is_raw, values_of
from ..formatting import basename, fmt_shape, fmt_value, one_line, shorten_paths
from ..messages import DiffFailed, DiffReady, HistogramReady, StatsFailed
from ..widgets.banner import SafetyBanner
from ..widgets.histogram import render_histogram

__all__ = ["DiffScreen", "STATUS_STYLES"]

STATUS_STYLES = {"same": "dim", "changed": "yellow", "added": "green", "removed": "red",
                 "renamed": "cyan"}
VALUE_FIELDS = ("max_abs", "max_rel", "mean_abs", "rms", "cosine", "mismatched", "nan_mismatch",
                "inf_mismatch", "identical_bytes", "numel")


def _side(info) -> str:
    return f"{info.dtype} {fmt_shape(info.shape)}" if info is not None else "—"


def _entry_name(e) -> str:
    if e.status == "renamed" and e.name_a and e.name_b and e.name_a != e.name_b:
        return f"{e.name_a} → {e.name_b}"
    return e.name or e.name_a or e.name_b or "?"


class DiffScreen(Screen):
    """Aligned tensors of two models."""

    BINDINGS = [
        Binding("c", "toggle_changed", "Changed only"),
        Binding("a", "browse(0)", "Browse A"),
        Binding("b", "browse(1)", "Browse B"),
    ]

    def __init__(self, model_a, model_b):
        super().__init__()
        self.model_a = model_a
        self.model_b = model_b
        self.result = None
        self.error: str | None = None
        self.changed_only = False
        self.shown: list = []
        self.current: str | None = None

    def compose(self) -> ComposeResult:
        title = Text()
        title.append(" diff ", style="bold reverse")
        title.append(f" A {basename(self.model_a.path)} ({self.model_a.format}) ↔ "
                     f"B {basename(self.model_b.path)} ({self.model_b.format})")
        yield Static(title, id="titlebar")
        yield SafetyBanner(id="banner")
        yield Static(Text("comparing…", style="dim italic"), id="diff-summary")
        yield DataTable(id="diff-table", cursor_type="row")
        with VerticalScroll(id="diff-details"):
            with Horizontal(id="dd-row"):
                yield Static(id="dd-info")
                yield Static(id="dd-hist")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#diff-table", DataTable)
        for col in ("status", "tensor", "A", "B", "max |a-b|"):
            table.add_column(col, key=col)
        table.focus()
        self.run_diff()

    @work(thread=True, exclusive=True, group="diff")
    def run_diff(self) -> None:
        try:
            import tensorscope
            result = tensorscope.diff(self.model_a, self.model_b, values=True)
        except Exception as err:
            self.post_message(DiffFailed(one_line(err, self.model_a.path, self.model_b.path)))
            return
        self.post_message(DiffReady(result))

    def on_diff_failed(self, message: DiffFailed) -> None:
        self.error = message.message
        self.query_one("#diff-summary", Static).update(Text(f"diff failed: {message.message}",
                                                             style="yellow"))

    def on_diff_ready(self, message: DiffReady) -> None:
        self.result = message.result
        self.fill()

    # -- table ------------------------------------------------------------------------------------
    def fill(self) -> None:
        r = self.result
        counts = dict(getattr(r, "counts", {}) or {})
        summary = Text()
        for status in ("same", "changed", "added", "removed", "renamed"):
            if counts.get(status):
                summary.append(f"{counts[status]} {status}  ", style=STATUS_STYLES[status])
        meta = list(getattr(r, "metadata", []) or [])
        if meta:
            summary.append(f"· metadata: {len(meta)} key{'s' if len(meta) != 1 else ''} differ  ",
                           style="magenta")
        if self.changed_only:
            summary.append("· changed only (c)", style="bold")
        self.query_one("#diff-summary", Static).update(summary)
        self.shown = [e for e in r.entries if not (self.changed_only and e.status == "same")]
        table = self.query_one("#diff-table", DataTable)
        table.clear()
        for i, e in enumerate(self.shown):
            style = STATUS_STYLES.get(e.status, "")
            v = getattr(e, "values", None)
            max_abs = fmt_value(v.max_abs) if v is not None and v.max_abs is not None else ""
            table.add_row(Text(e.status, style=style), Text(_entry_name(e), style=style),
                          Text(_side(e.a), style=style), Text(_side(e.b), style=style),
                          Text(max_abs, style=style, justify="right"), key=str(i))
        self.current = None
        if self.shown:
            table.move_cursor(row=0)
            self.show_entry(0)
        else:
            self.query_one("#dd-info", Static).update(Text("no differences", style="green")
                                                       if self.changed_only else "")
            self.query_one("#dd-hist", Static).update("")

    def action_toggle_changed(self) -> None:
        self.changed_only = not self.changed_only
        if self.result is not None:
            self.fill()

    @on(DataTable.RowHighlighted, "#diff-table")
    def _highlight(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self.show_entry(int(event.row_key.value))

    # -- details ----------------------------------------------------------------------------------
    def show_entry(self, i: int) -> None:
        key = str(i)
        if key == self.current or i >= len(self.shown):
            return
        self.current = key
        e = self.shown[i]
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("tensor", Text(_entry_name(e), style="bold"))
        grid.add_row("status", Text(e.status, style=STATUS_STYLES.get(e.status, "")))
        for side, name, info in (("A", e.name_a, e.a), ("B", e.name_b, e.b)):
            shown = _side(info) if name in (None, e.name) else f"{name}  {_side(info)}"
            grid.add_row(side, shown)
        paths = (self.model_a.path, self.model_b.path)
        for change in getattr(e, "changes", []) or []:
            grid.add_row("change", shorten_paths(str(change), *paths))
        v = getattr(e, "values", None)
        if v is not None:
            for field in VALUE_FIELDS:
                if hasattr(v, field):
                    val = getattr(v, field)
                    grid.add_row(field, fmt_value(val) if isinstance(val, float) else str(val))
        self.query_one("#dd-info", Static).update(grid)
        hist = self.query_one("#dd-hist", Static)
        if e.a is not None and e.b is not None and tuple(e.a.shape) == tuple(e.b.shape) and e.a.numel:
            hist.update(Text("difference histogram: computing…", style="dim italic"))
            self.diff_hist(key, e.a, e.b)
        else:
            hist.update("")

    @work(thread=True, exclusive=True, group="diff-hist")
    def diff_hist(self, key: str, info_a, info_b) -> None:
        worker = get_current_worker()
        try:
            a = values_of(self.model_a, info_a)  # decoded values for quantized dtypes
            b = values_of(self.model_b, info_b)
            if is_raw(info_a, a) or is_raw(info_b, b):
                self.post_message(StatsFailed(key, "values are stored packed/quantized; no histogram"))
                return
            counts, lo, hi = diff_histogram(a, b, HIST_BINS, lambda: worker.is_cancelled)
        except Cancelled:
            return
        except Exception as err:
            self.post_message(StatsFailed(key, one_line(err, self.model_a.path, self.model_b.path)))
            return
        self.post_message(HistogramReady(key, counts, lo, hi))

    def on_histogram_ready(self, message: HistogramReady) -> None:
        if message.key == self.current:
            text = Text("histogram of a - b\n", style="dim")
            text.append_text(render_histogram(message.counts, message.lo, message.hi, style="yellow"))
            self.query_one("#dd-hist", Static).update(text)

    def on_stats_failed(self, message: StatsFailed) -> None:
        if message.key == self.current:
            self.query_one("#dd-hist", Static).update(Text(message.message, style="yellow"))

    # -- browse either side ---------------------------------------------------------------------
    def action_browse(self, side: int) -> None:
        from .browse import BrowseScreen
        model = self.model_a if side == 0 else self.model_b
        self.app.push_screen(BrowseScreen(model, closable=True,
                                          label=f"{'AB'[side]}: {basename(model.path)}"))
