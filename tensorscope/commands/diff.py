"""`tensorscope diff A B`: compare two models of any formats down to the values."""
from __future__ import annotations

import argparse
import contextlib
import gc
from typing import TYPE_CHECKING

from .. import open as open_model
from ..remote import with_cost
from ..render import StyledOut, emit_json, opening, progress
from ..safetext import shown as shown_text

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

How is B related to A? Every tensor gets a verdict with its evidence (identical; the same
values in another dtype; A cast to B's dtype, saying which rounding; quantized within a step of
B's scheme; pruned, with the new sparsity; a low-rank update, with its rank; scaled;
re-initialised; unrelated; changed), and the pair one sentence: "B is A cast to bfloat16", "B is
A plus a rank-8 update on self_attn.q_proj and self_attn.v_proj of all 32 layers", "B and A are
unrelated models of the same architecture", with the share of parameters changed.

Where did the model change? Each pair also gets its relative change ||B-A||/||A||; --by layer or
--by module adds those up per layer (model.layers.3) or per module kind (self_attn.q_proj) as
sums of squares, with the share of parameters changed, ranked; --top N keeps the N largest
changed groups.

Exit status: 0 when every tensor is the same within tolerance, 1 when anything differs
(changed, added, removed, renamed), 2 on error. With --atol or --rtol given, a tensor whose
values are all within that tolerance is "same within tolerance" even when its dtype changed.
Metadata differences are shown, not counted; per-save ones (torch's serialization id and archive
name) only with -v.

Example:
  tensorscope diff old.pt new.pt
  tensorscope diff model.pt model.safetensors --atol 1e-6 --rtol 0
  tensorscope diff ddp_checkpoint.pt model.safetensors --only-changed --limit 20
  tensorscope diff a.pt b.pt --map encoder.=model.encoder. --strip-prefix backbone.
  tensorscope diff a.onnx b.onnx --no-values --json
  tensorscope diff base.safetensors finetune.safetensors --by layer --top 10
  tensorscope diff model.safetensors model-bf16.safetensors --rtol 0.004
  tensorscope diff https://host/model.safetensors local.safetensors --fetch-budget 4G
