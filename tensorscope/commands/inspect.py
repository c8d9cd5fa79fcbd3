"""`tensorscope inspect PATH`: list the tensors of a model file."""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import math
import os
import sys
from collections import Counter
from operator import attrgetter

from .. import open as open_model
from ..errors import TensorscopeError
from ..model import TensorInfo, json_texts, json_texts_joined
from ..grouping import GroupCollector, describe_ranges, pattern_of, range_labels
from ..remote import with_cost
from ..render import (TextTable, emit_json_stream, human_bytes, human_count, opening, plural,
                      progress, stdout_console)
from ._args import positive_rows as _positive
from ..safetext import markup, shown

HELP = "list the tensors of a model file (any format)"
GROUP_ABOVE = 2000  # more tensors than this open in the grouped view (--no-group lists them all)
DESCRIPTION = f"""\
List the tensors of a model file or folder: name, dtype, shape, parameters, bytes and the byte
offset of the data in the file, with a summary. Nothing in the file is executed.

Above {GROUP_ABOVE:,} tensors the listing opens grouped (repeated layers collapsed, with the
index ranges seen); --no-group lists every tensor, --group groups a smaller file.

Example:
  tensorscope inspect model.pt
  tensorscope inspect model.safetensors --filter q_proj --stats
  tensorscope inspect model.safetensors --filter '*.attn.*.weight'
  tensorscope inspect model.gguf --show tokenizer.chat_template
  tensorscope inspect checkpoint/ --group
  tensorscope inspect moe-checkpoint/ --no-group | grep 'experts.17.'
  tensorscope inspect model.onnx --json
"""


def add_arguments(p):
    p.add_argument("path", help="model file or folder")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in README)")
    p.add_argument("--filter", metavar="TEXT", action="append", default=[],
                   help="only tensors whose name contains TEXT, or matches it as a glob when it "
                        "has * ? or [ (repeatable: any of them)")
    p.add_argument("--show", metavar="KEY", default=None,
                   help="print one metadata value in full (a dotted key as the summary shows it, "
                        "or a key inside it: tokenizer.chat_template) and exit")
    p.add_argument("--group", action=argparse.BooleanOptionalAction, default=None,
                   help="collapse repeated layers: model.layers.#.mlp.up_proj.weight ×32 "
                        f"(default: grouped above {GROUP_ABOVE:,} tensors; --no-group lists "
                        "every tensor)")
    p.add_argument("--stats", action="store_true",
                   help="min, max, mean, std, NaN and Inf counts (reads the values)")
    p.add_argument("--limit", type=_positive, default=None, metavar="N", help="show at most N rows")


_GLOB_CHARS = frozenset("*?[")


def _matcher(patterns):
    """A name test for ``--filter``: a substring (the TUI's filter), or a glob (anchored, as the
    shell's) when the text has glob characters."""
    subs = [p for p in patterns if not _GLOB_CHARS & set(p)]
    globs = [p for p in patterns if _GLOB_CHARS & set(p)]
    return lambda name: (any(p in name for p in subs)
                         or any(fnmatch.fnmatchcase(name, g) for g in globs))


def _selected(model, patterns):
    if not patterns:
        return list(model.tensors)
    match = _matcher(patterns)
    return [t for t in model.tensors if match(t.name)]


def _compute_stats(model, tensors):
    from ..dequant import many_value_stats  # numpy loads only when values are read
    out = {}
    total = sum(t.nbytes for t in tensors)
    with progress(total, "stats") as advance:
        # One pass per tensor on a few threads, pages released behind it; quantized/packed/block
        # dtypes: statistics of the decoded values. An error (strings, undecodable blocks) is the row's.
        for t, got in many_value_stats(model, tensors, advance):
            out[t.name] = {"error": str(got)} if isinstance(got, Exception) else got.to_dict()
    return out


