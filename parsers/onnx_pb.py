"""ONNX: a protobuf ``ModelProto``, walked on the wire, never loaded.

Format (normative, as ``onnx.load`` 1.23 reads it; field numbers checked against onnx's
descriptors by the tests):

- The file is one protobuf message ``ModelProto`` and nothing else: no magic, no trailer. A
  message is a sequence of fields ``tag, payload``; ``tag = field_number << 3 | wire_type`` is a
  varint. Wire types: 0 varint (at most 10 bytes), 1 fixed 8 bytes, 2 length-delimited (varint
  length, then that many bytes: strings, bytes, sub-messages, packed repeated scalars), 5 fixed 4
  bytes; 3/4 (groups) are obsolete and only skipped in unknown fields. Fields MAY come in any
  order; a singular field that appears twice keeps its last value, and a singular sub-message
  that appears twice is merged (both occurrences are walked, in order). Unknown field numbers
  are skipped (and reported, bounded). A known field with the wrong wire type is an error.
- Repeated scalar fields MAY be packed (one length-delimited payload) or not (one tagged field
  per element), or both, and a reader MUST accept every form. ``TensorProto`` declares
  ``float_data``, ``int32_data``, ``int64_data``, ``double_data`` and ``uint64_data`` packed;
  ``dims`` and the ``AttributeProto`` lists are not packed by onnx's writer.
- protobuf's own parser refuses messages over 2 GiB and copies every byte; this walker keeps
  absolute offsets instead, so files of any size open, and ``raw_data`` payloads are never read
  while listing.

Where tensors live (all are listed, ordered per graph: initializers, sparse initializers, then
the tensors of each node in node order, a subgraph's tensors at its node's place; then training
graphs, then functions):

- ``GraphProto.initializer`` (role ``initializer``), named by ``TensorProto.name``.
- ``GraphProto.sparse_initializer``: a ``SparseTensorProto`` (values, indices, dims) is listed as
  two tensors ``<name>.values`` and ``<name>.indices`` (role ``sparse_initializer``), ``<name>``
  being the values tensor's name; ``extras["sparse_dims"]`` holds the dense shape.
- ``Constant`` nodes: attribute ``value`` (a TensorProto) is named by the node's output (role
  ``constant``); ``value_float``/``value_int`` (0-d) and ``value_floats``/``value_ints`` (1-d)
  are listed too; ``sparse_value`` as a sparse pair; ``value_string(s)`` are not listed (noted in
  ``extras["skipped_constants"]``). Other nodes' tensor attributes (``t``, ``tensors``,
  ``sparse_tensor(s)``) are listed as role ``constant`` with ``extras["attribute"]``.
- Subgraphs (``AttributeProto.g``/``graphs``: If/Loop/Scan bodies), ``TrainingInfoProto``
  graphs and ``FunctionProto`` nodes are walked the same way, iteratively, nesting bounded by
  `Limits.max_graph_depth`. ``extras["graph"]`` is the path (``main/If_0.then_branch``). A name
  already used by an earlier tensor becomes ``<graph path>/<name>``.

A tensor's values (``TensorProto``), checked in onnx's order:

- ``data_location == EXTERNAL`` (1): ``external_data`` key/value entries ``location`` (a path
  relative to the model's folder, REQUIRED), ``offset`` and ``length`` (optional decimal
  integers; location alone means the whole file), ``checksum``, ``basepath``. Other keys are
  ignored and reported (bounded, as onnx does). A location that is absolute, climbs out of the
  folder with ``..`` or resolves outside it through symlinks is rejected (CWE-22;
  GHSA-538c-55jv-c5g9 for onnx's own fix); offset and length are checked against the external
  file's size, which is the only thing read from it while listing (``os.stat``).
- else ``raw_data``: the little-endian bytes, zero-copy at its absolute offset. Its length MUST
  equal ``ceil(numel * bits / 8)`` (sub-byte types pack LSB first, a partial byte is padding).
- else the typed field of the element type: ``float_data`` (float32, complex64 interleaved) and
  ``double_data`` (float64, complex128) hold the little-endian layout when packed in one
  payload, so they are zero-copy too; ``int32_data`` (bit patterns for float16/bfloat16/float8,
  values for int8/16/32, uint8/16, bool; two 4-bit or four 2-bit values per entry; one 6-bit
  value per entry), ``int64_data``, ``uint64_data`` (uint32/uint64) and ``string_data`` are
  decoded on read: a copy (``extras["copy"] = True``, ``byte_offset = None``,
  ``model.custom_readers[name]``). Sub-byte types read back packed, as raw bytes, like a view.
- no data at all is valid only for an empty tensor.

Public API: `FORMAT`, `sniff`, `open_source`, `Limits`, `DEFAULT_LIMITS`, `OnnxFormatError`,
`ONNX_DTYPES`, `MESSAGES` (the field tables), `decode_varints`.
"""
from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from tensorscope import dtypes
from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.model import Anomaly, Evidence, ModelFile, TensorInfo
from tensorscope.remote import RemoteSource, is_url
from tensorscope.remote import dirname as remote_dirname
from tensorscope.remote import join as remote_join
from tensorscope.source import ByteSource, whole

from . import protowire
# the wire reader's names, as the walker (and code that reads ONNX through this module) uses them
from .protowire import (EGROUP, I32, I64, LEN, SGROUP, VARINT, WireField,  # noqa: F401
                        _peek_varint, _table, _text, _WIRE_NAMES)

__all__ = ["FORMAT", "sniff", "open_source", "Limits", "DEFAULT_LIMITS", "OnnxFormatError",
           "ONNX_DTYPES", "MESSAGES", "WireField", "decode_varints"]

FORMAT = "onnx"

