"""The ``.npy`` header, as ``numpy.lib.format`` reads it: magic, version, length, and the dict
literal (``descr``, ``fortran_order``, ``shape``) parsed by a small literal parser that compiles
nothing. Shared by the ``.npy``/``.npz`` reader (`numpy_fmt`), the plain-pickle reader (the sibling
``.npy`` files of old joblib dumps) and the scanner's loader view; see `numpy_fmt` for the format.
"""
from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorscope.errors import FormatError, LimitExceeded

__all__ = ["FORMAT", "MAGIC_PREFIX", "MAGIC_LEN", "MAX_HEADER_SIZE", "NpyHeader",
           "NumpyFormatError", "parse_header", "sniff"]

FORMAT = "npy"

MAGIC_PREFIX = b"\x93NUMPY"
MAGIC_LEN = 8  # prefix + major + minor
# (major, minor) -> (header-length field, header encoding), numpy's _header_size_info
_VERSIONS: dict[tuple[int, int], tuple[struct.Struct, str]] = {
    (1, 0): (struct.Struct("<H"), "latin1"),
    (2, 0): (struct.Struct("<I"), "latin1"),
    (3, 0): (struct.Struct("<I"), "utf8"),
}
MAX_HEADER_SIZE = 10000  # numpy.lib.format._MAX_HEADER_SIZE
_EXPECTED_KEYS = {"descr", "fortran_order", "shape"}

# numpy (kind, itemsize) -> canonical dtype name, for the types read element-wise.
_DTYPES: dict[tuple[str, int], str] = {
    ("b", 1): "bool",
    ("i", 1): "int8", ("i", 2): "int16", ("i", 4): "int32", ("i", 8): "int64",
    ("u", 1): "uint8", ("u", 2): "uint16", ("u", 4): "uint32", ("u", 8): "uint64",
    ("f", 2): "float16", ("f", 4): "float32", ("f", 8): "float64",
    ("c", 8): "complex64", ("c", 16): "complex128",
}


class NumpyFormatError(FormatError):
    """A .npy header or payload that numpy.load would reject."""

    def __init__(self, reason: str, **where):
        where.setdefault("format", FORMAT)
        super().__init__(reason, **where)


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """A parsed .npy header.

    Attributes:
        version: (major, minor).
        descr: the descriptor as written (str or list).
        shape: the array's shape.
        fortran_order: whether the data are in Fortran order.
        np_dtype: the numpy dtype the descriptor denotes (metadata only, never used to unpickle).
        data_start: offset of the data relative to the start of the .npy bytes.
        dtype: our canonical dtype name (``object`` for pickled payloads, ``uint8`` for raw).
        layout: ``plain`` (zero-copy), ``swapped`` (big-endian: byte-swapping reader),
            ``raw`` (listed as bytes) or ``object`` (a pickle).
        py2_header: the header needed Python 2 ``L`` suffixes removed.
    """

    version: tuple[int, int]
    descr: Any
    shape: tuple[int, ...]
    fortran_order: bool
    np_dtype: np.dtype
    data_start: int
    dtype: str
    layout: str
    py2_header: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def data_nbytes(self) -> int:
        """Bytes of raw data numpy reads (0 for object arrays, whose payload is a pickle)."""
        return 0 if self.layout == "object" else self.numel * self.np_dtype.itemsize

    @property
    def view_shape(self) -> tuple[int, ...]:
        return self.shape + (self.np_dtype.itemsize,) if self.layout == "raw" else self.shape

    @property
    def view_stride(self) -> tuple[int, ...]:
        """Strides in elements of ``dtype`` for `view_shape` (Fortran order honoured)."""
        if self.layout == "raw":
            item = self.np_dtype.itemsize
            base = _f_stride(self.shape) if self.fortran_order else _c_stride(self.shape)
            return tuple(s * item for s in base) + (1,)
        return _f_stride(self.shape) if self.fortran_order else _c_stride(self.shape)


def _c_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _f_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in shape:
        out.append(acc)
        acc *= max(d, 1)
    return tuple(out)


def sniff(head: bytes, size: int) -> bool:
    """True when the file starts with the .npy magic."""
    return head[:6] == MAGIC_PREFIX and size >= MAGIC_LEN + 2


def _descr_to_dtype(descr: Any) -> np.dtype:
    """numpy's descr_to_dtype: strings, (base, shape) tuples, lists of fields (padding removed)."""
    if isinstance(descr, str):
        return np.dtype(descr)
    if isinstance(descr, tuple):
        if len(descr) != 2:
            raise TypeError(f"subarray descriptor must have 2 items, not {len(descr)}")
        return np.dtype((_descr_to_dtype(descr[0]), descr[1]))
    if not isinstance(descr, list):
        raise TypeError(f"descr must be a string, tuple or list, not {type(descr).__name__}")
    names, formats, titles, offsets = [], [], [], []
    offset = 0
    for field in descr:
        if not isinstance(field, tuple) or len(field) not in (2, 3):
            raise TypeError(f"field {field!r} is not (name, descr[, shape])")
        if len(field) == 2:
            name, sub = field
            dt = _descr_to_dtype(sub)
        else:
            name, sub, shape = field
            dt = np.dtype((_descr_to_dtype(sub), shape))
        is_pad = name == "" and dt.type is np.void and dt.names is None
        if not is_pad:
            title, name = name if isinstance(name, tuple) else (None, name)
            titles.append(title)
            names.append(name)
            formats.append(dt)
            offsets.append(offset)
        offset += dt.itemsize
    return np.dtype({"names": names, "formats": formats, "titles": titles,
                     "offsets": offsets, "itemsize": offset})