def run(args) -> int:
    with contextlib.ExitStack() as stack:
        with opening(shown(args.path)):     # listing: no object tree, no call evidence
            model = stack.enter_context(open_model(args.path, listing=True))
        if args.show is not None:
            return _show(model, args.show)
        tensors = _selected(model, args.filter)
        group = args.group if args.group is not None else len(tensors) > GROUP_ABOVE
        stats = _compute_stats(model, tensors) if args.stats else {}
        # the grouping pass over every tensor, shared with the architecture summary when the
        # listing is the whole model
        collector = GroupCollector() if group else None
        groups = _groups(tensors, stats, collector) if group else None
        whole = collector if not args.filter else None
        if args.json:
            _emit_json(model, tensors, stats, groups, whole)
        else:
            _print_human(model, tensors, stats, groups, args)
        if args.filter and not tensors:
            shown_filters = " ".join(f"--filter {shown(repr(f))}" for f in args.filter)
            print(f"tensorscope inspect: no tensor name matches {shown_filters} (of "
                  f"{plural(len(model.tensors), 'tensor')}); text without * ? [ matches anywhere "
                  "in the name, a glob matches the whole name", file=sys.stderr)
            return 1
    return 0


# -- what the listing says about the file ------------------------------------------------------

def _is_buffer(role: str) -> bool:
    return role.startswith("buffer")


_kind = attrgetter("dtype", "role", "shape", "nbytes", "has_data")


def summarize(model, tensors) -> dict:
    """`ModelFile.summary` over ``tensors`` (the selection), plus ``by_role``; with a filter,
    ``of`` holds the whole file's tensors, params and bytes."""
    by_dtype: dict[str, dict[str, int]] = {}
    by_role: dict[str, dict[str, int]] = {}
    params = nbytes = 0
    # counted per kind of record (a checkpoint has a handful), in C; then summed per kind
    kinds = Counter(map(_kind, tensors))
    for (dtype, role, shape, b, has_data), count in kinds.items():
        n = math.prod(shape) * count
        b = b * count if has_data else 0   # data-less (traced inputs): no bytes
        params += n
        nbytes += b
        for table, key in ((by_dtype, dtype), (by_role, role)):
            d = table.get(key)
            if d is None:
                d = table[key] = {"tensors": 0, "params": 0, "bytes": 0}
            d["tensors"] += count
            d["params"] += n
            d["bytes"] += b
    out = {"format": model.format, "path": model.path, "files": list(model.files),
           "tensors": len(tensors), "params": params, "bytes": nbytes, "by_dtype": by_dtype,
           "by_role": by_role}
    if len(tensors) != len(model.tensors):
        out["of"] = {"tensors": len(model.tensors), "params": model.num_params,
                     "bytes": model.total_bytes}
    return out


def outside_allowlist(model) -> list[tuple[str, str]]:
    """``(dotted global, category)`` for every global the parse's pickles referenced that
    torch's weights-only allowlist does not hold and that is not torch's own framework code:
    denied names first, then unknown ones. Read from the evidence the parse already recorded."""
    if not any(getattr(rec.result, "globals", None) for rec in model.evidence.pickles):
        return []   # no pickle named a global (safetensors, GGUF ...): no policy to load
    from ..policy import DENIED, UNKNOWN, classify
    seen: dict[tuple, object] = {}
    for rec in model.evidence.pickles:
        for g in getattr(rec.result, "globals", None) or ():
            key = (g.module, g.name)
            if key not in seen:
                seen[key] = classify(g.module, g.name)
    found = [(v.dotted, v.category) for v in seen.values() if v.category in (DENIED, UNKNOWN)]
    found.sort(key=lambda x: x[1] != DENIED)  # stable: first-seen order within each kind
    return list(dict.fromkeys(found))


def _groups(tensors, stats=None, c=None) -> list[dict]:
    """The groups of `tensorscope.grouping.GroupCollector` (``c``, fed here), with params and
    labelled ranges, and with ``stats`` (per tensor name) the statistics of each group's values,
    merged exactly."""
    c = GroupCollector() if c is None else c
    c.add_tensors(tensors)
    merged = _group_stats(tensors, stats) if stats else {}
    out = []
    for g in c.groups():
        numel = 1
        for d in g["shape"]:
            numel *= d
        g["params"] = g["count"] * numel
        g["ranges"] = [{"label": label, "min": lo, "max": hi, "distinct": k}
                       for label, (lo, hi, k) in zip(range_labels(g["pattern"]), g["ranges"])]
        if stats:
            g["stats"] = merged.get((g["pattern"], g["dtype"], tuple(g["shape"])), {})
        out.append(g)
    return out


