"""The common model every parser produces and every consumer reads.

`TensorInfo` is one immutable record per tensor, the same for every format. `ModelFile` is one
opened model: its tensors in saved order, its metadata, the inert object tree of its pickles and
the evidence (pickles seen, anomalies) that the scanner judges.
"""
from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from . import dtypes
from .errors import TensorNotFound
from .native import optional_extension
from .remote import open_source
from .source import ByteSource

if TYPE_CHECKING:  # numpy is imported by `read` (through the reader), never at import time
    import numpy as np

__all__ = ["TensorInfo", "Chunk", "Anomaly", "PickleRecord", "Evidence", "ModelFile",
           "contiguous_stride", "FrozenDict"]


class FrozenDict(dict):
    """A read-only dict: `TensorInfo.extras`. A dict subclass rather than a MappingProxyType over
    a copy: one object per record instead of two, and JSON encodes it as it is."""

    __slots__ = ()

    def _readonly(self, *args, **kwargs):
        raise TypeError("TensorInfo.extras is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly
    __ior__ = _readonly

    def __reduce__(self):  # picklable (per-file work is shipped to worker processes)
        return (FrozenDict, (dict(self),))

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


_EMPTY: Mapping[str, Any] = FrozenDict()
_KNOWN_DTYPES: set[str] = set()
_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}
_INT_ONLY = {int}
_SCALARS = (str, int, float, bool, type(None))


def _int_items(values: tuple) -> bool:
    """True when every item is a plain int (bools excluded) - one C-level pass."""
    return not values or set(map(type, values)) == _INT_ONLY


