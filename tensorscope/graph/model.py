"""The graph as every output shows it: graphs of nodes, each node with its values, the parameters
it consumes, its parameters and FLOPs; totals per graph, per repeated block and per model.

Format readers (`onnx`, `pt2`, `torchscript` in this package) fill `Graph` and `Node`; the
counting here is the same for all of them.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..grouping import group_key
from .flops import COUNTER_KINDS, NONE

__all__ = ["Value", "Node", "Graph", "GraphModel", "SCHEMA", "block_of"]

SCHEMA = "tensorscope.graph/1"


@dataclass(slots=True)
class Value:
    """A value flowing between nodes: its name, and dtype and shape where known (a dimension
    may be a symbol, a str)."""

    name: str
    dtype: str | None = None
    shape: tuple | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype,
                "shape": list(self.shape) if self.shape is not None else None}


@dataclass(slots=True)
class Node:
    graph: str
    index: int
    name: str
    op: str
    inputs: list[Value]
    outputs: list[Value]
    attributes: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    parameters: list[str] = field(default_factory=list)   # TensorInfo names consumed
    params: int = 0                                        # their elements
    flops: int | None = None
    flops_kind: str | None = None
    uncounted: str | None = None                           # why flops is None
    module: str = ""                                       # the module that ran it
    subgraphs: list[str] = field(default_factory=list)
    flops_detail: dict | None = None                       # by kind, for a call (functions)
    body_uncounted: dict | None = None                     # a call's body ops without formula

    def to_dict(self) -> dict:
        return {"graph": self.graph, "index": self.index, "name": self.name, "op": self.op,
                "domain": self.domain, "module": self.module,
                "inputs": [v.to_dict() for v in self.inputs],
                "outputs": [v.to_dict() for v in self.outputs],
                "attributes": self.attributes, "parameters": self.parameters,
                "params": self.params, "flops": self.flops, "flops_kind": self.flops_kind,
                "uncounted": self.uncounted, "subgraphs": self.subgraphs,
                **({"flops_by_kind": self.flops_detail} if self.flops_detail else {})}


@dataclass(slots=True)
class Graph:
    path: str
    kind: str                        # graph, subgraph, function, method
    name: str = ""
    parent: str | None = None
    inputs: list[Value] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    # FLOPs of this graph's nodes are per call (a function: per call site, in its callers)
    counted_in_callers: bool = False

    def totals(self, numel: dict[str, int]) -> dict:
        return totals_of(self.nodes, numel)


_INDEX = re.compile(r"^[0-9]+$")


def block_of(module: str) -> tuple[str, int] | None:
    """The repeated block a module belongs to: ``layers.3.attn.q`` -> ``("layers.#", 3)``; the
    first indexed component ends the block (as `tensorscope.grouping.layer_key` cuts names)."""
    if not module:
        return None
    parts = module.split(".")
    for i, c in enumerate(parts):
        if c.isascii() and c.isdigit():
            return group_key(".".join(parts[:i + 1])), int(c)
    return None


def totals_of(nodes, numel: dict[str, int]) -> dict:
    flops = 0
    by_kind: Counter = Counter()
    uncounted: Counter = Counter()
    used: dict[str, None] = {}
    for n in nodes:
        for p in n.parameters:
            used[p] = None
        if n.body_uncounted:
            uncounted.update(n.body_uncounted)
        if n.flops is None:
            uncounted[n.op] += 1
        else:
            flops += n.flops
            if n.flops_detail:
                by_kind.update(n.flops_detail)
            elif n.flops_kind and n.flops_kind != NONE:
                by_kind[n.flops_kind] += n.flops
    counter = sum(by_kind.get(k, 0) for k in COUNTER_KINDS)
    return {"nodes": len(nodes), "params": sum(numel.get(p, 0) for p in used), "flops": flops,
            "flop_counter_flops": counter, "flops_by_kind": dict(by_kind),
            "uncounted": dict(uncounted.most_common())}


@dataclass
class GraphModel:
    """Every graph of one file, and the numbers of its parameters."""

    format: str
    path: str
    graphs: list[Graph]
    numel: dict[str, int]            # parameter (TensorInfo name) -> elements
    params_total: int                # the model's parameters (as sum(p.numel()) counts them)
    notes: list[str] = field(default_factory=list)
    shapes_from: str = ""            # file, inference, file+inference, none
    extra: dict[str, Any] = field(default_factory=dict)

    def nodes(self) -> Iterator[Node]:
        for g in self.graphs:
            yield from g.nodes

    @property
    def main(self) -> Graph:
        return self.graphs[0]

    def totals(self) -> dict:
        """The model's totals: the main graph's nodes (a function call counts its body at that
        call site; control-flow subgraphs are totalled on their own, in ``graphs``)."""
        out = totals_of(self.main.nodes, self.numel)
        out["params"] = self.params_total
        out["params_consumed"] = totals_of(self.main.nodes, self.numel)["params"]
        return out

    def blocks(self) -> list[dict]:
        """Totals per repeated block (``layers.#``): instances, nodes, params and FLOPs, over the
        main graph's nodes."""
        acc: dict[str, dict] = {}
        for n in self.main.nodes:
            got = block_of(n.module)
            if got is None:
                continue
            pattern, index = got
            b = acc.get(pattern)
            if b is None:
                b = acc[pattern] = {"pattern": pattern, "instances": set(), "nodes": 0,
                                    "params": set(), "flops": 0, "uncounted": 0}
            b["instances"].add(index)
            b["nodes"] += 1
            b["params"].update(n.parameters)
            if n.flops is None:
                b["uncounted"] += 1
            else:
                b["flops"] += n.flops
        out = []
        for b in acc.values():
            k = len(b["instances"])
            params = sum(self.numel.get(p, 0) for p in b["params"])
            out.append({"pattern": b["pattern"], "count": k, "first": min(b["instances"]),
                        "last": max(b["instances"]), "nodes": b["nodes"], "params": params,
                        "flops": b["flops"], "uncounted": b["uncounted"],
                        "flops_per_instance": b["flops"] // k if k else 0})
        return out

    def to_header(self) -> dict:
        graphs = []
        for g in self.graphs:
            t = g.totals(self.numel)
            graphs.append({"path": g.path, "kind": g.kind, "name": g.name, "parent": g.parent,
                           "inputs": [v.to_dict() for v in g.inputs],
                           "outputs": [v.to_dict() for v in g.outputs],
                           "counted_in_callers": g.counted_in_callers, "totals": t})
        return {"schema": SCHEMA, "format": self.format, "path": self.path,
                "shapes_from": self.shapes_from, "totals": self.totals(), "graphs": graphs,
                "blocks": self.blocks(), "notes": self.notes, **self.extra}
