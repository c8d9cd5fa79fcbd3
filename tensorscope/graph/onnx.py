"""ONNX graphs: the main graph, If/Loop/Scan subgraphs and model-local functions, with shapes.

Shapes come from the file first (graph inputs, outputs and ``value_info``, initializer dims,
``Constant`` values). Where a node's output has none, ``onnx.shape_inference`` runs on the
structure-only model (`tensorscope.parsers.onnx_graph.structure_only`: the file without its
initializers' data, so a 10 GB model infers from a few MB), with ``data_prop`` so shape tensors
computed in the graph (``Shape -> Gather -> Concat -> Reshape``) resolve. onnx is imported here
only, lazily. A model-local function's body has no shapes of its own (they depend on the call),
so its FLOPs are counted per call site: the body inferred again with the caller's input types
(cached per distinct input types), and the call node carries the body's FLOPs.

Parameters are the initializers (and sparse initializers) a node reads, looked up through the
enclosing graphs as ONNX scoping does, linked to the `TensorInfo` the parser listed. Floating
initializers, and integer ones of rank 2 or more (quantized weights), count as parameters;
0-d and 1-d integer initializers are shapes, axes, indices and zero points: constants.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Any

from ..parsers.onnx_graph import OnnxGraph, read_graphs, structure_only
from ..parsers.onnx_pb import ONNX_DTYPES
from .flops import Uncounted, onnx_flops
from .model import Graph, GraphModel, Node, Value

__all__ = ["build"]

_INT_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                         "int4", "uint4", "int2", "uint2", "bool", "string"})
FUNCTION_SITES_MAX = 4096   # distinct (function, input types) inferred per model


def _is_parameter(dtype: str, shape: tuple) -> bool:
    return dtype not in _INT_DTYPES or (len(shape) >= 2 and dtype != "string" and dtype != "bool")


def _vi(vi: dict) -> tuple[str | None, tuple | None]:
    if vi.get("kind") in ("tensor", "sparse_tensor"):
        shape = vi.get("shape")
        return vi.get("elem_type"), tuple(shape) if shape is not None else None
    return vi.get("kind"), None


def _module_of(name: str) -> str:
    """torch.onnx names nodes by module path: ``/layers.0/attn/q/MatMul`` -> ``layers.0.attn.q``."""
    if not name.startswith("/"):
        return ""
    parts = [p for p in name.split("/")[1:-1] if p]
    return ".".join(parts)


def _proto_shapes(graph_proto, path: str, out: dict[str, dict], depth: int = 0) -> None:
    """value_info of an inferred GraphProto and its subgraphs, by our graph paths."""
    from onnx import AttributeProto
    shapes = out.setdefault(path, {})
    for vi in list(graph_proto.value_info) + list(graph_proto.output) + list(graph_proto.input):
        t = vi.type
        if t.HasField("tensor_type"):
            tt = t.tensor_type
            dims = None
            if tt.HasField("shape"):
                dims = tuple(d.dim_value if d.HasField("dim_value") else
                             (d.dim_param if d.HasField("dim_param") else None)
                             for d in tt.shape.dim)
            shapes[vi.name] = (ONNX_DTYPES.get(tt.elem_type, str(tt.elem_type)), dims)
    if depth > 64:
        return
    for i, node in enumerate(graph_proto.node):
        label = node.name or f"{node.op_type}_{i}"
        for a in node.attribute:
            if a.type == AttributeProto.GRAPH:
                _proto_shapes(a.g, f"{path}/{label}.{a.name}", out, depth + 1)
            elif a.type == AttributeProto.GRAPHS:
                for k, g in enumerate(a.graphs):
                    _proto_shapes(g, f"{path}/{label}.{a.name}.{k}", out, depth + 1)


class _Builder:
    def __init__(self, model):
        self.model = model
        self.src = model.source(model.path)
        self.notes: list[str] = []
        self.graphs, self.opsets = read_graphs(self.src)
        self.by_path = {g.path: g for g in self.graphs}
        self.functions = {(g.domain, g.name): g for g in self.graphs if g.kind == "function"}
        self.inferred: dict[str, dict] = {}
        self.proto = None          # the structure-only ModelProto, when inference ran
        self.site_cache: dict[tuple, tuple[int | None, str | None, dict]] = {}
        self.site_kinds: dict[tuple, dict] = {}
        self._last_site: tuple = ()
        self.numel: dict[str, int] = {}
        self.params_total = 0
        self.allow_inference = True
        self._link_tensors()

    # -- parameters ---------------------------------------------------------------------------
    def _link_tensors(self) -> None:
        self.tensor_of: dict[tuple[str, str], str] = {}
        for t in self.model.tensors:
            if t.role not in ("initializer", "sparse_initializer"):
                continue
            graph = t.extras.get("graph", "main")
            name = t.name
            if t.role == "sparse_initializer":
                name = t.extras.get("sparse_name", name)
                if not t.name.endswith(".values"):
                    continue
            orig = name[len(graph) + 1:] if name.startswith(graph + "/") else name
            self.tensor_of[(graph, orig)] = t.name
            if _is_parameter(t.dtype, t.shape):
                n = t.numel if t.role == "initializer" else t.numel
                self.numel[t.name] = n
                self.params_total += n

    def parameter(self, graph: OnnxGraph, name: str) -> str | None:
        g: OnnxGraph | None = graph
        while g is not None:
            if name in g.initializers:
                t = self.tensor_of.get((g.path, name))
                return t if t in self.numel else None
            g = self.by_path.get(g.parent) if g.parent else None
        return None

    # -- shapes -------------------------------------------------------------------------------
    def file_shapes(self, g: OnnxGraph) -> dict[str, tuple]:
        shapes: dict[str, tuple] = {}
        for name, (dtype, dims) in g.initializers.items():
            shapes[name] = (dtype, dims)
        for vi in list(g.inputs) + list(g.outputs) + list(g.value_info.values()):
            if "kind" in vi:
                shapes[vi["name"]] = _vi(vi)
        for n in g.nodes:
            if n.op == "Constant" and n.domain in ("", "ai.onnx") and n.outputs:
                v = n.attributes.get("value")
                if isinstance(v, dict) and "tensor" in v:
                    shapes[n.outputs[0]] = (v["tensor"], tuple(v["shape"]))
                elif isinstance(n.attributes.get("value_float"), float):
                    shapes[n.outputs[0]] = ("float32", ())
                elif isinstance(n.attributes.get("value_int"), int):
                    shapes[n.outputs[0]] = ("int64", ())
                elif isinstance(n.attributes.get("value_ints"), list):
                    shapes[n.outputs[0]] = ("int64", (len(n.attributes["value_ints"]),))
                elif isinstance(n.attributes.get("value_floats"), list):
                    shapes[n.outputs[0]] = ("float32", (len(n.attributes["value_floats"]),))
        return shapes

    def infer(self) -> None:
        try:
            import onnx
            from onnx import shape_inference
            self.proto = onnx.ModelProto.FromString(structure_only(self.src))
            inferred = shape_inference.infer_shapes(self.proto, check_type=False,
                                                    strict_mode=False, data_prop=True)
            _proto_shapes(inferred.graph, "main", self.inferred)
        except Exception as e:  # noqa: BLE001 — inference is a bonus: say why it is missing
            self.notes.append(f"onnx shape inference failed: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''}")

    # -- function call sites ------------------------------------------------------------------
    def call_site(self, fn: OnnxGraph, in_types: tuple, depth: int = 0
                  ) -> tuple[int | None, str | None, dict]:
        """(FLOPs, why uncounted, body shapes) of one call of ``fn`` with ``in_types``."""
        key = (fn.path, in_types)
        got = self.site_cache.get(key)
        if got is not None:
            return got
        if not self.allow_inference:
            return None, "shape inference not run (--no-infer)", {}
        if len(self.site_cache) >= FUNCTION_SITES_MAX or depth > 16:
            return None, "too many distinct function call sites", {}
        shapes: dict[str, tuple] = {}
        try:
            shapes = self._infer_body(fn, in_types)
        except Exception as e:  # noqa: BLE001
            self.site_cache[key] = got = (None, f"function body not inferred: {type(e).__name__}",
                                          {})
            return got
        total, kinds, uncounted = 0, {}, {}
        for n in fn.nodes:
            f, kind, reason = self.node_flops(n, lambda name: shapes.get(name), depth + 1)
            if kind == "function":
                inner = self.site_kinds.get(self._last_site, {})
                for k, v in inner.get("by_kind", {}).items():
                    kinds[k] = kinds.get(k, 0) + v
                for k, v in inner.get("uncounted", {}).items():
                    uncounted[k] = uncounted.get(k, 0) + v
            elif f is None:
                uncounted[n.op] = uncounted.get(n.op, 0) + 1
            elif kind != "none":
                kinds[kind] = kinds.get(kind, 0) + f
            if f is not None:
                total += f
        # ops of the body without a formula are listed (in the call's totals), not guessed
        self.site_cache[key] = got = (total, None, shapes)
        self.site_kinds[key] = {"by_kind": kinds, "uncounted": uncounted}
        self._last_site = key
        return got

    def _infer_body(self, fn: OnnxGraph, in_types: tuple) -> dict[str, tuple]:
        import onnx
        from onnx import helper, shape_inference
        if self.proto is None:
            self.proto = onnx.ModelProto.FromString(structure_only(self.src))
        proto_fn = next(f for f in self.proto.functions
                        if f.name == fn.name and f.domain == fn.domain)
        elem = {v: k for k, v in ONNX_DTYPES.items()}
        inputs = []
        for name, (dtype, shape) in zip([v["name"] for v in fn.inputs], in_types):
            if dtype is None or dtype not in elem:
                raise Uncounted("input type unknown")
            inputs.append(helper.make_tensor_value_info(name, elem[dtype], shape))
        outputs = [onnx.ValueInfoProto(name=v["name"]) for v in fn.outputs]
        graph = helper.make_graph(list(proto_fn.node), "call", inputs, outputs)
        m = helper.make_model(graph, opset_imports=list(self.proto.opset_import),
                              functions=list(self.proto.functions),
                              ir_version=self.proto.ir_version)
        inferred = shape_inference.infer_shapes(m, check_type=False, strict_mode=False,
                                                data_prop=True)
        out: dict[str, dict] = {}
        _proto_shapes(inferred.graph, "call", out)
        return out.get("call", {})

    # -- nodes --------------------------------------------------------------------------------
    def node_flops(self, n, shape_of, depth: int = 0) -> tuple[int | None, str | None, str | None]:
        """(flops, kind, why uncounted) of a node, shapes by ``shape_of(name)``."""
        fn = self.functions.get((n.domain, n.op))
        if fn is not None:
            types = tuple(shape_of(v) or (None, None) for v in n.inputs)
            f, why, _ = self.call_site(fn, types, depth)
            self._last_site = (fn.path, types)
            return f, "function" if f is not None else None, why
        ins = [(shape_of(v) or (None, None))[1] if v else None for v in n.inputs]
        outs = [(shape_of(v) or (None, None))[1] for v in n.outputs]
        try:
            f, kind = onnx_flops(n.op, n.domain, ins, outs, n.attributes)
            return f, kind, None
        except Uncounted as e:
            return None, None, str(e)

    def build(self) -> GraphModel:
        file_shapes = {g.path: self.file_shapes(g) for g in self.graphs}
        missing = any(o and o not in file_shapes[g.path] for g in self.graphs
                      if g.kind == "graph" for n in g.nodes for o in n.outputs)
        shapes_from = "file"
        if missing and not self.allow_inference:
            self.notes.append("shape inference not run (--no-infer): shapes from the file only")
        elif missing:
            self.infer()
            shapes_from = "file+inference" if self.inferred else "file"

        out_graphs: list[Graph] = []
        merged: dict[str, dict] = {}
        for g in self.graphs:   # parents come before their subgraphs
            # one lookup per value: the file's shape where it has one, else the inferred one
            mine = dict(self.inferred.get(g.path, {}))
            for k, v in file_shapes.get(g.path, {}).items():
                if v[1] is not None or k not in mine:
                    mine[k] = v
            parent = merged.get(g.parent) if g.parent else None
            # a subgraph sees its enclosing graphs' values (ONNX scoping)
            merged[g.path] = ChainMap(mine, parent) if parent is not None else mine
            shape_of = merged[g.path].get

            def value(name, shape_of=shape_of):
                got = shape_of(name) if name else None
                return Value(name, got[0], got[1]) if got else Value(name)

            kind = "function" if g.kind == "function" else ("graph" if g.path == "main"
                                                            else "subgraph")
            out = Graph(g.path, kind, g.name or (g.path if kind == "function" else ""),
                        g.parent, [value(v["name"]) for v in g.inputs],
                        [value(v["name"]) for v in g.outputs],
                        counted_in_callers=kind == "function")
            for i, n in enumerate(g.nodes):
                node = Node(g.path, i, n.name, n.op, [value(v) for v in n.inputs],
                            [value(v) for v in n.outputs], n.attributes, n.domain,
                            module=_module_of(n.name), subgraphs=list(n.subgraphs))
                for v in n.inputs:
                    p = self.parameter(g, v) if v else None
                    if p is not None and p not in node.parameters:
                        node.parameters.append(p)
                node.params = sum(self.numel.get(p, 0) for p in node.parameters)
                if kind == "function":
                    # shapes depend on the call: FLOPs are on the calling nodes
                    f, k, why = self.node_flops(n, shape_of)
                    if f is None:
                        why = "counted per call site, in the calling node"
                else:
                    f, k, why = self.node_flops(n, shape_of)
                node.flops, node.flops_kind, node.uncounted = f, k, why
                if k == "function":
                    site = self.site_kinds.get(self._last_site, {})
                    node.flops_detail = dict(site.get("by_kind", {}))
                    body = site.get("uncounted")
                    if body:
                        node.body_uncounted = dict(body)
                        node.uncounted = "in the function body, uncounted: " + ", ".join(
                            f"{op} ×{k}" for op, k in body.items())
                out.nodes.append(node)
            out_graphs.append(out)
        self._order_check(out_graphs)
        return GraphModel("onnx", self.model.path, out_graphs, self.numel, self.params_total,
                          notes=self.notes, shapes_from=shapes_from,
                          extra={"opset_import": self.opsets})

    def _order_check(self, graphs: list[Graph]) -> None:
        """ONNX requires each graph's nodes in topological order: say where a file breaks it."""
        for g in graphs:
            if g.kind == "function":
                continue
            produced = {v.name for n in g.nodes for v in n.outputs}
            seen: set[str] = set()
            for n in g.nodes:
                late = [v.name for v in n.inputs if v.name in produced and v.name not in seen]
                if late:
                    self.notes.append(f"graph {g.path}: node {n.name or n.op!r} reads "
                                      f"{late[0]!r} before the node producing it (not in "
                                      "topological order)")
                    break
                seen.update(v.name for v in n.outputs)


def build(model, *, infer: bool = True) -> GraphModel:
    b = _Builder(model)
    b.allow_inference = infer
    return b.build()
