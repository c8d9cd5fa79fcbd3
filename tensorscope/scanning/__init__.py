"""Static safety scan of untrusted model files: every pickle anywhere, judged by an allowlist.

Nothing from a scanned file is executed or imported. The scan is one more consumer of the parsed
`ModelFile` (its pickle runs, anomalies and code files: `loader.judge_model_evidence`) plus the
loader's-eye view of the same bytes (`loader`): what torch.load / np.load / joblib.load would read,
and where readers disagree. A parser failure never stops the scan, and whatever the format's
loader rejects is never clean.

Modules: `report` (Finding, FileReport, ScanReport, JSON and SARIF), `rules` (the registry: id,
severity, rationale, references), `walk` (files and folders), `loader` (the dispatcher: one file as
its loader reads it), `context` (`ScanContext`, the state every checker reports into, and
`ScanLimits`), checkers `pickles` (pickle rules), `torchscript` (code rules), `configs`,
`chat_template`, `hf_repo`, `keras`, ... Checkers import `context`, never `loader`.
Policy: `tensorscope.policy`.

Public API:
    scan_paths(*paths) -> ScanReport        files and folders (also ``tensorscope.scan(*paths)``)
    scan_file(path, limits=...) -> FileReport  one file: pure and picklable, for process pools
    scan_model(model) -> FileReport         a ModelFile already opened (convert, the TUI)
    scan_opened(path, model) -> ScanReport  scan_paths(path) reusing a model opened from it
    plan(*paths)                            the files scan_paths would read, and walk findings
"""
from __future__ import annotations

from .context import DEFAULT_SCAN_LIMITS, ScanLimits
from .loader import scan_file, scan_model
from .report import FileReport, Finding, ScanReport, Severity, merge
from .rules import RULES, Rule, severity_of
from .walk import plan, scan_opened, scan_paths

__all__ = ["scan_paths", "scan_file", "scan_model", "scan_opened", "plan", "merge", "Severity", "Finding",
           "FileReport", "ScanReport", "RULES", "Rule", "severity_of", "ScanLimits",
           "DEFAULT_SCAN_LIMITS"]

