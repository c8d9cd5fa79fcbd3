"""Command palette provider: every screen and action of the app, fuzzy-searchable."""
from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

__all__ = ["TensorscopeCommands"]


class TensorscopeCommands(Provider):
    """Screens and actions (browse, diff, scan, values, file info, filter, theme, help)."""

    def _commands(self) -> list[tuple[str, str, str]]:
        """``(title, help, action)``; actions run on the screen the palette was opened from."""
        from .screens.browse import BrowseScreen

        app = self.app
        cmds = [
            ("Scan findings", "Show the static safety scan of the opened file(s)", "app.scan"),
            ("Toggle dark/light theme", "Switch between the dark and the light theme", "app.toggle_theme"),
            ("Help: keys", "Show the key bindings", "app.help"),
        ]
        if getattr(app, "other", None):
            cmds.append(("Diff", "Back to the side-by-side diff", "app.diff"))
        if isinstance(self.screen, BrowseScreen):
            cmds += [
                ("Filter tensors", "Filter the table by name (substring or glob)", "filter"),
                ("Values preview", "Show a window of the selected tensor's values", "values"),
                ("File info", "Format, metadata, code and graph of the file", "file_info"),
                ("Sort: next column", "Cycle the table's sort column", "cycle_sort"),
            ]
        return cmds

    def _run(self, action: str) -> None:
        target = self.app if action.startswith("app.") else self.screen
        self.app.call_later(target.run_action, action.removeprefix("app."))

    async def discover(self) -> Hits:
        for title, help_text, action in self._commands():
            yield DiscoveryHit(title, partial(self._run, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, action in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(self._run, action), text=title,
                          help=help_text)
