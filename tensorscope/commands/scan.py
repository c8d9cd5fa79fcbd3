"""`tensorscope scan PATH...`: static safety scan of untrusted model files."""
from __future__ import annotations

from ..remote import is_url, with_cost
from ..render import emit_json, error_line, plural, stderr_console, stdout_console
from ..safetext import shown
from . import scan_pipeline

HELP = "statically scan model files for code that loading would run (nothing is executed)"
DESCRIPTION = """\
Scan files and folders for what loading them would run: every pickle anywhere (torch zips,
legacy streams, TorchScript archives, .npy object arrays, plain and compressed pickles, nested
archives, second-stage payloads), judged by an allowlist of what a weights-only load needs;
zip tricks that make readers disagree; misleading extensions; TorchScript code calling outside
torch; ONNX external data leaving the model's folder and custom-op domains. Nothing from the
files is executed or imported. A file that cannot be parsed is never reported clean.

Every rule (id, severity, why) is listed by --list-rules; the JSON schema is in
tensorscope/scanning/report.py.

Exit status: 0 no finding at or above --fail-on, 1 findings, 2 error (a path that does not
exist, or nothing to scan: an empty folder, a folder without model files).

Example:
  tensorscope scan model.pt
  tensorscope scan ~/.cache/huggingface/hub/models--org--name
  tensorscope scan checkpoints/ --fail-on high
  tensorscope scan model.bin --json > report.json
  tensorscope scan . --sarif > scan.sarif
  tensorscope scan --list-rules
  tensorscope scan https://example.org/model.safetensors hf://org/name s3://bucket/model.pt
  tensorscope scan registry/ --jobs 8 --jsonl report.jsonl
  tensorscope scan registry/ --jobs 8 --jsonl report.jsonl --resume report.jsonl
  tensorscope scan s3://bucket/models --dask tcp://scheduler:8786 --jsonl report.jsonl
  tensorscope scan models/ --ignore pickle.user-class:models/sklearn/*.pkl --severity zip.comment=info
  tensorscope scan models/ --write-baseline baseline.json; tensorscope scan models/ --baseline baseline.json
  tensorscope scan models/ --sarif --output scan.sarif --sbom models.cdx.json
Configuration ([tool.tensorscope.scan] in pyproject.toml, tensorscope.toml), suppressions,
baselines and the SBOM: docs/scan-ci.md.
"""

SEVERITY_STYLES = {"info": "dim", "low": "cyan", "medium": "yellow", "high": "bold red",
                   "critical": "bold white on red"}


def add_arguments(p):
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or folders to scan")
    p.add_argument("--list-rules", action="store_true",
                   help="print every rule (id, default severity, title) and exit; with --json, "
                        "with the rationale and references")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="machine-readable report (schema: tensorscope.scan/1)")
    out.add_argument("--sarif", action="store_true", help="SARIF 2.1.0 report (code scanning)")
    p.add_argument("--fail-on", default=None, metavar="SEVERITY",
                   choices=["info", "low", "medium", "high", "critical"],
                   help="exit 1 when a finding reaches this severity (default: the "
                        "configuration's fail-on, else medium)")
    p.add_argument("--min-severity", default="low", metavar="SEVERITY",
                   choices=["info", "low", "medium", "high", "critical"],
                   help="hide findings below this severity in the table (default: low; "
                        "info lists every framework global seen)")
    p.add_argument("--no-recursive", action="store_true", help="do not descend into sub-folders")
    fleet = p.add_argument_group("many files (tensorscope.scanning.fleet)")
    fleet.add_argument("--jobs", type=int, default=1, metavar="N",
                       help="scan on N processes (default 1); verdicts as a sequential scan")
    fleet.add_argument("--dask", metavar="ADDRESS",
                       help="scan on the Dask cluster at ADDRESS ('local': start a LocalCluster; "
                            "needs tensorscope[distributed])")
    fleet.add_argument("--jsonl", metavar="FILE",
                       help="write one JSON object per file as it finishes ('-': stdout, "
                            "instead of the table); to a FILE, stdout stays quiet (the summary "
                            "line goes to stderr) unless --json, --sarif or --table asks")
    fleet.add_argument("--table", action="store_true",
                       help="with --jsonl FILE: print the findings table on stdout as well")
    fleet.add_argument("--resume", metavar="REPORT.jsonl",
                       help="skip files whose size and ETag/mtime equal their line in this "
                            "report (give the same FILE to --jsonl to append to it)")
    scan_pipeline.add_arguments(p)


