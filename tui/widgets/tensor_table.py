"""A virtual table: only the rows on screen are ever formatted or drawn.

`VirtualTable` holds a list of row keys (indices into the model's tensors, or groups) and a
``cells(key)`` callback; `render_line` asks for the cells of the rows that are visible, so
showing 1,000,000 rows costs what showing 30 does, and a new filter result is one list
assignment. The header stays on the first line. Column widths are fixed per data set (the screen
computes them once from the model), and when the table is narrower than all of them, columns
yield in the order the screen gives (``yield_order``): a header is never cut to a stub.

Text is drawn as plain `Segment`s: nothing in a cell is read as markup, and the screen passes
every string that came from the file through `tensorscope.safetext.shown`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

__all__ = ["Column", "VirtualTable", "fit", "fit_columns"]


@dataclass(frozen=True)
class Column:
    """One column: its key (and header), the widest its values get, alignment."""

    key: str
    width: int
    right: bool = False
    flex: bool = False  # takes the space the others leave (the name)
    min_width: int = 0


def fit(text: str, width: int, right: bool = False, middle: bool = False) -> str:
    """``text`` padded or cut to ``width`` cells; a cut shows ``…`` (in the middle for names,
    whose ends say the most: ``model.layers.3…up_proj.weight``)."""
    if width <= 0:
        return ""
    if not text.isascii():  # wide characters (CJK names) take two cells: measure cells
        if cell_len(text) > width:
            return set_cell_size(text, width - 1) + "…"
        pad = " " * (width - cell_len(text))
        return pad + text if right else text + pad
    if len(text) > width:
        if width == 1:
            return "…"
        if middle and width >= 8:
            short = shorten_name(text, width)
            if short is not None:
                return short.ljust(width)
            head = (width - 1) // 3
            return text[:head] + "…" + text[len(text) - (width - 1 - head):]
        return text[:width - 1] + "…"
    return text.rjust(width) if right else text.ljust(width)


def shorten_name(name: str, width: int) -> str | None:
    """A dotted name cut to ``width`` by leaving out whole components, those that tell rows apart
    last: the layer indices (and their labels) and the leaf stay, so rows of different layers
    never look alike (``…layers.3…down_proj.weight``). None when even that does not fit."""
    parts = name.split(".")
    n = len(parts)
    if n < 3:
        return None
    index = {i for i, p in enumerate(parts) if p.isdigit()}
    labels = {i - 1 for i in index if i - 1 not in index and i > 0}
    # the order components go in: plain middle ones (left first), the first, the labels of
    # indices, the one before the leaf; indices and the leaf never
    middle = [i for i in range(1, n - 2) if i not in index and i not in labels]
    order = middle + ([0] if 0 not in index | labels else []) + sorted(labels) + \
        ([n - 2] if n - 2 not in index else [])
    dropped: set[int] = set()
    for i in order:
        dropped.add(i)
        text = _render(parts, dropped)
        if len(text) <= width:
            return text
    return None


def _render(parts: list[str], dropped: set[int]) -> str:
    out, gap = [], False
    for i, p in enumerate(parts):
        if i in dropped:
            if not gap:
                out.append("…")
            gap = True
            continue
        if out and not gap:
            out.append(".")
        out.append(p)
        gap = False
    return "".join(out)


def fit_columns(columns: Sequence[Column], width: int, yield_order: Sequence[str] = ()
                ) -> list[tuple[Column, int]]:
    """The columns that fit in ``width`` (one space between columns) and their widths: fixed
    columns are never narrower than their header plus the sort arrow (`` ▲``); while the flexible
    column would fall under its minimum, columns are dropped in ``yield_order``."""
    shown = list(columns)
    drop = list(yield_order)
    while True:
        fixed = [c for c in shown if not c.flex]
        used = sum(max(c.width, len(c.key) + 2) for c in fixed) + len(shown) + 1
        flex = [c for c in shown if c.flex]
        room = width - used
        if all(room >= max(c.min_width, len(c.key) + 2) for c in flex) or not drop:
            break
        key = drop.pop(0)
        shown = [c for c in shown if c.key != key]
    out = []
    for c in shown:
        if c.flex:
            out.append((c, max(room, len(c.key) + 2)))
        else:
            out.append((c, max(c.width, len(c.key) + 2)))
    return out


class VirtualTable(ScrollView, can_focus=True):
    """Rows drawn on demand from ``keys``; a row cursor; header clicks sort."""

    DEFAULT_CSS = """
    VirtualTable {
        overflow-x: hidden;
        background: $surface;
        color: $foreground;
        & > .vtable--header { text-style: bold; background: $panel; color: $foreground; }
        & > .vtable--even-row { background: $surface-lighten-1 50%; }
        &:dark > .vtable--even-row { background: $surface-darken-1 40%; }
        & > .vtable--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus {
            background-tint: $foreground 5%;
            & > .vtable--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
    }
    """
    COMPONENT_CLASSES = {"vtable--header", "vtable--even-row", "vtable--cursor"}

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "first", "First row", show=False),
        Binding("end", "last", "Last row", show=False),
        Binding("enter", "select", "Open", show=False),
    ]

    cursor_row: reactive[int] = reactive(0, always_update=True, init=False)

    @dataclass
    class RowHighlighted(Message):
        """The cursor moved to ``key`` (row ``row``)."""

        table: "VirtualTable"
        row: int
        key: object

        @property
        def control(self) -> "VirtualTable":
            return self.table

    @dataclass
    class RowSelected(Message):
        """Enter (or a click on the highlighted row) on ``key``."""

        table: "VirtualTable"
        row: int
        key: object

        @property
        def control(self) -> "VirtualTable":
            return self.table

    @dataclass
    class HeaderSelected(Message):
        """A click on the header of column ``column``."""

        table: "VirtualTable"
        column: str

        @property
        def control(self) -> "VirtualTable":
            return self.table

    def __init__(self, columns: Sequence[Column] = (), *, yield_order: Sequence[str] = (),
                 id: str | None = None, zebra_stripes: bool = True):
        super().__init__(id=id)
        self.columns: list[Column] = list(columns)
        self.yield_order = tuple(yield_order)
        self.labels: dict[str, str] = {}
        self.keys: Sequence = ()
        self.cells: Callable[[object], Sequence[str]] = lambda key: ()
        self.zebra_stripes = zebra_stripes
        self._layout: list[tuple[Column, int]] = []
        self._layout_width = 0

    # -- data -------------------------------------------------------------------------------------
    def set_rows(self, keys: Sequence, cells: Callable[[object], Sequence[str]] | None = None) -> None:
        """Show ``keys`` (any sequence: a list of a million ints is fine) from the first row."""
        self.keys = keys
        if cells is not None:
            self.cells = cells
        self.virtual_size = Size(self._width(), len(keys) + 1)
        self.scroll_to(y=0, animate=False, immediate=True)
        self.cursor_row = 0
        self.refresh()

    def update_rows(self, keys: Sequence, cursor: int = 0) -> None:
        """Show ``keys`` with the cursor on row ``cursor``, the scroll kept where it shows it
        (rows that arrive while the model is still being read)."""
        self.keys = keys
        self.virtual_size = Size(self._width(), len(keys) + 1)
        if cursor != self.cursor_row:
            self.cursor_row = cursor
        self.refresh()

    def set_columns(self, columns: Sequence[Column]) -> None:
        self.columns = list(columns)
        self._layout = []
        self.refresh()

    @property
    def row_count(self) -> int:
        return len(self.keys)

    def visible_columns(self) -> list[str]:
        return [c.key for c, _ in self._fit()]

    def get_row_at(self, row: int) -> tuple[str, ...]:
        """The cells of ``row`` as shown (unpadded), keyed by every column."""
        return tuple(self.cells(self.keys[row]))

    def move_cursor(self, row: int) -> None:
        self.cursor_row = row

    # -- cursor -----------------------------------------------------------------------------------
    def validate_cursor_row(self, row: int) -> int:
        return max(0, min(row, len(self.keys) - 1))

    def watch_cursor_row(self, old: int, row: int) -> None:
        self._scroll_to_cursor()
        self.refresh()
        if self.keys:
            self.post_message(self.RowHighlighted(self, row, self.keys[row]))

    def _scroll_to_cursor(self) -> None:
        body = max(1, self.size.height - 1)
        top = round(self.scroll_offset.y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + body:
            self.scroll_to(y=self.cursor_row - body + 1, animate=False, immediate=True)

    def action_cursor(self, step: int) -> None:
        self.cursor_row += step

    def action_page(self, step: int) -> None:
        self.cursor_row += step * max(1, self.size.height - 2)

    def action_first(self) -> None:
        self.cursor_row = 0

    def action_last(self) -> None:
        self.cursor_row = len(self.keys) - 1

    def action_select(self) -> None:
        if self.keys:
            self.post_message(self.RowSelected(self, self.cursor_row, self.keys[self.cursor_row]))

    def on_click(self, event: events.Click) -> None:
        if event.y == 0:
            x = 0
            for col, width in self._fit():
                if x <= event.x < x + width + 1:
                    self.post_message(self.HeaderSelected(self, col.key))
                    return
                x += width + 1
            return
        row = round(self.scroll_offset.y) + event.y - 1
        if 0 <= row < len(self.keys):
            if row == self.cursor_row and event.chain > 1:
                self.action_select()
            self.cursor_row = row

    # -- drawing ----------------------------------------------------------------------------------
    def on_resize(self, event: events.Resize) -> None:
        self._layout = []
        self.virtual_size = Size(self._width(), len(self.keys) + 1)

    def _width(self) -> int:
        return self.scrollable_content_region.width  # without the scrollbar

    def _fit(self) -> list[tuple[Column, int]]:
        if not self._layout or self._layout_width != self._width():
            self._layout_width = self._width()
            self._layout = fit_columns(self.columns, self._layout_width, self.yield_order)
        return self._layout

    def _line(self, values: Sequence[str], style: Style, header: bool = False) -> Strip:
        parts = [" "]
        for (col, width), value in zip(self._fit(), values):
            parts.append(fit(value, width, right=col.right and not header, middle=col.flex and not header))
            parts.append(" ")
        return Strip([Segment("".join(parts), style)]).adjust_cell_length(self._width(), style)

    def render_line(self, y: int) -> Strip:
        width = self._width()
        base = self.rich_style
        if y == 0:
            style = base + self.get_component_rich_style("vtable--header")
            labels = [self.labels.get(c.key, c.key) for c, _ in self._fit()]
            return self._line(labels, style, header=True)
        row = round(self.scroll_offset.y) + y - 1
        if row >= len(self.keys):
            return Strip.blank(width, base)
        by_key = dict(zip((c.key for c in self.columns), self.cells(self.keys[row])))
        values = [by_key.get(c.key, "") for c, _ in self._fit()]
        if row == self.cursor_row:
            style = base + self.get_component_rich_style("vtable--cursor")
        elif self.zebra_stripes and row % 2:
            style = base + self.get_component_rich_style("vtable--even-row")
        else:
            style = base
        return self._line(values, style)
