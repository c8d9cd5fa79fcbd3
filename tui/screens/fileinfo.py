"""The file's own metadata: summary, format metadata, embedded code, graph overview.

Tabs appear only when the model has that content: ``Code`` for TorchScript (``extras["code"]``,
member -> source, shown read-only with syntax highlighting), ``Graph`` for ONNX
(``extras["nodes"]``: op counts; inputs/outputs/opsets come from ``metadata``).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static, TabbedContent, TabPane
from textual.widgets.option_list import Option

from tensorscope.safetext import shown

from ..formatting import basename, human_bytes, human_count
from ..widgets.banner import SafetyBanner

__all__ = ["FileInfoScreen", "render_value", "op_counts"]

MAX_ITEMS = 200  # list/dict entries shown per level; the rest are counted


def _t(value: Any, style: str = "") -> Text:
    """Text from the file, inert: escapes shown (`safetext.shown`), never read as markup."""
    return Text(shown(value), style=style)


def key_label(key: Any, parent: str = "") -> Text:
    """A metadata key; an ONNX opset's empty domain is the default one, ``ai.onnx`` (the name
    the ONNX spec gives it), shown as such."""
    if key == "":
        return _t("ai.onnx" if parent == "opset_import" else '""')
    return _t(key)


def render_value(value: Any, depth: int = 0, parent: str = "") -> Any:
    """A JSON-like value as nested grids (text from the file inert, long collections truncated)."""
    if isinstance(value, dict):
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(overflow="fold")
        items = list(value.items())
        for k, v in items[:MAX_ITEMS]:
            grid.add_row(key_label(k, parent), render_value(v, depth + 1, str(k)))
        if len(items) > MAX_ITEMS:
            grid.add_row("…", Text(f"{len(items) - MAX_ITEMS:,} more", style="dim"))
        if not items:
            grid.add_row(Text("{}", style="dim"), "")
        return grid
    if isinstance(value, (list, tuple)):
        if all(isinstance(x, (int, float, str, bool)) or x is None for x in value) and len(value) <= 16:
            return _t(", ".join(str(x) for x in value) if value else "[]")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(overflow="fold")
        for i, v in enumerate(value[:MAX_ITEMS]):
            grid.add_row(str(i), render_value(v, depth + 1, parent))
        if len(value) > MAX_ITEMS:
            grid.add_row("…", Text(f"{len(value) - MAX_ITEMS:,} more", style="dim"))
        return grid
    return _t(value)


def _short_member(member: str) -> str:
    """``archive/code/__torch__/a/b.py`` -> ``a/b.py``: the archive and code prefixes are noise."""
    for marker in ("/code/__torch__/", "/code/"):
        if marker in member:
            return member.split(marker, 1)[1]
    return member


def _node_fields(node: Any) -> tuple[str, str, str]:
    """``(name, op_type, domain)`` of an ONNX node: the parser's tuples, or dicts/objects."""
    if isinstance(node, (tuple, list)):
        parts = [str(x) if x is not None else "" for x in node][:3]
        return tuple(parts + [""] * (3 - len(parts)))  # type: ignore[return-value]
    get = node.get if isinstance(node, dict) else lambda k: getattr(node, k, None)
    return str(get("name") or ""), str(get("op_type") or "?"), str(get("domain") or "")


def op_counts(nodes: Any) -> Counter:
    """Operator counts (``domain.op`` outside the default domain) from an ONNX node list."""
    counts: Counter = Counter()
    for node in nodes or ():
        _, op, domain = _node_fields(node)
        counts[f"{domain}.{op}" if domain and domain != "ai.onnx" else op] += 1
    return counts


