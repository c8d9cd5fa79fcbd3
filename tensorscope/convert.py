"""Convert any model tensorscope reads into safetensors, executing nothing, in bounded memory.

`convert(src, out)` scans the input, opens it with the format parsers (nothing in it runs), picks
the tensors of its state dict, and streams each one from its zero-copy view into a safetensors
file. `plan(model)` is the selection step alone (what would be written, refused, skipped).

Output format (what ``safetensors.torch.save_file`` writes, byte for byte; checked by the tests):

- 8 bytes: ``N`` as a little-endian u64; ``N`` bytes of compact JSON (``","`` and ``":"``
  separators, UTF-8 unescaped, control characters escaped as serde_json does), padded with
  spaces to a multiple of 8; then the tensor bytes, little-endian, C order, with no hole.
- The JSON object is ``__metadata__`` first (str -> str), then one entry per tensor
  ``{"dtype", "shape", "data_offsets": [begin, end]}`` in data order. Data order is safetensors'
  own: dtype descending in the order of the reference crate's ``Dtype`` enum (which
  `tensorscope.parsers.safetensors.DTYPES` lists), then name ascending.
- ``F4`` shapes count fp4 values: a torch ``float4_e2m1fn_x2 [3, 4]`` is written ``F4 [3, 8]``.

What is written (state-dict semantics):

- Tensors whose role is ``tensor`` (plain containers), ``parameter``, ``buffer`` (persistent) or
  ``initializer`` (ONNX), named as tensorscope names them (the state-dict keys; sparse tensors as
  their components ``name.indices`` / ``name.values`` ..., recorded in ``__metadata__``).
  Non-persistent buffers, TorchScript constants, attributes and traced inputs, ONNX node
  constants and sparse initializers are skipped and reported (``include_all=True`` keeps them).
- Tensors that share a storage are each written as their own copy (safetensors forbids
  aliasing): reported in ``shared``. Tensors whose strides overlap (``expand``) are written
  materialised: ``expanded``. Other non-contiguous tensors are written contiguous: ``contiguous``.
- Refused, naming the tensors (`Unconvertible`), unless ``skip_unsupported=True`` leaves them
  out: dtypes safetensors cannot hold (complex128, complex32, quantized qint8/quint8/qint32/
  quint4x2/quint2x4, int4/uint4/int2/uint2, strings, objects, block-quantized types, NumPy
  structured/void/string arrays), ONNX fp4/fp6 (its nibble packing is not safetensors'), tensors
  without stored values (meta tensors, records stored empty), and packed tensors stored with
  strides. Two tensors with one name, or a tensor named ``__metadata__``, are an error.

``__metadata__`` holds ``format: "pt"`` (what Hugging Face loaders expect), ``source_format``
(tensorscope's format name), ``source_sha256`` (of the input file; for inputs of several files,
the sha256 of their ``sha256sum``-style manifest: ``"<hex>  <path relative to the input>\\n"``
lines sorted by path), ``converted_by``, and ``tensorscope.sparse`` when sparse tensors were
split. The hash is computed in a thread while the tensors are copied, and written into the header
(its length is fixed) once known.

Sharding: a sharded input (several weight files with an index) gives a sharded output, tensor
``t`` going to the shard matching its input shard; ``max_shard_size`` re-shards any input
greedily in state-dict order (a tensor larger than the limit gets a shard of its own), as
``huggingface_hub.split_torch_state_dict_into_shards`` does. Shards of ``dir/model.safetensors``
are ``dir/model-00001-of-00003.safetensors`` ..., with ``dir/model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {name: shard}}``, sorted keys).

Durability: each output is written to ``<OUT>.tmp-<random>`` in the output folder, flushed and
fsynced, verified when asked (reopened and compared with the input by `tensorscope.diff`, bit for
bit), then renamed into place (shards first, the index last) and the folder fsynced. On any
error every temporary file is removed, so a failure never leaves a half-written output. An
existing output is only replaced with ``force=True``.

Memory and speed: a contiguous tensor stored plainly in a file is copied by the kernel
(``os.copy_file_range``: no page of the input is mapped into this process), or, below 256 KiB,
read with ``os.pread`` into a buffer written every 4 MiB (a checkpoint of 100,000 small tensors
costs a few hundred writes, not 100,000 kernel copies; tensors a few bytes apart in the input
share one ``pread``); the header is built once, as text, from columns; any
other tensor is
read through the memory maps piece by piece (`reader.iter_flat_chunks`), a non-contiguous piece
copied one at a time, and the pages already written are handed back to the kernel. Either way
the resident set stays flat whatever the size. Copies of a whole tensor happen only where the
format forces them (compressed npz members, typed ONNX fields, byte-swapped NumPy arrays), and
in ``verify`` for chunked tensors. Chunked tensors (DCP) are written block by block along their
first dimension. Writeback of the output starts as it is written, so the final fsync is short.

Public API: `convert`, `plan`, `ConversionPlan`, `PlannedTensor`, `ConvertReport`,
`ConversionRefused`, `UnsafeSource`, `Unconvertible`, `parse_size`, `SAFETENSORS_DTYPES`, `SCHEMA`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import mmap
import operator
import os
import re
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from . import __version__, dtypes
from .errors import FileMissing, FormatError, TensorscopeError
from .model import ModelFile, TensorInfo
from .parsers.safetensors import DTYPES as _ST_READ_DTYPES
from .parsers.safetensors import HEADER_LEN
from .reader import CHUNK_BYTES, iter_flat_chunks, strided_view
from .remote import is_url

__all__ = ["convert", "check_arguments", "plan", "ConversionPlan", "PlannedTensor", "ConvertReport",
           "ConversionRefused", "UnsafeSource", "Unconvertible", "parse_size",
           "SAFETENSORS_DTYPES", "SCHEMA", "STATE_DICT_ROLES"]

SCHEMA = "tensorscope.convert/1"

# Roles that make up a state dict; everything else is skipped unless include_all.
STATE_DICT_ROLES = frozenset({"tensor", "parameter", "buffer", "initializer"})

# canonical dtype -> safetensors dtype; the reader's table inverted, plus torch's packed fp4.
SAFETENSORS_DTYPES: dict[str, str] = {canon: st for st, (canon, _bits) in _ST_READ_DTYPES.items()}
SAFETENSORS_DTYPES["float4_e2m1fn_x2"] = "F4"
# Data order: the reference writer sorts by its Dtype enum, descending; DTYPES lists the enum.
_DTYPE_RANK = {st: i for i, st in enumerate(_ST_READ_DTYPES)}
_SUB_BYTE_BITS = {st: bits for st, (_c, bits) in _ST_READ_DTYPES.items() if bits < 8}

_SHA_PLACEHOLDER = "0" * 64   # replaced in place once the hash is known (same length)
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


# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------

@dataclass
class ConvertReport:
    """What a conversion did (or why it did not).

    JSON schema (`to_dict`, stable; new keys may be added, none removed)::

        {"schema": "tensorscope.convert/1",
         "status": "converted" | "refused-unsafe" | "refused",
         "input": str, "source_format": str,
         "source_sha256": str | null,          # as written into __metadata__
         "source_files": {path: sha256},       # every input file
         "outputs": [{"path": str, "tensors": int, "bytes": int}],   # bytes: file size
         "index": str | null,                  # model.safetensors.index.json when sharded
         "tensors_written": int, "bytes_written": int,   # tensor bytes
         "tensors": [{"name", "dtype", "shape", "file"}],  # safetensors dtype/shape, output file
         "shared": [{"storage": str, "tensors": [str]}],   # de-aliased: each written as a copy
         "expanded": [str], "contiguous": [str],
         "skipped": [{"name", "dtype", "reason"}], "refused": [{"name", "dtype", "reason"}],
         "verified": bool | null,              # null: --verify not asked
         "allowed_unsafe": bool,
         "scan": <tensorscope.scan/1 report> | null}
    """

    input: str
    source_format: str = ""
    status: str = "converted"
    source_sha256: str | None = None
    source_files: dict[str, str] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    index: str | None = None
    tensors: list[dict[str, Any]] = field(default_factory=list)
    shared: dict[str, list[str]] = field(default_factory=dict)
    expanded: list[str] = field(default_factory=list)
    contiguous: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    verified: bool | None = None
    allowed_unsafe: bool = False
    scan: Any = None

    @property
    def bytes_written(self) -> int:
        return sum(t["nbytes"] for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "status": self.status, "input": self.input,
            "source_format": self.source_format, "source_sha256": self.source_sha256,
            "source_files": dict(self.source_files), "outputs": list(self.outputs),
            "index": self.index, "tensors_written": len(self.tensors),
            "bytes_written": self.bytes_written,
            "tensors": [{k: t[k] for k in ("name", "dtype", "shape", "file")} for t in self.tensors],
            "shared": [{"storage": k, "tensors": v} for k, v in self.shared.items()],
            "expanded": list(self.expanded), "contiguous": list(self.contiguous),
            "skipped": list(self.skipped), "refused": list(self.refused),
            "verified": self.verified, "allowed_unsafe": self.allowed_unsafe,
            "scan": self.scan.to_dict() if hasattr(self.scan, "to_dict") else self.scan,
        }


def _listing(items: Sequence[tuple[TensorInfo, str]]) -> list[dict[str, Any]]:
    return [{"name": t.name, "dtype": t.dtype, "reason": why} for t, why in items]


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


class _Hasher(threading.Thread):
    """sha256 of each input file, read sequentially with a small buffer (no mmap: the resident
    set does not grow; hashlib and readinto release the GIL, so this runs beside the copy)."""

    BUF = 1 << 20

    def __init__(self, files: list[str]):
        super().__init__(name="tensorscope-sha256", daemon=True)
        self.files = files
        self.digests: dict[str, str] = {}
        self.error: BaseException | None = None
        self._cancelled = threading.Event()

    def run(self) -> None:
        try:
            buf = bytearray(self.BUF)
            view = memoryview(buf)
            for path in self.files:
                h = hashlib.sha256()
                with open(path, "rb", buffering=0) as f:
                    while not self._cancelled.is_set():
                        n = f.readinto(buf)
                        if not n:
                            break
                        h.update(view[:n])
                self.digests[path] = h.hexdigest()
        except BaseException as e:  # re-raised by result() in the caller's thread
            self.error = e

    def cancel(self) -> None:
        self._cancelled.set()

    def result(self, root: str) -> tuple[str, dict[str, str]]:
        self.join()
        if self.error is not None:
            raise TensorscopeError(f"cannot hash the input: {self.error}") from self.error
        if len(self.files) == 1:
            return self.digests[self.files[0]], dict(self.digests)
        base = root if os.path.isdir(root) else os.path.dirname(root)
        rel = {os.path.relpath(p, base): d for p, d in self.digests.items()}
        manifest = "".join(f"{d}  {p}\n" for p, d in sorted(rel.items()))
        return hashlib.sha256(manifest.encode("utf-8")).hexdigest(), dict(self.digests)


# ------------------------------------------------------------------------------------------------
# Reading values piece by piece
# ------------------------------------------------------------------------------------------------

def _releaser(model: ModelFile):
    from .reader import PageReleaser
    return PageReleaser(model)


def _chunked_pieces(model: ModelFile, info: TensorInfo, chunk_bytes: int) -> Iterator[np.ndarray]:
    """A chunked tensor (DCP) in C order, assembled one block of leading rows at a time."""
    spec = dtypes.spec(info.dtype)
    where = dict(format=info.source_format or "convert", file=info.file)
    shape = info.shape
    views = []
    for c in info.chunks:
        if len(c.offsets) != len(shape) or len(c.sizes) != len(shape) or any(
                o < 0 or s < 0 or o + s > d for o, s, d in zip(c.offsets, c.sizes, shape)):
            raise FormatError(f"chunk of {info.name!r} at {list(c.offsets)} size {list(c.sizes)} "
                              f"lies outside the tensor's shape {list(shape)}", **where)
        v = strided_view(model, c.tensor)
        if v.shape != tuple(c.sizes):
            raise FormatError(f"chunk of {info.name!r} at {list(c.offsets)} has shape "
                              f"{list(v.shape)}, expected {list(c.sizes)}", **where)
        views.append((c, v))
    if not shape:
        block = np.zeros((), dtype=spec.numpy)
        for _, v in views:
            block[()] = v
        yield block.reshape(1)
        return
    row_bytes = math.prod(shape[1:]) * spec.itemsize
    rows = max(1, chunk_bytes // max(row_bytes, 1))
    for r0 in range(0, shape[0], rows):
        r1 = min(shape[0], r0 + rows)
        block = np.zeros((r1 - r0,) + shape[1:], dtype=spec.numpy)  # holes read as 0, as assemble_chunks
        for c, v in views:
            lo, hi = max(r0, c.offsets[0]), min(r1, c.offsets[0] + c.sizes[0])
            if lo >= hi:
                continue
            dst = (slice(lo - r0, hi - r0),) + tuple(slice(o, o + s) for o, s in
                                                     zip(c.offsets[1:], c.sizes[1:]))
            block[dst] = v[lo - c.offsets[0]:hi - c.offsets[0]]
        yield block.reshape(-1)


def _pieces(model: ModelFile, info: TensorInfo, chunk_bytes: int, release) -> Iterator[np.ndarray]:
    """The tensor's bytes in C order as contiguous little-endian 1-D pieces."""
    if info.chunks:
        yield from _chunked_pieces(model, info, chunk_bytes)
        return
    arr = model.read(info)
    for piece in iter_flat_chunks(arr, chunk_bytes):
        if piece.dtype.byteorder == ">":  # big-endian NumPy data: safetensors is little-endian
            piece = piece.astype(piece.dtype.newbyteorder("<"))
        yield piece
        release(info.file, piece)


