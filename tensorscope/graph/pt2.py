"""torch.export ``.pt2`` graphs: the serialized program's nodes, with its own tensor metadata.

The program (``models/<m>.json``, `tensorscope.parsers.torch_export.read_programs`) lists the
graph's ``call_function`` nodes in topological order (placeholders and the output are the graph's
``inputs``/``outputs``): each with its ``torch.ops`` target, named arguments (``as_tensor``,
``as_int``, ``as_ints`` ...), outputs, and ``nn_module_stack`` (the module that ran it). Every
tensor value's dtype and sizes are in ``graph.tensor_values``: shapes come from the file, no
inference. A symbolic size (``as_expr``) stays a symbol, and FLOPs that need it are uncounted.
Placeholders map to parameters, buffers and constants through the graph signature; those are
linked to the `TensorInfo` the parser listed for them. A higher-order op's graphs (``as_graph``
arguments: ``torch.cond`` branches) follow their graph as subgraphs, counted on their own.
"""
from __future__ import annotations

import re
from typing import Any

from ..parsers.torch_export import SCALAR_TYPES, read_programs
from .flops import Uncounted, aten_flops, aten_op
from .model import Graph, GraphModel, Node, Value

__all__ = ["build"]

_SPEC_FIELDS = {"parameter": "parameter_name", "buffer": "buffer_name",
                "tensor_constant": "tensor_constant_name"}


# A symbolic size is sympy's srepr text ("Symbol('s77', positive=True, integer=True)"): shown
# with each symbol by its name ("s77"), never evaluated.
_SYMBOL = re.compile(r"Symbol\('([A-Za-z_]\w*)'[^)]*\)")


def _dim(d: Any):
    if isinstance(d, dict):
        if "as_int" in d:
            v = d["as_int"]
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        expr = d.get("as_expr")
        if isinstance(expr, dict):
            return _SYMBOL.sub(r"\1", str(expr.get("expr_str", "?"))[:200])
    return None


def _tensor_value(meta: Any) -> tuple[str | None, tuple | None]:
    if not isinstance(meta, dict):
        return None, None
    sizes = meta.get("sizes")
    shape = tuple(_dim(d) for d in sizes) if isinstance(sizes, list) else None
    dtype = SCALAR_TYPES.get(meta.get("dtype"), None) if isinstance(meta.get("dtype"), int) \
        else None
    return dtype, shape


def _names(arg: Any) -> list[str]:
    """Tensor names an argument or output refers to (``as_tensor``, ``as_tensors``, optional)."""
    if not isinstance(arg, dict):
        return []
    if "as_tensor" in arg:
        return [str(arg["as_tensor"].get("name", ""))] if isinstance(arg["as_tensor"], dict) else []
    for key in ("as_tensors", "as_optional_tensors"):
        if isinstance(arg.get(key), list):
            out = []
            for t in arg[key]:
                if isinstance(t, dict):
                    inner = t.get("as_tensor", t)
                    if isinstance(inner, dict) and "name" in inner:
                        out.append(str(inner["name"]))
            return out
    if isinstance(arg.get("as_sym_int"), dict) and "as_name" in arg["as_sym_int"]:
        return [str(arg["as_sym_int"]["as_name"])]
    return []


def _plain(arg: Any):
    """An argument as a plain attribute value (scalars, lists, names)."""
    if not isinstance(arg, dict) or len(arg) != 1:
        return arg
    key, v = next(iter(arg.items()))
    if key in ("as_tensor", "as_tensors", "as_optional_tensors"):
        return None
    if key == "as_none":
        return None
    if key in ("as_sym_int", "as_sym_float", "as_sym_bool") and isinstance(v, dict):
        return v.get("as_int", v.get("as_float", v.get("as_bool", v.get("as_name"))))
    if key == "as_scalar_type" and isinstance(v, int):
        return SCALAR_TYPES.get(v, v)
    if key == "as_sym_ints" and isinstance(v, list):
        return [_plain(x) if isinstance(x, dict) else x for x in v]
    return v


def _module(meta: Any) -> str:
    """The innermost module of ``nn_module_stack`` ("key,path,type;key,path,type")."""
    stack = meta.get("nn_module_stack") if isinstance(meta, dict) else None
    if not isinstance(stack, str) or not stack:
        return ""
    last = stack.split(";")[-1]
    parts = last.split(",")
    return parts[1] if len(parts) >= 3 else ""


def _graph(name: str, program: dict, model, qualify) -> tuple[list[Graph], dict[str, int], int,
                                                                dict]:
    gm = program.get("graph_module") if isinstance(program, dict) else None
    graph = gm.get("graph") if isinstance(gm, dict) else None
    if not isinstance(graph, dict):
        graph = {}
    values = graph.get("tensor_values") if isinstance(graph.get("tensor_values"), dict) else {}
    sig = gm.get("signature") if isinstance(gm, dict) else {}
    specs = sig.get("input_specs") if isinstance(sig, dict) else None
    placeholder_of: dict[str, tuple[str, str]] = {}   # graph name -> (kind, fqn)
    for spec in specs if isinstance(specs, list) else ():
        if not isinstance(spec, dict) or len(spec) != 1:
            continue
        kind, body = next(iter(spec.items()))
        field = _SPEC_FIELDS.get(kind)
        if field and isinstance(body, dict):
            arg = body.get("arg")
            gname = arg.get("name") if isinstance(arg, dict) else None
            if isinstance(gname, str) and isinstance(body.get(field), str):
                placeholder_of[gname] = (kind, body[field])

    tensors = {t.name: t for t in model.tensors}
    numel: dict[str, int] = {}
    params_total = 0
    buffers = 0
    linked: dict[str, str] = {}
    # Tied parameters (one tensor under two names, ``lm_head.weight`` = ``embed.weight``) are
    # two placeholders over one storage view: counted once, as ``module.parameters()`` does.
    seen_views: set[tuple] = set()
    for gname, (kind, fqn) in placeholder_of.items():
        tname = qualify(fqn)
        t = tensors.get(tname)
        dtype, shape = _tensor_value(values.get(gname))
        if t is not None:
            n = t.numel
        elif shape is not None and all(isinstance(d, int) for d in shape):
            n = 1
            for d in shape:
                n *= d
        else:
            n = 0
        linked[gname] = tname
        numel[tname] = n
        view = (t.file, t.storage_key, t.storage_offset, t.shape, t.stride, t.dtype) \
            if t is not None and t.storage_key is not None else (tname,)
        if view in seen_views:
            continue
        seen_views.add(view)
        if kind == "parameter":
            params_total += n
        else:
            buffers += n

    param_names = {linked[g] for g, (kind, _) in placeholder_of.items() if kind == "parameter"}

    out: list[Graph] = []
    _read_graph(graph, Graph(name if name != "model" else "main", "graph", name), out,
                linked, numel, param_names, 0)
    return out, numel, params_total, {"buffers": buffers}


