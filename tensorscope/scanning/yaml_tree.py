"""YAML read as PyYAML's composer reads it: nodes with their resolved tags, never constructed.

``yaml.compose_all`` runs PyYAML's scanner, parser and composer: escapes in double-quoted
scalars are decoded (``"os\\x2esystem"`` is ``os.system``), ``%TAG`` directives and verbatim
tags (``!<tag:yaml.org,2002:python/object/apply:os.system>``) resolve to the full tag, anchors
and aliases become shared nodes. Nothing is constructed, so no python tag runs. The node graph is
then turned into inert Python values (dicts, lists, strings) the way SafeLoader would shape them
(merge keys ``<<`` flattened), each node converted once: an alias is the same object, so a
billion-laughs document costs its size, and recursive anchors stay cycles.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_YAML = 2 << 20          # characters composed (configs are KBs; pure-Python PyYAML composes
                            # ~150 KB/s on a loaded machine)
PYTHON_TAG = "tag:yaml.org,2002:python/"
_MERGE = "tag:yaml.org,2002:merge"


@dataclass
class Document:
    """One YAML document as inert values, with what a constructing loader would act on."""
    value: object
    # (tag suffix after "python/" or the local "!python/" form, line, tag as written/resolved)
    python_tags: list[tuple[str, int, bool]] = field(default_factory=list)
    lines: dict[int, int] = field(default_factory=dict)     # id(dict) -> its line (1-based)


class YAMLUnreadable(Exception):
    """The text is not YAML PyYAML's composer accepts (the loader fails on it too)."""


def _loader_class():
    import yaml

    class ComposeOnly(yaml.SafeLoader):
        """SafeLoader's scanner, parser, composer and resolver; its constructor is never used."""
    return ComposeOnly


_LOADER = None


def compose(text: str) -> list[Document]:
    """Every document of ``text``. Raises `YAMLUnreadable`."""
    global _LOADER
    import yaml
    if _LOADER is None:
        _LOADER = _loader_class()
    if len(text) > MAX_YAML:
        raise YAMLUnreadable(f"larger than {MAX_YAML >> 20} MiB: not composed")
    docs = []
    try:
        for node in yaml.compose_all(text, Loader=_LOADER):
            if node is not None:
                docs.append(_convert(node))
    except yaml.YAMLError as e:
        raise YAMLUnreadable(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    except RecursionError:
        raise YAMLUnreadable("nests deeper than PyYAML's composer can follow") from None
    return docs


def _convert(root) -> Document:
    """Inert values for the node graph under ``root`` (iterative: deep documents are fine)."""
    import yaml
    doc = Document(None)
    memo: dict[int, object] = {}
    order: list = []
    stack = [root]
    # first pass: one container per node (aliases share it), tags recorded once per node
    while stack:
        node = stack.pop()
        if id(node) in memo:
            continue
        tag = node.tag or ""
        if tag.startswith(PYTHON_TAG):
            doc.python_tags.append((tag[len(PYTHON_TAG):], node.start_mark.line + 1, True))
        elif tag.startswith("!python/"):
            doc.python_tags.append((tag[len("!python/"):], node.start_mark.line + 1, False))
        if isinstance(node, yaml.ScalarNode):
            memo[id(node)] = _scalar(node)
        elif isinstance(node, yaml.SequenceNode):
            memo[id(node)] = []
            order.append(node)
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            d: dict = {}
            memo[id(node)] = d
            doc.lines[id(d)] = node.start_mark.line + 1
            order.append(node)
            for k, v in node.value:
                stack.append(k)
                stack.append(v)
    # second pass: fill the containers
    for node in order:
        out = memo[id(node)]
        if isinstance(node, yaml.SequenceNode):
            out.extend(memo[id(n)] for n in node.value)
            continue
        merged: list = []
        for k, v in node.value:
            if k.tag == _MERGE:
                merged.extend([v] if isinstance(v, yaml.MappingNode) else
                              [n for n in getattr(v, "value", []) if isinstance(n, yaml.MappingNode)]
                              if isinstance(v, yaml.SequenceNode) else [])
                continue
            out[_key(memo[id(k)])] = memo[id(v)]
        for m in merged:        # merged keys never override the mapping's own (SafeLoader)
            for k, v in m.value:
                if k.tag != _MERGE:
                    out.setdefault(_key(memo[id(k)]), memo[id(v)])
    doc.value = memo[id(root)]
    return doc


def _scalar(node):
    """A scalar as SafeLoader types it by its resolved tag (null, bool, int, float; the rest is
    its text), without running a constructor."""
    tag, v = node.tag, node.value
    if tag == "tag:yaml.org,2002:null":
        return None
    if tag == "tag:yaml.org,2002:bool":
        return v.lower() in ("yes", "true", "on", "y")
    if tag == "tag:yaml.org,2002:int":
        try:
            return int(v.replace("_", ""), 0) if len(v) < 400 else v
        except ValueError:
            return v
    if tag == "tag:yaml.org,2002:float":
        try:
            return float(v.replace("_", ""))
        except ValueError:
            return v
    return v


def _key(k) -> object:
    """A mapping key as a dict key: scalars as their text, containers by identity."""
    return k if isinstance(k, str) else f"<{type(k).__name__} key #{id(k) & 0xffff:x}>"
