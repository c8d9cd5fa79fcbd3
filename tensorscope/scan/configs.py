"""Model configs that loaders turn into calls: Hydra ``_target_`` keys and PyYAML python tags.

NeMo (``.nemo`` tars: ``model_config.yaml``), Lightning and every Hydra-based trainer restore a
model by ``hydra.utils.instantiate(cfg)``, which imports and calls whatever dotted name a
``_target_`` key holds (NVIDIA NeMo CVE-2025-23304). PyYAML's unsafe loaders build objects from
``!!python/object/apply:``, ``!!python/object/new:``, ``!!python/name:`` and
``!!python/module:`` tags (Lightning's ``hparams.yaml``, CVE-2021-4118). The text is matched,
never parsed by YAML or instantiated; each named callable is judged by the pickle policy.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .. import policy

if TYPE_CHECKING:
    from . import loader

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
MAX_TEXT = 16 << 20     # configs are KBs; a larger text is read up to this

# ``_target_: os.system`` (YAML, quoted or not) and ``"_target_": "os.system"`` (JSON).
# ``${get_method:os.system}`` (and get_class, get_object): an interpolation resolving to a callable
# that a partial or a target then calls.
_TARGET = re.compile(r"""['"]?_target_['"]?\s*:\s*['"]?([A-Za-z_][\w.]*)|"""
                     r"""\$\{\s*(?:hydra\.utils\.)?get_(?:method|class|object)\s*:\s*([A-Za-z_][\w.]*)""")
# ``!!python/object/apply:os.system``, ``!python/name:...`` (the local tag form too).
_PY_TAG = re.compile(r"!!?python/(object/apply|object/new|object|name|module):([A-Za-z_][\w.]*)")


# jsonpickle (``jsonpickle.decode``) imports every ``py/object``, ``py/type`` and ``py/function``
# it meets and calls them through ``py/reduce``/``py/newargs``; ``py/repr`` is ``module/expr``,
# evaluated with eval after the import.
_JSONPICKLE = re.compile(r'"py/(object|type|function|repr|mod)"\s*:\s*"([^"\\]{1,400})"')

# Denied in a pickle (they call or build what they are given) but ordinary as a Hydra target:
# what they wrap is itself a `_target_` here, judged on its own.
_ORDINARY_TARGETS = {"functools.partial", "torch.compile"}


def _verdict(dotted: str) -> policy.Verdict:
    module, _, name = dotted.rpartition(".")
    return policy.classify(module or "builtins", name)


def check_text(ctx: "loader._Ctx", text: str, member: str | None) -> None:
    """Report the ``_target_`` keys and python tags of one config text."""
    text = text[:MAX_TEXT]
    seen: set[str] = set()
    for m in _TARGET.finditer(text):
        dotted = m.group(1) or m.group(2)
        if dotted in seen:
            continue
        seen.add(dotted)
        verdict = _verdict(dotted)
        if verdict.category == policy.DENIED and dotted not in _ORDINARY_TARGETS:
            line = text.count("\n", 0, m.start()) + 1
            ctx.add("config.hydra-target", f"_target_ {dotted} (line {line}): Hydra's "
                    f"instantiate imports and calls it when the model is restored: "
                    f"{verdict.reason}", member, None, dotted, "member")
    _check_jsonpickle(ctx, text, member)
    for m in _PY_TAG.finditer(text):
        kind, dotted = m.group(1), m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        verdict = _verdict(dotted) if kind != "module" else policy.classify(dotted, "*")
        denied = verdict.category == policy.DENIED
        ctx.add("config.yaml-python-tag",
                f"YAML tag !!python/{kind}:{dotted} (line {line}): an unsafe YAML load "
                f"({'imports and calls' if 'apply' in kind or kind == 'object/new' else 'imports'}"
                f" it){': ' + verdict.reason if denied else ''}", member, None, dotted, "member",
                variant="denied" if denied else None)


def _check_jsonpickle(ctx: "loader._Ctx", text: str, member: str | None) -> None:
    """jsonpickle tags: a callable the policy denies (or any ``py/repr``, an eval) is critical,
    any other name medium (decoding imports and instantiates it, as a pickle's user class)."""
    seen: set[tuple[str, str]] = set()
    for m in _JSONPICKLE.finditer(text):
        kind, value = m.group(1), m.group(2)
        if (kind, value) in seen or len(seen) >= 64:
            continue
        seen.add((kind, value))
        line = text.count("\n", 0, m.start()) + 1
        if kind == "repr":
            ctx.add("config.jsonpickle", f"jsonpickle py/repr {value!r} (line {line}): decoding "
                    "imports the module and evaluates the expression (eval)", member, None,
                    value.split("/")[0], "member", variant="denied")
            continue
        dotted = value.replace("/", ".") if kind != "mod" else value
        verdict = policy.classify(dotted, "*") if kind == "mod" else _verdict(dotted)
        denied = verdict.category == policy.DENIED
        ctx.add("config.jsonpickle", f"jsonpickle py/{kind} {dotted} (line {line}): "
                f"jsonpickle.decode imports {'and calls ' if kind != 'mod' else ''}it"
                + (f": {verdict.reason}" if denied else ""), member, None, dotted, "member",
                variant="denied" if denied else None)
