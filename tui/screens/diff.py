"""Two models side by side: where they differ, largest relative change first.

`tensorscope.diff` runs in a worker when the screen mounts (with ``norms=True``, so identical
tensors count in the per-layer denominators). The top line is the pair's verdict ("B is A plus a
rank-8 update on self_attn.q_proj and self_attn.v_proj of all 32 layers (0.4% of parameters
changed)", `tensorscope.diff_verdict`). The table lists the pairs ranked by relative change
‖B−A‖/‖A‖ with each tensor's verdict (``low-rank update: rank 8 explains 100.0% of ‖B−A‖²``,
``A rounded to bfloat16 (round-to-nearest-even)``); the pane gives the reason it is listed
(``values: 12 of 4,096 outside tolerance; NaN on a side at 1``); ``l`` switches it to the layers, ranked, each with a bar of its relative change (norms added
as sums of squares, `tensorscope.diffing.group_changes`). For the highlighted pair the pane shows
the `ValueDiff` statistics and, from a second worker, a histogram of ``a - b``.

At 80×24 the pane has about ten lines: the histogram keeps its place and the secondary statistics
(mean, RMS, norms, counts) yield first; wider screens show them all. Every name from a file goes
through `tensorscope.safetext.shown` (Text objects are never parsed as markup).
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

from tensorscope.safetext import shown as safe

from ..compute import HIST_BINS, Cancelled, diff_histogram, is_raw, values_of
from ..formatting import basename, fmt_shape, fmt_value, one_line, shorten_paths
from ..messages import DiffFailed, DiffReady, HistogramReady, StatsFailed
from ..widgets.banner import SafetyBanner
from ..widgets.histogram import render_histogram

__all__ = ["DiffScreen", "STATUS_STYLES"]

STATUS_STYLES = {"same": "dim", "changed": "yellow", "added": "green", "removed": "red",
                 "renamed": "cyan"}
BAR = 16  # cells of the widest bar in the layers view
LARGE = 5000  # above this many pairs the screen opens on the changed ones (c shows all)


def _side(info) -> str:
    return f"{info.dtype} {fmt_shape(info.shape)}" if info is not None else "—"


def _entry_name(e) -> str:
    if e.status == "renamed" and e.name_a and e.name_b and e.name_a != e.name_b:
        return safe(f"{e.name_a} → {e.name_b}")
    return safe(e.name or e.name_a or e.name_b or "?")


def _rel(v) -> str:
    """Relative change for a table cell: "0" for identical, "—" when not compared."""
    if v is None:
        return "—"
    r = v.rel_change
    return "—" if r is None else ("0" if r == 0 else f"{r:.3g}")


def _cosine(v) -> str:
    if v.cosine is not None:
        return fmt_value(v.cosine)
    if v.identical_bytes and v.norm_a is None:
        return "— (identical bytes, not read)"
    if v.norm_a == 0 or v.norm_b == 0:
        return "— (a side is all zeros)"
    return "— (nothing finite to compare)" if v.max_abs is None else "—"


def bar(frac: float, width: int = BAR) -> str:
    """A horizontal bar of ``frac`` (0..1) of ``width`` cells, eighths for the last cell."""
    if not frac or frac != frac or frac <= 0:
        return ""
    eighths = max(1, round(min(frac, 1.0) * width * 8))
    return "█" * (eighths // 8) + ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")[eighths % 8]


class DiffScreen(Screen):
    """Aligned tensors of two models."""

    # the pair's verdict: at most two lines at 80x24, so that the table keeps its rows
    DEFAULT_CSS = """
    #diff-verdict { height: auto; max-height: 2; padding: 0 1; text-style: bold; }
    """

    BINDINGS = [
        Binding("c", "toggle_changed", "Changed only"),
        Binding("l", "toggle_layers", "Layers"),
        Binding("escape", "back", "Back", show=False),
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
        self.layers_view = False
        self.groups: list = []
        self.shown: list = []
        self.current: str | None = None

    def compose(self) -> ComposeResult:
        title = Text()
        title.append(" diff ", style="bold reverse")
        title.append(f" A {safe(basename(self.model_a.path))} ({self.model_a.format}) ↔ "
                     f"B {safe(basename(self.model_b.path))} ({self.model_b.format})")
        yield Static(title, id="titlebar")
        yield SafetyBanner(id="banner")
        yield Static(id="diff-verdict")
        yield Static(Text("comparing…", style="dim italic"), id="diff-summary")
        yield DataTable(id="diff-table", cursor_type="row")
        with VerticalScroll(id="diff-details"):
            with Horizontal(id="dd-row"):
                yield Static(id="dd-info")
                yield Static(id="dd-hist")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#diff-table", DataTable).focus()
        self._columns()
        self.run_diff()

    def _columns(self) -> None:
        table = self.query_one("#diff-table", DataTable)
        table.clear(columns=True)
        cols = (("layer", "tensors", "changed", "rel Δ", "‖B−A‖/‖A‖") if self.layers_view
                else ("status", "tensor", "rel Δ", "verdict"))
        for col in cols:
            table.add_column(col, key=col)

    @work(thread=True, exclusive=True, group="diff")
    def run_diff(self) -> None:
        try:
            import tensorscope
            from tensorscope.diffing import group_changes, ranked
            result = tensorscope.diff(self.model_a, self.model_b, values=True, norms=True)
            result.entries = ranked(result.entries)
            self.groups = group_changes(result.entries, "layer")
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
        if len(self.result.entries) > LARGE:  # 100,000 "same" rows tell nothing: what differs first
            self.changed_only = True
        self.fill()

    # -- table ------------------------------------------------------------------------------------
    def _summary(self) -> Text:
        r = self.result
        counts = dict(getattr(r, "counts", {}) or {})
        summary = Text()
        for status in ("same", "changed", "added", "removed", "renamed"):
            if counts.get(status):
                summary.append(f"{counts[status]:,} {status}  ", style=STATUS_STYLES[status])
        from tensorscope.diffing import PER_SAVE_KEYS
        meta = [m for m in (getattr(r, "metadata", []) or []) if m[0] not in PER_SAVE_KEYS]
        if meta:
            summary.append(f"· metadata: {len(meta)} key{'s' if len(meta) != 1 else ''} differ  ",
                           style="magenta")
        top = next((g for g in self.groups if g.rel_change), None)
        if top is not None:
            summary.append(f"· most changed: {safe(top.key)} ({top.rel_change:.3g})  ", style="bold")
        if self.changed_only:
            summary.append("· changed only (c)", style="bold")
        return summary

    def fill(self) -> None:
        pv = getattr(self.result, "verdict", None)
        self.query_one("#diff-verdict", Static).update(
            Text(safe(pv.text)) if pv is not None and pv.text else "")
        self.query_one("#diff-summary", Static).update(self._summary())
        table = self.query_one("#diff-table", DataTable)
        table.clear()
        self.current = None
        if self.layers_view:
            self._fill_layers(table)
            return
        self.shown = [e for e in self.result.entries
                      if not (self.changed_only and e.status == "same" and not e.changes)]
        from tensorscope.diffing import reason
        for i, e in enumerate(self.shown):
            style = STATUS_STYLES.get(e.status, "")
            why = e.verdict.text if e.verdict is not None else reason(e)
            table.add_row(Text(e.status, style=style), Text(_entry_name(e), style=style),
                          Text(_rel(e.values), style=style, justify="right"),
                          Text(safe(why), style=style), key=str(i))
        if self.shown:
            table.move_cursor(row=0)
            self.show_entry(0)
        else:
            self.query_one("#dd-info", Static).update(Text("no differences", style="green")
                                                       if self.changed_only else "")
            self.query_one("#dd-hist", Static).update("")

    def _fill_layers(self, table: DataTable) -> None:
        groups = [g for g in self.groups if not (self.changed_only and not g.changed)]
        top = max((g.rel_change or 0.0 for g in groups), default=0.0)
        for i, g in enumerate(groups):
            rel = g.rel_change
            style = "yellow" if g.changed else "dim"
            table.add_row(Text(safe(g.key), style=style), Text(f"{g.tensors:,}", justify="right"),
                          Text(f"{g.changed:,}", style=style, justify="right"),
                          Text("—" if rel is None else f"{rel:.3g}", justify="right"),
                          Text(bar(rel / top if rel and top else 0.0), style="yellow"),
                          key=f"g{i}")
        info = Text("relative change per layer: sqrt(Σ‖B−A‖²) / sqrt(Σ‖A‖²) over its tensors;"
                    " l or Esc: back to the tensors", style="dim")
        self.query_one("#dd-info", Static).update(info)
        self.query_one("#dd-hist", Static).update("")

    def action_toggle_changed(self) -> None:
        self.changed_only = not self.changed_only
        if self.result is not None:
            self.fill()

    def action_toggle_layers(self) -> None:
        self.layers_view = not self.layers_view
        self._columns()
        if self.result is not None:
            self.fill()

    def action_back(self) -> None:
        """Esc leaves the layer view (as it leaves every other sub-view)."""
        if self.layers_view:
            self.action_toggle_layers()

    @on(DataTable.RowHighlighted, "#diff-table")
    def _highlight(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key is not None else None
        if key is not None and not self.layers_view and not key.startswith("g"):
            self.show_entry(int(key))

    def on_resize(self) -> None:
        if self.current is not None and not self.layers_view:
            i, self.current = int(self.current), None
            self.show_entry(i)

    # -- details ----------------------------------------------------------------------------------
    def show_entry(self, i: int) -> None:
        key = str(i)
        if key == self.current or i >= len(self.shown):
            return
        self.current = key
        e = self.shown[i]
        from tensorscope.diffing import reason
        narrow = self.size.width < 100
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("tensor", Text(_entry_name(e), style="bold"))
        grid.add_row(Text(e.status, style=STATUS_STYLES.get(e.status, "")),
                     Text(shorten_paths(safe(reason(e)), self.model_a.path, self.model_b.path)))
        sides = []
        for side, name, info in (("A", e.name_a, e.a), ("B", e.name_b, e.b)):
            sides.append(f"{side} {_side(info)}" if name in (None, e.name)
                         else f"{side} {safe(name)} {_side(info)}")
        grid.add_row("sides", "   ".join(sides))
        if e.verdict is not None and not narrow:   # at 80 columns its table cell says it
            grid.add_row("verdict", Text(safe(e.verdict.text) + f"   (rule: {e.verdict.rule})"))
        v = e.values
        if v is not None:
            grid.add_row("rel Δ", f"{_rel(v)}   cosine {_cosine(v)}")
            grid.add_row("max", f"|a-b| {fmt_value(v.max_abs)}   rel {fmt_value(v.max_rel)}"
                         + (f" ({v.zero_ref:,} zeros of B left out)" if v.zero_ref else ""))
            if not narrow:  # these yield first at 80 columns: the histogram keeps its lines
                grid.add_row("mean", f"|a-b| {fmt_value(v.mean_abs)}   rms {fmt_value(v.rms)}")
                grid.add_row("norms", f"‖A‖ {fmt_value(v.norm_a)}   ‖B‖ {fmt_value(v.norm_b)}"
                             f"   ‖B−A‖ {fmt_value(v.norm_diff)}")
                mism = "—" if v.mismatched is None else f"{v.mismatched:,} of {v.numel:,}"
                grid.add_row("outside tol", f"{mism}   NaN {v.nan_mismatch:,}   "
                             f"Inf {v.inf_mismatch:,}")
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
