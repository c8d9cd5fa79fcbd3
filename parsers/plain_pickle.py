"""Plain pickle files (``pickle.dump`` of dicts, numpy arrays, torch tensors): read without loading.

Spec (what ``pickle.load`` would meet; last in the registry, so any file no container claims):
- The file MUST start with a pickle: ``PROTO n`` (n = 2..5) or, for protocols 0/1, any opcode;
  the sniffer runs the VM over the first bytes and requires a few opcodes to decode (a text file
  that merely starts with ``(`` fails on its next byte). Bytes after STOP are reported.
- numpy arrays (protocols 0-4) are ``numpy[._]core.multiarray._reconstruct(ndarray, (0,), b'b')``
  then ``BUILD (version, shape, dtype, is_fortran, rawdata)``; protocol 5 uses
  ``numpy[._]core.numeric._frombuffer(buffer, dtype, shape, order)``. ``dtype`` is
  ``numpy.dtype(typestr, align, copy)`` with ``BUILD (version, byteorder, ...)``. Numeric arrays
  are listed as tensors: when ``rawdata`` is stored verbatim (BINBYTES, BYTEARRAY8: protocols 3+)
  ``byte_offset`` is its place in the file and reads are zero-copy views (big-endian arrays are
  byte-swapped copies); protocols 0-2 store bytes as latin-1 text (``_codecs.encode``): then
  ``byte_offset`` is None and the reader copies the decoded bytes. Pickles written by Python 2
  hold ``rawdata`` in a py2 ``str`` (SHORT_BINSTRING/BINSTRING, verbatim in the file): read as
  ``pickle.load(encoding='latin1')`` and numpy read it, they are the same bytes, listed zero-copy.
  A numeric array whose data cannot be located is a ``pickle.numpy_unreadable`` anomaly.
- torch tensors pickled without ``torch.save`` are ``torch._utils._rebuild_tensor_v2(storage,
  ...)`` whose storage is ``torch.storage._load_from_bytes(<bytes>)``: a nested ``torch.load`` of
  a legacy stream (parsed by `torch_legacy`, never run). Its storage bytes are located in the file
  the same way; nested pickles are kept as evidence (roles ``nested.legacy.*``).
- joblib files (``joblib.dump`` without compression) are pickles whose arrays follow the BUILD of
  a ``joblib.numpy_pickle.NumpyArrayWrapper`` as raw bytes (`joblib_fmt` has the layout): the VM
  reads them as joblib's unpickler does, and numeric ones are listed zero-copy at their offsets.
  joblib < 0.10 pickled a ``NDArrayWrapper`` naming a sibling ``.npy`` file instead (listed
  zero-copy from it), or a ``ZNDArrayWrapper`` naming a ``ZF``-compressed data file (inflated,
  capped, into a copy): plain names in the pickle's folder only; otherwise ``joblib.sibling_array``.
- Everything else stays an inert object in ``model.objects``; every global and call the VM saw is
  in ``model.evidence.pickles`` (role ``pickle``) for the scanner.

Public: ``FORMAT``, ``sniff(head, size)``, ``open_source(src)``.
"""
from __future__ import annotations

import math
import pickletools

import numpy as np

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.model import ModelFile, PickleRecord, contiguous_stride
from tensorscope.source import ByteSource

from . import compression, pickle_vm, torch_pickle
from .joblib_arrays import InlineArray, build_hooks
from .pickle_vm import Call, Global
from .truncation import cut_short, is_truncation
from .torch_pickle import StorageRef, TensorRef

__all__ = ["FORMAT", "sniff", "open_source", "cut_short"]

FORMAT = "pickle"
JOBLIB = "joblib"   # the same reader, for what joblib.dump wrote (`joblib_fmt.FORMAT`)
SNIFF_OPCODES = 64       # opcodes the sniffer runs over the head
SNIFF_MIN_OPCODES = 3    # a protocol 0/1 head must decode at least this many
_SNIFF_LIMITS = pickle_vm.Limits(max_opcodes=SNIFF_OPCODES)

_RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
_FROMBUFFER = {("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer")}
_LOAD_FROM_BYTES = ("torch.storage", "_load_from_bytes")

