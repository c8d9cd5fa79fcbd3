"""Zero-copy values: numpy views over the memory map, and chunk-wise statistics.

`strided_view` turns a `TensorInfo` into a read-only ``np.ndarray`` that shares memory with the
file's map. `iter_chunks` walks any tensor in bounded-size pieces (for stats, diff, convert), and
`tensor_stats` computes min/max/mean/std/NaN/Inf/zeros in float64 without materialising a copy of
the whole tensor.
"""
from __future__ import annotations

import mmap
import threading
from typing import TYPE_CHECKING

from . import dtypes
from .errors import FormatError
from .lazyimport import lazy_module
from .valuestats import TensorStats, iter_flat_chunks, summarize  # noqa: F401  (part of reader's API)

np = lazy_module("numpy")   # imported by the first value that goes through numpy

if TYPE_CHECKING:
    from .model import ModelFile, TensorInfo

__all__ = ["PageReleaser", "strided_view", "assemble_chunks", "iter_flat_chunks", "TensorStats", "tensor_stats",
           "CHUNK_BYTES"]

CHUNK_BYTES = 16 << 20  # 16 MiB pieces keep peak memory flat whatever the tensor size


def strided_view(model: "ModelFile", info: "TensorInfo") -> np.ndarray:
    """A read-only numpy view of ``info`` over its file's memory map (no copy)."""
    if info.chunks:
        return assemble_chunks(model, info)
    spec = dtypes.spec(info.dtype)
    where = dict(format=info.source_format or "read", file=info.file, member=info.storage_key)
    if info.byte_offset is None:
        raise FormatError(f"tensor {info.name!r} has no stored bytes to read", **where)
    src = model.source(info.file)
    if spec.kind in ("block", "string", "object", "unknown") or spec.packed:
        # No element-wise layout numpy knows: expose the stored bytes.
        raw = src.view(info.byte_offset, info.nbytes, f"tensor {info.name!r}", fmt=where["format"],
                       member=info.storage_key)
        arr = np.frombuffer(raw, dtype=np.uint8)
        return arr
    span = info.span_bytes
    src.view(info.byte_offset, span, f"tensor {info.name!r}", fmt=where["format"],
              member=info.storage_key)
    if info.storage_nbytes is not None and info.numel:
        start_in_storage = info.storage_offset * spec.itemsize
        if start_in_storage + span > info.storage_nbytes:
            raise FormatError(
                f"tensor {info.name!r} needs bytes [{start_in_storage}, {start_in_storage + span}) of its "
                f"storage but the storage record holds {info.storage_nbytes} bytes", **where)
    if spec.name == "complex32":
        np_dtype, itemsize, shape = np.dtype(np.float16), 2, info.shape + (2,)
        strides = tuple(s * 4 for s in info.stride) + (2,)
    else:
        np_dtype, itemsize, shape = spec.numpy, spec.itemsize, info.shape
        strides = tuple(s * itemsize for s in info.stride)
    try:
        if info.numel == 0:
            empty = np.empty(shape, dtype=np_dtype)
            empty.flags.writeable = False  # read-only like every other view
            return empty
        # np.ndarray over the map: shares memory; the map is read-only so the view is too.
        arr = np.ndarray(shape, dtype=np_dtype, buffer=src.raw, offset=info.byte_offset,
                         strides=strides)
    except ValueError as e:  # a dimension numpy cannot index (2^63 x 0, stride-0 giants)
        raise FormatError(f"tensor {info.name!r} of shape {info.shape} cannot be viewed: {e}",
                          **where) from None
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


def assemble_chunks(model: "ModelFile", info: "TensorInfo") -> np.ndarray:
    """Copy a chunked tensor (DCP shards) into one array; each chunk is read through its view.

    Every chunk is viewed (bounds-checked against its file) and placed inside the global shape
    BEFORE the output is allocated, and the chunks must cover every element: the allocation is
    then bounded by bytes that really exist, never by a shape the metadata merely claims.
    """
    spec = dtypes.spec(info.dtype)
    where = dict(format=info.source_format or "read", file=info.file)
    pieces = []
    covered = 0
    for chunk in info.chunks:
        piece = strided_view(model, chunk.tensor)
        if piece.shape != tuple(chunk.sizes) or len(chunk.offsets) != len(info.shape) or any(
                o < 0 or o + s > d for o, s, d in zip(chunk.offsets, chunk.sizes, info.shape)):
            raise FormatError(f"chunk of {info.name!r} at offsets {list(chunk.offsets)} with shape "
                              f"{piece.shape} does not fit the tensor's shape {list(info.shape)}",
                              **where)
        covered += piece.size
        pieces.append((tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes)), piece))
    if covered != info.numel or _boxes_overlap([c for c in info.chunks]):
        raise FormatError(f"the chunks of {info.name!r} hold {covered} elements for its "
                          f"{info.numel}: they overlap or leave holes", **where)
    out = np.empty(info.shape, dtype=spec.numpy if spec.numpy is not None else np.uint8)
    for index, piece in pieces:
        out[index] = piece
    out.flags.writeable = False
    return out


