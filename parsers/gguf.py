"""GGUF (ggml / llama.cpp): a typed key-value header, tensor descriptors, then aligned tensor data.

Format (normative, as read by llama.cpp's ``gguf_init_from_file`` and gguf-py's ``GGUFReader``):

- Bytes 0-4 MUST be ``GGUF``; then u32 version, u64 tensor_count, u64 kv_count. Versions 2 and 3
  are read (they share this layout). Version 1 (u32 counts and lengths) is rejected, as llama.cpp
  rejects it; version 0 and versions above 3 are rejected. All integers are little-endian, except
  in big-endian files, recognised as the readers do by a version whose low 16 bits are zero:
  those are read with every header integer (and plain tensor value) byte-swapped.
- Strings are a u64 byte length then that many bytes of UTF-8 (no terminator). Invalid UTF-8 is
  replaced for display and recorded (``gguf.invalid_utf8``).
- kv_count key/value pairs follow: key (string), u32 value type, value. Value types: 0 u8, 1 i8,
  2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (one byte, non-zero is true), 8 string, 9 array,
  10 u64, 11 i64, 12 f64. An array is u32 item type, u64 count, then the items. Arrays of arrays
  are read (gguf-py writes them) but llama.cpp rejects them: recorded as ``gguf.nested_array``.
  Keys MUST be unique.
- ``general.alignment``, if present, MUST be a u32 power of two; the default is 32.
- tensor_count tensor descriptors follow: name (string, unique; llama.cpp wants < 64 bytes),
  u32 n_dims (at most 4), n_dims u64 dims ``ne[0..]`` with ``ne[0]`` the fastest-varying, u32
  ggml type, u64 offset relative to the data section. ``ne[0]`` MUST be a multiple of the type's
  block size, the element count MUST stay below 2**63.
- The data section starts at the end of the descriptors rounded up to the alignment. Each
  tensor's offset MUST be a multiple of the alignment and its bytes MUST lie inside the file.
  Writers place tensors back to back in descriptor order, each padded to the alignment, and
  llama.cpp insists on exactly that: other layouts are recorded (``gguf.unexpected_offset``), as
  are overlapping tensors (``gguf.overlap``) and bytes after the last tensor (``gguf.trailing_bytes``).

Shapes: our shape is numpy/torch order, i.e. ``ne`` reversed (``GGUFReader.tensors[i].shape`` is
``ne`` as stored; its ``.data.shape`` is the reversed order for plain types). Plain types
(F32 F16 BF16 F64 I8 I16 I32 I64) map to our dtypes and read zero-copy; the block-quantized types
are registered as block dtypes with their lowercase ggml names (``q4_k``) and read as raw bytes.
In big-endian files plain multi-byte tensors are read by a custom reader that byte-swaps (a copy).

Limits: counts, string lengths and array lengths are checked against the bytes that remain
before anything is allocated, so a kv_count of 2**63 fails at once.

Metadata: ``ModelFile.metadata["gguf"]`` holds the header and a JSON-able view of the key/values
in which arrays longer than `METADATA_ARRAY_HEAD` items are cut to their head plus a count;
``ModelFile.extras["gguf_kv"]`` maps each key to a `GGUFField` with the full value.

Public API: `FORMAT`, `sniff`, `open_source`, `GGML_TYPES`, `GGUFField`, `GGUFError`.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tensorscope import dtypes
from tensorscope.errors import FormatError
from tensorscope.model import ModelFile, TensorInfo
from tensorscope.source import ByteSource

__all__ = ["FORMAT", "sniff", "open_source", "GGML_TYPES", "GGMLType", "GGUFField", "GGUFError",
           "METADATA_ARRAY_HEAD", "DEFAULT_ALIGNMENT"]

FORMAT = "gguf"
MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
METADATA_ARRAY_HEAD = 16   # the metadata view keeps this many items of a long array
MAX_DIMS = 4               # GGML_MAX_DIMS
MAX_NAME = 64              # GGML_MAX_NAME (llama.cpp wants len(name) < 64)
MAX_ARRAY_DEPTH = 8        # nested arrays deeper than this are refused (no reader writes them)
_I64_LIMIT = 1 << 63

# Smallest encodings, to bound counts by the bytes that remain before looping over them.
_MIN_KV = 8 + 4 + 1                 # key length, value type, smallest value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8    # name length, n_dims, type, offset


@dataclass(frozen=True, slots=True)
class GGMLType:
    """One ggml tensor type: ``block_elems`` values stored in ``block_bytes`` bytes."""

    code: int
    name: str
    block_elems: int
    block_bytes: int
    dtype: str  # our canonical dtype (plain types) or the registered block type name

    @property
    def is_plain(self) -> bool:
        return self.block_elems == 1


def _t(code, name, block_elems, block_bytes, dtype=None):
    return GGMLType(code, name, block_elems, block_bytes, dtype or name.lower())


# ggml's type_traits (ggml.c) as listed by gguf-py 0.19 GGML_QUANT_SIZES: code, name, block, bytes.
GGML_TYPES: dict[int, GGMLType] = {}
for _ty in [
    _t(0, "F32", 1, 4, "float32"), _t(1, "F16", 1, 2, "float16"),
    _t(2, "Q4_0", 32, 18), _t(3, "Q4_1", 32, 20),
    _t(6, "Q5_0", 32, 22), _t(7, "Q5_1", 32, 24), _t(8, "Q8_0", 32, 34), _t(9, "Q8_1", 32, 40),
    _t(10, "Q2_K", 256, 84), _t(11, "Q3_K", 256, 110), _t(12, "Q4_K", 256, 144),
    _t(13, "Q5_K", 256, 176), _t(14, "Q6_K", 256, 210), _t(15, "Q8_K", 256, 292),
    _t(16, "IQ2_XXS", 256, 66), _t(17, "IQ2_XS", 256, 74), _t(18, "IQ3_XXS", 256, 98),
    _t(19, "IQ1_S", 256, 50), _t(20, "IQ4_NL", 32, 18), _t(21, "IQ3_S", 256, 110),
    _t(22, "IQ2_S", 256, 82), _t(23, "IQ4_XS", 256, 136),
    _t(24, "I8", 1, 1, "int8"), _t(25, "I16", 1, 2, "int16"), _t(26, "I32", 1, 4, "int32"),
    _t(27, "I64", 1, 8, "int64"), _t(28, "F64", 1, 8, "float64"),
    _t(29, "IQ1_M", 256, 56), _t(30, "BF16", 1, 2, "bfloat16"),
    _t(34, "TQ1_0", 256, 54), _t(35, "TQ2_0", 256, 66),
    _t(39, "MXFP4", 32, 17), _t(40, "NVFP4", 64, 36), _t(41, "Q1_0", 128, 18),
]:
    if _ty.code in GGML_TYPES:  # checked at import time, as pickletools checks its opcode table
        raise RuntimeError(f"duplicate ggml type code {_ty.code}")
    GGML_TYPES[_ty.code] = _ty
    if not _ty.is_plain:
        dtypes.register_block_type(_ty.dtype, _ty.block_elems, _ty.block_bytes)

# Codes ggml once used and dropped; named in the error so a user knows why.
_REMOVED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8",
                  36: "IQ4_NL_4_4", 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}

# GGUF value types: code -> (name, struct code); 8 string and 9 array are variable-size.
_STRING, _ARRAY, _BOOL = 8, 9, 7
VALUE_TYPES: dict[int, tuple[str, str]] = {
    0: ("uint8", "B"), 1: ("int8", "b"), 2: ("uint16", "H"), 3: ("int16", "h"),
    4: ("uint32", "I"), 5: ("int32", "i"), 6: ("float32", "f"), 7: ("bool", "B"),
    8: ("string", ""), 9: ("array", ""), 10: ("uint64", "Q"), 11: ("int64", "q"),
    12: ("float64", "d"),
}


class GGUFError(FormatError):
    """A GGUF file that the ggml readers would reject."""

    def __init__(self, reason: str, **where):
        super().__init__(reason, format=FORMAT, **where)


@dataclass(frozen=True, slots=True)
class GGUFField:
    """One key/value pair, in full.

    Attributes:
        key: the key.
        type: ``uint32``, ``string``, ``array`` ... (see `VALUE_TYPES`).
        value: Python scalar or str; for arrays of numbers a read-only numpy array (a view over
            the file, or a byte-swapped copy in big-endian files); for arrays of strings or of
            arrays a list.
        item_type: for arrays, the item type name (``array`` for nested arrays), else None.
        offset: absolute offset of the key's length field in the file.
    """

    key: str
    type: str
    value: Any
    item_type: str | None
    offset: int

    def to_json(self, head: int | None = METADATA_ARRAY_HEAD) -> Any:
        """A JSON-able value; arrays longer than ``head`` become {"count", "items", "truncated"}."""
        return _jsonable(self.value, head)


def _jsonable(value: Any, head: int | None) -> Any:
    if isinstance(value, np.ndarray):
        items = value[:head] if head is not None else value
        out = items.tolist()
        count = int(value.shape[0])
    elif isinstance(value, list):
        items = value[:head] if head is not None else value
        out = [_jsonable(v, head) for v in items]
        count = len(value)
    else:
        return value
    if head is not None and count > head:
        return {"count": count, "items": out, "truncated": True}
    return out


def sniff(head: bytes, size: int) -> bool:
    """True when the file starts with the GGUF magic and can hold the fixed header."""
    return head[:4] == MAGIC and size >= 24


class _Reader:
    """Bounds-checked sequential reads over the file, in the file's byte order."""

    def __init__(self, src: ByteSource, order: str):
        self.src = src
        self.size = src.size
        # A window over the file's start that grows as the header is read: the header's end is
        # not known up front, and a remote file then fetches the header, not the tensors.
        self.buf = src.view(0, min(self.size, 64 << 10), "header", fmt=FORMAT)
        self.pos = 0
        self.order = order
        self.anomalies: list[tuple[str, str, int]] = []
        self._structs: dict[str, struct.Struct] = {}

    def fail(self, reason: str, offset: int | None = None) -> GGUFError:
        return GGUFError(reason, file=self.src.path, offset=self.pos if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"truncated: {what} needs {self.pos + n} bytes, the file ends at "
                            f"{self.size}")
        if self.pos + n > len(self.buf):
            grown = min(self.size, max(self.pos + n, len(self.buf) * 2))
            self.buf = self.src.view(0, grown, "header", fmt=FORMAT)

    def scalar(self, code: str, what: str):
        st = self._structs.get(code)
        if st is None:
            st = self._structs[code] = struct.Struct(self.order + code)
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def u32(self, what: str) -> int:
        return self.scalar("I", what)

    def u64(self, what: str) -> int:
        return self.scalar("Q", what)

    def string(self, what: str) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"truncated: {what} (a string of {n} bytes) needs {self.pos + n} "
                            f"bytes, the file ends at {self.size}", start)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.anomalies.append(("gguf.invalid_utf8", f"{what} is not valid UTF-8", start))
            return raw.decode("utf-8", errors="replace")


