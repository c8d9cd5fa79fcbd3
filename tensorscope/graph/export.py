"""Pictures of a graph as text: Graphviz DOT and Mermaid flowcharts.

A node is one box (op, output shapes, params and FLOPs); an edge goes from the node that
produces a value to each node that reads it; graph inputs are ellipses. Subgraphs and functions
are clusters. Names from the file are hostile text: `tensorscope.safetext.shown` makes control
and bidi characters visible, then each language's own quoting is applied (DOT: ``\\"`` and
``\\\\`` in a quoted string; Mermaid: ``#quot;``-style entity codes for every character its
parser would read as syntax), so a name can neither end a label nor inject a statement.
"""
from __future__ import annotations

from typing import Iterator

from ..units import human_count
from ..safetext import shown
from .model import GraphModel, Node

__all__ = ["to_dot", "to_mermaid", "node_label"]


def _shape(shape) -> str:
    if shape is None:
        return "?"
    # a symbolic dimension (ONNX dim_param, a .pt2 symbol) is text from the file
    return "[" + ",".join("?" if d is None else (str(d) if isinstance(d, int) else shown(d))
                          for d in shape) + "]"


def node_label(n: Node) -> list[str]:
    lines = [n.op]
    if n.name and n.name != n.op:
        lines.append(n.name)
    outs = " ".join(_shape(v.shape) for v in n.outputs)
    if outs:
        lines.append(outs)
    extra = []
    if n.params:
        extra.append(f"params {human_count(n.params)}")
    if n.flops:
        extra.append(f"FLOPs {human_count(n.flops)}")
    if extra:
        lines.append(", ".join(extra))
    return [shown(x) for x in lines]


def _edges(gm: GraphModel) -> Iterator[tuple[str, str, str]]:
    """(from id, to id, value name) per graph; graph inputs get ids of their own."""
    for gi, g in enumerate(gm.graphs):
        producer: dict[str, str] = {}
        for v in g.inputs:
            producer[v.name] = f"g{gi}_in_{len(producer)}"
        for n in g.nodes:
            me = f"g{gi}_n{n.index}"
            for v in n.inputs:
                src = producer.get(v.name)
                if src is not None:
                    yield src, me, v.name
            for v in n.outputs:
                producer[v.name] = me


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _dot_quote(text: str) -> str:
    return '"' + _dot_escape(text) + '"'


def to_dot(gm: GraphModel) -> Iterator[str]:
    """DOT lines (``dot -Tsvg graph.dot -o graph.svg``)."""
    yield "digraph tensorscope {"
    yield '  rankdir=TB; node [shape=box, fontname="Helvetica", fontsize=10];'
    for gi, g in enumerate(gm.graphs):
        yield f"  subgraph cluster_{gi} {{"
        yield f"    label={_dot_quote(shown(g.path) + ' (' + g.kind + ')')};"
        for k, v in enumerate(g.inputs):
            label = _dot_escape(shown(v.name)) + "\\n" + _dot_escape(_shape(v.shape))
            yield f'    g{gi}_in_{k} [shape=ellipse, label="{label}"];'
        for n in g.nodes:
            label = "\\n".join(_dot_escape(x) for x in node_label(n))
            yield f'    g{gi}_n{n.index} [label="{label}"];'
        yield "  }"
    for a, b, _ in _edges(gm):
        yield f"  {a} -> {b};"
    yield "}"


# Inside a quoted label Mermaid ends the string at ``"``, reads ``#...;`` as an entity, ``<>&`` as
# HTML and backticks as Markdown: those become entity codes, the rest is plain text.
_MERMAID_ESCAPES = {'"': "#quot;", "<": "#lt;", ">": "#gt;", "#": "#35;", "&": "#38;",
                    "`": "#96;"}


def _mermaid_text(text: str) -> str:
    return "".join(_MERMAID_ESCAPES.get(c, c) for c in text)


def to_mermaid(gm: GraphModel) -> Iterator[str]:
    """Mermaid lines (paste into a Markdown ```` ```mermaid ```` block, or ``mmdc -i f.mmd``)."""
    yield "flowchart TD"
    for gi, g in enumerate(gm.graphs):
        yield f'  subgraph g{gi} ["{_mermaid_text(shown(g.path) + " (" + g.kind + ")")}"]'
        for k, v in enumerate(g.inputs):
            yield f'    g{gi}_in_{k}(["{_mermaid_text(shown(v.name) + " " + _shape(v.shape))}"])'
        for n in g.nodes:
            label = "<br/>".join(_mermaid_text(x) for x in node_label(n))
            yield f'    g{gi}_n{n.index}["{label}"]'
        yield "  end"
    for a, b, _ in _edges(gm):
        yield f"  {a} --> {b}"
