"""A module imported on first use, for the value path's numpy.

The modules that compare and summarise values (`tensorscope.diffing`, `tensorscope.diff_verdict`,
`tensorscope.lowrank`, `tensorscope.reader`, `tensorscope.valuestats`) name numpy at their top as
``np = lazy_module("numpy")``: importing them costs nothing until a value goes through numpy. A
diff of plain pairs that the compiled pass reads from their stored bytes never does, and numpy's
import (~50 ms, more than the rest of a small diff's start) is then not paid at all. Nothing
process-wide changes: numpy is imported the ordinary way, by the first attribute looked up.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["lazy_module"]


class _LazyModule:
    """Stands for the module ``name``; each attribute is looked up once, then kept on this object,
    so later look-ups cost what a module attribute does."""

    def __init__(self, name: str) -> None:
        self._lazy_name = name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self._lazy_name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<module {self._lazy_name!r}, imported on first use>"


def lazy_module(name: str) -> Any:
    """The module ``name``, imported when one of its attributes is first looked up."""
    return _LazyModule(name)