def _value(r: _Reader, vtype: int, what: str, depth: int = 0) -> tuple[Any, str | None]:
    """Read one value of type ``vtype``. Returns (value, item type name for arrays)."""
    info = VALUE_TYPES.get(vtype)
    if info is None:
        raise r.fail(f"{what} has invalid value type {vtype}")
    name, code = info
    if code:
        v = r.scalar(code, what)
        return (v != 0 if vtype == _BOOL else v), None
    if vtype == _STRING:
        return r.string(what), None
    # Array: item type, count, items.
    item_type = r.u32(f"item type of {what}")
    count = r.u64(f"length of {what}")
    item = VALUE_TYPES.get(item_type)
    if item is None:
        raise r.fail(f"{what} is an array of invalid value type {item_type}", r.pos - 12)
    item_name, item_code = item
    remain = r.size - r.pos
    if item_code:
        itemsize = struct.calcsize(item_code)
        if count > remain // itemsize:
            raise r.fail(f"truncated: {what} (an array of {count} {item_name}) needs "
                         f"{r.pos + count * itemsize} bytes, the file ends at {r.size}")
        dt = np.dtype(item_code).newbyteorder(r.order)
        r.need(count * itemsize, what)
        arr = np.frombuffer(r.buf, dtype=dt, count=count, offset=r.pos) if count else np.empty(0, dt)
        r.pos += count * itemsize
        if item_type == _BOOL:
            arr = arr != 0
        elif r.order == ">" and itemsize > 1:
            arr = arr.astype(dt.newbyteorder("="))  # a copy, so values read natively
        if arr.flags.writeable:
            arr.flags.writeable = False
        return arr, item_name
    min_item = 8 if item_type == _STRING else 12
    if count > remain // min_item:
        raise r.fail(f"truncated: {what} (an array of {count} {item_name}s) needs at least "
                     f"{r.pos + count * min_item} bytes, the file ends at {r.size}")
    if item_type == _ARRAY:
        if depth + 1 >= MAX_ARRAY_DEPTH:
            raise r.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels")
        if depth == 0:
            r.anomalies.append(("gguf.nested_array", f"{what} is an array of arrays, which "
                                "llama.cpp refuses to load (gguf-py reads it)", r.pos - 12))
    values = []
    for i in range(count):
        v, _ = _value(r, item_type, f"{what}[{i}]", depth + 1)
        values.append(v)
    return values, item_name