def shared_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    """`contiguous_stride`, one shared tuple per shape (checkpoints repeat a few shapes)."""
    stride = _STRIDES.get(shape)
    if stride is None:
        stride = contiguous_stride(shape)
        if len(_STRIDES) < 4096:
            _STRIDES[shape] = stride
    return stride


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides in elements."""
    stride, acc = [], 1
    for dim in reversed(shape):
        stride.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(stride))


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a tensor stored apart from the rest (DCP shards, GGUF splits).

    ``offsets``/``sizes`` place the piece in the global tensor; ``tensor`` says where its bytes are.
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    tensor: "TensorInfo"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor, in any format.

    Invariants: ``len(shape) == len(stride)``; ``stride`` and ``storage_offset`` count elements;
    ``byte_offset`` is the absolute offset, in ``file``, of the element at index (0, ..., 0) (it
    already includes ``storage_offset``), or None when the values are not stored plainly in a file
    (meta tensors, ONNX typed fields, chunked tensors); ``nbytes`` is the number of bytes the
    elements take when contiguous. Instances are hashable and compare by value (``extras`` aside).

    Attributes:
        name: dotted path through the saved object (``layers.0.attn.q_proj.weight``).
        dtype: canonical dtype name (see `tensorscope.dtypes`).
        shape, stride: element counts.
        storage_offset: elements from the start of the storage to element (0, ..., 0).
        byte_offset: see above.
        nbytes: contiguous size in bytes.
        file: path of the file holding the bytes.
        storage_key: the storage this tensor views (torch ``data/<key>``), when there is one.
        storage_nbytes: size of that storage's record on disk, the bound for reads.
        path: the name's components (keys may themselves contain dots).
        source_format: the format that produced this record.
        role: ``parameter``, ``buffer``, ``constant``, ``tensor`` (plain), ``input`` ...
        chunks: pieces of a tensor stored in several places (DCP), else empty.
        extras: format specifics (quantization, requires_grad, ONNX location ...).
        has_data: False for a tensor saved without its values (torch's traced inputs: the pickle
            gives dtype and shape, the storage record is empty). It is listed, never read, and
            stays out of every byte total (`ModelFile.total_bytes`, `summary`), which all
            consumers (inspect, diff, the TUI) read.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0
    byte_offset: int | None = None
    nbytes: int = -1
    file: str = ""
    storage_key: str | None = None
    storage_nbytes: int | None = None
    path: tuple[str, ...] = ()
    source_format: str = ""
    role: str = "tensor"
    chunks: tuple[Chunk, ...] = ()
    extras: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    has_data: bool = True

    def __post_init__(self):
        # Runs once per tensor (10^5-10^6 per checkpoint): the common case (tuples of ints from
        # a parser, a known dtype, extras already frozen or empty) costs a few type checks.
        set_ = object.__setattr__
        shape = self.shape
        if type(shape) is not tuple or not _int_items(shape):
            shape = tuple(int(d) for d in shape)
            set_(self, "shape", shape)
        stride = self.stride
        if stride is None:
            stride = _STRIDES.get(shape)
            if stride is None:
                stride = contiguous_stride(shape)
                if len(_STRIDES) < 4096:  # checkpoints repeat a few shapes: share their strides
                    _STRIDES[shape] = stride
            set_(self, "stride", stride)
        elif type(stride) is not tuple or not _int_items(stride):
            stride = tuple(int(s) for s in stride)
            set_(self, "stride", stride)
        if len(stride) != len(shape):
            raise ValueError(f"tensor {self.name!r}: stride {stride} does not match shape {shape}")
        if self.dtype not in _KNOWN_DTYPES:  # validated once per dtype, not per tensor
            dtypes.spec(self.dtype)  # unknown dtype names are a programming error
            _KNOWN_DTYPES.add(self.dtype)
        if self.nbytes < 0:
            set_(self, "nbytes", dtypes.nbytes_for(self.dtype, math.prod(shape)))
        if not self.path:
            set_(self, "path", (self.name,))
        extras = self.extras
        if type(extras) is not FrozenDict:
            set_(self, "extras", FrozenDict(extras) if extras else _EMPTY)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_contiguous(self) -> bool:
        return all(d <= 1 or s == c for d, s, c in zip(self.shape, self.stride, contiguous_stride(self.shape)))

    @property
    def span_bytes(self) -> int:
        """Bytes from the first element to one past the last one addressed through the strides."""
        if self.numel == 0:
            return 0
        s = dtypes.spec(self.dtype)
        last = sum((d - 1) * st for d, st in zip(self.shape, self.stride))
        if s.kind in ("block", "unknown") or s.packed:
            return self.nbytes
        return (last + 1) * s.itemsize

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form (see README, "JSON schema")."""
        shape = self.shape
        d = {
            "name": self.name, "dtype": self.dtype, "shape": [*shape],
            "stride": [*self.stride], "storage_offset": self.storage_offset,
            "byte_offset": self.byte_offset, "nbytes": self.nbytes, "numel": math.prod(shape),
            "file": self.file, "storage_key": self.storage_key, "role": self.role,
            "path": [*self.path], "format": self.source_format,
        }
        if not self.has_data:
            d["has_data"] = False
        if self.chunks:
            d["chunks"] = [{"offsets": list(c.offsets), "sizes": list(c.sizes), "file": c.tensor.file,
                            "byte_offset": c.tensor.byte_offset, "nbytes": c.tensor.nbytes}
                           for c in self.chunks]
        extras = self.extras
        if extras:
            d["extras"] = _plain_extras(extras)
        return d


class _Trusted:
    """`TensorInfo.trusted`: a record from fields a parser has already checked, without
    `TensorInfo.__post_init__` (``shape``/``stride`` tuples of ints of one length, ``dtype`` a
    canonical name, ``nbytes`` computed, ``path`` non-empty, ``extras`` a `FrozenDict`, shared
    ones included: they are read-only).

    Built as this twin class, whose slots are TensorInfo's, with plain attribute stores, then
    turned into a TensorInfo by ``__class__`` assignment (allowed between classes of one layout):
    a frozen dataclass's ``__init__`` stores each field through ``object.__setattr__``, and a
    checkpoint of 10^5-10^6 tensors made its records at 3 µs each, this at 1.1 µs.
    """

    __slots__ = TensorInfo.__slots__

    def __init__(self, name, dtype, shape, stride, storage_offset, byte_offset, nbytes, file,
                 storage_key, storage_nbytes, path, source_format, role, chunks, extras,
                 has_data=True):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.stride = stride
        self.storage_offset = storage_offset
        self.byte_offset = byte_offset
        self.nbytes = nbytes
        self.file = file
        self.storage_key = storage_key
        self.storage_nbytes = storage_nbytes
        self.path = path
        self.source_format = source_format
        self.role = role
        self.chunks = chunks
        self.extras = extras
        self.has_data = has_data
        self.__class__ = TensorInfo


