"""joblib files (``joblib.dump``): a pickle with NumPy arrays written inline, maybe compressed.

Spec (joblib 0.10 - 1.6: ``numpy_pickle.py``, ``numpy_pickle_utils.py``, ``compressor.py``,
``numpy_pickle_compat.py``; checked against files joblib 1.6 writes):

- An uncompressed file is ONE pickle written by ``NumpyPickler``: every ``numpy.ndarray``
  (``matrix``, ``memmap``) is replaced by a ``joblib.numpy_pickle.NumpyArrayWrapper`` object
  (``NEWOBJ`` + ``BUILD`` of a dict: ``subclass``, ``shape``, ``order`` 'C'|'F', ``dtype``,
  ``allow_mmap`` and, since joblib 1.2, ``numpy_array_alignment_bytes``), and the array's bytes
  follow that BUILD in the stream. ``NumpyUnpickler.load_build`` reads them and goes on with the
  next opcode after them, so ``pickle.load`` cannot read such a file (it would take the bytes for
  opcodes). With protocol >= 4 the frame is committed first: the bytes lie outside every frame.
- The bytes after the BUILD:
  - dtype holding objects (``O``, or a record with an object field: dtype flag bit 0): a whole
    nested pickle of the array (joblib reads it with a fresh unpickler sharing ``find_class``).
  - otherwise, when ``numpy_array_alignment_bytes`` is present and not None (None when the file
    cannot ``tell()``, e.g. compressed streams): one byte P, then P padding bytes (0xff) so the
    data start at a multiple of the alignment (16) in the stream; then ``prod(shape) * itemsize``
    bytes (1 element for shape ``()``) in ``order``: 'F' writes the elements in Fortran order.
  The itemsize is the dtype state's ``elsize`` when positive (flexible and record dtypes), else
  the digits of its type string (``f8``, ``M8``). Byte order is the dtype state's second field.
- A compressed file is the same stream through one compressor, chosen by its first bytes as
  ``_detect_compressor`` does: zlib ``x`` (``compress=3`` default), gzip ``\\x1f\\x8b``, bz2
  ``BZh``, xz ``\\xfd7zXZ``, lzma ``]\\x00``, lz4 ``\\x04\\x22\\x4d\\x18`` (needs the lz4
  package: refused here). Arrays in a compressed file have no alignment padding.
- joblib < 0.10 wrote ``ZF`` + the decompressed length as ``0x...`` hex left-justified to 19
  bytes, MAY add a space (Python 2), then a zlib stream of the pickle. Its arrays were
  ``NDArrayWrapper`` objects naming sibling ``.npy`` files, or ``ZNDArrayWrapper`` objects naming
  ``ZF``-compressed raw data files (both listed by `plain_pickle` from those files when they are
  plain names in the same folder).

Reading: the pickle VM runs with `build_hooks`, which skip (and place) each wrapper's bytes
exactly as joblib's unpickler reads them. Uncompressed files are opened by `plain_pickle` (listed
zero-copy at their absolute offsets); compressed ones by `open_source` here: decompressed into
memory (capped at `INFLATE_MAX`), listed with ``byte_offset`` None, and read through copying
custom readers.

Public: ``FORMAT``, ``sniff(head, size)``, ``open_source(src)``, `build_hooks`, `InlineArray`,
`ARRAY_WRAPPERS`, `compression`, `decompress`, `zf_data_offset`, `INFLATE_MAX`.
"""
from __future__ import annotations

import bz2
import dataclasses
import lzma
import math
import re
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.model import ModelFile, PickleRecord
from tensorscope.source import ByteSource

from .pickle_vm import Call, Global, PickleError

__all__ = ["FORMAT", "sniff", "open_source", "build_hooks", "InlineArray", "ARRAY_WRAPPERS",
           "compression", "decompress", "zf_data_offset", "INFLATE_MAX"]

FORMAT = "joblib"

# The class joblib pickles in place of an array (and sklearn's old vendored copy of joblib).
ARRAY_WRAPPERS = frozenset({("joblib.numpy_pickle", "NumpyArrayWrapper"),
                            ("sklearn.externals.joblib.numpy_pickle", "NumpyArrayWrapper")})

