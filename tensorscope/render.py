"""Presentation helpers shared by the CLI commands: consoles, JSON, sizes, progress.

Only `tensorscope/cli.py`, `tensorscope/commands/` and `tui/` present; the library never prints.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import sys
from typing import Any, Callable, Iterable, Iterator, Sequence

from .units import human_bytes, human_count, plural  # noqa: F401  (render's callers use them)

__all__ = ["stdout_console", "stderr_console", "emit_json", "emit_json_stream", "human_bytes",
           "human_count", "progress", "deferred_progress", "opening", "TextTable", "StyledOut",
           "PROGRESS_MIN_BYTES", "error_line"]

PROGRESS_MIN_BYTES = 256 << 20  # below this a job is quick: no progress bar
OPENING_NOTICE_AFTER = 0.3      # seconds an open may take before `opening` says what it reads


def _piped_width() -> int:
    """The width of piped output: $COLUMNS, else 200 (not 80: tables stay one row per line)."""
    try:
        return int(os.environ.get("COLUMNS", "200"))
    except ValueError:
        return 200


def stdout_console():
    """Rich console for stdout. Piped output is not squeezed into 80 columns: tables stay one
    row per line (width from $COLUMNS, else 200) so that grep and less see whole rows. Emoji
    codes are not replaced: ``:thumbs_up:`` in a tensor name is text from the file, printed as
    it is (`tensorscope.safetext.markup` escapes only Rich's brackets)."""
    from rich.console import Console
    width = None if sys.stdout.isatty() else _piped_width()
    return Console(highlight=False, soft_wrap=False, width=width, emoji=False)


def stderr_console():
    from rich.console import Console
    return Console(stderr=True, highlight=False, emoji=False)


def error_line(command: str | None, message: str) -> int:
    """The one error line of every command, ``tensorscope <command>: error: <file>: <reason>``, on
    stderr (text from a file escaped); returns the exit status 2."""
    from .safetext import shown
    prog = f"tensorscope {command}" if command else "tensorscope"
    sys.stderr.write(f"{prog}: error: {shown(message)}\n")
    sys.stderr.flush()
    return 2


def emit_json(obj: Any) -> None:
    """Stable JSON on stdout: sorted keys, no markup. Indented on a terminal; one compact line
    when piped, because only the unindented form runs on json's C encoder (5x faster on a
    10,000-tensor listing). Written with one write: json.dump issues one per token."""
    indent = 2 if sys.stdout.isatty() else None
    sys.stdout.write(json.dumps(obj, indent=indent, sort_keys=True, default=_default,
                                allow_nan=True))
    sys.stdout.write("\n")


def emit_json_stream(doc: dict, key: str, rows: Iterable[Any], batch: int = 2048,
                     to_dict: Callable[[Any], Any] | None = None,
                     to_texts: Callable[[list], list[str | None]] | None = None,
                     to_joined: Callable[[list], str | None] | None = None) -> None:
    """`emit_json` of ``doc`` plus ``doc[key] = [to_dict(r) for r in rows]``, written batch by
    batch: the rows are encoded ``batch`` at a time and never all held at once. ``key`` must sort
    after every key of ``doc`` (the output is then byte for byte what `emit_json` writes when
    piped). ``to_texts(rows)``, when given, returns each row's encoded text (exactly what the
    encoder would write for ``to_dict(row)``) or None to take the encoder; ``to_joined(rows)``,
    when given, their texts joined by ``", "`` in one string, or None to take ``to_texts``. On a
    terminal the whole document is indented by `emit_json` instead (a person reads it, not a
    pipe)."""
    if sys.stdout.isatty():
        emit_json({**doc, key: [to_dict(r) for r in rows] if to_dict else list(rows)})
        return
    if any(k > key for k in doc):
        raise ValueError(f"{key!r} must sort after every other key")
    encode = json.JSONEncoder(sort_keys=True, default=_default, allow_nan=True).encode
    head = encode(doc)
    write = sys.stdout.write
    write(head[:-1] + (", " if doc else "") + json.dumps(key) + ": [")
    rows = iter(rows)
    sep = ""
    while chunk := list(itertools.islice(rows, batch)):
        joined = to_joined(chunk) if to_joined else None
        if joined is not None:
            write(sep + joined)
            sep = ", "
            continue
        texts = to_texts(chunk) if to_texts else [None] * len(chunk)
        if None in texts:   # the rows the fast path left to the encoder
            texts = [encode(to_dict(r) if to_dict else r) if x is None else x
                     for r, x in zip(chunk, texts)]
        write(sep + ", ".join(texts))
        sep = ", "
    write("]}\n")


def _default(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (bytes, bytearray, memoryview)):
        return bytes(o).hex()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def _status_visible() -> bool:
    """A status line on stderr reaches a person, and no pager or pipe shares the screen: stderr is
    a terminal and stdout is that terminal or a file (not ``| less``, which owns the screen)."""
    try:
        if not sys.stderr.isatty():
            return False
        if sys.stdout.isatty():
            return True
        import stat
        return stat.S_ISREG(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def opening(what: str) -> Iterator[None]:
    """Say ``reading <what> …`` on stderr if opening takes longer than `OPENING_NOTICE_AFTER`
    (a checkpoint of 10^5 tensors, a remote file), and wipe the line once it is open, so the
    first output is the listing itself. A one-shot timer thread: nothing runs while the parse is
    quick, and nothing is written when no terminal would show it. ``what`` must be safe text."""
    if not _status_visible():
        yield
        return
    import threading
    lock = threading.Lock()
    state = {"shown": False, "done": False}

    def show() -> None:
        with lock:
            if not state["done"]:
                sys.stderr.write(f"reading {what} …")
                sys.stderr.flush()
                state["shown"] = True

    timer = threading.Timer(OPENING_NOTICE_AFTER, show)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["shown"]:
                sys.stderr.write("\r\x1b[2K")   # back to the line's start, erase it
                sys.stderr.flush()


@contextlib.contextmanager
def progress(total_bytes: int, description: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for long jobs; yields ``advance(n_bytes)``. Silent when stderr is
    not a terminal or the job is small, so stdout stays clean for pipes and JSON."""
    if total_bytes < PROGRESS_MIN_BYTES or not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                               TimeRemainingColumn)
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TimeRemainingColumn(), console=stderr_console(), transient=True) as bar:
        task = bar.add_task(description, total=total_bytes)
        yield lambda n: bar.advance(task, n)


class _Deferred:
    """`deferred_progress`'s handle: ``begin(total)`` once the total is known, then ``advance(n)``."""

    def __init__(self, stack: contextlib.ExitStack, description: str):
        self._stack, self._description = stack, description
        self.advance: Callable[[int], None] = lambda n: None

    def begin(self, total_bytes: int) -> None:
        self.advance = self._stack.enter_context(progress(total_bytes, self._description))


@contextlib.contextmanager
def deferred_progress(description: str) -> Iterator[_Deferred]:
    """`progress` for a job whose size is known only once it has started (convert learns it from
    its plan): nothing is shown until ``begin(total)``, then the same rules apply."""
    with contextlib.ExitStack() as stack:
        yield _Deferred(stack, description)


class TextTable:
    """A table written as aligned plain text, row batches at a time, never held whole.

    Column widths are fixed before the first row (the caller measures them over the rows it
    will print, or over a bounded sample and the column's vocabulary), so the first rows reach
    the screen at once and each further row costs one ``str.format``: 100,000 rows print in a
    fraction of a second where a Rich table builds, measures and wraps every cell first. Cells
    must already be safe text (`tensorscope.safetext.shown` for anything from a file); nothing
    is interpreted as markup. With ``fold`` (a terminal), a first-column cell wider than its
    column continues on the next lines, the other cells on the first.
    """

    GAP = "  "

    def __init__(self, headers: Sequence[str], aligns: str, widths: Sequence[int], *,
                 fold: bool = False, bold: bool = False, out=None, batch: int = 512):
        self.bold = bold
        self.widths = [max(w, len(h)) for w, h in zip(widths, headers)]
        self.headers = list(headers)
        self.fold = fold
        self.out = out
        self.batch = batch
        self.fmt = self.GAP.join(f"{{{i}:{'>' if a == 'r' else '<'}{w}}}"
                                 for i, (a, w) in enumerate(zip(aligns, self.widths)))

    @staticmethod
    def fit_first(widths: list[int], total: int | None = None, minimum: int = 24) -> list[int]:
        """``widths`` with the first column narrowed so that a row fits ``total`` columns (the
        terminal's width by default), never below ``minimum``."""
        total = total or shutil.get_terminal_size((200, 24)).columns
        rest = sum(widths[1:]) + len(TextTable.GAP) * (len(widths) - 1)
        return [min(widths[0], max(minimum, total - rest - 1))] + list(widths[1:])

    def header_line(self) -> str:
        return self.fmt.format(*self.headers).rstrip()

    def write(self, rows: Iterable[Sequence[str]], header: bool = True) -> int:
        """Write (the header and) ``rows``; returns the number of rows written."""
        out = self.out or sys.stdout
        fmt, w0, fold = self.fmt.format, self.widths[0], self.fold
        lines: list[str] = []
        if header:
            lines.append(f"\x1b[1m{self.header_line()}\x1b[0m" if self.bold else self.header_line())
        n = 0
        for row in rows:
            n += 1
            first = row[0]
            if fold and len(first) > w0:
                lines.append(fmt(first[:w0], *row[1:]).rstrip())
                lines.extend(first[i:i + w0] for i in range(w0, len(first), w0))
            else:
                lines.append(fmt(*row).rstrip())
            if len(lines) >= self.batch:
                out.write("\n".join(lines) + "\n")
                lines.clear()
                if n <= self.batch:
                    out.flush()  # the first screenful now, the rest as it comes
        if lines:
            out.write("\n".join(lines) + "\n")
        return n


def _one_cell_each(text: str) -> bool:
    """Every character of ``text`` takes one terminal cell (Rich's count): its width is its
    length, and Rich lays it out as it is. Plain ASCII without importing Rich; wide (CJK),
    zero-width (combining) and control characters are left to Rich."""
    if text.isascii():
        return text.isprintable()
    from rich.cells import get_character_cell_size
    return all(get_character_cell_size(c) == 1 for c in text)


def _rich_styles_pipe() -> bool:
    """Rich would write escape codes to a stdout that is not a terminal (its own rules:
    TTY_COMPATIBLE=1, a non-empty FORCE_COLOR)."""
    env = os.environ
    if env.get("TTY_COMPATIBLE", "") == "1":
        return True
    return env.get("TTY_COMPATIBLE", "") != "0" and bool(env.get("FORCE_COLOR"))


class StyledOut:
    """Human output line by line, each line a sequence of spans ``"text"`` or ``("text",
    "style")`` (text already safe: `tensorscope.safetext.shown`), and tables laid out as a Rich
    ``Table(box=None, pad_edge=False)`` lays them out. The bytes are Rich's, without Rich's cost
    where it adds nothing:

    - stdout not a terminal (a pipe, a file: Rich writes no styles there): a line or a table that
      fits the width (`stdout_console`'s: $COLUMNS, else 200) is written as plain text, as Rich
      would write it, without importing Rich; wider ones go through Rich (it wraps and folds).
    - a terminal: every line through `stdout_console` (styles, the terminal's width); a table that
      fits is laid out here, line by line, one wider than the terminal is a Rich table (it folds).
    """

    def __init__(self):
        self.plain = not sys.stdout.isatty() and not _rich_styles_pipe()
        self._console = None
        self._width = _piped_width() if self.plain else None

    @property
    def console(self):
        if self._console is None:
            self._console = stdout_console()
        return self._console

    @property
    def width(self) -> int:
        if self._width is None:
            self._width = self.console.width
        return self._width

    def line(self, *spans) -> None:
        if self.plain:
            text = "".join(s if isinstance(s, str) else s[0] for s in spans)
            if len(text) <= self.width and _one_cell_each(text):
                sys.stdout.write(text + "\n")
                return
        self.console.print(_text(spans))

    def table(self, headers: Sequence[str], justify: str, rows: Sequence[Sequence],
              title: str | None = None, fold: str = "") -> None:
        """``rows`` of cells (spans: ``"text"`` or ``("text", "style")``) under bold ``headers``;
        ``justify`` a letter per column (``l``, ``r``); ``title`` above, left (italic on a
        terminal). ``fold``: the letters of the columns a Rich table folds when the table is
        wider than the screen (``f``) or cuts with an ellipsis (anything else); unused when it
        fits."""
        n = len(headers)
        texts = [[c if isinstance(c, str) else c[0] for c in r] for r in rows]
        widths = [len(h) for h in headers]
        for r in texts:
            for i in range(n):
                w = len(r[i])
                if w > widths[i]:
                    widths[i] = w
        if n == 1 and not widths[0]:
            widths[0] = 1   # Rich gives a column no narrower than one cell, padding included
        total = sum(widths) + 2 * (n - 1)   # one space of padding each side, none at the edges
        if (total > self.width or (title is not None and len(title) > total)
                or not _one_cell_each("".join(headers) + "".join(map("".join, texts))
                                      + (title or ""))):
            self._rich_table(headers, justify, rows, title, fold)
            return
        lines = []
        if title is not None:
            lines.append([(_pad(title, total, "l"), "italic")])
        lines.append([(_pad(h, widths[i], justify[i]) + ("  " if i < n - 1 else ""), "bold")
                      for i, h in enumerate(headers)])
        for row, text in zip(rows, texts):
            spans = []
            for i, cell in enumerate(row):
                t = text[i]
                if justify[i] == "r" and t[-1:].isspace():   # Rich right-justifies it stripped
                    t = t.rstrip()
                    cell = t if isinstance(cell, str) else (t, cell[1])
                w = widths[i] - len(t)
                left, right = (w, 0) if justify[i] == "r" else (0, w)
                if left:
                    spans.append(" " * left)
                spans.append(cell)
                if right or i < n - 1:
                    spans.append(" " * (right + (2 if i < n - 1 else 0)))
            lines.append(spans)
        if self.plain:
            sys.stdout.write("".join("".join(s if isinstance(s, str) else s[0] for s in spans)
                                     + "\n" for spans in lines))
        else:
            for spans in lines:
                self.console.print(_text(spans))

    def _rich_table(self, headers, justify, rows, title, fold) -> None:
        from rich.table import Table
        from rich.text import Text
        table = Table(box=None, header_style="bold", pad_edge=False, title_justify="left",
                      title=None if title is None else Text(title, style="table.title"))
        for i, h in enumerate(headers):
            kw = {"overflow": "fold"} if i < len(fold) and fold[i] == "f" else {}
            table.add_column(Text(h), justify="right" if justify[i] == "r" else "left", **kw)
        for r in rows:
            table.add_row(*(_text([c]) for c in r))
        self.console.print(table)


def _pad(text: str, width: int, justify: str) -> str:
    if justify == "r":
        text = text.rstrip()
    gap = " " * (width - len(text))
    return gap + text if justify == "r" else text + gap


def _text(spans):
    """A Rich Text of spans: their text as it is (never read as markup), their styles applied."""
    from rich.text import Text
    return Text.assemble(*((s, "") if isinstance(s, str) else s for s in spans))
