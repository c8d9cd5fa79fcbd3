"""Scan results: `Severity`, `Finding`, one file's `FileReport`, the whole `ScanReport`, and their
JSON and SARIF forms.

JSON schema (`ScanReport.to_dict`, stable; new keys may be added, none removed)::

    {"schema": "tensorscope.scan/1",
     "files": [str, ...],                 # model files scanned
     "files_read": int,                   # every file read: these, and configs and text judged or
                                          # skipped (as many as the --jsonl records)
     "errors": int,                       # files that could not be read or parsed completely
     "severity": "critical"|...|null,     # worst finding
     "unsafe": bool,                      # any finding at HIGH or above
     "counts": {"critical": n, "high": n, "medium": n, "low": n, "info": n},
     "findings": [{"severity": str, "rule": str, "message": str, "file": str,
                   "member": str|null,   # archive member, "a.zip!inner.pt:archive/data.pkl" when nested
                   "offset": int|null,   # byte offset of the opcode/record
                   "offset_base": "file"|"member",  # absolute in file, or within the (decompressed) member
                   "trigger": str|null,  # the global or call, e.g. "os.system"
                   "line": int, "column": int}]}  # where the finding is in a text (only when known)

`FileReport.to_dict` is one file's part of it (schema ``tensorscope.scan-file/1``: ``file``,
``scanned``, ``error``, ``findings``), the unit a parallel or distributed scan streams.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from .rules import RULES, Severity


@dataclass(frozen=True)
class Finding:
    """One finding. Instances are immutable and hashable.

    Attributes:
        severity: a `Severity` (from the rule registry, `tensorscope.scanning.rules`).
        rule: stable rule id.
        message: one line saying what and why (may quote the file: show it through safetext).
        file: path of the scanned file.
        member: archive member (``!`` separates nesting levels), None for the file itself.
        offset: byte offset of the opcode/record, None when not known.
        trigger: the global or call that triggered the rule (``os.system``), None otherwise.
        offset_base: ``file`` when ``offset`` is absolute in the file, ``member`` when it counts
            within the (decompressed or nested) member.
        line, column: 1-based place in the text the finding is about (a config, TorchScript
            code), when it has one; in SARIF ``region.startLine``/``startColumn``.
    """

    severity: Severity
    rule: str
    message: str
    file: str
    member: str | None = None
    offset: int | None = None
    trigger: str | None = None
    offset_base: str = "file"
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = self.file + (f":{self.member}" if self.member else "")
        if self.offset is not None:
            where += f" at byte {self.offset}" + (" of the member" if self.offset_base == "member" else "")
        return f"{self.severity}: {where}: {self.message} [{self.rule}]"

    def to_dict(self) -> dict[str, Any]:
        d = {"severity": str(self.severity), "rule": self.rule, "message": self.message,
             "file": self.file, "member": self.member, "offset": self.offset,
             "offset_base": self.offset_base, "trigger": self.trigger}
        if self.line is not None:   # new keys, present only when known (schema: keys are added)
            d["line"] = self.line
            if self.column is not None:
                d["column"] = self.column
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        return cls(Severity.parse(d["severity"]), d["rule"], d["message"], d["file"], d.get("member"),
                   d.get("offset"), d.get("trigger"), d.get("offset_base", "file"),
                   d.get("line"), d.get("column"))

    @property
    def place(self) -> tuple[int | None, int | None]:
        """(line, column): the fields, or the ``(line N)`` the judges write at the end of their
        own sentence (the last one in the message: text quoted from the file comes before it)."""
        if self.line is not None:
            return self.line, self.column
        found = _LINE_IN_MESSAGE.findall(self.message)
        if not found:
            return None, None
        line, column = found[-1]
        return int(line), int(column) if column else None


@dataclass
class FileReport:
    """One file's scan: independent of every other file (a pure function's picklable result).

    Attributes:
        file: the path scanned.
        findings: its findings, worst first.
        scanned: False for a non-model file skipped in a folder walk (no findings then).
        error: the file could not be read or parsed completely.
        data_files: other files its tensors live in (ONNX external data), read as raw data.
    """

    file: str
    findings: list[Finding] = field(default_factory=list)
    scanned: bool = True
    error: bool = False
    data_files: list[str] = field(default_factory=list)

    @property
    def severity(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "tensorscope.scan-file/1", "file": self.file, "scanned": self.scanned,
                "error": self.error, "findings": [f.to_dict() for f in self.findings]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FileReport":
        return cls(d["file"], [Finding.from_dict(f) for f in d["findings"]], d["scanned"], d["error"])


@dataclass
class ScanReport:
    """The result of a scan.

    Attributes:
        findings: every finding, worst first.
        files: the files scanned.
        errors: how many files could not be read or parsed completely.
    """

    findings: list[Finding] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    errors: int = 0
    read: int = 0      # files the scan read: `files` plus those judged as text or skipped (one
                       # count with the --jsonl records)
    resumed: int = 0   # files a --resume report vouched for, not read again

    @property
    def severity(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    @property
    def unsafe(self) -> bool:
        return any(f.severity >= Severity.HIGH for f in self.findings)

    def exit_code(self, fail_on: Severity = Severity.MEDIUM) -> int:
        """0 when no finding reaches ``fail_on``, else 1."""
        return 1 if any(f.severity >= fail_on for f in self.findings) else 0

    def counts(self) -> dict[str, int]:
        out = {str(s): 0 for s in Severity}
        for f in self.findings:
            out[str(f.severity)] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        sev = self.severity
        return {"schema": "tensorscope.scan/1", "files": list(self.files), "errors": self.errors,
                "files_read": self.read,
                "severity": str(sev) if sev is not None else None, "unsafe": self.unsafe,
                "counts": self.counts(), "findings": [f.to_dict() for f in self.findings]}

    def to_sarif(self) -> dict[str, Any]:
        """SARIF 2.1.0: one run, every rule of the registry with its documentation, one result
        per finding."""
        from .. import __version__
        used = sorted(set(RULES) | {f.rule for f in self.findings})
        index = {r: i for i, r in enumerate(used)}
        rules = []
        for rid in used:
            rule = RULES.get(rid)
            sev = rule.severity if rule else Severity.LOW
            text = rule.rationale if rule else "Reported by a format reader."
            help_md = text + ("\n\nReferences:\n" + "\n".join(f"- {r}" for r in rule.references)
                              if rule and rule.references else "")
            d = {"id": rid, "name": rid.replace(".", "/"),
                 "shortDescription": {"text": rule.title if rule else rid},
                 "fullDescription": {"text": text},
                 "help": {"text": help_md, "markdown": help_md},
                 "defaultConfiguration": {"level": _LEVEL[sev]},
                 "properties": {"severity": str(sev)}}
            refs = [r for r in (rule.references if rule else ()) if r.startswith("https://")]
            if refs:
                d["helpUri"] = refs[0]
            rules.append(d)
        results = []
        for f in self.findings:
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": _uri(f.file)}}}
            region: dict[str, int] = {}
            if f.offset is not None and f.offset_base == "file":
                region["byteOffset"] = f.offset
            line, column = f.place
            if line is not None:
                region["startLine"] = line
                if column is not None:
                    region["startColumn"] = column
            if region:
                loc["physicalLocation"]["region"] = region
            if f.member:
                loc["logicalLocations"] = [{"name": f.member, "kind": "member"}]
            results.append({"ruleId": f.rule, "ruleIndex": index[f.rule], "level": _LEVEL[f.severity],
                            "message": {"text": f.message}, "locations": [loc],
                            "properties": {"severity": str(f.severity), "member": f.member,
                                           "offset": f.offset, "offsetBase": f.offset_base,
                                           "trigger": f.trigger}})
        return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
                "runs": [{"tool": {"driver": {"name": "tensorscope", "version": __version__,
                                              "informationUri": "https://github.com/tensorscope/tensorscope",
                                              "rules": rules}},
                          "results": results,
                          "artifacts": [{"location": {"uri": _uri(p)}} for p in self.files]}]}


_LINE_IN_MESSAGE = re.compile(r"\(line (\d+)(?:, column (\d+))?\)")

_LEVEL = {Severity.CRITICAL: "error", Severity.HIGH: "error", Severity.MEDIUM: "warning",
          Severity.LOW: "note", Severity.INFO: "note"}


def _uri(path: str) -> str:
    from urllib.parse import quote
    p = path.replace(os.sep, "/")
    return quote(p, safe="/:._-~")


def merge(reports) -> ScanReport:
    """One `ScanReport` from per-file reports (findings deduplicated, worst first)."""
    out = ScanReport()
    findings: list[Finding] = []
    read: set[str] = set()
    for r in reports:
        read.add(r.file)
        if r.scanned:
            out.files.append(r.file)
        out.errors += int(r.error)
        findings.extend(r.findings)
    out.findings = sort_findings(dedupe(findings))
    out.read = len(read)
    return out


def dedupe(findings) -> list[Finding]:
    seen = set()
    out = []
    for f in findings:
        key = (f.rule, f.file, f.member, f.offset, f.trigger, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def sort_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-int(f.severity), f.file, f.member or "",
                                           f.offset if f.offset is not None else -1, f.rule))