# ------------------------------------------------------------------------------------------------
# Writing one safetensors file
# ------------------------------------------------------------------------------------------------

def _data_order(tensors: list[PlannedTensor]) -> list[PlannedTensor]:
    """safetensors' own order: dtype (enum rank) descending, then name ascending (bytewise UTF-8,
    which is code point order)."""
    by_dtype: dict[str, list[PlannedTensor]] = {}
    for t in tensors:
        group = by_dtype.get(t.st_dtype)
        if group is None:
            by_dtype[t.st_dtype] = [t]
        else:
            group.append(t)
    ordered: list[PlannedTensor] = []
    for st in sorted(by_dtype, key=_DTYPE_RANK.__getitem__, reverse=True):
        ordered += sorted(by_dtype[st], key=_BY_NAME)
    return ordered


_BY_NAME = operator.attrgetter("info.name")


# Characters json.dumps(ensure_ascii=False) escapes in a string; a name without any is written
# as itself between quotes (names are valid UTF-8 by then: `_check_names`).
_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')


def _header(ordered: list[PlannedTensor], metadata: dict[str, str] | None) -> bytes:
    # Built from columns as text: the same bytes as json.dumps of the whole object (the same
    # C encoder writes the metadata and any name that needs escaping), without 100,000 dicts
    # and lists to walk. Each distinct shape and dtype is formatted once.
    enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    plain = not _JSON_ESCAPED.search("".join([t.info.name for t in ordered]))
    shapes: dict[tuple[int, ...], str] = {}
    heads: dict[str, str] = {}
    parts = [f"{enc(_METADATA_KEY)}:{enc(metadata)}"] if metadata else []
    begin = 0
    for t in ordered:
        name, end = t.info.name, begin + t.info.nbytes
        shape = shapes.get(t.st_shape)
        if shape is None:
            shape = shapes[t.st_shape] = ",".join(map(str, t.st_shape))
        head = heads.get(t.st_dtype)
        if head is None:
            head = heads[t.st_dtype] = f':{{"dtype":{enc(t.st_dtype)},"shape":['
        key = f'"{name}"' if plain else enc(name)
        parts.append(f'{key}{head}{shape}],"data_offsets":[{begin},{end}]}}')
        begin = end
    text = ("{" + ",".join(parts) + "}").encode("utf-8")
    pad = (8 - len(text) % 8) % 8  # data starts on a multiple of 8, as the reference writer pads
    return HEADER_LEN.pack(len(text) + pad) + text + b" " * pad


