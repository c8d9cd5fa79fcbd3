"""The streaming safetensors writer: the header as the reference writer makes it, tensors copied from
the input piece by piece (kernel copies, batched preads, or the memory maps), the input hashed
alongside, and the durable finish (fsync, hash patched in place)."""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import operator
import os
import re
import threading
from typing import Callable, Iterator

import numpy as np

from .. import dtypes
from ..errors import FormatError, TensorscopeError
from ..model import ModelFile, TensorInfo
from ..parsers.safetensors import HEADER_LEN
from ..reader import iter_flat_chunks, strided_view
from ..remote import is_url
from .plan import _DTYPE_RANK, _METADATA_KEY, PlannedTensor

_SHA_PLACEHOLDER = "0" * 64   # replaced in place once the hash is known (same length)


class _Hasher(threading.Thread):
    """sha256 of each input file, read sequentially with a small buffer (no mmap: the resident
    set does not grow; hashlib and readinto release the GIL, so this runs beside the copy)."""

    BUF = 1 << 20

    def __init__(self, files: list[str]):
        super().__init__(name="tensorscope-sha256", daemon=True)
        self.files = files
        self.digests: dict[str, str] = {}
        self.error: BaseException | None = None
        self._cancelled = threading.Event()

    def run(self) -> None:
        try:
            buf = bytearray(self.BUF)
            view = memoryview(buf)
            for path in self.files:
                h = hashlib.sha256()
                with open(path, "rb", buffering=0) as f:
                    while not self._cancelled.is_set():
                        n = f.readinto(buf)
                        if not n:
                            break
                        h.update(view[:n])
                self.digests[path] = h.hexdigest()
        except BaseException as e:  # re-raised by result() in the caller's thread
            self.error = e

    def cancel(self) -> None:
        self._cancelled.set()

    def result(self, root: str) -> tuple[str, dict[str, str]]:
        self.join()
        if self.error is not None:
            raise TensorscopeError(f"cannot hash the input: {self.error}") from self.error
        if len(self.files) == 1:
            return self.digests[self.files[0]], dict(self.digests)
        base = root if os.path.isdir(root) else os.path.dirname(root)
        rel = {os.path.relpath(p, base): d for p, d in self.digests.items()}
        manifest = "".join(f"{d}  {p}\n" for p, d in sorted(rel.items()))
        return hashlib.sha256(manifest.encode("utf-8")).hexdigest(), dict(self.digests)


# ------------------------------------------------------------------------------------------------
# Reading values piece by piece
# ------------------------------------------------------------------------------------------------

def _releaser(model: ModelFile):
    from ..reader import PageReleaser
    return PageReleaser(model)


