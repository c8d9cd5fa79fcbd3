"""A fused projection in one model against its split parts in the other: the same weights.

Attention implementations store the query, key and value projections either as one matrix
(``qkv_proj``, ``query_key_value``, ``Wqkv``, ``W_pack``, ``in_proj_weight``) or as three
(``q_proj``/``k_proj``/``v_proj``, ``query``/``key``/``value``, ``wq``/``wk``/``wv`` ...);
converters go from one to the other by stacking rows (torch.cat along dim 0). `fused_matches`
finds, among the names only one side has, a fused tensor whose parts the other side has under the
same parent module, with the same leaf (``weight``, ``bias``): the fused rows are the parts' rows
in q, k, v order when the row counts add up and the other dimensions agree. Each part is then
compared with its rows of the fused tensor (`row_slice`: a record of those rows, a view of the
same bytes, nothing copied), so a fused against a split model diffs as the same weights.

Only plain dtypes stored in one piece are sliced (block-quantized rows are not whole blocks in
general); anything else stays "removed" and "added".
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from . import dtypes
from .model import TensorInfo

__all__ = ["FUSED", "fused_matches", "row_slice"]

# fused component -> the split components, in the order their rows are stacked
FUSED = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "qkv": ("q", "k", "v"),
    "query_key_value": ("query", "key", "value"),
    "Wqkv": ("Wq", "Wk", "Wv"),
    "W_pack": ("q_proj", "k_proj", "v_proj"),
    "wqkv": ("wq", "wk", "wv"),
    "c_qkv": ("c_q", "c_k", "c_v"),
    "in_proj_weight": ("q_proj_weight", "k_proj_weight", "v_proj_weight"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "attn_qkv": ("attn_q", "attn_k", "attn_v"),   # GGUF's names
}


def _sliceable(t: TensorInfo, model) -> bool:
    s = dtypes.spec(t.dtype)
    return (t.byte_offset is not None and not t.chunks and t.name not in model.custom_readers
            and s.numpy_name is not None and not s.packed and s.kind not in ("block", "quantized")
            and len(t.shape) >= 1 and t.stride[0] >= 0)


def row_slice(t: TensorInfo, lo: int, hi: int) -> TensorInfo:
    """The record of rows [lo, hi) of ``t`` (a view of the same stored bytes)."""
    item = dtypes.spec(t.dtype).itemsize
    rows = hi - lo
    rest = t.numel // t.shape[0] if t.shape[0] else 0
    return dataclasses.replace(
        t, name=f"{t.name}[{lo}:{hi}]", shape=(rows,) + tuple(t.shape[1:]),
        byte_offset=t.byte_offset + lo * t.stride[0] * item,
        storage_offset=t.storage_offset + lo * t.stride[0], nbytes=rows * rest * item)


def _split_names(key: str) -> list[tuple[str, tuple[str, ...]]]:
    """Every way ``key`` names a fused tensor: (the fused component, the split keys)."""
    parts = key.split(".")
    out = []
    for i, c in enumerate(parts):
        split = FUSED.get(c)
        if split is not None:
            out.append((c, tuple(".".join(parts[:i] + [s] + parts[i + 1:]) for s in split)))
    return out


def fused_matches(fused_side: dict[str, TensorInfo], split_side: dict[str, TensorInfo],
                  fused_model, split_model) -> list[tuple[TensorInfo, list[tuple[TensorInfo,
                                                                              TensorInfo]]]]:
    """(fused tensor, [(its rows for a part, that part)]) for every fused tensor among the keys
    of ``fused_side`` whose split parts are keys of ``split_side`` (both: aligned key -> tensor,
    only the names one side lacks)."""
    out = []
    for key, t in fused_side.items():
        if not _sliceable(t, fused_model):
            continue
        for _, names in _split_names(key):
            parts = [split_side.get(n) for n in names]
            if any(p is None for p in parts):
                continue
            if any(p.shape[1:] != t.shape[1:] or not p.shape for p in parts):
                continue
            if sum(p.shape[0] for p in parts) != t.shape[0]:
                continue
            pairs, lo = [], 0
            for p in parts:
                pairs.append((row_slice(t, lo, lo + p.shape[0]), p))
                lo += p.shape[0]
            out.append((t, pairs))
            break
    return out


def used(matches: Sequence) -> tuple[set[str], set[str]]:
    """Names of the fused tensors and of the parts the matches consume."""
    fused = {t.name for t, _ in matches}
    parts = {p.name for _, pairs in matches for _, p in pairs}
    return fused, parts