# numpy typestr (kind + itemsize) -> canonical dtype. Others (objects, strings, records,
# datetimes) stay objects.
NUMPY_DTYPES = {
    "f2": "float16", "f4": "float32", "f8": "float64", "c8": "complex64", "c16": "complex128",
    "i1": "int8", "i2": "int16", "i4": "int32", "i8": "int64",
    "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64", "b1": "bool",
}
# Opcodes whose payload is verbatim bytes in the file: Python 3 bytes, and Python 2 ``str``
# (BINSTRING, SHORT_BINSTRING), which numpy arrays pickled under Python 2 hold their data in.
_BYTES_OPS = {"BINBYTES": 4, "SHORT_BINBYTES": 1, "BINBYTES8": 8, "BYTEARRAY8": 8,
              "BINSTRING": 4, "SHORT_BINSTRING": 1}


# -- sniffing -------------------------------------------------------------------------------------
def sniff(head: bytes, size: int) -> bool:
    """A pickle head: PROTO 2..5, or protocol 0/1 opcodes that decode for a while."""
    if not head:
        return False
    if head[0] == 0x80 and (len(head) < 2 or not 2 <= head[1] <= 5):
        return False
    result = pickle_vm.run(head, limits=_SNIFF_LIMITS, build_hooks=build_hooks(head))
    if result.stopped or isinstance(result.error, LimitExceeded):
        return True
    if is_truncation(result.error):
        # The head is a prefix of the file: a cut argument (a FRAME bigger than the head) is fine.
        need = 1 if head[0] == 0x80 else SNIFF_MIN_OPCODES
        return result.opcodes >= need
    return False


# -- payload positions ------------------------------------------------------------------------------
def _bytes_payloads(src: ByteSource, start: int, end: int) -> dict[int, list[int]]:
    """``{length: [offsets]}`` of every BINBYTES/SHORT_BINBYTES/BINBYTES8/BYTEARRAY8 payload in
    the pickle at ``[start, end)``: the VM gives values, this static walk gives their places.
    Opcode layouts come from `pickletools`; nothing is copied but text lines."""
    buf = src.view(0, src.size, "pickle", fmt=FORMAT)
    raw = src.raw  # valid: the view above fetched every byte of a remote source
    find = raw.find if hasattr(raw, "find") else None
    out: dict[int, list[int]] = {}
    pos = start
    while pos < end:
        op = pickletools.code2op.get(chr(buf[pos]))
        if op is None or op.name == "STOP":
            break
        arg = op.arg
        if arg is None:
            pos += 1
        elif arg.n >= 0:
            pos += 1 + arg.n
        elif arg.n == pickletools.UP_TO_NEWLINE:
            lines = 2 if arg.name == "stringnl_noescape_pair" else 1
            at = pos + 1
            for _ in range(lines):
                nl = find(b"\n", at, end) if find else bytes(buf[at:end]).find(b"\n")
                if nl < 0:
                    return out
                at = nl + 1 if find else at + nl + 1
            pos = at
        else:
            prefix = {pickletools.TAKEN_FROM_ARGUMENT1: 1, pickletools.TAKEN_FROM_ARGUMENT4: 4,
                      pickletools.TAKEN_FROM_ARGUMENT4U: 4, pickletools.TAKEN_FROM_ARGUMENT8U: 8}[arg.n]
            if pos + 1 + prefix > end:
                break
            length = int.from_bytes(buf[pos + 1:pos + 1 + prefix], "little",
                                    signed=arg.n == pickletools.TAKEN_FROM_ARGUMENT4)
            data = pos + 1 + prefix
            if length < 0 or data + length > end:
                break
            if op.name in _BYTES_OPS:
                out.setdefault(length, []).append(data)
            pos = data + length
    return out


class _Locator:
    """Finds where a bytes value the VM produced sits in the file (first unused exact match)."""

    def __init__(self, src: ByteSource, end: int):
        self.src = src
        self.end = end
        self.table: dict[int, list[int]] | None = None
        self.used: set[int] = set()

    def find(self, value: bytes | bytearray) -> int | None:
        if self.table is None:
            self.table = _bytes_payloads(self.src, 0, self.end)
        n = len(value)
        for at in self.table.get(n, ()):
            if at not in self.used and self.src.view(at, n) == value:
                self.used.add(at)
                return at
        return None


# -- numpy ------------------------------------------------------------------------------------------
def _numpy_dtype(value) -> tuple[str, str] | None:
    """``numpy.dtype('f4', ...)`` + BUILD state -> (canonical dtype, byte order '<' or '>')."""
    if not (isinstance(value, Call) and isinstance(value.func, Global)
            and value.func.dotted == "numpy.dtype" and value.args and isinstance(value.args[0], str)):
        return None
    name = NUMPY_DTYPES.get(value.args[0])
    if name is None:
        return None
    order = "<"
    state = value.state
    if isinstance(state, tuple) and len(state) > 1 and state[1] == ">":
        order = ">"
    return name, order


