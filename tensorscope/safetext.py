"""Text from a file is evidence, not output: the one function every human-facing string passes.

Tensor names, globals, metadata keys, member names and messages quoted from a file are hostile
data. Shown raw, an escape sequence retitles the terminal (OSC), clears it or recolours it (CSI),
and a bidi override (U+202E) makes ``os.system`` read as something else. `shown` makes every such
character visible as its escape (``\\x1b``, ``\\u202e``); `markup` additionally neutralises Rich
markup so that ``[bold red]`` in a name is printed, never interpreted. JSON and SARIF need neither:
their encoders escape by construction.
"""
from __future__ import annotations

import re

__all__ = ["shown", "markup", "is_clean"]

# C0 and C1 controls (DEL included), bidi embeddings/overrides/isolates and marks, the Arabic
# letter mark, line/paragraph separators, and the zero-width characters that hide or join text.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")


def _escape(m: re.Match) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown(text) -> str:
    """``text`` with every control, bidi and invisible character written as its escape."""
    if not isinstance(text, str):
        text = str(text)
    return _UNSAFE.sub(_escape, text)


def markup(text) -> str:
    """`shown` text, also safe inside a Rich/Textual markup string (``[`` escaped)."""
    from rich.markup import escape
    return escape(shown(text))


_UNSAFE_IN_OUTPUT = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")


def is_clean(output: str) -> bool:
    """True when a whole output (lines of text) holds no raw control, bidi or invisible character
    other than newline and tab: what tests assert about every command's stdout and stderr."""
    return _UNSAFE_IN_OUTPUT.search(output) is None
