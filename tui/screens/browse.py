"""Browse one model: module tree, tensor table, details pane with statistics and histogram.

The tree groups tensors by path components and expands lazily (children are added when a node
is first expanded, at most `MAX_CHILDREN` per node). The table shows the tensors under the
highlighted module, filtered and sorted, and adds rows a page at a time as the cursor nears the
end, so 100,000 tensors cost one page of widgets. Statistics and the histogram of the
highlighted tensor are computed in an exclusive thread worker on the zero-copy view.
"""
from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static, Tree
from textual.worker import get_current_worker

from ..compute import HIST_BINS, Cancelled, chunked_stats, histogram, is_raw, stream_values
from ..formatting import basename, compact_bytes, fmt_offset, fmt_shape, human_bytes, human_count, one_line
from ..messages import HistogramReady, StatsFailed, StatsReady
from ..model_index import ModuleNode, build_tree, select_rows, tensor_path
from ..widgets.banner import SafetyBanner
from ..widgets.details import TensorDetails

__all__ = ["BrowseScreen", "PAGE_ROWS", "MAX_CHILDREN"]

PAGE_ROWS = 200      # rows added to the table at a time
MAX_CHILDREN = 500   # tree children shown per node; the rest are reachable by filtering
DEBOUNCE_ABOVE = 20_000  # tensors above which filter keystrokes are coalesced
DEBOUNCE_SECONDS = 0.12
COLUMNS = ("name", "dtype", "shape", "params", "bytes", "offset")
SORT_CYCLE = ("#",) + COLUMNS


def node_label(node: ModuleNode, root: bool = False) -> Text:
    label = Text()
    label.append(node.name, style="bold" if root else "")
    label.append(f" {human_count(node.params)}·{compact_bytes(node.nbytes)}", style="dim")
    return label