def _array_parts(call: Call):
    """(shape, dtype Call, fortran, raw) of a numpy array Call, or None."""
    key = (call.func.module, call.func.name) if isinstance(call.func, Global) else None
    if key in _RECONSTRUCT:
        state = call.state
        if isinstance(state, tuple) and len(state) == 5:
            _version, shape, dtype, fortran, raw = state
            return shape, dtype, fortran is True, raw
    elif key in _FROMBUFFER and len(call.args) == 4:
        raw, dtype, shape, order = call.args
        return shape, dtype, order == "F", raw
    return None


def _shape(value) -> tuple[int, ...] | None:
    if not isinstance(value, tuple) or len(value) > 64:
        return None
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in value):
        return None
    return value


def _fortran_stride(shape):
    return tuple(reversed(contiguous_stride(tuple(reversed(shape)))))


# -- the file ----------------------------------------------------------------------------------------
class _Copies:
    """Storages whose values are not plain little-endian bytes in the file: (buffer, offset, byte
    order) by storage identity. Tensors over them get a copying reader."""

    def __init__(self):
        self.table: dict[int, tuple[StorageRef, bytes, int, str]] = {}
        self.inflated: dict[str, bytes] = {}   # joblib .z sibling files, each inflated once

    def add(self, storage: StorageRef, buffer: bytes, offset: int, order: str = "<") -> None:
        self.table[id(storage)] = (storage, buffer, offset, order)

    def reader(self, ref: TensorRef, info):
        entry = self.table.get(id(ref.storage)) if ref.storage is not None else None
        if entry is None:
            return None
        _storage, buffer, offset, order = entry
        from tensorscope.dtypes import spec
        s = spec(ref.dtype)

        def read() -> np.ndarray:
            """A copy in native byte order (the file holds no plain view of these values)."""
            if s.numpy is None or not torch_pickle.tensor_fits(ref):
                raise FormatError(f"tensor {info.name!r} cannot be read from its "
                                  f"{len(buffer)}-byte payload", format=FORMAT, file=info.file)
            if info.numel == 0:
                return np.empty(info.shape, dtype=s.numpy)
            view = np.ndarray(info.shape, dtype=s.numpy.newbyteorder(order), buffer=buffer,
                              offset=offset + ref.storage_offset * s.itemsize,
                              strides=tuple(st * s.itemsize for st in info.stride))
            out = view.astype(s.numpy)
            out.flags.writeable = False
            return out
        return read


def open_source(src: ByteSource) -> ModelFile:
    model = ModelFile(FORMAT, src.path, sources={src.path: src})
    nested: list[tuple[int, StorageRef, bytes, ModelFile]] = []
    copies = _Copies()
    joblib_arrays: list[InlineArray] = []

    def on_array(array: InlineArray):
        joblib_arrays.append(array)
        return _joblib_tensor(array, src, copies)

    data = src.view(0, src.size, "pickle", fmt=FORMAT)
    result = pickle_vm.run(data, hooks=_hooks(src, model, nested), file=src.path,
                           build_hooks=build_hooks(data, on_array))
    model.evidence.pickles.append(PickleRecord(src.path, None, 0, result.end, result, role="pickle"))
    cut = cut_short(result, src)
    if cut is not None:
        raise cut from None
    result.raise_for_error()
    if result.end < src.size:
        model.evidence.add("pickle.trailing_bytes", f"{src.size - result.end} bytes follow the "
                           "pickle's STOP (pickle.load ignores them)", file=src.path,
                           offset=result.end)
    model.objects = result.value
    locator = _Locator(src, result.end)
    _locate_nested(src, model, nested, locator, copies)
    arrays: dict[int, TensorRef | None] = {}

    def leaf(call: Call):
        if id(call) not in arrays:  # one record per array, however often it is referenced
            sibling = _sibling_array(call, src, model, copies)
            arrays[id(call)] = sibling if sibling is not False else \
                _numpy_tensor(call, src, locator, model, copies)
        return arrays[id(call)]

    # a pickle holding joblib's NumpyArrayWrapper is what joblib.dump writes: named as the
    # compressed dumps are (`joblib_fmt`), whatever the compression
    fmt = model.format = JOBLIB if joblib_arrays else FORMAT
    tensors = []
    for path, raw_path, ref in torch_pickle.named_tensors(result.value, leaf=leaf):
        info = torch_pickle.to_tensor_info(path, raw_path, ref, fmt=fmt, file=src.path)
        tensors.append(info)
        reader = copies.reader(ref, info)
        if reader is not None:
            model.custom_readers[info.name] = reader
        elif ref.storage is not None and not torch_pickle.tensor_fits(ref):
            model.evidence.add("pickle.tensor_out_of_storage",
                               f"tensor {info.name!r} addresses bytes past the end of its data",
                               file=src.path)
    model.tensors = tensors
    model.metadata = {"pickle_protocol": result.protocol, "pickle_end": result.end,
                      "opcodes": result.opcodes, "globals": len(result.globals),
                      "calls": len(result.calls), "root_type": _type_name(result.value)}
    if joblib_arrays:
        model.metadata["joblib_arrays"] = len(joblib_arrays)
        _note_unlisted(model, joblib_arrays, src)
    return model


