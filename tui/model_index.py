"""The module tree and the tensor table's row logic, with no Textual in sight.

`build_tree` groups tensors by the components of `TensorInfo.path` (a name with a single
component is split on dots, since most formats store flat dotted names) into `ModuleNode`s that
carry parameter and byte totals per subtree. `select_rows` filters (substring, or glob when the
pattern has ``*?[``) and sorts indices into ``model.tensors``; it is O(n log n) over plain Python
values so it stays fast at 100,000 tensors.
"""
from __future__ import annotations

import fnmatch
import gc
import re
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["ModuleNode", "build_tree", "build_group_tree", "tensor_path", "select_rows", "SORT_KEYS",
           "TensorIndex", "index_chunk"]


def tensor_path(t) -> tuple[str, ...]:
    """The tensor's components: its ``path``, or its dotted name split when the parser gave none."""
    path = tuple(t.path) if t.path else (t.name,)
    if len(path) == 1 and "." in path[0]:
        return tuple(path[0].split("."))
    return path


@dataclass(eq=False, slots=True)
class ModuleNode:
    """One module (a path prefix). ``direct`` holds tensor indices whose parent is this node."""

    name: str
    prefix: tuple[str, ...]
    children: dict[str, "ModuleNode"] = field(default_factory=dict)
    direct: list[int] = field(default_factory=list)
    params: int = 0
    nbytes: int = 0
    count: int = 0
    seen: set = field(default_factory=set)  # grouped tree: the indices a ``#`` node stands for

    @property
    def dotted(self) -> str:
        return ".".join(self.prefix)

    def tensor_indices(self) -> list[int]:
        """Every tensor in this subtree, in saved order."""
        out: list[int] = []
        stack = [self]
        while stack:
            node = stack.pop()
            out.extend(node.direct)
            stack.extend(node.children.values())
        out.sort()
        return out


def build_tree(tensors: Sequence, root_name: str = "model") -> ModuleNode:
    """Group tensors into modules and total params/bytes per subtree in O(tensors + modules)."""
    return _with_gc_paused(_build, tensors, root_name)


def build_group_tree(tensors: Sequence, root_name: str = "model") -> ModuleNode:
    """The same tree with every index collapsed (`tensorscope.grouping`): ``layers.#`` is one node
    for all layers, with the index values it stands for, so a 1,000,000-tensor mixture of
    experts reads as a handful of nodes (``model / layers.# ×60 / mlp / experts.# ×256 / ...``)."""
    return _with_gc_paused(_build_grouped, tensors, root_name)


# An all-digit dotted component: what `grouping.group_key` writes as ``#``.
_INDEX = re.compile(r"(?:(?<=\.)|^)[0-9]+(?=\.|$)")
_HASHED = str.maketrans("0123456789", "#" * 10)


def _new_group(fast: str) -> list:
    """``[members, per-# sets of index strings, positions of the index components, exact, params,
    bytes]`` for a parent whose digits were all turned into ``#`` (``fast``). When a ``#`` sits inside a
    word (``conv2``), the digits are not an index: such parents are grouped exactly (``exact``
    maps their `_INDEX` pattern to its own group)."""
    comps = fast.split(".") if fast else []
    positions = [k for k, c in enumerate(comps) if c and c.strip("#") == ""]
    mixed = any("#" in c and c.strip("#") for c in comps)
    return [[], [set() for _ in positions], positions, {} if mixed else None, 0, 0]


def _build_grouped(tensors: Sequence, root_name: str) -> ModuleNode:
    # Per tensor: one str.translate of its parent's name (digits -> #) and a dict lookup; the
    # index values come from a split only when the parent has indices. The tree itself is built
    # once per distinct pattern, of which there are a handful.
    groups: dict[str, list] = {}
    for i, t in enumerate(tensors):
        path = t.path
        name = (path[0] if path else t.name) if len(path) <= 1 else ".".join(path)
        parent = name.rpartition(".")[0]
        fast = parent.translate(_HASHED)
        g = groups.get(fast)
        if g is None:
            g = groups[fast] = _new_group(fast)
        if g[3] is not None:  # digits inside words: group by the exact pattern (rare, slower)
            pattern = _INDEX.sub("#", parent)
            g = g[3].get(pattern)
            if g is None:
                g = groups[fast][3][pattern] = _new_group(pattern)
        g[0].append(i)
        g[4] += t.numel  # totals in the same pass: each record is touched once
        g[5] += max(t.nbytes, 0) if t.has_data else 0
        if g[2]:
            parts = parent.split(".")
            for seen, k in zip(g[1], g[2]):
                seen.add(parts[k])
    flat: list[tuple[str, list]] = []
    for fast, g in groups.items():
        for key, h in ([(fast, g)] if g[3] is None else g[3].items()):
            flat.append((re.sub("#+", "#", key) if g[3] is None else key, h))
    root = ModuleNode(root_name, ())
    nodes: dict[tuple[str, ...], ModuleNode] = {(): root}
    for pattern, (members, seen, _, _, params, nbytes) in flat:
        comps, _ = _group_components(tuple(pattern.split(".")) if pattern else ())
        node = root
        k = 0
        for depth in range(len(comps)):
            prefix = comps[:depth + 1]
            child = nodes.get(prefix)
            if child is None:
                child = nodes[prefix] = node.children[comps[depth]] = ModuleNode(comps[depth], prefix)
            for _ in range(comps[depth].count("#")):
                child.seen.update(int(v) for v in seen[k])
                k += 1
            node = child
        node.direct.extend(members)
        node.params += params
        node.nbytes += nbytes
        node.count += len(members)
    for prefix in reversed(list(nodes)):
        node = nodes[prefix]
        if prefix:
            parent = nodes[prefix[:-1]]
            parent.params += node.params
            parent.nbytes += node.nbytes
            parent.count += node.count
        if len(node.direct) > 1:
            node.direct.sort()
    return root