class FileInfoScreen(Screen):
    """Summary, metadata, code and graph of the opened file."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, model):
        super().__init__()
        self.model = model
        code = model.extras.get("code") if isinstance(model.extras, dict) else None
        self.code: dict[str, str] = dict(code) if isinstance(code, dict) else {}

    def compose(self) -> ComposeResult:
        m = self.model
        title = Text()
        title.append(" file info ", style="bold reverse")
        title.append(f" {shown(basename(m.path))} · {m.format}")
        yield Static(title, id="titlebar")
        yield SafetyBanner(id="banner")
        with TabbedContent(id="info-tabs"):
            with TabPane("Summary", id="tab-summary"):
                with VerticalScroll():
                    yield Static(self._summary())
            with TabPane("Metadata", id="tab-metadata"):
                with VerticalScroll():
                    yield Static(render_value(self.model.metadata) if self.model.metadata
                                 else Text("(no metadata)", style="dim"))
            if self.code:
                with TabPane("Code", id="tab-code"):
                    with Horizontal():
                        yield OptionList(*(Option(_t(_short_member(m)), id=m) for m in sorted(self.code)),
                                         id="code-files")
                        with VerticalScroll(id="code-view"):
                            yield Static(id="code-text")
            nodes = m.extras.get("nodes") if isinstance(m.extras, dict) else None
            if nodes:
                with TabPane("Graph", id="tab-graph"):
                    with VerticalScroll():
                        yield Static(self._graph(nodes))
        yield Footer()

    def on_mount(self) -> None:
        if self.code:
            self.show_code(sorted(self.code)[0])

    def _summary(self) -> Table:
        s = self.model.summary()
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column()
        grid.add_row("format", _t(s.get("format")))
        grid.add_row("file", _t(basename(self.model.path)))
        files = s.get("files") or []
        if len(files) > 1:
            grid.add_row("files", _t(", ".join(basename(f) for f in files)))
        grid.add_row("tensors", f"{s.get('tensors', 0):,}")
        grid.add_row("params", f"{s.get('params', 0):,} ({human_count(s.get('params', 0))})")
        grid.add_row("bytes", f"{s.get('bytes', 0):,} ({human_bytes(s.get('bytes', 0))})")
        by = Table(box=None, padding=(0, 1), show_edge=False)
        for col in ("dtype", "tensors", "params", "bytes"):
            by.add_column(col, justify="left" if col == "dtype" else "right")
        for dt, d in sorted((s.get("by_dtype") or {}).items()):
            by.add_row(_t(dt), f"{d['tensors']:,}", human_count(d["params"]), human_bytes(d["bytes"]))
        grid.add_row("by dtype", by)
        if self.code:
            grid.add_row("code files", f"{len(self.code)}")
        from tensorscope.architecture import describe, summarize
        for line in describe(summarize(self.model)):   # the architecture summary, as inspect's
            key, _, rest = line.partition(" ")
            grid.add_row(key if key != "model" else "architecture", Text(rest))
        return grid

    def _graph(self, nodes) -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(overflow="fold")
        meta = self.model.metadata
        for key in ("graph_name", "ir_version", "producer_name", "opset_import", "inputs", "outputs"):
            if key in meta:
                grid.add_row(key, render_value(meta[key], parent=key))
        counts = op_counts(nodes)
        grid.add_row("nodes", f"{sum(counts.values()):,}")
        ops = Table(box=None, padding=(0, 1), show_edge=False)
        ops.add_column("op")
        ops.add_column("count", justify="right")
        for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            ops.add_row(_t(op), str(n))
        grid.add_row("ops", ops)
        listing = Table(box=None, padding=(0, 1), show_edge=False)
        for col in ("#", "name", "op", "domain"):
            listing.add_column(col, justify="right" if col == "#" else "left")
        for i, node in enumerate(list(nodes)[:MAX_ITEMS]):
            listing.add_row(str(i), *(_t(f) for f in _node_fields(node)))
        if len(nodes) > MAX_ITEMS:
            listing.add_row("…", f"{len(nodes) - MAX_ITEMS:,} more", "", "")
        grid.add_row("node list", listing)
        return grid

    def show_code(self, member: str) -> None:
        # Code from the file: escapes shown line by line (newlines kept, tabs expanded first).
        text = "\n".join(shown(line) for line in self.code.get(member, "").expandtabs(4).split("\n"))
        self.query_one("#code-text", Static).update(
            Syntax(text, "python", line_numbers=True, word_wrap=False, theme="ansi_dark",
                   background_color="default"))

    @on(OptionList.OptionHighlighted, "#code-files")
    def _code_pick(self, event: OptionList.OptionHighlighted) -> None:
        self.show_code(str(event.option.id))