def _note_unlisted(model: ModelFile, arrays: list[InlineArray], src: ByteSource) -> None:
    """An array joblib wrote that is not a tensor (objects, strings, records) is said, never
    dropped in silence: ``joblib.array_not_listed``."""
    for a in arrays:
        kind = a.typestr.lstrip("<>|=")[:1]
        if not a.has_objects and NUMPY_DTYPES.get(f"{kind}{a.itemsize}") and kind in "fiucb":
            continue
        what = ("Python objects (dtype object): numeric arrays inside it are listed by their "
                "place, the rest stays inert" if a.has_objects else
                f"{a.typestr} values, which are not a tensor dtype: kept as an inert object")
        model.evidence.add("joblib.array_not_listed", f"the joblib array at byte "
                           f"{a.wrapper.pos} (shape {list(a.shape)}) holds {what}",
                           file=src.path, offset=a.wrapper.pos)


def _type_name(value) -> str:
    if isinstance(value, Call):
        return value.func.dotted if isinstance(value.func, Global) else "call"
    return type(value).__name__


# joblib < 0.10 (Python 2 era) wrote each array to a sibling file and pickled a wrapper naming it.
_SIBLING_WRAPPERS = {(m, n) for m in ("joblib.numpy_pickle", "sklearn.externals.joblib.numpy_pickle")
                     for n in ("NDArrayWrapper", "ZNDArrayWrapper")}


def _sibling_array(call: Call, src: ByteSource, model: ModelFile, copies: "_Copies"):
    """A joblib < 0.10 ``NDArrayWrapper`` (BUILD state ``{'filename': 'x.pkl_01.npy', ...}``):
    the sibling .npy it names, listed zero-copy from that file (a plain name in the same folder
    only), or an anomaly when it cannot be; False when ``call`` is not such a wrapper.
    ``ZNDArrayWrapper`` (compressed dumps): the sibling holds ``ZF`` + zlib of the raw data and
    the wrapper's ``state`` is the array's (version, shape, dtype, fortran): read as a copy."""
    import os

    from . import npy_header  # numpy: only these old joblib dumps need it
    func = call.func
    if type(func) is not Global or (func.module, func.name) not in _SIBLING_WRAPPERS:
        return False
    state = call.state if isinstance(call.state, dict) else {}
    name = state.get("filename")
    if isinstance(name, bytes):
        name = name.decode("latin-1")

    def unread(why: str) -> None:
        model.evidence.add("joblib.sibling_array", f"{func.name} at byte {call.pos} names the "
                           f"array file {name!r}, {why}: the array is not listed",
                           file=src.path, offset=call.pos)
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name \
            or "\\" in name or "\0" in name:
        return unread("not a plain file name in the pickle's folder")
    folder = os.path.dirname(src.path)
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return unread("which does not exist beside it")
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder or "."):
        return unread("a link out of the pickle's folder (not followed)")
    if func.name == "ZNDArrayWrapper":
        return _zf_sibling(call, state, path, model, copies, unread)
    try:
        sib = model.source(path)
        h = npy_header.parse_header(sib.view(0, sib.size), file=path)
    except (OSError, FormatError) as e:
        return unread(f"which cannot be read ({e})")
    if h.layout != "plain" or h.data_nbytes > sib.size - h.data_start:
        return unread(f"whose {h.layout} array (or its size) is not read in place")
    storage = StorageRef(f"joblib@{call.pos}", h.dtype, h.numel, "numpy", file=path,
                         data_offset=h.data_start, nbytes=h.data_nbytes)
    stride = _fortran_stride(h.shape) if h.fortran_order else contiguous_stride(h.shape)
    return TensorRef(storage, 0, h.shape, stride, h.dtype, pos=call.pos,
                     extras={"joblib_file": name, "order": "F" if h.fortran_order else "C"})