# The onnx.proto messages this walker reads (onnx 1.23.2). tests/test_onnx.py checks every
# entry against onnx's generated descriptors: same names, numbers and wire types.
MESSAGES: dict[str, dict[int, WireField]] = {
    "ModelProto": _table(
        ir_version=(1, VARINT), producer_name=(2, LEN), producer_version=(3, LEN),
        domain=(4, LEN), model_version=(5, VARINT), doc_string=(6, LEN), graph=(7, LEN),
        opset_import=(8, LEN), metadata_props=(14, LEN), training_info=(20, LEN),
        functions=(25, LEN), configuration=(26, LEN)),
    "GraphProto": _table(
        node=(1, LEN), name=(2, LEN), initializer=(5, LEN), doc_string=(10, LEN), input=(11, LEN),
        output=(12, LEN), value_info=(13, LEN), quantization_annotation=(14, LEN),
        sparse_initializer=(15, LEN), metadata_props=(16, LEN)),
    "NodeProto": _table(
        input=(1, LEN), output=(2, LEN), name=(3, LEN), op_type=(4, LEN), attribute=(5, LEN),
        doc_string=(6, LEN), domain=(7, LEN), overload=(8, LEN), metadata_props=(9, LEN),
        device_configurations=(10, LEN)),
    "AttributeProto": _table(
        name=(1, LEN), f=(2, I32), i=(3, VARINT), s=(4, LEN), t=(5, LEN), g=(6, LEN),
        floats=(7, I32, True), ints=(8, VARINT, True), strings=(9, LEN), tensors=(10, LEN),
        graphs=(11, LEN), doc_string=(13, LEN), tp=(14, LEN), type_protos=(15, LEN),
        type=(20, VARINT), ref_attr_name=(21, LEN), sparse_tensor=(22, LEN),
        sparse_tensors=(23, LEN)),
    "TensorProto": _table(
        dims=(1, VARINT, True), data_type=(2, VARINT), segment=(3, LEN),
        float_data=(4, I32, True), int32_data=(5, VARINT, True), string_data=(6, LEN),
        int64_data=(7, VARINT, True), name=(8, LEN), raw_data=(9, LEN),
        double_data=(10, I64, True), uint64_data=(11, VARINT, True), doc_string=(12, LEN),
        external_data=(13, LEN), data_location=(14, VARINT), metadata_props=(16, LEN)),
    "TensorProto.Segment": _table(begin=(1, VARINT), end=(2, VARINT)),
    "SparseTensorProto": _table(values=(1, LEN), indices=(2, LEN), dims=(3, VARINT, True)),
    "FunctionProto": _table(
        name=(1, LEN), input=(4, LEN), output=(5, LEN), attribute=(6, LEN), node=(7, LEN),
        doc_string=(8, LEN), opset_import=(9, LEN), domain=(10, LEN), attribute_proto=(11, LEN),
        value_info=(12, LEN), overload=(13, LEN), metadata_props=(14, LEN)),
    "TrainingInfoProto": _table(
        initialization=(1, LEN), algorithm=(2, LEN), initialization_binding=(3, LEN),
        update_binding=(4, LEN)),
    "ValueInfoProto": _table(name=(1, LEN), type=(2, LEN), doc_string=(3, LEN),
                             metadata_props=(4, LEN)),
    "TypeProto": _table(
        tensor_type=(1, LEN), sequence_type=(4, LEN), map_type=(5, LEN), denotation=(6, LEN),
        opaque_type=(7, LEN), sparse_tensor_type=(8, LEN), optional_type=(9, LEN)),
    "TypeProto.Tensor": _table(elem_type=(1, VARINT), shape=(2, LEN)),
    "TypeProto.SparseTensor": _table(elem_type=(1, VARINT), shape=(2, LEN)),
    "TypeProto.Sequence": _table(elem_type=(1, LEN)),
    "TypeProto.Optional": _table(elem_type=(1, LEN)),
    "TypeProto.Map": _table(key_type=(1, VARINT), value_type=(2, LEN)),
    "TensorShapeProto": _table(dim=(1, LEN)),
    "TensorShapeProto.Dimension": _table(dim_value=(1, VARINT), dim_param=(2, LEN),
                                         denotation=(3, LEN)),
    "StringStringEntryProto": _table(key=(1, LEN), value=(2, LEN)),
    "OperatorSetIdProto": _table(domain=(1, LEN), version=(2, VARINT)),
}

# TensorProto.DataType (onnx 1.23) -> canonical dtype name (FORMATS.md "Dtype vocabulary").
ONNX_DTYPES: dict[int, str] = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    8: "string", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64",
    14: "complex64", 15: "complex128", 16: "bfloat16", 17: "float8_e4m3fn",
    18: "float8_e4m3fnuz", 19: "float8_e5m2", 20: "float8_e5m2fnuz", 21: "uint4", 22: "int4",
    23: "float4_e2m1fn", 24: "float8_e8m0fnu", 25: "uint2", 26: "int2", 27: "float6_e2m3fn",
    28: "float6_e3m2fn",
}

# TensorProto field numbers of the typed value fields.
_F_FLOAT, _F_INT32, _F_STRING, _F_INT64, _F_DOUBLE, _F_UINT64 = 4, 5, 6, 7, 10, 11
_TYPED_FIELD_NAMES = {_F_FLOAT: "float_data", _F_INT32: "int32_data", _F_STRING: "string_data",
                      _F_INT64: "int64_data", _F_DOUBLE: "double_data", _F_UINT64: "uint64_data"}
# Which typed field holds each dtype (onnx.helper.tensor_dtype_to_field).
_STORAGE_FIELD: dict[str, int] = {
    "float32": _F_FLOAT, "complex64": _F_FLOAT, "float64": _F_DOUBLE, "complex128": _F_DOUBLE,
    "int64": _F_INT64, "uint32": _F_UINT64, "uint64": _F_UINT64, "string": _F_STRING,
}
for _name in ONNX_DTYPES.values():
    _STORAGE_FIELD.setdefault(_name, _F_INT32)
# Values packed into one int32_data entry (4-bit: two, 2-bit: four); float6 keeps one per entry.
_PER_INT32_ENTRY = {"int4": 2, "uint4": 2, "float4_e2m1fn": 2, "int2": 4, "uint2": 4}
_DATA_LOCATION_EXTERNAL = 1
_EXTERNAL_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})


