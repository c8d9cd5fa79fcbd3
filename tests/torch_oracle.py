"""Test helpers: what torch itself reports for a file, flattened the way tensorscope names tensors.

Only tests import this (torch is a test dependency, never a package one).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))  # whole-module fixtures pickle gen_torch.TinyNet

ROOT_NAME = "<root>"

_SPARSE_PARTS = {
    torch.sparse_coo: lambda t: {"indices": t._indices(), "values": t._values()},
    torch.sparse_csr: lambda t: {"crow_indices": t.crow_indices(), "col_indices": t.col_indices(),
                                 "values": t.values()},
}


def flatten(obj, prefix: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """{dotted name: tensor} for everything torch.load returned."""
    out: dict[str, torch.Tensor] = {}
    name = ".".join(prefix) if prefix else ROOT_NAME
    if isinstance(obj, torch.Tensor):
        if obj.layout in _SPARSE_PARTS:
            for part, t in _SPARSE_PARTS[obj.layout](obj).items():
                out[f"{name}.{part}"] = t
        else:
            out[name] = obj
    elif isinstance(obj, torch.nn.Module):
        for k, v in list(obj.named_parameters()) + list(obj.named_buffers()):
            out[".".join(prefix + (k,))] = v
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, prefix + (str(k),)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, prefix + (str(i),)))
    return out


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def stored_bytes(t: torch.Tensor) -> bytes:
    """The tensor's values in C order as raw bytes (integer representation for quantized)."""
    if t.is_quantized:
        t = t.int_repr()
    t = t.detach().contiguous()
    if t.dtype == torch.complex32:
        t = torch.view_as_real(t).contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def our_bytes(arr: np.ndarray) -> bytes:
    return np.ascontiguousarray(arr).tobytes()


def torch_archive(n: int = 6, empty: bool = False) -> bytes:
    """The bytes of ``torch.save`` of ``n`` small tensors (one empty tensor more with ``empty``)."""
    import io
    buf = io.BytesIO()
    sd = {f"w{i}": torch.full((i % 5 + 1,), float(i)) for i in range(n)}
    if empty:
        sd["e"] = torch.empty(0)
    torch.save(sd, buf)
    return buf.getvalue()
