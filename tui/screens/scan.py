"""Scan findings of every opened file, worst first, with severity colours.

The scan itself runs once at startup in the app's worker (`tensorscope.scanning.scan_opened`, over the
models already parsed); this screen shows its state: scanning, unavailable (scanner missing or
failed), or the findings table with the full text of the highlighted finding underneath.
"""
from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tensorscope.safetext import shown

from ..formatting import basename, shorten_paths
from ..widgets.banner import SafetyBanner, scan_verdict

__all__ = ["ScanScreen", "SEVERITY_STYLES", "severity_name"]

SEVERITY_STYLES = {
    "info": "dim", "low": "cyan", "medium": "yellow", "high": "bold red", "critical": "bold white on red",
}


def severity_name(sev) -> str:
    name = getattr(sev, "name", None)
    return (name or str(sev)).lower()


def _where(f) -> str:
    parts = [basename(str(f.file))] if getattr(f, "file", None) else []
    if getattr(f, "member", None):
        parts.append(str(f.member))
    where = ":".join(parts)
    if getattr(f, "offset", None) is not None:
        where += f" @{f.offset}"
    return where


class ScanScreen(Screen):
    """Findings of the startup scan."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def compose(self) -> ComposeResult:
        title = Text()
        title.append(" scan ", style="bold reverse")
        title.append(" static safety scan (nothing from the file is executed)")
        yield Static(title, id="titlebar")
        yield SafetyBanner(id="banner")
        yield Static(id="scan-summary")
        yield DataTable(id="findings", cursor_type="row", zebra_stripes=True)
        yield Static(id="finding-detail")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#findings", DataTable)
        for col in ("severity", "rule", "where", "trigger", "message"):
            table.add_column(col, key=col)
        self.app.scan_updated.subscribe(self, lambda _: self.refresh_findings())
        self.refresh_findings()
        table.focus()

    def _findings(self) -> list[tuple[str, object]]:
        out = []
        for path, report in self.app.scan_reports:
            for f in report.findings:
                out.append((path, f))
        out.sort(key=lambda pf: (-int(pf[1].severity), str(pf[1].rule), _where(pf[1])))
        return out

    def refresh_findings(self) -> None:
        app = self.app
        summary = self.query_one("#scan-summary", Static)
        table = self.query_one("#findings", DataTable)
        table.clear()
        self.items = []
        if not app.scan_done:
            summary.update(Text("scanning…", style="dim italic"))
            return
        if app.scan_error:
            summary.update(Text(f"scan unavailable: {app.scan_error}", style="yellow"))
            return
        lines = Text()
        for path, report in app.scan_reports:
            sev = severity_name(report.severity) if report.findings else "clean"
            style = SEVERITY_STYLES.get(sev, "green")
            lines.append(f"{shown(basename(path))}: ", style="bold")
            lines.append(f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''}, ")
            lines.append("worst " + sev if report.findings else "clean", style=style)
            # the CLI's verdict and words (`tensorscope scan`, default --fail-on medium)
            verdict = scan_verdict(report)
            lines.append({"unsafe": " — UNSAFE to load\n", "review": " — review before loading\n",
                          "clean": " — nothing found that loading would run\n"}[verdict],
                         style={"unsafe": "bold red", "review": "yellow", "clean": "green"}[verdict])
        summary.update(lines)
        paths = [p for p, _ in app.scan_reports]
        self.items = self._findings()
        for i, (path, f) in enumerate(self.items):
            sev = severity_name(f.severity)
            table.add_row(Text(sev, style=SEVERITY_STYLES.get(sev, "")), Text(shown(f.rule)),
                          Text(shown(_where(f))), Text(shown(getattr(f, "trigger", "") or "")),
                          Text(shown(shorten_paths(str(f.message), *paths))), key=str(i))
        if self.items:
            self._detail(0)
        else:
            self.query_one("#finding-detail", Static).update("")

    def _detail(self, i: int) -> None:
        path, f = self.items[i]
        sev = severity_name(f.severity)
        text = Text()
        text.append(f"{sev} ", style=SEVERITY_STYLES.get(sev, ""))
        text.append(f"{shown(f.rule)}  ", style="bold")
        text.append(shown(_where(f)), style="dim")
        text.append("\n" + shown(shorten_paths(str(f.message), *[p for p, _ in self.app.scan_reports])))
        self.query_one("#finding-detail", Static).update(text)

    @on(DataTable.RowHighlighted, "#findings")
    def _highlight(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value is not None:
            self._detail(int(event.row_key.value))