class _Sink:
    """The output file: plain writes, kernel-side copies, and early writeback.

    Contiguous tensors stored plainly in a file are copied by ``os.copy_file_range`` (the kernel
    moves the bytes page cache to page cache: no page faults on our maps, no user-space copy);
    when the kernel or filesystem refuses it, the bytes go through the memory map instead.
    Every `WRITEBACK_STEP` bytes, writeback of what is already written is started
    (``POSIX_FADV_DONTNEED`` starts it without waiting), so the final fsync has only the tail
    left to wait for and the output does not crowd the page cache.

    Small tensors (below `GATHER_BELOW` bytes) are gathered: read with ``os.pread`` (no map
    either) into one buffer written every `GATHER_STEP` bytes, so a checkpoint of 100,000 small
    tensors costs a few hundred writes instead of 100,000 kernel copies.
    """

    WRITEBACK_STEP = 64 << 20
    GATHER_BELOW = 256 << 10
    GATHER_STEP = 4 << 20
    GATHER_GAP = 4 << 10

    def __init__(self, path: str, advance: Callable[[int], None]):
        self.f = open(path, "xb", buffering=0)
        self.fd = self.f.fileno()
        self.pos = 0
        self.synced = 0  # writeback started up to here
        self.advance = advance
        self.can_copy = hasattr(os, "copy_file_range")
        self.sources: dict[str, int] = {}
        self.gathered = bytearray()  # read, accounted, not yet written
        self.run: list[tuple[int, int]] = []  # (offset, length) to gather, not yet read
        self.run_file: str | None = None      # ... all from this file, in [run_start, run_end)
        self.run_start = self.run_end = self.pending = 0

    def _fd(self, file: str) -> int:
        src = self.sources.get(file)
        if src is None:
            src = self.sources[file] = os.open(file, os.O_RDONLY)
        return src

    def flush(self) -> None:
        """Write the gathered bytes (before any other write or copy: the file position moves)."""
        if self.run:
            self._read_run()
        if self.gathered:
            view = memoryview(self.gathered)
            done = 0
            while done < len(view):
                done += self.f.write(view[done:])
            view.release()
            self.gathered.clear()

    def gather(self, file: str, offset: int, length: int) -> None:
        """Append ``length`` bytes of ``file`` at ``offset`` (inside the file: checked by the
        caller) to the buffer; written at the next `flush`. Tensors that follow each other in
        the file, a few bytes apart (a zip's local headers), are read with one ``pread``."""
        gap = offset - self.run_end
        if file == self.run_file and 0 <= gap <= self.GATHER_GAP and \
                offset + length - self.run_start <= self.GATHER_STEP:
            self.run.append((offset, length))
            self.run_end = offset + length
        else:
            if self.run:
                self._read_run()
            self.run_file, self.run_start, self.run_end = file, offset, offset + length
            self.run.append((offset, length))
        self.pending += length  # accounted (position, progress, writeback) once read

    def _read_run(self) -> None:
        file, start, end, run = self.run_file, self.run_start, self.run_end, self.run
        data = os.pread(self._fd(file), end - start, start)
        if len(data) != end - start:
            raise TensorscopeError(f"{file}: read {len(data)} bytes at offset {start}, expected "
                                   f"{end - start} (the file changed while it was converted?)")
        if len(run) == 1:
            self.gathered += data
            n = len(data)
        else:
            view = memoryview(data)
            gathered = self.gathered
            n = 0
            for offset, length in run:
                gathered += view[offset - start:offset - start + length]
                n += length
            view.release()
        run.clear()
        self.run_file = None
        self.pending = 0
        self._account(n)
        if len(self.gathered) >= self.GATHER_STEP:
            self.flush()

    def tell(self) -> int:
        """Bytes of the output so far, counting those gathered but not read yet."""
        return self.pos + self.pending

    def _account(self, n: int) -> None:
        self.pos += n
        self.advance(n)
        if self.pos - self.synced >= self.WRITEBACK_STEP and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(self.fd, self.synced, self.pos - self.synced, os.POSIX_FADV_DONTNEED)
            except OSError:
                # advice only
                pass
            self.synced = self.pos

    def write(self, data) -> None:
        self.flush()
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += self.f.write(view[done:])
        self._account(len(view))

    def copy(self, file: str, offset: int, length: int) -> int:
        """Copy up to ``length`` bytes of ``file`` from ``offset``; returns how many were copied
        (fewer, down to 0, when the kernel refuses: the caller writes the rest)."""
        if not self.can_copy:
            return 0
        self.flush()
        src = self._fd(file)
        done = 0
        while done < length:
            try:
                n = os.copy_file_range(src, self.fd, min(length - done, self.WRITEBACK_STEP),
                                       offset + done)
            except OSError:
                self.can_copy = False  # EXDEV, EINVAL, ENOSYS, EOPNOTSUPP: use plain writes
                break
            if n <= 0:
                break
            done += n
            self._account(n)
        return done

    def close(self) -> None:
        """Close (after `flush` on success; on failure the gathered bytes are dropped with the
        temporary file)."""
        for fd in self.sources.values():
            os.close(fd)
        self.sources.clear()
        self.f.close()


