"""`tensorscope inspect PATH`: list the tensors of a model file."""
from __future__ import annotations

import fnmatch
import os
import re
from collections import OrderedDict

from .. import open as open_model
from ..errors import TensorscopeError
from ..remote import with_cost
from ..render import emit_json, human_bytes, human_count, progress, stdout_console

HELP = "list the tensors of a model file (any format)"
DESCRIPTION = """\
List the tensors of a model file or folder: name, dtype, shape, parameters, bytes and the byte
offset of the data in the file, with a summary. Nothing in the file is executed.

Example:
  tensorscope inspect model.pt
  tensorscope inspect model.safetensors --filter '*.attn.*' --stats
  tensorscope inspect checkpoint/ --group
  tensorscope inspect model.onnx --json
"""

_INDEX = re.compile(r"^\d+$")


def add_arguments(p):
    p.add_argument("path", help="model file or folder")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in README)")
    p.add_argument("--filter", metavar="GLOB", action="append", default=[],
                   help="only tensors whose name matches the glob (repeatable)")
    p.add_argument("--group", action="store_true",
                   help="collapse repeated layers: layers.#.attn.q_proj.weight x32")
    p.add_argument("--stats", action="store_true",
                   help="min, max, mean, std, NaN and Inf counts (reads the values)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="show at most N rows")


def group_key(name_path: tuple[str, ...]) -> str:
    """``('layers', '3', 'attn')`` -> ``layers.#.attn``: numeric components become ``#``."""
    return ".".join("#" if _INDEX.match(c) else c for c in name_path)


def grouped(tensors):
    """Rows of repeated layers collapsed: (pattern, dtype, shape) -> [tensors] in first-seen order."""
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for t in tensors:
        groups.setdefault((group_key(t.path), t.dtype, t.shape), []).append(t)
    return groups


def _selected(model, globs):
    if not globs:
        return list(model.tensors)
    return [t for t in model.tensors if any(fnmatch.fnmatchcase(t.name, g) for g in globs)]


def _compute_stats(model, tensors):
    from ..dequant import value_stats  # numpy loads only when values are read
    out = {}
    total = sum(t.nbytes for t in tensors)
    with progress(total, "stats") as advance:
        for t in tensors:
            try:
                # Quantized/packed/block dtypes: statistics of the decoded values (dequant).
                out[t.name] = value_stats(model, t).to_dict()
            except (TypeError, ValueError, TensorscopeError) as e:  # strings, undecodable blocks
                out[t.name] = {"error": str(e)}
            advance(t.nbytes)
    return out


def run(args) -> int:
    with open_model(args.path) as model:
        tensors = _selected(model, args.filter)
        stats = _compute_stats(model, tensors) if args.stats else {}
        if args.json:
            emit_json(with_cost(_as_json(model, tensors, stats, args.group)))
        else:
            _print_human(model, tensors, stats, args)
    return 0


def _as_json(model, tensors, stats, group):
    rows = []
    for t in tensors:
        row = t.to_dict()
        if t.name in stats:
            row["stats"] = stats[t.name]
        rows.append(row)
    doc = {"schema": "tensorscope.inspect/1", "summary": model.summary(), "metadata": model.metadata,
           "tensors": rows,
           "anomalies": [{"kind": a.kind, "message": a.message, "file": a.file, "member": a.member,
                          "offset": a.offset} for a in model.evidence.anomalies]}
    if group:
        doc["groups"] = [{"pattern": k[0], "dtype": k[1], "shape": list(k[2]), "count": len(v),
                          "names": [t.name for t in v]} for k, v in grouped(tensors).items()]
    return doc


def _fmt_shape(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _print_human(model, tensors, stats, args):
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text
    console = stdout_console()
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("name", overflow="fold")
    table.add_column("dtype")
    table.add_column("shape")
    table.add_column("params", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("offset", justify="right")
    several_files = len({t.file for t in tensors}) > 1  # shards, external data: say which file
    if several_files:
        table.add_column("file")
    if stats:
        for col in ("min", "max", "mean", "std", "nan", "inf"):
            table.add_column(col, justify="right")
    rows = []
    if args.group:
        for (pattern, dtype, shape), members in grouped(tensors).items():
            first = members[0]
            label = pattern if len(members) > 1 else first.name
            count = f" ×{len(members)}" if len(members) > 1 else ""
            rows.append((first, f"{label}{count}", dtype, shape, sum(m.numel for m in members),
                         sum(m.nbytes for m in members if m.has_data), first.byte_offset))
    else:  # a tensor saved without data (traced inputs) shows "-" bytes, as in the totals
        rows = [(t, t.name, t.dtype, t.shape, t.numel, t.nbytes if t.has_data else None,
                 t.byte_offset) for t in tensors]
    shown = rows[: args.limit] if args.limit else rows
    for t, label, dtype, shape, params, nbytes, offset in shown:
        cells = [label, dtype, _fmt_shape(shape), f"{params:,}", human_bytes(nbytes),
                 "-" if offset is None else str(offset)]
        if several_files:
            cells.append(os.path.basename(t.file))
        if stats:
            s = stats.get(t.name, {})
            cells += [_num(s.get(k)) for k in ("min", "max", "mean", "std")]
            cells += [str(s.get("nan", "")), str(s.get("inf", ""))]
        table.add_row(*(Text(c) for c in cells))  # names come from the file: never markup
    console.print(table)
    if len(shown) < len(rows):
        console.print(f"… {len(rows) - len(shown)} more rows (--limit)")
    summary = model.summary()
    console.print()
    console.print(f"[bold]format[/] {model.format}   [bold]tensors[/] {len(tensors)}"
                  f"{'' if len(tensors) == len(model.tensors) else f' of {len(model.tensors)}'}   "
                  f"[bold]parameters[/] {human_count(summary['params'])}   "
                  f"[bold]size[/] {human_bytes(summary['bytes'])}")
    by_dtype = ", ".join(f"{k}: {v['tensors']} tensor{'s' if v['tensors'] != 1 else ''} "
                         f"{human_bytes(v['bytes'])}"
                         for k, v in summary["by_dtype"].items())
    if by_dtype:
        console.print(f"[bold]by dtype[/] {escape(by_dtype)}")
    for key, value in _flat_metadata(model.metadata):
        console.print(f"[bold]{escape(key)}[/] {escape(value)}")
    if model.evidence.anomalies:
        console.print(f"[yellow]{len(model.evidence.anomalies)} anomalies[/] "
                      "(run `tensorscope scan` for a safety verdict):")
        for a in model.evidence.anomalies[:10]:
            console.print(Text(f"  {a.kind}: {a}"))


def _num(v):
    if v is None:
        return "-"
    return f"{v:.4g}"


def _flat_metadata(meta, prefix="", depth=0):
    for key, value in meta.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth < 1 and len(value) <= 12:
            yield from _flat_metadata(value, name + ".", depth + 1)
        else:
            text = str(value)
            yield name, (text if len(text) <= 120 else text[:117] + "...")
