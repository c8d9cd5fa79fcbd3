"""What a conversion writes: the state-dict selection, the refusals and the safetensors dtypes (`plan`)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .. import dtypes
from ..errors import TensorscopeError
from ..model import ModelFile, TensorInfo
from ..parsers.safetensors import DTYPES as _ST_READ_DTYPES
from .report import ConvertReport

# Roles that make up a state dict; everything else is skipped unless include_all.
STATE_DICT_ROLES = frozenset({"tensor", "parameter", "buffer", "initializer"})

# canonical dtype -> safetensors dtype; the reader's table inverted, plus torch's packed fp4.
SAFETENSORS_DTYPES: dict[str, str] = {canon: st for st, (canon, _bits) in _ST_READ_DTYPES.items()}
SAFETENSORS_DTYPES["float4_e2m1fn_x2"] = "F4"
# Data order: the reference writer sorts by its Dtype enum, descending; DTYPES lists the enum.
_DTYPE_RANK = {st: i for i, st in enumerate(_ST_READ_DTYPES)}
_SUB_BYTE_BITS = {st: bits for st, (_c, bits) in _ST_READ_DTYPES.items() if bits < 8}
_METADATA_KEY = "__metadata__"


# ------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------

class ConversionRefused(TensorscopeError):
    """The conversion was not done; ``report`` says why (a `ConvertReport`, status set)."""

    def __init__(self, message: str, report: "ConvertReport"):
        super().__init__(message)
        self.report = report


class UnsafeSource(ConversionRefused):
    """The scan found something at or above the refusal threshold (the CLI exits 1)."""


class Unconvertible(ConversionRefused):
    """Tensors safetensors cannot hold, or names it cannot store (the CLI exits 2)."""


# ------------------------------------------------------------------------------------------------
# Planning: which tensors, under which safetensors dtype and shape
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PlannedTensor:
    """One tensor to write: its source record and how it appears in the output."""

    info: TensorInfo
    st_dtype: str
    st_shape: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def nbytes(self) -> int:
        return self.info.nbytes


@dataclass
class ConversionPlan:
    """The outcome of `plan`: tensors to write (state-dict order) and the rest, with reasons.

    Attributes:
        tensors: what will be written.
        refused: ``[(TensorInfo, reason)]`` that stop the conversion (unless skipped).
        skipped: ``[(TensorInfo, reason)]`` left out on purpose (not part of the state dict, or
            refused and ``skip_unsupported``).
        shared: ``{storage: [names]}`` for storages viewed by several written tensors.
        expanded: names of tensors whose strides overlap (written materialised).
        contiguous: names of other non-contiguous tensors (written contiguous).
        sparse: ``{sparse tensor name: {"layout", "shape"}}`` for split sparse tensors.
    """

    tensors: list[PlannedTensor] = field(default_factory=list)
    refused: list[tuple[TensorInfo, str]] = field(default_factory=list)
    skipped: list[tuple[TensorInfo, str]] = field(default_factory=list)
    shared: dict[str, list[str]] = field(default_factory=dict)
    expanded: list[str] = field(default_factory=list)
    contiguous: list[str] = field(default_factory=list)
    sparse: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def _refusal(model: ModelFile, t: TensorInfo) -> str | None:
    """Why ``t`` cannot be written to safetensors, or None when it can."""
    spec = dtypes.spec(t.dtype)
    st = SAFETENSORS_DTYPES.get(t.dtype)
    if st is None:
        kinds = {"quantized": "a quantized torch dtype (no safetensors equivalent; dequantize it first)",
                 "block": "a block-quantized dtype", "string": "strings", "object": "Python objects"}
        what = kinds.get(spec.kind, "no safetensors equivalent")
        return f"dtype {t.dtype}: {what}"
    if t.extras.get("numpy_descr"):
        return f"NumPy dtype {t.extras['numpy_descr']} (structured, string or void records)"
    if spec.packed or st in _SUB_BYTE_BITS:
        if t.source_format == "onnx":
            return f"dtype {t.dtype} from ONNX: its nibble packing is not defined to match safetensors' {st}"
        if not t.is_contiguous:
            return f"packed dtype {t.dtype} stored with strides {list(t.stride)}"
        if t.dtype == "float4_e2m1fn_x2" and not t.shape:
            return "0-d float4_e2m1fn_x2 (safetensors F4 needs a last dimension to double)"
        bits = _SUB_BYTE_BITS.get(st, 8)
        if st in _SUB_BYTE_BITS and t.dtype != "float4_e2m1fn_x2" and (t.numel * bits) % 8:
            return f"{t.numel} values of {bits} bits do not fill whole bytes ({st})"
    if t.extras.get("pickled"):
        return "a pickled tensor subclass (its values are not a plain storage)"
    error = t.extras.get("error")
    if error:
        return f"no readable values: {error}"
    if t.byte_offset is None and not t.chunks and t.name not in model.custom_readers:
        device = t.extras.get("device")
        return "no stored values (meta tensor)" if device == "meta" else "no stored values"
    return None


def _st_shape(t: TensorInfo) -> tuple[int, ...]:
    if t.dtype == "float4_e2m1fn_x2":  # safetensors counts fp4 values, torch counts pairs
        return t.shape[:-1] + (t.shape[-1] * 2,)
    return t.shape


def _storage_id(t: TensorInfo) -> str | None:
    """A name for the storage ``t`` views, unique across files and key spaces (TorchScript's
    ``constants/`` reuses ``data/``'s keys; a legacy tar holds every storage in one member)."""
    if t.storage_key is None:
        return None
    member = t.extras.get("member")
    if member and str(member).endswith(str(t.storage_key)):
        return str(member)
    return f"{member or os.path.basename(t.file)}:{t.storage_key}"


def plan(model: ModelFile, *, include_all: bool = False, skip_unsupported: bool = False) -> ConversionPlan:
    """Decide what a conversion of ``model`` writes, refuses and skips. Reads no tensor bytes.

    Args:
        model: an open `ModelFile`.
        include_all: write every tensor the file lists, not only the state dict.
        skip_unsupported: leave refused tensors out (reported as skipped) instead of refusing.

    Returns:
        A `ConversionPlan`.

    Raises:
        Unconvertible: two written tensors share a name, or a name is ``__metadata__`` or is not
            valid UTF-8 (these cannot be skipped: the output would silently lose a tensor).
    """
    p = ConversionPlan()
    by_storage: dict[str, str] = {}  # storage -> the first tensor written from it
    shared: dict[str, list[str]] = {}
    layouts: dict[tuple, str] = {}
    plain_dtypes: dict[str, bool] = {}  # dtype -> nothing but the record's extras can refuse it
    bases: dict[str, str] = {}
    custom = model.custom_readers
    written, expanded, contiguous = p.tensors, p.expanded, p.contiguous
    for t in model.tensors:
        if not include_all and t.role not in STATE_DICT_ROLES:
            p.skipped.append((t, f"role {t.role}: not part of the state dict"))
            continue
        extras, name = t.extras, t.name
        plain = plain_dtypes.get(t.dtype)
        if plain is None:
            st = SAFETENSORS_DTYPES.get(t.dtype)
            plain = plain_dtypes[t.dtype] = (st is not None and st not in _SUB_BYTE_BITS
                                             and not dtypes.spec(t.dtype).packed)
        # The common record (a plain dtype, stored values, none of the extras that refuse)
        # passes `_refusal` as is.
        if not plain or t.byte_offset is None or (extras and (
                extras.get("numpy_descr") or extras.get("pickled") or extras.get("error"))):
            why = _refusal(model, t)
            if why is not None:
                (p.skipped if skip_unsupported else p.refused).append((t, why))
                continue
        dtype = t.dtype
        written.append(PlannedTensor(t, SAFETENSORS_DTYPES[dtype],
                                     t.shape if dtype != "float4_e2m1fn_x2" else _st_shape(t)))
        chunks = t.chunks
        if t.storage_key is not None and not chunks:
            # _storage_id, inlined (this runs once per tensor)
            member, key = extras.get("member"), t.storage_key
            if type(member) is str and type(key) is str and member.endswith(key):
                sid = member
            elif member:
                sid = _storage_id(t)
            else:
                base = bases.get(t.file)
                if base is None:
                    base = bases[t.file] = os.path.basename(t.file)
                sid = f"{base}:{key}"
            seen = len(by_storage)
            first = by_storage.setdefault(sid, name)
            if len(by_storage) == seen:  # a storage seen before: listed (most are viewed once)
                ids = shared.get(sid)
                if ids is None:
                    shared[sid] = [first, name]
                else:
                    ids.append(name)
        if not chunks and name not in custom:
            key = (t.shape, t.stride, t.dtype)  # a checkpoint has few layouts: judge each once
            kind = layouts.get(key)
            if kind is None:
                kind = layouts[key] = ("" if not t.numel else
                                       "expanded" if t.span_bytes < t.nbytes else
                                       "contiguous" if not t.is_contiguous else "")
            if kind:
                (expanded if kind == "expanded" else contiguous).append(name)
        if extras:
            layout = extras.get("sparse_layout")
            if layout and extras.get("component") and "." in name:
                p.sparse[name.rsplit(".", 1)[0]] = {"layout": str(layout),
                                                    "shape": list(extras.get("sparse_shape") or [])}
    if shared:  # in the order the storages were first seen
        p.shared = {k: shared[k] for k in by_storage if k in shared}
    _check_names(model, p)
    return p


def _check_names(model: ModelFile, p: ConversionPlan) -> None:
    names = [pt.name for pt in p.tensors]
    unique = set(names)
    if len(unique) == len(names) and _METADATA_KEY not in unique:
        try:
            "".join(names).encode("utf-8")
            return  # the usual case, checked at C speed
        except UnicodeEncodeError:
            pass
    seen: dict[str, int] = {}
    problems: list[str] = []
    for pt in p.tensors:
        seen[pt.name] = seen.get(pt.name, 0) + 1
        if pt.name == _METADATA_KEY:
            problems.append(f"a tensor is named {_METADATA_KEY!r}, which safetensors reserves")
        try:
            pt.name.encode("utf-8")
        except UnicodeEncodeError:
            problems.append(f"tensor name {pt.name!r} is not valid UTF-8")
    dups = [n for n, c in seen.items() if c > 1]
    if dups:
        problems.append("several tensors are named " + ", ".join(repr(n) for n in dups[:10])
                        + (f" (+{len(dups) - 10} more)" if len(dups) > 10 else ""))
    if problems:
        report = ConvertReport(input=model.path, source_format=model.format, status="refused")
        raise Unconvertible(f"{model.path}: cannot convert: " + "; ".join(problems), report)