# Decompressed output cap, the same as for compressed pickles in torch zips (torch_zip).
INFLATE_MAX = 128 << 20
_PIECE = 1 << 20

# Compressor prefixes, as joblib's compressor.py declares them; lz4 last (not readable here).
_PREFIXES = (("gzip", b"\x1f\x8b"), ("bz2", b"BZh"), ("xz", b"\xfd7zXZ"), ("lzma", b"]\x00"),
             ("lz4", b"\x04\x22\x4d\x18"))
MAGIC_ZF = b"ZF"
_ZF_HEADER = 2 + 19          # "ZF" + len(hex(2**64)) characters of hex length, space-padded
_TYPESTR = re.compile(r"[<>|=]?([A-Za-z])(\d+)")


def compression(head: bytes) -> str | None:
    """The compressor joblib would detect from the first bytes, or None (a plain stream).

    >>> compression(b"x\\x9c..."), compression(b"\\x80\\x04"), compression(b"ZF0x12c ")
    ('zlib', None, 'zf')
    """
    if head[:2] == MAGIC_ZF:
        return "zf"
    # zlib: joblib tests the 'x' byte only; the header checksum (RFC 1950) keeps text out.
    if len(head) >= 2 and head[0] == 0x78 and int.from_bytes(head[:2], "big") % 31 == 0:
        return "zlib"
    for name, prefix in _PREFIXES:
        if head.startswith(prefix):
            return name
    return None


def _decompressor(kind: str):
    if kind in ("zlib", "zf"):
        return zlib.decompressobj(15)
    if kind == "gzip":
        return zlib.decompressobj(31)
    if kind == "bz2":
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor(lzma.FORMAT_XZ if kind == "xz" else lzma.FORMAT_ALONE)


def zf_data_offset(buf, path: str | None = None) -> int:
    """Where the zlib stream of a ``ZF`` file starts (FormatError without a hex length)."""
    header = bytes(buf[:_ZF_HEADER + 1])
    try:
        int(header[2:_ZF_HEADER].decode("ascii").strip(), 16)
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"ZF header {header[:_ZF_HEADER]!r} has no hex length", format=FORMAT,
                          file=path, offset=2) from None
    return _ZF_HEADER + 1 if header[_ZF_HEADER:_ZF_HEADER + 1] == b" " else _ZF_HEADER


def decompress(buf, kind: str, *, cap: int = INFLATE_MAX, path: str | None = None,
               head_only: bool = False) -> bytes:
    """The stream inside a compressed joblib file, at most ``cap`` bytes.

    ``head_only``: return what the given bytes decompress to (up to ``cap``) without requiring
    the stream to end (for sniffing a prefix). Raises FormatError for a broken stream, an
    unsupported compressor or a stream that does not end; LimitExceeded past ``cap``.
    """
    if kind == "lz4":
        raise FormatError("lz4-compressed joblib file: reading it needs the lz4 package, which "
                          "tensorscope does not use", format=FORMAT, file=path, offset=0)
    start = zf_data_offset(buf, path) if kind == "zf" else 0
    d = _decompressor(kind)
    is_zlib = kind in ("zlib", "zf", "gzip")
    out = bytearray()
    view = memoryview(buf)
    pos = start
    try:
        while pos < len(view) and not d.eof:
            data = view[pos:pos + _PIECE]
            pos += len(data)
            while True:
                # Never more than one byte past the cap per call: output is bounded, not trusted.
                got = d.decompress(data, cap + 1 - len(out))
                if not got and not d.eof and (
                        len(getattr(d, "unconsumed_tail", b"")) == len(data) if is_zlib
                        else not data and not d.needs_input):
                    raise ValueError("stream makes no progress")  # the loop would spin forever
                out += got
                if len(out) > cap:
                    raise LimitExceeded(f"{kind} stream output", cap, len(out), format=FORMAT,
                                        file=path)
                if d.eof:
                    break
                if is_zlib:     # zlib hands back the input it did not consume
                    data = d.unconsumed_tail
                    if not data:
                        break
                elif d.needs_input:
                    break
                else:           # bz2/lzma buffer the input: ask for the rest of the output
                    data = b""
    except LimitExceeded:
        raise
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
        raise FormatError(f"{kind} stream is corrupt after {len(out)} output bytes: {e}",
                          format=FORMAT, file=path) from None
    if not d.eof and not head_only:
        raise FormatError(f"{kind} stream ends early ({len(out)} bytes decompressed): the file "
                          "is truncated", format=FORMAT, file=path, offset=len(buf))
    return bytes(out)