def run(args) -> int:
    import os

    from ..scanning import Severity, scan_paths
    if args.list_rules:
        return _list_rules(args.json)
    if not args.paths:
        return error_line("scan", "no PATH given (or use --list-rules)")
    for p in args.paths:
        if not is_url(p) and not os.path.lexists(p):
            return error_line("scan", f"{p}: no such file or directory")
    if args.jobs < 1:
        return error_line("scan", "--jobs must be at least 1")
    pipe = scan_pipeline.Pipeline.prepare(args)
    if isinstance(pipe, int):
        return pipe
    if args.jobs > 1 or args.dask or args.jsonl or args.resume or pipe.inventory:
        from ..scanning.fleet import scan_fleet
        report = scan_fleet(args.paths, recursive=not args.no_recursive, jobs=args.jobs,
                            dask=args.dask, jsonl=args.jsonl, resume=args.resume,
                            inventory=pipe.inventory, on_record=pipe.on_record)
    else:
        report = scan_paths(*args.paths, recursive=not args.no_recursive)
    if not report.files:
        # Nothing was scanned (an empty or mistyped folder): that must not pass a CI gate.
        skipped = "" if not report.findings else \
            f" ({len(report.findings)} walk finding{'s' if len(report.findings) != 1 else ''}: " \
            + "; ".join(str(f) for f in report.findings[:3]) + ")"
        return error_line("scan", f"nothing to scan in {', '.join(args.paths)}: no model file "
                                  f"found{skipped}")
    report = pipe.judge(report)   # suppressions, severities, baseline; writes baseline and SBOM
    if isinstance(report, int):
        return report
    fail_on = Severity.parse(pipe.fail_on())
    min_severity = Severity.parse(args.min_severity)
    with pipe.output():
        if args.json:
            emit_json(with_cost(report.to_dict()))
        elif args.sarif:
            emit_json(report.to_sarif())
        elif args.jsonl == "-":
            pass   # the JSON lines already written are the output
        elif args.jsonl and not args.table and not args.output:
            # the records went to the file; a person still hears how it went, on stderr
            stderr_console().print(_summary(report, min_severity, args))
        else:
            _print_table(report, min_severity, args)
    return report.exit_code(fail_on)


def _list_rules(as_json: bool) -> int:
    from rich.table import Table
    from rich.text import Text

    from ..scanning.rules import RULES, SEVERITY_MEANING, listing
    if as_json:
        emit_json({"schema": "tensorscope.scan-rules/1",
                   "severities": {str(k): v for k, v in SEVERITY_MEANING.items()}, "rules": [
            {"id": r.id, "severity": str(r.severity), "title": r.title, "rationale": r.rationale,
             "references": list(r.references), "variants": {k: str(v) for k, v in r.variants.items()}}
            for r in sorted(RULES.values(), key=lambda r: r.id)]})
        return 0
    meaning = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("severity", "loading the file ..."):
        meaning.add_column(col, overflow="fold")
    for sev, text in SEVERITY_MEANING.items():
        meaning.add_row(Text(str(sev), style=SEVERITY_STYLES.get(str(sev), "")), Text(text))
    stdout_console().print(meaning)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in ("rule", "severity", "title", "context"):
        table.add_column(col, overflow="fold")
    for rid, sev, title, var in listing():
        table.add_row(Text(rid), Text(sev, style=SEVERITY_STYLES.get(sev, "")), Text(title), Text(var))
    stdout_console().print(table)
    return 0


def _print_table(report, min_severity, args=None) -> None:
    from rich.table import Table
    from rich.text import Text

    console = stdout_console()
    rows = [f for f in report.findings if f.severity >= min_severity]
    if rows:
        table = Table(show_header=True, header_style="bold", expand=False, show_lines=False,
                      box=None, pad_edge=False)
        for col in ("severity", "rule", "where", "trigger", "reason"):
            table.add_column(col, overflow="fold")
        for f in rows:
            sev = str(f.severity)
            where = shown(f.file + (f":{f.member}" if f.member else ""))
            if f.offset is not None:
                where += f" @{f.offset}" + ("" if f.offset_base == "file" else " (in member)")
            # Text objects: names and messages come from the file and are never read as markup.
            # and control characters in them are shown escaped (safetext), never sent raw.
            table.add_row(Text(sev, style=SEVERITY_STYLES.get(sev, "")), Text(f.rule),
                          Text(where), Text(shown(f.trigger or "")), Text(shown(f.message)))
        console.print(table)
    console.print(_summary(report, min_severity, args))


def _summary(report, min_severity, args=None):
    """One line: how many files (the same count as the --jsonl records), what was found, the
    verdict."""
    from rich.text import Text

    rows = [f for f in report.findings if f.severity >= min_severity]
    n, models = max(report.read, len(report.files)), len(report.files)
    summary = Text()
    kinds = f" ({models:,} of them model file{'s' if models != 1 else ''})" if models != n else ""
    if report.resumed:
        since = shown(getattr(args, "resume", None) or "the --resume report")
        summary.append(f"{plural(n, 'file')}{kinds}: {n - report.resumed:,} scanned, "
                       f"{report.resumed:,} unchanged since {since} (not read again, their "
                       "findings kept)")
    else:
        summary.append(f"{plural(n, 'file')} scanned{kinds}")
    summary.append(", ")
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
    hidden = len(report.findings) - len(rows)
    if hidden:
        summary.append(f" ({hidden} below {min_severity} hidden)", style="dim")
    suppressed = len(getattr(report, "suppressed", ()))
    if suppressed:
        summary.append(f", {suppressed} suppressed", style="dim")
    return summary
