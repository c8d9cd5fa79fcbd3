"""Model configs that loaders turn into calls, judged from the values their own parsers decode.

- Hydra ``_target_`` (with ``_partial_`` and ``_args_``): NeMo (``.nemo`` tars:
  ``model_config.yaml``), Lightning and every Hydra-based trainer restore a model by
  ``hydra.utils.instantiate(cfg)``, which imports and calls the dotted name a ``_target_``
  holds (CVE-2025-23304). OmegaConf interpolations (``${a.b}``, ``${.x}``, string
  interpolation, ``oc.select``/``oc.decode``) are resolved symbolically over the same document,
  and ``${get_method:...}`` (get_class, get_object) names a callable that is imported.
- PyYAML python tags: the unsafe loader builds objects from ``python/object/apply``,
  ``object/new``, ``object``, ``name`` and ``module`` tags (CVE-2021-4118), however spelled
  (``!!``, ``%TAG``, verbatim ``!<tag:yaml.org,2002:python/...>``). Lightning writes
  ``!!python/object/apply:pathlib.PosixPath`` for a path hyperparameter (known inert).
- jsonpickle: ``jsonpickle.decode`` imports every ``py/object``, ``py/type`` and
  ``py/function`` and calls them (``py/reduce``, ``py/newargs``); ``py/repr`` is evaluated.
- ``.pt2`` ``models/*.json``: ``expr_str`` fields go to ``sympy.sympify`` and ``guards_code`` to
  ``exec`` (`pt2_exprs`).

YAML is composed by PyYAML (`yaml_tree`: never constructed), JSON decoded by ``json.loads``, so
``\\x2e``, ``\\u005f`` and ``\\/`` escapes, anchors, aliases and merge keys resolve exactly as
the loader resolves them. Each named callable is judged by the pickle policy.
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Iterator

from .. import policy
from . import pt2_exprs, yaml_tree

if TYPE_CHECKING:
    from .context import ScanContext

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
MAX_TEXT = 16 << 20     # configs are KBs; a larger text is read up to this
MAX_NODES = 1 << 20     # values walked per document
MAX_RESOLVE_DEPTH = 16  # interpolations followed through other interpolations

# Denied in a pickle (they call or build what they are given) but ordinary as a Hydra target:
# what they wrap is itself a `_target_` here, judged on its own.
_ORDINARY_TARGETS = {"functools.partial", "torch.compile"}
# OmegaConf/Hydra resolvers that import the callable their argument names.
_IMPORTING_RESOLVERS = {"get_method", "get_class", "get_object", "hydra.utils.get_method",
                        "hydra.utils.get_class", "hydra.utils.get_object"}
_DOTTED = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*\Z")
# PyYAML's python/ tags that build values of builtin types (FullLoader builds them too).
_INERT_TYPE_TAGS = {"none", "bool", "int", "long", "float", "complex", "str", "unicode",
                    "bytes", "list", "tuple", "dict"}


def _verdict(dotted: str) -> policy.Verdict:
    module, _, name = dotted.rpartition(".")
    return policy.classify(module or "builtins", name)


# -- decoding -----------------------------------------------------------------------------------

def documents(text: str, member: str | None = None) -> list[yaml_tree.Document]:
    """The documents a loader decodes from ``text``: JSON through ``json.loads`` when it is
    JSON, YAML through PyYAML's composer otherwise; empty when neither accepts it (the loader
    fails on it too)."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if stripped[:1] in ("{", "[") or (member or "").lower().endswith(".json"):
        try:
            return [yaml_tree.Document(json.loads(text))]
        except (ValueError, RecursionError):
            if (member or "").lower().endswith(".json"):
                return []
    try:
        return yaml_tree.compose(text)
    except yaml_tree.YAMLUnreadable:
        return []


def check_text(ctx: "ScanContext", text: str, member: str | None) -> None:
    """Report what loading one config text imports and calls."""
    text = text[:MAX_TEXT]
    docs = documents(text, member)
    if not docs and len(text) > yaml_tree.MAX_YAML:
        ctx.add("config.hydra-target", f"a {len(text) / 2 ** 20:.1f} MiB config, larger than the "
                f"{yaml_tree.MAX_YAML >> 20} MiB this scan composes as YAML: its targets and tags "
                "are not judged", member, None, "size", "member", variant="unresolved")
    for doc in docs:
        _check_python_tags(ctx, doc, member)
        _check_hydra(ctx, doc, member)
        _check_jsonpickle(ctx, doc, member)
        if _is_pt2_model_json(ctx, member):
            _check_pt2(ctx, doc.value, member)


# -- PyYAML python tags -------------------------------------------------------------------------

def _check_python_tags(ctx, doc: yaml_tree.Document, member) -> None:
    seen: set[str] = set()
    for suffix, line, resolved in doc.python_tags[:256]:
        if suffix in seen:
            continue
        seen.add(suffix)
        kind, _, dotted = suffix.partition(":")
        spelled = f"!!python/{suffix}" if resolved else f"!python/{suffix} (a local tag " \
            "spelled as PyYAML's; judged as the tag it imitates)"
        if kind in _INERT_TYPE_TAGS and not dotted:
            ctx.add("config.yaml-python-tag", f"YAML tag {spelled} (line {line}): a builtin "
                    "value, built by PyYAML's full and unsafe loaders (safe_load refuses it)",
                    member, None, suffix, "member", variant="inert")
            continue
        if kind not in ("object/apply", "object/new", "object", "name", "module") or not dotted:
            continue
        verdict = policy.classify(dotted, "*") if kind == "module" else _verdict(dotted)
        calls = kind in ("object/apply", "object/new")
        what = "imports and calls" if calls else "imports and builds" if kind == "object" \
            else "imports"
        if verdict.category == policy.DENIED:
            variant, why = "denied", f": {verdict.reason}"
        elif _known_inert(verdict):
            variant, why = "inert", (f": known inert ({verdict.reason}); PyYAML's full_load "
                                     "(Lightning's load_hparams_from_yaml) refuses the tag, "
                                     "only an unsafe load builds it" if calls or kind == "object"
                                     else f": known inert ({verdict.reason})")
        else:
            variant, why = None, ""
        ctx.add("config.yaml-python-tag", f"YAML tag {spelled} (line {line}): an unsafe YAML "
                f"load {what} {dotted}{why}", member, None, dotted, "member", variant=variant)


def _known_inert(verdict: policy.Verdict) -> bool:
    """A class whose construction runs nothing the file chooses: the weights-only allowlist and
    pathlib's path values (what Lightning writes). Other framework names stay high here: a
    YAML tag can call any of their functions with any arguments."""
    return verdict.category == policy.ALLOWED or (
        verdict.category == policy.FRAMEWORK and (verdict.entry or "").startswith("pathlib."))


# -- Hydra / OmegaConf --------------------------------------------------------------------------

def _walk(value) -> Iterator[tuple[dict, tuple]]:
    """(mapping, path) for every mapping under ``value``, each once (aliases, cycles)."""
    seen: set[int] = set()
    stack: list[tuple[object, tuple]] = [(value, ())]
    n = 0
    while stack and n < MAX_NODES:
        node, path = stack.pop()
        n += 1
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            yield node, path
            stack.extend((v, path + (k,)) for k, v in node.items() if isinstance(v, (dict, list)))
        else:
            stack.extend((v, path + (i,)) for i, v in enumerate(node)
                         if isinstance(v, (dict, list)))


def _strings(value) -> Iterator[str]:
    """Every string holding an interpolation, anywhere under ``value`` (each container once)."""
    seen: set[int] = set()
    stack = [value]
    n = 0
    while stack and n < MAX_NODES:
        node = stack.pop()
        n += 1
        if isinstance(node, str):
            if "${" in node:
                yield node
        elif isinstance(node, (dict, list)) and id(node) not in seen:
            seen.add(id(node))
            stack.extend(node.values() if isinstance(node, dict) else node)


def _check_hydra(ctx, doc: yaml_tree.Document, member) -> None:
    root = doc.value
    resolver = _Resolver(root)
    judged: set[str] = set()
    for mapping, path in _walk(root):
        if "_target_" not in mapping:
            continue
        line = doc.lines.get(id(mapping))
        at = f"{'.'.join(map(str, path)) or 'the top'}" + (f", line {line}" if line else "")
        raw = mapping["_target_"]
        names = resolver.resolve(raw, path) if isinstance(raw, str) else None
        partial = mapping.get("_partial_") in (True, "true", "True")
        if not names:
            ctx.add("config.hydra-target", f"_target_ at {at} is {_show(raw)}, which does not "
                    "resolve to a dotted name from the document alone: Hydra's instantiate "
                    "imports and calls whatever it resolves to", member, None, _show(raw),
                    "member", variant="unresolved")
            continue
        for dotted in sorted(names):
            judged.add(dotted)
            _judge_target(ctx, dotted, at, raw, partial, member)
    for text in _strings(root):
        for dotted in resolver.imported(text):
            if dotted not in judged:
                judged.add(dotted)
                _judge_target(ctx, dotted, "an interpolation", text, False, member,
                              resolver_call=True)


def _show(raw) -> str:
    return repr(raw)[:80]


def _judge_target(ctx, dotted: str, at: str, raw, partial: bool, member,
                  resolver_call: bool = False) -> None:
    if not _DOTTED.match(dotted):
        ctx.add("config.hydra-target", f"_target_ at {at} resolves to {dotted!r:.80}, which is "
                "not a dotted name: Hydra's locate fails on it", member, None, dotted[:80],
                "member", variant="unresolved")
        return
    verdict = _verdict(dotted)
    if verdict.category != policy.DENIED or dotted in _ORDINARY_TARGETS:
        return
    via = "" if raw == dotted else f" (written {_show(raw)})"
    if resolver_call:
        what = f"${{get_method:{dotted}}} at {at}: the resolver imports it for a target to call"
    else:
        what = (f"_target_ {dotted} at {at}{via}: Hydra's instantiate imports "
                + ("it and binds it (_partial_: the caller calls it)" if partial else
                   "and calls it") + " when the model is restored")
    ctx.add("config.hydra-target", f"{what}: {verdict.reason}", member, None, dotted, "member")


class _Resolver:
    """OmegaConf's interpolation grammar, evaluated symbolically over one decoded document:
    node references (absolute, relative ``${.x}``/``${..x}``, ``[key]``), string
    interpolation, ``oc.select`` and ``oc.decode``; ``oc.env`` and unknown resolvers are
    unknown (None)."""

    def __init__(self, root):
        self.root = root
        self.steps = 0      # interpolations followed per document (a doubling chain is bounded)

    def resolve(self, value: str, path: tuple, depth: int = 0) -> set[str] | None:
        """The strings ``value`` can become, None when unknown."""
        self.steps += 1
        if depth > MAX_RESOLVE_DEPTH or self.steps > 20_000 or len(value) > 1 << 16:
            return None
        parts = _parse(value)
        if parts is None:
            return None
        out = {""}
        for kind, item in parts:
            if kind == "lit":
                options = {item}
            else:
                options = self.interp(item, path, depth)
                if options is None:
                    return None
            out = {a + b for a in out for b in options}
            if len(out) > 64 or sum(map(len, out)) > 1 << 16:
                return None
        return out

    def interp(self, inner: str, path: tuple, depth: int) -> set[str] | None:
        name, args = _split_resolver(inner)
        if name is None:
            key = self.resolve(inner, path, depth + 1)
            if key is None or len(key) != 1:
                return None
            return self.lookup(next(iter(key)), path, depth)
        if name == "oc.select" and args:
            got = self.interp(args[0], path, depth)
            if got is not None:
                return got
            return self.resolve(_unquote(args[1]), path, depth + 1) if len(args) > 1 else None
        if name == "oc.decode" and args:
            got = self.resolve(_unquote(args[0]), path, depth + 1)
            return {_unquote(g) for g in got} if got is not None else None
        return None

    def imported(self, text: str, depth: int = 0) -> list[str]:
        """The dotted names the importing resolvers of ``text`` name (nested ones too)."""
        found: list[str] = []
        parts = _parse(text) or []
        for kind, item in parts:
            if kind != "interp" or depth > MAX_RESOLVE_DEPTH:
                continue
            name, args = _split_resolver(item)
            if name in _IMPORTING_RESOLVERS and args:
                got = self.resolve(_unquote(args[0]), (), depth + 1)
                found.extend(sorted(got or {_unquote(args[0])}))
            for a in args or [item]:
                found.extend(self.imported(a, depth + 1))
        return found

    def lookup(self, key: str, path: tuple, depth: int) -> set[str] | None:
        """The value at an OmegaConf key (``a.b``, ``.x``, ``..x``, ``a[0]``)."""
        dots = len(key) - len(key.lstrip("."))
        if dots:
            # relative to the node holding the interpolation: path is that mapping's path
            base = path[:len(path) - (dots - 1)] if dots - 1 <= len(path) else None
            if base is None:
                return None
            key = key[dots:]
        else:
            base = ()
        node = self.root
        for p in base:
            node = _child(node, p)
            if node is None:
                return None
        for p in _key_parts(key):
            node = _child(node, p)
            if node is None:
                return None
        if isinstance(node, str):
            return self.resolve(node, base + tuple(_key_parts(key))[:-1], depth + 1) \
                if "${" in node else {node}
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            return {str(node)}
        return None


def _child(node, key):
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    if isinstance(node, list) and isinstance(key, str) and key.isdigit():
        i = int(key)
        return node[i] if i < len(node) else None
    return None


def _key_parts(key: str) -> list:
    parts: list = []
    for piece in re.split(r"\.(?![^\[]*\])", key):
        m = re.match(r"^([^\[\]]*)((?:\[[^\]]*\])*)$", piece)
        if not m:
            parts.append(piece)
            continue
        if m.group(1):
            parts.append(m.group(1))
        for b in re.findall(r"\[([^\]]*)\]", m.group(2)):
            parts.append(int(b) if b.isdigit() else b)
    return parts


def _parse(text: str) -> list[tuple[str, str]] | None:
    """Literal and ``${...}`` parts of an OmegaConf string (``\\${`` is a literal ``${``);
    None when a ``${`` never closes (OmegaConf's grammar rejects it)."""
    parts: list[tuple[str, str]] = []
    lit: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        if text.startswith("\\${", i):
            lit.append("${")
            i += 3
            continue
        if text.startswith("${", i):
            depth, j, quote = 1, i + 2, None
            while j < n and depth:
                c = text[j]
                if quote:
                    if c == "\\":
                        j += 1
                    elif c == quote:
                        quote = None
                elif c in "'\"":
                    quote = c
                elif text.startswith("${", j):
                    depth += 1
                    j += 1
                elif c == "}":
                    depth -= 1
                j += 1
            if depth:
                return None
            if lit:
                parts.append(("lit", "".join(lit)))
                lit = []
            parts.append(("interp", text[i + 2:j - 1]))
            i = j
            continue
        lit.append(text[i])
        i += 1
    if lit:
        parts.append(("lit", "".join(lit)))
    return parts


def _split_resolver(inner: str) -> tuple[str | None, list[str]]:
    """(resolver name, its arguments) of ``name:arg1,arg2``; (None, []) for a node reference."""
    m = re.match(r"\s*([A-Za-z_][\w.]*)\s*:", inner)
    if not m:
        return None, []
    body = inner[m.end():]
    args: list[str] = []
    cur: list[str] = []
    depth, quote, i = 0, None, 0
    while i < len(body):
        c = body[i]
        if quote:
            if c == "\\" and i + 1 < len(body):
                cur.append(body[i:i + 2])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif body.startswith("${", i):
            depth += 1
        elif c == "}" and depth:
            depth -= 1
        elif c == "," and not depth:
            args.append("".join(cur).strip())
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    args.append("".join(cur).strip())
    return m.group(1), args


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return re.sub(r"\\(.)", r"\1", s[1:-1])
    return s


# -- jsonpickle ---------------------------------------------------------------------------------

_JSONPICKLE_TAGS = ("py/object", "py/type", "py/function", "py/repr", "py/mod")


def _check_jsonpickle(ctx, doc: yaml_tree.Document, member) -> None:
    """jsonpickle tags in decoded values: a callable the policy denies (or any ``py/repr``, an
    eval) is critical, any other name medium (decoding imports and instantiates it)."""
    seen: set[tuple[str, str]] = set()
    for mapping, path in _walk(doc.value):
        for tag in _JSONPICKLE_TAGS:
            value = mapping.get(tag)
            if not isinstance(value, str) or (tag, value) in seen or len(seen) >= 64:
                continue
            seen.add((tag, value))
            kind = tag[3:]
            at = ".".join(map(str, path)) or "the top"
            if kind == "repr":
                ctx.add("config.jsonpickle", f"jsonpickle py/repr {value[:200]!r} at {at}: "
                        "decoding imports the module and evaluates the expression (eval)",
                        member, None, value.split("/")[0], "member", variant="denied")
                continue
            dotted = value.replace("/", ".") if kind != "mod" else value
            verdict = policy.classify(dotted, "*") if kind == "mod" else _verdict(dotted)
            denied = verdict.category == policy.DENIED
            ctx.add("config.jsonpickle", f"jsonpickle py/{kind} {dotted} at {at}: "
                    f"jsonpickle.decode imports {'and calls ' if kind != 'mod' else ''}it"
                    + (f": {verdict.reason}" if denied else ""), member, None, dotted, "member",
                    variant="denied" if denied else None)


# -- .pt2 --------------------------------------------------------------------------------------

def _is_pt2_model_json(ctx, member: str | None) -> bool:
    """``<archive>/models/<name>.json`` of a torch.export archive, or the legacy
    ``serialized_exported_program.json`` that torch.export.load still reads (torch 2.13
    torch/export/__init__.py): what it deserializes."""
    if not member or not member.endswith(".json"):
        return False
    parts = member.replace("\\", "/").split("/")
    return (len(parts) >= 2 and parts[-2] == "models") or \
        parts[-1] == "serialized_exported_program.json"


def _check_pt2(ctx, doc, member) -> None:
    for kind, text, where in pt2_exprs.fields(doc):
        why = pt2_exprs.judge_expr(text) if kind == "expr_str" else pt2_exprs.judge_guard(text)
        if why is None:
            continue
        runs = ("torch.export.load passes it to sympy.sympify, which evaluates it" if
                kind == "expr_str" else
                "ExportedProgram.module() pastes it into Python source that it executes, and the "
                "guard runs on every call of the module")
        ctx.add("pt2.evaluated-text", f"{kind} at {where} = {text[:120]!r} is not a shape "
                f"expression ({why}): {runs}", member, None, text[:80], "member",
                variant="unjudged" if "not judged" in why else None)
        if len(ctx.findings) > 10_000:
            return

