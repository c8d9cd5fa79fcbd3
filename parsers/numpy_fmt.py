"""NumPy ``.npy`` (one array) and ``.npz`` (a zip of ``.npy`` members), as ``numpy.load`` reads them.

Format (normative, numpy 2.4 ``numpy.lib.format``):

- Bytes 0-6 MUST be ``\\x93NUMPY``, then a major and a minor version byte: 1.0, 2.0 or 3.0.
- Then the header length: u16 LE for 1.0, u32 LE for 2.0 and 3.0; then the header: latin-1 text
  (1.0, 2.0) or UTF-8 (3.0). Writers pad it with spaces and a newline so the data starts at a
  multiple of 64 (16 in old files); readers do not require it.
- The header is the repr of a Python dict literal with exactly the keys ``descr`` (a dtype
  descriptor: a string such as ``'<f4'``, or a list of fields for structured dtypes),
  ``fortran_order`` (bool) and ``shape`` (tuple of ints, ``()`` for a 0-d array). numpy parses it
  with `ast.literal_eval`; we parse the same literals (dict, list, tuple, str, int, True, False,
  None) with a small parser of our own that compiles nothing (`_HeaderLiteral`). numpy refuses
  headers longer than 10000 characters (`MAX_HEADER_SIZE`) because literal_eval is not safe on
  large input, unless told otherwise (``max_header_size=``, or ``allow_pickle=True`` which trusts
  the file); `open_source` takes the same ``max_header_size`` escape. Headers written by
  Python 2 (``1L`` integers) are accepted in versions 1.0 and 2.0, as numpy does.
- The data follows the header: ``prod(shape) * itemsize`` bytes in C order, or in Fortran order
  when ``fortran_order`` is True. Bytes after them are ignored by numpy; we record
  ``npy.trailing_bytes``. Fewer bytes is an error.
- Object arrays (any dtype holding ``O``) store a pickle instead of raw data. We never unpickle:
  the tensor is listed with dtype ``object`` (reading it returns the raw pickle bytes) and the
  pickle is run through the project's inert pickle VM, its `PickleRecord` (role ``npy.object``)
  added to ``model.evidence.pickles`` for the scanner.

Dtypes: booleans, signed/unsigned integers, float16/32/64 and complex64/128 map to our dtype
names. Little-endian (or byte-order-free) data reads zero-copy. Big-endian data (``'>f8'``) keeps
its canonical dtype name but is read by a custom reader that byte-swaps into a native array (a
copy); ``extras["byteorder"]`` says ``big``. Everything else (structured records, strings,
datetimes, ``V2`` as written for ml_dtypes' bfloat16, long double) is listed as its raw bytes:
dtype ``uint8`` with one extra trailing dimension of ``itemsize``, ``extras["numpy_descr"]``
giving the descriptor.

``.npz`` (`open_zip`): every member ``<key>.npy`` of the archive is one array named ``<key>``
(``np.load`` strips the suffix; for duplicate names it reads the last entry, as zipfile does,
and so do we). STORED members (``np.savez``) read zero-copy at their absolute offset in the
archive. Compressed members (``np.savez_compressed``) have ``byte_offset`` None: listing
decompresses only their header, and reading goes through a custom reader that decompresses the
member (bounded by the expected size) into a new array (a copy). A member that cannot be read is
recorded (``npz.bad_member``) and the listing goes on.

Public API: `FORMAT`, `FORMATS`, `sniff`, `open_source`, `open_zip`, `parse_header`,
`NpyHeader`, `MAX_HEADER_SIZE`, `NumpyFormatError`.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Callable

import numpy as np

from tensorscope.errors import FormatError
from tensorscope.model import ModelFile, PickleRecord, TensorInfo
from tensorscope.source import ByteSource

# the header (numpy's own names, re-exported: the loader view and the tests read them here)
from .npy_header import (FORMAT, MAGIC_LEN, MAGIC_PREFIX, MAX_HEADER_SIZE, NpyHeader,  # noqa: F401
                         NumpyFormatError, parse_header, sniff)

__all__ = ["FORMAT", "FORMATS", "sniff", "open_source", "open_zip", "parse_header", "NpyHeader",
           "MAX_HEADER_SIZE", "NumpyFormatError", "ROOT_NAME"]

FORMATS = ("npy", "npz")
ROOT_NAME = "<root>"  # a .npy holds one unnamed array; same name as a torch.save(tensor) root

def _tensor(h: NpyHeader, name: str, *, file: str, byte_offset: int | None, payload: int,
            fmt: str, storage_key: str | None = None, extras: dict | None = None) -> TensorInfo:
    ext = {"npy_version": f"{h.version[0]}.{h.version[1]}", "descr": _descr_str(h.descr),
           "fortran_order": h.fortran_order}
    if h.layout == "swapped":
        ext["byteorder"] = "big"
    if h.layout == "raw":
        ext["numpy_descr"] = _descr_str(h.descr)
        ext["array_shape"] = list(h.shape)
    if h.layout == "object":
        ext["pickle_bytes"] = payload
    if h.py2_header:
        ext["py2_header"] = True
    ext.update(extras or {})
    if h.layout == "object":
        shape, stride, nbytes = h.shape, None, payload
    else:
        shape, stride, nbytes = h.view_shape, h.view_stride, h.data_nbytes
    return TensorInfo(name=name, dtype=h.dtype, shape=shape, stride=stride,
                      byte_offset=byte_offset, nbytes=nbytes, file=file,
                      storage_key=storage_key, storage_nbytes=payload, path=(name,),
                      source_format=fmt, extras=ext)


def _descr_str(descr: Any) -> str:
    return descr if isinstance(descr, str) else repr(descr)


def _check_payload(h: NpyHeader, available: int, *, file: str, member: str | None, base: int,
                   fmt: str, ev) -> None:
    """Data shorter than the header says is an error; longer is recorded."""
    need = h.data_nbytes
    if h.layout == "object":
        if available == 0:
            raise NumpyFormatError("object array holds no pickle after its header", file=file,
                                   member=member, offset=base + h.data_start, format=fmt)
        return
    if need > available:
        layout = f"shape {h.shape} x {h.np_dtype.itemsize}-byte {_descr_str(h.descr)}"
        if member is None:   # a .npy file cut short (a member's size is the zip's business)
            start = base + h.data_start
            raise NumpyFormatError(f"truncated: the array data ({layout}) needs {start + need} "
                                   f"bytes, the file ends at {start + available}", file=file,
                                   offset=start, format=fmt)
        raise NumpyFormatError(f"array data needs {need} bytes ({layout}), {available} remain",
                               file=file, member=member, offset=base + h.data_start, format=fmt)
    if available > need:
        ev.add("npy.trailing_bytes", f"{available - need} bytes after the array data are not "
               "part of the array (numpy ignores them)", file=file, member=member,
               offset=base + h.data_start + need)


def _scan_pickle(model: ModelFile, data, *, file: str, member: str | None, offset: int) -> None:
    """Run an object array's pickle through the inert VM and keep the record for the scanner."""
    from . import pickle_vm  # only object arrays need it
    result = pickle_vm.run(data, file=file, member=member, base_offset=offset)
    model.evidence.pickles.append(
        PickleRecord(file, member, offset, len(data), result, role="npy.object"))
    if result.stopped and result.end < len(data):
        # np.load stops at STOP; whatever follows is invisible to it (a place to hide things).
        model.evidence.add("npy.trailing_bytes", f"{len(data) - result.end} bytes after the "
                           "object array's pickle are not read by numpy", file=file,
                           member=member, offset=offset + result.end)