if _Trusted.__init__.__code__.co_varnames[1:17] != TensorInfo.__slots__:
    raise TypeError("_Trusted.__init__ must store every TensorInfo field, in order")
TensorInfo.trusted = _Trusted


_SCALAR_TYPES = frozenset(_SCALARS)


# -- the JSON text of a record, without building its dict ---------------------------------------
# `json_text` is what ``json.JSONEncoder(sort_keys=True).encode(t.to_dict())`` writes, made by
# string joins: inspect --json writes 10^5-10^6 rows, and the dict + encoder walk per row was
# most of its cost. Repeated values (dtype, file, format, role, shapes) are encoded once.
_str_json = json.encoder.encode_basestring_ascii   # the encoder's own (C) string escaping
_TEXT: dict[Any, str] = {}                          # repeated strings and int tuples -> JSON text
_TEXT_MAX = 65536


def _cached(value) -> str:
    text = _TEXT.get(value)
    if text is None:
        if value is None:
            text = "null"
        elif type(value) is str:
            text = _str_json(value)
        else:   # a tuple of ints (shape, stride)
            text = "[" + ", ".join(map(int.__repr__, value)) + "]"
        if len(_TEXT) < _TEXT_MAX:
            _TEXT[value] = text
    return text


def _scalar_json(v) -> str | None:
    t = type(v)
    if t is str:
        return _str_json(v)
    if t is int:
        return int.__repr__(v)
    if v is None:
        return "null"
    if t is bool:
        return "true" if v else "false"
    return None     # floats (nan/inf spelling) and the rest: the general encoder


_EXTRAS_ORDER: dict[tuple, tuple[tuple[str, str], ...]] = {}  # key set -> sorted (key, '"key": ')


def _extras_text(extras: Mapping[str, Any]) -> str | None:
    """``"extras": {...}, `` for extras of str keys and str/int/bool/None values or flat lists of
    them; None for anything else (floats, nesting)."""
    keys = tuple(extras)
    order = _EXTRAS_ORDER.get(keys)
    if order is None:
        if set(map(type, keys)) != {str}:
            return None
        order = tuple((k, _str_json(k) + ": ") for k in sorted(keys))
        if len(_EXTRAS_ORDER) < 1024:   # a format writes a handful of key sets
            _EXTRAS_ORDER[keys] = order
    parts = []
    for k, prefix in order:
        v = extras[k]
        t = type(v)
        if t is str:
            text = _str_json(v)
        elif t is list or t is tuple:   # a tuple is written as a list, as the encoder does
            if v and set(map(type, v)) == _INT_ONLY:
                text = "[" + ", ".join(map(int.__repr__, v)) + "]"   # "[32, 64]", as the encoder
            else:
                items = [_scalar_json(x) for x in v]
                if None in items:
                    return None
                text = "[" + ", ".join(items) + "]"
        else:
            text = _scalar_json(v)
            if text is None:
                return None
        parts.append(prefix + text)
    return '"extras": {' + ", ".join(parts) + "}, "


# A row's text is a template per kind of record (dtype, shape, stride, file, format, role, size,
# extras object: a checkpoint has a handful) around the fields that vary per tensor (name, path,
# byte offset, storage key and offset). The extras object is keyed by identity and kept
# referenced by its entry, so that its id cannot be reused while the entry exists; per-record
# extras (not shared) stop filling the table at `_ROWS_MAX` and are then encoded per row.
_ROWS: dict[tuple, tuple | None] = {}
_ROWS_MAX = 4096


def _member_location(extras) -> str | None:
    """The location of a torch storage's extras, ``{"location": str, "member": str}`` (one
    record each: the member varies per tensor, and is a field of its kind's rows); else None."""
    if type(extras) is FrozenDict and len(extras) == 2 and type(extras.get("member")) is str:
        location = extras.get("location")
        if type(location) is str:
            return location
    return None