def _chunked_pieces(model: ModelFile, info: TensorInfo, chunk_bytes: int) -> Iterator[np.ndarray]:
    """A chunked tensor (DCP) in C order, assembled one block of leading rows at a time."""
    spec = dtypes.spec(info.dtype)
    where = dict(format=info.source_format or "convert", file=info.file)
    shape = info.shape
    views = []
    for c in info.chunks:
        if len(c.offsets) != len(shape) or len(c.sizes) != len(shape) or any(
                o < 0 or s < 0 or o + s > d for o, s, d in zip(c.offsets, c.sizes, shape)):
            raise FormatError(f"chunk of {info.name!r} at {list(c.offsets)} size {list(c.sizes)} "
                              f"lies outside the tensor's shape {list(shape)}", **where)
        v = strided_view(model, c.tensor)
        if v.shape != tuple(c.sizes):
            raise FormatError(f"chunk of {info.name!r} at {list(c.offsets)} has shape "
                              f"{list(v.shape)}, expected {list(c.sizes)}", **where)
        views.append((c, v))
    if not shape:
        block = np.zeros((), dtype=spec.numpy)
        for _, v in views:
            block[()] = v
        yield block.reshape(1)
        return
    row_bytes = math.prod(shape[1:]) * spec.itemsize
    rows = max(1, chunk_bytes // max(row_bytes, 1))
    for r0 in range(0, shape[0], rows):
        r1 = min(shape[0], r0 + rows)
        block = np.zeros((r1 - r0,) + shape[1:], dtype=spec.numpy)  # holes read as 0, as assemble_chunks
        for c, v in views:
            lo, hi = max(r0, c.offsets[0]), min(r1, c.offsets[0] + c.sizes[0])
            if lo >= hi:
                continue
            dst = (slice(lo - r0, hi - r0),) + tuple(slice(o, o + s) for o, s in
                                                     zip(c.offsets[1:], c.sizes[1:]))
            block[dst] = v[lo - c.offsets[0]:hi - c.offsets[0]]
        yield block.reshape(-1)


def _pieces(model: ModelFile, info: TensorInfo, chunk_bytes: int, release) -> Iterator[np.ndarray]:
    """The tensor's bytes in C order as contiguous little-endian 1-D pieces."""
    if info.chunks:
        yield from _chunked_pieces(model, info, chunk_bytes)
        return
    arr = model.read(info)
    for piece in iter_flat_chunks(arr, chunk_bytes):
        if piece.dtype.byteorder == ">":  # big-endian NumPy data: safetensors is little-endian
            piece = piece.astype(piece.dtype.newbyteorder("<"))
        yield piece
        release(info.file, piece)


# ------------------------------------------------------------------------------------------------
# Writing one safetensors file
# ------------------------------------------------------------------------------------------------

def _data_order(tensors: list[PlannedTensor]) -> list[PlannedTensor]:
    """safetensors' own order: dtype (enum rank) descending, then name ascending (bytewise UTF-8,
    which is code point order)."""
    by_dtype: dict[str, list[PlannedTensor]] = {}
    for t in tensors:
        group = by_dtype.get(t.st_dtype)
        if group is None:
            by_dtype[t.st_dtype] = [t]
        else:
            group.append(t)
    ordered: list[PlannedTensor] = []
    for st in sorted(by_dtype, key=_DTYPE_RANK.__getitem__, reverse=True):
        ordered += sorted(by_dtype[st], key=_BY_NAME)
    return ordered


_BY_NAME = operator.attrgetter("info.name")


# Characters json.dumps(ensure_ascii=False) escapes in a string; a name without any is written
# as itself between quotes (names are valid UTF-8 by then: `_check_names`).
_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')


def _header(ordered: list[PlannedTensor], metadata: dict[str, str] | None) -> bytes:
    # Built from columns as text: the same bytes as json.dumps of the whole object (the same
    # C encoder writes the metadata and any name that needs escaping), without 100,000 dicts
    # and lists to walk. Each distinct shape and dtype is formatted once.
    enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    plain = not _JSON_ESCAPED.search("".join([t.info.name for t in ordered]))
    shapes: dict[tuple[int, ...], str] = {}
    heads: dict[str, str] = {}
    parts = [f"{enc(_METADATA_KEY)}:{enc(metadata)}"] if metadata else []
    begin = 0
    for t in ordered:
        name, end = t.info.name, begin + t.info.nbytes
        shape = shapes.get(t.st_shape)
        if shape is None:
            shape = shapes[t.st_shape] = ",".join(map(str, t.st_shape))
        head = heads.get(t.st_dtype)
        if head is None:
            head = heads[t.st_dtype] = f':{{"dtype":{enc(t.st_dtype)},"shape":['
        key = f'"{name}"' if plain else enc(name)
        parts.append(f'{key}{head}{shape}],"data_offsets":[{begin},{end}]}}')
        begin = end
    text = ("{" + ",".join(parts) + "}").encode("utf-8")
    pad = (8 - len(text) % 8) % 8  # data starts on a multiple of 8, as the reference writer pads
    return HEADER_LEN.pack(len(text) + pad) + text + b" " * pad


class _Sink:
    """The output file: plain writes, kernel-side copies, and early writeback.

    Contiguous tensors stored plainly in a file are copied by ``os.copy_file_range`` (the kernel
    moves the bytes page cache to page cache: no page faults on our maps, no user-space copy);
    when the kernel or filesystem refuses it, the bytes go through the memory map instead.
    Every `WRITEBACK_STEP` bytes, writeback of what is already written is started
    (``POSIX_FADV_DONTNEED`` starts it without waiting), so the final fsync has only the tail
    left to wait for and the output does not crowd the page cache.

    Small tensors (below `GATHER_BELOW` bytes) are gathered: read with ``os.pread`` (no map
    either) into one buffer written every `GATHER_STEP` bytes, so a checkpoint of 100,000 small
    tensors costs a few hundred writes instead of 100,000 kernel copies.
    """

    WRITEBACK_STEP = 64 << 20
    GATHER_BELOW = 256 << 10
    GATHER_STEP = 4 << 20
    GATHER_GAP = 4 << 10

    def __init__(self, path: str, advance: Callable[[int], None]):
        self.f = open(path, "xb", buffering=0)
        self.fd = self.f.fileno()
        self.pos = 0
        self.synced = 0  # writeback started up to here
        self.advance = advance
        self.can_copy = hasattr(os, "copy_file_range")
        self.sources: dict[str, int] = {}
        self.gathered = bytearray()  # read, accounted, not yet written
        self.run: list[tuple[int, int]] = []  # (offset, length) to gather, not yet read
        self.run_file: str | None = None      # ... all from this file, in [run_start, run_end)
        self.run_start = self.run_end = self.pending = 0

    def _fd(self, file: str) -> int:
        src = self.sources.get(file)
        if src is None:
            src = self.sources[file] = os.open(file, os.O_RDONLY)
        return src

    def flush(self) -> None:
        """Write the gathered bytes (before any other write or copy: the file position moves)."""
        if self.run:
            self._read_run()
        if self.gathered:
            view = memoryview(self.gathered)
            done = 0
            while done < len(view):
                done += self.f.write(view[done:])
            view.release()
            self.gathered.clear()

    def gather(self, file: str, offset: int, length: int) -> None:
        """Append ``length`` bytes of ``file`` at ``offset`` (inside the file: checked by the
        caller) to the buffer; written at the next `flush`. Tensors that follow each other in
        the file, a few bytes apart (a zip's local headers), are read with one ``pread``."""
        gap = offset - self.run_end
        if file == self.run_file and 0 <= gap <= self.GATHER_GAP and \
                offset + length - self.run_start <= self.GATHER_STEP:
            self.run.append((offset, length))
            self.run_end = offset + length
        else:
            if self.run:
                self._read_run()
            self.run_file, self.run_start, self.run_end = file, offset, offset + length
            self.run.append((offset, length))
        self.pending += length  # accounted (position, progress, writeback) once read

    def _read_run(self) -> None:
        file, start, end, run = self.run_file, self.run_start, self.run_end, self.run
        data = os.pread(self._fd(file), end - start, start)
        if len(data) != end - start:
            raise TensorscopeError(f"{file}: read {len(data)} bytes at offset {start}, expected "
                                   f"{end - start} (the file changed while it was converted?)")
        if len(run) == 1:
            self.gathered += data
            n = len(data)
        else:
            view = memoryview(data)
            gathered = self.gathered
            n = 0
            for offset, length in run:
                gathered += view[offset - start:offset - start + length]
                n += length
            view.release()
        run.clear()
        self.run_file = None
        self.pending = 0
        self._account(n)
        if len(self.gathered) >= self.GATHER_STEP:
            self.flush()

    def tell(self) -> int:
        """Bytes of the output so far, counting those gathered but not read yet."""
        return self.pos + self.pending

    def _account(self, n: int) -> None:
        self.pos += n
        self.advance(n)
        if self.pos - self.synced >= self.WRITEBACK_STEP and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(self.fd, self.synced, self.pos - self.synced, os.POSIX_FADV_DONTNEED)
            except OSError:
                # advice only
                pass
            self.synced = self.pos

    def write(self, data) -> None:
        self.flush()
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += self.f.write(view[done:])
        self._account(len(view))

    def copy(self, file: str, offset: int, length: int) -> int:
        """Copy up to ``length`` bytes of ``file`` from ``offset``; returns how many were copied
        (fewer, down to 0, when the kernel refuses: the caller writes the rest)."""
        if not self.can_copy:
            return 0
        self.flush()
        src = self._fd(file)
        done = 0
        while done < length:
            try:
                n = os.copy_file_range(src, self.fd, min(length - done, self.WRITEBACK_STEP),
                                       offset + done)
            except OSError:
                self.can_copy = False  # EXDEV, EINVAL, ENOSYS, EOPNOTSUPP: use plain writes
                break
            if n <= 0:
                break
            done += n
            self._account(n)
        return done

    def close(self) -> None:
        """Close (after `flush` on success; on failure the gathered bytes are dropped with the
        temporary file)."""
        for fd in self.sources.values():
            os.close(fd)
        self.sources.clear()
        self.f.close()


def _plain_range(model: ModelFile, info: TensorInfo,
                 layouts: dict | None = None) -> tuple[str, int] | None:
    """``(file, offset)`` when the tensor's bytes are exactly ``nbytes`` contiguous bytes of a
    file on disk, in the order safetensors wants; None otherwise. ``layouts`` caches, across
    the calls for one file, what repeats: by (shape, stride) whether the layout is contiguous
    and not empty, by file its source when that is a file on disk (else None)."""
    if info.chunks or info.byte_offset is None or info.name in model.custom_readers:
        return None
    if layouts is None:
        layouts = {}
    key = (info.shape, info.stride)
    plain_layout = layouts.get(key)
    if plain_layout is None:
        plain_layout = layouts[key] = bool(info.numel) and info.is_contiguous
    if not plain_layout:
        return None
    src = layouts.get(info.file, False)
    if src is False:  # an in-memory blob or a URL is not a file
        src = model.source(info.file)
        src = layouts[info.file] = src if isinstance(src.raw, mmap.mmap) and not is_url(src.path) else None
    if src is None:
        return None
    itemsize = _PLAIN_ITEMSIZE.get(info.dtype, -1)
    if itemsize == -1:
        itemsize = _plain_itemsize(info.dtype)
    if itemsize is None:
        arr = model.read(info)  # the reader's own bounds checks; touches no tensor byte
        return None if arr.dtype.byteorder == ">" else (info.file, info.byte_offset)
    # What `reader.strided_view` checks for a contiguous tensor, without building the view
    # (this runs once per tensor): inside the file, and inside its storage record.
    offset, n = info.byte_offset, info.nbytes
    if offset < 0 or n > src.size - offset:
        src.check(offset, n, f"tensor {info.name!r}", fmt=info.source_format or "read",
                  member=info.storage_key)  # raises, with the reader's message
    if info.storage_nbytes is not None:
        start = info.storage_offset * itemsize
        if start + n > info.storage_nbytes:
            raise FormatError(
                f"tensor {info.name!r} needs bytes [{start}, {start + n}) of its storage "
                f"but the storage record holds {info.storage_nbytes} bytes",
                format=info.source_format or "read", file=info.file, member=info.storage_key)
    return info.file, offset


_PLAIN_ITEMSIZE: dict[str, int | None] = {}


def _plain_itemsize(dtype: str) -> int | None:
    """Bytes per element of a dtype whose contiguous bytes are its values as numpy views them,
    None for the others (packed, block, strings, objects, complex32: the reader decides)."""
    if dtype not in _PLAIN_ITEMSIZE:
        spec = dtypes.spec(dtype)
        plain = not (spec.numpy_name is None or spec.kind in ("block", "string", "object")
                     or spec.packed or spec.name == "complex32")
        _PLAIN_ITEMSIZE[dtype] = spec.itemsize if plain else None
    return _PLAIN_ITEMSIZE[dtype]


def _write_file(path: str, model: ModelFile, ordered: list[PlannedTensor], metadata: dict[str, str],
                chunk_bytes: int, release, advance: Callable[[int], None]) -> int:
    """Write one safetensors file (header with a placeholder hash); returns the header size."""
    header = _header(ordered, metadata)
    sink = _Sink(path, advance)
    layouts: dict = {}
    try:
        sink.write(header)
        for t in ordered:
            start = sink.tell()
            plain = _plain_range(model, t.info, layouts)
            if plain is None:
                for piece in _pieces(model, t.info, chunk_bytes, release):
                    raw = piece.view(np.uint8) if piece.dtype != np.uint8 else piece
                    sink.write(np.ascontiguousarray(raw))
            elif t.nbytes < sink.GATHER_BELOW:
                sink.gather(plain[0], plain[1], t.nbytes)
            else:
                copied = sink.copy(plain[0], plain[1], t.nbytes)
                if copied < t.nbytes:  # the kernel refused part: the rest through the map
                    src = model.source(plain[0])
                    rest = src.view(plain[1] + copied, t.nbytes - copied, f"tensor {t.name!r}")
                    for i in range(0, len(rest), chunk_bytes):
                        sink.write(rest[i:i + chunk_bytes])
                    release(plain[0], model.read(t.info))
            if sink.tell() - start != t.nbytes:  # a reader bug must never become a shifted file
                raise TensorscopeError(f"tensor {t.name!r}: wrote {sink.tell() - start} bytes, "
                                       f"expected {t.nbytes}")
        sink.flush()
    finally:
        sink.close()
    return len(header)


def _patch_hash(path: str, header_len: int, old: bytes, new: bytes) -> None:
    with open(path, "r+b") as f:
        head = f.read(header_len)
        at = head.find(old)
        if at < 0 or len(old) != len(new):
            raise TensorscopeError(f"{path}: hash placeholder not found in the header")
        f.seek(at)
        f.write(new)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        # some filesystems refuse fsync on folders; the files themselves are synced
        pass
    finally:
        os.close(fd)


def _fsync_file(path: str) -> None:
    with open(path, "r+b") as f:
        os.fsync(f.fileno())