class BrowseScreen(Screen):
    """Tree of modules | table of tensors / details of the highlighted one."""

    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("o", "cycle_sort", "Sort"),
        Binding("r", "reverse_sort", "Reverse", show=False),
        Binding("v", "values", "Values"),
        Binding("m", "file_info", "File info"),
        Binding("escape", "back", "Back", show=False),
    ]

    def __init__(self, model, *, closable: bool = False, label: str = "", root: ModuleNode | None = None):
        super().__init__()
        self.model = model
        self.closable = closable
        self.label = label or basename(model.path)
        self.root = root if root is not None else build_tree(model.tensors, root_name=self.label)
        self.node: ModuleNode = self.root
        self.pattern = ""
        self.sort = "#"
        self.reverse = False
        self.rows: list[int] = []
        self.loaded = 0
        self.current: str | None = None  # key of the tensor in the details pane
        self._expanded: set[int] = set()
        self._filter_timer = None

    # -- layout -----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        m = self.model
        title = Text()
        title.append(" tensorscope ", style="bold reverse")
        title.append(f" {self.label} · {m.format} · {len(m.tensors):,} tensors · "
                     f"{human_count(self.root.params)} params · {human_bytes(self.root.nbytes)}")
        yield Static(title, id="titlebar")
        yield SafetyBanner(id="banner")
        yield Input(placeholder="filter by name: substring, or glob like *.weight  (enter: done, esc: clear)",
                    id="filter")
        with Horizontal(id="browse-main"):
            yield Tree(node_label(self.root, root=True), data=self.root, id="modules")
            with Vertical(id="browse-right"):
                table = DataTable(id="tensors", cursor_type="row", zebra_stripes=True)
                yield table
                yield Static(id="table-status")
                yield TensorDetails(id="details")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#tensors", DataTable)
        for col in COLUMNS:
            table.add_column(col, key=col)
        tree = self.query_one("#modules", Tree)
        tree.show_root = True
        tree.guide_depth = 2
        self._populate(tree.root)
        tree.root.expand()
        self.refresh_table()
        table.focus()

    # -- tree -------------------------------------------------------------------------------------
    def _populate(self, tnode) -> None:
        node: ModuleNode = tnode.data
        if node is None or id(node) in self._expanded:
            return
        self._expanded.add(id(node))
        children = list(node.children.values())
        for child in children[:MAX_CHILDREN]:
            if child.children:
                tnode.add(node_label(child), data=child)
            else:
                tnode.add_leaf(node_label(child), data=child)
        if len(children) > MAX_CHILDREN:
            tnode.add_leaf(Text(f"… {len(children) - MAX_CHILDREN:,} more (filter with /)", style="dim"))

    @on(Tree.NodeExpanded, "#modules")
    def _expanded_node(self, event: Tree.NodeExpanded) -> None:
        self._populate(event.node)

    @on(Tree.NodeHighlighted, "#modules")
    def _tree_highlight(self, event: Tree.NodeHighlighted) -> None:
        node = event.node.data
        if isinstance(node, ModuleNode) and node is not self.node:
            self.node = node
            self.refresh_table()

    # -- table ------------------------------------------------------------------------------------
    def refresh_table(self) -> None:
        indices = range(len(self.model.tensors)) if self.node is self.root else self.node.tensor_indices()
        self.rows = select_rows(self.model.tensors, indices, self.pattern, self.sort, self.reverse)
        table = self.query_one("#tensors", DataTable)
        table.clear()
        for col in COLUMNS:
            arrow = ""
            if col == self.sort:
                arrow = " ▼" if self.reverse else " ▲"
            table.columns[col].label = Text(col + arrow)
        self.loaded = 0
        self._load_more()
        self._update_status()
        if self.rows:
            table.move_cursor(row=0)
            self._show_tensor(self.rows[0])
        else:
            self.current = None
            self.query_one(TensorDetails).clear("no tensors match" if self.pattern else "no tensors here")

    def _rel_name(self, t) -> str:
        prefix = self.node.prefix
        path = tensor_path(t)
        if prefix and path[:len(prefix)] == prefix:
            return ".".join(path[len(prefix):])
        return t.name

    def _load_more(self) -> None:
        table = self.query_one("#tensors", DataTable)
        tensors = self.model.tensors
        batch = self.rows[self.loaded:self.loaded + PAGE_ROWS]
        for i in batch:
            t = tensors[i]
            table.add_row(Text(self._rel_name(t)), t.dtype, fmt_shape(t.shape),
                          Text(human_count(t.numel), justify="right"),
                          Text(human_bytes(t.nbytes) if t.has_data else "-", justify="right"),
                          Text(fmt_offset(t.byte_offset), justify="right"), key=str(i))
        self.loaded += len(batch)

    def _update_status(self) -> None:
        where = self.node.dotted or self.label
        bits = [f"{where}: {len(self.rows):,} tensor{'s' if len(self.rows) != 1 else ''}"]
        if self.pattern:
            bits.append(f"filter {self.pattern!r}")
        if self.sort != "#":
            bits.append(f"sort {self.sort} {'▼' if self.reverse else '▲'}")
        if self.loaded < len(self.rows):
            bits.append(f"showing {self.loaded:,} (scroll for more)")
        self.query_one("#table-status", Static).update(Text(" · ".join(bits), style="dim"))

    @on(DataTable.RowHighlighted, "#tensors")
    def _row_highlight(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is None or event.row_key.value is None:
            return
        if event.cursor_row >= self.loaded - 20 and self.loaded < len(self.rows):
            self._load_more()
            self._update_status()
        self._show_tensor(int(event.row_key.value))

    @on(DataTable.RowSelected, "#tensors")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_values()

    @on(DataTable.HeaderSelected, "#tensors")
    def _header(self, event: DataTable.HeaderSelected) -> None:
        col = str(event.column_key.value)
        if col == self.sort:
            self.reverse = not self.reverse
        else:
            self.sort, self.reverse = col, False
        self.refresh_table()

    # -- details ----------------------------------------------------------------------------------
    def selected_info(self):
        if self.current is None:
            return None
        return self.model.tensors[int(self.current)]

    def _show_tensor(self, index: int) -> None:
        key = str(index)
        if key == self.current:
            return
        self.current = key
        info = self.model.tensors[index]
        self.query_one(TensorDetails).show(info)
        self.compute_stats(key, info)

    @work(thread=True, exclusive=True, group="stats")
    def compute_stats(self, key: str, info) -> None:
        worker = get_current_worker()
        try:
            arr = stream_values(self.model, info)  # decoded values for quantized dtypes
            if is_raw(info, arr):
                self.post_message(StatsFailed(key, f"no element statistics: {info.dtype} values are "
                                                   "stored packed/quantized (raw bytes)"))
                return
            stats = chunked_stats(arr, lambda: worker.is_cancelled)
            self.post_message(StatsReady(key, stats))
            if stats.min is not None:
                counts = histogram(arr, stats.min, stats.max, HIST_BINS, lambda: worker.is_cancelled)
                self.post_message(HistogramReady(key, counts, stats.min, stats.max))
        except Cancelled:
            return
        except Exception as err:  # any failure is shown in the pane, never a traceback
            self.post_message(StatsFailed(key, one_line(err, info.file, self.model.path)))

    def on_stats_ready(self, message: StatsReady) -> None:
        if message.key == self.current:
            self.query_one(TensorDetails).show_stats(message.stats)

    def on_stats_failed(self, message: StatsFailed) -> None:
        if message.key == self.current:
            self.query_one(TensorDetails).show_error(message.message)

    def on_histogram_ready(self, message: HistogramReady) -> None:
        if message.key == self.current:
            self.query_one(TensorDetails).show_histogram(message.counts, message.lo, message.hi)

    # -- filter -----------------------------------------------------------------------------------
    def action_filter(self) -> None:
        self.add_class("-filtering")
        self.query_one("#filter", Input).focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.pattern = event.value
        if len(self.model.tensors) <= DEBOUNCE_ABOVE:
            self.refresh_table()
            return
        # Large models: coalesce a burst of keystrokes into one refresh.
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._filter_timer = self.set_timer(DEBOUNCE_SECONDS, self.refresh_table)

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.query_one("#tensors", DataTable).focus()
        if not event.value:
            self.remove_class("-filtering")

    def action_back(self) -> None:
        flt = self.query_one("#filter", Input)
        if self.has_class("-filtering"):
            self.remove_class("-filtering")
            if flt.value:
                flt.value = ""  # Input.Changed refreshes the table
            self.query_one("#tensors", DataTable).focus()
        elif self.closable:
            self.dismiss()

    # -- sort -------------------------------------------------------------------------------------
    def action_cycle_sort(self) -> None:
        self.sort = SORT_CYCLE[(SORT_CYCLE.index(self.sort) + 1) % len(SORT_CYCLE)]
        self.reverse = False
        self.refresh_table()

    def action_reverse_sort(self) -> None:
        self.reverse = not self.reverse
        self.refresh_table()

    # -- other screens ----------------------------------------------------------------------------
    def action_values(self) -> None:
        info = self.selected_info()
        if info is not None:
            from .values import ValuesScreen
            self.app.push_screen(ValuesScreen(self.model, info))

    def action_file_info(self) -> None:
        from .fileinfo import FileInfoScreen
        self.app.push_screen(FileInfoScreen(self.model))
