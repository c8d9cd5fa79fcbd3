"""`tensorscope diff A B`: compare two models of any formats down to the values."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .. import open as open_model
from ..remote import with_cost
from ..render import emit_json, progress, stdout_console

if TYPE_CHECKING:
    from ..diffing import DiffResult, TensorDiff

HELP = "compare two models (any formats) tensor by tensor, down to the values"
DESCRIPTION = """\
Compare two model files or folders of any formats (a .pt against its .safetensors conversion,
two checkpoints of one run). Tensors are aligned by name; wrapper prefixes such as `module.` (DDP)
or `_orig_mod.` (torch.compile) are detected and reported, tensors renamed but unchanged are found
by their bytes. For each pair: dtype, shape, layout, and the values (identical bytes are detected at
memory-compare speed; otherwise max/mean abs difference, max relative difference, RMS, cosine and
the count of elements outside atol + rtol*|b|, as torch.isclose counts them). Memory stays flat
whatever the file sizes. Nothing in the files is executed.

Exit status: 0 when every tensor is the same within tolerance, 1 when anything differs
(changed, added, removed, renamed), 2 on error. Metadata differences are shown, not counted.

Example:
  tensorscope diff old.pt new.pt
  tensorscope diff model.pt model.safetensors --atol 1e-6 --rtol 0
  tensorscope diff ddp_checkpoint.pt model.safetensors --only-changed --limit 20
  tensorscope diff a.pt b.pt --map encoder.=model.encoder. --strip-prefix backbone.
  tensorscope diff a.onnx b.onnx --no-values --json
"""


def _map_arg(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old:
        raise argparse.ArgumentTypeError(f"expected OLD=NEW, got {text!r}")
    return old, new


def add_arguments(p):
    p.add_argument("a", help="first model (file or folder)")
    p.add_argument("b", help="second model (file or folder)")
    p.add_argument("--atol", type=float, default=1e-8, metavar="X",
                   help="absolute tolerance (default 1e-8, as torch.allclose)")
    p.add_argument("--rtol", type=float, default=1e-5, metavar="Y",
                   help="relative tolerance (default 1e-5, as torch.allclose)")
    p.add_argument("--only-changed", action="store_true",
                   help="leave out tensors that are the same (in the table and the JSON entries)")
    p.add_argument("--no-values", action="store_true",
                   help="compare names, dtypes, shapes and layout only; read no tensor bytes")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in README)")
    p.add_argument("--strip-prefix", metavar="P", action="append", default=[],
                   help="remove this prefix from names on both sides before aligning (repeatable)")
    p.add_argument("--map", metavar="OLD=NEW", action="append", default=[], type=_map_arg,
                   help="rewrite a leading OLD into NEW in names on both sides (repeatable)")
    p.add_argument("--no-detect-prefix", action="store_true",
                   help="do not look for wrapper prefixes (module., _orig_mod., ...)")
    p.add_argument("--no-renames", action="store_true",
                   help="do not pair removed and added tensors by content")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="show at most N tensors")


def run(args) -> int:
    with open_model(args.a) as ma, open_model(args.b) as mb:
        total = 0 if args.no_values else ma.total_bytes + mb.total_bytes
        with progress(total, "diff") as advance:
            from ..diffing import diff_models  # numpy loads only when a diff runs
            result = diff_models(ma, mb, atol=args.atol, rtol=args.rtol, values=not args.no_values,
                                 strip_prefix=args.strip_prefix, maps=args.map,
                                 detect_prefix=not args.no_detect_prefix,
                                 detect_renames=not args.no_renames, progress=advance)
    entries = ordered(result.entries)
    if args.only_changed:
        entries = [e for e in entries if e.status != "same" or e.changes]
    shown = entries[: args.limit] if args.limit > 0 else entries
    if args.json:
        doc = result.to_dict()
        doc["entries"] = [e.to_dict() for e in shown]
        emit_json(with_cost(doc))
    else:
        _print_human(result, shown, len(entries))
    return result.exit_code


def ordered(entries: list[TensorDiff]) -> list[TensorDiff]:
    """Largest change first: structural changes (added, removed, renamed, dtype, shape), then value
    changes, then the rest, each by max_abs descending; ties keep the model's order."""
    def key(item):
        i, e = item
        if e.structural:
            rank = 0
        elif e.status == "changed":
            rank = 1
        elif e.changes:
            rank = 2  # layout only
        else:
            rank = 3
        m = e.values.max_abs if e.values is not None and e.values.max_abs is not None else -1.0
        if m != m:  # NaN sorts first among its rank
            m = float("inf")
        return (rank, -m, i)
    return [e for _, e in sorted(enumerate(entries), key=key)]