def _row_parts(t: "TensorInfo") -> tuple | None:
    """The fixed text of a kind's rows, around the fields that vary: (up to the name, or up to
    the extras' member for a `_member_location` kind, from the name to the path, from the path
    to the storage key, after the storage offset, the extras object kept alive, from the member
    to the name or None); None when the record needs the general encoder."""
    extras = t.extras
    location = _member_location(extras)
    after_member = None
    if location is not None:
        ex = f'"extras": {{"location": {_str_json(location)}, "member": '
        after_member = "}, "
        extras = None       # the kind is keyed by the location, not this record's extras
    else:
        ex = _extras_text(extras) if extras else ""
        if ex is None:
            return None
    shape = t.shape
    head = f'"dtype": {_cached(t.dtype)}, {ex}'
    rest = (f'"file": {_cached(t.file)}, "format": {_cached(t.source_format)}, "name": ')
    if after_member is None:
        head += rest
    else:
        after_member += rest
    mid = f', "nbytes": {int.__repr__(t.nbytes)}, "numel": {int.__repr__(math.prod(shape))}, "path": '
    tail = (f', "role": {_cached(t.role)}, "shape": {_cached(shape)}, "storage_key": ')
    return head, mid, tail, f', "stride": {_cached(t.stride)}}}', extras, after_member


def json_text(t: "TensorInfo") -> str | None:
    """``t.to_dict()`` as sorted-key JSON text, or None when the record needs the general encoder
    (chunks, no data, extras other than scalars and flat lists of str/int, a field of an
    unexpected type: the encoder then says what it is)."""
    return json_texts((t,))[0]


def json_texts(records) -> list[str | None]:
    """`json_text` of each record, in one loop (10^5-10^6 rows: no call per row). The parts of
    a record's kind are looked up again only when it differs from the previous record's.
    Compiled (`tensorscope/_jsonrows.c`, the same steps) where it is built; a row it hands back
    (NotImplemented) is made by `_json_texts`."""
    if _ROWS_C is None or type(records) is not list:
        return _json_texts(records)
    out, pending = _ROWS_C.texts(records, _parts_of, _str_json)
    if pending:
        for i, text in enumerate(out):
            if text is NotImplemented:
                out[i] = _json_texts((records[i],))[0]
    return out


def json_texts_joined(records) -> str | None:
    """``", ".join(json_texts(records))`` made in one compiled pass (no string per row) when
    `tensorscope/_jsonrows.c` is built and makes every row; else None (`json_texts` then)."""
    if _ROWS_C is None or type(records) is not list:
        return None
    return _ROWS_C.joined(records, _parts_of, _str_json)


def _json_texts(records) -> list[str | None]:
    """`json_texts` in Python (the compiled loop's twin)."""
    out: list[str | None] = []
    append = out.append
    prev = parts = location = None     # location: of the previous kind, when a member kind
    for t in records:
        ex = t.extras
        if not (prev is not None and t.shape is prev.shape
                and (ex is prev.extras or (location is not None and type(ex) is FrozenDict
                                           and len(ex) == 2 and type(ex.get("member")) is str
                                           and type(loc := ex.get("location")) is str
                                           and loc == location))   # `_member_location`, inline
                and t.dtype is prev.dtype and t.file is prev.file and t.stride is prev.stride
                and type(t.nbytes) is int and t.nbytes == prev.nbytes and t.role is prev.role
                and t.source_format is prev.source_format and t.has_data and not t.chunks):
            parts = _parts_of(t)
            prev = t if parts is not None else None
            if parts is None:
                append(None)
                continue
            location = None if parts[5] is None else ex["location"]
        bo, so, sk = t.byte_offset, t.storage_offset, t.storage_key
        try:
            if (bo is not None and type(bo) is not int) or type(so) is not int:
                raise TypeError
            name, path = _str_json(t.name), t.path
            path_text = f"[{name}]" if len(path) == 1 and path[0] == t.name else \
                f'[{", ".join(map(_str_json, path))}]'
            head, mid, tail, stride, _, after_member = parts
            if after_member is not None:
                head = f'{head}{_str_json(ex["member"])}{after_member}'
            append(f'{{"byte_offset": {"null" if bo is None else int.__repr__(bo)}, {head}{name}'
                   f'{mid}{path_text}{tail}{"null" if sk is None else _str_json(sk)}, '
                   f'"storage_offset": {int.__repr__(so)}{stride}')
        except TypeError:
            append(None)
    return out