def _object_elements(model: ModelFile, key: str, h: NpyHeader, data, *, file: str, fmt: str,
                     base: int | None) -> list[TensorInfo]:
    """List the numeric arrays an object array holds (ragged arrays saved with allow_pickle) as
    ``key[i]`` / ``key[i, j]`` (then the path inside a dict or list element).

    The pickle is ``ndarray._reconstruct`` + ``BUILD (version, shape, dtype, fortran, items)``,
    ``items`` in C order whatever the array's order; `plain_pickle` lists the same bytes (nothing
    is unpickled) and names those arrays ``4.<flat index>...``. ``base`` is the pickle's offset in
    the file when its bytes are the file's own (zero-copy), None for a decompressed copy."""
    from tensorscope.errors import TensorscopeError
    from . import plain_pickle
    try:
        inner = plain_pickle.open_source(ByteSource.from_bytes(data, name=file))
    except TensorscopeError:
        return []  # the scanner's run of the same pickle reports what is wrong with it
    count = math.prod(h.shape)
    out = []
    for t in inner.tensors:
        if len(t.path) < 2 or t.path[0] != "4" or not t.path[1].isdigit() or int(t.path[1]) >= count:
            continue
        index = np.unravel_index(int(t.path[1]), h.shape) if h.shape else ()
        name = f"{key}[{', '.join(str(int(i)) for i in index)}]" + "".join(f".{p}" for p in t.path[2:])
        zero_copy = base is not None and t.byte_offset is not None and t.name not in inner.custom_readers
        info = dataclasses.replace(
            t, name=name, path=(name,), file=file, source_format=fmt, storage_key=None,
            byte_offset=base + t.byte_offset if zero_copy else None,
            extras={**t.extras, "object_array": key, "element": [int(i) for i in index]})
        out.append(info)
        model.custom_readers[name] = (lambda t=t: inner.read(t))
    return out


