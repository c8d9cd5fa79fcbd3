"""Browse one model: module tree, tensor table, details pane with statistics and histogram.

The tree groups tensors by path components and expands lazily (children are added when a node
is first expanded, at most `MAX_CHILDREN` per node); above `GROUP_ABOVE` tensors it opens as the
grouped tree (``layers.#``, `tensorscope.grouping`'s reading of repeated layers), ``g`` switches.
The table shows the tensors under the highlighted module, filtered and sorted by the model's
`TensorIndex`, in a `VirtualTable` that formats only the rows on screen, so a keystroke in the
filter costs one pass over the names at 100,000 tensors and nothing per row shown. Statistics and
the histogram of the highlighted tensor are computed in an exclusive thread worker on the
zero-copy view. Every string from the file is shown through `tensorscope.safetext`.
"""
from __future__ import annotations

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Static, Tree
from textual.worker import get_current_worker

from ..compute import HIST_BINS, Cancelled, histogram, is_raw, stream_values, summary
from ..formatting import basename, compact_bytes, fmt_offset, fmt_shape, human_bytes, human_count, one_line
from ..messages import HistogramReady, StatsFailed, StatsReady
from tensorscope.safetext import shown

from ..model_index import ModuleNode, TensorIndex, build_group_tree, build_tree
from ..widgets.banner import SafetyBanner
from ..widgets.details import TensorDetails
from ..widgets.tensor_table import Column, VirtualTable

__all__ = ["BrowseScreen", "MAX_CHILDREN", "GROUP_ABOVE", "COLUMNS", "YIELD_ORDER"]

MAX_CHILDREN = 500   # tree children shown per node; the rest are reachable by filtering
GROUP_ABOVE = 5_000  # tensors above which the tree opens grouped (layers.#)
BEHIND_ABOVE = 20_000  # tensors above which the tree is built behind the first screen
DEBOUNCE_ABOVE = 300_000  # tensors above which filter keystrokes are coalesced
DEBOUNCE_SECONDS = 0.08
SHARD_REFRESH = 0.25  # seconds at most between a shard's arrival and its rows on screen
DETAILS_AFTER = 0.15  # seconds after the last filter keystroke before the details pane follows
COLUMNS = ("name", "dtype", "shape", "params", "bytes", "offset")
# When the table is narrow, columns give way in this order: the offset (a detail the pane shows
# too), then params (bytes say the size), then the shape; the name and bytes stay.
YIELD_ORDER = ("offset", "params", "shape", "dtype")
SORT_CYCLE = ("#",) + COLUMNS


def node_label(node: ModuleNode, root: bool = False) -> Text:
    label = Text()
    label.append(shown(node.name), style="bold" if root else "")
    if node.seen:
        lo, hi = min(node.seen), max(node.seen)
        span = f"{lo}" if lo == hi else f"{lo}–{hi}"
        label.append(f" ×{len(node.seen):,} ({span})", style="cyan")
    label.append(f" {human_count(node.params)}·{compact_bytes(node.nbytes)}", style="dim")
    return label


def table_columns(index: TensorIndex) -> list[Column]:
    w = index.widths
    return [Column("name", 0, flex=True, min_width=24),
            Column("dtype", w["dtype"]), Column("shape", w["shape"]),
            Column("params", 6, right=True), Column("bytes", 10, right=True),
            Column("offset", w["offset"], right=True)]


