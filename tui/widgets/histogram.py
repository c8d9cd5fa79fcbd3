"""A vertical bar chart in block characters, for value and difference histograms.

Each bin is one column; a bar of height ``h`` rows uses full blocks and one partial block
(eighths), so 4 rows give 32 levels. Any non-empty bin shows at least the lowest block, so rare
values (a few NaN-adjacent outliers) stay visible next to a dominant bin.
"""
from __future__ import annotations

from rich.text import Text

from ..formatting import fmt_value, human_count

__all__ = ["render_histogram"]

_EIGHTHS = " ▁▂▃▄▅▆▇█"


def render_histogram(counts: list[int], lo: float, hi: float, *, height: int = 4,
                     style: str = "bold green") -> Text:
    """Bars for ``counts`` with the value range underneath and the peak count on the right."""
    text = Text()
    peak = max(counts) if counts else 0
    if not counts or peak == 0:
        text.append("(no finite values)", style="dim")
        return text
    levels = height * 8
    heights = [0 if c == 0 else max(1, round(c / peak * levels)) for c in counts]
    for row in range(height, 0, -1):
        base = (row - 1) * 8
        line = "".join(_EIGHTHS[max(0, min(8, h - base))] for h in heights)
        text.append(line, style=style)
        if row == height:
            text.append(f" {human_count(peak)}", style="dim")
        text.append("\n")
    width = len(counts)
    left, right = fmt_value(lo), fmt_value(hi)
    gap = max(1, width - len(left) - len(right))
    text.append(f"{left}{' ' * gap}{right}", style="dim")
    return text
