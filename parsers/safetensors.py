"""safetensors: an 8-byte length, a JSON header, then the raw little-endian tensor bytes.

Format (normative, as read by the Rust reference ``safetensors`` 0.8, checked byte by byte):

- Bytes 0-8 MUST hold ``N``, a little-endian u64: the header length. A file shorter than 8 bytes
  is invalid; ``N`` MUST NOT exceed ``MAX_HEADER_SIZE`` (100 000 000) and ``8 + N`` MUST NOT
  exceed the file size.
- Bytes ``[8, 8+N)`` MUST be UTF-8 JSON text whose value is an object. Writers pad it with
  spaces so that data starts at a multiple of 8; leading and trailing JSON whitespace is allowed,
  anything else (NUL padding, a BOM) is not. NaN/Infinity literals and lone surrogate escapes
  are not JSON and are rejected.
- The key ``__metadata__`` MAY appear once; its value MUST be null or an object of string to
  string (user metadata). Every other key names a tensor whose value MUST be an object with
  ``dtype`` (one of `DTYPES`), ``shape`` (array of unsigned integers, possibly empty for a 0-d
  tensor, possibly containing 0 for an empty tensor) and ``data_offsets`` (``[begin, end]``,
  unsigned integers relative to byte ``8+N``). Each of these three fields MUST appear once;
  other fields are ignored by the reference reader (we record them as anomalies).
- A tensor name MAY appear twice in the header: the reference reader keeps the last one. We do
  the same and record ``safetensors.duplicate_name``, since another reader may keep the first.
- Sorted by ``data_offsets``, the tensors MUST tile the data region exactly: each begins where
  the previous one ended (no hole, no overlap, ``end >= begin``), and the last ends at the end
  of the file. "The byte buffer needs to be entirely indexed, and cannot contain holes. This
  prevents the creation of polyglot files."
- ``end - begin`` MUST equal ``prod(shape) * bits(dtype) / 8``, computed without overflow (u64),
  and for sub-byte dtypes (F4, F6_*) ``prod(shape) * bits`` MUST be a multiple of 8.
- Header order is normally data order (writers sort by dtype size, then name); older writers
  used name order. Tensors are listed here in data order, as the reference reader indexes them.

Dtypes: ``F4`` counts fp4 values in its header shape, while torch's ``float4_e2m1fn_x2`` packs
two per element (a torch ``[3, 4]`` is saved as ``F4 [3, 8]``). We report what
``safetensors.torch`` loads: ``float4_e2m1fn_x2`` with the last dimension halved, so that a
.pt <-> .safetensors diff aligns. When the header shape cannot be expressed that way (0-d, or an
odd last dimension), the tensor is listed as ``float4_e2m1fn`` with the header shape. The header
dtype and shape are always kept in ``TensorInfo.extras`` (``safetensors_dtype``,
``header_shape`` as a tuple; one read-only dict shared by the tensors of the same kind). A
tensor's ``data_offsets`` are ``[byte_offset - data_offset, byte_offset - data_offset + nbytes]``
with ``metadata["safetensors"]["data_offset"]``.

Values are zero-copy: ``byte_offset = 8 + N + begin``.

Public API: `FORMAT`, `sniff`, `open_source`, `DTYPES`, `MAX_HEADER_SIZE`, `SafetensorsError`.
"""
from __future__ import annotations

import contextvars
import itertools
import json
import math
import operator
import re
import struct
from contextlib import contextmanager
from typing import Any

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.model import FrozenDict, ModelFile, TensorInfo, shared_stride
from tensorscope.native import optional_extension
from tensorscope.source import ByteSource

__all__ = ["FORMAT", "sniff", "open_source", "DTYPES", "MAX_HEADER_SIZE", "SafetensorsError"]

FORMAT = "safetensors"

HEADER_LEN = struct.Struct("<Q")  # u64 LE header length N at offset 0
MAX_HEADER_SIZE = 100_000_000      # the Rust reference's MAX_HEADER_SIZE
_U64_LIMIT = 1 << 64               # shapes and offsets are usize (u64) in the reference reader
_JSON_WS = b" \t\n\r"
_MAX_FIELD_ANOMALIES = 10          # unknown-field warnings are bounded (onnx habit)

