"""ONNX graphs as data: every graph's nodes (op, inputs, outputs, attributes, subgraphs), value
infos and initializer headers, read on the wire by the same walker `onnx_pb` lists tensors with.

`onnx_pb.open_source` lists tensors and counts ops; `tensorscope graph` needs the nodes
themselves, so this module walks the same messages again on demand (the listing stays as cheap as
it was) and never reads a tensor's data. It adds no field of its own: the field numbers are
`onnx_pb.MESSAGES`, checked against onnx's descriptors by tests/test_onnx.py.

- Graphs are named as `onnx_pb` names them in ``TensorInfo.extras["graph"]``: ``main``, a
  subgraph ``<parent>/<node name or op_index>.<attribute>[.<k>]``, a model-local function
  ``functions/<domain>.<name>``. Order: the main graph, then each subgraph right after the graph
  holding it (depth first), then the functions.
- Node order is the file's (ONNX requires topological order, and ``onnx.load`` keeps the file's).
  Empty input names (an omitted optional input) are kept, as ``NodeProto.input`` keeps them.
- Attributes become plain values: ``f``/``i``/``s`` (``s`` decoded as UTF-8 with replacement),
  ``floats``/``ints``/``strings`` lists, a tensor as ``{"tensor": dtype, "shape": dims}``, a graph
  as ``{"graph": path}``, a reference to a function attribute as ``{"ref_attr_name": name}``.
- `structure_only` rebuilds the model without the initializers' data (dims, type and name kept;
  small initializers kept whole, since shape inference reads the values of shape tensors): what
  ``onnx.shape_inference`` needs, a fraction of the file.

Public: `OnnxNode`, `OnnxGraph`, `read_graphs(src)`, `structure_only(src)`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.source import ByteSource

from .onnx_pb import (DEFAULT_LIMITS, FORMAT, LEN, ONNX_DTYPES, VARINT, Limits, _err, _fields,
                      _text, _Walker, decode_varints)

__all__ = ["OnnxNode", "OnnxGraph", "read_graphs", "structure_only", "ATTRIBUTE_LIST_MAX"]

ATTRIBUTE_LIST_MAX = 4096   # entries kept per list attribute (real ones: a handful)


@dataclass(slots=True)
class OnnxNode:
    name: str
    op: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, Any]
    subgraphs: list[str]          # paths of the graphs held by this node's attributes
    offset: int                   # the NodeProto's first byte in the file


@dataclass(slots=True)
class OnnxGraph:
    path: str
    kind: str                     # "graph" or "function"
    name: str
    nodes: list[OnnxNode] = field(default_factory=list)
    inputs: list[dict] = field(default_factory=list)      # value infos, or {"name"} (functions)
    outputs: list[dict] = field(default_factory=list)
    value_info: dict[str, dict] = field(default_factory=dict)
    initializers: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    parent: str | None = None
    domain: str = ""
    attribute_names: list[str] = field(default_factory=list)   # a function's attributes


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


class _GraphReader(_Walker):
    """The tensor walker's message readers (value infos, types, tensor headers), reused."""

    def read(self) -> tuple[list[OnnxGraph], dict[str, int]]:
        buf = self.buf
        graphs_at: list[tuple[int, int]] = []
        functions: list[tuple[int, int]] = []
        opsets: dict[str, int] = {}
        for num, wire, a, b, at in _fields(buf, 0, self.src.size, "ModelProto"):
            if num == 7:
                graphs_at.append((a, b))
            elif num == 8:
                d, v = self.opset(a, b)
                opsets[d] = v
            elif num == 25:
                functions.append((a, b))
        out: list[OnnxGraph] = []
        # (spans, path, kind, parent, depth); a stack: a subgraph is read right after its parent
        tasks: list[tuple] = []
        for i, span in reversed(list(enumerate(functions))):
            tasks.append(([span], None, "function", None, 1, i))
        if graphs_at:
            tasks.append((graphs_at, "main", "graph", None, 1, 0))
        while tasks:
            spans, path, kind, parent, depth, index = tasks.pop()
            if depth > self.limits.max_graph_depth:
                raise LimitExceeded("subgraph nesting", self.limits.max_graph_depth, depth,
                                    format=FORMAT, offset=spans[0][0])
            g, found = self.one_graph(spans, path, kind, parent, index)
            out.append(g)
            for sub_spans, sub_path in reversed(found):
                tasks.append((sub_spans, sub_path, "graph", g.path, depth + 1, 0))
        return out, opsets

    def one_graph(self, spans, path, kind, parent, index):
        buf = self.buf
        message = "FunctionProto" if kind == "function" else "GraphProto"
        node_field = 7 if kind == "function" else 1
        g = OnnxGraph(path or "", kind, "", parent=parent)
        node_spans: list[tuple[int, int]] = []
        for start, end in spans:
            for num, wire, a, b, at in _fields(buf, start, end, message):
                if num == node_field:
                    node_spans.append((a, b))
                elif kind == "function":
                    if num == 1:
                        g.name = _text(buf, a, b)
                    elif num == 10:
                        g.domain = _text(buf, a, b)
                    elif num in (4, 5):
                        (g.inputs if num == 4 else g.outputs).append({"name": _text(buf, a, b)})
                    elif num == 6:
                        g.attribute_names.append(_text(buf, a, b))
                    elif num == 11:
                        g.attribute_names.append(self.attr_name(a, b))
                    elif num == 12:
                        vi = self.value_info(a, b)
                        g.value_info[vi["name"]] = vi
                elif num == 2:
                    g.name = _text(buf, a, b)
                elif num in (11, 12):
                    (g.inputs if num == 11 else g.outputs).append(self.value_info(a, b))
                elif num == 13:
                    vi = self.value_info(a, b)
                    g.value_info[vi["name"]] = vi
                elif num == 5:
                    tf = self.tensor_fields([(a, b)])
                    g.initializers[tf.name] = (ONNX_DTYPES.get(tf.data_type, str(tf.data_type)),
                                               tuple(tf.dims))
                elif num == 15:
                    self.sparse_header(a, b, g)
        if kind == "function":
            label = f"{g.domain}.{g.name}" if g.domain else g.name
            g.path = f"functions/{label or index}"
        found: list[tuple[list, str]] = []
        for i, (a, b) in enumerate(node_spans):
            self.node_total += 1
            if self.node_total > self.limits.max_nodes:
                raise LimitExceeded("nodes", self.limits.max_nodes, format=FORMAT, offset=a)
            node = self.one_node(a, b, g.path, i, found)
            g.nodes.append(node)
        return g, found

    def attr_name(self, a: int, b: int) -> str:
        for num, wire, x, y, at in _fields(self.buf, a, b, "AttributeProto"):
            if num == 1:
                return _text(self.buf, x, y)
        return ""

    def sparse_header(self, a: int, b: int, g: OnnxGraph) -> None:
        values: list[tuple[int, int]] = []
        dims: list[int] = []
        for num, wire, x, y, at in _fields(self.buf, a, b, "SparseTensorProto"):
            if num == 1:
                values.append((x, y))
            elif num == 3:
                dims.extend(self.int64s(wire, x, y, "SparseTensorProto.dims", at))
        if values:
            tf = self.tensor_fields(values)
            g.initializers[tf.name] = (ONNX_DTYPES.get(tf.data_type, str(tf.data_type)),
                                       tuple(dims))

    def one_node(self, a: int, b: int, path: str, index: int, found: list) -> OnnxNode:
        buf = self.buf
        node = OnnxNode("", "", "", [], [], {}, [], a)
        attributes: list[tuple[int, int]] = []
        for num, wire, x, y, at in _fields(buf, a, b, "NodeProto"):
            if num == 1:
                node.inputs.append(_text(buf, x, y))
            elif num == 2:
                node.outputs.append(_text(buf, x, y))
            elif num == 3:
                node.name = _text(buf, x, y)
            elif num == 4:
                node.op = _text(buf, x, y)
            elif num == 5:
                attributes.append((x, y))
            elif num == 7:
                node.domain = _text(buf, x, y)
        label = node.name or f"{node.op}_{index}"
        for x, y in attributes:
            name, value, graphs = self.attribute(x, y)
            for k, spans in enumerate(graphs):
                sub = f"{path}/{label}.{name}" + ("" if isinstance(value, dict) else f".{k}")
                node.subgraphs.append(sub)
                found.append((spans, sub))
            if graphs:
                value = {"graph": node.subgraphs[-1]} if isinstance(value, dict) else \
                    [{"graph": s} for s in node.subgraphs[-len(graphs):]]
            node.attributes[name] = value
        return node

    def attribute(self, a: int, b: int) -> tuple[str, Any, list[list[tuple[int, int]]]]:
        """(name, value, graph spans) of one AttributeProto; a singular ``g`` gives a dict value."""
        buf = self.buf
        name = ""
        value: Any = None
        g_spans: list[tuple[int, int]] = []
        graphs: list[list[tuple[int, int]]] = []
        lists: dict[int, list] = {}
        t_spans: list[tuple[int, int]] = []
        for num, wire, x, y, at in _fields(buf, a, b, "AttributeProto"):
            if num == 1:
                name = _text(buf, x, y)
            elif num == 2:
                value = struct.unpack("<f", bytes(buf[x:y]))[0]
            elif num == 3:
                value = _signed(x)
            elif num == 4:
                value = _text(buf, x, y, 4096)
            elif num == 5:
                t_spans.append((x, y))
            elif num == 6:
                g_spans.append((x, y))
            elif num == 7:
                got = lists.setdefault(7, [])
                if len(got) < ATTRIBUTE_LIST_MAX:
                    if wire == LEN and (y - x) % 4:
                        raise _err(f"AttributeProto.floats holds {y - x} bytes, not a multiple "
                                   "of 4", at)
                    raw = bytes(buf[x:min(y, x + 4 * ATTRIBUTE_LIST_MAX)])
                    got.extend(np.frombuffer(raw, "<f4").tolist())
            elif num == 8:
                got = lists.setdefault(8, [])
                if len(got) < ATTRIBUTE_LIST_MAX:
                    if wire == VARINT:
                        got.append(_signed(x))
                    else:
                        got.extend(decode_varints(bytes(buf[x:y])).view(np.int64)
                                   .tolist()[:ATTRIBUTE_LIST_MAX])
            elif num == 9:
                got = lists.setdefault(9, [])
                if len(got) < ATTRIBUTE_LIST_MAX:
                    got.append(_text(buf, x, y, 4096))
            elif num == 10:
                lists.setdefault(10, []).append(self.tensor_header([(x, y)]))
            elif num == 11:
                graphs.append([(x, y)])
            elif num == 21:
                value = {"ref_attr_name": _text(buf, x, y)}
        if t_spans:
            value = self.tensor_header(t_spans)
        for number in (7, 8, 9, 10):
            if number in lists:
                value = lists[number]
        if g_spans:
            return name, {}, [g_spans]
        if graphs:
            return name, [], graphs
        return name, value, []

    def tensor_header(self, spans) -> dict:
        tf = self.tensor_fields(spans)
        return {"tensor": ONNX_DTYPES.get(tf.data_type, str(tf.data_type)),
                "shape": list(tf.dims)}


