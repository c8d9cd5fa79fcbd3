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

A whole model file through one of these compressors (``model.pt.gz``, a legacy ``.pkl.gzip``,
``model.safetensors.gz``, ``arrays.npy.gz``) is opened here too: the decompressed payload goes to the
parser whose signature it carries (one layer only), and the model keeps that format's name.

Reading: the pickle VM runs with `build_hooks`, which skip (and place) each wrapper's bytes
exactly as joblib's unpickler reads them. Uncompressed files are opened by `plain_pickle` (listed
zero-copy at their absolute offsets); compressed ones by `open_source` here: decompressed into
memory (capped at `INFLATE_MAX`), listed with ``byte_offset`` None, and read through copying
custom readers.

Public: ``FORMAT``, ``sniff(head, size)``, ``open_source(src)``; the inline-array layout lives in
`joblib_arrays` (`build_hooks`, `InlineArray`, `ARRAY_WRAPPERS`), the sniffer and the bounded
decompressor in `compression` (`compression`, `decompress`, `zf_data_offset`, `INFLATE_MAX`);
both are re-exported here.
"""
from __future__ import annotations

import dataclasses

from tensorscope.errors import FormatError, LimitExceeded, UnknownFormat
from tensorscope.model import ModelFile, PickleRecord
from tensorscope.source import ByteSource

from . import plain_pickle
from .compression import INFLATE_MAX, compression, decompress, zf_data_offset
from .joblib_arrays import ARRAY_WRAPPERS, InlineArray, build_hooks

__all__ = ["FORMAT", "sniff", "open_source", "build_hooks", "InlineArray", "ARRAY_WRAPPERS",
           "compression", "decompress", "zf_data_offset", "INFLATE_MAX"]

FORMAT = "joblib"


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
    return _inner_parser(inner[:4096], len(inner)) is not None


def _inner_parser(head: bytes, size: int):
    """The parser for a decompressed payload: a model file gzipped as a whole (``model.pt.gz``,
    ``model.safetensors.gz``, a legacy torch stream) is that format inside, else a pickle. One
    layer only: a compressed stream inside is not inflated again (no nested bombs)."""
    from tensorscope.formats import FILE_PARSERS, _parser
    for name in FILE_PARSERS:
        if name in ("joblib_fmt", "plain_pickle"):
            continue
        mod = _parser(name)
        if mod.sniff(head, size):
            return mod
    return plain_pickle if plain_pickle.sniff(head, size) else None


def open_source(src: ByteSource) -> ModelFile:
    """Decompress (capped) and list the pickle inside; values are read from the decompressed
    copy (``byte_offset`` None: nothing in the file is a plain view of them)."""
    head = src.head(64)
    kind = compression(head)
    if kind is None:
        raise FormatError("not a compressed joblib stream", format=FORMAT, file=src.path, offset=0)
    payload = decompress(src.view(0, src.size), kind, path=src.path)
    # The scanner's name for a decompressed stream, so that it reuses this run (zf holds zlib).
    member = "<zlib>" if kind == "zf" else f"<{kind}>"
    inner_src = ByteSource.from_bytes(payload, name=src.path)
    # A compressed model file (``model.pt.gz``: torch.load(gzip.open(f)) reads it) is that
    # format inside: a legacy stream read as one pickle would list nothing after the magic.
    inner_head = bytes(payload[:4096])
    inner_parser = _inner_parser(inner_head, len(payload))
    if inner_parser is None and inner_head[257:262] == b"ustar":
        # a tarball (a NeMo .nemo, a .tar.gz of a model folder): no loader here reads it whole;
        # `tensorscope scan` walks its members
        raise UnknownFormat(f"{src.path}: a {kind}-compressed tar archive, not a model file "
                            "this tool lists (`tensorscope scan` reads its members)")
    inner_parser = inner_parser or plain_pickle
    try:
        inner = inner_parser.open_source(inner_src)
    except FormatError as e:
        if e.member is None:
            e.member = member
            e.args = (e._render(),)
        raise
    # values come from the decompressed copy: never from the (compressed) file of that name
    inner.sources[src.path] = inner_src
    fmt = FORMAT if inner_parser is plain_pickle else inner.format
    model = ModelFile(fmt, src.path, sources={src.path: src}, objects=inner.objects)
    model.sources[member] = inner_src
    for rec in inner.evidence.pickles:   # members of an inner archive as the scanner names them
        model.evidence.pickles.append(PickleRecord(src.path, _joined(member, rec.member),
                                                   rec.offset, rec.length, rec.result, role=rec.role))
    for a in inner.evidence.anomalies:
        model.evidence.add(a.kind, a.message, file=src.path, member=_joined(member, a.member),
                           offset=a.offset)
    for t in inner.tensors:
        extras = {**t.extras, "compression": kind, "decompressed_offset": t.byte_offset}
        info = dataclasses.replace(t, byte_offset=None, file=src.path, source_format=fmt,
                                   extras=extras)
        model.tensors.append(info)
        model.custom_readers[info.name] = _copying_reader(inner, t)
    model.metadata = {**inner.metadata, "compression": kind, "decompressed_bytes": len(payload),
                      "compressed_bytes": src.size}
    return model


def _joined(stream: str, member: str | None) -> str:
    return f"{stream}!{member}" if member else stream


def _copying_reader(inner: ModelFile, t):
    def read():
        """A copy of the values from the decompressed stream."""
        out = inner.read(t).copy()
        out.flags.writeable = False
        return out
    return read