def _parts_of(t: "TensorInfo") -> tuple | None:
    """`_row_parts` of a record's kind, from the table or made (None: the general encoder)."""
    if t.chunks or not t.has_data or type(t.nbytes) is not int:   # True == 1: not one kind
        return None
    location = _member_location(t.extras)
    key = (t.dtype, t.shape, t.stride, t.file, t.source_format, t.role, t.nbytes,
           id(t.extras) if location is None else ("member", location))
    parts = _ROWS.get(key, False)
    if parts is False:
        try:
            parts = _row_parts(t)
        except TypeError:
            parts = None
        if len(_ROWS) < _ROWS_MAX:
            _ROWS[key] = parts
    return parts


# The compiled `json_texts` (tensorscope/_jsonrows.c), bound to the record classes here; None when
# it is not built (or is a stale build). Tests set it to None too.
JSONROWS_ABI = 1
_ROWS_C = optional_extension("_jsonrows", JSONROWS_ABI)
if _ROWS_C is not None:
    _ROWS_C.bind(TensorInfo, FrozenDict)


def _plain_extras(extras: Mapping[str, Any]) -> dict:
    """`_jsonable` for the common extras (string keys; scalars and flat lists of scalars), in a
    loop that runs once per tensor; anything else takes the general walk."""
    out = {}
    for k, v in extras.items():
        t = type(v)
        if type(k) is not str:
            return _jsonable(dict(extras))
        if t in _SCALAR_TYPES:
            out[k] = v
        elif (t is list or t is tuple) and set(map(type, v)) <= _SCALAR_TYPES:
            out[k] = [*v]
        else:
            return _jsonable(dict(extras))
    return out


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, TensorInfo):
        return v.name
    return str(v)


@dataclass(frozen=True, slots=True)
class Anomaly:
    """Something structurally odd a parser noticed and did not silently fix (evidence for `scan`).

    ``kind`` is a stable identifier (``zip.duplicate_name``, ``zip.local_central_mismatch`` ...).
    """

    kind: str
    message: str
    file: str = ""
    member: str | None = None
    offset: int | None = None

    def __str__(self) -> str:
        where = ":".join(x for x in (self.file, self.member or "") if x)
        at = f" at byte {self.offset}" if self.offset is not None else ""
        return f"{where}{at}: {self.message}" if where else self.message


@dataclass(slots=True)
class PickleRecord:
    """One pickle stream a parser ran through the VM: where it was and what the VM saw.

    ``result`` is the VM's `PickleResult` (globals, calls, error, end offset). ``offset`` is the
    absolute offset of the stream's first byte in ``file`` (VM positions are relative to it).
    """

    file: str
    member: str | None
    offset: int
    length: int
    result: Any
    role: str = "data"  # data, constants, metadata, legacy.main, npy.object ...


@dataclass(slots=True)
class Evidence:
    """What the scanner judges: every pickle run, every anomaly, every embedded code file."""

    pickles: list[PickleRecord] = field(default_factory=list)
    anomalies: list[Anomaly] = field(default_factory=list)
    code: dict[str, str] = field(default_factory=dict)  # TorchScript code/ files: member -> text
    # the zip's central directory as read, when the opener asked to keep it
    # (`parsers.zip_dispatch.keeping_archive`): the scanner's loader view reuses it
    archive: Any = field(default=None, repr=False, compare=False)

    def add(self, kind: str, message: str, **where) -> None:
        self.anomalies.append(Anomaly(kind, message, **where))

    def extend(self, other: "Evidence") -> None:
        self.pickles.extend(other.pickles)
        self.anomalies.extend(other.anomalies)
        self.code.update(other.code)


_name_of = operator.attrgetter("name")


