"""The safety banner: a red bar on every screen when a file is unsafe to load.

It reads the app's scan state (``app.scan_reports``, ``app.scan_error``, ``app.scan_done``) and
subscribes to ``app.scan_updated`` so it appears as soon as the startup scan finishes. It stays
hidden while scanning and when the scan found nothing at HIGH or above.
"""
from __future__ import annotations

from textual.widgets import Static

__all__ = ["SafetyBanner", "scan_summary"]


def scan_summary(reports: list) -> tuple[bool, str]:
    """``(unsafe, sentence)`` over ``[(path, ScanReport)]``."""
    from ..formatting import basename

    unsafe_files = [(p, r) for p, r in reports if getattr(r, "unsafe", False)]
    if not unsafe_files:
        return False, ""
    parts = []
    for path, report in unsafe_files:
        bad = [f for f in report.findings if int(f.severity) >= 3]
        triggers = sorted({f.trigger for f in bad if getattr(f, "trigger", None)})
        what = ", ".join(triggers[:3]) + (" …" if len(triggers) > 3 else "")
        parts.append(f"{basename(path)}: {len(bad)} high/critical finding"
                     f"{'s' if len(bad) != 1 else ''}" + (f" ({what})" if what else ""))
    return True, "UNSAFE TO LOAD — " + "; ".join(parts) + " — press s for the scan"


class SafetyBanner(Static):
    """Red banner shown while any scanned file is unsafe."""

    DEFAULT_CSS = """
    SafetyBanner { display: none; height: auto; }
    SafetyBanner.-unsafe { display: block; }
    """

    def on_mount(self) -> None:
        signal = getattr(self.app, "scan_updated", None)
        if signal is not None:
            signal.subscribe(self, self._on_scan)
        self._on_scan(None)

    def _on_scan(self, _data) -> None:
        unsafe, sentence = scan_summary(getattr(self.app, "scan_reports", []) or [])
        self.set_class(unsafe, "-unsafe")
        self.update(f"⚠ {sentence}" if unsafe else "")