def _plain_range(model: ModelFile, info: TensorInfo,
                 layouts: dict | None = None) -> tuple[str, int] | None:
    """``(file, offset)`` when the tensor's bytes are exactly ``nbytes`` contiguous bytes of a
    file on disk, in the order safetensors wants; None otherwise. ``layouts`` caches, across
    the calls for one file, what repeats: by (shape, stride) whether the layout is contiguous
    and not empty, by file its source when that is a file on disk (else None)."""
    if info.chunks or info.byte_offset is None or info.name in model.custom_readers:
        return None
    if layouts is None:
        layouts = {}
    key = (info.shape, info.stride)
    plain_layout = layouts.get(key)
    if plain_layout is None:
        plain_layout = layouts[key] = bool(info.numel) and info.is_contiguous
    if not plain_layout:
        return None
    src = layouts.get(info.file, False)
    if src is False:  # an in-memory blob or a URL is not a file
        src = model.source(info.file)
        src = layouts[info.file] = src if isinstance(src.raw, mmap.mmap) and not is_url(src.path) else None
    if src is None:
        return None
    itemsize = _PLAIN_ITEMSIZE.get(info.dtype, -1)
    if itemsize == -1:
        itemsize = _plain_itemsize(info.dtype)
    if itemsize is None:
        arr = model.read(info)  # the reader's own bounds checks; touches no tensor byte
        return None if arr.dtype.byteorder == ">" else (info.file, info.byte_offset)
    # What `reader.strided_view` checks for a contiguous tensor, without building the view
    # (this runs once per tensor): inside the file, and inside its storage record.
    offset, n = info.byte_offset, info.nbytes
    if offset < 0 or n > src.size - offset:
        src.check(offset, n, f"tensor {info.name!r}", fmt=info.source_format or "read",
                  member=info.storage_key)  # raises, with the reader's message
    if info.storage_nbytes is not None:
        start = info.storage_offset * itemsize
        if start + n > info.storage_nbytes:
            raise FormatError(
                f"tensor {info.name!r} needs bytes [{start}, {start + n}) of its storage "
                f"but the storage record holds {info.storage_nbytes} bytes",
                format=info.source_format or "read", file=info.file, member=info.storage_key)
    return info.file, offset


