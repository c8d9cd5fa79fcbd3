"""Scan settings for pipelines: a team records a decision once (a rule accepted for a path, a
severity changed) and the gate keeps every other verdict.

Where settings come from, first found wins: ``--config FILE``; else, from the scanned path upwards,
a ``tensorscope.toml`` (table ``[scan]``, or ``[tool.tensorscope.scan]``) or a ``pyproject.toml``
with a ``[tool.tensorscope.scan]`` table (one without it is passed over, as ruff does). Keys::

    fail-on = "high"                                # the --fail-on default
    ignore = ["pickle.user-class", {rule = "zip.comment", reason = "our exporter writes one"}]
    per-path-ignores = {"models/sklearn/*.joblib" = ["pickle.unknown-call"]}
    severity = {"zip.comment" = "info"}
    reasons = {"pickle.unknown-call" = "reviewed pipeline, PR #412"}   # reason per ignored rule

Globs are relative to the config file's folder (``*`` stays in one folder, ``**`` crosses them; a
pattern without ``/`` also matches the file's name anywhere). The command line adds
``--ignore RULE[:GLOB]`` (globs relative to the working folder) and ``--severity RULE=LEVEL``.
An unknown key, rule id or level is an error (`SettingsError`, exit 2), never passed over.

What a suppression may hide: a suppressed finding is never dropped (`JudgedReport.suppressed`,
JSON ``suppressed``, SARIF ``suppressions``, the table's count). A CRITICAL finding is hidden only
by an ignore that names its rule and its file, literally (no wildcard): a repository-wide ignore, a
glob, or a severity override cannot lower or hide it (`JudgedReport.refused` says which tried).
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import TensorscopeError
from ..remote import is_url
from .report import Finding, ScanReport, Severity

__all__ = ["SettingsError", "Suppression", "ScanSettings", "find_config", "load_settings",
           "apply_settings", "JudgedReport"]

KEYS = ("fail-on", "ignore", "per-path-ignores", "severity", "reasons")
_MAGIC = re.compile(r"[*?\[]")


class SettingsError(TensorscopeError):
    """A configuration or flag that cannot be honoured (exit 2, one line naming the key)."""


@dataclass(frozen=True)
class Suppression:
    """One accepted rule: everywhere (``glob`` None) or for the files ``glob`` matches, globs
    read from ``base``. ``source`` says where it was written (``pyproject.toml: per-path-ignores``,
    ``--ignore``, ``baseline b.json``)."""

    rule: str
    glob: str | None
    reason: str
    source: str
    base: str = "."
    kind: str = "config"           # config | command-line | baseline

    def matches(self, path: str) -> bool:
        if self.glob is None:
            return True
        if is_url(path):
            return _glob_re(self.glob).fullmatch(path) is not None
        rel = _rel(path, self.base)
        rx = _glob_re(self.glob)
        return bool(rx.fullmatch(rel) or ("/" not in self.glob.strip("/")
                                          and rx.fullmatch(rel.rsplit("/", 1)[-1])))

    def names(self, path: str) -> bool:
        """The glob names ``path`` itself, literally: what hiding a CRITICAL finding takes."""
        if self.glob is None or _MAGIC.search(self.glob):
            return False
        if is_url(path):
            return self.glob == path
        return os.path.abspath(os.path.join(self.base, self.glob)) == os.path.abspath(path)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "source": self.source,
                "rule": self.rule, "path": self.glob}


@dataclass
class ScanSettings:
    """What the configuration and flags say. ``config`` is the file read (None: none)."""

    config: str | None = None
    fail_on: Severity | None = None
    suppressions: list[Suppression] = field(default_factory=list)
    severity: dict[str, tuple[Severity, str]] = field(default_factory=dict)  # rule -> (level, source)
    reasons: dict[str, str] = field(default_factory=dict)   # the file's reasons table


# ---------------------------------------------------------------------------------------------
# Finding and reading the configuration

def find_config(start: str, _memo: dict | None = None) -> str | None:
    """The configuration that applies to ``start`` (a file or folder): the nearest folder, from
    ``start`` upwards, holding a ``tensorscope.toml`` or a ``pyproject.toml`` with
    ``[tool.tensorscope.scan]``; None when there is none. ``_memo`` (folder -> answer) spares
    the walk for the many files of one folder (pre-commit passes each staged file)."""
    memo = {} if _memo is None else _memo
    cur = os.path.abspath(start)
    if not os.path.isdir(cur):
        cur = os.path.dirname(cur)
    seen = []
    found = None
    while True:
        if cur in memo:
            found = memo[cur]
            break
        seen.append(cur)
        own = os.path.join(cur, "tensorscope.toml")
        py = os.path.join(cur, "pyproject.toml")
        if os.path.isfile(own):
            found = own
            break
        if os.path.isfile(py) and _has_scan_table(py):
            found = py
            break
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    for d in seen:
        memo[d] = found
    return found


def _has_scan_table(path: str) -> bool:
    try:
        doc = _read_toml(path)
    except SettingsError:
        return True    # a broken pyproject.toml is reported, not passed over
    tool = doc.get("tool")
    return isinstance(tool, dict) and isinstance(tool.get("tensorscope"), dict)


def _read_toml(path: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise SettingsError(f"{path}: cannot read: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from None


def _scan_table(path: str) -> tuple[dict[str, Any], str]:
    """The scan table of a configuration file and the name it goes by in messages."""
    doc = _read_toml(path)
    name = os.path.basename(path)
    if "tool" in doc or name == "pyproject.toml":
        tool = doc.get("tool", {})
        ts = tool.get("tensorscope") if isinstance(tool, dict) else None
        if ts is None:
            if name == "pyproject.toml":
                raise SettingsError(f"{path}: no [tool.tensorscope.scan] table")
            ts = {}
        where = "[tool.tensorscope]"
        rest = {k: v for k, v in doc.items() if k != "tool"} if name != "pyproject.toml" else {}
    else:
        ts, where, rest = doc, "", {}
    for k in rest:
        raise SettingsError(f"{path}: unknown key {k!r} (expected [scan] or [tool.tensorscope.scan])")
    if not isinstance(ts, dict):
        raise SettingsError(f"{path}: {where or 'the file'} must be a table")
    for k in ts:
        if k != "scan":
            raise SettingsError(f"{path}: {where} unknown key {k!r} (known: scan)")
    table = ts.get("scan", {})
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: {where}.scan must be a table")
    return table, f"{name} [{(where.strip('[]') + '.' if where else '')}scan]"


def load_settings(*, paths: list[str], config: str | None = None, isolated: bool = False,
                  ignores: list[str] = (), severities: list[str] = ()) -> ScanSettings:
    """The settings for a scan of ``paths``: the configuration file (``config``, else the one
    found from the paths upwards, none when ``isolated``) and then the command line's
    ``--ignore`` and ``--severity`` values. Raises `SettingsError`."""
    from .rules import RULES
    out = ScanSettings()
    if config is None and not isolated:
        memo: dict = {}
        found = {find_config(p if not is_url(p) else os.getcwd(), memo) for p in paths or ["."]}
        found.discard(None)
        if len(found) > 1:
            raise SettingsError("the paths have different configurations ("
                                + ", ".join(sorted(found)) + "): give one with --config FILE")
        config = found.pop() if found else None
    if config is not None:
        if not os.path.isfile(config):
            raise SettingsError(f"{config}: no such configuration file")
        out.config = config
        table, where = _scan_table(config)
        _from_table(out, table, where, os.path.dirname(os.path.abspath(config)), RULES)
    cwd = os.getcwd()
    for text in ignores:
        rule, _, glob = text.partition(":")
        _check_rule(rule, "--ignore", RULES)
        if _ and not glob:
            raise SettingsError(f"--ignore {text!r}: empty path after ':'")
        reason = out.reasons.get(rule) or "accepted on the command line (--ignore)"
        out.suppressions.append(Suppression(rule, glob or None, reason, "--ignore", cwd,
                                            "command-line"))
    for text in severities:
        rule, eq, level = text.partition("=")
        if not eq:
            raise SettingsError(f"--severity {text!r}: expected RULE=LEVEL")
        _check_rule(rule, "--severity", RULES)
        out.severity[rule] = (_level(level, f"--severity {rule}"), "--severity")
    return out


def _from_table(out: ScanSettings, table: dict, where: str, base: str, rules) -> None:
    for k in table:
        if k not in KEYS:
            near = difflib.get_close_matches(str(k), KEYS, n=1)
            raise SettingsError(f"{where}: unknown key {k!r}"
                                + (f" (did you mean {near[0]!r}?)" if near else
                                   f" (known: {', '.join(KEYS)})"))
    reasons = table.get("reasons", {})
    if not isinstance(reasons, dict):
        raise SettingsError(f"{where} reasons: expected a table of RULE = \"reason\"")
    for rule, text in reasons.items():
        _check_rule(rule, f"{where} reasons", rules)
        if not isinstance(text, str):
            raise SettingsError(f"{where} reasons.{rule}: expected a string")
        out.reasons[rule] = text
    if "fail-on" in table:
        out.fail_on = _level(table["fail-on"], f"{where} fail-on")

    def entries(value, key):
        if not isinstance(value, list):
            raise SettingsError(f"{where} {key}: expected a list of rule ids")
        for item in value:
            if isinstance(item, str):
                rule, reason = item, None
            elif isinstance(item, dict):
                extra = set(item) - {"rule", "reason"}
                if extra or "rule" not in item:
                    raise SettingsError(f"{where} {key}: an entry takes rule and reason, got "
                                        + ", ".join(repr(k) for k in item))
                rule, reason = item["rule"], item.get("reason")
                if reason is not None and not isinstance(reason, str):
                    raise SettingsError(f"{where} {key}: reason of {rule!r} must be a string")
            else:
                raise SettingsError(f"{where} {key}: {item!r} is not a rule id")
            _check_rule(rule, f"{where} {key}", rules)
            yield rule, reason or reasons.get(rule) or f"accepted in {where}"

    for rule, reason in entries(table.get("ignore", []), "ignore"):
        out.suppressions.append(Suppression(rule, None, reason, f"{where} ignore", base))
    ppi = table.get("per-path-ignores", {})
    if not isinstance(ppi, dict):
        raise SettingsError(f"{where} per-path-ignores: expected a table of \"GLOB\" = [rule ids]")
    for glob, value in ppi.items():
        if not glob:
            raise SettingsError(f"{where} per-path-ignores: an empty path")
        for rule, reason in entries(value, f"per-path-ignores.{glob!r}"):
            out.suppressions.append(Suppression(rule, glob, reason, f"{where} per-path-ignores",
                                                base))
    sev = table.get("severity", {})
    if not isinstance(sev, dict):
        raise SettingsError(f"{where} severity: expected a table of RULE = \"LEVEL\"")
    for rule, level in sev.items():
        _check_rule(rule, f"{where} severity", rules)
        out.severity[rule] = (_level(level, f"{where} severity.{rule}"), f"{where} severity")


def _check_rule(rule, where: str, rules) -> None:
    if not isinstance(rule, str) or rule not in rules:
        near = difflib.get_close_matches(str(rule), list(rules), n=1)
        raise SettingsError(f"{where}: unknown rule id {rule!r}"
                            + (f" (did you mean {near[0]!r}?)" if near else
                               " (tensorscope scan --list-rules lists them)"))


def _level(value, where: str) -> Severity:
    try:
        return Severity.parse(value if isinstance(value, str) else repr(value))
    except ValueError as e:
        raise SettingsError(f"{where}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Globs: '*' and '?' within a folder, '**' across folders, [...] classes

_GLOB_CACHE: dict[str, re.Pattern] = {}


def _glob_re(glob: str) -> re.Pattern:
    rx = _GLOB_CACHE.get(glob)
    if rx is None:
        g, i, out = glob.replace(os.sep, "/"), 0, []
        g = g[2:] if g.startswith("./") else g
        while i < len(g):
            c = g[i]
            if g.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
                continue
            if g.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            if c == "*":
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "[":
                j = g.find("]", i + 2 if g.startswith("[!", i) else i + 1)
                if j < 0:
                    out.append(re.escape(c))
                else:
                    body = g[i + 1:j]
                    body = "^" + body[1:] if body.startswith("!") else body
                    out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                    i = j
            else:
                out.append(re.escape(c))
            i += 1
        rx = _GLOB_CACHE[glob] = re.compile("".join(out))
    return rx


def _rel(path: str, base: str) -> str:
    try:
        rel = os.path.relpath(os.path.abspath(path), base)
    except ValueError:  # another drive
        rel = os.path.abspath(path)
    return rel.replace(os.sep, "/")


# ---------------------------------------------------------------------------------------------
# Applying them

@dataclass
class JudgedReport(ScanReport):
    """A `ScanReport` after the settings: ``findings`` are the active ones (what the exit code,
    counts and verdict are made of); ``suppressed`` holds (finding, `Suppression`) for every
    finding an ignore or a baseline accepted; ``refused`` one line per suppression or override
    that was not allowed to hide a CRITICAL finding."""

    suppressed: list[tuple[Finding, Suppression]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    config: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["suppressed"] = [{**f.to_dict(), "suppression": s.to_dict()} for f, s in self.suppressed]
        d["suppressions_refused"] = list(self.refused)
        d["config"] = self.config
        return d

    def to_sarif(self) -> dict[str, Any]:
        """SARIF with the suppressed findings as results carrying ``suppressions`` (what code
        scanning shows as dismissed, with the justification)."""
        every = ScanReport(findings=[*self.findings, *(f for f, _ in self.suppressed)],
                           files=self.files, errors=self.errors, read=self.read,
                           resumed=self.resumed)
        doc = every.to_sarif()
        results = doc["runs"][0]["results"]
        for res, (_, s) in zip(results[len(self.findings):], self.suppressed):
            res["suppressions"] = [{"kind": "external", "status": "accepted",
                                    "justification": s.reason,
                                    "properties": {"source": s.source, "tensorscopeKind": s.kind}}]
        return doc


def apply_settings(report: ScanReport, settings: ScanSettings,
                   extra: list[Suppression] | None = None,
                   accept=None) -> JudgedReport:
    """The report with severities overridden and suppressions applied. ``accept(finding)``, when
    given, returns a `Suppression` for a finding accepted by other means (a baseline) or None."""
    out = JudgedReport(files=list(report.files), errors=report.errors, read=report.read,
                       resumed=report.resumed, config=settings.config)
    by_rule: dict[str, list[Suppression]] = {}
    for s in [*settings.suppressions, *(extra or ())]:
        by_rule.setdefault(s.rule, []).append(s)
    refused: dict[str, None] = {}
    active: list[Finding] = []
    for f in report.findings:
        over = settings.severity.get(f.rule)
        if over is not None and over[0] != f.severity:
            if f.severity == Severity.CRITICAL:
                refused[f"{over[1]}: {f.rule} = {over[0]} does not lower a critical finding "
                        f"(in {f.file}); accept it for that file by name in per-path-ignores"] = None
            else:
                f = dataclasses.replace(f, severity=over[0])
        hit = None
        for s in by_rule.get(f.rule, ()):
            if not s.matches(f.file):
                continue
            if f.severity == Severity.CRITICAL and not s.names(f.file):
                refused[f"{s.source}: {s.rule}" + (f" for {s.glob!r}" if s.glob else "")
                        + f" does not hide a critical finding in {f.file}: name the rule and "
                          f"that file, without wildcards"] = None
                continue
            hit = s
            break
        if hit is None and accept is not None:
            hit = accept(f)
        if hit is None:
            active.append(f)
        else:
            out.suppressed.append((f, hit))
    from .report import sort_findings
    out.findings = sort_findings(active)
    out.refused = list(refused)
    return out
