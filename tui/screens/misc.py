"""Small screens: loading, the error screen for a file that failed to parse, and help."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Static

from tensorscope.safetext import shown

from ..widgets.banner import SafetyBanner

__all__ = ["LoadingScreen", "ErrorScreen", "HelpScreen"]


class LoadingScreen(Screen):
    """Shown while the file(s) parse in a worker."""

    def __init__(self, names: list[str]):
        super().__init__()
        self.names = names

    def compose(self) -> ComposeResult:
        title = Text()
        title.append(" tensorscope ", style="bold reverse")
        yield Static(title, id="titlebar")
        yield Static(Text(f"opening {' and '.join(shown(n) for n in self.names)} …", style="dim italic"),
                     id="loading")
        yield Footer()


class ErrorScreen(Screen):
    """A file that could not be opened: its one-line error, never a traceback."""

    def __init__(self, name: str, message: str):
        super().__init__()
        self.file_name = name
        self.message = message

    def compose(self) -> ComposeResult:
        title = Text()
        title.append(" tensorscope ", style="bold reverse")
        title.append(f" {shown(self.file_name)}")
        yield Static(title, id="titlebar")
        yield SafetyBanner(id="banner")
        with Center(id="error-box"):
            text = Text()
            text.append(f"cannot open {shown(self.file_name)}\n\n", style="bold red")
            text.append(shown(self.message))
            text.append("\n\npress s for the safety scan, q to quit", style="dim")
            yield Static(text, id="error-message")
        yield Footer()


class HelpScreen(ModalScreen):
    """The key bindings of the screen underneath, plus the global ones."""

    BINDINGS = [Binding("escape,question_mark,q", "app.pop_screen", "Close")]

    def __init__(self, bindings: list[tuple[str, str]]):
        super().__init__()
        self.bindings = bindings

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, desc in self.bindings:
            table.add_row(key, desc)
        text = Text.assemble(
            ("tensorscope — keys\n", "bold"),
            ("Files are parsed, never executed. Values are read zero-copy from the file.\n", "dim"))
        with VerticalScroll(id="help-box"):
            yield Static(text)
            yield Static(table)
            yield Static(Text("ctrl+p opens the command palette · tab moves focus · esc goes back",
                              style="dim"))
