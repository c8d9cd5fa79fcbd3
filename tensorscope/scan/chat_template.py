"""GGUF chat templates: Jinja source that every llama.cpp front end renders, read as text.

``tokenizer.chat_template`` (and the named ``tokenizer.chat_template.<name>`` variants) is a
Jinja2 template. llama-cpp-python < 0.2.72 rendered it in a plain ``jinja2.Environment``, so a
template that walks ``''.__class__.__mro__[1].__subclasses__()`` reaches ``os.popen`` when the
model is loaded for chat (CVE-2024-34359, GHSA-56xg-wfcc-g829); sandboxed renderers still run
whatever escapes their sandbox. Real templates only index messages, loop, compare and
concatenate: they never touch a dunder, a private mangled name, or spell underscores through
escapes. Nothing is rendered or parsed by Jinja here; the tags' text is matched.
"""
from __future__ import annotations

import re

from . import loader

_CLOSER = {"{{": "}}", "{%": "%}"}


def _tags(text: str):
    """The Jinja tags ({{ }}, {% %}) of a template, in order, as the lazy regex
    ``\\{\\{.*?\\}\\}|\\{%.*?%\\}`` finds them; comments ({# #}) are never rendered. Found with
    str.find: that regex rescans to the end from every unclosed opener (quadratic)."""
    pos = 0
    next_at = {o: text.find(o) for o in ("{{", "{%")}   # -1: none left (each searched forward)
    while True:
        for o, at in next_at.items():
            if 0 <= at < pos:
                next_at[o] = text.find(o, pos)
        found = [(at, o) for o, at in next_at.items() if at >= 0]
        if not found:
            return
        start, opener = min(found)
        end = text.find(_CLOSER[opener], start + 2)
        if end < 0:     # no closer anywhere after: no later tag of this kind closes either
            next_at[opener] = -1
            pos = start + 1
            continue
        yield text[start:end + 2]
        pos = end + 2
# A dunder or a name-mangled private attribute (self._TemplateReference__context).
_DUNDER = re.compile(r"__[A-Za-z][A-Za-z0-9_]*?__|_[A-Za-z]+__[A-Za-z]\w*")
# Underscores and dots spelled through escapes or built from pieces (filter bypasses).
_OBFUSCATED = re.compile(r"\\x5[fF]|\\u005[fF]|\\137|\\N\{LOW LINE\}|\\x2[eE]|"
                         r"['\"]_+['\"]\s*[*~+]|[~+]\s*['\"]_+['\"]|"   # '_'*2, '_' ~ '_'
                         r"['\"][^'\"]*__|__[^'\"]*['\"]|"      # '__cla' + 'ss__'
                         r"['\"][^'\"]*%c[^'\"]*['\"]\s*[|%]|"   # '%c%c'|format(95, 95)
                         r"\|\s*attr\s*\(|\|\s*string\s*\|\s*list")
# Names that lead out of a template to the interpreter, whatever the sandbox.
_GADGETS = re.compile(r"\b(?:__import__|import_module|popen|subprocess|os\.system|"
                      r"getattr|eval|exec|compile|globals|builtins|mro|subclasses|"
                      r"func_globals|f_back|gi_frame|cr_frame|lipsum|cycler|joiner)\b")


_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)


def template_finding(text: str) -> tuple[str, str] | None:
    """(what, evidence) for the worst thing in one template, None when it is ordinary."""
    for body in _tags(text):
        m = _DUNDER.search(body)
        if m:
            return "reaches the dunder or private attribute", m.group(0)
        m = _OBFUSCATED.search(body)
        if m:
            return "builds attribute names through escapes or filters", m.group(0)
        m = _GADGETS.search(_STRINGS.sub("''", body))   # prose in string literals is not code
        if m:
            return "names an interpreter gadget", m.group(0)
    return None


def check_gguf(ctx: "loader._Ctx", model) -> None:
    """Judge every chat template a GGUF file carries (string or array of strings)."""
    meta = model.metadata.get("gguf") if isinstance(model.metadata, dict) else None
    kv = meta.get("kv") if isinstance(meta, dict) else None
    if not isinstance(kv, dict):
        return
    for key, value in kv.items():
        if not (isinstance(key, str) and key.startswith("tokenizer.chat_template")):
            continue
        if isinstance(value, dict):   # a long array, as the metadata view keeps it
            value = value.get("items", [])
        texts = value if isinstance(value, list) else [value]
        for text in texts[:64]:
            if not isinstance(text, str):
                continue
            hit = template_finding(text)
            if hit is None:
                continue
            what, evidence = hit
            ctx.add("gguf.chat-template-code",
                    f"metadata {key} is a Jinja template that {what} {evidence!r}: rendering it "
                    "for chat (llama.cpp front ends, CVE-2024-34359) escapes to the interpreter",
                    None, None, evidence)