def _zf_sibling(call: Call, state: dict, path: str, model: ModelFile, copies: "_Copies", unread):
    """``ZNDArrayWrapper.read``: ``_reconstruct(*init_args)`` then ``__setstate__(state +
    (read_zfile(sibling),))``; the data are inflated (capped) into a copy."""
    import os
    parts = state.get("state")
    if not (isinstance(parts, tuple) and len(parts) == 4):
        return unread("with an array state that is not (version, shape, dtype, fortran)")
    shape, dt = _shape(parts[1]), _numpy_dtype(parts[2])
    if shape is None or dt is None:
        return unread("holding a non-numeric array (not listed)")
    dtype, order = dt
    data = copies.inflated.get(path)
    if data is None:
        # One budget for every sibling of the pickle: many wrappers cannot multiply the cap.
        budget = compression.INFLATE_MAX - sum(len(d) for d in copies.inflated.values())
        try:
            sib = model.source(path)
            if compression.compression(sib.head(2)) != "zf":
                return unread("which is not a ZF-compressed array file")
            data = copies.inflated[path] = compression.decompress(sib.view(0, sib.size), "zf",
                                                                  path=path, cap=max(budget, 0))
        except (OSError, FormatError) as e:
            return unread(f"which cannot be read ({e})")
    from tensorscope.dtypes import spec
    numel = math.prod(shape)
    if len(data) != numel * spec(dtype).itemsize:
        return unread(f"whose {len(data)} bytes do not hold shape {list(shape)} of {dtype}")
    storage = StorageRef(f"joblib@{call.pos}", dtype, numel, "numpy", file=path, nbytes=len(data))
    copies.add(storage, data, 0, order)
    fortran = parts[3] is True
    stride = _fortran_stride(shape) if fortran else contiguous_stride(shape)
    return TensorRef(storage, 0, shape, stride, dtype, pos=call.pos,
                     extras={"joblib_file": os.path.basename(path), "order": "F" if fortran else "C"})


def _numpy_tensor(call: Call, src: ByteSource, locator: _Locator, model: ModelFile,
                  copies: _Copies) -> TensorRef | None:
    parts = _array_parts(call)
    if parts is None:
        return None
    shape, dtype_call, fortran, raw = parts
    shape = _shape(shape)
    dt = _numpy_dtype(dtype_call)
    if shape is None or dt is None:
        return None  # object arrays, strings, records: stay inert objects
    if isinstance(raw, str):
        # A Python 2 pickle: the data is a py2 ``str`` (BINSTRING), which the VM gives as text
        # when it happens to be valid UTF-8. pickle.load(encoding='latin1') gives latin-1 text
        # and numpy's _reconstruct encodes it back to latin-1: the same bytes as this round trip.
        raw = raw.encode("utf-8")
    if not isinstance(raw, (bytes, bytearray)):
        model.evidence.add("pickle.numpy_unreadable",
                           f"numpy array at byte {call.pos} ({dt[0]}, shape {list(shape)}): its "
                           f"data is a {type(raw).__name__}, not bytes; it is not listed",
                           file=src.path, offset=call.pos)
        return None
    dtype, order = dt
    from tensorscope.dtypes import spec
    numel = math.prod(shape)
    need = numel * spec(dtype).itemsize
    if len(raw) != need:
        model.evidence.add("pickle.numpy_size_mismatch",
                           f"numpy array at byte {call.pos} holds {len(raw)} bytes, its shape "
                           f"{list(shape)} and dtype {dtype} need {need}", file=src.path,
                           offset=call.pos)
        return None
    at = locator.find(raw) if raw else None
    storage = StorageRef(f"pickle@{call.pos}", dtype, numel, "numpy", file=src.path,
                         data_offset=at, nbytes=len(raw))
    if at is None or order == ">":
        # Not a plain little-endian run of bytes in the file: read (a copy) from the value.
        copies.add(storage, bytes(raw), 0, order)
    stride = _fortran_stride(shape) if fortran else contiguous_stride(shape)
    extras = {"numpy_dtype": f"{order}{dtype}", "order": "F" if fortran else "C"}
    return TensorRef(storage, 0, shape, stride, dtype, pos=call.pos, extras=extras)