def read_graphs(src: ByteSource, *, limits: Limits = DEFAULT_LIMITS
                ) -> tuple[list[OnnxGraph], dict[str, int]]:
    """Every graph of an ONNX model (main, subgraphs, local functions) and the opset imports.

    Raises `OnnxFormatError` (with the file) on a malformed model, `LimitExceeded` past limits.
    """
    reader = _GraphReader(src, limits, strict=False)
    try:
        return reader.read()
    except FormatError as e:
        raise e.located(file=src.path)
    except RecursionError:
        raise _err("nesting too deep", file=src.path) from None


# -- the structure-only model ----------------------------------------------------------------------
def _varint_bytes(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint_bytes(number << 3 | LEN) + _varint_bytes(len(payload)) + payload


def structure_only(src: ByteSource, *, keep_bytes: int = 4096,
                   limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The model's bytes without its initializers' data: each main-graph initializer larger than
    ``keep_bytes`` is written back as its dims, data type and name only; everything else is
    copied as it is (nodes, subgraphs, functions, value infos, opsets). Training info is dropped.
    Small initializers stay whole: shape inference reads the values of shape and axes tensors."""
    reader = _GraphReader(src, limits, strict=False)
    buf = reader.buf
    out = bytearray()
    try:
        for num, wire, a, b, at in _fields(buf, 0, src.size, "ModelProto"):
            if num == 20:
                continue
            if num != 7:
                out += buf[at:b]
                continue
            graph = bytearray()
            for n2, w2, x, y, at2 in _fields(buf, a, b, "GraphProto"):
                if n2 != 5 or y - x <= keep_bytes:
                    graph += buf[at2:y]
                    continue
                tf = reader.tensor_fields([(x, y)])
                t = bytearray()
                for d in tf.dims:
                    t += _varint_bytes(1 << 3 | VARINT) + _varint_bytes(d)
                t += _varint_bytes(2 << 3 | VARINT) + _varint_bytes(tf.data_type)
                t += _len_field(8, tf.name.encode("utf-8"))
                graph += _len_field(5, bytes(t))
            out += _len_field(7, bytes(graph))
    except FormatError as e:
        raise e.located(file=src.path)
    return bytes(out)