def _classify(dt: np.dtype) -> tuple[str, str]:
    """(our dtype, layout) for a numpy dtype."""
    if dt.hasobject:
        return "object", "object"
    if dt.names is None and dt.subdtype is None:
        name = _DTYPES.get((dt.kind, dt.itemsize))
        if name is not None:
            if dt.byteorder == ">" and dt.itemsize > 1:
                return name, "swapped"
            return name, "plain"
    return "uint8", "raw"


def parse_header(buf: memoryview | bytes, *, file: str = "", member: str | None = None,
                 base: int = 0, max_header_size: int = MAX_HEADER_SIZE,
                 fmt: str = FORMAT) -> NpyHeader:
    """Parse the magic, version and header dict of the .npy bytes in ``buf``.

    Args:
        buf: the .npy bytes (the whole payload, or at least its header).
        file, member, base: where ``buf`` lives, for error messages (``base`` = absolute offset
            of ``buf[0]`` in ``file``).
        max_header_size: numpy's limit on the header length in characters.
        fmt: the format named in errors (``npy`` or ``npz``).

    Raises:
        NumpyFormatError: bad magic, unsupported version, truncated or malformed header.
        LimitExceeded: a header longer than ``max_header_size``.
    """
    where = dict(file=file, member=member, format=fmt)

    def bad(reason: str, at: int = 0) -> NumpyFormatError:
        return NumpyFormatError(reason, offset=base + at, **where)

    if len(buf) < MAGIC_LEN or bytes(buf[:6]) != MAGIC_PREFIX:
        raise bad(f"bad magic {bytes(buf[:6])!r}, expected {MAGIC_PREFIX!r}")
    version = (buf[6], buf[7])
    if version not in _VERSIONS:
        raise bad(f"unsupported .npy format version {version[0]}.{version[1]} "
                  "(numpy reads 1.0, 2.0 and 3.0)", 6)
    length_field, encoding = _VERSIONS[version]
    if len(buf) < MAGIC_LEN + length_field.size:
        raise bad(f"truncated: the header length needs {length_field.size} bytes, "
                  f"{len(buf) - MAGIC_LEN} remain", MAGIC_LEN)
    (hlen,) = length_field.unpack_from(buf, MAGIC_LEN)
    start = MAGIC_LEN + length_field.size
    # numpy limits the decoded length; a UTF-8 character takes at most 4 bytes.
    if hlen > max_header_size * (4 if encoding == "utf8" else 1):
        raise LimitExceeded("header length", max_header_size, hlen, offset=base + MAGIC_LEN, **where)
    if hlen > len(buf) - start:
        raise bad(f"truncated: the header (length {hlen}) needs {start + hlen} bytes, the data "
                  f"ends at {len(buf)}", MAGIC_LEN)
    try:
        text = bytes(buf[start:start + hlen]).decode(encoding)
    except UnicodeDecodeError as e:
        raise bad(f"header is not valid UTF-8 ({e.reason})", start + e.start) from None
    if len(text) > max_header_size:
        raise LimitExceeded("header length", max_header_size, len(text), offset=base + MAGIC_LEN, **where)

    try:
        d, py2 = _HeaderLiteral(text, allow_long=version < (3, 0)).parse()
    except _LiteralError as e:
        at = start + len(text[:e.pos].encode(encoding))
        raise bad(f"cannot parse header: {e.reason}", at) from None
    if not isinstance(d, dict):
        raise bad(f"header is not a dictionary: {type(d).__name__}", start)
    if set(d) != _EXPECTED_KEYS:
        keys = sorted(map(repr, d))
        raise bad(f"header does not contain the correct keys: [{', '.join(keys)}]", start)
    shape = d["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(x, int) for x in shape):
        raise bad(f"shape is not valid: {shape!r}"[:200], start)
    if any(x < 0 for x in shape):
        raise bad(f"shape {shape!r} has a negative dimension", start)
    if not isinstance(d["fortran_order"], bool):
        raise bad(f"fortran_order is not a valid bool: {d['fortran_order']!r}"[:200], start)
    try:
        dt = _descr_to_dtype(d["descr"])
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError) as e:
        raise bad(f"descr is not a valid dtype descriptor: {d['descr']!r}"[:200] + f" ({e})"[:200],
                  start) from None
    dtype, layout = _classify(dt)
    return NpyHeader(version, d["descr"], tuple(int(x) for x in shape), d["fortran_order"], dt,
                     start + hlen, dtype, layout, py2)


