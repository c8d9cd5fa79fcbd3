"""Small text helpers shared by the screens: human counts and sizes, shapes, values, basenames.

Everything here is pure (no Textual), so snapshot output stays deterministic and the helpers are
cheap to call for every row of a large table.
"""
from __future__ import annotations

import math
import os

__all__ = ["human_count", "human_bytes", "compact_bytes", "fmt_shape", "fmt_value", "fmt_offset", "basename",
           "shorten_paths", "one_line"]

_COUNT_UNITS = ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K"))
_BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def human_count(n: int) -> str:
    """``1234 -> '1.2K'``, ``7_000_000_000 -> '7.0B'``; small numbers stay exact."""
    for size, unit in _COUNT_UNITS:
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def human_bytes(n: int) -> str:
    """``2048 -> '2.0 KiB'``; below 1 KiB the exact byte count."""
    if n < 0:
        return "?"
    for size, unit in _BYTE_UNITS:
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def compact_bytes(n: int) -> str:
    """``16_588 -> '16KiB'``, ``1_500_000 -> '1.4MiB'``: short enough for tree labels."""
    for size, unit in _BYTE_UNITS:
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v >= 10 else f"{v:.1f}{unit}"
    return f"{n}B"


def fmt_shape(shape: tuple[int, ...]) -> str:
    """``(3, 4) -> '3×4'``; a 0-d tensor is ``'scalar'``."""
    return "×".join(str(d) for d in shape) if shape else "scalar"


def fmt_value(v) -> str:
    """One element for the preview and statistics: 6 significant digits, ints exact."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, complex):
        return f"{v.real:.4g}{v.imag:+.4g}j"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return f"{f:.6g}"


def fmt_offset(offset: int | None) -> str:
    return "—" if offset is None else str(offset)


def basename(path: str) -> str:
    """The last component of a path (the UI never shows absolute paths)."""
    return os.path.basename(os.path.normpath(path)) if path else ""


def shorten_paths(text: str, *paths: str) -> str:
    """Replace each absolute path in ``text`` with its basename (error messages name the file)."""
    for p in sorted((p for p in paths if p), key=len, reverse=True):
        text = text.replace(p, basename(p))
        ap = os.path.abspath(p)
        if ap != p:
            text = text.replace(ap, basename(p))
    return text


def one_line(err: BaseException, *paths: str) -> str:
    """Any failure as one line: tensorscope errors carry their place; others get their type."""
    from tensorscope import TensorscopeError

    if isinstance(err, (TensorscopeError, OSError)):
        msg = str(err)
    else:
        msg = f"internal error ({type(err).__name__}): {err}"
    msg = " ".join(msg.split())
    return shorten_paths(msg, *paths)