def _boxes_overlap(chunks) -> bool:
    """True when two chunks share an element (pairwise box test; DCP writes few chunks per tensor)."""
    boxes = [(c.offsets, tuple(o + s for o, s in zip(c.offsets, c.sizes))) for c in chunks
             if all(s > 0 for s in c.sizes)]
    for i in range(len(boxes)):
        lo_a, hi_a = boxes[i]
        for lo_b, hi_b in boxes[i + 1:]:
            if all(la < hb and lb < ha for la, ha, lb, hb in zip(lo_a, hi_a, lo_b, hi_b)):
                return True
    return False


def numeric(arr: np.ndarray) -> np.ndarray:
    """A piece converted to float64 (complex: magnitude) for statistics and comparison."""
    if arr.dtype.kind == "c":
        return np.abs(arr).astype(np.float64)
    return arr.astype(np.float64)


def tensor_stats(arr: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> TensorStats:
    """min, max, mean, std (population), NaN/Inf/zero counts over finite values, in one pass
    (`tensorscope.valuestats.summarize`: float64 sums, pieces merged by Chan's update)."""
    return summarize(arr, step_bytes=chunk_bytes).stats()


_PAGE = mmap.PAGESIZE
RELEASE_BEHIND = 2 << 20   # see `PageReleaser.release_piece`: a large folio, at most


class PageReleaser:
    """Drops the pages of a model's memory maps once they have been compared.

    Reading a file through a shared read-only map makes its pages part of our resident set; without
    this, diffing two 2 GB files would end at ~4 GB RSS. ``MADV_DONTNEED`` on such a map only drops
    our mapping of the pages (the page cache keeps them), so a later access re-reads them correctly.
    """

    def __init__(self, model: "ModelFile"):
        self.model = model
        self.maps: dict[str, tuple[mmap.mmap, int]] = {}   # file -> (map, size)
        self.bases: dict[str, int] = {}                      # file -> the map's base address
        self.pending: dict[str, tuple[int, int, int]] = {}      # file -> (lo, hi, bytes) to release
        self.lock = threading.Lock()

    def _map(self, file: str):
        got = self.maps.get(file)
        if got is None:
            src = self.model.sources.get(file)
            raw = getattr(src, "raw", None) if src is not None else None
            if not isinstance(raw, mmap.mmap) or not hasattr(raw, "madvise"):
                return None
            got = self.maps[file] = (raw, len(raw))
        return got

    def _base(self, file: str, raw: mmap.mmap) -> int:
        """The address of ``file``'s map, to place a view's pages in it (numpy tells it: only
        views, which come from numpy, need it)."""
        base = self.bases.get(file)
        if base is None:
            base = self.bases[file] = (np.frombuffer(raw, dtype=np.uint8, count=1).ctypes.data
                                       if len(raw) else 0)
        return base

    def release_range(self, file: str, offset: int, length: int) -> None:
        got = self._map(file)
        if got is None or length <= 0:
            return
        raw, size = got
        lo = max(0, offset) // _PAGE * _PAGE
        hi = min(size, offset + length)
        if hi <= lo:
            return
        try:
            raw.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        except (OSError, ValueError):
            # advice only: a refused hint costs memory, never correctness
            pass

    def release_piece(self, file: str, piece: np.ndarray, behind: int = 0) -> None:
        """Release the pages under ``piece`` when it is a view into ``file``'s map (not a copy),
        and the ``behind`` bytes before it: a fault maps the cached pages around it too (the
        kernel's fault-around, 64 KiB, or a whole large folio), so the first read of a step maps
        again the tail of the step released before it; releasing a step's lead-in as well drops
        those (`RELEASE_BEHIND`), else ~200 KiB per tensor stay mapped and the RSS creeps up."""
        got = self._map(file)
        if got is None:
            return
        raw, size = got
        base = self._base(file, raw)
        addr = piece.__array_interface__["data"][0]
        if base <= addr < base + size:
            lead = min(behind, addr - base)
            self.release_range(file, addr - base - lead, piece.nbytes + lead)

    def release_tensor(self, info: "TensorInfo") -> None:
        if info.byte_offset is not None and info.file:
            self.release_range(info.file, info.byte_offset, info.span_bytes)

    def release_later(self, info: "TensorInfo", batch: int = 8 << 20) -> None:
        """Release a small tensor's pages with its neighbours': one ``madvise`` per ``batch`` bytes
        of small tensors instead of one per tensor (whose shared pages would be faulted again by
        the next). Thread-safe; `flush` releases what is left."""
        if info.byte_offset is None or not info.file:
            return
        with self.lock:
            lo, hi, n = self.pending.get(info.file, (info.byte_offset, 0, 0))
            lo, hi, n = min(lo, info.byte_offset), max(hi, info.byte_offset + info.span_bytes), n + info.span_bytes
            if n < batch:
                self.pending[info.file] = (lo, hi, n)
                return
            self.pending.pop(info.file, None)
        lead = min(lo, RELEASE_BEHIND)   # the tail of the batch before, mapped again by fault-around
        self.release_range(info.file, lo - lead, hi - lo + lead)

    def flush(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, {}
        for file, (lo, hi, _) in pending.items():
            self.release_range(file, lo, hi - lo)