# header dtype -> (canonical dtype, bits per value). The Rust Dtype enum of safetensors 0.8.
DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 8),
    "F4": ("float4_e2m1fn", 4),          # see module docstring: usually float4_e2m1fn_x2
    "F6_E2M3": ("float6_e2m3fn", 6),
    "F6_E3M2": ("float6_e3m2fn", 6),
    "U8": ("uint8", 8),
    "I8": ("int8", 8),
    "F8_E5M2": ("float8_e5m2", 8),
    "F8_E4M3": ("float8_e4m3fn", 8),
    "F8_E8M0": ("float8_e8m0fnu", 8),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8),
    "I16": ("int16", 16),
    "U16": ("uint16", 16),
    "F16": ("float16", 16),
    "BF16": ("bfloat16", 16),
    "I32": ("int32", 32),
    "U32": ("uint32", 32),
    "F32": ("float32", 32),
    "C64": ("complex64", 64),
    "F64": ("float64", 64),
    "I64": ("int64", 64),
    "U64": ("uint64", 64),
}

_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")
_by_offsets = operator.itemgetter(0, 1)


class SafetensorsError(FormatError):
    """A safetensors file that the reference reader would reject."""

    def __init__(self, reason: str, **where):
        super().__init__(reason, format=FORMAT, **where)


def truncation(head: bytes, size: int) -> str | None:
    """For a file `sniff` refused: the reason when it is a safetensors file cut inside its header
    (a plausible header length past the end, then ``{``)."""
    if len(head) < 9 or size < 9:
        return None
    (n,) = HEADER_LEN.unpack_from(head)
    if 8 + n > size and 2 <= n <= MAX_HEADER_SIZE and head[8:].lstrip(_JSON_WS)[:1] == b"{":
        return f"truncated: the header (length {n}) needs {8 + n} bytes, the file ends at {size}"
    return None


def sniff(head: bytes, size: int) -> bool:
    """True when the first bytes look like a safetensors header: a plausible N, then ``{``."""
    if len(head) < 9 or size < 10:
        return False
    (n,) = HEADER_LEN.unpack_from(head)
    if not 2 <= n <= size - 8:
        return False
    body = head[8:8 + n].lstrip(_JSON_WS)
    return body[:1] == b"{"


class _Obj(dict):
    """A JSON object that remembers the keys it saw more than once (json keeps the last)."""

    __slots__ = ("dups",)


def _object_hook(pairs: list[tuple[str, Any]] | tuple) -> _Obj:
    obj = _Obj(pairs)
    obj.dups = ()
    if len(obj) != len(pairs):  # rare: find which keys repeat
        seen: set[str] = set()
        obj.dups = [k for k, _ in pairs if k in seen or seen.add(k)]
    return obj


def _obj(value: Any) -> Any:
    """A parsed JSON object (a tuple of pairs, see `_parse_header`) as an `_Obj` that knows its
    duplicate keys; anything else as it is. One level: deeper objects stay tuples of pairs
    (they only ever appear in error messages, as "an object")."""
    return _object_hook(value) if type(value) is tuple else value


def _u64s(values: list) -> bool:
    """True when every item is a plain int in [0, 2**64) (bools excluded), in C loops."""
    return not values or (set(map(type, values)) == _INT_ONLY and min(values) >= 0
                          and max(values) < _U64_LIMIT)


_INT_ONLY = {int}


class _BadJSON(ValueError):
    pass


# Python's json turns "\ud800" (a lone surrogate escape) into a str; serde_json and UTF-8 refuse
# it. Valid UTF-8 input cannot hold a surrogate otherwise, so only escapes need a closer look.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_surrogates(value: Any) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise _BadJSON(f"lone surrogate escape in string {v!r}") from None
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, tuple):  # an object as parsed: (key, value) pairs
            stack.extend(v)
        elif isinstance(v, list):
            stack.extend(v)


def _reject_constant(name: str):
    raise _BadJSON(f"{name} is not valid JSON")


def _header_text(src: ByteSource) -> tuple[int, str]:
    """Read N and the header's text (checked UTF-8). Returns (N, text)."""
    n, raw = _header_bytes(src)
    return n, _decoded(raw, src.path)


def _decoded(raw, path: str) -> str:
    """The header's text; SafetensorsError (with the offset) when it is not valid UTF-8."""
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"header is not valid UTF-8 ({e.reason})", file=path,
                               offset=8 + e.start) from None