@dataclass(frozen=True)
class Limits:
    """Bounds on hostile or absurd input; crossing one raises `LimitExceeded`."""

    max_graph_depth: int = 64      # subgraph nesting (If inside Loop inside If ...)
    max_type_depth: int = 32       # TypeProto nesting (sequence of map of optional ...)
    max_rank: int = 64             # dims per tensor (numpy's own maximum)
    max_tensors: int = 10_000_000
    max_nodes: int = 10_000_000
    max_reported: int = 10         # unknown keys / unknown fields reported per file (onnx: 10)
    max_doc_chars: int = 4096      # doc strings kept in metadata

    def __post_init__(self):
        for name, value in vars(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")


DEFAULT_LIMITS = Limits()


class OnnxFormatError(FormatError):
    """Malformed ONNX. ``anomaly`` holds the `Anomaly` recorded for it, when there is one (the
    model that would have carried it is not returned when the error is raised)."""

    anomaly: Anomaly | None = None


def _err(reason: str, offset: int | None = None, **kw) -> OnnxFormatError:
    return OnnxFormatError(reason, format=FORMAT, offset=offset, **kw)


# -- the wire reader, raising ONNX's error ------------------------------------------------------
def _varint(buf, pos: int, end: int, what: str) -> tuple[int, int]:
    return protowire._varint(buf, pos, end, what, _err)


def _fields(buf, start: int, end: int, message: str) -> Iterator[tuple[int, int, int, int, int]]:
    """`protowire._fields` over the ONNX message ``message`` (its table in `MESSAGES`)."""
    return protowire._fields(buf, start, end, message, MESSAGES[message], _err)


def decode_varints(payload) -> np.ndarray:
    return protowire.decode_varints(payload, _err)


# -- sniffing -------------------------------------------------------------------------------------
def _sniff_message(head: bytes, start: int, end: int, message: str, file_end: int,
                   depth: int = 0) -> tuple[bool, set[int]]:
    """Check that ``head[start:end]`` is a prefix of valid ``message`` fields: known numbers,
    declared wire types, lengths inside ``file_end``; small known sub-messages recursively."""
    table = MESSAGES[message]
    seen: set[int] = set()
    pos = start
    while pos < end:
        got = _peek_varint(head, pos, end)
        if got is None:
            return end < file_end, seen  # cut by the head: fine; cut by the message: not
        tag, pos = got
        number, wire = tag >> 3, tag & 7
        spec = table.get(number)
        if spec is None and number > max(table) and wire in (VARINT, I64, LEN, I32):
            # A field from a newer onnx. Text never gets here: its bytes are fields 4 to 15.
            spec = WireField("unknown", wire)
        if tag < 0 or spec is None or not (wire == spec.wire or (spec.packable and wire == LEN)):
            return False, seen
        seen.add(number)
        if wire == VARINT:
            got = _peek_varint(head, pos, end)
            if got is None:
                return end < file_end, seen
            value, pos = got
            if value < 0 or (message == "ModelProto" and number == 1 and not 1 <= value <= 64):
                return False, seen
        elif wire in (I32, I64):
            pos += 4 if wire == I32 else 8
        else:
            got = _peek_varint(head, pos, end)
            if got is None:
                return end < file_end, seen
            length, pos = got
            if length < 0 or length > file_end - pos:
                return False, seen
            stop = min(pos + length, end)
            sub = _SNIFF_SUBMESSAGES.get((message, number))
            if sub is not None and depth < 3:
                ok, _ = _sniff_message(head, pos, stop, sub, pos + length, depth + 1)
                if not ok:
                    return False, seen
            elif spec.name in ("producer_name", "producer_version", "domain", "name",
                               "op_type", "key", "value"):
                try:  # a cut at the head's end may split a character: ignore the last 3 bytes
                    bytes(head[pos:stop]).decode("utf-8")
                except UnicodeDecodeError as e:
                    if stop - e.start > 3 or stop == pos + length:
                        return False, seen
            pos += length
    return pos == end or end < file_end, seen


_SNIFF_SUBMESSAGES = {
    ("ModelProto", 7): "GraphProto", ("ModelProto", 8): "OperatorSetIdProto",
    ("ModelProto", 14): "StringStringEntryProto", ("GraphProto", 1): "NodeProto",
    ("GraphProto", 5): "TensorProto", ("NodeProto", 5): "AttributeProto",
}


_SNIFF_HEAD = 4096
_UNBOUNDED = 1 << 62


def truncation(buf, size: int) -> str | None:
    """The reason when ``buf`` (the file, or its first bytes) is a ``ModelProto`` cut short: its
    start is valid ONNX (as `sniff` checks it, lengths aside) and a top-level field runs past the
    end of the file. None when that cannot be told from ``buf``."""
    head = bytes(buf[:_SNIFF_HEAD])
    ok, seen = _sniff_message(head, 0, min(len(head), size), "ModelProto", _UNBOUNDED)
    if not ok or not seen & {1, 7}:
        return None
    table = MESSAGES["ModelProto"]
    pos, avail = 0, min(len(buf), size)
    while pos < avail:   # top-level fields only: a handful, whatever the model's size
        got = _peek_varint(buf, pos, avail)
        if got is None or got[0] < 0:
            break
        tag, pos = got
        number, wire = tag >> 3, tag & 7
        if wire == VARINT:
            got = _peek_varint(buf, pos, avail)
            if got is None or got[0] < 0:
                break
            pos = got[1]
            continue
        if wire in (I32, I64):
            end = pos + (4 if wire == I32 else 8)
        elif wire == LEN:
            got = _peek_varint(buf, pos, avail)
            if got is None or got[0] < 0:
                break
            end = got[1] + got[0]
        else:
            return None
        if end > size:
            spec = table.get(number)
            what = f"ModelProto.{spec.name}" if spec is not None else f"ModelProto field {number}"
            return f"truncated: {what} needs {end} bytes, the file ends at {size}"
        pos = end
    return None   # (a tag or varint cut by the end keeps the walker's "truncated varint")


def sniff(head: bytes, size: int) -> bool:
    """True when the head parses as the start of a ``ModelProto`` holding an ``ir_version`` (1
    to 64) or a graph: every field a known one with its declared wire type, every length inside
    the file, names valid UTF-8, opset/graph/node/tensor sub-messages well formed as far as the
    head reaches. Zip, pickle, safetensors, GGUF, NumPy and text fail on the first bytes."""
    if not head or size <= 0:
        return False
    end = min(len(head), size)
    ok, seen = _sniff_message(head, 0, end, "ModelProto", size)
    return ok and bool(seen & {1, 7})


# -- the model walker -----------------------------------------------------------------------------
@dataclass
class _Pending:
    """A tensor found during the walk; built (named, resolved) once all are known."""

    key: tuple
    name: str
    role: str
    graph: str
    spans: list[tuple[int, int]]          # TensorProto occurrences (merged in order)
    extras: dict[str, Any] = field(default_factory=dict)
    # Constant attribute scalars: (AttributeProto spans, field number, dtype, 0-d?)
    attr_value: tuple | None = None


@dataclass
class _GraphTask:
    spans: list[tuple[int, int]]
    path: str
    key: tuple
    depth: int
    kind: str = "GraphProto"              # or FunctionProto: nodes at field 7


class _HopAhead:
    """Asks a remote source for the places a message walk will jump to, many at a time.

    The fields of a GraphProto form a chain: where initializer k+1 starts is known only once
    initializer k's length has been read, and the raw data between is skipped. Read by ranges,
    that is one round trip per tensor (500 tensors at 20 ms: 10 s). Models repeat themselves (a
    transformer's layers hold the same tensors), so when the walk is about to jump into bytes not
    fetched yet, the sizes of the fields to come are guessed from the shortest period the recent
    sizes repeat with (a layer's worth of tensors; sizes a few bytes apart count as equal, as
    names grow a digit; no period, no guess), and a small range at each guessed start goes out
    in one concurrent batch (`RemoteSource.prefetch`). A right guess saves a round trip; a wrong
    one costs a small range (rounded to cache blocks) and the walk faults there as before. The
    skipped data stay unfetched. The batch doubles while the walk runs past the guesses, and
    halves after a wrong one.
    """

    PROBE = 512            # bytes at a guessed start: the tag, the length and a tensor's header
    BEFORE = 128           # a guess may land a few bytes late (a name one digit shorter)
    SLACK = 16             # sizes this close repeat (the same tensor, a longer name)
    FIRST, MOST = 4, 256   # guesses per batch
    MAX_PERIOD = 1024      # fields per repeating unit looked for

    def __init__(self, src, end: int):
        self.prefetch = getattr(src, "prefetch", None)   # None for a local map: nothing to do
        self.cached = getattr(src, "cached", None)
        self.end = end
        self.sizes: list[int] = []
        self.window = self.FIRST
        self.last_guess = -1

    def field(self, at: int, b: int) -> None:
        """The walk read the field ``[at, b)``; the next one starts at ``b``."""
        if self.prefetch is None:
            return
        self.sizes.append(b - at)
        if b >= self.end or self.cached(b, 16):
            return
        if self.last_guess >= 0:   # ran past the guesses, or one was wrong
            self.window = min(self.window * 2, self.MOST) if b > self.last_guess else \
                max(self.FIRST, self.window // 2)
        period = self._period()
        if period is None:
            return
        ranges, pos = [(b, self.PROBE)], b
        for k in range(self.window):
            pos += period[k % len(period)]
            if pos >= self.end:
                break
            ranges.append((max(0, pos - self.BEFORE), self.BEFORE + self.PROBE))
            self.last_guess = pos
        self.prefetch(ranges)

    def _period(self) -> list[int] | None:
        """The sizes of the shortest unit the last fields repeat (the last ``max(p, 8)`` sizes
        equal those ``p`` before them: two equal tensors in a row are no unit of one), or None
        when nothing repeats (no guess is better than a wrong one)."""
        sizes, n, slack = self.sizes, len(self.sizes), self.SLACK
        for p in range(1, min(n // 2, self.MAX_PERIOD) + 1):
            span = max(p, 8)
            if n - p < span:
                break
            if all(abs(sizes[i] - sizes[i - p]) <= slack for i in range(n - 1, n - 1 - span, -1)):
                return sizes[n - p:]
        return None


@dataclass
class _TensorFields:
    """What one walk over a TensorProto found (payload positions, not values)."""

    dims: list[int] = field(default_factory=list)
    data_type: int = 0
    name: str = ""
    raw: tuple[int, int] | None = None
    raw_count: int = 0
    data_location: int = 0
    external: list[tuple[str, str, int]] = field(default_factory=list)
    segment: tuple[int, int] | None = None
    # typed field number -> [packed payloads, unpacked count, bytes in unpacked elements, first at]
    typed: dict[int, list] = field(default_factory=dict)


class _Walker:
    def __init__(self, src: ByteSource, limits: Limits, strict: bool):
        self.src = src
        self.buf = whole(src, "ONNX model", fmt=FORMAT)
        self.path = src.path
        self.limits = limits
        self.strict = strict
        self.evidence = Evidence()
        self.pending: list[_Pending] = []
        self.nodes: list[tuple[str, str, str]] = []
        self.op_counts: dict[str, int] = {}
        self.node_domains: set[str] = set()
        self.graph_nodes: dict[str, int] = {}
        self.skipped_constants: list[str] = []
        self.node_total = 0
        self.reported: dict[str, int] = {}
        self.metadata: dict[str, Any] = {}
        self.external_files: dict[str, tuple[str, int]] = {}

    # -- reporting --
    def report(self, kind: str, message: str, offset: int | None = None) -> None:
        """Add an anomaly; kinds that can repeat are bounded by `Limits.max_reported`."""
        n = self.reported[kind] = self.reported.get(kind, 0) + 1
        if n <= self.limits.max_reported:
            self.evidence.add(kind, message, file=self.path, offset=offset)

    def unknown(self, message: str, number: int, wire: int, at: int) -> None:
        self.report("onnx.unknown_field", f"unknown field {number} ({_WIRE_NAMES[wire]}) in "
                    f"{message}, skipped", at)

    # -- the model --
    def walk(self) -> None:
        buf, md = self.buf, self.metadata
        graphs: list[tuple[int, int]] = []
        opsets: dict[str, int] = {}
        props: dict[str, str] = {}
        training: list[tuple[int, int]] = []
        functions: list[tuple[int, int]] = []
        for num, wire, a, b, at in _fields(buf, 0, self.src.size, "ModelProto"):
            if num == 1:
                md["ir_version"] = a
            elif num in (2, 3, 4):
                md[{2: "producer_name", 3: "producer_version", 4: "domain"}[num]] = _text(buf, a, b)
            elif num == 5:
                md["model_version"] = a
            elif num == 6:
                md["doc_string"] = _text(buf, a, b, self.limits.max_doc_chars)
            elif num == 7:
                graphs.append((a, b))
            elif num == 8:
                domain, version = self.opset(a, b)
                opsets[domain] = version
            elif num == 14:
                k, v = self.entry(a, b)
                props[k] = v
            elif num == 20:
                training.append((a, b))
            elif num == 25:
                functions.append((a, b))
            elif num not in MESSAGES["ModelProto"]:
                self.unknown("ModelProto", num, wire, at)
        md.setdefault("ir_version", 0)
        md["opset_import"] = opsets
        md["metadata_props"] = props
        if not graphs:
            self.report("onnx.no_graph", "ModelProto has no graph", 0)
        tasks = [_GraphTask(graphs, "main", (0,), 1)] if graphs else []
        for i, span in enumerate(training):
            for num, wire, a, b, at in _fields(buf, *span, "TrainingInfoProto"):
                if num in (1, 2):
                    which = "initialization" if num == 1 else "algorithm"
                    tasks.append(_GraphTask([(a, b)], f"training_info.{i}.{which}", (1, i, num), 1))
        for i, span in enumerate(functions):
            name = domain = ""
            for num, wire, a, b, at in _fields(buf, *span, "FunctionProto"):
                if num == 1:
                    name = _text(buf, a, b)
                elif num == 10:
                    domain = _text(buf, a, b)
            md.setdefault("functions", []).append({"name": name, "domain": domain})
            if domain:
                self.node_domains.add(domain)
            label = f"{domain}.{name}" if domain else name
            tasks.append(_GraphTask([span], f"functions/{label or i}", (2, i), 1, "FunctionProto"))
        # Iterative depth-first walk: a subgraph found in a node is pushed, never recursed into.
        tasks.reverse()
        while tasks:
            task = tasks.pop()
            found = self.graph(task)
            tasks.extend(reversed(found))
        domains = set(opsets) | self.node_domains
        md["domains"] = sorted(d for d in domains if d not in ("", "ai.onnx"))
        # the domains nodes (and local functions) actually use: what makes a runtime load a library
        md["node_domains"] = sorted(d for d in self.node_domains if d not in ("", "ai.onnx"))
        md["op_counts"] = dict(sorted(self.op_counts.items()))
        md["node_count"] = self.node_total

    def opset(self, a: int, b: int) -> tuple[str, int]:
        domain, version = "", 0
        for num, wire, x, y, at in _fields(self.buf, a, b, "OperatorSetIdProto"):
            if num == 1:
                domain = _text(self.buf, x, y)
            elif num == 2:
                version = x
        return domain, version

    def entry(self, a: int, b: int) -> tuple[str, str]:
        key = value = ""
        for num, wire, x, y, at in _fields(self.buf, a, b, "StringStringEntryProto"):
            if num == 1:
                key = _text(self.buf, x, y)
            elif num == 2:
                value = _text(self.buf, x, y)
        return key, value

    # -- graphs and functions --
    def graph(self, task: _GraphTask) -> list[_GraphTask]:
        if task.depth > self.limits.max_graph_depth:
            raise LimitExceeded("subgraph nesting", self.limits.max_graph_depth, task.depth,
                                format=FORMAT, offset=task.spans[0][0])
        buf, main = self.buf, task.path == "main"
        node_field = 7 if task.kind == "FunctionProto" else 1
        subgraphs: list[_GraphTask] = []
        n_init = n_sparse = n_node = 0
        for start, end in task.spans:
            ahead = _HopAhead(self.src, end)
            for num, wire, a, b, at in _fields(buf, start, end, task.kind):
                ahead.field(at, b)
                if num == node_field:
                    subgraphs.extend(self.node(a, b, task, n_node))
                    n_node += 1
                elif task.kind == "FunctionProto":
                    continue
                elif num == 5:
                    self.add(_Pending(task.key + (0, n_init), "", "initializer", task.path,
                                      [(a, b)]))
                    n_init += 1
                elif num == 15:
                    self.sparse(a, b, task.key + (1, n_sparse), "", "sparse_initializer",
                                task.path, {})
                    n_sparse += 1
                elif main and num == 2:
                    self.metadata["graph_name"] = _text(buf, a, b)
                elif main and num in (11, 12):
                    io = self.metadata.setdefault("inputs" if num == 11 else "outputs", [])
                    io.append(self.value_info(a, b))
                elif num not in MESSAGES["GraphProto"]:
                    self.unknown("GraphProto", num, wire, at)
        self.graph_nodes[task.path] = self.graph_nodes.get(task.path, 0) + n_node
        return subgraphs

    def node(self, a: int, b: int, task: _GraphTask, index: int) -> list[_GraphTask]:
        buf = self.buf
        self.node_total += 1
        if self.node_total > self.limits.max_nodes:
            raise LimitExceeded("nodes", self.limits.max_nodes, format=FORMAT, offset=a)
        name = op_type = domain = ""
        outputs: list[str] = []
        attributes: list[tuple[int, int]] = []
        for num, wire, x, y, at in _fields(buf, a, b, "NodeProto"):
            if num == 2:
                outputs.append(_text(buf, x, y))
            elif num == 3:
                name = _text(buf, x, y)
            elif num == 4:
                op_type = _text(buf, x, y)
            elif num == 5:
                attributes.append((x, y))
            elif num == 7:
                domain = _text(buf, x, y)
        if task.path == "main":
            self.nodes.append((name, op_type, domain))
        self.op_counts[op_type] = self.op_counts.get(op_type, 0) + 1
        if domain:
            self.node_domains.add(domain)
        label = name or f"{op_type}_{index}"
        is_constant = op_type == "Constant" and domain in ("", "ai.onnx")
        found: list[_GraphTask] = []
        for k, (x, y) in enumerate(attributes):
            found.extend(self.attribute(x, y, task, index, k, label, outputs, is_constant))
        return found

    def attribute(self, a: int, b: int, task: _GraphTask, node_index: int, attr_index: int,
                  label: str, outputs: list[str], is_constant: bool) -> list[_GraphTask]:
        buf = self.buf
        name = ""
        singular: dict[int, list[tuple[int, int]]] = {}   # t, g, sparse_tensor: merged spans
        lists: dict[int, list[tuple[int, int]]] = {}      # tensors, graphs, sparse_tensors
        scalars: set[int] = set()
        for num, wire, x, y, at in _fields(buf, a, b, "AttributeProto"):
            if num == 1:
                name = _text(buf, x, y)
            elif num in (5, 6, 22):
                singular.setdefault(num, []).append((x, y))
            elif num in (10, 11, 23):
                lists.setdefault(num, []).append((x, y))
            elif num in (2, 3, 4, 7, 8, 9):
                scalars.add(num)
        key = task.key + (2, node_index, attr_index)
        where = {"node": label, "attribute": name}
        found: list[_GraphTask] = []
        output = outputs[0] if outputs else ""
        if 5 in singular:
            tname = output if is_constant and name == "value" else ""
            self.add(_Pending(key + (0,), tname, "constant", task.path, singular[5], dict(where),
                              ))
            if not tname:
                self.pending[-1].extras["fallback_name"] = f"{label}.{name}"
        for k, span in enumerate(lists.get(10, ())):
            self.add(_Pending(key + (1, k), "", "constant", task.path, [span],
                              dict(where, fallback_name=f"{label}.{name}.{k}")))
        if 22 in singular:
            base = output if is_constant and name == "sparse_value" else ""
            self.sparse_merged(singular[22], key + (2,), base or "", "constant", task.path,
                               dict(where, fallback_name=f"{label}.{name}"))
        for k, span in enumerate(lists.get(23, ())):
            self.sparse(*span, key + (3, k), "", "constant", task.path,
                        dict(where, fallback_name=f"{label}.{name}.{k}"))
        if is_constant and name in ("value_float", "value_floats", "value_int", "value_ints"):
            number = {"value_float": 2, "value_floats": 7, "value_int": 3, "value_ints": 8}[name]
            dtype = "float32" if number in (2, 7) else "int64"
            p = _Pending(key + (4,), output or f"{label}.{name}", "constant", task.path, [],
                         dict(where))
            p.attr_value = ([(a, b)], number, dtype, number in (2, 3))
            self.add(p)
        elif is_constant and name in ("value_string", "value_strings"):
            self.skipped_constants.append(output or label)
        for num, suffix in ((6, None), (11, 0)):
            spans = [singular[6]] if num == 6 and 6 in singular else \
                [[s] for s in lists.get(11, ())] if num == 11 else []
            for k, graph_spans in enumerate(spans):
                path = f"{task.path}/{label}.{name}" + ("" if suffix is None else f".{k}")
                found.append(_GraphTask(graph_spans, path, key + (5, num, k), task.depth + 1))
        return found

    def add(self, p: _Pending) -> None:
        self.pending.append(p)
        if len(self.pending) > self.limits.max_tensors:
            raise LimitExceeded("tensors", self.limits.max_tensors, format=FORMAT,
                                offset=p.spans[0][0] if p.spans else None)

    def sparse(self, a: int, b: int, key: tuple, name: str, role: str, graph: str,
               extras: dict) -> None:
        self.sparse_merged([(a, b)], key, name, role, graph, extras)

    def sparse_merged(self, spans, key, name, role, graph, extras) -> None:
        values: list[tuple[int, int]] = []
        indices: list[tuple[int, int]] = []
        dims: list[int] = []
        for start, end in spans:
            for num, wire, x, y, at in _fields(self.buf, start, end, "SparseTensorProto"):
                if num == 1:
                    values.append((x, y))
                elif num == 2:
                    indices.append((x, y))
                elif num == 3:
                    dims.extend(self.int64s(wire, x, y, "SparseTensorProto.dims", at))
        if not values:
            raise _err("SparseTensorProto has no values tensor", spans[0][0])
        base = name or self.tensor_fields(values).name or extras.get("fallback_name", "")
        common = dict(extras, sparse_name=base, sparse_dims=dims, sparse_offset=spans[0][0])
        self.add(_Pending(key + (0,), f"{base}.values", role, graph, values, dict(common)))
        if indices:
            self.add(_Pending(key + (1,), f"{base}.indices", role, graph, indices, dict(common)))

    def int64s(self, wire: int, a: int, b: int, what: str, at: int) -> list[int]:
        """dims-like int64 lists (one varint or a packed run), sign-checked, rank-bounded."""
        if wire == VARINT:
            values = [a]
        else:
            values, pos = [], a
            while pos < b:
                v, pos = _varint(self.buf, pos, b, what)
                values.append(v)
                if len(values) > self.limits.max_rank:
                    break
        for v in values:
            if v >= 1 << 63:
                raise _err(f"{what} holds a negative dimension {v - (1 << 64)}", at)
        return values

    # -- value infos --
    def value_info(self, a: int, b: int) -> dict[str, Any]:
        out: dict[str, Any] = {"name": ""}
        for num, wire, x, y, at in _fields(self.buf, a, b, "ValueInfoProto"):
            if num == 1:
                out["name"] = _text(self.buf, x, y)
            elif num == 2:
                out.update(self.type_proto(x, y, 0))
        return out

    def type_proto(self, a: int, b: int, depth: int) -> dict[str, Any]:
        if depth >= self.limits.max_type_depth:
            raise LimitExceeded("TypeProto nesting", self.limits.max_type_depth, depth,
                                format=FORMAT, offset=a)
        buf = self.buf
        for num, wire, x, y, at in _fields(buf, a, b, "TypeProto"):
            if num in (1, 8):
                out: dict[str, Any] = {"kind": "tensor" if num == 1 else "sparse_tensor",
                                       "elem_type": "undefined", "shape": None}
                for n2, w2, p, q, at2 in _fields(buf, x, y, "TypeProto.Tensor"):
                    if n2 == 1:
                        out["elem_type"] = ONNX_DTYPES.get(p, str(p))
                    elif n2 == 2:
                        out["shape"] = self.shape(p, q)
                return out
            if num in (4, 9):
                inner: dict[str, Any] = {}
                message = "TypeProto.Sequence" if num == 4 else "TypeProto.Optional"
                for n2, w2, p, q, at2 in _fields(buf, x, y, message):
                    if n2 == 1:
                        inner = self.type_proto(p, q, depth + 1)
                return {"kind": "sequence" if num == 4 else "optional", "elem": inner}
            if num == 5:
                out = {"kind": "map", "key_type": "undefined", "value": {}}
                for n2, w2, p, q, at2 in _fields(buf, x, y, "TypeProto.Map"):
                    if n2 == 1:
                        out["key_type"] = ONNX_DTYPES.get(p, str(p))
                    elif n2 == 2:
                        out["value"] = self.type_proto(p, q, depth + 1)
                return out
            if num == 7:
                return {"kind": "opaque"}
        return {"kind": "undefined"}

    def shape(self, a: int, b: int) -> list[int | str | None]:
        dims: list[int | str | None] = []
        for num, wire, x, y, at in _fields(self.buf, a, b, "TensorShapeProto"):
            if num != 1:
                continue
            dim: int | str | None = None
            for n2, w2, p, q, at2 in _fields(self.buf, x, y, "TensorShapeProto.Dimension"):
                if n2 == 1:
                    dim = p - (1 << 64) if p >= 1 << 63 else p
                elif n2 == 2:
                    dim = _text(self.buf, p, q)
            dims.append(dim)
        return dims

    # -- tensors --
    def tensor_fields(self, spans: list[tuple[int, int]]) -> _TensorFields:
        """One pass over a TensorProto's fields (all occurrences, merged): positions only."""
        buf, tf = self.buf, _TensorFields()
        for start, end in spans:
            for num, wire, a, b, at in _fields(buf, start, end, "TensorProto"):
                if num == 1:
                    tf.dims.extend(self.int64s(wire, a, b, "TensorProto.dims", at))
                    if len(tf.dims) > self.limits.max_rank:
                        raise LimitExceeded("tensor rank", self.limits.max_rank, len(tf.dims),
                                            format=FORMAT, offset=at)
                elif num == 2:
                    tf.data_type = a
                elif num == 8:
                    tf.name = _text(buf, a, b)
                elif num == 9:
                    tf.raw = (a, b)
                    tf.raw_count += 1
                elif num == 14:
                    tf.data_location = a
                elif num == 13:
                    k, v = self.entry(a, b)
                    tf.external.append((k, v, at))
                elif num == 3:
                    begin = stop = 0
                    for n2, w2, p, q, at2 in _fields(buf, a, b, "TensorProto.Segment"):
                        if n2 == 1:
                            begin = p
                        elif n2 == 2:
                            stop = p
                    tf.segment = (begin, stop)
                elif num in _TYPED_FIELD_NAMES:
                    slot = tf.typed.setdefault(num, [[], 0, 0, at])
                    if wire == LEN and num != _F_STRING:
                        slot[0].append((a, b))
                    else:
                        slot[1] += 1
                        slot[2] += (b - a) if wire == LEN else 0
                elif num not in MESSAGES["TensorProto"]:
                    self.unknown("TensorProto", num, wire, at)
        return tf

    # -- building TensorInfos --
    def build(self) -> tuple[list[TensorInfo], dict[str, Callable[[], np.ndarray]], list[str]]:
        self.pending.sort(key=lambda p: p.key)
        infos: list[TensorInfo] = []
        readers: dict[str, Callable[[], np.ndarray]] = {}
        files: list[str] = []
        used: set[str] = set()
        for p in self.pending:
            tf = self.tensor_fields(p.spans) if p.spans else None
            name = p.name or (tf.name if tf else "") or p.extras.get("fallback_name", "") \
                or f"{p.graph}.tensor"
            if name in used:
                renamed = f"{p.graph}/{name}"
                n = 2
                while renamed in used:
                    renamed, n = f"{p.graph}/{name}#{n}", n + 1
                self.report("onnx.duplicate_name", f"tensor name {name!r} used twice; the "
                            f"one in {p.graph} is listed as {renamed!r}",
                            p.spans[0][0] if p.spans else None)
                name = renamed
            used.add(name)
            extras = dict(p.extras, graph=p.graph)
            extras.pop("fallback_name", None)
            if tf is None:
                info, reader = self.attr_constant(p, name, extras)
            else:
                info, reader = self.tensor(tf, p, name, extras)
            infos.append(info)
            if reader is not None:
                readers[name] = reader
            if info.file != self.path and info.file not in files:
                files.append(info.file)
        return infos, readers, files

    def attr_constant(self, p: _Pending, name: str, extras: dict):
        spans, number, dtype, scalar = p.attr_value
        kind = "f32" if number in (2, 7) else "varint"
        extras.update(encoding=MESSAGES["AttributeProto"][number].name)
        runs = _collect(self.buf, spans, "AttributeProto", number)
        count = _count_entries(runs, kind)
        one_run = len(runs) == 1 and runs[0][0] == "packed"
        zero_copy = kind == "f32" and bool(runs) and (scalar or one_run)
        if zero_copy:
            # A fixed32 scalar (the last one wins) or one packed run is the little-endian
            # layout: zero-copy.
            start, stop = runs[-1][1], runs[-1][2]
            if scalar:
                start = stop - 4
            shape = () if scalar else ((stop - start) // 4,)
            extras["attribute_offset"] = spans[0][0]
            return TensorInfo(name, dtype, shape, byte_offset=start, file=self.path,
                              storage_nbytes=stop - start, source_format=FORMAT, role=p.role,
                              extras=extras), None
        shape = () if scalar else (count,)
        extras.update(copy=True, attribute_offset=spans[0][0])
        info = TensorInfo(name, dtype, shape, file=self.path, source_format=FORMAT, role=p.role,
                          extras=extras)
        buf = self.buf

        def read() -> np.ndarray:
            values = _decode_runs(buf, _collect(buf, spans, "AttributeProto", number), kind)
            if kind == "varint":
                values = values.view(np.int64)
            if scalar:
                values = values[-1:] if values.size else np.zeros(1, values.dtype)
            return _frozen(values.reshape(shape))
        return info, read

    def tensor(self, tf: _TensorFields, p: _Pending, name: str, extras: dict):
        at = p.spans[0][0]
        where = f"tensor {name!r} (TensorProto at byte {at})"
        dtype = ONNX_DTYPES.get(tf.data_type)
        if dtype is None:
            raise _err(f"{where}: unknown data_type {tf.data_type}", at)
        shape = tuple(tf.dims)
        numel = math.prod(shape)
        nbytes = dtypes.nbytes_for(dtype, numel)
        extras.update(tensor_offset=at, onnx_data_type=tf.data_type)
        if tf.segment is not None:
            extras["segment"] = list(tf.segment)
            self.report("onnx.segment", f"{where} is a segment {tf.segment} of a larger tensor "
                        "(onnx.numpy_helper refuses to load segments)", at)
        if tf.raw_count > 1:
            self.report("onnx.repeated_raw_data", f"{where} has raw_data {tf.raw_count} times; "
                        "protobuf keeps the last", at)
        common = dict(file=self.path, source_format=FORMAT, role=p.role, path=(name,))
        if tf.data_location == _DATA_LOCATION_EXTERNAL:
            return self.external(tf, name, where, at, dtype, shape, nbytes, extras, common)
        if tf.external:
            self.report("onnx.ignored_external_data", f"{where} has external_data entries but "
                        f"data_location {tf.data_location}: onnx ignores them", at)
        storage = _STORAGE_FIELD[dtype]
        for number in tf.typed:
            if number != storage or tf.raw is not None:
                self.report("onnx.ignored_data_field", f"{where} ({dtype}) also has "
                            f"{_TYPED_FIELD_NAMES[number]}, which onnx ignores",
                            tf.typed[number][3])
        if tf.raw is not None:
            if dtype == "string":
                raise _err(f"{where}: a string tensor cannot use raw_data", tf.raw[0])
            a, b = tf.raw
            if b - a != nbytes:
                raise _err(f"{where}: raw_data holds {b - a} bytes at byte {a}, dims "
                           f"{list(shape)} of {dtype} need {nbytes}", a)
            extras["encoding"] = "raw_data"
            return TensorInfo(name, dtype, shape, byte_offset=a, nbytes=nbytes,
                              storage_nbytes=b - a, extras=extras, **common), None
        slot = tf.typed.get(storage)
        if slot is None:
            if numel:
                raise _err(f"{where}: no data (dims {list(shape)} of {dtype} need {nbytes} bytes "
                           f"and no raw_data, {_TYPED_FIELD_NAMES[storage]} or external data "
                           "is present)", at)
            extras["encoding"] = "empty"
            if dtype == "string":
                extras["copy"] = True
                return (TensorInfo(name, dtype, shape, nbytes=0, extras=extras, **common),
                        lambda: _frozen(np.empty(shape, dtype=object)))
            return TensorInfo(name, dtype, shape, byte_offset=at, nbytes=0, storage_nbytes=0,
                              extras=extras, **common), None
        return self.typed(p.spans, slot, storage, name, where, dtype, shape, numel, nbytes,
                          extras, common)

    def typed(self, spans, slot, storage, name, where, dtype, shape, numel, nbytes, extras,
              common):
        packed, unpacked, unpacked_bytes, first_at = slot
        field_name = _TYPED_FIELD_NAMES[storage]
        extras["encoding"] = field_name
        spec = dtypes.spec(dtype)
        if dtype == "string":
            if unpacked != numel:
                raise _err(f"{where}: string_data has {unpacked} entries, dims {list(shape)} "
                           f"need {numel}", first_at)
            expected = numel
        elif dtype in _PER_INT32_ENTRY:
            expected = -(-numel // _PER_INT32_ENTRY[dtype])
        elif spec.kind == "complex":
            expected = 2 * numel
        else:
            expected = numel
        if storage in (_F_FLOAT, _F_DOUBLE):
            width = 4 if storage == _F_FLOAT else 8
            payload = sum(b - a for a, b in packed)
            if payload % width:
                raise _err(f"{where}: packed {field_name} of {payload} bytes is not a multiple "
                           f"of {width}", packed[0][0])
            count = payload // width + unpacked
            if count != expected:
                raise _err(f"{where}: {field_name} has {count} values, dims {list(shape)} of "
                           f"{dtype} need {expected}", first_at)
            if len(packed) == 1 and not unpacked:
                a, b = packed[0]  # the packed payload is the little-endian layout: zero-copy
                return TensorInfo(name, dtype, shape, byte_offset=a, nbytes=nbytes,
                                  storage_nbytes=b - a, extras=extras, **common), None
        elif storage != _F_STRING:
            payload = sum(b - a for a, b in packed)
            # Each varint takes 1 to 10 bytes: the exact count is checked when decoding.
            if not (payload + unpacked >= expected and payload <= 10 * (expected - unpacked)) \
                    and not (expected == unpacked and payload == 0):
                raise _err(f"{where}: {field_name} holds {payload} bytes of packed varints and "
                           f"{unpacked} single values, dims {list(shape)} of {dtype} need "
                           f"{expected} values", first_at)
        extras["copy"] = True
        extras["encoded_bytes"] = sum(b - a for a, b in packed) + unpacked_bytes
        info = TensorInfo(name, dtype, shape, nbytes=nbytes, extras=extras, **common)
        buf, path = self.buf, self.path
        kind = {_F_FLOAT: "f32", _F_DOUBLE: "f64", _F_STRING: "bytes"}.get(storage, "varint")

        def read() -> np.ndarray:
            runs = _collect(buf, spans, "TensorProto", storage)
            values = _decode_runs(buf, runs, kind)
            if len(values) != expected:
                raise _err(f"{where}: {field_name} decodes to {len(values)} values, dims "
                           f"{list(shape)} of {dtype} need {expected}", first_at, file=path)
            return _frozen(_convert(values, dtype, shape, numel))
        return info, read

    def external(self, tf, name, where, at, dtype, shape, nbytes, extras, common):
        entries: dict[str, str] = {}
        unknown: list[str] = []
        for key, value, entry_at in tf.external:
            if key in _EXTERNAL_KEYS:
                entries[key] = value
            else:
                unknown.append(key[:100] + ("..." if len(key) > 100 else ""))
        if unknown:
            shown = sorted(set(unknown))[:self.limits.max_reported]
            more = len(unknown) - len(shown)
            self.report("onnx.unknown_external_key", f"{where}: ignoring unknown external data "
                        f"key(s) {shown}" + (f" and {more} more" if more > 0 else ""), at)
        extras["encoding"] = "external"
        extras["location"] = location = entries.get("location", "")
        if "checksum" in entries:
            extras["checksum"] = entries["checksum"]
        try:
            if not location:
                raise _err(f"{where}: external data without a location", at)
            offset = _decimal(entries.get("offset"), "offset", where, at)
            length = _decimal(entries.get("length"), "length", where, at)
            target, size = self.external_file(location, where, at)
            start = offset or 0
            if start > size:
                raise _err(f"External data offset ({start}) exceeds file size ({size}) for "
                           f"tensor {name!r} (TensorProto at byte {at})", at)
            available = size - start
            if length is not None and length > available:
                raise _err(f"External data length ({length}) exceeds available data "
                           f"({available} bytes from offset {start}) for tensor {name!r} "
                           f"(TensorProto at byte {at})", at)
            span = available if length is None else length
            if dtype == "string" or span != nbytes:
                raise _err(f"{where}: external data {location!r} holds {span} bytes from offset "
                           f"{start}, dims {list(shape)} of {dtype} need {nbytes}", at)
        except OnnxFormatError as e:
            e.located(file=self.path)
            if self.strict:
                raise
            error = e
            extras["error"] = str(e)
            info = TensorInfo(name, dtype, shape, nbytes=nbytes, extras=extras, **common)

            def fail() -> np.ndarray:
                raise error
            return info, fail
        extras.update(external_offset=start, external_length=span)
        common["file"] = target
        return TensorInfo(name, dtype, shape, byte_offset=start, nbytes=nbytes,
                          storage_nbytes=span, extras=extras, **common), None

    def external_file(self, location: str, where: str, at: int) -> tuple[str, int]:
        """(path, size) of an external data file: resolved, checked and stat'ed once per
        location (one file commonly holds every tensor); never opened."""
        known = self.external_files.get(location)
        if known is not None:
            return known
        target = self.resolve(location, where, at)
        if is_url(target):  # beside a remote model: its size from the server, one byte read
            with RemoteSource(target, first_fetch=1) as src:
                self.external_files[location] = (target, src.size)
            return target, src.size
        try:
            st = os.stat(target)
        except OSError as e:
            raise _err(f"{where}: external data file {location!r} cannot be opened: "
                       f"{e.strerror}", at) from None
        if not stat.S_ISREG(st.st_mode):
            raise _err(f"{where}: external data location {location!r} is not a file", at)
        self.external_files[location] = (target, st.st_size)
        return target, st.st_size

    def resolve(self, location: str, where: str, at: int) -> str:
        """The external file's path, or an error when the location leaves the model's folder."""
        if self.path.startswith("<"):
            raise _err(f"{where}: external data {location!r} cannot be resolved for an "
                       "in-memory model", at)
        url = is_url(self.path)
        base = remote_dirname(self.path) if url else os.path.dirname(os.path.abspath(self.path))
        reason = None
        parts = re.split(r"[\\/]", location)
        if "\x00" in location:
            reason = "contains a NUL byte"
        elif os.path.isabs(location) or location.startswith(("/", "\\")) or \
                re.match(r"^[A-Za-z]:", location):
            reason = "is an absolute path"
        else:
            depth = 0
            for part in parts:
                depth += -1 if part == ".." else 0 if part in ("", ".") else 1
                if depth < 0:
                    reason = "climbs out of the model's folder with '..'"
                    break
        target = os.path.normpath(os.path.join(base, *[p for p in parts if p]))
        if url and reason is None:
            return remote_join(base, *[p for p in parts if p])
        if reason is None:
            real_base = os.path.realpath(base)
            real = os.path.realpath(target)
            if os.path.commonpath([real_base, real]) != real_base:
                reason = f"resolves outside the model's folder (to {real!r}) through a symlink"
        if reason is not None:
            # CWE-22 path traversal; onnx's own fix: GHSA-538c-55jv-c5g9.
            message = f"{where}: external data location {location!r} {reason}"
            anomaly = Anomaly("onnx.external_path_escape", message, file=self.path, offset=at)
            self.evidence.anomalies.append(anomaly)
            err = _err(message, at)
            err.anomaly = anomaly
            raise err
        return target


def _decimal(value: str | None, key: str, where: str, at: int) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)  # what onnx's ExternalDataInfo does
    except ValueError:
        raise _err(f"{where}: external data {key} {value[:40]!r} is not an integer", at) from None
    if number < 0:
        raise _err(f"{where}: external data {key} must be non-negative, got {number}", at)
    return number


# -- decoding typed fields (copies) --------------------------------------------------------------
def _collect(buf, spans, message: str, number: int) -> list[tuple[str, int, int]]:
    """Every occurrence of field ``number`` across ``spans``: ("packed", a, b), ("one", a, b)
    (fixed or length-delimited payload) or ("varint", value, 0)."""
    runs: list[tuple[str, int, int]] = []
    packable = MESSAGES[message][number].packable
    for start, end in spans:
        for num, wire, a, b, at in _fields(buf, start, end, message):
            if num != number:
                continue
            if wire == VARINT:
                runs.append(("varint", a, 0))
            elif wire == LEN and packable:
                runs.append(("packed", a, b))
            else:
                runs.append(("one", a, b))
    return runs


def _count_entries(runs, kind: str) -> int:
    width = {"f32": 4, "f64": 8}.get(kind)
    total = 0
    for form, a, b in runs:
        total += (b - a) // width if form == "packed" and width else 1
    return total


def _decode_runs(buf, runs, kind: str):
    """Concatenate the values of ``runs``: float32/float64/uint64 arrays, or a list of bytes."""
    if kind == "bytes":
        return [bytes(buf[a:b]) for form, a, b in runs]
    dtype = {"f32": np.dtype("<f4"), "f64": np.dtype("<f8")}.get(kind, np.dtype(np.uint64))
    pieces: list[np.ndarray] = []
    singles: list = []

    def flush():
        if singles:
            if kind == "varint":
                pieces.append(np.array(singles, dtype=np.uint64))
            else:
                pieces.append(np.frombuffer(b"".join(singles), dtype=dtype))
            singles.clear()
    for form, a, b in runs:
        if form == "packed":
            flush()
            raw = buf[a:b]
            if kind == "varint":
                try:
                    pieces.append(decode_varints(raw))
                except OnnxFormatError as e:
                    raise _err(f"{e.reason} (packed payload at byte {a})", a) from None
            else:
                pieces.append(np.frombuffer(raw, dtype=dtype))
        elif form == "varint":
            singles.append(a)
        else:
            singles.append(bytes(buf[a:b]))
    flush()
    if not pieces:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(pieces) if len(pieces) > 1 else pieces[0].copy()


def _pack_6bit(values: np.ndarray) -> np.ndarray:
    """Pack 6-bit codes four per three bytes (onnx's raw layout for float6), trimmed to
    ceil(n*6/8) bytes."""
    n = values.size
    groups = -(-n // 4)
    v = np.zeros(groups * 4, dtype=np.uint8)
    v[:n] = values & 0x3F
    v = v.reshape(groups, 4)
    out = np.empty((groups, 3), dtype=np.uint8)
    out[:, 0] = v[:, 0] | (v[:, 1] << 6)
    out[:, 1] = (v[:, 1] >> 2) | (v[:, 2] << 4)
    out[:, 2] = (v[:, 2] >> 4) | (v[:, 3] << 2)
    return out.reshape(-1)[:-(-n * 6 // 8)]


def _convert(values, dtype: str, shape: tuple[int, ...], numel: int) -> np.ndarray:
    """Typed-field entries -> the array `ModelFile.read` promises (onnx.numpy_helper.to_array's
    conversions; packed sub-byte types as their raw bytes)."""
    if dtype == "string":
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr.reshape(shape)
    spec = dtypes.spec(dtype)
    if values.dtype.kind == "f":  # float_data / double_data
        return values.view(spec.numpy).reshape(shape)
    if dtype in ("int64", "uint64"):
        return values.view(spec.numpy).reshape(shape)
    low = values.astype(np.uint32)  # int32 semantics: the low 32 bits of the varint
    if dtype == "int32":
        return low.view(np.int32).reshape(shape)
    if dtype == "uint32":
        return low.reshape(shape)
    if spec.bits == 16:
        return low.astype(np.uint16).view(spec.numpy).reshape(shape)
    if dtype in ("float6_e2m3fn", "float6_e3m2fn"):
        return _pack_6bit(low.astype(np.uint8))
    if spec.packed:
        return low.astype(np.uint8)
    return low.astype(np.uint8).view(spec.numpy).reshape(shape)


def _frozen(arr: np.ndarray) -> np.ndarray:
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


# -- entry point --------------------------------------------------------------------------------
def open_source(src: ByteSource, *, limits: Limits = DEFAULT_LIMITS,
                strict: bool = True) -> ModelFile:
    """List every tensor of an ONNX model without loading it.

    Args:
        src: the model file.
        limits: bounds on nesting and counts.
        strict: raise on external data that escapes the folder, is missing or out of bounds
            (as ``onnx.load`` does). With ``strict=False`` such tensors are still listed, carry
            ``extras["error"]``, and raise only when read (for scanners).

    Returns:
        The `ModelFile`: tensors as above, ``metadata`` (ir_version, opset_import, producer,
        graph inputs/outputs, op_counts, domains ...), ``extras["nodes"]`` (main graph nodes as
        ``(name, op_type, domain)``).

    Raises:
        OnnxFormatError: malformed protobuf or ONNX (message names the byte offset).
        LimitExceeded: nesting or counts beyond `limits`.
    """
    walker = _Walker(src, limits, strict)
    try:
        walker.walk()
        infos, readers, files = walker.build()
    except FormatError as e:
        cut = truncation(whole(src, "ONNX model", fmt=FORMAT), src.size)   # a cut download rather than a malformed model
        if cut is not None:
            raise _err(cut, file=src.path, offset=src.size) from None
        raise e.located(file=src.path)
    except RecursionError:  # not expected (the walk is iterative): never a raw traceback
        raise _err("nesting too deep", file=src.path) from None
    md = walker.metadata
    if walker.skipped_constants:
        md["skipped_constants"] = walker.skipped_constants[:100]
    md["tensor_count"] = len(infos)
    extras = {"nodes": walker.nodes, "graphs": walker.graph_nodes}
    for kind, n in walker.reported.items():
        if n > limits.max_reported:
            walker.evidence.add(kind, f"{n - limits.max_reported} more {kind} anomalies not "
                                "listed", file=src.path)
    model = ModelFile(FORMAT, src.path, infos, metadata=md, evidence=walker.evidence,
                      files=[src.path] + files, extras=extras)
    model.sources.setdefault(src.path, src)
    model.custom_readers.update(readers)
    return model
