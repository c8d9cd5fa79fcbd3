"""A window of a tensor's values: at most `WINDOW_ROWS` × `WINDOW_COLS` cells at a time.

ndim > 2 shows the last two axes at a leading index (``[0, 0, :, :]`` first): ``.``/``,`` step to
the next/previous 2-D slice (every leading axis, the last turning fastest), ``>``/``<`` along the
first axis. 1-D tensors are laid out in rows of 10. ``]``/``[`` move the window by rows,
``}``/``{`` by columns. Only the window is read from the zero-copy view, so a 10 GB tensor
previews as fast as a small one.
"""
from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tensorscope.safetext import shown

from ..compute import as_matrix, is_raw, preview_window, step_lead, values_of
from ..formatting import fmt_shape, fmt_value, one_line
from ..widgets.banner import SafetyBanner

__all__ = ["ValuesScreen", "WINDOW_ROWS", "WINDOW_COLS"]

WINDOW_ROWS = 100
WINDOW_COLS = 20


class ValuesScreen(Screen):
    """Value preview of one tensor, window by window."""

    BINDINGS = [
        Binding("right_square_bracket", "rows(1)", "Rows ▶"),
        Binding("left_square_bracket", "rows(-1)", "◀ Rows"),
        Binding("right_curly_bracket", "cols(1)", "Cols ▶"),
        Binding("left_curly_bracket", "cols(-1)", "◀ Cols"),
        Binding("full_stop", "slice(1)", "Next slice", show=False),
        Binding("comma", "slice(-1)", "Previous slice", show=False),
        Binding("greater_than_sign", "slice(1, 0)", "Next along axis 0", show=False),
        Binding("less_than_sign", "slice(-1, 0)", "Previous along axis 0", show=False),
        Binding("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, model, info):
        super().__init__()
        self.model = model
        self.info = info
        self.row0 = 0
        self.col0 = 0
        self.arr = None
        self.error: str | None = None
        self.nrows = self.ncols = 0
        self.view_label = ""
        self.lead: tuple[int, ...] | None = None  # leading indices of the 2-D slice (ndim > 2)
        self.page_cols = WINDOW_COLS  # columns shown (as many as fit); { } step by it

    def compose(self) -> ComposeResult:
        yield Static(id="titlebar")
        yield SafetyBanner(id="banner")
        yield Static(id="values-status")
        yield DataTable(id="values", zebra_stripes=True, cursor_type="cell")
        yield Footer()

    def on_mount(self) -> None:
        info = self.info
        title = Text()
        title.append(" values ", style="bold reverse")
        title.append(f" {shown(info.name)} · {shown(info.dtype)} {fmt_shape(info.shape)}")
        self.query_one("#titlebar", Static).update(title)
        try:
            arr = values_of(self.model, info)  # decoded values for quantized dtypes
            if is_raw(info, arr):
                self.error = f"{info.dtype} values are stored packed/quantized; no element preview"
            else:
                self.arr = arr
                if arr.ndim > 2:
                    self.lead = (0,) * (arr.ndim - 2)
                view, width, self.view_label = as_matrix(arr, self.lead)
                if view.ndim == 1:
                    self.nrows, self.ncols = math.ceil(view.shape[0] / width), width
                else:
                    self.nrows, self.ncols = view.shape
        except Exception as err:
            self.error = one_line(err, info.file, self.model.path)
        self.render_window()
        self.query_one("#values", DataTable).focus()

    def render_window(self) -> None:
        table = self.query_one("#values", DataTable)
        status = self.query_one("#values-status", Static)
        table.clear(columns=True)
        if self.error is not None or self.arr is None:
            status.update(Text(shown(self.error or "no values"), style="yellow"))
            return
        if self.info.numel == 0:
            status.update(Text("empty tensor (0 elements)", style="dim"))
            return
        rows, cols, cells = preview_window(self.arr, self.row0, self.col0, WINDOW_ROWS, WINDOW_COLS,
                                           self.lead)
        texts = [[fmt_value(v) for v in line] for line in cells]
        fit = self._columns_that_fit(rows, cols, texts)
        cols, texts = cols[:fit], [line[:fit] for line in texts]
        self.page_cols = max(1, fit)
        table.add_column("", key="_index")
        for c in cols:
            table.add_column(Text(str(c), justify="right"), key=f"c{c}")
        for r, line in zip(rows, texts):
            table.add_row(Text(str(r), style="dim"),
                          *(Text(v, justify="right") for v in line), key=f"r{r}")
        r_end = self.row0 + len(rows)
        c_end = self.col0 + len(cols)
        keys = "[ ] rows, { } cols"
        view = self.view_label
        if self.lead is not None:
            keys += ", , . slice, < > axis 0"
            view += " of " + str(list(self.arr.shape[:-2])).replace("]", ", :, :]")
        status.update(Text(
            f"view {view} · rows {self.row0}–{r_end - 1} of {self.nrows} · "
            f"cols {self.col0}–{c_end - 1} of {self.ncols}   ({keys})", style="dim"))

    def _columns_that_fit(self, rows: list[int], cols: list[int], texts: list[list[str]]) -> int:
        """How many of ``cols`` fit the screen's width whole (a cell is its widest value or its
        label, plus DataTable's padding of one cell on each side), never fewer than one."""
        width = (self.size.width or self.app.size.width) - 2   # the vertical scrollbar
        used = max((len(str(r)) for r in rows), default=1) + 2
        for k, c in enumerate(cols):
            cell = max([len(str(c))] + [len(line[k]) for line in texts if k < len(line)]) + 2
            used += cell
            if used > width:
                return max(1, k)
        return len(cols)

    def on_resize(self) -> None:
        if self.arr is not None:
            self.render_window()

    def action_slice(self, step: int, axis: int | None = None) -> None:
        """Move to another 2-D slice of a tensor with more than two dimensions."""
        if self.lead is None:
            return
        new = step_lead(self.lead, self.arr.shape, step, axis)
        if new != self.lead:
            self.lead = new
            _, _, self.view_label = as_matrix(self.arr, self.lead)
            self.render_window()

    def action_rows(self, step: int) -> None:
        new = self.row0 + step * WINDOW_ROWS
        if 0 <= new < max(self.nrows, 1):
            self.row0 = new
            self.render_window()

    def action_cols(self, step: int) -> None:
        new = self.col0 + step * self.page_cols
        if 0 <= new < max(self.ncols, 1):
            self.col0 = new
            self.render_window()