def _g(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}"


_STYLE = {"same": "green", "changed": "red", "added": "cyan", "removed": "magenta",
          "renamed": "yellow"}


def _change_text(e: TensorDiff) -> str:
    if e.status == "added":
        return f"{e.b.dtype} {list(e.b.shape)}"
    if e.status == "removed":
        return f"{e.a.dtype} {list(e.a.shape)}"
    if e.status == "renamed":
        return f"-> {e.name_b}"
    parts = [c for c in e.changes if c != "values"]
    v = e.values
    if v is not None and "values" in e.changes:
        parts.append("values" if v.mismatched is None else f"values: {v.mismatched:,} of {v.numel:,}")
        if v.nan_mismatch or v.inf_mismatch:
            parts.append(f"nan {v.nan_mismatch:,} inf {v.inf_mismatch:,}")
    elif v is not None and v.identical_bytes:
        parts.append("identical")
    elif v is not None:
        parts.append("within tolerance")
    return "; ".join(parts)


def _print_human(result: DiffResult, shown: list[TensorDiff], total_rows: int) -> None:
    from rich.markup import escape
    from rich.table import Table
    console = stdout_console()
    for side, path, fmt, prefix in (("A", result.a_path, result.a_format, result.prefix_a),
                                    ("B", result.b_path, result.b_format, result.prefix_b)):
        note = f"   [yellow]wrapper prefix {escape(repr(prefix))} stripped[/]" if prefix else ""
        console.print(f"[bold]{side}[/] {escape(str(path))} ({escape(fmt)}){note}")
    c = result.counts
    verdict = "[green]same[/]" if result.identical else "[red]different[/]"
    console.print(f"{verdict}: {c['same']} same, {c['changed']} changed, {c['added']} added, "
                  f"{c['removed']} removed, {c['renamed']} renamed"
                  f"   (atol {result.atol:g}, rtol {result.rtol:g}"
                  f"{'' if result.values_compared else ', values not compared'})")
    if shown:
        table = Table(box=None, header_style="bold", pad_edge=False)
        table.add_column("status")
        table.add_column("name", overflow="fold")
        table.add_column("change", overflow="fold")
        for col in ("max_abs", "max_rel", "mean_abs", "cosine"):
            table.add_column(col, justify="right")
        for e in shown:
            v = e.values
            stats = ["-"] * 4 if v is None or v.identical_bytes else \
                [_g(v.max_abs), _g(v.max_rel), _g(v.mean_abs), _g(v.cosine, 6)]
            table.add_row(f"[{_STYLE[e.status]}]{e.status}[/]", escape(e.name),
                          escape(_change_text(e)), *stats)
        console.print(table)
    if len(shown) < total_rows:
        console.print(f"… {total_rows - len(shown)} more tensors (--limit)")
    if result.metadata:
        console.print("[bold]metadata differences[/] (not counted in the exit status)")
        meta = Table(box=None, header_style="bold", pad_edge=False)
        meta.add_column("key", overflow="fold")
        meta.add_column("A", overflow="fold")
        meta.add_column("B", overflow="fold")
        for key, va, vb in result.metadata:
            meta.add_row(escape(str(key)), escape(_short(va)), escape(_short(vb)))
        console.print(meta)


def _short(v) -> str:
    text = "(absent)" if v is None else str(v)
    return text if len(text) <= 80 else text[:77] + "..."
