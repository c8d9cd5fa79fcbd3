"""Real modules and the files the real exporters write from them, for the graph tests.

Each builder returns ``(module, example inputs)``; `export_onnx` and `export_pt2` write the file
with torch's own exporters (``torch.onnx.export(..., dynamo=False)``, which needs no onnxscript,
and ``torch.export.save``). The oracles are onnx.load, torch.export.load and FlopCounterMode.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)
        self.fc3 = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, groups=2)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)
        self.up = nn.ConvTranspose2d(16, 4, 2, stride=2)
        self.head = nn.Linear(4 * 26 * 26, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = self.up(self.dw(x))
        return self.head(x.flatten(1))


class Attention(nn.Module):
    """Multi-head self-attention written out (q @ k^T, softmax, @ v) with GQA-free heads."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads

        def split(y):
            return y.view(b, t, h, d // h).transpose(1, 2)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / (d // h) ** 0.5
        a = torch.matmul(torch.softmax(scores, -1), v)
        return self.o_proj(a.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = Attention(d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, layers=3, d=32, vocab=50):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class SDPA(nn.Module):
    """Attention through F.scaled_dot_product_attention, with fewer key/value heads (GQA)."""

    def __init__(self, d=32, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.kv = heads, kv_heads
        self.hd = d // heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, kv_heads * self.hd)
        self.v = nn.Linear(d, kv_heads * self.hd)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


class Branchy(nn.Module):
    """Data-dependent control flow: scripted, it exports as an ONNX If with two subgraphs."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        return self.b(x) * 2


BUILDERS = {
    "mlp": lambda: (MLP(), (torch.randn(5, 16),)),
    "cnn": lambda: (CNN(), (torch.randn(2, 3, 28, 28),)),
    "transformer": lambda: (Transformer(), (torch.randint(0, 50, (2, 7)),)),
}


def build(name: str):
    """The module with random parameters (the ONNX exporter merges initializers of equal
    values, as a fresh LayerNorm's ones and zeros are), and its inputs."""
    torch.manual_seed(0)
    module, inputs = BUILDERS[name]()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    return module, inputs


def export_onnx(module, inputs, path, **kw) -> None:
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, str(path), dynamo=False, **kw)


def export_pt2(module, inputs, path) -> None:
    module.eval()
    torch.export.save(torch.export.export(module, inputs), str(path))


def flop_counter(module, inputs) -> tuple[int, dict[str, int]]:
    """FlopCounterMode's total and per-op counts (attention through the math kernel, so that it
    counts the two products; CPU's fused kernel has no formula in torch's counter)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    module.eval()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        module(*inputs)
    return fc.get_total_flops(), {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}


class Cond(nn.Module):
    """torch.cond: a .pt2 with two subgraphs (higher-order op)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.a(x), lambda x: self.b(x) * 2, (x,))