_PLAIN_ITEMSIZE: dict[str, int | None] = {}


def _plain_itemsize(dtype: str) -> int | None:
    """Bytes per element of a dtype whose contiguous bytes are its values as numpy views them,
    None for the others (packed, block, strings, objects, complex32: the reader decides)."""
    if dtype not in _PLAIN_ITEMSIZE:
        spec = dtypes.spec(dtype)
        plain = not (spec.numpy_name is None or spec.kind in ("block", "string", "object")
                     or spec.packed or spec.name == "complex32")
        _PLAIN_ITEMSIZE[dtype] = spec.itemsize if plain else None
    return _PLAIN_ITEMSIZE[dtype]


def _write_file(path: str, model: ModelFile, ordered: list[PlannedTensor], metadata: dict[str, str],
                chunk_bytes: int, release, advance: Callable[[int], None]) -> int:
    """Write one safetensors file (header with a placeholder hash); returns the header size."""
    header = _header(ordered, metadata)
    sink = _Sink(path, advance)
    layouts: dict = {}
    try:
        sink.write(header)
        for t in ordered:
            start = sink.tell()
            plain = _plain_range(model, t.info, layouts)
            if plain is None:
                for piece in _pieces(model, t.info, chunk_bytes, release):
                    raw = piece.view(np.uint8) if piece.dtype != np.uint8 else piece
                    sink.write(np.ascontiguousarray(raw))
            elif t.nbytes < sink.GATHER_BELOW:
                sink.gather(plain[0], plain[1], t.nbytes)
            else:
                copied = sink.copy(plain[0], plain[1], t.nbytes)
                if copied < t.nbytes:  # the kernel refused part: the rest through the map
                    src = model.source(plain[0])
                    rest = src.view(plain[1] + copied, t.nbytes - copied, f"tensor {t.name!r}")
                    for i in range(0, len(rest), chunk_bytes):
                        sink.write(rest[i:i + chunk_bytes])
                    release(plain[0], model.read(t.info))
            if sink.tell() - start != t.nbytes:  # a reader bug must never become a shifted file
                raise TensorscopeError(f"tensor {t.name!r}: wrote {sink.tell() - start} bytes, "
                                       f"expected {t.nbytes}")
        sink.flush()
    finally:
        sink.close()
    return len(header)