MAX_SUBGRAPH_DEPTH = 64


def _read_graph(graph: dict, g: Graph, out: list[Graph], linked: dict[str, str],
                numel: dict[str, int], param_names: set[str], depth: int) -> None:
    """``g`` filled from one serialized graph; a higher-order op's graphs (``torch.cond``
    branches, ``as_graph`` arguments) follow it as subgraphs. The program's placeholder names
    reach into them (torch names the lifted parameters the same there)."""
    out.append(g)
    values = graph.get("tensor_values") if isinstance(graph.get("tensor_values"), dict) else {}

    def value(nm: str) -> Value:
        dtype, shape = _tensor_value(values.get(nm))
        return Value(nm, dtype, shape)

    for arg in graph.get("inputs") or ():
        for nm in _names(arg):
            g.inputs.append(value(nm))
    for arg in graph.get("outputs") or ():
        for nm in _names(arg):
            g.outputs.append(value(nm))
    nested: list[tuple[dict, Graph]] = []
    for i, n in enumerate(graph.get("nodes") or ()):
        if not isinstance(n, dict):
            continue
        target = str(n.get("target", ""))
        inputs, attrs, by_name, subgraphs = [], {}, {}, []
        for k, a in enumerate(n.get("inputs") or ()):
            if not isinstance(a, dict):
                continue
            aname, arg = str(a.get("name", "") or f"arg{k}"), a.get("arg")
            by_name[aname] = arg
            sub = arg.get("as_graph") if isinstance(arg, dict) else None
            if isinstance(sub, dict) and isinstance(sub.get("graph"), dict):
                path = f"{g.path}/{sub.get('name') or aname}"
                subgraphs.append(path)
                attrs[aname] = {"graph": path}
                if depth < MAX_SUBGRAPH_DEPTH:
                    nested.append((sub["graph"], Graph(path, "subgraph", str(sub.get("name", "")),
                                                       g.path)))
                continue
            refs = _names(arg)
            if refs and not (isinstance(arg, dict) and "as_sym_int" in arg):
                inputs.extend(value(r) for r in refs)
            else:
                attrs[aname] = _plain(arg)
        outputs = [value(r) for o in n.get("outputs") or () for r in _names(o)]
        node = Node(g.path, i, str(n.get("name") or (outputs[0].name if outputs else f"n{i}")),
                    aten_op(target), inputs, outputs, attrs, domain=target,
                    module=_module(n.get("metadata")), subgraphs=subgraphs)
        for v in inputs:
            p = linked.get(v.name)
            if p is not None and p not in node.parameters:
                node.parameters.append(p)
        node.params = sum(numel.get(p, 0) for p in node.parameters if p in param_names)

        def shape_of(arg):
            refs = _names(arg)
            return _tensor_value(values.get(refs[0]))[1] if len(refs) == 1 else None
        if subgraphs:
            node.uncounted = "control flow: its subgraphs are counted on their own"
        else:
            try:
                node.flops, node.flops_kind = aten_flops(target, by_name, shape_of,
                                                         [v.shape for v in outputs])
            except Uncounted as e:
                node.uncounted = str(e)
        node.index = len(g.nodes)
        g.nodes.append(node)
        entries = [o for o in n.get("outputs") or () if isinstance(o, dict)]
        if len(entries) > 1 or any(k in e for e in entries
                                   for k in ("as_tensors", "as_optional_tensors")):
            # A node returning several values: torch.export.load gives each its own
            # operator.getitem node, named by the value, right after it; so does this list.
            for k, v in enumerate(outputs):
                g.nodes.append(Node(g.path, len(g.nodes), v.name, "getitem", [Value(node.name)],
                                    [v], {"index": k}, domain="_operator.getitem",
                                    module=node.module, flops=0, flops_kind="none"))
    for sub_graph, sub in nested:
        _read_graph(sub_graph, sub, out, linked, numel, param_names, depth + 1)


def build(model) -> GraphModel:
    programs = read_programs(model.source(model.path))
    several = len(programs) > 1
    graphs, numel, total, extra = [], {}, 0, {"buffers": 0}
    for name, program in programs.items():
        def qualify(fqn: str, name=name) -> str:
            return f"{name}.{fqn}" if several else fqn
        gs, n, t, e = _graph(name, program, model, qualify)
        graphs.extend(gs)
        numel.update(n)
        total += t
        extra["buffers"] += e["buffers"]
    return GraphModel("pt2", model.path, graphs, numel, total, shapes_from="file", extra=extra)