def _with_gc_paused(fn, *args):
    # Tens of thousands of small container objects would trigger the cyclic GC over and over
    # (each pass walking every TensorInfo): pause it while building, as the parsers do.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return fn(*args)
    finally:
        if enabled:
            gc.enable()


def _by_parent(tensors: Sequence) -> dict:
    """Tensor indices by parent: the dotted parent string for flat names (one string operation
    per tensor), the component tuple for nested paths."""
    out: dict = {}
    for i, t in enumerate(tensors):
        path = t.path
        key = (path[0] if path else t.name).rpartition(".")[0] if len(path) <= 1 else tuple(path[:-1])
        lst = out.get(key)
        if lst is None:
            out[key] = [i]
        else:
            lst.append(i)
    return out


def _group_components(comps: tuple[str, ...]) -> tuple[tuple[str, ...], list[int]]:
    """``(model, layers, #, mlp)`` -> ``(model, layers.#, mlp)``: an index joins the name before
    it, as `grouping.group_key` writes it (digits are collected too: ``(model, layers, 3)`` ->
    ``((model, layers.#), [3])``)."""
    out: list[str] = []
    idx: list[int] = []
    for c in comps:
        digit = c.isdigit() and c.isascii()
        if digit or c == "#":
            if digit:
                idx.append(int(c))
            out[-1:] = [f"{out[-1]}.#" if out else "#"]
        else:
            out.append(c)
    return tuple(out), idx


def _build(tensors: Sequence, root_name: str) -> ModuleNode:
    root = ModuleNode(root_name, ())
    nodes: dict[tuple[str, ...], ModuleNode] = {(): root}
    for key, members in _by_parent(tensors).items():
        parent = (tuple(key.split(".")) if key else ()) if isinstance(key, str) else key
        node = nodes.get(parent)
        if node is None:
            # Create the missing chain of ancestors once.
            depth = len(parent)
            while depth and parent[:depth] not in nodes:
                depth -= 1
            node = nodes[parent[:depth]]
            for k in range(depth, len(parent)):
                child = ModuleNode(parent[k], parent[:k + 1])
                node.children[parent[k]] = child
                nodes[parent[:k + 1]] = child
                node = child
        node.direct.extend(members)
        node.params += sum(tensors[i].numel for i in members)
        # tensors saved without data (traced inputs) stay out of the byte totals
        node.nbytes += sum(max(t.nbytes, 0) for t in map(tensors.__getitem__, members) if t.has_data)
        node.count += len(members)
    # Post-order accumulation: children were created after their parents, so reversed creation
    # order visits every child before its parent.
    for prefix in reversed(list(nodes)):
        node = nodes[prefix]
        if prefix:
            parent = nodes[prefix[:-1]]
            parent.params += node.params
            parent.nbytes += node.nbytes
            parent.count += node.count
    return root


SORT_KEYS = {
    "#": None,
    "name": lambda t: t.name,
    "dtype": lambda t: (t.dtype, t.name),
    "shape": lambda t: (len(t.shape), t.shape),
    "params": lambda t: t.numel,
    "bytes": lambda t: t.nbytes,
    "offset": lambda t: (t.byte_offset is None, t.byte_offset or 0),
}


def _matcher(pattern: str):
    pat = pattern.strip().lower()
    if not pat:
        return None
    if any(c in pat for c in "*?["):
        return lambda name: fnmatch.fnmatchcase(name.lower(), pat)
    return lambda name: pat in name.lower()


def select_rows(tensors: Sequence, indices: Sequence[int], pattern: str = "", sort: str = "#",
                reverse: bool = False) -> list[int]:
    """The indices to show: filtered by name (substring, or glob with ``*?[``), then sorted."""
    match = _matcher(pattern)
    rows = [i for i in indices if match(tensors[i].name)] if match else list(indices)
    key = SORT_KEYS.get(sort)
    if key is not None:
        rows.sort(key=lambda i: key(tensors[i]), reverse=reverse)
    elif reverse:
        rows.reverse()
    return rows