def _patch_hash(path: str, header_len: int, old: bytes, new: bytes) -> None:
    with open(path, "r+b") as f:
        head = f.read(header_len)
        at = head.find(old)
        if at < 0 or len(old) != len(new):
            raise TensorscopeError(f"{path}: hash placeholder not found in the header")
        f.seek(at)
        f.write(new)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        # some filesystems refuse fsync on folders; the files themselves are synced
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------
# Verification (the diff engine)
# ------------------------------------------------------------------------------------------------

def _expected_model(model: ModelFile, tensors: list[PlannedTensor]) -> ModelFile:
    """The input restricted to ``tensors``, sharing its maps (for a diff against an output)."""
    exp = ModelFile(model.format, model.path, [t.info for t in tensors], sources=model.sources,
                    files=model.files)
    for t in tensors:
        info = t.info
        if info.dtype == "float4_e2m1fn" and t.st_dtype == "F4" and info.shape and info.shape[-1] % 2 == 0:
            # The safetensors reader lists an even F4 as torch's float4_e2m1fn_x2 (same bytes).
            info = dataclasses.replace(info, dtype="float4_e2m1fn_x2", stride=None, nbytes=info.nbytes,
                                       shape=info.shape[:-1] + (info.shape[-1] // 2,))
            exp.tensors[exp.tensors.index(t.info)] = info
        if info.name in model.custom_readers:
            exp.custom_readers[info.name] = model.custom_readers[info.name]
    return exp


def _verify(model: ModelFile, tensors: list[PlannedTensor], path: str) -> None:
    from .diffing import diff_models
    from .formats import open_model
    with open_model(path, format="safetensors") as written:
        result = diff_models(_expected_model(model, tensors), written, atol=0.0, rtol=0.0,
                             detect_prefix=False, detect_renames=False)
    # Bit for bit: every tensor "same" with identical bytes (layout changes are expected).
    bad = [e for e in result.entries
           if e.status != "same" or e.values is None or not e.values.identical_bytes]
    if bad or len(result.entries) != len(tensors):
        names = ", ".join(f"{e.name} ({e.status}{': ' + '; '.join(e.changes) if e.changes else ''})"
                          for e in bad[:5])
        raise TensorscopeError(f"verification failed for {path}: {len(bad)} tensor(s) differ from "
                               f"the input: {names}")


# ------------------------------------------------------------------------------------------------
# The conversion
# ------------------------------------------------------------------------------------------------

def _severity(value):
    from .scan import Severity
    if value is None or isinstance(value, Severity):
        return value
    return Severity.parse(str(value))


def _announce_scan(report, on_scan, refuse_at, allow_unsafe_source) -> None:
    if on_scan is not None:
        on_scan(report.scan)
    _refuse_if_unsafe(report, _severity(refuse_at), allow_unsafe_source)


def convert(src: str | os.PathLike, out: str | os.PathLike, *, max_shard_size: int | str | None = None,
            allow_unsafe_source: bool = False, refuse_at: Any = "critical", verify: bool = False,
            force: bool = False, include_all: bool = False, skip_unsupported: bool = False,
            metadata: dict[str, str] | None = None, record_source: bool = True,
            scan_report: Any = None, progress: Callable[[int], None] | None = None,
            chunk_bytes: int = CHUNK_BYTES, on_scan: Callable[[Any], None] | None = None,
            planned: Callable[[int], None] | None = None) -> ConvertReport:
    """Convert a model file or folder to safetensors without executing anything from it.

    Args:
        src: any input `tensorscope.open` reads (torch zip/legacy/TorchScript, DCP and sharded
            folders, ONNX, NumPy, safetensors).
        out: the output file (``model.safetensors``) or an existing folder (``out/model.safetensors``).
            Sharded outputs are named after it (see the module docstring).
        max_shard_size: bytes (or ``"5GB"``) per output shard; None keeps one file, or the input's
            sharding for a sharded input.
        allow_unsafe_source: convert even when the scan reaches ``refuse_at``.
        refuse_at: the scan severity that refuses the conversion (default ``critical``).
        verify: reopen every output and compare it with the input, bit for bit, before renaming.
        force: replace existing outputs.
        include_all, skip_unsupported: see `plan`.
        metadata: extra ``__metadata__`` entries (str -> str); they override the defaults.
        record_source: write ``format``, ``source_format``, ``source_sha256`` and ``converted_by``.
        scan_report: a `ScanReport` already computed for ``src``; None scans the model opened
            here (`tensorscope.scan.scan_opened`: one parse for scanning and converting).
        on_scan: called with the scan report before anything is written (the CLI prints it).
        progress: called with the number of tensor bytes written after each piece.
        planned: called once with the number of tensor bytes to write, before the first is
            written (a progress bar's total).
        chunk_bytes: bytes copied per step (peak memory is a small multiple of it).

    Returns:
        The `ConvertReport` (status ``converted``).

    Raises:
        UnsafeSource: the scan reached ``refuse_at`` and ``allow_unsafe_source`` is False.
        Unconvertible: tensors safetensors cannot hold (named in the message).
        TensorscopeError: the input cannot be read, an output exists without ``force``,
            verification failed. No output file is left behind by any failure.

    Example:
        >>> report = convert("pytorch_model.bin", "model.safetensors", verify=True)  # doctest: +SKIP
        >>> report.tensors_written, report.outputs                                  # doctest: +SKIP
    """
    from .formats import gc_paused, open_model
    from .parsers.zip_dispatch import keeping_archive
    from .scan import scan_opened, scan_paths

    src, out = os.fspath(src), os.fspath(out)
    limit = check_arguments(src, out, force=force, max_shard_size=max_shard_size)
    report = ConvertReport(input=src, allowed_unsafe=bool(allow_unsafe_source))
    try:
        with keeping_archive():  # the scan below reuses the zip's central directory
            model = open_model(src)
    except TensorscopeError:
        # what cannot be opened is still judged first: a hostile file is refused as unsafe
        report.scan = scan_report if scan_report is not None else scan_paths(src)
        _announce_scan(report, on_scan, refuse_at, allow_unsafe_source)
        raise
    with model, contextlib.ExitStack() as after_scan:
        # the scan reads the model just opened: one parse for both
        report.scan = scan_report if scan_report is not None else scan_opened(src, model)
        model.evidence.archive = None  # read by the scan; the writing has no use for it
        # From here the collector stays paused while the 10^5-10^6 plan entries, header parts and
        # report rows are made (`formats.gc_paused`): the records it would walk are frozen, but
        # these new objects would set off full collections over each other again and again
        # (measured: the report rows took 3-7x longer). Not during the scan, whose garbage is
        # collected as it goes. The pause ends, and the records are unfrozen, with the model.
        after_scan.enter_context(gc_paused())
        _announce_scan(report, on_scan, refuse_at, allow_unsafe_source)
        report.source_format = model.format
        p = _checked_plan(model, report, include_all, skip_unsupported)
        if planned is not None:
            planned(p.total_bytes)
        groups, paths, index = _layout(model, p, out, limit)
        _check_targets(src, model, paths + ([index] if index else []), force)
        meta: dict[str, str] = {}
        if record_source:
            meta = {"format": "pt", "source_format": model.format, "source_sha256": _SHA_PLACEHOLDER,
                    "converted_by": f"tensorscope {__version__}"}
        if p.sparse:
            meta["tensorscope.sparse"] = json.dumps(p.sparse, sort_keys=True, separators=(",", ":"))
        meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
        hash_it = meta.get("source_sha256") == _SHA_PLACEHOLDER
        hasher = _Hasher(_input_files(model, src)) if hash_it else None
        temps: list[str] = []
        try:
            if hasher is not None:
                hasher.start()
            sizes = []
            for group, final in zip(groups, paths):
                temps.append(f"{final}.tmp-{secrets.token_hex(4)}")
                sizes.append(_write_file(temps[-1], model, _data_order(group), meta, chunk_bytes,
                                         _releaser(model).release_piece, progress or (lambda n: None)))
            if hasher is not None:
                report.source_sha256, report.source_files = hasher.result(src)
                for tmp, hlen in zip(temps, sizes):  # fsyncs each file
                    _patch_hash(tmp, hlen, f'"source_sha256":"{_SHA_PLACEHOLDER}"'.encode(),
                                f'"source_sha256":"{report.source_sha256}"'.encode())
            else:
                report.source_sha256 = meta.get("source_sha256")
                for tmp in temps:
                    _fsync_file(tmp)
            if verify:
                for tmp, group in zip(temps, groups):
                    _verify(model, group, tmp)
                report.verified = True
            finals = list(paths)
            if index is not None:
                temps.append(f"{index}.tmp-{secrets.token_hex(4)}")
                _write_index(temps[-1], groups, paths)
                finals.append(index)
            for tmp, final in zip(temps, finals):  # shards first, the index last
                os.replace(tmp, final)
            _fsync_dir(os.path.dirname(os.path.abspath(paths[0])))
        except BaseException:
            for tmp in temps:  # first of all: no half-written output survives
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
            if hasher is not None:
                hasher.cancel()
            raise

        # Still inside ``with model`` and the collector's pause (see above).
        report.index = index
        for group, final in zip(groups, paths):
            report.outputs.append({"path": final, "tensors": len(group),
                                   "bytes": os.path.getsize(final)})
            report.tensors.extend([{"name": t.info.name, "dtype": t.st_dtype,
                                    "shape": list(t.st_shape), "nbytes": t.info.nbytes,
                                    "file": final} for t in group])
    return report


def _refuse_if_unsafe(report: ConvertReport, threshold, allow: bool) -> None:
    worst = report.scan.severity
    if worst is None or threshold is None or worst < threshold or allow:
        return
    report.status = "refused-unsafe"
    first = next(f for f in report.scan.findings if f.severity >= threshold)
    raise UnsafeSource(f"{report.input}: refused: the scan found {worst} issues ({first.rule}: "
                       f"{first.message}); nothing was converted. Pass --allow-unsafe-source "
                       "to convert the tensors anyway (conversion executes nothing)", report)


def _checked_plan(model: ModelFile, report: ConvertReport, include_all: bool,
                  skip_unsupported: bool) -> ConversionPlan:
    """`plan`, its outcome recorded in ``report``; raises Unconvertible when nothing may go on."""
    try:
        p = plan(model, include_all=include_all, skip_unsupported=skip_unsupported)
    except Unconvertible as e:
        e.report.scan, e.report.allowed_unsafe = report.scan, report.allowed_unsafe
        raise
    report.skipped = _listing(p.skipped)
    report.refused = _listing(p.refused)
    report.shared, report.expanded, report.contiguous = p.shared, p.expanded, p.contiguous
    if p.refused:
        report.status = "refused"
        shown = "; ".join(f"{t.name} ({why})" for t, why in p.refused[:8])
        more = f" (+{len(p.refused) - 8} more)" if len(p.refused) > 8 else ""
        raise Unconvertible(f"{report.input}: cannot convert {len(p.refused)} tensor(s) to "
                            f"safetensors: {shown}{more}. Pass --skip-unsupported to leave them out",
                            report)
    if not p.tensors:
        report.status = "refused"
        shown = ", ".join(f"{t.name} ({why})" for t, why in p.skipped[:5])
        raise Unconvertible(f"{report.input}: nothing to convert: no tensor is left to write "
                            f"({len(p.skipped)} skipped: {shown})", report)
    return p


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


def check_arguments(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
                    max_shard_size: int | str | None = None) -> int | None:
    """What can be known wrong before the input is read: a missing input, an output that is
    neither ``*.safetensors`` nor an existing folder, a missing output folder, an existing
    output without ``force``, an output that is the input, a bad ``max_shard_size``. Returns
    the shard size in bytes (or None). Raises TensorscopeError (`FileMissing` for a missing
    input). `convert` calls it first; the CLI calls it before it scans."""
    src, out = os.fspath(src), os.fspath(out)
    if not is_url(src) and not os.path.exists(src):
        raise FileMissing(src, "no such file or directory")
    limit = None
    if max_shard_size is not None:
        try:
            limit = parse_size(max_shard_size)
        except ValueError as e:
            raise TensorscopeError(f"--max-shard-size: {e}") from None
    base = _output_base(out)
    if not base.endswith(".safetensors"):
        raise TensorscopeError(f"{out}: the output must be a .safetensors file or an existing "
                               "folder")
    folder = os.path.dirname(os.path.abspath(base))
    if not os.path.isdir(folder):
        raise TensorscopeError(f"{base}: the output folder {folder} does not exist")
    if not is_url(src) and os.path.realpath(base) == os.path.realpath(src):
        raise TensorscopeError(f"{base}: the output would overwrite the input")
    if os.path.exists(base) and not force:
        raise TensorscopeError(f"{base}: exists; pass --force to replace it")
    return limit


def _fsync_file(path: str) -> None:
    with open(path, "r+b") as f:
        os.fsync(f.fileno())


def _check_targets(src: str, model: ModelFile, targets: list[str], force: bool) -> None:
    inputs = {os.path.realpath(f) for f in _input_files(model, src)}
    for t in targets:
        folder = os.path.dirname(os.path.abspath(t))
        if not os.path.isdir(folder):
            raise TensorscopeError(f"{t}: the output folder {folder} does not exist")
        if os.path.realpath(t) in inputs:
            raise TensorscopeError(f"{t}: the output would overwrite the input")
        if os.path.exists(t) and not force:
            raise TensorscopeError(f"{t}: exists; pass --force to replace it")
