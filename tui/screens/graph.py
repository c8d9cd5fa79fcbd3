"""The graph of one model: every graph (main, subgraphs, functions, methods) as an expandable
tree of its nodes, each with op, output shapes, params and FLOPs; a filter by op or name; Enter
on a node goes back to the tensor table filtered to the parameters that node reads.

The graph is read (`tensorscope.graph.build_graph`) in a thread worker, and each graph's nodes
are added to the tree only when it is expanded, at most `MAX_CHILDREN` at a time, so a
10,000-node model opens at once. Every string from the file is shown through
`tensorscope.safetext`.
"""
from __future__ import annotations

import os
from fnmatch import fnmatchcase

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Static, Tree

from tensorscope.safetext import shown

from ..formatting import basename, human_count
from ..widgets.banner import SafetyBanner

__all__ = ["GraphScreen", "MAX_CHILDREN", "parameter_filter", "node_text"]

MAX_CHILDREN = 2000   # nodes added per graph; the rest are reached by filtering


def _shape(shape) -> str:
    if shape is None:
        return "?"
    # a symbolic dimension (ONNX dim_param, a .pt2 symbol) is text from the file
    return "[" + ",".join("?" if d is None else (str(d) if isinstance(d, int) else shown(d))
                          for d in shape) + "]"


def node_text(n) -> Text:
    t = Text()
    t.append(shown(n.op), style="bold")
    if n.name and n.name != n.op:
        t.append(f" {shown(n.name)}")
    outs = " ".join(_shape(v.shape) for v in n.outputs)
    if outs:
        t.append(f" → {outs}", style="cyan")
    if n.params:
        t.append(f" {human_count(n.params)} params", style="green")
    t.append(f" {human_count(n.flops)} FLOPs" if n.flops is not None else " uncounted", style="dim")
    return t


def parameter_filter(names: list[str]) -> str:
    """The tensor-table filter that shows a node's parameters: the name itself for one, the
    module prefix as a glob (``layers.0.attn.q_proj.*``) when they share one, else the first."""
    if not names:
        return ""
    if len(names) == 1:
        return names[0]
    prefix = os.path.commonprefix(names)
    if "." in prefix:
        return prefix[:prefix.rindex(".") + 1] + "*"
    return names[0]


class GraphScreen(Screen):
    """Graphs | nodes (lazy), filter, Enter: the node's parameters in the tensor table."""

    BINDINGS = [
        Binding("slash", "filter", "Filter"),
        Binding("escape", "back", "Back"),
    ]
    DEFAULT_CSS = """
    GraphScreen #graph-filter { display: none; height: 1; border: none; padding: 0 1; }
    GraphScreen.-filtering #graph-filter { display: block; }
    GraphScreen #graph-tree { height: 1fr; }
    GraphScreen #graph-status { height: 1; }
    """

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.graph = None
        self.error: str | None = None
        self.pattern = ""

    def compose(self) -> ComposeResult:
        title = Text()
        title.append(" graph ", style="bold reverse")
        title.append(f" {shown(basename(self.model.path))} · {self.model.format}")
        yield Static(title, id="titlebar")
        yield SafetyBanner(id="banner")
        yield Input(placeholder="filter nodes by op or name (substring or glob; enter: done)",
                    id="graph-filter")
        yield Tree(Text("reading the graph …"), id="graph-tree")
        yield Static(id="graph-status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#graph-tree", Tree).focus()
        self.load()

    @work(thread=True, exclusive=True, group="graph")
    def load(self) -> None:
        from tensorscope.graph import build_graph
        try:
            g = build_graph(self.model)
        except Exception as err:  # noqa: BLE001 — shown on the screen, never a traceback
            self.app.call_from_thread(self._failed, str(err))
            return
        self.app.call_from_thread(self._loaded, g)

    def _failed(self, message: str) -> None:
        self.error = message
        tree = self.query_one("#graph-tree", Tree)
        tree.reset(Text(shown(message), style="red"))

    def _loaded(self, g) -> None:
        self.graph = g
        self._rebuild()
        t = g.totals()
        self.query_one("#graph-status", Static).update(Text(
            f"{t['nodes']:,} nodes · {human_count(t['params'])} params · {human_count(t['flops'])} "
            f"FLOPs ({human_count(t['flop_counter_flops'])} as FlopCounterMode counts) · shapes: "
            f"{g.shapes_from or 'none'}", style="dim"))

    def _matches(self, n) -> bool:
        p = self.pattern.lower()
        if not p:
            return True
        if any(c in p for c in "*?["):
            return fnmatchcase(n.op.lower(), p) or fnmatchcase(n.name.lower(), p)
        return p in n.op.lower() or p in n.name.lower()

    def _rebuild(self) -> None:
        g = self.graph
        tree = self.query_one("#graph-tree", Tree)
        tree.reset(Text(shown(basename(self.model.path)), style="bold"))
        tree.show_root = True
        for sub in g.graphs:
            nodes = [n for n in sub.nodes if self._matches(n)]
            t = sub.totals(g.numel)
            label = Text()
            label.append(shown(sub.path), style="bold")
            label.append(f" ({sub.kind}) {len(nodes):,} nodes · {human_count(t['params'])} params"
                         f" · {human_count(t['flops'])} FLOPs", style="dim")
            branch = tree.root.add(label, data=("graph", sub.path, nodes))
            if sub is g.main:
                self._populate(branch)
                branch.expand()
        tree.root.expand()

    def _populate(self, tnode) -> None:
        data = tnode.data
        if not (isinstance(data, tuple) and data[0] == "graph") or tnode.children:
            return
        nodes = data[2]
        for n in nodes[:MAX_CHILDREN]:
            tnode.add_leaf(node_text(n), data=("node", n))
        if len(nodes) > MAX_CHILDREN:
            tnode.add_leaf(Text(f"… {len(nodes) - MAX_CHILDREN:,} more (filter with /)", style="dim"))

    @on(Tree.NodeExpanded, "#graph-tree")
    def _expanded(self, event: Tree.NodeExpanded) -> None:
        self._populate(event.node)

    @on(Tree.NodeSelected, "#graph-tree")
    def _selected(self, event: Tree.NodeSelected) -> None:
        data = event.node.data
        if isinstance(data, tuple) and data[0] == "node":
            n = data[1]
            if not n.parameters:
                self.notify("this node reads no parameters", timeout=2)
                return
            self.dismiss(parameter_filter(n.parameters))

    # -- filter -----------------------------------------------------------------------------------
    def action_filter(self) -> None:
        self.add_class("-filtering")
        self.query_one("#graph-filter", Input).focus()

    @on(Input.Submitted, "#graph-filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        self.pattern = event.value
        if self.graph is not None:
            self._rebuild()
        self.query_one("#graph-tree", Tree).focus()

    def action_back(self) -> None:
        if self.has_class("-filtering"):
            self.remove_class("-filtering")
            self.query_one("#graph-tree", Tree).focus()
        else:
            self.dismiss(None)