# -- inline arrays ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class InlineArray:
    """One array joblib wrote after a ``NumpyArrayWrapper``.

    Attributes:
        wrapper: the wrapper's inert `Call` (its BUILD state is in ``wrapper.state``).
        shape, order ('C' or 'F'), typestr (``f8``, ``U5``, ``V12``), byteorder ('<', '>', '|'),
        itemsize: the array's layout.
        data_offset: offset of the first data byte in the VM's data (None for object arrays).
        nbytes: data bytes (``prod(shape) * itemsize``; 0 for object arrays).
        end: offset of the next opcode.
        value: for object arrays, the nested pickle's value; else None.
    """

    wrapper: Call
    shape: tuple[int, ...]
    order: str
    typestr: str
    byteorder: str
    itemsize: int
    data_offset: int | None
    nbytes: int
    end: int
    value: Any = None

    @property
    def has_objects(self) -> bool:
        return self.data_offset is None


def _dtype_layout(dtype: Any, pos: int) -> tuple[str, str, int, bool]:
    """(typestr, byteorder, itemsize, has_objects) of a ``numpy.dtype(typestr, align, copy)``
    Call with its BUILD state."""
    if not (type(dtype) is Call and type(dtype.func) is Global and dtype.func.dotted ==
            "numpy.dtype" and dtype.args and type(dtype.args[0]) is str):
        raise PickleError(f"NumpyArrayWrapper dtype is a {type(dtype).__name__}, not "
                          "numpy.dtype(...): the array's size is unknown", offset=pos)
    typestr = dtype.args[0]
    m = _TYPESTR.fullmatch(typestr)
    if m is None:
        raise PickleError(f"NumpyArrayWrapper dtype {typestr!r} is not a numpy type string",
                          offset=pos)
    state = dtype.state if type(dtype.state) is tuple else ()
    byteorder = state[1] if len(state) > 1 and state[1] in ("<", ">", "|", "=") else "|"
    elsize = state[5] if len(state) > 5 and type(state[5]) is int else -1
    flags = state[7] if len(state) > 7 and type(state[7]) is int else 0
    itemsize = elsize if elsize > 0 else int(m.group(2))
    return typestr, byteorder, itemsize, m.group(1) == "O" or bool(flags & 1)


def _shape(value: Any, pos: int) -> tuple[int, ...]:
    if type(value) is not tuple or len(value) > 64 or \
            any(type(d) is not int or d < 0 for d in value):
        raise PickleError(f"NumpyArrayWrapper shape {str(value)[:60]} is not a tuple of "
                          "non-negative ints", offset=pos)
    return value


