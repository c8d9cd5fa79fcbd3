"""`tensorscope graph PATH`: the computation graph a file stores, node by node."""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import sys
from collections import Counter

from .. import open as open_model
from ..grouping import group_key
from ..render import TextTable, emit_json, human_count, opening, stdout_console
from ._args import positive_rows as _positive
from ..safetext import markup, shown

HELP = "the computation graph (ONNX, torch.export .pt2, TorchScript): ops, shapes, params, FLOPs"
GROUP_ABOVE = 2000
DESCRIPTION = f"""\
Show the graph a model file stores, in topological order: each node's op, inputs -> outputs
(shapes and dtypes where known), the parameters it reads, its parameters and FLOPs (counted as
torch.utils.flop_counter counts them: a multiply-add is 2 FLOPs; element-wise ops 1 per output
element; ops without a formula are listed as uncounted, never guessed), and totals per graph,
per repeated block (layers.#) and for the model. ONNX: the main graph, If/Loop/Scan subgraphs and
model-local functions (shapes from the file, else onnx shape inference on the model rebuilt
without its weights). torch.export .pt2: the serialized graph and its tensor metadata.
TorchScript: each method's ops, read from its code. Nothing in the file is executed.

Above {GROUP_ABOVE:,} nodes the table opens grouped (one row per module pattern and op).

Example:
  tensorscope graph model.onnx
  tensorscope graph model.pt2 --json | jq .totals
  tensorscope graph model.onnx --dot > model.dot && dot -Tsvg model.dot -o model.svg
  tensorscope graph model.onnx --mermaid > model.mmd
"""


def add_arguments(p):
    p.add_argument("path", help="model file (ONNX, .pt2, TorchScript)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="machine-readable output "
                     "(schema tensorscope.graph/1: nodes, totals, graphs, blocks)")
    out.add_argument("--dot", action="store_true", help="Graphviz DOT (render: dot -Tsvg)")
    out.add_argument("--mermaid", action="store_true", help="Mermaid flowchart text")
    p.add_argument("--filter", metavar="GLOB", action="append", default=[],
                   help="only nodes whose op or name matches the glob (repeatable)")
    p.add_argument("--group", action=argparse.BooleanOptionalAction, default=None,
                   help=f"one row per module pattern and op (default above {GROUP_ABOVE:,} nodes)")
    p.add_argument("--no-infer", dest="infer", action="store_false",
                   help="ONNX: shapes from the file only, without onnx shape inference")
    p.add_argument("--limit", type=_positive, default=None, metavar="N", help="show at most N rows")


def _selected(gm, globs):
    nodes = gm.nodes()
    if not globs:
        return list(nodes)
    return [n for n in nodes
            if any(fnmatch.fnmatchcase(n.op, g) or fnmatch.fnmatchcase(n.name, g) for g in globs)]


def run(args) -> int:
    from ..graph import build_graph
    with contextlib.ExitStack() as stack:
        with opening(shown(args.path)):     # listing: no object tree, no call evidence
            model = stack.enter_context(open_model(args.path, listing=True))
            gm = build_graph(model, infer=args.infer)
        nodes = _selected(gm, args.filter)
        if args.json:
            _emit_json(gm.to_header(), nodes)
        elif args.dot or args.mermaid:
            from ..graph.export import to_dot, to_mermaid
            lines = (to_dot if args.dot else to_mermaid)(gm)
            write = sys.stdout.write
            for line in lines:
                write(line + "\n")
        else:
            group = args.group if args.group is not None else len(nodes) > GROUP_ABOVE
            _print_human(gm, nodes, group, args.limit)
    return 0


def _emit_json(doc: dict, nodes) -> None:
    """The document with ``nodes`` last, written a batch of nodes at a time (a 100,000-node
    graph is never one string); on a terminal, indented at once (a person reads it)."""
    if sys.stdout.isatty():
        emit_json({**doc, "nodes": [n.to_dict() for n in nodes]})
        return
    encode = json.JSONEncoder(sort_keys=True, default=str, allow_nan=True).encode
    write = sys.stdout.write
    write(encode(doc)[:-1] + ', "nodes": [')
    for i in range(0, len(nodes), 1024):
        write((", " if i else "") + ", ".join(encode(n.to_dict()) for n in nodes[i:i + 1024]))
    write("]}\n")


# -- the table -------------------------------------------------------------------------------------
def _shape(shape) -> str:
    if shape is None:
        return "?"
    # a symbolic dimension (ONNX dim_param, a .pt2 symbol) is text from the file
    return "[" + ",".join("?" if d is None else (str(d) if isinstance(d, int) else shown(d))
                          for d in shape) + "]"


def _flops(n) -> str:
    if n.flops is None:
        return "uncounted"
    return f"{n.flops:,}"