def _group_stats(tensors, stats) -> dict[tuple, dict]:
    """Per (pattern, dtype, shape): the members' statistics merged as one population (Chan's
    parallel update over the finite values; NaN, Inf and zero counts added)."""
    acc: dict[tuple, list] = {}
    for t in tensors:
        s = stats.get(t.name)
        if not s or "error" in s:
            continue
        key = (pattern_of(t), t.dtype, tuple(t.shape))
        a = acc.get(key)
        if a is None:   # numel, nan, inf, zeros, finite count, mean, M2, min, max
            a = acc[key] = [0, 0, 0, 0, 0, 0.0, 0.0, math.inf, -math.inf]
        nan, inf = s.get("nan") or 0, s.get("inf") or 0
        a[0] += s.get("numel") or 0
        a[1] += nan
        a[2] += inf
        a[3] += s.get("zeros") or 0
        n = (s.get("numel") or 0) - nan - inf
        if n <= 0 or s.get("mean") is None:
            continue
        delta = s["mean"] - a[5]
        total = a[4] + n
        a[5] += delta * n / total
        a[6] += (s.get("std") or 0.0) ** 2 * n + delta * delta * a[4] * n / total
        a[4] = total
        a[7], a[8] = min(a[7], s["min"]), max(a[8], s["max"])
    out = {}
    for key, (numel, nan, inf, zeros, n, mean, m2, lo, hi) in acc.items():
        finite = n > 0
        out[key] = {"numel": numel, "nan": nan, "inf": inf, "zeros": zeros,
                    "min": lo if finite else None, "max": hi if finite else None,
                    "mean": mean if finite else None,
                    "std": math.sqrt(m2 / n) if finite else None}
    return out


# -- JSON ------------------------------------------------------------------------------------------

def _emit_json(model, tensors, stats, groups, collector=None):
    doc = {"schema": "tensorscope.inspect/1", "summary": summarize(model, tensors),
           "metadata": model.metadata,
           "anomalies": [{"kind": a.kind, "message": a.message, "file": a.file, "member": a.member,
                          "offset": a.offset} for a in model.evidence.anomalies],
           "outside_allowlist": [{"global": d, "category": c} for d, c in outside_allowlist(model)]}
    if groups is not None:
        doc["groups"] = groups
    doc["model"] = _architecture(model, collector)
    # ``fetched``: what reading a URL cost (the rows read nothing more)
    if stats:
        emit_json_stream(with_cost(doc), "tensors", tensors, to_dict=lambda t: _stats_row(t, stats))
    else:
        emit_json_stream(with_cost(doc), "tensors", tensors, to_dict=TensorInfo.to_dict,
                         to_texts=json_texts, to_joined=json_texts_joined)


def _stats_row(t, stats):
    row = t.to_dict()
    if t.name in stats:
        row["stats"] = stats[t.name]
    return row


# -- the table -----------------------------------------------------------------------------------