"""


GROUP_BY = ("layer", "module")  # diffing.GROUP_BY, spelled here so that --help needs no numpy


def _map_arg(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old:
        raise argparse.ArgumentTypeError(f"expected OLD=NEW, got {text!r}")
    return old, new


def _tolerance(label: str):
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{label} must be a number >= 0 such as 1e-6, "
                                             f"got {text!r}")
        if not x >= 0:   # also NaN
            raise argparse.ArgumentTypeError(f"{label} must be a number >= 0, got {x}")
        return x
    return parse


def _budget(text: str) -> int:
    from ..remote import parse_budget
    try:
        return parse_budget(text)
    except Exception:   # noqa: BLE001 - its message names the environment variable
        raise argparse.ArgumentTypeError(f"expected bytes like 512M or 4G, got {text!r}")


def add_arguments(p):
    p.add_argument("a", help="first model (file or folder)")
    p.add_argument("b", help="second model (file or folder)")
    p.add_argument("--atol", type=_tolerance("atol"), default=None, metavar="X",
                   help="absolute tolerance (default 1e-8, as torch.allclose); when given, "
                        "tensors within tolerance do not count as differences, even across dtypes")
    p.add_argument("--rtol", type=_tolerance("rtol"), default=None, metavar="Y",
                   help="relative tolerance (default 1e-5, as torch.allclose); as --atol")
    p.add_argument("--fetch-budget", type=_budget, default=None, metavar="BYTES",
                   help="most bytes to fetch per remote file (512M, 4G; default 1G, or "
                        "TENSORSCOPE_FETCH_BUDGET): a diff of a URL reads all of its tensors")
    p.add_argument("--only-changed", action="store_true",
                   help="leave out tensors that are the same (in the table and the JSON entries)")
    p.add_argument("--no-values", action="store_true",
                   help="compare names, dtypes, shapes and layout only; read no tensor bytes")
    p.add_argument("--no-verdicts", action="store_true",
                   help="the statistics only: no verdicts (no extra pass over any tensor)")
    p.add_argument("--json", action="store_true", help="machine-readable output (schema in README)")
    p.add_argument("--strip-prefix", metavar="P", action="append", default=[],
                   help="remove this prefix from names on both sides before aligning (repeatable)")
    p.add_argument("--map", metavar="OLD=NEW", action="append", default=[], type=_map_arg,
                   help="rewrite a leading OLD into NEW in names on both sides (repeatable)")
    p.add_argument("--no-detect-prefix", action="store_true",
                   help="do not look for wrapper prefixes (module., _orig_mod., ...)")
    p.add_argument("--no-renames", action="store_true",
                   help="do not pair removed and added tensors by content")
    p.add_argument("--limit", type=_positive, default=0, metavar="N", help="show at most N tensors")
    p.add_argument("--by", choices=GROUP_BY,
                   help="where the model changed: relative change ||B-A||/||A|| per layer "
                        "(model.layers.3) or per module kind (self_attn.q_proj), ranked")
    p.add_argument("--top", type=_positive, default=0, metavar="N",
                   help="only the N largest changes (tensors, or groups with --by), ranked by "
                        "relative change")
    p.add_argument("--all", action="store_true",
                   help=f"list every tensor even above {LARGE:,} (by default a large diff lists "
                        "only what differs, plus a summary per name pattern)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also show per-save metadata (torch's serialization_id, archive_prefix)")


LARGE = 2000  # above this many tensors the human output lists only what differs


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {n}")
    return n


def run(args) -> int:
    from ..remote import FetchBudgetExceeded
    gc_was = gc.isenabled()
    gc.disable()  # 100,000 records without cycles: collections would cost more than the diff
    try:
        return _run(args)
    except FetchBudgetExceeded as e:   # a diff reads every tensor: say how to allow it here
        raise FetchBudgetExceeded(e.url, f"{e.reason}; a diff reads all of its tensors: "
                                         f"--fetch-budget 4G allows more") from None
    finally:
        if gc_was:
            gc.enable()


def _run(args) -> int:
    # the records only: no object trees, no per-call evidence (~1 KB less per torch tensor)
    with contextlib.ExitStack() as stack:
        if getattr(args, "fetch_budget", None) is not None:
            stack.enter_context(_fetch_budget(args.fetch_budget))
        with opening(f"{shown_text(args.a)} and {shown_text(args.b)}"):
            ma = stack.enter_context(open_model(args.a, listing=True))
            mb = stack.enter_context(open_model(args.b, listing=True))
        total = 0 if args.no_values else ma.total_bytes + mb.total_bytes
        with progress(total, "diff") as advance:
            from ..diffing import diff_models  # numpy loads only when a diff runs
            result = diff_models(ma, mb, atol=args.atol, rtol=args.rtol, values=not args.no_values,
                                 strip_prefix=args.strip_prefix, maps=args.map,
                                 detect_prefix=not args.no_detect_prefix,
                                 detect_renames=not args.no_renames, progress=advance,
                                 norms=bool(args.by),
                                 verdicts=not getattr(args, "no_verdicts", False))
    from ..diffing import group_changes
    groups = group_changes(result.entries, args.by) if args.by else None
    entries = ordered(result.entries)
    if args.only_changed or args.top:
        entries = [e for e in entries if e.status != "same" or e.changes]
    limit = args.top or args.limit
    shown = entries[:limit] if limit else entries
    if groups is not None and args.top:   # the N largest CHANGES: unchanged groups fill no slot
        groups = [g for g in groups if g.changed or g.params_changed][:args.top]
    if args.json:
        _emit_json(result, shown, groups, args.by)
    else:
        hidden_same = 0
        if not (args.all or limit or args.only_changed) and len(result.entries) > LARGE:
            kept = [e for e in shown if e.status != "same" or e.changes]
            hidden_same, shown = len(shown) - len(kept), kept
        _print_human(result, shown, len(entries) - hidden_same, groups, args.by, hidden_same,
                     args.verbose)
    return result.exit_code


def _emit_json(result: DiffResult, shown: list[TensorDiff], groups, by) -> None:
    """The document, written as it is encoded: the entries one at a time (a 100,000-tensor diff
    is never one string in memory). Keys sorted, as `emit_json` writes them."""
    import json
    import sys
    doc = with_cost(result.to_dict(entries=False))  # "fetched" when remote objects were read
    if groups is not None:
        doc["by"] = by
        doc["groups"] = [g.to_dict() for g in groups]
    if sys.stdout.isatty():  # a person reading: indented, as every --json on a terminal
        doc["entries"] = [e.to_dict() for e in shown]
        emit_json(doc)
        return
    doc["entries"] = None
    out = sys.stdout
    keys = sorted(doc)
    out.write("{")
    for i, k in enumerate(keys):
        out.write(", " if i else "")
        out.write(json.dumps(k) + ": ")
        if k == "entries":
            out.write("[")
            for j, e in enumerate(shown):
                out.write((", " if j else "") + json.dumps(e.to_dict(), sort_keys=True,
                                                           default=str))
            out.write("]")
        else:
            out.write(json.dumps(doc[k], sort_keys=True, default=str))
    out.write("}\n")


@contextlib.contextmanager
def _fetch_budget(nbytes: int):
    """--fetch-budget: the remote reader's budget for this command (the library reads it from
    the environment when a source is opened; the CLI tunes itself, and puts it back)."""
    import os
    key = "TENSORSCOPE_FETCH_BUDGET"
    old = os.environ.get(key)
    os.environ[key] = str(int(nbytes))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def ordered(entries: list[TensorDiff]) -> list[TensorDiff]:
    """Largest change first (`tensorscope.diffing.ranked`)."""
    from ..diffing import ranked
    return ranked(entries)


def _g(v, digits: int = 4) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}"


_STYLE = {"same": "green", "changed": "red", "added": "cyan", "removed": "magenta",
          "renamed": "yellow"}


def _bar(frac: float, width: int = 20) -> str:
    n = 0 if frac != frac or frac <= 0 else max(1, round(min(frac, 1.0) * width))
    return "█" * n


def _print_human(result: DiffResult, shown: list[TensorDiff], total_rows: int, groups, by,
                 hidden_same: int, verbose: bool) -> None:
    from ..diffing import PER_SAVE_KEYS, reason
    out = StyledOut()   # Rich's layout; plain writes where Rich would add nothing (a pipe)
    for side, path, fmt, prefix in (("A", result.a_path, result.a_format, result.prefix_a),
                                    ("B", result.b_path, result.b_format, result.prefix_b)):
        note = ["   ", (f"wrapper prefix {shown_text(repr(prefix))} stripped", "yellow")] if prefix else []
        out.line((side, "bold"), f" {shown_text(path)} ({shown_text(fmt)})", *note)
    c = result.counts
    pv = result.verdict
    if pv is not None and pv.text:
        out.line(("verdict", "bold"), " " + shown_text(pv.text))
    verdict = ("same", "green") if result.exit_code == 0 else ("different", "red")
    within = sum(1 for e in result.entries if e.status != "same" and e.verdict is not None
                 and not e.verdict.differs)
    share = (f"; {_pct(pv.share_changed)} of {pv.params:,} parameters changed"
             if pv is not None and pv.params else "")
    out.line(verdict, f": {c['same']:,} same, {c['changed']:,} changed"
                      f"{f' ({within:,} within tolerance)' if within else ''}, {c['added']:,} added, "
                      f"{c['removed']:,} removed, {c['renamed']:,} renamed{share}"
                      f"   (atol {result.atol:g}, rtol {result.rtol:g}"
                      f"{'' if result.values_compared else ', values not compared'})")
    if groups is not None:
        _print_groups(out, groups, by)
    if shown and len(shown) > PLAIN_ROWS:
        _print_plain(shown)
    elif shown:
        out.table(["status", "name", "verdict", "change", "rel_change", "max_abs", "max_rel",
                   "cosine"], "llllrrrr",
                  [[(e.status, _STYLE[e.status]), shown_text(e.name), shown_text(_verdict(e)),
                    shown_text(reason(e)), *_stats(e)] for e in shown], fold="ffff")
    if hidden_same:
        out.line(f"{hidden_same:,} tensors the same, not listed (--all lists every tensor)")
        _print_patterns(out, result.entries)
    if len(shown) < total_rows:
        out.line(f"… {total_rows - len(shown):,} more tensors (--limit / --top)")
    meta = [m for m in result.metadata if verbose or m[0] not in PER_SAVE_KEYS]
    if meta:
        out.line(("metadata differences", "bold"), " (not counted in the exit status)")
        out.table(["key", "A", "B"], "lll",
                  [[shown_text(key), shown_text(_short(va)), shown_text(_short(vb))]
                   for key, va, vb in meta], fold="fff")
    noise = len(result.metadata) - len(meta)
    if noise:
        out.line((f"{noise} per-save metadata key{'s' if noise > 1 else ''} differ "
                  f"(serialization id, archive name): -v shows them", "dim"))


PLAIN_ROWS = 500  # above this, rows are written as plain aligned lines as they come (no table)


def _verdict(e: TensorDiff) -> str:
    return e.verdict.text if e.verdict is not None else ""


def _pct(x: float) -> str:
    p = 100 * x
    return f"{p:.1f}%" if p == 0 or p >= 1 else f"{p:.2g}%"


def _stats(e: TensorDiff) -> list[str]:
    v = e.values
    if v is None:
        return ["-"] * 4
    if v.identical_bytes:
        # identical values have cosine 1 whether or not their norms were read (--by reads them),
        # unless a side is known to be all zeros (then it is undefined)
        return ["0", "0", "0", "-" if v.norm_a == 0 else "1"]
    return [_g(v.rel_change), _g(v.max_abs), _g(v.max_rel), _g(v.cosine, 6)]


def _print_plain(shown: list[TensorDiff]) -> None:
    """Many rows: one plain line each, written as produced (a Rich table of 100,000 rows would
    be laid out whole before its first line)."""
    import sys
    from ..diffing import reason
    out = sys.stdout
    width = max(len(shown_text(e.name)) for e in shown[:2000])
    out.write(f"{'status':8} {'name':{width}} {'rel_change':>10} {'max_abs':>10} {'max_rel':>10} "
              f"{'cosine':>10}  verdict; change\n")
    for e in shown:
        out.write(f"{e.status:8} {shown_text(e.name):{width}} "
                  + " ".join(f"{x:>10}" for x in _stats(e))
                  + f"  {shown_text(_verdict(e))}; {shown_text(reason(e))}\n")


def _print_groups(out: StyledOut, groups, by: str) -> None:
    top = max((g.rel_change or 0.0 for g in groups), default=0.0)
    rows = []
    for g in groups:
        rel = g.rel_change
        note = f" ({g.unknown} not compared)" if g.unknown else ""
        rows.append([shown_text(g.key), f"{g.tensors:,}", f"{g.changed:,}{note}",
                     _pct(g.share_changed), _g(g.norm_a), _g(g.norm_diff), _g(rel),
                     (_bar(rel / top if rel is not None and top else 0.0), "red")])
    out.table([by, "tensors", "changed", "params changed", "||A||", "||B-A||", "rel_change", ""],
              "lrrrrrrl", rows, title=f"relative change ||B-A||/||A|| per {by}", fold="f")


def _print_patterns(out: StyledOut, entries: list[TensorDiff]) -> None:
    """One line per name pattern (``model.layers.#.mlp.experts.#.up_proj.weight``): how many
    tensors, how many differ."""
    from ..grouping import group_key
    pats: dict[str, list[int]] = {}
    for e in entries:
        info = e.a if e.a is not None else e.b
        k = group_key(e.name, info.path if info is not None and len(info.path) > 1 else ())
        p = pats.setdefault(k, [0, 0])
        p[0] += 1
        p[1] += e.status != "same"
    for k, (n, changed) in list(pats.items())[:50]:
        out.line(f"  {shown_text(k)} ×{n:,}: {changed:,} differ")
    if len(pats) > 50:
        out.line(f"  … {len(pats) - 50:,} more name patterns")


def _short(v) -> str:
    text = "(absent)" if v is None else str(v)
    return text if len(text) <= 80 else text[:77] + "..."