def _node_rows(nodes, depth_of, graphs=None):
    """One row per node; with ``graphs`` (path -> Graph), a heading row where a graph other than
    the first begins: the tree of graphs, subgraphs indented under their parents."""
    cache: dict = {}
    current = nodes[0].graph if nodes else None
    for n in nodes:
        if graphs is not None and n.graph != current:
            current = n.graph
            g = graphs[n.graph]
            indent = "  " * max(0, depth_of.get(n.graph, 0) - 1)
            yield [f"{indent}▸ {shown(g.path)} ({g.kind})", "", "", "", ""]
        ins = " ".join(_cached(cache, v.shape) for v in n.inputs if v.name)
        outs = " ".join(_cached(cache, v.shape) for v in n.outputs)
        indent = "  " * depth_of.get(n.graph, 0)
        yield [indent + shown(n.name or n.op), shown(n.op), f"{ins} → {outs}",
               f"{n.params:,}" if n.params else "", _flops(n)]


def _cached(cache, shape):
    got = cache.get(shape)
    if got is None:
        got = cache[shape] = _shape(shape)
    return got


def _group_rows(nodes):
    acc: dict[tuple, list] = {}
    for n in nodes:
        key = (n.graph, group_key(n.module) if n.module else "", n.op)
        a = acc.get(key)
        if a is None:
            a = acc[key] = [0, set(), 0, 0, Counter()]
        a[0] += 1
        a[1].update(n.parameters)
        a[2] += n.params
        if n.flops is None:
            a[4]["uncounted"] += 1
        else:
            a[3] += n.flops
    for (graph, module, op), (count, _, params, flops, unc) in acc.items():
        label = f"{graph}:{module}" if module else graph
        yield [shown(label), shown(op), f"×{count:,}", f"{params:,}" if params else "",
               f"{flops:,}" + (f" (+{unc['uncounted']} uncounted)" if unc else "")]


def _print_human(gm, nodes, group, limit):
    tty = sys.stdout.isatty()
    by_path = {g.path: g for g in gm.graphs}
    depth_of: dict[str, int] = {}
    for g in gm.graphs:   # parents come before their subgraphs
        depth_of[g.path] = depth_of.get(g.parent, 0) + 1 if g.parent else 0
    if group:
        headers, aligns = ["module", "op", "nodes", "params", "FLOPs"], "llrrr"
        rows = list(_group_rows(nodes))
    else:
        headers, aligns = ["node", "op", "inputs → outputs", "params", "FLOPs"], "lllrr"
        rows = _node_rows(nodes, depth_of, by_path)
    total = len(nodes) if not group else None
    if limit:
        rows = (r for i, r in zip(range(limit), rows))
    rows = list(rows) if group or len(nodes) <= 4096 else rows
    if isinstance(rows, list):
        widths = [min(80, max((len(r[i]) for r in rows), default=0)) for i in range(5)]
    else:   # a big graph streams: widths from the first rows' vocabulary
        head = list(_node_rows(nodes[:2048], depth_of, by_path))
        widths = [min(80, max((len(r[i]) for r in head), default=0)) for i in range(5)]
    if tty:
        widths = TextTable.fit_first(widths)
    headings = [0]

    def counted(rows):
        for r in rows:
            if r[0].lstrip().startswith("▸ ") and not r[1]:
                headings[0] += 1
            yield r
    written = TextTable(headers, aligns, widths, fold=tty, bold=tty).write(counted(rows))
    console = stdout_console()
    if total is not None and written - headings[0] < total:
        console.print(f"… {total - written + headings[0]:,} more nodes (--limit)", markup=False)
    _print_totals(console, gm)


def _print_totals(console, gm):
    h = gm.to_header()
    t = h["totals"]
    console.print()
    kinds = ", ".join(f"{k} {human_count(v)}" for k, v in t["flops_by_kind"].items())
    console.print(f"[bold]format[/] {markup(gm.format)}   [bold]nodes[/] {t['nodes']:,}   "
                  f"[bold]params[/] {t['params']:,}   [bold]FLOPs[/] {t['flops']:,}"
                  + (f" ({markup(kinds)})" if kinds else "")
                  + f"   [bold]shapes[/] {markup(gm.shapes_from or 'none')}")
    console.print(f"[bold]FLOPs as FlopCounterMode counts them[/] (matmul, conv, attention) "
                  f"{t['flop_counter_flops']:,}")
    if t["uncounted"]:
        ops = ", ".join(f"{op} ×{k}" for op, k in list(t["uncounted"].items())[:12])
        console.print(f"[bold]uncounted[/] {markup(ops)}")
    for g in h["graphs"][1:]:
        gt = g["totals"]
        note = " (FLOPs per call site, in the callers)" if g["counted_in_callers"] else ""
        console.print(f"[bold]{markup(g['kind'])}[/] {markup(g['path'])}: {gt['nodes']:,} nodes, "
                      f"params {gt['params']:,}, FLOPs {gt['flops']:,}{note}")
    for b in h["blocks"]:
        console.print(f"[bold]block[/] {markup(b['pattern'])} ×{b['count']:,} "
                      f"({b['first']}..{b['last']}): {b['nodes']:,} nodes, params "
                      f"{b['params']:,}, FLOPs {b['flops']:,} ({b['flops_per_instance']:,} each)")
    for note in h["notes"]:
        console.print(f"[yellow]note[/] {markup(note)}")