def open_source(src: ByteSource, *, max_header_size: int = MAX_HEADER_SIZE) -> ModelFile:
    """Parse a .npy file: one array named `ROOT_NAME` (reads no array data).

    Args:
        src: the file.
        max_header_size: numpy's header limit (raise it only for trusted files).

    Returns:
        A `ModelFile` with one tensor; ``metadata["npy"]`` holds the header.

    Raises:
        NumpyFormatError: bad magic or version, malformed header, data shorter than the shape.
        LimitExceeded: header longer than ``max_header_size``.

    Example:
        >>> model = open_source(ByteSource("weights.npy"))  # doctest: +SKIP
        >>> model.read("<root>").shape                      # doctest: +SKIP
    """
    path = src.path
    # the header only (a remote file fetches no more): magic, version, length, dict
    buf = src.view(0, min(src.size, 12 + max_header_size + 64), "header", fmt=FORMAT)
    h = parse_header(buf, file=path, max_header_size=max_header_size)
    model = ModelFile(FORMAT, path)
    available = src.size - h.data_start
    _check_payload(h, available, file=path, member=None, base=0, fmt=FORMAT, ev=model.evidence)
    payload = available if h.layout == "object" else h.data_nbytes
    info = _tensor(h, ROOT_NAME, file=path, byte_offset=h.data_start, payload=payload, fmt=FORMAT)
    model.tensors = [info]
    if h.layout == "swapped":
        model.custom_readers[info.name] = _swapped_reader(model, info, h)
    if h.layout == "object":
        pickled = src.view(h.data_start, src.size - h.data_start)
        _scan_pickle(model, pickled, file=path, member=None, offset=h.data_start)
        model.tensors += _object_elements(model, ROOT_NAME, h, pickled, file=path, fmt=FORMAT,
                                          base=h.data_start)
    model.metadata["npy"] = _header_meta(h)
    return model


def _header_meta(h: NpyHeader) -> dict[str, Any]:
    return {"version": f"{h.version[0]}.{h.version[1]}", "descr": _descr_str(h.descr),
            "fortran_order": h.fortran_order, "shape": list(h.shape), "data_offset": h.data_start}


def _swapped_reader(model: ModelFile, info: TensorInfo, h: NpyHeader,
                    data: Callable[[], Any] | None = None) -> Callable[[], np.ndarray]:
    """A reader for big-endian data: a native-order copy (numpy arrays stay correct either way,
    but consumers expect the dtypes of `tensorscope.dtypes`)."""
    stored = h.np_dtype
    item = stored.itemsize

    def read() -> np.ndarray:
        if data is not None:
            raw, offset = data(), h.data_start
        else:
            src = model.source(info.file)
            src.view(info.byte_offset, info.nbytes, f"tensor {info.name!r}", fmt=FORMAT)
            raw, offset = src.raw, info.byte_offset
        if info.numel == 0:
            out = np.empty(info.shape, dtype=stored.newbyteorder("="))
        else:
            arr = np.ndarray(info.shape, dtype=stored, buffer=raw, offset=offset,
                             strides=tuple(s * item for s in info.stride))
            out = arr.astype(stored.newbyteorder("="))
        out.flags.writeable = False
        return out

    return read


# -- .npz -----------------------------------------------------------------------------------------------
def open_zip(src: ByteSource, archive, *, max_header_size: int = MAX_HEADER_SIZE) -> ModelFile:
    """List the arrays of an .npz archive (called by ``zip_dispatch`` once the zip is read).

    Args:
        src: the file.
        archive: its `tensorscope.parsers.zipfmt.ZipArchive`.
        max_header_size: numpy's header limit, per member.

    Returns:
        A `ModelFile` (format ``npz``): one tensor per ``<key>.npy`` member, named ``<key>``,
        with ``storage_key`` the member name; the archive's anomalies are in its evidence.
    """
    path = src.path
    model = ModelFile("npz", path)
    ev = model.evidence
    ev.anomalies.extend(archive.anomalies)
    chosen: dict[str, Any] = {}
    for m in archive.members:  # zipfile (so np.load) keeps the last member of a name
        if m.name.endswith(".npy") and not m.is_dir:
            chosen[m.name] = m
    compressed = arrays = 0
    for m in chosen.values():
        key = m.name[:-4]
        try:
            infos = _npz_member(model, archive, m, key, max_header_size)
        except FormatError as e:
            ev.add("npz.bad_member", f"member cannot be read: {e.reason}", file=path,
                   member=m.name, offset=e.offset if e.offset is not None else m.header_offset)
            continue
        compressed += not m.is_stored
        arrays += 1
        model.tensors += infos
    model.metadata["npz"] = {"members": len(archive.members), "arrays": arrays,
                             "compressed": compressed}
    return model