def _header_bytes(src: ByteSource):
    """Read N and the header's bytes (unchecked). Returns (N, bytes or a buffer)."""
    path = src.path
    if src.size < 8:
        raise SafetensorsError(f"file has {src.size} bytes; the header length alone needs 8",
                               file=path, offset=0)
    (n,) = HEADER_LEN.unpack(src.read(0, 8, "header length", fmt=FORMAT))
    if n > MAX_HEADER_SIZE:
        raise LimitExceeded("header length", MAX_HEADER_SIZE, n, format=FORMAT, file=path, offset=0)
    if 8 + n > src.size:
        raise SafetensorsError(f"truncated: the header (length {n}) needs {8 + n} bytes, the file "
                               f"ends at {src.size}", file=path, offset=0)
    # A local file's header is read with a system call, not through the map: the pages it
    # spans would otherwise stay resident (10 shards of 10^5 tensors: 11 MB of RSS).
    pread = getattr(src, "pread", None)
    raw = pread(8, n) if pread is not None else src.view(8, n, "header", fmt=FORMAT)
    return n, raw


def _loads(text: str, path: str, pairs: bool) -> Any:
    """The header's JSON value. With ``pairs``, objects come back as tuples of (key, value) pairs
    (a C call per object, duplicate keys visible; JSON has no tuples, so an object can never be
    mistaken for an array); without, as plain dicts (faster, duplicates lost: see `_fast`)."""
    try:
        header = json.loads(text, object_pairs_hook=tuple if pairs else None,
                            parse_constant=_reject_constant)
        if _SURROGATE_ESCAPE.search(text):
            _check_surrogates(header)
    except json.JSONDecodeError as e:
        at = 8 + len(text[:e.pos].encode("utf-8"))
        raise SafetensorsError(f"header is not valid JSON: {e.msg}", file=path, offset=at) from None
    except _BadJSON as e:
        raise SafetensorsError(f"header is not valid JSON: {e}", file=path, offset=8) from None
    except RecursionError:
        raise SafetensorsError("header JSON nests too deeply", file=path, offset=8) from None
    if type(header) is not (tuple if pairs else dict):
        raise SafetensorsError(f"header must be a JSON object, not {_json_type(header)}",
                               file=path, offset=8)
    return _object_hook(header) if pairs else header


# -- the fast path: a well-formed header of many tensors ----------------------------------------
# A checkpoint of 10^5-10^6 tensors spends its time here. Entries are checked column by column
# (map, set, list comparisons run in C) instead of one Python loop per entry; each distinct
# (dtype, shape) is checked once and its record fields (dtype, shape, stride, size, extras)
# shared by every tensor of that kind. Anything the checks do not accept (a duplicate key,
# an extra field, holes or overlaps, a bad size) returns None, and `_open`'s general path reads
# the header again and says exactly what is wrong.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')   # a JSON string token, escapes included
_get_dtype = operator.itemgetter("dtype")
_get_shape = operator.itemgetter("shape")
_get_offsets = operator.itemgetter("data_offsets")
_first, _second, _nbytes_of = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(3)
_KINDS: dict[tuple[str, tuple[int, ...]], tuple | None] = {}   # (header dtype, shape) -> kind


# Names a caller already holds (a sharded index's weight map, name -> the same string): the
# records of a shard take those string objects instead of their own copies (10^6 names: ~96 MB).
_KNOWN_NAMES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("known_names",
                                                                          default=None)


@contextmanager
def sharing_names(names: dict[str, str]):
    """Within it, records are named by the string objects of ``names`` (name -> name) where it
    holds their name (`tensorscope.parsers.sharded` passes the index's)."""
    token = _KNOWN_NAMES.set(names)
    try:
        yield
    finally:
        _KNOWN_NAMES.reset(token)


def _string_count(text: str) -> int:
    """The number of string tokens (keys and values) in valid JSON text. Without a backslash
    every quote delimits a string; with one, escaped quotes are skipped by the regex."""
    return text.count('"') // 2 if "\\" not in text else len(_STRING.findall(text))


def _kind(st_dtype: str, shape: tuple[int, ...]) -> tuple | None:
    """(dtype, shape, stride, nbytes, extras) shared by the tensors of one header dtype and
    shape, or None when that shape is invalid (`_open`'s general path says why)."""
    key = (st_dtype, shape)
    kind = _KINDS.get(key, False)
    if kind is not False:
        return kind
    kind = None
    bits = DTYPES[st_dtype][1]
    numel = math.prod(shape)
    if (not shape or (min(shape) >= 0 and max(shape) < _U64_LIMIT)) and numel < _U64_LIMIT \
            and numel * bits // 8 < _U64_LIMIT and not numel * bits % 8:
        dtype, ours = _canonical("", st_dtype, list(shape))
        kind = (dtype, ours, shared_stride(ours), numel * bits // 8,
                FrozenDict(safetensors_dtype=st_dtype, header_shape=shape))
    if len(_KINDS) < 4096:
        _KINDS[key] = kind
    return kind


