"""Pages generated from the code, and the site's navigation (an MkDocs hook: ``mkdocs.yml`` ``hooks``).

Generated at build time, so they cannot fall behind the code:

- ``cli.md``: every subcommand's ``--help``, from the argparse parsers ``tensorscope.cli`` builds;
- ``rules.md``: every scan rule, from the registry ``tensorscope.scanning.rules.RULES``;
- ``schemas.md``: the hand-written ``inspect --json`` page plus the ``diff`` and ``scan`` schemas,
  read from the docstrings that define them (``tensorscope/diff_result.py``, ``tensorscope/scanning/report.py``).

The navigation lists every page of `NAV` that exists (written or generated), so a page another
change adds appears once its file is there, and a page not written yet is simply not listed.
``python docs/gen.py`` prints the generated pages (what ``tests/test_docs_site.py`` checks).
"""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (section, [(title, file)]): a file that does not exist is left out of the navigation.
NAV = [
    ("Home", [("Overview", "index.md"), ("Install", "install.md")]),
    ("Using it", [("Commands in depth", "commands.md"), ("Formats", "formats.md"),
                  ("Remote reading", "remote.md"), ("Graph", "graph.md"), ("Diff", "diff.md")]),
    ("Scanning", [("Scan", "scan.md"), ("Scanning text", "scan-text.md"),
                  ("Threat model", "threat-model.md"), ("Rules", "rules.md")]),
    ("Reference", [("CLI", "cli.md"), ("JSON schemas", "schemas.md"), ("Library API", "library.md")]),
    ("Internals", [("Contributing", "contributing.md"), ("Native code", "native.md"),
                   ("Remote transport", "remote-transport.md"), ("Performance", "performance.md"),
                   ("Benchmarks", "benchmarks.md")]),
]

HELP_WIDTH = 100  # fixed, so the page does not depend on the terminal that built it


def cli_reference() -> str:
    from tensorscope import cli

    parser = cli.build_parser()
    out = ["# CLI reference", "",
           "Generated from the argparse parsers (`tensorscope.cli.build_parser`): what "
           "`tensorscope COMMAND --help` prints.", ""]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out += ["```text", _help(parser).rstrip(), "```", ""]
    for name in cli.COMMANDS:
        p = sub.choices[name]
        out += [f"## `tensorscope {name}`", "", "```text", _help(p).rstrip(), "```", ""]
    return "\n".join(out)


def _help(parser: argparse.ArgumentParser) -> str:
    fmt_class = parser.formatter_class
    parser.formatter_class = lambda prog: fmt_class(prog, width=HELP_WIDTH)
    try:
        return parser.format_help()
    finally:
        parser.formatter_class = fmt_class


def rules_reference() -> str:
    from tensorscope.scanning.rules import ANOMALIES, RULES

    by_rule: dict[str, list[str]] = {}
    for kind, rid in ANOMALIES.items():
        by_rule.setdefault(rid, []).append(kind)
    out = ["# Scan rules", "",
           "Generated from the rule registry (`tensorscope.scanning.rules.RULES`); "
           "`tensorscope scan --list-rules` prints the same table, `--json` with the rationale.", "",
           "| rule | severity | title |", "|---|---|---|"]
    ordered = sorted(RULES.values(), key=lambda r: (-int(r.severity), r.id))
    for r in ordered:
        out.append(f"| [`{r.id}`](#{_anchor(r.id)}) | {r.severity} | {_cell(r.title)} |")
    out.append("")
    for r in ordered:
        out += [f"## {r.id}", "", f"**{r.severity}**: {_md(r.title)}", "", _md(r.rationale), ""]
        if r.variants and r.id != "pickle.findings-capped":
            out += ["Severity by context: " + ", ".join(f"`{k}` {v}" for k, v in r.variants.items())
                    + ".", ""]
        if by_rule.get(r.id):
            out += ["Parser anomalies: " + ", ".join(f"`{k}`" for k in sorted(by_rule[r.id])) + ".", ""]
        if r.references:
            out += ["References: " + ", ".join(f"<{u}>" for u in r.references), ""]
    return "\n".join(out)


def _anchor(rule_id: str) -> str:  # what the toc extension makes of the heading "## a.b-c"
    return re.sub(r"[^\w\- ]", "", rule_id.lower()).replace(" ", "-")


def _md(text: str) -> str:
    return text.replace("<", "&lt;").replace("*", r"\*").replace("_", r"\_")


def _cell(text: str) -> str:
    return _md(text).replace("|", r"\|")


def schemas() -> str:
    page = (ROOT / "docs" / "schemas.md").read_text()
    for title, path in [("`diff --json`", "tensorscope/diff_result.py"),
                        ("`scan --json`", "tensorscope/scanning/report.py")]:
        page += f"\n## {title}\n\nFrom the docstring of `{path}`.\n\n" + _schema_section(ROOT / path)
    return page


def _schema_section(path: Path) -> str:
    """The docstring of ``path`` from its paragraph that starts "JSON schema", reST literal
    blocks (``::``) turned into fenced code."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    start = doc.find("JSON schema")
    lines = doc[start:].splitlines() if start >= 0 else []
    out, in_code = [], False
    for line in lines:
        if in_code and line and not line.startswith(" "):
            out.append("```")
            in_code = False
        if not in_code and line.rstrip().endswith("::"):
            out += [line.rstrip()[:-1], "", "```text"]
            in_code = True
            continue
        if in_code and not line.strip() and (not out or out[-1] == "```text"):
            continue
        out.append(line[4:] if in_code else line.replace("``", "`"))
    if in_code:
        out.append("```")
    return "\n".join(out) + "\n"


GENERATED = {"cli.md": cli_reference, "rules.md": rules_reference}


# --- the MkDocs hook -------------------------------------------------------------------------------
def on_config(config, **kwargs):
    docs = Path(config["docs_dir"])
    have = {p.name for p in docs.glob("*.md")} | set(GENERATED)
    config["nav"] = [{section: [{t: f} for t, f in pages if f in have]}
                     for section, pages in NAV if any(f in have for _, f in pages)]
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    for name, make in GENERATED.items():
        files.append(File.generated(config, name, content=make()))
    old = files.get_file_from_path("schemas.md")
    if old is not None:
        files.remove(old)
        files.append(File.generated(config, "schemas.md", content=schemas()))
    return files


if __name__ == "__main__":
    print(cli_reference())
    print(rules_reference())
    print(schemas())