def build_hooks(data, on_array: Callable[[InlineArray], Any] | None = None) -> dict:
    """Build hooks for `pickle_vm.run` over ``data`` that read each wrapper's inline bytes as
    ``joblib.load`` does. ``on_array(array)`` MAY return the value that replaces the wrapper on
    the stack (a tensor record); None keeps the wrapper (object arrays: the nested value)."""
    n = len(data)

    def hook(obj: Call, end: int, nested) -> tuple[Any, int]:
        state = obj.state
        pos = end - 1           # the BUILD opcode, where errors are reported
        if type(state) is not dict:
            raise PickleError(f"NumpyArrayWrapper state is a {type(state).__name__}, not a dict",
                              offset=pos)
        shape = _shape(state.get("shape"), pos)
        order = state.get("order", "C")
        if order not in ("C", "F"):
            raise PickleError(f"NumpyArrayWrapper order {order!r} is not 'C' or 'F'", offset=pos)
        typestr, byteorder, itemsize, has_objects = _dtype_layout(state.get("dtype"), pos)
        if has_objects:
            inner = nested(end)
            array = InlineArray(obj, shape, order, typestr, byteorder, itemsize, None, 0,
                                inner.end, inner.value)
            value = on_array(array) if on_array is not None else None
            return (inner.value if value is None else value), inner.end
        at = end
        if state.get("numpy_array_alignment_bytes") is not None:
            if at >= n:
                raise PickleError("NumpyArrayWrapper padding byte is missing: the data ends",
                                  offset=pos)
            at += 1 + data[at]
        nbytes = math.prod(shape) * itemsize
        if at > n or nbytes > n - at:
            raise PickleError(f"NumpyArrayWrapper array wants {nbytes} bytes at {at}, "
                              f"{max(0, n - at)} remain", offset=pos)
        array = InlineArray(obj, shape, order, typestr, byteorder, itemsize, at, nbytes,
                            at + nbytes)
        value = on_array(array) if on_array is not None else None
        return (obj if value is None else value), at + nbytes

    return {key: hook for key in ARRAY_WRAPPERS}


# -- compressed files ------------------------------------------------------------------------------
def sniff(head: bytes, size: int) -> bool:
    """A compressed stream (joblib's prefixes) whose first decompressed bytes are a pickle."""
    kind = compression(head)
    if kind is None or kind == "lz4":
        return kind == "lz4"    # claimed, so that opening says why it cannot be read
    try:
        inner = decompress(head, kind, cap=4096, head_only=True)
    except (FormatError, LimitExceeded) as e:
        if isinstance(e, LimitExceeded):
            return True
        return False
    if not inner:
        return kind == "bz2"    # bz2 gives nothing before a whole block: decided when opened
    from . import plain_pickle
    return plain_pickle.sniff(inner[:4096], len(inner))


def open_source(src: ByteSource) -> ModelFile:
    """Decompress (capped) and list the pickle inside; values are read from the decompressed
    copy (``byte_offset`` None: nothing in the file is a plain view of them)."""
    from . import plain_pickle
    head = src.head(64)
    kind = compression(head)
    if kind is None:
        raise FormatError("not a compressed joblib stream", format=FORMAT, file=src.path, offset=0)
    payload = decompress(src.buffer, kind, path=src.path)
    # The scanner's name for a decompressed stream, so that it reuses this run (zf holds zlib).
    member = "<zlib>" if kind == "zf" else f"<{kind}>"
    inner_src = ByteSource.from_bytes(payload, name=src.path)
    try:
        inner = plain_pickle.open_source(inner_src)
    except FormatError as e:
        if e.member is None:
            e.member = member
            e.args = (e._render(),)
        raise
    model = ModelFile(FORMAT, src.path, sources={src.path: src}, objects=inner.objects)
    model.sources[member] = inner_src
    for rec in inner.evidence.pickles:
        model.evidence.pickles.append(PickleRecord(src.path, member, rec.offset, rec.length,
                                                   rec.result, role=rec.role))
    for a in inner.evidence.anomalies:
        model.evidence.add(a.kind, a.message, file=src.path, member=member, offset=a.offset)
    for t in inner.tensors:
        extras = {**t.extras, "compression": kind, "decompressed_offset": t.byte_offset}
        info = dataclasses.replace(t, byte_offset=None, file=src.path, source_format=FORMAT,
                                   extras=extras)
        model.tensors.append(info)
        model.custom_readers[info.name] = _copying_reader(inner, t)
    model.metadata = {**inner.metadata, "compression": kind, "decompressed_bytes": len(payload),
                      "compressed_bytes": src.size}
    return model


def _copying_reader(inner: ModelFile, t):
    def read():
        """A copy of the values from the decompressed stream."""
        out = inner.read(t).copy()
        out.flags.writeable = False
        return out
    return read