def _fmt_shape(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


class _Cells:
    """Per-value caches: a 100,000-tensor checkpoint has a handful of shapes, sizes and files."""

    def __init__(self):
        self.shapes: dict[tuple, tuple[str, int, str]] = {}
        self.sizes: dict[int, str] = {}
        self.files: dict[str, str] = {}
        self.dtypes: dict[str, str] = {}

    def shape(self, shape):
        got = self.shapes.get(shape)
        if got is None:
            numel = 1
            for d in shape:
                numel *= d
            got = self.shapes[shape] = (_fmt_shape(shape), numel, f"{numel:,}")
        return got

    def dtype(self, name):  # ``unknown:<name>``: a dtype name a newer torch wrote, from the file
        got = self.dtypes.get(name)
        if got is None:
            got = self.dtypes[name] = shown(name)
        return got

    def size(self, n):
        got = self.sizes.get(n)
        if got is None:
            got = self.sizes[n] = human_bytes(n)
        return got

    def file(self, path):
        got = self.files.get(path)
        if got is None:
            got = self.files[path] = shown(os.path.basename(path))
        return got


def _tensor_rows(tensors, stats, several_files):
    cells = _Cells()
    for t in tensors:
        shape, _numel, params = cells.shape(t.shape)
        offset = t.byte_offset
        # a tensor saved without data (traced inputs) shows "-" bytes, as in the totals
        row = [shown(t.name), cells.dtype(t.dtype), shape, params, cells.size(t.nbytes if t.has_data else None),
               "-" if offset is None else str(offset)]
        if several_files:
            row.append(cells.file(t.file))
        if stats:
            s = stats.get(t.name, {})
            row += [_num(s.get(k)) for k in ("min", "max", "mean", "std")]
            row += [str(s.get("nan", "")), str(s.get("inf", ""))]
        yield row


def _tensor_widths(tensors, several_files, stats):
    """Column widths over the rows to print, from each column's vocabulary: one pass of
    attribute reads (names measured raw: the rare escaped name only pushes its own row)."""
    cells = _Cells()
    name_w = max(map(len, (t.name for t in tensors)), default=0)
    dtypes, shapes, sizes, files = set(), set(), set(), set()
    top_offset = 0
    for t in tensors:
        dtypes.add(t.dtype)
        shapes.add(t.shape)
        sizes.add(t.nbytes if t.has_data else None)
        if several_files:
            files.add(t.file)
        if t.byte_offset is not None and t.byte_offset > top_offset:
            top_offset = t.byte_offset
    widths = [name_w, max((len(cells.dtype(d)) for d in dtypes), default=0),
              max((len(cells.shape(s)[0]) for s in shapes), default=0),
              max((len(cells.shape(s)[2]) for s in shapes), default=0),
              max((len(cells.size(n)) for n in sizes), default=0), max(1, len(str(top_offset)))]
    if several_files:
        widths.append(max((len(cells.file(f)) for f in files), default=0))
    if stats:
        values = list(stats.values())
        widths += [max((len(_num(v.get(k))) for v in values), default=1)
                   for k in ("min", "max", "mean", "std")]
        widths += [max((len(str(v.get(k, ""))) for v in values), default=1) for k in ("nan", "inf")]
    return widths


def _group_rows(groups, stats=False):
    for g in groups:
        label = f"{g['pattern']} ×{g['count']:,}" if g["count"] > 1 else g["first"]
        ranges = describe_ranges(g["pattern"], [(r["min"], r["max"], r["distinct"])
                                                for r in g["ranges"]]) if g["count"] > 1 else ""
        row = [shown(label), shown(g["dtype"]), _fmt_shape(g["shape"]), f"{g['params']:,}",
               human_bytes(g["bytes"]), shown(ranges)]
        if stats:
            s = g.get("stats") or {}
            row += [_num(s.get(k)) for k in ("min", "max", "mean", "std")]
            row += [str(s.get("nan", "")), str(s.get("inf", ""))]
        yield row


def _print_human(model, tensors, stats, groups, args):
    tty = sys.stdout.isatty()
    limit = args.limit
    if groups is not None:
        headers, aligns = ["name", "dtype", "shape", "params", "bytes", "indices"], "lllrrl"
        if stats:
            headers += ["min", "max", "mean", "std", "nan", "inf"]
            aligns += "rrrrrr"
        rows = list(_group_rows(groups[:limit] if limit else groups, bool(stats)))
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(len(headers))]
        total_rows = len(groups)
    else:
        shown_tensors = tensors[:limit] if limit else tensors
        several_files = len({t.file for t in tensors}) > 1  # shards, external data: say which
        headers = ["name", "dtype", "shape", "params", "bytes", "offset"]
        aligns = "lllrrr"
        if several_files:
            headers.append("file")
            aligns += "l"
        if stats:
            headers += ["min", "max", "mean", "std", "nan", "inf"]
            aligns += "rrrrrr"
        widths = _tensor_widths(shown_tensors, several_files, stats)
        rows = _tensor_rows(shown_tensors, stats, several_files)
        total_rows = len(tensors)
    if tty:
        widths = TextTable.fit_first(widths)
    written = TextTable(headers, aligns, widths, fold=tty, bold=tty).write(rows)
    console = stdout_console()
    if written < total_rows:
        console.print(f"… {total_rows - written:,} more rows (--limit)", markup=False)
    if groups is not None:
        why = ("" if args.group else f"; more than {GROUP_ABOVE:,} tensors")
        console.print(f"{plural(len(tensors), 'tensor')} in {plural(len(groups), 'group')}{why}: "
                      "--no-group lists every tensor"
                      + (" (statistics are of each group's values together)" if stats else ""),
                      markup=False)
    _print_summary(console, model, tensors)