def _joblib_tensor(array: InlineArray, src: ByteSource,
                   copies: _Copies) -> TensorRef | None:
    """A numeric array joblib wrote inline: a view of its bytes in the file (a copy when
    big-endian). Object, string, record and datetime arrays stay inert (None)."""
    kind = array.typestr.lstrip("<>|=")[:1]
    dtype = NUMPY_DTYPES.get(f"{kind}{array.itemsize}") if kind in "fiucb" else None
    if dtype is None or array.has_objects:
        return None
    numel = math.prod(array.shape)
    storage = StorageRef(f"joblib@{array.wrapper.pos}", dtype, numel, "numpy", file=src.path,
                         data_offset=array.data_offset, nbytes=array.nbytes)
    order = ">" if array.byteorder == ">" else "<"
    if order == ">":
        start = array.data_offset
        copies.add(storage, src.read(start, array.nbytes), 0, order)
    fortran = array.order == "F"
    stride = _fortran_stride(array.shape) if fortran else contiguous_stride(array.shape)
    extras = {"numpy_dtype": f"{order}{dtype}", "order": array.order, "joblib": True}
    return TensorRef(storage, 0, array.shape, stride, dtype, pos=array.wrapper.pos, extras=extras)


# -- torch tensors pickled without torch.save ------------------------------------------------------
def _hooks(src: ByteSource, model: ModelFile, nested: list) -> dict:
    hooks = torch_pickle.rebuild_hooks()
    for key, fn in list(hooks.items()):
        if key[0] == "torch._utils":
            hooks[key] = _tolerant(key, fn, model, src)

    def load_from_bytes(args, pos):
        if len(args) != 1 or not isinstance(args[0], (bytes, bytearray)):
            return Call(Global(*_LOAD_FROM_BYTES, pos), args, None, pos, "REDUCE")
        payload = bytes(args[0])
        try:
            storage, inner = _nested_storage(payload, src, pos)
        except FormatError as e:
            model.evidence.add("pickle.nested_unreadable", f"torch.storage._load_from_bytes at "
                               f"byte {pos}: {e}", file=src.path, offset=pos)
            return Call(Global(*_LOAD_FROM_BYTES, pos), args, None, pos, "REDUCE")
        nested.append((pos, storage, payload, inner))
        return storage

    hooks[_LOAD_FROM_BYTES] = load_from_bytes
    return hooks


def _tolerant(key, fn, model, src):
    """A rebuild hook that leaves the call inert when its storage could not be placed."""
    def hook(args, pos):
        try:
            return fn(args, pos)
        except FormatError as e:
            model.evidence.add("pickle.tensor_not_rebuilt", f"{key[0]}.{key[1]} at byte {pos}: "
                               f"{e.reason}", file=src.path, offset=pos)
            return Call(Global(key[0], key[1], pos), args, None, pos, "REDUCE")
    return hook


def _nested_storage(payload: bytes, src: ByteSource, pos: int):
    """``_load_from_bytes``: the payload is a whole torch.save stream holding one storage."""
    from . import torch_legacy
    inner_src = ByteSource.from_bytes(payload, name=src.path)
    member = f"torch.storage._load_from_bytes@{pos}"
    if not torch_legacy.sniff(payload[:4096], len(payload)):
        raise FormatError("the bytes are not a legacy torch stream", format=FORMAT,
                          file=src.path, member=member)
    inner = torch_legacy.open_stream(inner_src, member=member)
    storage = inner.objects
    if not isinstance(storage, StorageRef):
        raise FormatError(f"the nested stream holds a {type(storage).__name__}, not a storage",
                          format=FORMAT, file=src.path, member=member)
    return storage, inner


def _locate_nested(src: ByteSource, model: ModelFile, nested: list, locator: _Locator,
                   copies: _Copies) -> None:
    for pos, storage, payload, inner in nested:
        at = locator.find(payload)
        for record in inner.evidence.pickles:
            record.role = "nested." + record.role
            record.file = src.path
            if at is not None:
                record.offset += at
        model.evidence.pickles.extend(inner.evidence.pickles)
        for anomaly in inner.evidence.anomalies:
            model.evidence.add(anomaly.kind, anomaly.message, file=src.path,
                               member=anomaly.member, offset=anomaly.offset)
        model.evidence.code.update(inner.evidence.code)
        storage.file = src.path
        if storage.error or storage.data_offset is None:
            continue
        if at is not None:
            storage.data_offset += at     # absolute in the file: zero-copy reads
        else:
            # Latin-1 text in the file (protocols 0-2): readable only from the decoded bytes.
            copies.add(storage, payload, storage.data_offset)
            storage.data_offset = None
