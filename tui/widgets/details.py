"""The details pane: statistics, a histogram and every metadata field of one tensor.

The pane only renders; the owning screen runs the statistics worker and calls `show_stats`,
`show_histogram` or `show_error` when its messages arrive.
"""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from tensorscope.safetext import shown

from ..formatting import basename, fmt_offset, fmt_shape, fmt_value, human_bytes, human_count
from .histogram import render_histogram

__all__ = ["TensorDetails", "info_fields"]


def info_fields(info) -> list[tuple[str, str]]:
    """Every field of a `TensorInfo` as display pairs (files as basenames); text from the file
    is made inert by `_grid`."""
    fields = [
        ("name", info.name),
        ("dtype", info.dtype),
        ("shape", f"{fmt_shape(info.shape)}  {list(info.shape)}"),
        ("stride", str(list(info.stride))),
        ("numel", f"{info.numel:,}"),
        ("nbytes", f"{info.nbytes:,} ({human_bytes(info.nbytes)})" if info.has_data
         else f"— (saved without data; {info.nbytes:,} when stored)"),
        ("byte_offset", fmt_offset(info.byte_offset)),
        ("storage_offset", str(info.storage_offset)),
        ("storage_key", info.storage_key or "—"),
        ("storage_nbytes", "—" if info.storage_nbytes is None else f"{info.storage_nbytes:,}"),
        ("file", basename(info.file) or "—"),
        ("role", info.role),
        ("format", info.source_format or "—"),
        ("path", " / ".join(info.path)),
    ]
    if info.chunks:
        fields.append(("chunks", f"{len(info.chunks)} pieces"))
    if info.extras:
        n = len(info.extras)
        fields.append(("extras", f"{n} format-specific field{'s' if n != 1 else ''}:"))
    for key in sorted(info.extras, key=str):
        fields.append((f"· {key}", str(info.extras[key])))
    return fields


def _grid(pairs: list[tuple[str, str]]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="dim", no_wrap=True, max_width=15, overflow="ellipsis")
    grid.add_column(overflow="fold")
    for k, v in pairs:  # Text, never markup: names and extras come from the file
        grid.add_row(Text(shown(k)), Text(shown(v)))
    return grid


def stats_pairs(stats) -> list[tuple[str, str]]:
    pct = f"{stats.zero_fraction * 100:.2f}%"
    return [
        ("min", fmt_value(stats.min)), ("max", fmt_value(stats.max)),
        ("mean", fmt_value(stats.mean)), ("std", fmt_value(stats.std)),
        ("NaN", f"{stats.nan:,}"), ("Inf", f"{stats.inf:,}"),
        ("zeros", f"{stats.zeros:,} ({pct})"), ("numel", f"{stats.numel:,}"),
    ]


def _stats_grid(stats) -> Table:
    pairs = stats_pairs(stats)
    grid = Table.grid(padding=(0, 1))
    for _ in range(2):
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(no_wrap=True, min_width=12)
    for i in range(0, len(pairs), 2):
        (k1, v1), (k2, v2) = pairs[i], pairs[i + 1]
        grid.add_row(k1, v1, k2, v2)
    return grid


class TensorDetails(VerticalScroll, can_focus=True):
    """Statistics, histogram and metadata of the highlighted tensor."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Held directly: the screen may call show() before this container has composed.
        self.title = Static(id="d-title")
        self.stats = Static(id="d-stats")
        self.hist = Static(id="d-hist")
        self.meta = Static(id="d-meta")

    def compose(self):
        yield self.title
        with Horizontal(id="d-row"):
            with Vertical(id="d-main"):
                yield self.stats
                yield self.hist
            yield self.meta

    def clear(self, message: str = "") -> None:
        self.title.update(Text(message, style="dim"))
        for part in (self.stats, self.hist, self.meta):
            part.update("")

    def show(self, info) -> None:
        title = Text()
        title.append(shown(info.name), style="bold")
        title.append(f"  {shown(info.dtype)} {fmt_shape(info.shape)} · {human_count(info.numel)} params"
                     f" · {human_bytes(info.nbytes)}", style="dim")
        self.title.update(title)
        self.stats.update(Text("statistics: computing…", style="dim italic"))
        self.hist.update("")
        self.meta.update(_grid(info_fields(info)))

    def show_stats(self, stats) -> None:
        self.stats.update(_stats_grid(stats))

    def show_error(self, message: str) -> None:
        self.stats.update(Text(shown(message), style="yellow"))

    def show_histogram(self, counts: list[int], lo: float, hi: float) -> None:
        self.hist.update(render_histogram(counts, lo, hi))
