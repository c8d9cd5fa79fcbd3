"""`tensorscope graph`: the computation graph a file stores, with parameters and FLOPs per node.

`build_graph(model)` reads the graph of an opened `ModelFile` (ONNX, torch.export ``.pt2``,
TorchScript) into a `GraphModel`; `tensorscope.graph.flops` holds the counting rules and
`tensorscope.graph.export` the DOT and Mermaid writers.
"""
from __future__ import annotations

from ..errors import TensorscopeError
from .model import SCHEMA, Graph, GraphModel, Node, Value

__all__ = ["build_graph", "GraphModel", "Graph", "Node", "Value", "SCHEMA", "NoGraph"]


class NoGraph(TensorscopeError):
    """The file stores no computation graph (a state dict, safetensors, GGUF ...)."""


def build_graph(model, *, infer: bool = True) -> GraphModel:
    """The graph of an opened model. ``infer=False``: ONNX shapes from the file only (onnx's
    shape inference, C++, is not run on the file's structure)."""
    if model.format == "onnx":
        from . import onnx
        return onnx.build(model, infer=infer)
    if model.format == "pt2":
        from . import pt2
        return pt2.build(model)
    if model.format == "torchscript":
        from . import torchscript
        return torchscript.build(model)
    raise NoGraph(f"{model.path}: a {model.format} file stores tensors, not a graph "
                  "(graphs: ONNX, torch.export .pt2, TorchScript); `tensorscope inspect` "
                  "summarizes its architecture")
