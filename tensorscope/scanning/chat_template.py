"""Chat templates: Jinja that every chat renders, judged from jinja2's own parse tree.

``tokenizer.chat_template`` of a GGUF file (and the named ``tokenizer.chat_template.<name>``
variants), and a repository's ``chat_template`` (`hf_repo`), are Jinja2 templates.
llama-cpp-python < 0.2.72 rendered them in a plain ``jinja2.Environment``, so a template that
walks ``''.__class__.__mro__[1].__subclasses__()`` reaches ``os.popen`` when the model is loaded
for chat (CVE-2024-34359, GHSA-56xg-wfcc-g829); sandboxed renderers (transformers) refuse
'_'-names, and run whatever escapes their sandbox. Real templates only index messages, loop,
compare and concatenate. The template is parsed by jinja2 and its tree walked with constant
folding (`jinja_tree`): nothing is compiled or rendered.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import jinja_tree

if TYPE_CHECKING:
    from .context import ScanContext

# jinja_tree levels -> rule variants (severities in the rule registry)
VARIANT = {jinja_tree.ESCAPE: None, jinja_tree.SUSPECT: "suspect",
           jinja_tree.UNPARSED: "unparsed", jinja_tree.EVIDENCE: "evidence"}


def template_findings(text: str) -> list[jinja_tree.Hit]:
    """Every hit of one template, worst first; empty when it is ordinary."""
    return jinja_tree.findings(text)


def template_finding(text: str) -> jinja_tree.Hit | None:
    """The worst hit of one template, None when it is ordinary."""
    hits = jinja_tree.findings(text)
    return hits[0] if hits else None


def report(ctx: "ScanContext", rule: str, text: str, where: str, consequence: str,
           member: str | None = None) -> None:
    """Add a ``rule`` finding for one template: its worst hit (the others say no more)."""
    hit = template_finding(text)
    if hit is not None:
        line = f" (line {hit.line})" if hit.line else ""
        tail = consequence if hit.level in (jinja_tree.ESCAPE, jinja_tree.SUSPECT) else \
            "evidence only" if hit.level == jinja_tree.EVIDENCE else "not known to be safe"
        ctx.add(rule, f"{where} is a Jinja template that {hit.what}{line}: {tail}", member, None,
                hit.evidence, variant=VARIANT[hit.level])


def check_gguf(ctx: "ScanContext", model) -> None:
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
            if isinstance(text, str):
                report(ctx, "gguf.chat-template-code", text, f"metadata {key}",
                       "rendering it for chat (llama.cpp front ends, CVE-2024-34359) escapes to "
                       "the interpreter")
