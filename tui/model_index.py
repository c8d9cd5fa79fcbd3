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
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["ModuleNode", "build_tree", "tensor_path", "select_rows", "SORT_KEYS"]


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
    # Tens of thousands of small container objects would trigger the cyclic GC over and over
    # (each pass walking every TensorInfo): pause it while building, as the parsers do.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build_tree(tensors, root_name)
    finally:
        if enabled:
            gc.enable()


def _build_tree(tensors: Sequence, root_name: str) -> ModuleNode:
    root = ModuleNode(root_name, ())
    nodes: dict[tuple[str, ...], ModuleNode] = {(): root}
    for i, t in enumerate(tensors):
        parent = tensor_path(t)[:-1]
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
        node.direct.append(i)
        node.params += t.numel
        node.nbytes += max(t.nbytes, 0) if t.has_data else 0
        node.count += 1
    # Post-order accumulation: children were created after their parents, so reversed creation
    # order visits every child before its parent.
    for prefix in reversed(list(nodes)):
        if prefix:
            child = nodes[prefix]
            parent = nodes[prefix[:-1]]
            parent.params += child.params
            parent.nbytes += child.nbytes
            parent.count += child.count
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
