"""Where a conversion writes: output names, shard sizes (`parse_size`), splitting a plan into shards
and the Hugging Face index."""
from __future__ import annotations

import json
import os

from ..model import ModelFile
from .plan import ConversionPlan, PlannedTensor

# ------------------------------------------------------------------------------------------------
# Sizes and output names
# ------------------------------------------------------------------------------------------------

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """``"5GB"`` -> 5_000_000_000, ``"500MiB"`` -> 524_288_000, ``"1024"`` -> 1024 (as the
    Hugging Face tools read ``max_shard_size``: GB decimal, GiB binary).

    >>> parse_size("5GB"), parse_size("2MiB"), parse_size(7)
    (5000000000, 2097152, 7)
    """
    if isinstance(text, int):
        value = text
    else:
        s = str(text).strip().upper().replace(" ", "")
        digits = s.rstrip("KMGTIB")
        unit = s[len(digits):]
        if unit not in _UNITS or not digits:
            raise ValueError(f"size {text!r}: expected a number with an optional unit "
                             "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
        try:
            value = int(float(digits) * _UNITS[unit])
        except ValueError:
            raise ValueError(f"size {text!r}: {digits!r} is not a number") from None
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value


def _output_base(out: str) -> str:
    """The single-file output path: ``out``, or ``out/model.safetensors`` for a folder."""
    if os.path.isdir(out) or out.endswith(os.sep):
        return os.path.join(out, "model.safetensors")
    return out


def _shard_names(base: str, n: int) -> list[str]:
    stem = base[:-len(".safetensors")] if base.endswith(".safetensors") else base
    return [f"{stem}-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def _split_greedy(tensors: list[PlannedTensor], limit: int) -> list[list[PlannedTensor]]:
    shards: list[list[PlannedTensor]] = []
    current: list[PlannedTensor] = []
    size = 0
    for t in tensors:
        if current and size + t.nbytes > limit:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    if current or not shards:
        shards.append(current)
    return shards


def _is_sharded_input(model: ModelFile, tensors: list[PlannedTensor]) -> bool:
    """Several weight files behind one index (a sharded checkpoint), as opposed to one model
    whose tensors merely live in several files (ONNX external data, DCP ranks)."""
    files = {t.info.file for t in tensors if not t.info.chunks}
    if len(files) < 2 or model.format in ("onnx", "dcp"):
        return False
    return "shard" in model.format or "weight_map" in model.metadata


def _split_by_input(tensors: list[PlannedTensor], files: list[str]) -> list[list[PlannedTensor]]:
    order = {f: i for i, f in enumerate(files)}
    groups: dict[str, list[PlannedTensor]] = {}
    for t in tensors:
        groups.setdefault(t.info.file, []).append(t)
    return [groups[f] for f in sorted(groups, key=lambda f: (order.get(f, len(order)), f))]


# ------------------------------------------------------------------------------------------------
# Hashing the input (in a thread, while the tensors are copied)
# ------------------------------------------------------------------------------------------------

def _input_files(model: ModelFile, src: str) -> list[str]:
    """Every file the input consists of (the named file first), each once."""
    files = ([src] if os.path.isfile(src) else []) + [f for f in model.files if f and os.path.isfile(f)]
    return list({os.path.abspath(f): None for f in files})


def _layout(model: ModelFile, p: ConversionPlan, out: str, limit: int | None):
    """``(groups of tensors, their output paths, index path or None)``."""
    if limit is not None:
        groups = _split_greedy(p.tensors, limit)
    elif _is_sharded_input(model, p.tensors):
        groups = _split_by_input(p.tensors, list(model.files))
    else:
        groups = [p.tensors]
    base = _output_base(out)
    if len(groups) == 1:
        return groups, [base], None
    return groups, _shard_names(base, len(groups)), base + ".index.json"


def _write_index(path: str, groups: list[list[PlannedTensor]], paths: list[str]) -> None:
    """The Hugging Face index, as ``save_pretrained`` writes it (sorted keys, indent 2)."""
    weight_map = {t.name: os.path.basename(final) for group, final in zip(groups, paths) for t in group}
    total = sum(t.nbytes for group in groups for t in group)
    doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(path, "x", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