def _read_header(src: ByteSource) -> tuple[_Reader, int, int, int]:
    if src.size < 4 or src.read(0, 4, "magic", fmt=FORMAT) != MAGIC:
        got = src.head(4)
        raise GGUFError(f"bad magic {got!r}, expected b'GGUF'", file=src.path, offset=0)
    if src.size < 24:
        raise GGUFError(f"truncated: the GGUF header needs 24 bytes, the file has {src.size}",
                        file=src.path, offset=0)
    (version,) = struct.unpack_from("<I", src.read(4, 4, "version", fmt=FORMAT))
    order = "<"
    if version & 0xFFFF == 0 and version != 0:
        # Written on a big-endian host: the readers recognise it the same way.
        order = ">"
        (version,) = struct.unpack_from(">I", src.read(4, 4, "version", fmt=FORMAT))
    r = _Reader(src, order)
    r.pos = 8
    if version == 1:
        raise r.fail("GGUF version 1 is not supported (it used 32-bit counts and lengths, and "
                     "llama.cpp no longer reads it); convert the file to version 3", 4)
    if version not in SUPPORTED_VERSIONS:
        raise r.fail(f"unsupported GGUF version {version} (this reader handles versions 2 and 3)", 4)
    tensor_count = r.u64("tensor_count")
    kv_count = r.u64("kv_count")
    remain = src.size - r.pos
    if kv_count > remain // _MIN_KV:
        raise r.fail(f"truncated: {kv_count} key/values (kv_count) need at least "
                     f"{r.pos + kv_count * _MIN_KV} bytes, the file ends at {src.size}", 16)
    if tensor_count > remain // _MIN_TENSOR_INFO:
        raise r.fail(f"truncated: {tensor_count} tensor descriptors (tensor_count) need at least "
                     f"{r.pos + tensor_count * _MIN_TENSOR_INFO} bytes, the file ends at "
                     f"{src.size}", 8)
    return r, version, tensor_count, kv_count