def _compile(pattern: str):
    """``(kind, test)``: a substring, or a glob when the pattern has ``*?[``. The usual globs
    (``*.weight``, ``layers.1.*``, ``*up*``) become string tests, many times faster than the
    regular expression `fnmatch` would run; the rest are compiled once."""
    pat = pattern.strip().lower()
    if not pat:
        return "", None
    if not any(c in pat for c in "*?["):
        return "sub", pat
    core = pat.strip("*")
    if core and not any(c in core for c in "*?["):
        if pat.startswith("*") and pat.endswith("*"):
            return "sub", core
        if pat.startswith("*"):
            return "glob", lambda name: name.endswith(core)
        return "glob", lambda name: name.startswith(core)
    return "glob", re.compile(fnmatch.translate(pat)).match


def index_chunk(tensors: Sequence) -> tuple[list, dict]:
    """What `TensorIndex` keeps per tensor (the lowercase names) and the column widths, for
    ``tensors``: computed once for a model, or per shard as shards arrive (`TensorIndex.extend`)."""
    lower = []
    for t in tensors:
        name = t.name
        low = name.lower()
        lower.append(name if low == name else low)
    dtypes = {t.dtype for t in tensors}
    shapes = {t.shape for t in tensors}
    offsets = [t.byte_offset for t in tensors if t.byte_offset is not None]
    widths = {
        "dtype": max((len(d) for d in dtypes), default=5),
        "shape": max((len("×".join(map(str, s)) or "scalar") for s in shapes), default=5),
        "offset": len(str(max(offsets))) if offsets else 1,
    }
    return lower, widths


class TensorIndex:
    """What the table needs per model, computed once: lowercase names, sort orders, column widths.

    `select` filters and sorts in O(candidates) with no per-row object: a substring test over a
    precomputed lowercase name (the name itself when it is already lowercase, so a million names
    cost one list), a compiled glob otherwise; a query that extends the previous one filters the
    previous result only. Sort orders over all tensors are computed once per column and reused.
    """

    def __init__(self, tensors: Sequence):
        self.tensors = tensors
        self.lower, self.widths = index_chunk(tensors)
        self._orders: dict[str, list[int]] = {}
        self._ranks: dict[str, list[int]] = {}
        self._base: tuple = (None, None)
        self._last: tuple = (None, "", "", None)

    def extend(self, chunk: tuple[list, dict]) -> bool:
        """Take in the tensors appended to ``tensors`` since (a shard read while the first screen
        is up): ``chunk`` is `index_chunk` of them, made off the UI thread. True when a column
        got wider."""
        lower, widths = chunk
        self.lower.extend(lower)
        wider = {k: max(v, self.widths[k]) for k, v in widths.items()}
        grew = wider != self.widths
        self.widths = wider
        self._orders.clear()   # every cached order and selection is over the old rows
        self._ranks.clear()
        self._base = (None, None)
        self._last = (None, "", "", None)
        return grew

    def order(self, sort: str) -> list[int]:
        if sort not in self._orders:
            key = SORT_KEYS.get(sort)
            tensors = self.tensors
            rows = list(range(len(tensors)))
            if key is not None:
                rows.sort(key=lambda i: key(tensors[i]))
            self._orders[sort] = rows
        return self._orders[sort]

    def _rank(self, sort: str) -> list[int]:
        if sort not in self._ranks:
            rank = [0] * len(self.tensors)
            for pos, i in enumerate(self.order(sort)):
                rank[i] = pos
            self._ranks[sort] = rank
        return self._ranks[sort]

    def base(self, node: ModuleNode | None, sort: str = "#", reverse: bool = False) -> list[int]:
        """The rows under ``node`` (None: every tensor) in display order, before filtering."""
        key = (node, sort, reverse)  # the node itself (compared by identity), never a reused id
        if self._base[0] == key:
            return self._base[1]
        if node is None:
            rows = self.order(sort)
        else:
            rows = node.tensor_indices()
            if sort != "#":
                rows.sort(key=self._rank(sort).__getitem__)
        if reverse:
            rows = rows[::-1]
        self._base = (key, rows)
        return rows

    def select(self, node: ModuleNode | None, pattern: str = "", sort: str = "#",
               reverse: bool = False) -> list[int]:
        """The indices to show under ``node``, filtered by ``pattern``, sorted."""
        rows = self.base(node, sort, reverse)
        kind, test = _compile(pattern)
        if test is None:
            return rows
        key = (node, sort, reverse)
        last_key, last_kind, last_pat, last_rows = self._last
        if kind == "sub" and last_kind == "sub" and last_key == key and last_pat in test:
            rows = last_rows  # the query extends the previous one: filter its result only
        low = self.lower
        if kind == "sub":
            out = [i for i in rows if test in low[i]]
        else:
            out = [i for i in rows if test(low[i])]
        self._last = (key, kind, test if kind == "sub" else "", out)
        return out