def _npz_member(model: ModelFile, archive, m, key: str, max_header_size: int) -> list[TensorInfo]:
    """The member's array, then (object arrays) the numeric arrays it holds."""
    path = model.path
    ev = model.evidence
    if m.error:
        raise NumpyFormatError(m.error, file=path, member=m.name, offset=m.header_offset,
                               format="npz")
    if m.is_encrypted:
        raise NumpyFormatError("member is encrypted", file=path, member=m.name,
                               offset=m.header_offset, format="npz")
    extras = {"member": m.name, "compressed": not m.is_stored}
    if m.is_stored:
        buf = archive.data(m)
        h = parse_header(buf, file=path, member=m.name, base=m.data_offset,
                         max_header_size=max_header_size, fmt="npz")
        available = len(buf) - h.data_start
        _check_payload(h, available, file=path, member=m.name, base=m.data_offset, fmt="npz", ev=ev)
        payload = available if h.layout == "object" else h.data_nbytes
        info = _tensor(h, key, file=path, byte_offset=m.data_offset + h.data_start,
                       payload=payload, fmt="npz", storage_key=m.name, extras=extras)
        if h.layout == "swapped":
            model.custom_readers[key] = _swapped_reader(model, info, h)
        if h.layout == "object":
            _scan_pickle(model, buf[h.data_start:], file=path, member=m.name,
                         offset=m.data_offset + h.data_start)
            return [info, *_object_elements(model, key, h, buf[h.data_start:], file=path,
                                            fmt="npz", base=m.data_offset + h.data_start)]
        return [info]

    # Compressed: decompress the header only; the data are decompressed when read.
    # Magic, version, length field and a header of at most max_header_size characters.
    head = _member_prefix(archive, m, MAGIC_LEN + 4 + 4 * max_header_size)
    h = parse_header(head, file=path, member=m.name, base=0, max_header_size=max_header_size,
                     fmt="npz")
    available = m.size - h.data_start
    _check_payload(h, available, file=path, member=m.name, base=0, fmt="npz", ev=ev)
    payload = available if h.layout == "object" else h.data_nbytes
    info = _tensor(h, key, file=path, byte_offset=None, payload=payload, fmt="npz",
                   storage_key=m.name, extras=extras)
    limit = h.data_start + payload

    def content() -> bytes:
        # Bounded by what the header and the central directory promise (zip bombs stop there).
        return archive.read_bytes(m, max_size=max(m.size, limit))

    model.custom_readers[key] = _decompressing_reader(info, h, content)
    if h.layout == "object":
        data = content()
        _scan_pickle(model, memoryview(data)[h.data_start:], file=path, member=m.name,
                     offset=m.data_offset)
        return [info, *_object_elements(model, key, h, memoryview(data)[h.data_start:],
                                        file=path, fmt="npz", base=None)]
    return [info]


def _member_prefix(archive, m, n: int) -> bytes:
    """The first ``n`` uncompressed bytes of a member, decompressing no more than needed."""
    if m.method == 8:  # deflate: stream just enough
        raw = archive.data(m)
        d = zlib.decompressobj(-15)
        out = bytearray()
        try:
            for i in range(0, len(raw), 1 << 16):
                out += d.decompress(raw[i:i + (1 << 16)], n - len(out))
                if len(out) >= n or d.eof:
                    break
        except zlib.error as e:
            raise NumpyFormatError(f"corrupt deflate data: {e}", file=archive.source.path,
                                   member=m.name, offset=m.data_offset, format="npz") from None
        return bytes(out)
    return archive.read_bytes(m, max_size=max(m.size, 0))[:n]


def _decompressing_reader(info: TensorInfo, h: NpyHeader,
                          content: Callable[[], bytes]) -> Callable[[], np.ndarray]:
    """Values of a compressed member: decompressed into a new array (a copy)."""
    def read() -> np.ndarray:
        data = content()
        if h.layout == "object":
            arr = np.frombuffer(data, dtype=np.uint8, offset=h.data_start)
        elif info.numel == 0:
            arr = np.empty(info.shape, dtype=_read_dtype(h))
        else:
            view = np.ndarray(info.shape, dtype=h.np_dtype if h.layout != "raw" else np.uint8,
                              buffer=data, offset=h.data_start,
                              strides=tuple(s * _item(h) for s in info.stride))
            arr = view.astype(_read_dtype(h)) if h.layout != "raw" else view.copy()
        arr.flags.writeable = False
        return arr

    return read


def _item(h: NpyHeader) -> int:
    return 1 if h.layout == "raw" else h.np_dtype.itemsize


def _read_dtype(h: NpyHeader) -> np.dtype:
    if h.layout == "raw":
        return np.dtype(np.uint8)
    return h.np_dtype.newbyteorder("=") if h.layout == "swapped" else h.np_dtype