def _fast(header: dict, text: str, path: str, data_start: int) -> tuple[list, dict | None] | None:
    """(records in data order, user metadata) of a header whose every entry is exactly
    ``{dtype, shape, data_offsets}``, well typed, without duplicate keys anywhere, tiling the
    data region; else None."""
    meta = header.get("__metadata__")
    strings = len(header)
    if meta is not None:
        if type(meta) is not dict or set(map(type, meta.values())) - {str}:
            return None
        strings += 2 * len(meta)
    names = list(header)
    if meta is not None or "__metadata__" in header:
        names.remove("__metadata__")
    entries = list(map(header.__getitem__, names))
    if not entries:
        return None
    if set(map(type, entries)) != {dict} or set(map(len, entries)) != {3}:
        return None
    try:
        st_dtypes = list(map(_get_dtype, entries))
        shapes = list(map(_get_shape, entries))
        offsets = list(map(_get_offsets, entries))
    except KeyError:
        return None
    # Every key and dtype of the entries is a string token: any more in the text means a key
    # appeared twice somewhere (json keeps the last), which the general path reports.
    if _string_count(text) != strings + 4 * len(entries):
        return None
    if set(map(type, st_dtypes)) != {str} or not set(st_dtypes) <= DTYPES.keys():
        return None
    if set(map(type, shapes)) != {list} or set(map(type, offsets)) != {list} \
            or set(map(len, offsets)) != {2}:
        return None
    shapes = list(map(tuple, shapes))
    if not set(map(type, itertools.chain.from_iterable(shapes))) <= {int}:
        return None
    begins, ends = list(map(_first, offsets)), list(map(_second, offsets))
    if set(map(type, begins)) != {int} or set(map(type, ends)) != {int}:
        return None
    if begins[0] != 0 or begins[1:] != ends[:-1]:
        # Not in data order (older writers sorted the header by name): sorted as the reference
        # reader sorts, by (begin, end), ties in header order.
        order = sorted(range(len(names)), key=list(zip(begins, ends)).__getitem__)
        names, st_dtypes, shapes, begins, ends = (list(map(column.__getitem__, order)) for column
                                                  in (names, st_dtypes, shapes, begins, ends))
    # Tiling: first at 0, each begins where the previous ends, none ends before it begins.
    if begins[0] != 0 or begins[1:] != ends[:-1] or not all(map(operator.le, begins, ends)) \
            or ends[-1] >= _U64_LIMIT:
        return None
    keys = list(zip(st_dtypes, shapes))
    kinds = {k: _kind(*k) for k in set(keys)}
    if None in kinds.values():
        return None
    per = list(map(kinds.__getitem__, keys))
    if list(map(operator.sub, ends, begins)) != list(map(_nbytes_of, per)):
        return None
    known = _KNOWN_NAMES.get()
    if known:
        names = list(map(known.get, names, names))
    trusted = TensorInfo.trusted
    tensors = [trusted(name, dtype, shape, stride, 0, data_start + b, nbytes, path, None, nbytes,
                       (name,), FORMAT, "tensor", (), extras)
               for name, (dtype, shape, stride, nbytes, extras), b in zip(names, per, begins)]
    return tensors, (dict(meta) if meta is not None else None)


# The compiled `_fast` (tensorscope/_stheader.c), bound to the record class here; None when it is
# not built (or is a stale build): `_fast` then runs after `json.loads`. Tests set it to None too.
STHEADER_ABI = 1
_HEADER = optional_extension("_stheader", STHEADER_ABI)
if _HEADER is not None:
    _HEADER.bind(TensorInfo)


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"a number ({v!r})"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _is_u64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _U64_LIMIT


