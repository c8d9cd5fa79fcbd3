"""The safety banner: a bar on every screen when a scanned file needs attention.

It reads the app's scan state (``app.scan_reports``, ``app.scan_error``, ``app.scan_done``) and
subscribes to ``app.scan_updated`` so it appears as soon as the startup scan finishes. The
threshold is the CLI's: a report whose `ScanReport.exit_code` (default ``--fail-on medium``) is 1
shows it, red "UNSAFE TO LOAD" at high or above, yellow "review before loading" for medium
findings, as ``tensorscope scan`` prints them. Hidden while scanning and when nothing reaches it.
"""
from __future__ import annotations

from textual.widgets import Static

__all__ = ["SafetyBanner", "scan_summary", "scan_verdict"]


def scan_verdict(report) -> str:
    """``"unsafe"``, ``"review"`` or ``"clean"``: what ``tensorscope scan`` (default --fail-on)
    says of one report."""
    if getattr(report, "unsafe", False):
        return "unsafe"
    return "review" if report.exit_code() else "clean"


def scan_summary(reports: list) -> tuple[str, str]:
    """``(verdict, sentence)`` over ``[(path, ScanReport)]``: the worst verdict and what the
    banner says (``""`` when every report is clean)."""
    from tensorscope.safetext import shown

    from ..formatting import basename

    verdicts = [(p, r, scan_verdict(r)) for p, r in reports]
    worst = "unsafe" if any(v == "unsafe" for *_, v in verdicts) else \
        "review" if any(v == "review" for *_, v in verdicts) else "clean"
    if worst == "clean":
        return worst, ""
    floor = 3 if worst == "unsafe" else 2  # the findings that make the verdict
    parts = []
    for path, report, verdict in verdicts:
        if verdict != worst:
            continue
        bad = [f for f in report.findings if int(f.severity) >= floor]
        triggers = sorted({shown(f.trigger) for f in bad if getattr(f, "trigger", None)})
        what = ", ".join(triggers[:3]) + (" …" if len(triggers) > 3 else "")
        kind = "high/critical" if worst == "unsafe" else "medium"
        parts.append(f"{shown(basename(path))}: {len(bad)} {kind} finding"
                     f"{'s' if len(bad) != 1 else ''}" + (f" ({what})" if what else ""))
    head = "UNSAFE TO LOAD" if worst == "unsafe" else "review before loading"
    return worst, f"{head} — " + "; ".join(parts) + " — press s for the scan"


class SafetyBanner(Static):
    """Red banner while any scanned file is unsafe, yellow while one needs review."""

    DEFAULT_CSS = """
    SafetyBanner { display: none; height: auto; }
    SafetyBanner.-unsafe, SafetyBanner.-review { display: block; }
    """

    def __init__(self, **kwargs):
        super().__init__(markup=False, **kwargs)  # the sentence quotes globals from the file

    def on_mount(self) -> None:
        signal = getattr(self.app, "scan_updated", None)
        if signal is not None:
            signal.subscribe(self, self._on_scan)
        self._on_scan(None)

    def _on_scan(self, _data) -> None:
        verdict, sentence = scan_summary(getattr(self.app, "scan_reports", []) or [])
        self.set_class(verdict == "unsafe", "-unsafe")
        self.set_class(verdict == "review", "-review")
        self.update(f"⚠ {sentence}" if sentence else "")