class ModelFile:
    """One opened model: tensors in saved order, metadata, object tree, evidence.

    Values are read with `read`, which returns a read-only numpy view over the file's memory map
    (a copy only where the format forces one: chunked tensors, typed ONNX fields, complex32), or
    with `values`, which also decodes quantized and packed dtypes into float32 (a copy).
    Close it (or use ``with``) to release the maps; views keep their map alive while they exist.
    """

    def __init__(self, format: str, path: str, tensors: list[TensorInfo] | None = None, *,
                 metadata: dict[str, Any] | None = None, objects: Any = None,
                 evidence: Evidence | None = None, sources: dict[str, ByteSource] | None = None,
                 files: list[str] | None = None, extras: dict[str, Any] | None = None):
        self.format = format
        self.path = path
        self.tensors: list[TensorInfo] = list(tensors or [])
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self.objects = objects
        self.evidence = evidence if evidence is not None else Evidence()
        self.sources: dict[str, ByteSource] = sources if sources is not None else {}
        self.files = files if files is not None else [path]
        # Free-form, format-specific content for the UI: TorchScript code, ONNX graph summary ...
        self.extras: dict[str, Any] = extras if extras is not None else {}
        # Readers for tensors whose values are not a plain strided view (set by parsers).
        self.custom_readers: dict[str, Callable[[], np.ndarray]] = {}
        self._index: dict[str, TensorInfo] | None = None
        self._indexed: tuple = (None, 0)   # (the tensors list, its length) _index was built from
        # The files a multi-file model was merged from (sharded checkpoints), by path: a scan
        # of the model's folder reads them from here instead of parsing them again.
        self.parts: dict[str, ModelFile] = {}

    # -- lookup -------------------------------------------------------------------------------
    def _by_name(self) -> dict[str, TensorInfo]:
        """name -> the first tensor of that name; rebuilt when the list was replaced or grew."""
        tensors = self.tensors
        if self._index is None or self._indexed[0] is not tensors \
                or self._indexed[1] != len(tensors):
            # reversed: dict keeps the last of a repeated key, so the first tensor wins (in C)
            self._index = dict(zip(map(_name_of, reversed(tensors)), reversed(tensors)))
            self._indexed = (tensors, len(tensors))
        return self._index

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._by_name()[name]
        except KeyError:
            raise TensorNotFound(f"{self.path}: no tensor named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name()

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def total_bytes(self) -> int:
        """Bytes of the stored tensors (tensors saved without data are not counted)."""
        return sum(t.nbytes for t in self.tensors if t.has_data)

    # -- values ---------------------------------------------------------------------------------
    def source(self, file: str) -> ByteSource:
        src = self.sources.get(file)
        if src is None:
            src = self.sources[file] = open_source(file)
        return src

    def read(self, name_or_info: str | TensorInfo) -> np.ndarray:
        """The tensor's values as a read-only numpy array.

        A zero-copy view over the memory map with the stored shape, strides and dtype whenever
        the bytes are stored plainly. What is STORED, not what it means: packed sub-byte and
        block-quantized dtypes come back as their raw bytes (uint8), torch quantized tensors as
        their integer representation (scale/zero point in ``info.extras``); `values` decodes
        them. Raises FormatError when the stored bytes do not cover the tensor.
        """
        info = name_or_info if isinstance(name_or_info, TensorInfo) else self.tensor(name_or_info)
        custom = self.custom_readers.get(info.name)
        if custom is not None:
            return custom()
        from .reader import strided_view
        return strided_view(self, info)

    def values(self, name_or_info: str | TensorInfo) -> np.ndarray:
        """The tensor's numeric values.

        Plain dtypes: exactly `read` (the zero-copy read-only view). Block-quantized (GGUF
        ``q4_k`` ...), packed sub-byte (``int4``, ``float4_e2m1fn``, torch ``float4_e2m1fn_x2``,
        ``quint4x2`` ...) and torch quantized (``qint8`` ...) dtypes: a NEW float32 array of
        decoded values (a copy, 4 bytes per value; ``float4_e2m1fn_x2`` doubles the last
        dimension). See `tensorscope.dequant` (and its `iter_decoded` for bounded memory).
        Raises TensorscopeError for a dtype that cannot be decoded (the message names it).
        """
        info = name_or_info if isinstance(name_or_info, TensorInfo) else self.tensor(name_or_info)
        from .dequant import decode, is_decoded
        return decode(self, info) if is_decoded(info.dtype) else self.read(info)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        for src in self.sources.values():
            src.close()
        self.sources.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"<ModelFile {self.format} {self.path!r}: {len(self.tensors)} tensors>"

    def summary(self) -> dict[str, Any]:
        by_dtype: dict[str, dict[str, int]] = {}
        for t in self.tensors:
            d = by_dtype.setdefault(t.dtype, {"tensors": 0, "params": 0, "bytes": 0})
            d["tensors"] += 1
            d["params"] += t.numel
            d["bytes"] += t.nbytes if t.has_data else 0
        return {"format": self.format, "path": self.path, "files": list(self.files),
                "tensors": len(self.tensors), "params": self.num_params,
                "bytes": self.total_bytes, "by_dtype": by_dtype}