def _tensor_entry(name: str, entry: Any, path: str) -> tuple[str, list[int], int, int, list[str]]:
    """Check one tensor's header entry; returns (header dtype, shape, begin, end, unknown fields)."""
    def bad(reason: str) -> SafetensorsError:
        return SafetensorsError(f"tensor {name!r}: {reason}", file=path, offset=8)

    if not isinstance(entry, dict):
        raise bad(f"entry must be an object with dtype, shape and data_offsets, not {_json_type(entry)}")
    for dup in entry.dups:
        if dup in _TENSOR_FIELDS:
            raise bad(f"field {dup!r} appears twice")
    for field in _TENSOR_FIELDS:
        if field not in entry:
            raise bad(f"missing field {field!r}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str):
        raise bad(f"dtype must be a string, not {_json_type(dtype)}")
    if dtype not in DTYPES:
        raise bad(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
        raise bad(f"shape must be an array of unsigned integers, not {json.dumps(shape)[:80]}")
    offsets = entry["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_u64(o) for o in offsets)):
        raise bad(f"data_offsets must be [begin, end] unsigned integers, not {json.dumps(offsets)[:80]}")
    unknown = [k for k in entry if k not in _TENSOR_FIELDS]
    return dtype, shape, offsets[0], offsets[1], unknown


def _user_metadata(value: Any, path: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SafetensorsError(f"__metadata__ must be an object of strings, not {_json_type(value)}",
                               file=path, offset=8)
    for k, v in value.items():
        if not isinstance(v, str):
            raise SafetensorsError(f"__metadata__[{k!r}] must be a string, not {_json_type(v)}",
                                   file=path, offset=8)
    return dict(value)


def _canonical(name: str, st_dtype: str, shape: list[int]) -> tuple[str, tuple[int, ...]]:
    """Our dtype and shape for a header dtype and shape (F4: what safetensors.torch loads)."""
    dtype, _bits = DTYPES[st_dtype]
    if st_dtype == "F4" and shape and shape[-1] % 2 == 0:
        return "float4_e2m1fn_x2", tuple(shape[:-1]) + (shape[-1] // 2,)
    return dtype, tuple(shape)


def open_source(src: ByteSource) -> ModelFile:
    """Parse a safetensors file's header and list its tensors (reads no tensor bytes).

    Args:
        src: the file.

    Returns:
        A `ModelFile` whose tensors are in data order; ``metadata["__metadata__"]`` holds the
        user metadata when the header has any, ``metadata["safetensors"]`` the layout.

    Raises:
        SafetensorsError: whatever the reference reader rejects, with the file, the byte offset
            and the tensor name where one applies.
        LimitExceeded: a header length above `MAX_HEADER_SIZE`.

    Example:
        >>> model = open_source(ByteSource("model.safetensors"))  # doctest: +SKIP
        >>> model.read("embed.weight").shape                       # doctest: +SKIP
    """
    return _open(src)


def _compiled(raw, path: str, data_start: int) -> tuple[list, dict | None] | None:
    """`_fast` over the header's bytes in C (`tensorscope/_stheader.c`), where it is built and
    the header is in its subset of JSON; else None (the Python path reads it)."""
    if _HEADER is None or type(path) is not str:
        return None
    return _HEADER.header(raw, data_start, path, DTYPES, _kind, _KNOWN_NAMES.get(), FORMAT,
                          "tensor")


def _open(src: ByteSource) -> ModelFile:
    path = src.path
    n, raw = _header_bytes(src)
    data_start = 8 + n
    model = ModelFile(FORMAT, path)
    fast = _compiled(raw, path, data_start)
    if fast is not None:
        tensors, user_meta = fast
        last = tensors[-1]
        if last.byte_offset + last.nbytes == src.size:
            return _finish(model, tensors, user_meta, n, data_start)
    text = _decoded(raw, path)
    del raw
    fast = _fast(_loads(text, path, False), text, path, data_start)
    if fast is not None:
        tensors, user_meta = fast
        last = tensors[-1]
        if last.byte_offset + last.nbytes == src.size:
            return _finish(model, tensors, user_meta, n, data_start)
    header = _loads(text, path, True)   # the general path: duplicates visible, every check
    ev = model.evidence

    if "__metadata__" in header.dups:
        raise SafetensorsError("key '__metadata__' appears twice", file=path, offset=8)
    meta_obj = _obj(header.get("__metadata__"))
    user_meta = _user_metadata(meta_obj, path)
    if user_meta is not None:
        dups = meta_obj.dups
        for key in dict.fromkeys(dups):
            ev.add("safetensors.duplicate_metadata_key",
                   f"__metadata__ key {key!r} appears more than once; readers keep the last value",
                   file=path, offset=8)

    for name in dict.fromkeys(header.dups):
        if name != "__metadata__":
            ev.add("safetensors.duplicate_name",
                   f"tensor {name!r} appears more than once in the header; the reference reader "
                   "keeps the last entry, another reader may keep the first", file=path, offset=8)

    entries = []
    unknown_count = 0
    for order, (name, entry) in enumerate(header.items()):
        if name == "__metadata__":
            continue
        if type(entry) is tuple and len(entry) == 3:
            # Exactly dtype, shape and data_offsets, once each, well typed: no message needed.
            d = dict(entry)
            st_dtype, shape, offsets = d.get("dtype"), d.get("shape"), d.get("data_offsets")
            if (len(d) == 3 and type(st_dtype) is str and st_dtype in DTYPES
                    and type(shape) is list and type(offsets) is list and len(offsets) == 2
                    and _u64s(shape) and _u64s(offsets)):
                entries.append((offsets[0], offsets[1], order, name, st_dtype, shape))
                continue
        st_dtype, shape, begin, end, unknown = _tensor_entry(name, _obj(entry), path)
        if unknown:
            unknown_count += 1
            if unknown_count <= _MAX_FIELD_ANOMALIES:
                ev.add("safetensors.unknown_field",
                       f"tensor {name!r} has fields the reference reader ignores: "
                       f"{', '.join(repr(k[:100]) for k in unknown[:10])}", file=path, offset=8)
        entries.append((begin, end, order, name, st_dtype, shape))
    if unknown_count > _MAX_FIELD_ANOMALIES:
        ev.add("safetensors.unknown_field",
               f"{unknown_count - _MAX_FIELD_ANOMALIES} more tensors have unknown fields",
               file=path, offset=8)

    # The reference reader sorts by data_offsets, then requires them to tile the data region.
    entries.sort(key=_by_offsets)
    expected = 0
    prev_name = None
    tensors = []
    data_offset = data_start
    for begin, end, _order, name, st_dtype, shape in entries:
        if end < begin:
            raise SafetensorsError(f"tensor {name!r}: invalid offsets, end {end} < begin {begin}",
                                   file=path, offset=data_start + begin)
        if begin > expected:
            raise SafetensorsError(
                f"tensor {name!r}: invalid offsets, data begins at {begin} but the previous tensor "
                f"ends at {expected}: a hole of {begin - expected} bytes (the data must be "
                "entirely indexed)", file=path, offset=data_start + expected)
        if begin < expected:
            raise SafetensorsError(
                f"tensor {name!r}: invalid offsets, data [{begin}, {end}) overlaps tensor "
                f"{prev_name!r} which ends at {expected}", file=path, offset=data_start + begin)
        _bits = DTYPES[st_dtype][1]
        numel = math.prod(shape)
        if numel >= _U64_LIMIT or numel * _bits // 8 >= _U64_LIMIT:
            raise SafetensorsError(f"tensor {name!r}: shape {shape} x {st_dtype} overflows u64",
                                   file=path, offset=data_start + begin)
        if (numel * _bits) % 8:
            raise SafetensorsError(
                f"tensor {name!r}: {numel} values of {st_dtype} take {numel * _bits} bits, not a "
                "whole number of bytes", file=path, offset=data_start + begin)
        nbytes = numel * _bits // 8
        if end - begin != nbytes:
            raise SafetensorsError(
                f"tensor {name!r}: shape {shape} x {st_dtype} needs {nbytes} bytes but "
                f"data_offsets [{begin}, {end}) span {end - begin}", file=path,
                offset=data_start + begin)
        dtype, our_shape = _canonical(name, st_dtype, shape)
        tensors.append(TensorInfo(
            name, dtype, our_shape, None, 0, data_offset + begin, nbytes, path, None, nbytes,
            (), FORMAT, "tensor", (), FrozenDict(safetensors_dtype=st_dtype,
                                                 header_shape=tuple(shape))))
        expected = end
        prev_name = name
    if data_start + expected != src.size:
        left = src.size - data_start - expected
        if left < 0:   # a cut download: say so, with what the header promises
            raise SafetensorsError(f"truncated: the tensors need {data_start + expected} bytes, "
                                   f"the file ends at {src.size}", file=path, offset=src.size)
        raise SafetensorsError("incomplete metadata, file not fully covered: "
                               f"{left} bytes after the last tensor are not indexed by any tensor",
                               file=path, offset=data_start + expected)

    return _finish(model, tensors, user_meta, n, data_start)


def _finish(model: ModelFile, tensors: list, user_meta: dict | None, n: int,
            data_start: int) -> ModelFile:
    model.tensors = tensors
    if user_meta is not None:
        model.metadata["__metadata__"] = user_meta
    model.metadata["safetensors"] = {"header_length": n, "data_offset": data_start,
                                     "tensors": len(tensors)}
    return model
