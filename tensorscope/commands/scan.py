"""`tensorscope scan PATH...`: static safety scan of untrusted model files."""
from __future__ import annotations

from ..render import emit_json, error_line, stdout_console

HELP = "statically scan model files for code that loading would run (nothing is executed)"
DESCRIPTION = """\
Scan files and folders for what loading them would run: every pickle anywhere (torch zips,
legacy streams, TorchScript archives, .npy object arrays, plain and compressed pickles, nested
archives, second-stage payloads), judged by an allowlist of what a weights-only load needs;
zip tricks that make readers disagree; misleading extensions; TorchScript code calling outside
torch; ONNX external data leaving the model's folder and custom-op domains. Nothing from the
files is executed or imported. A file that cannot be parsed is never reported clean.

Exit status: 0 no finding at or above --fail-on, 1 findings, 2 usage error (bad path).

Example:
  tensorscope scan model.pt
  tensorscope scan ~/.cache/huggingface/hub/models--org--name
  tensorscope scan checkpoints/ --fail-on high
  tensorscope scan model.bin --json > report.json
  tensorscope scan . --sarif > scan.sarif
"""

SEVERITY_STYLES = {"info": "dim", "low": "cyan", "medium": "yellow", "high": "bold red",
                   "critical": "bold white on red"}


def add_arguments(p):
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or folders to scan")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="machine-readable report (schema: tensorscope.scan/1)")
    out.add_argument("--sarif", action="store_true", help="SARIF 2.1.0 report (code scanning)")
    p.add_argument("--fail-on", default="medium", metavar="SEVERITY",
                   choices=["info", "low", "medium", "high", "critical"],
                   help="exit 1 when a finding reaches this severity (default: medium)")
    p.add_argument("--min-severity", default="low", metavar="SEVERITY",
                   choices=["info", "low", "medium", "high", "critical"],
                   help="hide findings below this severity in the table (default: low; "
                        "info lists every framework global seen)")
    p.add_argument("--no-recursive", action="store_true", help="do not descend into sub-folders")


def run(args) -> int:
    import os

    from ..scanner import Severity, scan_paths
    for p in args.paths:
        if not os.path.lexists(p):
            return error_line("scan", f"{p}: no such file or directory")
    report = scan_paths(*args.paths, recursive=not args.no_recursive)
    fail_on = Severity.parse(args.fail_on)
    if args.json:
        emit_json(report.to_dict())
    elif args.sarif:
        emit_json(report.to_sarif())
    else:
        _print_table(report, Severity.parse(args.min_severity))
    return report.exit_code(fail_on)


def _print_table(report, min_severity) -> None:
    from rich.table import Table
    from rich.text import Text

    console = stdout_console()
    shown = [f for f in report.findings if f.severity >= min_severity]
    if shown:
        table = Table(show_header=True, header_style="bold", expand=False, show_lines=False,
                      box=None, pad_edge=False)
        for col in ("severity", "rule", "where", "trigger", "reason"):
            table.add_column(col, overflow="fold")
        for f in shown:
            sev = str(f.severity)
            where = f.file + (f":{f.member}" if f.member else "")
            if f.offset is not None:
                where += f" @{f.offset}" + ("" if f.offset_base == "file" else " (in member)")
            # Text objects: names and messages come from the file and are never read as markup.
            table.add_row(Text(sev, style=SEVERITY_STYLES.get(sev, "")), Text(f.rule),
                          Text(where), Text(f.trigger or ""), Text(f.message))
        console.print(table)
    n = len(report.files)
    summary = Text()
    summary.append(f"{n} file{'s' if n != 1 else ''} scanned, ")
    counts = report.counts()
    parts = [f"{counts[s]} {s}" for s in ("critical", "high", "medium", "low", "info") if counts[s]]
    summary.append(", ".join(parts) if parts else "no findings")
    if report.errors:
        summary.append(f", {report.errors} not fully parsed", style="red")
    if report.unsafe:
        summary.append(" — UNSAFE to load", style="bold red")
    elif report.findings and report.severity >= 2:
        summary.append(" — review before loading", style="yellow")
    else:
        summary.append(" — nothing found that loading would run", style="green")
    hidden = len(report.findings) - len(shown)
    if hidden:
        summary.append(f" ({hidden} below {min_severity} hidden)", style="dim")
    console.print(summary)