def _role_counts(by_role) -> dict[str, int]:
    """Elements by kind: ``parameters`` and ``buffers`` where the file says (a saved module),
    ``elements`` for the rest (plain containers, state dicts, safetensors: they do not say)."""
    out = {}
    if "parameter" in by_role:
        out["parameters"] = by_role["parameter"]["params"]
    if any(_is_buffer(k) for k in by_role):
        out["buffers"] = sum(v["params"] for k, v in by_role.items() if _is_buffer(k))
    other = sum(v["params"] for k, v in by_role.items() if k != "parameter" and not _is_buffer(k))
    if other or not out:
        out["other elements" if out else "elements"] = other
    return out


def _print_summary(console, model, tensors):
    s = summarize(model, tensors)
    whole = summarize(model, model.tensors) if "of" in s else None
    mine = _role_counts(s["by_role"])
    if whole:
        theirs = _role_counts(whole["by_role"])
        if set(theirs) - set(mine):  # say "of" per kind of the whole file
            mine = {**{k: 0 for k in theirs}, **mine}
        parts = [f"[bold]{k}[/] {human_count(v)} of {human_count(theirs.get(k, 0))}"
                 for k, v in mine.items()]
        tensors_text = f"{len(tensors):,} of {len(model.tensors):,}"
        size_text = f"{human_bytes(s['bytes'])} of {human_bytes(whole['bytes'])}"
    else:
        parts = [f"[bold]{k}[/] {human_count(v)}" for k, v in mine.items()]
        tensors_text, size_text = f"{len(tensors):,}", human_bytes(s["bytes"])
    console.print()
    console.print(f"[bold]format[/] {markup(model.format)}   [bold]tensors[/] {tensors_text}   "
                  + "   ".join(parts) + f"   [bold]size[/] {size_text}")
    by_dtype = ", ".join(f"{k}: {v['tensors']:,} tensor{'s' if v['tensors'] != 1 else ''} "
                         f"{human_bytes(v['bytes'])}" for k, v in s["by_dtype"].items())
    if by_dtype:
        console.print(f"[bold]by dtype[/] {markup(by_dtype)}")
    _print_metadata(console, model.metadata)
    _print_architecture(console, model)
    if model.evidence.anomalies:
        console.print(f"[yellow]{plural(len(model.evidence.anomalies), 'anomaly', 'anomalies')}[/] "
                      "(run `tensorscope scan` for a safety verdict):")
        for a in model.evidence.anomalies[:10]:
            console.print(f"  {markup(a.kind)}: {markup(a)}")
    refs = outside_allowlist(model)
    if refs:
        names = ", ".join(d for d, _ in refs[:3]) + (f" (+{len(refs) - 3} more)" if len(refs) > 3 else "")
        console.print(f"[yellow]this file references {markup(names)}[/]: run `tensorscope scan` "
                      "before loading it")
    code = _repository_code(model)
    if code:
        names = ", ".join(code[:3]) + (f" (+{len(code) - 3} more)" if len(code) > 3 else "")
        console.print(f"[yellow]this repository names code for its loaders to import "
                      f"({markup(names)})[/]: from_pretrained(trust_remote_code=True) runs it; run "
                      "`tensorscope scan` on the folder")


def _architecture(model, collector=None):
    """The architecture summary (`tensorscope.architecture`); None when nothing is recognised."""
    from ..architecture import summarize
    return summarize(model, collector)


def _print_architecture(console, model) -> None:
    from ..architecture import describe
    for line in describe(_architecture(model)):
        console.print(line, markup=False)


def _repository_code(model) -> list[str]:
    """Code files a local model folder's configs name (`auto_map`, diffusers components)."""
    from ..remote import is_url
    from ..repo_code import named_code
    files = [f for f in (model.files or [model.path]) if isinstance(f, str) and not is_url(f)]
    if not files:
        return []
    # the folder of the model's first file: a Hugging Face cache's snapshot, not its root
    return named_code(os.path.dirname(os.path.abspath(files[0])))


def _num(v):
    if v is None:
        return "-"
    return f"{v:.4g}"


# -- metadata: a table of readable values -----------------------------------------------------------

VALUE_CHARS = 100   # a longer value is cut in the table; --show KEY prints it whole
META_ROWS = 60      # rows of the table at most; --json has every key
_KEY_WIDTH = 32


