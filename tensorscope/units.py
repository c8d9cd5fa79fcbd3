"""Numbers as people read them (``1.2 GiB``, ``7.24B``, ``1 tensor``): shared by every
presentation layer and by consumers that write text (graph pictures), so it sits at the bottom."""
from __future__ import annotations


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 tensor``, ``2 tensors``, ``1,024 anomalies`` (``words``: an irregular plural)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def human_count(n: int) -> str:
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
