"""Python-looking text in safetensors ``__metadata__``: evidence, since no known loader runs it.

``__metadata__`` is a str -> str map. safetensors itself never interprets it; transformers reads
only ``format`` (``pt``/``tf``/``flax``/``mlx``); diffusers, kohya's sd-scripts and ComfyUI read
``ss_*``/``modelspec.*`` values as JSON or plain text. None of them evaluates a value, so a value
that is Python source calling ``os.system`` runs nothing on load: it is reported at low, as
evidence of intent (pickled payloads hidden there are judged as pickles elsewhere). The text is
tokenized (never compiled, not even through ``ast.parse``) and judged with the repository-code
rules.
"""
from __future__ import annotations

import tokenize
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import ScanContext

MAX_VALUE = 1 << 16     # characters of one value judged
MAX_VALUES = 4096


def python_dangers(text: str) -> list[tuple[str, str]]:
    """(trigger, what) of a value that reads as Python doing what repository code is judged
    for (eval, os.system, subprocess ...); empty otherwise (JSON, prose, numbers)."""
    from . import torchscript
    if not isinstance(text, str) or len(text) < 8 or len(text) > MAX_VALUE or \
            ("(" not in text and "import" not in text):
        return []
    try:
        return torchscript.source_dangers(text)
    except (tokenize.TokenError, *torchscript.SOURCE_UNREADABLE):
        return []


def check_safetensors(ctx: "ScanContext", user_meta: dict) -> None:
    from .pickles import short_repr
    for key, value in list(user_meta.items())[:MAX_VALUES]:
        hits = python_dangers(value)
        if hits:
            ctx.add("safetensors.metadata-code",
                    f"__metadata__ key {short_repr(key)} holds Python source that "
                    + "; ".join(what for _, what in hits[:3])
                    + ": no known loader evaluates safetensors metadata (evidence only)",
                    None, None, hits[0][0])