class BrowseScreen(Screen):
    """Tree of modules | table of tensors / details of the highlighted one."""

    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("o", "cycle_sort", "Sort"),
        Binding("r", "reverse_sort", "Reverse sort", show=False),
        Binding("g", "toggle_grouped", "Grouped / module tree", show=False),
        Binding("v", "values", "Values"),
        Binding("m", "file_info", "File info"),
        Binding("G", "graph", "Graph"),
        Binding("escape", "back", "Back / clear filter", show=False),
    ]

    def __init__(self, model, *, closable: bool = False, label: str = "", root: ModuleNode | None = None,
                 index: TensorIndex | None = None, grouped: bool | None = None, stream=None):
        super().__init__()
        self.model = model
        # a sharded checkpoint still being read (`tui.streaming.ShardStream`): ``model`` grows
        # shard by shard, then the whole model replaces it (`model_complete`)
        self.stream = stream
        self.closable = closable
        self.label = label or basename(model.path)
        self.grouped = len(model.tensors) > GROUP_ABOVE if grouped is None else grouped
        self._trees: dict[bool, ModuleNode] = {}
        if root is not None:
            self._trees[self.grouped] = root
        # A large model's tree (seconds at 10^6 tensors) is built behind the first screen: the
        # table lists every tensor in saved order meanwhile, under a placeholder root.
        self._pending = root is None and (len(model.tensors) > BEHIND_ABOVE or stream is not None)
        if self._pending:
            self.root = ModuleNode(self.label, (), count=len(model.tensors))
        else:
            self.root = self._tree(self.grouped)
        self.index = index if index is not None else TensorIndex(model.tensors)
        self.node: ModuleNode = self.root
        self.pattern = ""
        self.sort = "#"
        self.reverse = False
        self.rows: list[int] = []
        self.current: str | None = None  # key of the tensor in the details pane
        self._expanded: set[int] = set()
        self._filter_timer = None
        self._details_timer = None
        self._grow_timer = None   # shards that arrived, to be shown (`shard_added`)
        self._wider = False

    def _tree(self, grouped: bool) -> ModuleNode:
        if grouped not in self._trees:
            build = build_group_tree if grouped else build_tree
            self._trees[grouped] = build(self.model.tensors, root_name=self.label)
        return self._trees[grouped]

    # -- layout -----------------------------------------------------------------------------------
    def _title(self) -> Text:
        m = self.model
        n = len(m.tensors)
        title = Text()
        title.append(" tensorscope ", style="bold reverse")
        title.append(f" {shown(self.label)} · {m.format} · {n:,} tensor{'s' if n != 1 else ''}")
        if not self._pending:
            title.append(f" · {human_count(self.root.params)} params · {human_bytes(self.root.nbytes)}")
        return title

    def _root_label(self) -> Text:
        if self.stream is not None:  # the progress indicator while shards arrive
            return Text.assemble((shown(self.label), "bold"),
                                 (f" reading shard {self.stream.done + 1:,} of {self.stream.total:,} …",
                                  "dim italic"))
        if self._pending:  # the progress indicator until the tree arrives
            return Text.assemble((shown(self.label), "bold"),
                                 (f" grouping {len(self.model.tensors):,} tensors …", "dim italic"))
        return node_label(self.root, root=True)

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="titlebar")
        yield SafetyBanner(id="banner")
        yield Input(placeholder="filter by name: substring, or glob like *.weight  (enter: done, esc: clear)",
                    id="filter")
        with Horizontal(id="browse-main"):
            yield Tree(self._root_label(), data=self.root, id="modules")
            with Vertical(id="browse-right"):
                yield VirtualTable(table_columns(self.index), yield_order=YIELD_ORDER, id="tensors")
                yield Static(id="table-status")
                yield TensorDetails(id="details")
        yield Footer()

    def on_mount(self) -> None:
        tree = self.query_one("#modules", Tree)
        tree.show_root = True
        tree.guide_depth = 2
        self._populate(tree.root)
        tree.root.expand()
        self.refresh_table()
        self.query_one("#tensors", VirtualTable).focus()
        if self._pending and self.stream is None:
            self._build_tree(self.grouped)
        if self.stream is not None:   # the first screen is drawn at the latest this much later
            self.set_timer(1.0, self._drawn)

    def _drawn(self) -> None:
        """The first screen is up (its first tensor's statistics shown, or a second passed): a
        streamed model's next shard is read now (`TensorscopeApp.first_screen_drawn`)."""
        drawn = getattr(self.app, "first_screen_drawn", None)
        if drawn is not None:
            drawn()

    # -- a model still being read -----------------------------------------------------------------
    def shard_added(self, wider: bool) -> None:
        """One more shard was appended to the model (and its index): its rows are shown within
        `SHARD_REFRESH` seconds (shards that come faster are shown together: each repaint takes
        the GIL from the reader), the cursor kept on the tensor it was on."""
        self._wider = self._wider or wider
        if self._grow_timer is None:
            self._grow_timer = self.set_timer(SHARD_REFRESH, self._grown)

    def _grown(self) -> None:
        self._grow_timer = None
        if self.stream is None:
            return   # the whole model came meanwhile (`model_complete` drew it)
        self.root.count = len(self.model.tensors)
        if self._wider:
            self._wider = False
            self.query_one("#tensors", VirtualTable).set_columns(table_columns(self.index))
        self.query_one("#titlebar", Static).update(self._title())
        self.query_one("#modules", Tree).root.set_label(self._root_label())
        self._refresh_keeping()

    def model_complete(self, model, index: TensorIndex | None) -> None:
        """The whole model (every shard read and checked) replaces the growing one; ``index``:
        its own table index when its order differs from the rows shown, else None. The tree is
        built next, behind the table."""
        if self._grow_timer is not None:
            self._grow_timer.stop()
            self._grow_timer = None
        previous = None if index is None or self.current is None else \
            self.model.tensors[int(self.current)]
        self.stream = None
        self.model = model
        if index is None:
            self.index.tensors = model.tensors   # the same records in the same order
        else:
            self.index = index
        self.root = ModuleNode(self.label, (), count=len(model.tensors))
        self.node = self.root
        self.grouped = len(model.tensors) > GROUP_ABOVE   # decided on the first shard until now
        if not self.is_mounted:
            return   # on_mount draws the whole model and starts the tree
        table = self.query_one("#tensors", VirtualTable)
        if index is not None or self._wider:
            self._wider = False
            table.set_columns(table_columns(self.index))
        self.query_one("#titlebar", Static).update(self._title())
        tree = self.query_one("#modules", Tree)
        tree.reset(self._root_label(), self.root)
        self._expanded.clear()
        self._refresh_keeping(previous)
        self._build_tree(self.grouped)

    def _refresh_keeping(self, previous=None) -> None:
        """The rows again (a filter or sort over the new ones too), the cursor on the same tensor.
        ``previous``: that tensor's record when the row numbers changed (a new order)."""
        table = self.query_one("#tensors", VirtualTable)
        node = None if self.node is self.root else self.node
        rows = self.index.select(node, self.pattern, self.sort, self.reverse)
        cursor = 0
        want = None if self.current is None else int(self.current)
        if previous is not None:   # its row number in the new order; shown again (stats too)
            want = next((i for i, t in enumerate(self.model.tensors) if t is previous), None)
            self.current = None
        if want is not None and rows:
            row = min(table.cursor_row, len(rows) - 1)
            if rows[row] == want:
                cursor = row   # the usual case: rows were appended after it
            else:
                try:
                    cursor = rows.index(want)
                except ValueError:
                    cursor = 0
        self.rows = rows
        table.update_rows(rows, cursor)
        self._update_status()
        if rows and str(rows[cursor]) != self.current:
            self._show_tensor(rows[cursor])
        elif not rows:
            self.current = None
            self.query_one(TensorDetails).clear("no tensors match" if self.pattern else "no tensors here")

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

    def action_toggle_grouped(self) -> None:
        """Switch between the module tree and the grouped tree (``layers.#``)."""
        grouped = not self.grouped
        if self._pending:
            self.notify("the tree is still being built …", timeout=2)
            return
        if grouped in self._trees:
            self._use_tree(grouped, self._trees[grouped])
        else:  # built off the UI thread: a module tree of a million tensors takes seconds
            self.notify("building the " + ("grouped" if grouped else "module") + " tree …", timeout=2)
            self._build_tree(grouped)

    @work(thread=True, exclusive=True, group="tree")
    def _build_tree(self, grouped: bool) -> None:
        build = build_group_tree if grouped else build_tree
        root = build(self.model.tensors, root_name=self.label)
        self.app.call_from_thread(self._use_tree, grouped, root)

    def _use_tree(self, grouped: bool, root: ModuleNode) -> None:
        first = self._pending  # the tree built behind the first screen: the table stays as it is
        self._pending = False
        self._trees[grouped] = root
        self.grouped, self.root = grouped, root
        self.node = root
        self._expanded.clear()
        tree = self.query_one("#modules", Tree)
        tree.reset(node_label(self.root, root=True), self.root)
        self._populate(tree.root)
        tree.root.expand()
        if first:
            self.query_one("#titlebar", Static).update(self._title())
            self._update_status()
        else:
            self.refresh_table()

    # -- table ------------------------------------------------------------------------------------
    def refresh_table(self, details_after: float | None = None) -> None:
        """Select and show the rows; the details pane follows the first row, ``details_after``
        seconds later when given (while typing a filter the table answers each keystroke and the
        pane, whose layout costs more than the table, catches up once typing pauses)."""
        if self._details_timer is not None:
            self._details_timer.stop()
            self._details_timer = None
        node = None if self.node is self.root else self.node
        self.rows = self.index.select(node, self.pattern, self.sort, self.reverse)
        table = self.query_one("#tensors", VirtualTable)
        table.labels = {col: col + ((" ▼" if self.reverse else " ▲") if col == self.sort else "")
                        for col in COLUMNS}
        table.set_rows(self.rows, self._cells)
        self._update_status()
        if details_after and self.rows:
            self._details_timer = self.set_timer(details_after, self._details_now)
        elif self.rows:
            self._show_tensor(self.rows[0])
        else:
            self.current = None
            self.query_one(TensorDetails).clear("no tensors match" if self.pattern else "no tensors here")

    def _rel_name(self, t) -> str:
        node = self.node
        if node.prefix and not node.seen and not self.grouped:
            dotted = node.dotted + "."
            if t.name.startswith(dotted):
                return t.name[len(dotted):]
            path = tuple(t.path)
            if path[:len(node.prefix)] == node.prefix:
                return ".".join(path[len(node.prefix):])
        return t.name

    def _cells(self, i: int) -> tuple[str, ...]:
        """One row's cells, made only when the row is drawn."""
        t = self.model.tensors[i]
        return (shown(self._rel_name(t)), shown(t.dtype), fmt_shape(t.shape), human_count(t.numel),
                human_bytes(t.nbytes) if t.has_data else "-", fmt_offset(t.byte_offset))

    def _update_status(self) -> None:
        where = shown(self.node.dotted or self.label)
        n = len(self.rows)
        bits = [f"{where}: {n:,} tensor{'s' if n != 1 else ''}"]
        if self.pattern:
            bits.append(f"filter {shown(self.pattern)!r}")
        if self.sort != "#":
            bits.append(f"sort {self.sort} {'▼' if self.reverse else '▲'}")
        if self.stream is not None:
            bits.append(f"reading shard {self.stream.done + 1:,} of {self.stream.total:,} …")
        elif self._pending:
            bits.append("building the module tree …")
        elif self.grouped:
            bits.append("grouped tree (g: by module)")
        # one line, always: no layout pass needed
        self.query_one("#table-status", Static).update(Text(" · ".join(bits), style="dim"), layout=False)

    def _details_now(self) -> None:
        if self._details_timer is not None:
            self._details_timer.stop()
            self._details_timer = None
        table = self.query_one("#tensors", VirtualTable)
        if self.rows:
            self._show_tensor(self.rows[min(table.cursor_row, len(self.rows) - 1)])

    @on(VirtualTable.RowHighlighted, "#tensors")
    def _row_highlight(self, event: VirtualTable.RowHighlighted) -> None:
        if self._details_timer is None:
            self._show_tensor(int(event.key))

    @on(VirtualTable.RowSelected, "#tensors")
    def _row_selected(self, event: VirtualTable.RowSelected) -> None:
        self.action_values()

    @on(VirtualTable.HeaderSelected, "#tensors")
    def _header(self, event: VirtualTable.HeaderSelected) -> None:
        self.sort_by(event.column)

    def sort_by(self, col: str) -> None:
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
            done = summary(arr, lambda: worker.is_cancelled)   # one read: stats (+ histogram)
            stats = done.stats()
            self.post_message(StatsReady(key, stats))
            if stats.min is not None:
                counts = histogram(arr, stats.min, stats.max, HIST_BINS, lambda: worker.is_cancelled,
                                   done=done)
                self.post_message(HistogramReady(key, counts, stats.min, stats.max))
        except Cancelled:
            return
        except Exception as err:  # any failure is shown in the pane, never a traceback
            self.post_message(StatsFailed(key, one_line(err, info.file, self.model.path)))

    def on_stats_ready(self, message: StatsReady) -> None:
        if message.key == self.current:
            self.query_one(TensorDetails).show_stats(message.stats)
            if self.stream is not None:
                self.call_after_refresh(self._drawn)

    def on_stats_failed(self, message: StatsFailed) -> None:
        if message.key == self.current:
            self.query_one(TensorDetails).show_error(message.message)
            if self.stream is not None:
                self.call_after_refresh(self._drawn)

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
            self.refresh_table(details_after=DETAILS_AFTER)
            return
        # Very large models: coalesce a burst of keystrokes into one refresh.
        if self._filter_timer is not None:
            self._filter_timer.stop()
        self._filter_timer = self.set_timer(DEBOUNCE_SECONDS,
                                            lambda: self.refresh_table(details_after=DETAILS_AFTER))

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        if self._filter_timer is not None:  # enter applies a pending filter now
            self._filter_timer.stop()
            self._filter_timer = None
            self.refresh_table()
        self._details_now()
        self.query_one("#tensors", VirtualTable).focus()
        if not event.value:
            self.remove_class("-filtering")

    def action_back(self) -> None:
        flt = self.query_one("#filter", Input)
        if self.has_class("-filtering"):
            self.remove_class("-filtering")
            if flt.value:
                flt.value = ""  # Input.Changed refreshes the table
            self.query_one("#tensors", VirtualTable).focus()
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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "graph":   # only files that store a graph
            return self.model.format in ("onnx", "pt2", "torchscript")
        return True

    def action_graph(self) -> None:
        from .graph import GraphScreen
        self.app.push_screen(GraphScreen(self.model), self.show_parameters)

    def show_parameters(self, pattern: str | None) -> None:
        """Back from the graph screen: the tensor table filtered to a node's parameters."""
        if not pattern:
            return
        self.add_class("-filtering")
        self.query_one("#filter", Input).value = pattern   # Input.Changed refreshes the table

    def action_file_info(self) -> None:
        from .fileinfo import FileInfoScreen
        self.app.push_screen(FileInfoScreen(self.model))
