"""Which tensor of A goes with which of B: names aligned (user prefixes, wrapper prefixes, maps),
tied weights, and the metadata compared. The steps and their order are in
`tensorscope.diffing`'s docstring."""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from .model import ModelFile, TensorInfo

__all__ = ["detect_prefixes", "PER_SAVE_KEYS"]


# ------------------------------------------------------------------------------------------------
# Alignment
# ------------------------------------------------------------------------------------------------

def _strip_user(name: str, strip: Sequence[str]) -> str:
    for p in strip:
        if p and name.startswith(p):
            name = name[len(p):]
    return name


def _map(name: str, maps: Sequence[tuple[str, str]]) -> str:
    for old, new in maps:
        if name.startswith(old):
            name = new + name[len(old):]
            break
    return name


def _common_prefixes(names: Sequence[str]) -> list[str]:
    """Every dotted prefix shared by all ``names`` that leaves each name non-empty, shortest first."""
    if not names:
        return [""]
    # The string prefix common to all names is the one common to the smallest and the largest.
    common = os.path.commonprefix([min(names), max(names)])
    dotted = common[: common.rfind(".") + 1]      # whole components only, the leaf excluded
    parts = dotted.split(".")[:-1]
    return ["".join(c + "." for c in parts[:i]) for i in range(len(parts) + 1)]


def _strip(names: Sequence[str], prefix: str) -> set[str]:
    n = len(prefix)
    return {x[n:] for x in names} if n else set(names)


def detect_prefixes(names_a: Sequence[str], names_b: Sequence[str],
                    rewrite: Callable[[str], str] | None = None) -> tuple[str, str]:
    """The wrapper prefixes to strip from A's and B's names ("" for none).

    A prefix counts only when every name of its side carries it and stripping it matches strictly
    more names; among equal matches the shortest prefixes win (no stripping when nothing gains).
    ``rewrite`` (the ``maps``) is applied to the names after a prefix is stripped.
    """
    rw = rewrite or (lambda n: n)

    def keys(names, prefix):
        return {rw(x) for x in _strip(names, prefix)}

    best = (len(keys(names_a, "") & keys(names_b, "")), 0, "", "")
    if best[0] == min(len(set(names_a)), len(set(names_b))):
        return "", ""  # every name already matches: no prefix can match more
    kb_by_prefix = {pb: keys(names_b, pb) for pb in _common_prefixes(names_b)}
    for pa in _common_prefixes(names_a):
        ka = keys(names_a, pa)
        for pb, kb in kb_by_prefix.items():
            hits = len(ka & kb)
            if hits > best[0]:
                best = (hits, len(pa) + len(pb), pa, pb)
    return best[2], best[3]


def _keyed(tensors: Sequence[TensorInfo], strip, maps, prefix: str) -> dict[str, TensorInfo]:
    out: dict[str, TensorInfo] = {}
    for t in tensors:
        key = _strip_user(t.name, strip)
        if prefix and key.startswith(prefix):
            key = key[len(prefix):]
        key = _map(key, maps)
        if key in out:  # two names collapsed into one key: keep the later one under its own name
            key = t.name
        out.setdefault(key, t)
    return out


# ------------------------------------------------------------------------------------------------
# Metadata
# ------------------------------------------------------------------------------------------------

_MISSING = object()


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(_flatten(v, key))
            else:
                out[key] = v
    return out


# Metadata that differs between any two saves of one model (torch writes a fresh serialization id
# and names the archive folder after the file): shown only on request (``-v``).
PER_SAVE_KEYS = frozenset({"serialization_id", "archive_prefix"})


def _metadata_diff(ma: ModelFile, mb: ModelFile) -> list[tuple[str, Any, Any]]:
    rows: list[tuple[str, Any, Any]] = []
    if ma.format != mb.format:
        rows.append(("format", ma.format, mb.format))
    fa, fb = _flatten(dict(ma.metadata or {})), _flatten(dict(mb.metadata or {}))
    # Keys of two different formats mostly describe different things (an ONNX opset, a safetensors
    # header length): across formats only the keys both sides have are compared.
    keys = set(fa) | set(fb) if ma.format == mb.format else set(fa) & set(fb)
    for key in sorted(keys):
        va, vb = fa.get(key, _MISSING), fb.get(key, _MISSING)
        if va is _MISSING or vb is _MISSING or va != vb:
            rows.append((key, None if va is _MISSING else va, None if vb is _MISSING else vb))
    return rows



def _tied(mine: dict[str, TensorInfo], other: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """Names only ``mine`` has whose bytes are exactly those of another of its tensors that
    ``other`` has too: name -> that tensor in ``other``."""
    groups: dict[tuple, list[str]] = {}
    for key, t in mine.items():
        if t.byte_offset is not None and t.numel and not t.chunks:
            groups.setdefault((t.file, t.byte_offset, t.dtype, t.shape, t.stride), []).append(key)
    out: dict[str, TensorInfo] = {}
    for keys in groups.values():
        shared = [k for k in keys if k in other]
        if len(keys) > 1 and shared:
            for k in keys:
                if k not in other:
                    out[mine[k].name] = other[shared[0]]
    return out


# torch.ao's quantized Linear keeps its weight and bias as the two items of one packed-params
# state (``fc._packed_params._packed_params`` = (qweight, bias)), which a loader hands back as
# ``fc.weight`` and ``fc.bias``: the float model's names.
_PACKED = (("._packed_params._packed_params.0", ".weight"),
           ("._packed_params._packed_params.1", ".bias"))


def unpack_keys(mine: dict[str, TensorInfo], other: dict[str, TensorInfo]) -> dict[str, TensorInfo]:
    """``mine`` with packed-params keys renamed to the float module's (``weight``, ``bias``)
    where ``other`` has that name and ``mine`` does not (so nothing that matched stops matching)."""
    if not any("._packed_params._packed_params." in k for k in mine):
        return mine
    out: dict[str, TensorInfo] = {}
    for k, t in mine.items():
        for suffix, leaf in _PACKED:
            if k.endswith(suffix):
                new = k[: -len(suffix)] + leaf
                if new in other and new not in mine:
                    k = new
                break
        out[k] = t
    return out