def _read_kv(r: _Reader, kv_count: int) -> dict[str, GGUFField]:
    fields: dict[str, GGUFField] = {}
    for i in range(kv_count):
        start = r.pos
        key = r.string(f"key #{i}")
        if key in fields:
            raise r.fail(f"duplicate key {key!r} (first at byte {fields[key].offset})", start)
        vtype = r.u32(f"value type of {key!r}")
        value, item_type = _value(r, vtype, f"key {key!r}")
        fields[key] = GGUFField(key, VALUE_TYPES[vtype][0], value, item_type, start)
    return fields


def _alignment(r: _Reader, fields: dict[str, GGUFField]) -> int:
    f = fields.get("general.alignment")
    if f is None:
        return DEFAULT_ALIGNMENT
    if f.type != "uint32":
        raise r.fail(f"general.alignment must be uint32, not {f.type}", f.offset)
    if f.value == 0 or f.value & (f.value - 1):
        raise r.fail(f"general.alignment {f.value} is not a power of two", f.offset)
    return f.value


def open_source(src: ByteSource) -> ModelFile:
    """Parse a GGUF file's header and tensor descriptors (reads no tensor bytes).

    Args:
        src: the file.

    Returns:
        A `ModelFile` with tensors in descriptor order, ``metadata["gguf"]`` (header and
        truncated key/values) and ``extras["gguf_kv"]`` (every `GGUFField` in full).

    Raises:
        GGUFError: bad magic, unsupported version, truncation, counts or lengths larger than the
            file, invalid value or ggml types, misaligned or out-of-file tensor data; the message
            names the byte offset and the key or tensor.

    Example:
        >>> model = open_source(ByteSource("tiny.gguf"))  # doctest: +SKIP
        >>> model.metadata["gguf"]["kv"]["general.architecture"]  # doctest: +SKIP
        'llama'
    """
    path = src.path
    r, version, tensor_count, kv_count = _read_header(src)
    fields = _read_kv(r, kv_count)
    alignment = _alignment(r, fields)

    infos = []
    names: dict[str, int] = {}
    for i in range(tensor_count):
        start = r.pos
        name = r.string(f"name of tensor #{i}")
        if name in names:
            raise r.fail(f"duplicate tensor name {name!r} (tensors #{names[name]} and #{i})", start)
        names[name] = i
        if len(name.encode("utf-8", errors="replace")) >= MAX_NAME:
            r.anomalies.append(("gguf.long_name", f"tensor name {name[:80]!r} is "
                                f"{len(name.encode())} bytes; llama.cpp refuses names of "
                                f"{MAX_NAME} bytes or more", start))
        n_dims = r.u32(f"n_dims of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions; ggml allows at most {MAX_DIMS}",
                         r.pos - 4)
        ne = [r.u64(f"dimension {j} of tensor {name!r}") for j in range(n_dims)]
        numel = math.prod(ne)
        if any(d >= _I64_LIMIT for d in ne) or numel >= _I64_LIMIT:
            raise r.fail(f"tensor {name!r}: dimensions {ne} hold 2**63 elements or more", start)
        code = r.u32(f"ggml type of tensor {name!r}")
        ty = GGML_TYPES.get(code)
        if ty is None:
            gone = _REMOVED_TYPES.get(code)
            why = f" ({gone}, removed from ggml)" if gone else ""
            raise r.fail(f"tensor {name!r} has unknown ggml type {code}{why}", r.pos - 4)
        if ne and ne[0] % ty.block_elems:
            raise r.fail(f"tensor {name!r} of type {ty.name} has {ne[0]} elements per row, not a "
                         f"multiple of the block size {ty.block_elems}", start)
        offset = r.u64(f"data offset of tensor {name!r}")
        nbytes = numel // ty.block_elems * ty.block_bytes
        infos.append((name, ne, ty, offset, nbytes, start))

    info_end = r.pos
    data_start = -(-info_end // alignment) * alignment
    model = ModelFile(FORMAT, path)
    ev = model.evidence
    for kind, message, at in r.anomalies:
        ev.add(kind, message, file=path, offset=at)

    tensors = []
    expected = 0  # where llama.cpp expects the next tensor: back to back, each padded
    for name, ne, ty, offset, nbytes, start in infos:
        if offset % alignment:
            raise GGUFError(f"tensor {name!r}: data offset {offset} is not a multiple of the "
                            f"alignment {alignment}", file=path, offset=start)
        begin = data_start + offset
        if begin > src.size or nbytes > src.size - begin:
            raise GGUFError(f"truncated: tensor {name!r} (data [{begin}, {begin + nbytes})) needs "
                            f"{begin + nbytes} bytes, the file ends at {src.size}", file=path,
                            offset=start)
        if offset != expected:
            ev.add("gguf.unexpected_offset",
                   f"tensor {name!r} is at data offset {offset}, llama.cpp expects {expected} "
                   "(tensors back to back in descriptor order) and refuses the file",
                   file=path, offset=begin)
        expected = offset + -(-nbytes // alignment) * alignment
        shape = tuple(reversed(ne))
        extras = {"ggml_type": ty.name, "ggml_type_code": ty.code, "ne": list(ne),
                  "data_offset": offset}
        if r.order == ">":
            extras["byteorder"] = "big"
        tensors.append(TensorInfo(
            name=name, dtype=ty.dtype, shape=shape, byte_offset=begin, nbytes=nbytes, file=path,
            storage_nbytes=nbytes, source_format=FORMAT, extras=extras))
        if r.order == ">" and ty.is_plain and ty.block_bytes > 1:
            model.custom_readers[name] = _swapped_reader(model, tensors[-1])

    _check_overlaps(tensors, ev, path)
    if tensors:
        end = max(t.byte_offset + t.nbytes for t in tensors)
        padded = data_start + max(
            (t.extras["data_offset"] + -(-t.nbytes // alignment) * alignment for t in tensors))
        if src.size > max(end, padded):
            ev.add("gguf.trailing_bytes",
                   f"{src.size - max(end, padded)} bytes after the last tensor belong to no tensor",
                   file=path, offset=max(end, padded))

    model.tensors = tensors
    model.metadata["gguf"] = {
        "version": version, "byteorder": "big" if r.order == ">" else "little",
        "tensor_count": tensor_count, "kv_count": kv_count, "alignment": alignment,
        "data_offset": data_start,
        "kv": {k: f.to_json() for k, f in fields.items()},
        "kv_types": {k: (f"array[{f.item_type}]" if f.type == "array" else f.type)
                     for k, f in fields.items()},
    }
    model.extras["gguf_kv"] = fields
    return model


def _check_overlaps(tensors: list[TensorInfo], ev, path: str) -> None:
    spans = sorted((t.byte_offset, t.byte_offset + t.nbytes, t.name) for t in tensors if t.nbytes)
    reported = 0
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0 and reported < 10:
            reported += 1
            ev.add("gguf.overlap", f"tensor {n1!r} [{b1}, {e1}) overlaps tensor {n0!r} [{b0}, {e0})",
                   file=path, offset=b1)


def _swapped_reader(model: ModelFile, info: TensorInfo) -> Callable[[], np.ndarray]:
    """Values of a plain tensor stored big-endian, as a native-order copy."""
    spec = dtypes.spec(info.dtype)

    def read() -> np.ndarray:
        src = model.source(info.file)
        raw = src.view(info.byte_offset, info.nbytes, f"tensor {info.name!r}", fmt=FORMAT)
        stored = np.dtype(f">u{spec.itemsize}") if info.dtype == "bfloat16" else spec.numpy.newbyteorder(">")
        arr = np.frombuffer(raw, dtype=stored).astype(stored.newbyteorder("=")).view(spec.numpy)
        arr = arr.reshape(info.shape)
        arr.flags.writeable = False
        return arr

    return read
