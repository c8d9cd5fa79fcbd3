"""Presentation helpers shared by the CLI commands: consoles, JSON, sizes, progress.

Only `tensorscope/cli.py`, `tensorscope/commands/` and `tui/` present; the library never prints.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Callable, Iterator

__all__ = ["stdout_console", "stderr_console", "emit_json", "human_bytes", "human_count", "progress",
           "PROGRESS_MIN_BYTES", "error_line"]

PROGRESS_MIN_BYTES = 256 << 20  # below this a job is quick: no progress bar


def stdout_console():
    """Rich console for stdout. Piped output is not squeezed into 80 columns: tables stay one
    row per line (width from $COLUMNS, else 200) so that grep and less see whole rows."""
    from rich.console import Console
    width = None
    if not sys.stdout.isatty():
        try:
            width = int(os.environ.get("COLUMNS", "200"))
        except ValueError:
            width = 200
    return Console(highlight=False, soft_wrap=False, width=width)


def stderr_console():
    from rich.console import Console
    return Console(stderr=True, highlight=False)


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


def _default(o):
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, (bytes, bytearray, memoryview)):
        return bytes(o).hex()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def human_count(n: int) -> str:
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


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