class _LiteralError(ValueError):
    def __init__(self, reason: str, pos: int):
        super().__init__(reason)
        self.reason = reason
        self.pos = pos


_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<int>[-+]?[0-9]+(?P<long>[lL])?)
  | (?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<punct>[{}()\[\]:,])
""", re.VERBOSE)
_NAMES = {"True": True, "False": False, "None": None}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t", "0": "\0",
            "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_MAX_NESTING = 32  # numpy headers nest 3 deep; structured descrs a little more


class _HeaderLiteral:
    """The Python literals a .npy header is made of, parsed without compiling anything.

    numpy uses `ast.literal_eval`, which compiles the text to an AST (an audit ``compile`` event,
    and a crash risk on deep nesting). A header holds only dicts, lists, tuples, str, int
    (``1L`` in Python 2 files), True, False and None: those are accepted here, nested at most
    `_MAX_NESTING` deep; anything else (names, calls, operators, floats) is refused with its
    position, where literal_eval would fail or numpy's checks would refuse the value.
    """

    def __init__(self, text: str, *, allow_long: bool):
        self.text = text
        self.allow_long = allow_long
        self.saw_long = False
        self.pos = 0  # where the next token starts (whitespace skipped lazily)

    def peek(self) -> tuple[str, str, int]:
        """The next token as (kind, text, position), not consumed; kind "end" at the end."""
        text, pos = self.text, self.pos
        while True:
            if pos >= len(text):
                return "end", "", pos
            m = _TOKEN.match(text, pos)
            if m is None:
                raise _LiteralError(f"unexpected character {text[pos]!r}", pos)
            if m.lastgroup != "ws":
                return ("int" if m.lastgroup == "long" else m.lastgroup), m.group(), pos
            pos = m.end()

    def next(self) -> tuple[str, str, int]:
        kind, tok, pos = self.peek()
        self.pos = pos + len(tok)
        return kind, tok, pos

    def parse(self) -> tuple[Any, bool]:
        value = self.value(0)
        kind, tok, pos = self.peek()
        if kind != "end":
            raise _LiteralError(f"unexpected {tok!r} after the value", pos)
        return value, self.saw_long

    def take(self, punct: str) -> bool:
        kind, tok, _ = self.peek()
        if kind == "punct" and tok == punct:
            self.next()
            return True
        return False

    def value(self, depth: int) -> Any:
        kind, tok, pos = self.next()
        if depth > _MAX_NESTING:
            raise _LiteralError(f"nested deeper than {_MAX_NESTING} levels", pos)
        if kind == "int":
            if tok[-1] in "lL":
                if not self.allow_long:
                    raise _LiteralError(f"invalid integer {tok!r}", pos)
                self.saw_long = True
                tok = tok[:-1]
            return int(tok)
        if kind == "str":
            return self.string(tok, pos)
        if kind == "name":
            if tok not in _NAMES:
                raise _LiteralError(f"a name ({tok!r}) is not a literal", pos)
            return _NAMES[tok]
        if kind == "punct" and tok in "([{":
            close = {"(": ")", "[": "]", "{": "}"}[tok]
            items: list = []
            trailing_comma = False
            while not self.take(close):
                if items and not trailing_comma:
                    _, t2, p2 = self.peek()
                    raise _LiteralError(f"expected ',' or {close!r}, found {t2 or 'the end'!r}", p2)
                key = self.value(depth + 1)
                if tok == "{":
                    if not self.take(":"):
                        raise _LiteralError("expected ':' in a dict", self.peek()[2])
                    try:
                        hash(key)
                    except TypeError:
                        raise _LiteralError("unhashable dict key", pos) from None
                    items.append((key, self.value(depth + 1)))
                else:
                    items.append(key)
                trailing_comma = self.take(",")
            if tok == "{":
                return dict(items)
            if tok == "[":
                return items
            if len(items) == 1 and not trailing_comma:
                return items[0]  # (x) is x, (x,) is a tuple
            return tuple(items)
        raise _LiteralError(f"unexpected {tok or 'end of header'!r}", pos)

    @staticmethod
    def string(tok: str, pos: int) -> str:
        body = tok[1:-1]
        if "\\" not in body:
            return body
        out, j = [], 0
        while j < len(body):
            c = body[j]
            if c != "\\":
                out.append(c)
                j += 1
                continue
            e = body[j + 1]
            if e in _ESCAPES:
                out.append(_ESCAPES[e])
                j += 2
                continue
            width = {"x": 2, "u": 4, "U": 8}.get(e)
            digits = body[j + 2:j + 2 + width] if width else ""
            if not width or len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise _LiteralError(f"unsupported escape in string {tok[:40]!r}", pos)
            code = int(digits, 16)
            if code > 0x10FFFF:
                raise _LiteralError(f"escape out of range in string {tok[:40]!r}", pos)
            out.append(chr(code))
            j += 2 + width
        return "".join(out)