def _metadata_rows(meta, prefix="", depth=0):
    """``(dotted key, readable text)``: nested dicts flattened (two levels), ONNX opsets as
    ``ai.onnx 21``, graph inputs as ``x: float32[batch, 4]``, lists joined; empty values left out."""
    for key, value in meta.items():
        name = f"{prefix}{key}"
        if key == "opset_import" and isinstance(value, dict):
            yield "opsets", ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in value.items())
        elif key.endswith("_types") and isinstance(value, dict) and prefix:
            continue   # GGUF's per-key value types: in --json
        elif isinstance(value, dict) and set(value) == {"count", "items", "truncated"}:
            items = ", ".join(map(str, value["items"]))
            yield name, f"{value['count']:,} items: {items}" + (" …" if value["truncated"] else "")
        elif isinstance(value, dict) and value and depth < 2 and not _scalar_dict(value):
            yield from _metadata_rows(value, name + ".", depth + 1)
        elif isinstance(value, dict):
            if value:
                yield name, ", ".join(f"{k} {_text(v)}" for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            if value:
                yield name, ", ".join(_io(v) if _is_io(v) else _text(v) for v in value)
        else:
            yield name, _text(value)


def _scalar_dict(d) -> bool:   # op counts, metadata_props: one row, "Add 2, Cast 2"
    return len(d) <= 12 and all(isinstance(v, (int, float, str, bool)) and len(str(v)) <= 40
                                for v in d.values()) and all(len(str(k)) <= 24 for k in d)


def _is_io(v) -> bool:
    return isinstance(v, dict) and "name" in v and ("elem_type" in v or "shape" in v)


def _io(v) -> str:
    """A graph input/output: ``name: dtype[dims]`` (symbolic dims by name)."""
    shape = v.get("shape")
    dims = "" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"
    return f"{v['name']}: {v.get('elem_type') or v.get('kind') or '?'}{dims}"


def _text(v) -> str:
    return v if isinstance(v, str) else repr(v) if isinstance(v, bytes) else str(v)


def _print_metadata(console, meta) -> None:
    rows = list(_metadata_rows(meta))
    if not rows:
        return
    width = min(_KEY_WIDTH, max(len(k) for k, _ in rows))
    for key, value in rows[:META_ROWS]:
        one_line = " ".join(value.split("\n"))
        if len(one_line) > VALUE_CHARS:
            one_line = one_line[:VALUE_CHARS - 1] + "…"
            more = f"  [dim](--show {markup(shown(key))})[/]"
        else:
            more = ""
        console.print(f"[bold]{markup(shown(key)).ljust(width)}[/] {markup(shown(one_line))}{more}")
    if len(rows) > META_ROWS:
        console.print(f"… {plural(len(rows) - META_ROWS, 'more key')} (--json lists them all)",
                      markup=False)


def _lookup(meta, key: str):
    """The metadata value at ``key``: a dotted path through the nested dicts, where a component
    may itself hold dots (GGUF keys: ``gguf.kv.tokenizer.chat_template``), or a key found at any
    depth when it is found once. KeyError when there is none."""
    def walk(node, rest):
        if rest in node:
            yield node[rest]
        for k, v in node.items():
            if isinstance(v, dict) and rest.startswith(f"{k}."):
                yield from walk(v, rest[len(k) + 1:])

    def anywhere(node):
        for k, v in node.items():
            if k == key:
                yield v
            if isinstance(v, dict):
                yield from anywhere(v)
    found = list(walk(meta, key)) or list(anywhere(meta))
    if len(found) != 1:
        raise KeyError(key)
    return found[0]


def _full_value(model, key: str):
    """``key``'s value; GGUF key/values in full (the metadata cuts arrays to their first items)."""
    fields = (model.extras or {}).get("gguf_kv") or {}
    bare = key[len("gguf.kv."):] if key.startswith("gguf.kv.") else key
    if bare in fields:
        return fields[bare].value
    return _lookup(model.metadata, key)


def _show(model, key: str) -> int:
    try:
        value = _full_value(model, key)
    except KeyError:
        keys = [k for k, _ in _metadata_rows(model.metadata)]
        near = [k for k in keys if key.lower() in k.lower()][:5] or keys[:5]
        raise TensorscopeError(f"{model.path}: no metadata key {key!r} (try: "
                               f"{', '.join(near)})") from None
    if isinstance(value, str):
        text = value
    else:
        import json
        if hasattr(value, "tolist"):   # a GGUF array of numbers (a view over the file)
            value = value.tolist()
        text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    # line by line: a template's line breaks are its layout; every other control stays escaped
    stdout_console().print("\n".join(map(shown, text.split("\n"))), markup=False,
                           highlight=False, soft_wrap=True)
    return 0
