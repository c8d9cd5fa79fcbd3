"""Compare two models of any formats, tensor by tensor, down to the values, in bounded memory.

`diff_models(a, b)` aligns the tensors of two `ModelFile`s by name, finds the names that only a
wrapper prefix or a rename separates, and compares every aligned pair: dtype, shape, layout, and
the values themselves. The models may be of different formats (a ``.pt`` against its
``.safetensors`` conversion): what is compared is what a loader would return.

Alignment (in this order; every step is reported, none is silent):

1. ``strip_prefix``: each given prefix is removed from the names of both sides that start with it.
2. Wrapper prefixes (``detect_prefix``): training tools prefix every key (``module.`` from DDP,
   ``_orig_mod.`` from ``torch.compile``, ``model.`` from a Lightning module). When every name of a
   side shares a leading dotted prefix and removing it matches strictly more names than before,
   it is removed and reported in ``DiffResult.prefix_a`` / ``prefix_b``.
3. ``maps``: ``(OLD, NEW)`` rewrites a leading ``OLD`` into ``NEW`` (the first map that applies),
   on both sides, so that both end up in one vocabulary. Step 2 scores prefixes with the maps
   applied.
4. Tied weights: a name that only one side has, but whose bytes are those of another tensor of
   that side (same file, offset, dtype, shape and strides: GPT-2's ``lm_head.weight`` over
   ``transformer.wte.weight`` in a transformers ``.bin``) that the other side has, is one tensor
   stored once by the other side (safetensors saves drop tied names; loaders tie them back). It
   is compared with that tensor and, when equal, is "same" with a ``tied to ...`` change.
5. Renames (``detect_renames``): a removed and an added tensor with the same dtype, shape and
   size whose bytes hash alike (BLAKE2b, streamed) are one tensor under a new name ("renamed").
   Only candidates of equal (dtype, shape) are ever read.
6. Packed parameters: torch.ao's quantized Linear keeps ``X._packed_params._packed_params.0`` and
   ``.1``, which a loader returns as ``X.weight`` and ``X.bias``: those names, where the other side
   has them (`diff_align.unpack_keys`, applied right after the maps).
7. Fused projections (`tensorscope.diff_fused`): a ``qkv_proj`` (``query_key_value``, ``Wqkv``
   ...) that only one side has, against the split parts only the other side has, when the rows
   add up: each part is compared with its rows of the fused tensor.

Per aligned pair:

- ``dtype``, ``shape`` differences are structural changes ("changed"). Shapes that differ get no
  value comparison.
- ``stride`` differences (compared over dimensions of size > 1) are a layout change: they are listed
  in ``changes`` but leave the status "same" when the values are the same, since a loader returns
  the same logical tensor.
- Values, same dtype and shape: the stored bytes are compared first, chunk by chunk, in logical C
  order (memory-compare speed, no float conversion). Identical bytes mean "same"
  (``identical_bytes=True``, ``compared_as="bytes"``; the float statistics are 0 and ``cosine`` is
  None because nothing was converted). Otherwise, and whenever the dtypes differ, both sides are
  streamed in lockstep and compared in float64 (complex128 when either side is complex).
- Block-quantized (GGUF ``q4_k`` ...), packed sub-byte (``int4``, ``float4_e2m1fn`` ...) and torch
  quantized (``qint8`` ...) dtypes are compared by their DECODED values (`tensorscope.dequant`,
  float32 widened to float64, streamed in pieces of whole blocks): between two such tensors whose
  bytes differ, and between such a tensor and any numeric dtype (a float16 model against its Q4_K
  quantization). Identical bytes of one dtype stay "same" without decoding, except for torch
  quantized tensors whose scale or zero point differ. Dtypes that cannot be decoded (GGUF grid
  i-quants ...), complex32, string and object dtypes are compared by bytes only:
  ``identical_bytes`` is set, the statistics are None.
- Tensors without readable values (meta tensors) get ``values=None``.

Statistics (over positions where both values are finite; NaN and Inf are counted apart):

- ``max_abs`` = max |a-b| (equals torch's ``(a.double()-b.double()).abs().max()`` without NaN/Inf);
- ``max_rel`` = max |a-b|/|b| over the positions where b != 0. Exact zeros of the reference B are
  left out (|a-b|/0 is inf on every pruned or zero-initialised tensor and says nothing) and
  counted apart: ``zero_ref`` = positions where b == 0 and a != 0 (torch.testing likewise
  documents its own choice for zeros). 0.0 when nothing differs; None when B is 0 wherever they
  differ;
- ``mean_abs`` = mean |a-b|; ``rms`` = sqrt(mean |a-b|^2);
- ``norm_a``, ``norm_b``, ``norm_diff`` = ‖A‖₂, ‖B‖₂, ‖B−A‖₂; ``rel_change`` = ‖B−A‖₂ / ‖A‖₂ (0.0
  when nothing differs, None when A is all zero): "how much did this tensor change";
- ``cosine`` = sum(a*b) / (|a| |b|) (complex: the real part of sum(conj(a)*b)); None when a side is
  all zero or nothing is finite;
- ``mismatched`` = positions where ``torch.isclose(a, b, rtol, atol, equal_nan=False)`` is false in
  float64: not (a == b or (|a-b| finite and |a-b| <= atol + rtol*|b|)). NaN never matches (not
  even NaN), so ``mismatched`` includes ``nan_mismatch`` (positions where either side is NaN) and
  ``inf_mismatch`` (positions with an Inf on a side, no NaN, and a != b);
- the status is "changed" with "values" in ``changes`` when ``mismatched > 0`` (or, for bytes-only
  dtypes, when the bytes differ). Bytes that differ within tolerance (-0.0 against 0.0, a tiny
  perturbation) keep the status "same", with ``identical_bytes=False`` and the statistics shown.
  `reason` says why a pair is listed as it is, in words, for the CLI and the TUI alike.

Identical bytes are not converted: their differences are 0 and their norms and cosine are None,
unless ``norms=True`` (then ‖A‖ is summed while their bytes are compared, and cosine is 1.0).

How it runs. Every numeric pair whose bytes differ (the byte comparison looks at the first
`PROBE_BYTES` before whole pieces: a fine-tune differs there) goes through one fused pass per
piece: both sides converted once into float64 (exact from every stored dtype, so max_abs and the
counts equal torch's float64 figures exactly, the sums to ~1e-12; float16 by integer passes,
`_half_fast`), then four BLAS dot products (a·a, b·b, a·b, d·d) and |d| reused for the max, the
sum, the relative difference and the tolerance test (`_Accumulator`, which says why not float32).
Pairs of `PARALLEL_ELEMS` elements or more are split into slices over a thread pool of one thread
per core (numpy and BLAS release the GIL) whose BLAS is pinned to one thread, so its pieces can be
`POOL_ELEMS` long (an eighth of the calls, the GIL hand-overs and the call overhead of
`FLOAT_ELEMS`, the size the caller's thread keeps below OpenBLAS's threading threshold); scratch
buffers are made once per thread. Each slice asks the kernel for its next `RELEASE_BYTES`
(``MADV_WILLNEED``) while it computes the current ones and releases the pages behind it
(``MADV_DONTNEED`` on the read-only map); the slices' sums are folded in slice order, so the
figures do not depend on timing. Where `pip install` built it, the compiled pass
(`_diffkernel.c`) replaces the numpy passes: one call per step of any length, with an AVX-512
route that divides only where a new largest ratio may be (0.45 ns per float16 pair on one core in
cache, 0.62 streaming from memory, against 0.97 for its portable loop and 3.6 for numpy). Large
pairs (`SMALL_BYTES` and up) are compared `LANES` at a time, each in a lane thread of its own, so
that one pair's set-up (views, byte probe, slicing) runs while the pool computes the other's
slices; entries keep A's order. The values are read through the maps: ``pread`` into
cache-sized buffers was measured and costs more here (the copy out of the page cache, 0.48 s of
system time on the 2 x 2 GB pair, against 0.27 s for faulting the pages in, many as 2 MiB
mappings, and releasing them). Small pairs (under `SMALL_BYTES`) whose stored bytes are plain
are compared as two byte strings with their pages released in batches: the per-pair cost that
dominates checkpoints of 100,000 small expert tensors. With ``norms=True`` an identical pair's
‖A‖ is summed during its byte comparison, so it is read once. A pair of one dtype the compiled
pass reads as stored, stored plainly in local maps and under `PARALLEL_ELEMS` elements, is
compared in one compiled call on the map's bytes, its rank sample copied out in the same call
(`_direct`): no numpy view, copy or import. numpy (~50 ms to import, more than the rest of a small
diff) is imported by the first pair that needs it (`tensorscope.lazyimport`).

Where it changed (`group_changes`): entries grouped by `tensorscope.grouping.layer_key`
(``model.layers.3``) or `module_key` (``self_attn.q_proj``), norms added as sums of squares over
the group's pairs (never a mean of ratios): ``rel_change`` = sqrt(Σ‖B−A‖²) / sqrt(Σ‖A‖²), ranked.
Run the diff with ``norms=True`` so that identical tensors count in the denominators.

Verdicts (`tensorscope.diff_verdict`): how each tensor of B relates to A's (identical, cast,
quantized, pruned, low-rank update ...) and one sentence for the pair, each with its evidence.

Exit code: 0 when every tensor is "same" (after prefix stripping), 1 otherwise; when the caller
gave atol or rtol, a pair whose values are all within that tolerance is not a difference even
when its dtypes differ (its verdict's ``rule`` says which test it met). Metadata
differences (format names, versions, safetensors ``__metadata__``) are reported, never counted:
``model.metadata`` is flattened to dotted keys (``producer.version``); between two files of one
format every key present on either side is compared, between two formats only the keys both have
(plus a ``format`` row). `PER_SAVE_KEYS` (torch's ``serialization_id`` and ``archive_prefix``)
differ between any two saves: they are flagged ``per_save`` and the CLI shows them only with -v.

Memory stays flat: values are read through zero-copy views piece by piece into reused buffers,
and pages of the memory maps that were compared are handed back to the kernel as the walk goes,
so the resident set does not grow with the files (``benchmarks/bench_diff.py``).

The JSON document and the result records live in `tensorscope.diff_result` (schema there);
alignment by name in `tensorscope.diff_align`; fused projections in `tensorscope.diff_fused`;
verdicts in `tensorscope.diff_verdict` and `tensorscope.lowrank`.
"""
from __future__ import annotations

import bisect
import functools
import gc
import math
import mmap
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Iterator, Sequence

from . import dtypes, lowrank
from .diff_align import (PER_SAVE_KEYS, _keyed, _map, _metadata_diff, _strip_user, _tied,
                         detect_prefixes, unpack_keys)
from .diff_fused import fused_matches
from .diff_result import (GROUP_BY, SCHEMA, STATUSES, DiffResult, GroupChange, TensorDiff,
                          ValueDiff, group_changes, ranked, reason)
from .diff_verdict import aligned_pieces, judge, judge_all, pair_verdict, rank_candidate
from .errors import TensorscopeError
from .lazyimport import lazy_module
from .model import ModelFile, TensorInfo, contiguous_stride
from .native import optional_extension
from .reader import PageReleaser, iter_flat_chunks

np = lazy_module("numpy")   # imported by the first value that goes through numpy

__all__ = ["ValueDiff", "TensorDiff", "DiffResult", "GroupChange", "diff_models", "compare_values",
           "detect_prefixes", "group_changes", "ranked", "reason", "STATUSES", "SCHEMA", "GROUP_BY",
           "PER_SAVE_KEYS"]


# Kinds whose elements numpy can convert to float64 one by one.
_NUMERIC_KINDS = ("float", "int", "uint", "bool", "complex")
FLOAT_ELEMS = 8192       # elements per float64 step on the caller's thread: below OpenBLAS's
                         # threshold (10,000) for starting its own threads on a dot product
POOL_ELEMS = 65536       # elements per step on the pool's threads, whose BLAS is pinned to one
                         # thread (`_blas_single_thread`): an eighth of the per-call overhead of
                         # 8,192 (and of the GIL hand-overs between the threads); 512 KiB buffers
                         # spill from L2 to L3, which measured cheaper than 8x the calls
PARALLEL_ELEMS = 1 << 20  # pairs this large are split across the thread pool
SLICES_PER_WORKER = 1     # ... in this many slices per pool thread (the lanes keep its queue full;
                          # with three lanes and 16 MiB steps, 1 measured 14% faster than 2 on the
                          # all-changed 2 GB pair: the fewest hand-overs)
RELEASE_BYTES = 16 << 20  # read ahead / release behind in steps of this many stored bytes
SMALL_BYTES = 64 << 10    # pairs below this compare as byte strings and release in batches
PROBE_BYTES = 64 << 10    # the byte comparison looks at this many first bytes before whole pieces


# ------------------------------------------------------------------------------------------------
# Streaming comparison
# ------------------------------------------------------------------------------------------------

def _numeric(t: TensorInfo) -> bool:
    s = dtypes.spec(t.dtype)
    return s.kind in _NUMERIC_KINDS and not s.packed and s.numpy_name is not None


def _decodable(t: TensorInfo) -> bool:
    """Decoded values exist for ``t`` (a block, packed or torch quantized dtype we can decode) and
    have ``t``'s own shape. (`dequant.is_decoded`'s test first: plain dtypes, every pair of a
    fine-tune, never import `dequant`.)"""
    s = dtypes.spec(t.dtype)
    if not (s.kind in ("block", "quantized") or s.packed):
        return False
    from . import dequant
    if not dequant.is_decoded(t.dtype) or dequant.decoded_shape(t) != t.shape:
        return False
    return s.kind != "block" or t.dtype in dequant.DECODABLE_BLOCK_TYPES


def _same_qparams(ta: TensorInfo, tb: TensorInfo) -> bool:
    """Identical stored bytes mean identical values unless torch quantization parameters differ."""
    if dtypes.spec(ta.dtype).kind != "quantized":
        return True
    keys = ("qscheme", "scale", "zero_point", "scales", "zero_points", "axis")
    if str(ta.extras.get("qscheme", "")).startswith("per_channel"):
        return False  # the parameters live in storages: compare the decoded values
    return all(ta.extras.get(k) == tb.extras.get(k) for k in keys)


def _as_bytes(piece: np.ndarray) -> np.ndarray:
    return piece.view(np.uint8) if piece.dtype != np.uint8 else piece


def _equal_bytes(pa: np.ndarray, pb: np.ndarray) -> bool:
    """Byte equality of two contiguous 1-D pieces: the compiled pass's memcmp (no temporary, the
    GIL released), else numpy on 8-byte words when the size allows (an eighth of the temporary,
    and faster)."""
    ua, ub = _as_bytes(pa), _as_bytes(pb)
    if _KERNEL is not None:
        return _KERNEL.equal(ua, ub)
    if ua.size % 8 == 0 and ua.size:
        ua, ub = ua.view(np.uint64), ub.view(np.uint64)
    return bool(np.array_equal(ua, ub))


@functools.lru_cache(maxsize=4096)
def _plain(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """C-contiguous strides (cached: a checkpoint has few distinct shapes)."""
    return all(d <= 1 or s == c for d, s, c in zip(shape, stride, contiguous_stride(shape)))


class _Pages(PageReleaser):
    """`PageReleaser` that also reads ahead (``MADV_WILLNEED`` on the next piece while this one is
    computed, so a cold file is read by the kernel in parallel with the arithmetic), releases
    small tensors in batches, and hands out a small tensor's stored bytes directly."""

    def __init__(self, model: ModelFile):
        super().__init__(model)
        self.pending: dict[str, tuple[int, int, int]] = {}  # file -> (lo, hi, bytes) to release

    def prefetch_range(self, file: str, offset: int, length: int) -> None:
        got = self._map(file)
        if got is None or length <= 0:
            return
        raw, size = got
        lo = max(0, offset) // mmap.PAGESIZE * mmap.PAGESIZE
        hi = min(size, offset + length)
        if hi > lo:
            try:
                raw.madvise(mmap.MADV_WILLNEED, lo, hi - lo)
            except (OSError, ValueError):
                # read-ahead is advice only: a kernel that refuses it still reads correctly
                pass

    def prefetch_piece(self, file: str, piece: np.ndarray) -> None:
        got = self._map(file)
        if got is None or piece.size == 0:
            return
        raw, size = got
        base = self._base(file, raw)
        addr = piece.__array_interface__["data"][0]
        if base <= addr < base + size:
            self.prefetch_range(file, addr - base, piece.nbytes)

    def stored_bytes(self, info: TensorInfo) -> bytes | None:
        """The bytes of a small tensor stored plainly (C order, one piece) in a local map (a
        copy), or None when it is stored any other way (then the general path reads it)."""
        span = self._stored_span(info)
        return None if span is None else span[0][span[1]:span[2]]

    def stored_view(self, info: TensorInfo) -> memoryview | None:
        """`stored_bytes` without the copy: a memoryview of the map, which the caller releases
        (the map cannot close while it is held)."""
        span = self._stored_span(info)
        return None if span is None else memoryview(span[0])[span[1]:span[2]]

    def _stored_span(self, info: TensorInfo) -> tuple[mmap.mmap, int, int] | None:
        """(map, start, end) of a tensor stored plainly in a local map. Byte-swapped tensors
        (big-endian GGUF and ``.npy``) have custom readers: the bytes of a span are native."""
        if info.byte_offset is None or info.chunks or info.name in self.model.custom_readers \
                or not info.file:
            return None
        self.model.source(info.file)   # opened as `ModelFile.read` opens it (raising as it does)
        got = self._map(info.file)
        if got is None:
            return None
        raw, size = got
        end = info.byte_offset + info.nbytes
        if end > size or not _plain(info.shape, info.stride):
            return None
        return raw, info.byte_offset, end

    def defer(self, info: TensorInfo) -> None:
        """Release a small tensor's pages later, with its neighbours: one ``madvise`` per
        `RELEASE_BYTES` of small tensors instead of one per tensor."""
        if info.byte_offset is None or not info.file:
            return
        lo, hi, n = self.pending.get(info.file, (info.byte_offset, 0, 0))
        lo, hi = min(lo, info.byte_offset), max(hi, info.byte_offset + info.nbytes)
        if n + info.nbytes >= RELEASE_BYTES:
            self.release_range(info.file, lo, hi - lo)
            self.pending.pop(info.file, None)
        else:
            self.pending[info.file] = (lo, hi, n + info.nbytes)

    def flush(self) -> None:
        for file, (lo, hi, _) in self.pending.items():
            self.release_range(file, lo, hi - lo)
        self.pending.clear()

    def prefetch_tensor(self, info: TensorInfo) -> None:
        if info.byte_offset is not None and info.file:
            self.prefetch_range(info.file, info.byte_offset, min(info.span_bytes, RELEASE_BYTES))


class _Walker:
    """Streams the values of one pair of views, releasing map pages and reporting progress."""

    def __init__(self, rel_a: PageReleaser, rel_b: PageReleaser,
                 progress: Callable[[int], None] | None, chunk_bytes: int):
        self.rel_a, self.rel_b = rel_a, rel_b
        self.progress = progress
        self.chunk_bytes = max(64, int(chunk_bytes))
        self.seen = 0
        self.want_norms = False  # also read identical tensors for their norms (grouped views)
        self.sampling = False    # gather the rank test's submatrix of a differing pair (lanes)
        self.sample = None
        self.sampler: _Sample | None = None   # ... from the pieces the value pass reads

    def pieces(self, va, vb, ia: TensorInfo, ib: TensorInfo, chunk_bytes: int, skip: int = 0):
        """Aligned pieces of both views. Progress is reported as pieces are handed out, except for
        the first ``skip`` bytes (already reported by an earlier pass over the same pair);
        ``self.seen`` is the number of bytes handed out so far."""
        self.seen = 0
        for pa, pb in aligned_pieces(iter_flat_chunks(va, chunk_bytes), iter_flat_chunks(vb, chunk_bytes)):
            n = pa.nbytes + pb.nbytes
            if self.progress is not None and self.seen + n > skip:
                self.progress(self.seen + n - max(self.seen, skip))
            self.seen += n
            yield pa, pb
            self.rel_a.release_piece(ia.file, pa)
            self.rel_b.release_piece(ib.file, pb)

    def same_bytes(self, va, vb, ia, ib, norm: bool = False) -> bool:
        """Whether the stored bytes are equal. With ``norm``, the sum of squares of A's values is
        taken in the same pass (``self.sumsq``), each step while its bytes are in cache: an
        identical pair's norms for the grouped view without reading it a second time."""
        self.seen = 0
        self.sumsq = 0.0
        if va.flags.c_contiguous and vb.flags.c_contiguous and va.nbytes > PROBE_BYTES:
            # A fine-tune's pairs differ in their first bytes: look there before comparing a whole
            # piece (up to `chunk_bytes`), whose pages the value pass would then fault in again.
            k = PROBE_BYTES // max(va.itemsize, 1)
            if not _equal_bytes(va.reshape(-1)[:k], vb.reshape(-1)[:k]):
                return False
        if not norm:
            for pa, pb in self.pieces(va, vb, ia, ib, self.chunk_bytes):
                if not _equal_bytes(pa, pb):
                    return False
            return True
        elems = max(1, min(FLOAT_ELEMS, self.chunk_bytes // 32))
        block = 8 * elems  # bytes compared per call; squares summed per `elems` (BLAS threshold)
        x, _, _, _, _, u = _buffers(elems, va.dtype.kind == "c")
        total = 0.0
        for pa, pb in self.pieces(va, vb, ia, ib, self.chunk_bytes):
            for i in range(0, pa.size, block):
                sa = pa[i:i + block]
                if not _equal_bytes(sa, pb[i:i + block]):
                    return False
                for j in range(0, sa.size, elems):
                    s = sa[j:j + elems]
                    total += _sumsq(s, x[:s.size], u)
        self.sumsq = total
        return True

    def floats(self, va, vb, ia, ib, atol: float, rtol: float, skip: int = 0) -> ValueDiff:
        cplx = va.dtype.kind == "c" or vb.dtype.kind == "c"
        compared_as = "complex128" if cplx else "float64"
        elems = max(1, min(FLOAT_ELEMS, self.chunk_bytes // 32))
        if (va.size >= PARALLEL_ELEMS and va.flags.c_contiguous and vb.flags.c_contiguous
                and elems == FLOAT_ELEMS):
            return self._parallel(va, vb, ia, ib, atol, rtol, skip, cplx).result(va.size,
                                                                                  compared_as)
        acc = _Accumulator(atol, rtol, elems, cplx)
        step = elems * max(va.itemsize, vb.itemsize, 1)
        if _KERNEL is not None and not cplx:
            # the compiled pass takes any length in one call: steps of `RELEASE_BYTES` (or
            # `chunk_bytes`) rather than a call, and a release of its pages, per 8K elements
            step = max(step, min(self.chunk_bytes, RELEASE_BYTES))
        sampler, at = self.sampler, 0
        for pa, pb in self.pieces(va, vb, ia, ib, step, skip):
            if sampler is None:
                acc.add(pa, pb)
            else:
                sampler.add(acc, at, pa, pb)
                at += pa.size
        return acc.result(va.size, compared_as)

    def _parallel(self, va, vb, ia, ib, atol, rtol, skip, cplx) -> _Accumulator:
        """One large contiguous pair over the thread pool: numpy and BLAS release the GIL, so the
        slices run on every core. Each slice reads ahead of itself and hands its pages back behind
        itself; the partial sums are folded in slice order (the figures do not depend on timing)."""
        fa, fb = va.reshape(-1), vb.reshape(-1)
        n = fa.size
        elems = _pool_elems()
        per = max(elems, -(-n // (SLICES_PER_WORKER * _workers())))
        per = -(-per // elems) * elems
        bounds = [(lo, min(n, lo + per)) for lo in range(0, n, per)]
        lock = threading.Lock()
        reported = [0]
        item = fa.itemsize + fb.itemsize
        sampler = self.sampler

        def advance(nbytes: int) -> None:
            if self.progress is None:
                return
            with lock:  # bytes before ``skip`` were reported by the byte pass
                before = reported[0]
                reported[0] += nbytes
                new = reported[0] - max(before, skip)
                if new > 0:
                    self.progress(min(new, nbytes))

        def run(lo: int, hi: int) -> _Accumulator:
            acc = _Accumulator(atol, rtol, elems, cplx)
            step = max(elems, (RELEASE_BYTES // item) // elems * elems)
            for s in range(lo, hi, step):
                e = min(hi, s + step)
                sa, sb = fa[s:e], fb[s:e]
                nxt = slice(e, min(hi, e + step))
                self.rel_a.prefetch_piece(ia.file, fa[nxt])
                self.rel_b.prefetch_piece(ib.file, fb[nxt])
                if sampler is None:
                    acc.add(sa, sb)   # one compiled call, or numpy passes of `elems`
                else:                 # ... that also copies out the rank test's elements
                    sampler.add(acc, s, sa, sb)
                self.rel_a.release_piece(ia.file, sa)
                self.rel_b.release_piece(ib.file, sb)
                advance((e - s) * item)
            return acc

        futures = [_pool().submit(run, lo, hi) for lo, hi in bounds]
        total = None
        for f in futures:
            acc = f.result()
            if total is None:
                total = acc
            else:
                total.merge(acc)
        self.seen = n * item
        return total

    def decoded(self, ma, ta, mb, tb, atol: float, rtol: float, skip: int = 0) -> ValueDiff:
        """Like `floats`, with either side decoded (`dequant.iter_decoded`) piece by piece.
        Progress counts stored bytes, in proportion to the values compared."""
        elems = max(256, min(FLOAT_ELEMS, self.chunk_bytes // 32))  # a whole K-quant block at least
        it_a = self._stream(ma, ta, self.rel_a, elems)
        it_b = self._stream(mb, tb, self.rel_b, elems)
        cplx = any(not _decodable(t) and dtypes.spec(t.dtype).kind == "complex" for t in (ta, tb))
        acc = _Accumulator(atol, rtol, elems, cplx)
        per_value = ta.nbytes / max(ta.numel, 1) + tb.nbytes / max(tb.numel, 1)
        done = reported = 0
        for pa, pb in aligned_pieces(it_a, it_b):
            acc.add(pa, pb)
            done += pa.size
            upto = int(done * per_value)
            lo = max(reported, skip)
            if self.progress is not None and upto > lo:
                self.progress(upto - lo)
            reported = upto
        return acc.result(ta.numel, "complex128" if cplx else "float64")

    @staticmethod
    def _stream(model, t, rel: PageReleaser, elems: int):
        if _decodable(t):
            from . import dequant
            return dequant.iter_decoded(model, t, elems, release=rel.release_range)
        return _released(iter_flat_chunks(model.read(t), elems * dtypes.spec(t.dtype).itemsize),
                         rel, t.file)


def take(pa: np.ndarray, pb: np.ndarray, pos: np.ndarray, lo: int, out_a: np.ndarray,
         out_b: np.ndarray) -> None:
    """``out_a[k] = pa[pos[k] - lo]`` and ``out_b[k] = pb[pos[k] - lo]``: the numpy twin of the
    compiled pass's gather (`_diffkernel.c`, ``stats`` with positions)."""
    idx = pos - lo
    np.take(pa, idx, out=out_a, mode="clip")   # in bounds: clip never clips, and needs no copy
    np.take(pb, idx, out=out_b, mode="clip")


@functools.lru_cache(maxsize=64)
def _position_keys(shape: tuple[int, ...]) -> list[int]:
    """`lowrank.sample_positions` as a list of ints, for `bisect` (cached per shape)."""
    return lowrank.sample_positions(shape).tolist()


class _Sample:
    """The rank test's random submatrix of one C-contiguous pair (`lowrank.sample_positions`),
    gathered from the pieces the value pass reads, in any order and from any thread (each piece
    fills its own run of positions): the same elements as `lowrank.gather`, without a second
    walk over the pair's pages (a gather before the pass faulted in and mapped every page that a
    sampled row touches, then the pass read them again)."""

    def __init__(self, va: np.ndarray, vb: np.ndarray):
        self.shape = tuple(va.shape)
        self.pos = lowrank.sample_positions(self.shape)
        self.keys = _position_keys(self.shape)
        self.a = np.empty(self.pos.size, va.dtype)
        self.b = np.empty(self.pos.size, vb.dtype)
        self.filled = 0
        self.lock = threading.Lock()

    def add(self, acc: "_Accumulator", lo: int, pa: np.ndarray, pb: np.ndarray) -> None:
        """``acc.add(pa, pb)`` (elements [lo, lo + size) of the flattened pair), copying out the
        sampled elements they hold: in the same compiled pass where it runs, each block's while
        it is in L1, else by numpy's take (the kernel's twin)."""
        # bisect on a list (no GIL released and taken back, as numpy's search does, for two
        # lookups: under the diff's other threads that hand-over cost more than the search)
        i, j = bisect.bisect_left(self.keys, lo), bisect.bisect_left(self.keys, lo + pa.size)
        if j == i:
            acc.add(pa, pb)
            return
        run = (self.pos[i:j], lo, self.a[i:j], self.b[i:j])
        if not acc.add(pa, pb, run):
            take(pa, pb, *run)
        with self.lock:
            self.filled += j - i

    def result(self) -> tuple[np.ndarray, np.ndarray] | None:
        """A's and B's submatrices in their own dtypes (the elements `lowrank.gather` copies into
        float64; `lowrank.rank_of_sample` widens them), or None when some position was not
        seen."""
        if self.filled != self.pos.size:
            return None
        rows, cols = lowrank.sample_index(self.shape)
        s, c = rows.size, cols.size
        return self.a.reshape(s, c), self.b.reshape(s, c)


def _sumsq(piece: np.ndarray, x: np.ndarray, scratch: np.ndarray) -> float:
    """Σ|v|² over the finite values of ``piece``, through ``x`` (float64/complex128, its size)."""
    _to_float(piece, x, scratch)
    with np.errstate(invalid="ignore", over="ignore"):
        if x.dtype.kind == "c":
            return float(np.vdot(x, x).real)
        if math.isfinite(v := float(np.dot(x, x))):
            return v
        fin = x[np.isfinite(x)]
        return float(np.dot(fin, fin))


def _released(pieces: Iterator[np.ndarray], rel: PageReleaser, file: str) -> Iterator[np.ndarray]:
    """Pass pieces through, handing each one's map pages back once the consumer asks for more."""
    for piece in pieces:
        yield piece
        rel.release_piece(file, piece)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


LANES = 3   # large pairs compared at once (`_diff`): while two keep the pool busy, the third
            # sets up its pair or runs its verdict (2 left the pool idle during those)
_LANES: ThreadPoolExecutor | None = None


def _lanes() -> ThreadPoolExecutor:
    """The threads that compare large pairs `LANES` at a time (each hands its slices to `_pool`,
    whose threads never wait on a lane: no deadlock)."""
    global _LANES
    _openblas()   # found once, here: the threads' initializers then read the cache (reading
    # /proc/self/maps from two starting threads at once, beside the maps faulting in, took
    # ~50 ms each, measured)
    with _POOL_LOCK:
        if _LANES is None:
            _LANES = ThreadPoolExecutor(LANES, thread_name_prefix="tensorscope-pair",
                                        initializer=_blas_single_thread)
        return _LANES


def _forget_pools() -> None:
    """In a forked child the pools' threads do not exist: start new pools there when asked."""
    global _POOL, _LANES, _POOL_LOCK
    _POOL = _LANES = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _workers() -> int:
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else (os.cpu_count() or 1)))


def _pool() -> ThreadPoolExecutor:
    """One pool per process, one thread per core (numpy and BLAS release the GIL in the loops),
    each with BLAS pinned to one thread."""
    global _POOL
    _openblas()   # (as in `_lanes`)
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(_workers(), thread_name_prefix="tensorscope-diff",
                                       initializer=_blas_single_thread)
        return _POOL


def _pool_elems() -> int:
    """Elements per fused step on the pool's threads: `POOL_ELEMS` when their BLAS is pinned to
    one thread (at most 8 `FLOAT_ELEMS`, which tests shrink to vary piece boundaries), else
    `FLOAT_ELEMS`, below OpenBLAS's own threading threshold."""
    return min(POOL_ELEMS, 8 * FLOAT_ELEMS) if _openblas() is not None else FLOAT_ELEMS


@functools.lru_cache(maxsize=1)
def _openblas():
    """numpy's OpenBLAS when it can pin a thread's BLAS calls to one thread
    (``openblas_set_num_threads_local``, OpenBLAS >= 0.3.27), else None. Found among the libraries
    the process has loaded (numpy loaded it; nothing is loaded from elsewhere)."""
    try:
        import ctypes
        with open("/proc/self/maps") as f:
            paths = sorted({line.split(None, 5)[-1].strip() for line in f
                            if "openblas" in line.lower() and ".so" in line})
        for path in paths:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL)
            if hasattr(lib, "openblas_set_num_threads_local"):
                return lib
    except (OSError, ValueError, AttributeError):
        return None  # not Linux, or not OpenBLAS: the pool keeps to pieces below BLAS's threshold
    return None


def _blas_single_thread() -> None:
    """Pin the calling thread's BLAS to one thread (the pool's initializer). Our pool already has
    a thread per core; OpenBLAS threads of its own would fight them, and their spinning triples the
    CPU time of a 32K-element dot product (measured)."""
    lib = _openblas()
    if lib is not None:
        lib.openblas_set_num_threads_local(1)


# fp8 and other one-byte float dtypes convert through a 256-entry table (ml_dtypes' own casts go
# element by element); filled on first use.
_TABLES: dict[str, np.ndarray] = {}


def _is_half(dt: np.dtype) -> bool:
    """``dt`` is native float16 (``np.dtype(np.float16)``, told without numpy's scalar types)."""
    return dt.kind == "f" and dt.itemsize == 2 and dt.isnative


def _is_ml(dt: np.dtype, name: str) -> bool:
    """``dt`` is ml_dtypes' ``name`` (bfloat16, float8_*), told by name so that ml_dtypes (~0.5 s
    to import) is imported only by the reader of such values."""
    return dt.name == name and dt.type.__module__ == "ml_dtypes"


def _table(piece: np.ndarray) -> np.ndarray:
    key = str(piece.dtype)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = np.arange(256, dtype=np.uint8).view(piece.dtype).astype(np.float64)
    return t


def _to_float(piece: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """Convert ``piece`` into ``out`` (float64/complex128), exactly, by the fastest route numpy has:
    bfloat16 is float32's upper half (a shift), one-byte floats go through a table, the rest through
    numpy's own cast (float16 is converted in hardware where numpy can)."""
    dt = piece.dtype
    if _is_ml(dt, "bfloat16"):
        u = scratch[: piece.size]
        np.left_shift(piece.view(np.uint16), 16, out=u, dtype=np.uint32)
        np.copyto(out, u.view(np.float32))
    elif dt.itemsize == 1 and dt.kind not in "iub":
        # mode="clip": a byte always indexes the 256 entries; the default bounds check would
        # convert the indices to intp first (7 ns per element against 0.8, measured)
        np.take(_table(piece), piece.view(np.uint8), out=out, mode="clip")
    else:
        np.copyto(out, piece, casting="unsafe")


# The optional compiled pass (tensorscope/_diffkernel.c, built by `pip install` when a C compiler
# is there; numpy computes the same figures without it). Codes are the kernel's; bfloat16 goes in
# as its uint16 bits (numpy cannot export ml_dtypes' types through the buffer protocol).
KERNEL_ABI = lowrank.KERNEL_ABI   # what `_diffkernel.c` must say it is (else it is not called)
_KERNEL = optional_extension("_diffkernel", KERNEL_ABI)


@functools.cache
def _kernel_views() -> dict:
    """The numpy type each code's buffer is viewed as (made when numpy is first needed)."""
    return {"e": np.uint16, "b": np.uint16, "f": np.float32, "d": np.float64, "c": np.int8,
            "B": np.uint8, "h": np.int16, "i": np.int32, "t": np.uint8, "E": np.uint8,
            "F": np.uint8}


def _kernel_code(dt: np.dtype) -> str | None:
    """The kernel's code for a native-order dtype, by its name (numpy's and ml_dtypes' names are
    ours: `lowrank.STORED_CODES`); the other one-byte floats through `_table` as in `_to_float`."""
    code = lowrank.STORED_CODES.get(dt.name) if dt.isnative else None
    if code is None and dt.itemsize == 1 and dt.kind not in "iub":
        return "t"
    return code


@functools.cache
def _half_constants() -> tuple:
    """`_half_fast`'s mask (0x8FFFE000: the sign, then float16's 15 low bits) and scale (float32's
    exponent bias minus float16's), as numpy scalars of the arrays' types."""
    return np.int32(-0x70002000), np.float32(2.0 ** 112)


HALF_OVER = 2.0 ** 32  # a sum of squares of finite float16 values reaching this holds a 65504^2


def _half_fast(piece: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
    """float16 -> float64 in three integer/float32 passes and a widening (0.57 ns per element
    against 0.86 for numpy's cast, measured): the int16 shifted left by 13 into an int32 puts the
    sign at bit 31 (sign-extension fills bits 28-30, which the mask clears), the exponent and the
    mantissa where float32 has them; times 2^112 rebiases the exponent, exactly, subnormals
    included (they land on float32 subnormals scaled by a power of two). Inf and NaN (exponent 31)
    come out FINITE, at 65536 or more: the caller checks ``x·x >= HALF_OVER`` (which every
    exponent-31 value reaches and no finite float16 below 65504 in magnitude does) and converts
    again with `_to_float`."""
    mask, scale = _half_constants()
    u = scratch[: piece.size].view(np.int32)
    np.left_shift(piece.view(np.int16), 13, u, dtype=np.int32)
    np.bitwise_and(u, mask, u)
    f = u.view(np.float32)
    np.multiply(f, scale, f)
    np.copyto(out, f)


_LOCAL = threading.local()


def _buffers(elems: int, cplx: bool) -> tuple[np.ndarray, ...]:
    """The calling thread's scratch buffers for `_Accumulator` (x, y, d, t, flag, u), made
    once per thread and size: buffers of 256 KiB and more come from fresh ``mmap``s that are
    faulted in page by page on every use (measured: most of the system time of a threaded diff
    that made a set per slice). One accumulator at a time per thread, which is how they are used."""
    cache = getattr(_LOCAL, "buffers", None)
    if cache is None:
        cache = _LOCAL.buffers = {}
    got = cache.get((elems, cplx))
    if got is None:
        if len(cache) > 4:  # tests vary the piece size: keep a few
            cache.clear()
        work = np.complex128 if cplx else np.float64
        got = cache[(elems, cplx)] = (
            np.empty(elems, work), np.empty(elems, work), np.empty(elems, np.float64),
            np.empty(elems, np.float64), np.empty(elems, np.bool_), np.empty(elems, np.uint32))
    return got


class _Sums:
    """The diff's running figures of one pair (sums, maxima, counts) and the `ValueDiff` they
    make: what `_Accumulator` folds its pieces into, and `_direct` one compiled call (no numpy)."""

    def __init__(self, atol: float, rtol: float):
        self.atol, self.rtol = float(atol), float(rtol)
        self.max_abs = -math.inf
        self.max_rel = -math.inf
        self.sum_abs = self.sum_sq = 0.0
        self.dot = self.xx = self.yy = 0.0
        self.count = 0
        self.mismatched = self.nan = self.inf = self.zero_ref = 0

    def merge(self, o: "_Sums") -> None:
        """Fold in the sums of another accumulator (a slice of the same tensor, another thread)."""
        self.max_abs = max(self.max_abs, o.max_abs)
        self.max_rel = max(self.max_rel, o.max_rel)
        self.sum_abs += o.sum_abs
        self.sum_sq += o.sum_sq
        self.dot += o.dot
        self.xx += o.xx
        self.yy += o.yy
        self.count += o.count
        self.mismatched += o.mismatched
        self.nan += o.nan
        self.inf += o.inf
        self.zero_ref += o.zero_ref

    def fold(self, got: tuple, n: int) -> None:
        """Fold in what one compiled ``stats`` call over ``n`` finite pairs returned."""
        sq, xx, yy, dot, sum_abs, worst, rel, zero_ref, mismatched = got
        self.sum_sq += sq
        self.xx += xx
        self.yy += yy
        self.dot += dot
        self.sum_abs += sum_abs
        self.count += n
        self.zero_ref += zero_ref
        self.mismatched += mismatched
        if worst > self.max_abs:
            self.max_abs = worst
        if rel > self.max_rel:   # (-inf when every b of the piece is 0: no ratio)
            self.max_rel = rel

    def result(self, numel: int, compared_as: str) -> ValueDiff:
        if self.count == 0:
            return ValueDiff(numel, False, mismatched=self.mismatched, nan_mismatch=self.nan,
                             inf_mismatch=self.inf, compared_as=compared_as)
        cosine = None
        if self.xx > 0 and self.yy > 0 and math.isfinite(self.xx) and math.isfinite(self.yy):
            cosine = self.dot / (math.sqrt(self.xx) * math.sqrt(self.yy))
        return ValueDiff(numel, False, max_abs=self.max_abs,
                         max_rel=self.max_rel if self.max_rel >= 0 else
                         (0.0 if self.max_abs == 0 else None),   # no b != 0 anywhere
                         mean_abs=self.sum_abs / self.count,
                         rms=math.sqrt(self.sum_sq / self.count), cosine=cosine,
                         mismatched=self.mismatched, nan_mismatch=self.nan, inf_mismatch=self.inf,
                         compared_as=compared_as, norm_a=math.sqrt(self.xx),
                         norm_b=math.sqrt(self.yy), norm_diff=math.sqrt(self.sum_sq),
                         zero_ref=self.zero_ref)


class _Accumulator(_Sums):
    """Running sums for the float statistics, one piece at a time, in reused buffers.

    The common case (every value finite, real) is one fused pass per piece: both sides converted
    once into float64 (exact for every input dtype up to float64, so ``max_abs`` and the counts equal
    torch's float64 figures exactly, and the sums are float64 sums of exact terms), then the four
    sums of products as BLAS dot products (a·a, b·b, a·b, d·d), and |d| reused for the max, the
    sum (numpy's pairwise sum), the relative difference and the tolerance test: 23 numpy calls
    per piece, each one vectorised pass over a cache-resident buffer, outputs given positionally
    and the full-size views made once (a call costs 0.3-1 µs here: a few % of a 64K piece). The
    per-call costs are in BENCHMARKS.md (3.6 ns per float16 pair on one thread, a third of it
    the widening). Anything non-finite or complex takes the careful path (`_general`).

    Where `pip install` could build it (a C compiler), `_kernel` computes the same figures in one
    compiled pass instead (`_diffkernel.c`: each element read once; 0.97 ns per float16 pair on
    one thread for its portable loop, 0.45 for its AVX-512 route); the numpy pass is the
    fallback and the tests hold all three to each other.

    Why not float32 for float16/bfloat16 inputs (exact as values): a float32 dot product
    accumulates in float32 (OpenBLAS), whose error bound over a piece (~n·2⁻²⁴) cannot be proved
    under 1e-6, so the float64 copies are needed for the dot products anyway; and |a-b| in float32
    rounds when the exponents of a and b are more than 13 binades apart, so max_abs and the
    tolerance count would need float64 re-checks. The ratio and tolerance passes in float32 would
    save at most ~0.3 ns of the 3.6, before those re-checks.
    """

    def __init__(self, atol: float, rtol: float, elems: int, cplx: bool):
        super().__init__(atol, rtol)
        self.elems = elems
        self.x, self.y, self.d, self.t, self.flag, self.u = _buffers(elems, cplx)
        self.full = (self.x, self.y, self.d, self.t, self.flag)

    def add(self, pa: np.ndarray, pb: np.ndarray, gather=None) -> bool:
        """Fold in one pair of pieces: in one compiled call where it applies (any length), else
        through the numpy passes in pieces of at most ``elems``. ``gather`` (positions, lo,
        out_a, out_b: `_Sample`) asks the compiled call to copy those elements out too; returns
        whether it did (else the caller takes them itself)."""
        if _KERNEL is not None and self.x.dtype.kind != "c" and self._kernel(pa, pb, gather):
            return gather is not None
        if pa.size <= self.elems:
            self._add_numpy(pa, pb)
            return False
        for i in range(0, pa.size, self.elems):
            self._add_numpy(pa[i:i + self.elems], pb[i:i + self.elems])
        return False

    def _add_numpy(self, pa: np.ndarray, pb: np.ndarray) -> None:
        n = pa.size
        if n == self.elems:
            x, y, d, t, flag = self.full
        else:
            x, y, d, t, flag = (b[:n] for b in self.full)
        half_a, half_b = _is_half(pa.dtype), _is_half(pb.dtype)
        (_half_fast if half_a else _to_float)(pa, x, self.u)
        (_half_fast if half_b else _to_float)(pb, y, self.u)
        if x.dtype.kind == "c":
            self._general(x, y)
            return
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            np.subtract(x, y, d)
            sq = float(np.dot(d, d))
            xx, yy = float(np.dot(x, x)), float(np.dot(y, y))
            if (half_a and xx >= HALF_OVER) or (half_b and yy >= HALF_OVER):
                # Maybe an Inf or NaN that `_half_fast` made finite: numpy's exact cast again.
                _to_float(pa, x, self.u)
                _to_float(pb, y, self.u)
                self._general(x, y)
                return
            if not (math.isfinite(sq) and math.isfinite(xx) and math.isfinite(yy)):
                # A NaN or Inf somewhere (or a square that overflows): the careful path.
                self._general(x, y)
                return
            self.dot += float(np.dot(x, y))
            self.sum_sq += sq
            self.xx += xx
            self.yy += yy
            self.count += n
            np.absolute(d, d)
            worst = float(np.maximum.reduce(d))
            if worst > self.max_abs:
                self.max_abs = worst
            if worst == 0.0:
                if np.count_nonzero(y):   # a ratio 0 where b != 0 (else none: see `result`)
                    self.max_rel = max(self.max_rel, 0.0)
                return
            self.sum_abs += float(np.add.reduce(d))
            np.absolute(y, t)
            # |a-b| / |b| over the positions where b is not exactly 0 (0/0 is NaN, which fmax
            # skips; x/0 is inf and means a zero of the reference: counted apart, then excluded).
            rel = float(np.fmax.reduce(np.divide(d, t, x)))
            if rel == math.inf:  # a third of a fine-tune's pieces: kept to four light passes
                zero = np.equal(t, 0.0, flag)
                self.zero_ref += int(np.count_nonzero(d[zero]))
                if int(np.count_nonzero(zero)) == n:
                    rel = math.nan
                else:
                    np.putmask(x, zero, 0.0)  # ratios are >= 0: a 0 in their place changes no max
                    rel = float(np.fmax.reduce(x))
            if not math.isnan(rel) and rel > self.max_rel:
                self.max_rel = rel
            # torch.isclose on finite values: |a-b| <= atol + rtol*|b| (a == b implies it), in
            # torch's order of operations, so the count is exact.
            if worst > self.atol:
                np.multiply(t, self.rtol, t)
                np.add(t, self.atol, t)
                self.mismatched += int(np.count_nonzero(np.greater(d, t, flag)))

    def _kernel(self, pa: np.ndarray, pb: np.ndarray, gather=None) -> bool:
        """The same figures as `add`'s finite path in one compiled pass (`_diffkernel.c`, which
        says why); False when the kernel does not take these dtypes or layouts."""
        ca, cb = _kernel_code(pa.dtype), _kernel_code(pb.dtype)
        if ca is None or cb is None or not (pa.flags.c_contiguous and pb.flags.c_contiguous):
            return False
        views = _kernel_views()
        va, vb = views[ca], views[cb]
        ta = _table(pa) if ca == "t" else b""
        tb = _table(pb) if cb == "t" else b""
        if gather is None:
            got = _KERNEL.stats(pa.view(va), ca, pb.view(vb), cb, self.atol, self.rtol, ta, tb)
        else:
            pos, lo, out_a, out_b = gather
            got = _KERNEL.stats(pa.view(va), ca, pb.view(vb), cb, self.atol, self.rtol, ta, tb,
                                pos, lo, out_a.view(va), out_b.view(vb))
        if got is None:   # a NaN or an infinity in the piece: the numpy passes' careful path
            return False
        self.fold(got, pa.size)
        return True

    def _general(self, x: np.ndarray, y: np.ndarray) -> None:
        """Any values, NaN and Inf included (allocates temporaries; also the complex path)."""
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            ad = np.abs(x - y)
            ay = np.abs(y)
            # torch.isclose: a == b, or a finite error within atol + rtol*|b| (NaN never matches).
            close = (x == y) | (np.isfinite(ad) & (ad <= self.atol + self.rtol * ay))
            self.mismatched += int(close.size - np.count_nonzero(close))
            both = np.isfinite(x) & np.isfinite(y)
            if not both.all():
                nan = np.isnan(x) | np.isnan(y)
                self.nan += int(np.count_nonzero(nan))
                self.inf += int(np.count_nonzero(~both & ~nan & (x != y)))
                x, y, ad, ay = x[both], y[both], ad[both], ay[both]
            if ad.size == 0:
                return
            self.count += ad.size
            self.max_abs = max(self.max_abs, float(ad.max()))
            ref = ay != 0
            self.zero_ref += int(np.count_nonzero(ad[~ref]))
            if ref.any():
                self.max_rel = max(self.max_rel, float((ad[ref] / ay[ref]).max()))
            self.sum_abs += float(ad.sum())
            self.sum_sq += float((ad * ad).sum())
            if x.dtype.kind == "c":
                self.dot += float((x.conj() * y).real.sum())
                self.xx += float((x.conj() * x).real.sum())
                self.yy += float((y.conj() * y).real.sum())
            else:
                self.dot += float((x * y).sum())
                self.xx += float((x * x).sum())
                self.yy += float((y * y).sum())

def _identical(numel: int, norm: float | None = None) -> ValueDiff:
    """Identical values: every difference 0; the norms and cosine when ``norm`` was computed."""
    cos = (1.0 if norm > 0 else None) if norm is not None and math.isfinite(norm) else None
    return ValueDiff(numel, True, 0.0, 0.0, 0.0, 0.0, cos, 0, 0, 0, "bytes",
                     norm_a=norm, norm_b=norm, norm_diff=0.0)


def _readable(model: ModelFile, t: TensorInfo) -> bool:
    return t.byte_offset is not None or bool(t.chunks) or t.name in model.custom_readers


def compare_values(ma: ModelFile, ta: TensorInfo, mb: ModelFile, tb: TensorInfo, *,
                   atol: float = 1e-8, rtol: float = 1e-5, chunk_bytes: int = 16 << 20,
                   progress: Callable[[int], None] | None = None) -> ValueDiff | None:
    """Compare the values of ``ta`` (in ``ma``) and ``tb`` (in ``mb``), which must have one shape.

    Returns None when either side has no readable values or the dtypes cannot be compared
    element-wise (two different bytes-only dtypes).
    """
    if ta.shape != tb.shape:
        raise ValueError(f"compare_values: shapes differ ({ta.shape} vs {tb.shape})")
    if not (_readable(ma, ta) and _readable(mb, tb)):
        return None
    rel_a, rel_b = _Pages(ma), _Pages(mb)
    progress = _serialised(progress)   # the lanes and the pool report too
    walker = _Walker(rel_a, rel_b, progress, chunk_bytes)
    try:
        return _compare(walker, ma, ta, mb, tb, atol, rtol)
    finally:
        rel_a.release_tensor(ta)
        rel_b.release_tensor(tb)


def _same_small(walker: _Walker, ta: TensorInfo, tb: TensorInfo) -> ValueDiff | None:
    """A small pair whose stored bytes are equal, compared as two byte strings: the per-pair cost
    that dominates a checkpoint of 100,000 small tensors (no views, no chunk walk, no madvise).
    None when the bytes differ or are not stored plainly (the general path decides)."""
    if ta.dtype != tb.dtype or walker.want_norms or not _same_qparams(ta, tb) \
            or ta.nbytes > walker.chunk_bytes:   # (progress: at most a piece at a time)
        return None
    sa = walker.rel_a.stored_bytes(ta)
    if sa is None:
        return None
    sb = walker.rel_b.stored_bytes(tb)
    if sb is None or sa != sb:
        return None
    if walker.progress is not None:
        walker.progress(len(sa) + len(sb))
    return _identical(ta.numel)


def _direct(walker: _Walker, ta: TensorInfo, tb: TensorInfo, atol, rtol) -> ValueDiff | None:
    """A pair of one dtype whose stored bytes the compiled pass reads as they are
    (`lowrank.STORED_CODES`), both stored plainly in local maps, under `PARALLEL_ELEMS` elements
    (larger ones are split over the pool): compared in one compiled call on the stored bytes, no
    numpy view or import; the rank test's sample is copied out in the same call (a
    `lowrank.StoredSample`). None when the pair is not such a pair, or holds a NaN or an infinity
    (the general path then takes it, its pages warm), or larger than a piece."""
    code = lowrank.STORED_CODES.get(ta.dtype)
    if (_KERNEL is None or code is None or ta.dtype != tb.dtype or walker.want_norms
            or ta.numel >= PARALLEL_ELEMS or ta.nbytes > walker.chunk_bytes):
        return None   # (progress is reported per piece of at most `chunk_bytes`)
    va = walker.rel_a.stored_view(ta)
    if va is None:
        return None
    vb = walker.rel_b.stored_view(tb)
    try:
        if vb is None:
            return None
        if _KERNEL.equal(va, vb):
            vd = _identical(ta.numel)
        else:
            sums, gather = _Sums(atol, rtol), ()
            if walker.sampling and rank_candidate(ta, tb):
                pos = lowrank.stored_positions(ta.shape)
                size = len(pos) * dtypes.spec(ta.dtype).itemsize
                gather = (pos, 0, bytearray(size), bytearray(size))
            got = _KERNEL.stats(va, code, vb, code, sums.atol, sums.rtol, b"", b"", *gather)
            if got is None:
                return None
            if gather:
                walker.sample = lowrank.StoredSample(bytes(gather[2]), bytes(gather[3]),
                                                     ta.dtype, *lowrank.sample_shape(ta.shape))
            sums.fold(got, ta.numel)
            vd = sums.result(ta.numel, "float64")
        if walker.progress is not None:
            walker.progress(len(va) + len(vb))
        return vd
    finally:
        va.release()
        if vb is not None:
            vb.release()


def _compare(walker: _Walker, ma, ta, mb, tb, atol, rtol) -> ValueDiff | None:
    vd = _direct(walker, ta, tb, atol, rtol)
    if vd is not None:
        return vd
    numeric = _numeric(ta) and _numeric(tb)
    decoded = (_decodable(ta) or _decodable(tb)) and all(_decodable(t) or _numeric(t)
                                                         for t in (ta, tb))
    if ta.dtype == tb.dtype:
        va, vb = ma.read(ta), mb.read(tb)
        if va.shape != vb.shape or va.dtype != vb.dtype:  # bytes-only views of different sizes
            return ValueDiff(ta.numel, False, mismatched=None)
        if va.dtype.hasobject:   # ONNX strings: Python objects (a copy), compared by value
            if np.array_equal(va, vb):
                return _identical(ta.numel)
            return ValueDiff(ta.numel, False, mismatched=None, compared_as="bytes")
        norm = walker.want_norms and numeric
        if walker.same_bytes(va, vb, ta, tb, norm) and _same_qparams(ta, tb):
            return _identical(ta.numel, math.sqrt(walker.sumsq) if norm else None)
        if decoded:
            return walker.decoded(ma, ta, mb, tb, atol, rtol, skip=walker.seen)
        if not numeric:
            return ValueDiff(ta.numel, False, mismatched=None, compared_as="bytes")
        if walker.sampling and rank_candidate(ta, tb):
            if va.flags.c_contiguous and vb.flags.c_contiguous:
                # the rank test's submatrix gathered by the value pass from each piece it reads
                # (its pages mapped, its lines in cache): no page touched twice
                walker.sampler = _Sample(va, vb)
            else:
                walker.sample = lowrank.gather(va, vb)
        # The byte pass stopped at the first difference: report only what it did not reach.
        try:
            return walker.floats(va, vb, ta, tb, atol, rtol, skip=walker.seen)
        finally:
            if walker.sampler is not None:
                sampler, walker.sampler = walker.sampler, None
                # None when some piece was not seen: the verdict then gathers it apart
                walker.sample = sampler.result()
    if decoded:
        return walker.decoded(ma, ta, mb, tb, atol, rtol)
    if not numeric:
        return None
    return walker.floats(ma.read(ta), mb.read(tb), ta, tb, atol, rtol)


# ------------------------------------------------------------------------------------------------
# The diff
# ------------------------------------------------------------------------------------------------

def _layout_differs(a: TensorInfo, b: TensorInfo) -> bool:
    if a.numel == 0:
        return False
    return any(d > 1 and sa != sb for d, sa, sb in zip(a.shape, a.stride, b.stride))


def _content_hash(walker_rel: PageReleaser, model: ModelFile, t: TensorInfo, chunk_bytes: int,
                  progress) -> bytes:
    import hashlib   # renames only: most diffs hash nothing (~3 ms of every diff's start)
    h = hashlib.blake2b(digest_size=32)
    try:
        for piece in iter_flat_chunks(model.read(t), chunk_bytes):
            h.update(_as_bytes(np.ascontiguousarray(piece)))
            walker_rel.release_piece(t.file, piece)
            if progress is not None:
                progress(piece.nbytes)
    finally:
        walker_rel.release_tensor(t)
    return h.digest()


def _find_renames(ma, mb, removed: list[TensorInfo], added: list[TensorInfo], rel_a, rel_b,
                  chunk_bytes, progress) -> list[tuple[TensorInfo, TensorInfo]]:
    def group(ts, model):
        g: dict[tuple, list[TensorInfo]] = {}
        for t in ts:
            if _readable(model, t):
                g.setdefault((t.dtype, t.shape, t.nbytes), []).append(t)
        return g

    ga, gb = group(removed, ma), group(added, mb)
    pairs = []
    for key in ga.keys() & gb.keys():
        by_hash: dict[bytes, list[TensorInfo]] = {}
        for t in gb[key]:
            by_hash.setdefault(_content_hash(rel_b, mb, t, chunk_bytes, progress), []).append(t)
        for t in ga[key]:
            hit = by_hash.get(_content_hash(rel_a, ma, t, chunk_bytes, progress))
            if hit:
                pairs.append((t, hit.pop(0)))
    return pairs


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _pair(ma, ta, mb, tb, walker: _Walker, values: bool, atol, rtol) -> TensorDiff:
    changes: list[str] = []
    if ta.dtype != tb.dtype:
        changes.append(f"dtype {ta.dtype} -> {tb.dtype}")
    if ta.shape != tb.shape:
        changes.append(f"shape {_fmt_shape(ta.shape)} -> {_fmt_shape(tb.shape)}")
    elif _layout_differs(ta, tb):
        changes.append(f"stride {_fmt_shape(ta.stride)} -> {_fmt_shape(tb.stride)}")
    vd = None
    if values and ta.shape == tb.shape and _readable(ma, ta) and _readable(mb, tb):
        small = ta.nbytes < SMALL_BYTES and tb.nbytes < SMALL_BYTES
        try:
            vd = _same_small(walker, ta, tb) if small else None
            if vd is None:
                vd = _compare(walker, ma, ta, mb, tb, atol, rtol)
        finally:
            if small:
                walker.rel_a.defer(ta)
                walker.rel_b.defer(tb)
            else:
                walker.rel_a.release_tensor(ta)
                walker.rel_b.release_tensor(tb)
        if vd is not None and vd.differs:
            changes.append("values")
    structural = any(not c.startswith("stride ") for c in changes)
    return TensorDiff("changed" if structural else "same", ta.name, tb.name, ta, tb, changes, vd)


def diff_models(a, b, *, atol: float | None = None, rtol: float | None = None,
                values: bool = True,
                strip_prefix: Sequence[str] = (), maps: Sequence[tuple[str, str]] = (),
                detect_prefix: bool = True, detect_renames: bool = True,
                progress: Callable[[int], None] | None = None,
                chunk_bytes: int = 16 << 20, norms: bool = False,
                verdicts: bool = True) -> DiffResult:
    """Compare two models tensor by tensor.

    Args:
        a, b: paths (opened with `tensorscope.open` and closed before returning) or open
            `ModelFile` objects (left open).
        atol, rtol: tolerance as in ``torch.isclose``: mismatch when |a-b| > atol + rtol*|b|
            (defaults 1e-8 and 1e-5). When either is given, a pair within tolerance does not
            count as a difference for the exit code, even across dtypes.
        values: compare values (False: dtype/shape/layout only, no tensor byte is read and no
            rename is looked for).
        strip_prefix: prefixes removed from the names of both sides before aligning.
        maps: ``(OLD, NEW)`` leading-prefix rewrites applied to the names of both sides.
        detect_prefix: find and strip a wrapper prefix carried by every name of one side.
        detect_renames: pair removed and added tensors whose bytes are equal.
        progress: called with the number of bytes read after each chunk (from the diff's
            threads, one call at a time).
        chunk_bytes: stored bytes compared per step (peak memory is a small multiple of it).
        norms: also read tensors whose bytes are identical for their 2-norms, so that grouped
            relative changes (`group_changes`) have every tensor in their denominators.
        verdicts: say how each tensor of B relates to A's and sum it up for the pair
            (`tensorscope.diff_verdict`; an extra pass only over changed pairs that need one).

    Returns:
        The `DiffResult`.

    Raises:
        TensorscopeError: a negative tolerance, a file that cannot be opened, or a tensor whose
            bytes cannot be read.

    Example:
        >>> r = diff_models("old.pt", "new.safetensors", atol=1e-6)   # doctest: +SKIP
        >>> r.counts, r.exit_code                                      # doctest: +SKIP
    """
    tolerance_given = atol is not None or rtol is not None
    atol = 1e-8 if atol is None else atol
    rtol = 1e-5 if rtol is None else rtol
    for label, tol in (("atol", atol), ("rtol", rtol)):
        if not tol >= 0:  # also rejects NaN; torch.isclose refuses negative tolerances too
            raise TensorscopeError(f"{label} must be a number >= 0, got {tol}")
    opened: list[ModelFile] = []
    gc_was = gc.isenabled()
    gc.disable()  # records without cycles, by the 100,000: collections would cost half the time
    try:
        ma = _as_model(a, opened)
        mb = _as_model(b, opened)
        return _diff(ma, mb, atol=atol, rtol=rtol, values=values, strip=tuple(strip_prefix),
                     maps=tuple((str(o), str(n)) for o, n in maps), detect_prefix=detect_prefix,
                     detect_renames=detect_renames, progress=progress, chunk_bytes=chunk_bytes,
                     norms=norms, verdicts=verdicts, tolerance_given=tolerance_given)
    finally:
        if gc_was:
            gc.enable()
        for m in opened:
            m.close()


def _as_model(x, opened: list[ModelFile]) -> ModelFile:
    if isinstance(x, ModelFile):
        return x
    from .formats import open_model
    m = open_model(os.fspath(x))
    opened.append(m)
    return m


def _large(ta: TensorInfo, tb: TensorInfo) -> bool:
    """A pair for the lanes: not one of the small pairs compared as byte strings."""
    return ta.nbytes >= SMALL_BYTES or tb.nbytes >= SMALL_BYTES


def _lane_pair(ma, ta, mb, tb, walker: _Walker, atol, rtol, nxt, judged) -> TensorDiff:
    """`_judged_pair` in a lane, which first asks the kernel to read ahead the start of the next
    large pair (``nxt``, or None), so that its pages come in while this one is compared (a
    candidate's extra pass then runs beside the other lane's comparison, with this thread's BLAS
    on one core)."""
    if nxt is not None and nxt[0].nbytes >= RELEASE_BYTES:
        walker.rel_a.prefetch_tensor(nxt[0])
        walker.rel_b.prefetch_tensor(nxt[1])
    return _judged_pair(ma, ta, mb, tb, walker, True, atol, rtol, judged)


def _judged_pair(ma, ta, mb, tb, walker: _Walker, values, atol, rtol, judged) -> TensorDiff:
    """`_pair` and, when ``judged`` is (True, tolerance_given), its verdict, right away: the rank
    test's sample, gathered by the value pass, is used while the pair's pages are warm and
    never kept."""
    walker.sampling = judged[0] and values
    try:
        e = _pair(ma, ta, mb, tb, walker, values, atol, rtol)
    finally:
        walker.sampling = False
    e.sample, walker.sample = walker.sample, None
    if judged[0]:
        e.verdict = judge(e, ma, mb, tolerance_given=judged[1])
    e.sample = None
    return e


def _serialised(progress: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """``progress`` called one call at a time, from whichever of the diff's threads."""
    if progress is None:
        return None
    lock = threading.Lock()

    def advance(n: int) -> None:
        with lock:
            progress(n)
    return advance


def _tied_pair(ma, ta, mb, tb, walker, values, atol, rtol, side: str) -> TensorDiff:
    e = _pair(ma, ta, mb, tb, walker, values, atol, rtol)
    kept = tb.name if side == "B" else ta.name
    e.changes.append(f"tied: {side} stores it once, as {kept}")
    return e


def _diff(ma: ModelFile, mb: ModelFile, *, atol, rtol, values, strip, maps, detect_prefix,
          detect_renames, progress, chunk_bytes, norms=False, verdicts=False,
          tolerance_given=False) -> DiffResult:
    names_a = [_strip_user(t.name, strip) for t in ma.tensors]
    names_b = [_strip_user(t.name, strip) for t in mb.tensors]
    pa, pb = ("", "")
    if detect_prefix:
        pa, pb = detect_prefixes(names_a, names_b, (lambda n: _map(n, maps)) if maps else None)
    ka = _keyed(ma.tensors, strip, maps, pa)
    kb = _keyed(mb.tensors, strip, maps, pb)
    ka, kb = unpack_keys(ka, kb), unpack_keys(kb, ka)   # torch.ao's packed Linear parameters

    rel_a, rel_b = _Pages(ma), _Pages(mb)
    progress = _serialised(progress)   # the lanes and the pool report too
    walker = _Walker(rel_a, rel_b, progress, chunk_bytes)
    walker.want_norms = norms
    entries: list = []   # TensorDiff, or the Future of one (a large pair, in a lane)
    # tied weights matter only for names one side lacks
    tied_a = _tied(ka, kb) if ka.keys() - kb.keys() else {}  # A name -> B tensor stored as
    tied_b = _tied(kb, ka) if kb.keys() - ka.keys() else {}  # B name -> A tensor
    removed = [t for k, t in ka.items() if k not in kb and t.name not in tied_a]
    added = [t for k, t in kb.items() if k not in ka and t.name not in tied_b]
    renamed: dict[str, TensorInfo] = {}  # A name -> B tensor
    if values and detect_renames and removed and added:
        for ta, tb in _find_renames(ma, mb, removed, added, rel_a, rel_b, chunk_bytes, progress):
            renamed[ta.name] = tb
    renamed_b = {t.name for t in renamed.values()}
    # a fused projection on one side, its split parts on the other (`diff_fused`)
    only_a = {k: t for k, t in ka.items() if k not in kb and t.name not in tied_a
              and t.name not in renamed}
    only_b = {k: t for k, t in kb.items() if k not in ka and t.name not in tied_b
              and t.name not in renamed_b}
    fused_a = {t.name: pairs for t, pairs in fused_matches(only_a, only_b, ma, mb)} \
        if only_a and only_b else {}
    fused_b = {t.name: pairs for t, pairs in fused_matches(only_b, only_a, mb, ma)} \
        if only_a and only_b else {}
    parts_b = {p.name for pairs in fused_a.values() for _, p in pairs}   # B's split parts
    parts_a = {p.name for pairs in fused_b.values() for _, p in pairs}   # A's split parts

    pending = list(ka.items())
    large = [(ta, kb[key]) for key, ta in pending if key in kb and _large(ta, kb[key])]
    following = dict(zip((ta.name for ta, _ in large), large[1:]))  # the next large pair
    lanes: list[Future] = []
    for key, ta in pending:
        tb = kb.get(key)
        if tb is not None and values and _large(ta, tb):
            # Large pairs are compared `LANES` at a time, each with a walker of its own: one's
            # set-up (views, byte probe, slicing) runs while the pool computes the other's slices.
            lane_walker = _Walker(rel_a, rel_b, progress, chunk_bytes)
            lane_walker.want_norms = norms
            lanes.append(_lanes().submit(_lane_pair, ma, ta, mb, tb, lane_walker, atol, rtol,
                                         following.get(ta.name), (verdicts, tolerance_given)))
            entries.append(lanes[-1])
        elif tb is not None:
            entries.append(_judged_pair(ma, ta, mb, tb, walker, values, atol, rtol,
                                        (verdicts, tolerance_given)))
        elif ta.name in tied_a:
            entries.append(_tied_pair(ma, ta, mb, tied_a[ta.name], walker, values, atol, rtol,
                                      "B"))
        elif ta.name in fused_a:
            for rows, part in fused_a[ta.name]:
                e = _pair(ma, rows, mb, part, walker, values, atol, rtol)
                e.changes.append(f"fused: rows of A's {ta.name} are B's {part.name}")
                entries.append(e)
        elif ta.name in parts_a:
            continue   # compared with its rows of B's fused tensor, below
        elif ta.name in renamed:
            tb = renamed[ta.name]
            entries.append(TensorDiff("renamed", ta.name, tb.name, ta, tb,
                                      [f"name {ta.name} -> {tb.name}"],
                                      _identical(ta.numel)))
        else:
            entries.append(TensorDiff("removed", ta.name, None, ta, None))
    for key, tb in kb.items():
        if key not in ka and tb.name in fused_b:
            for part, rows in ((p, r) for r, p in fused_b[tb.name]):
                e = _pair(ma, part, mb, rows, walker, values, atol, rtol)
                e.changes.append(f"fused: A's {part.name} is rows of B's {tb.name}")
                entries.append(e)
            continue
        if key not in ka and tb.name in parts_b:
            continue
        if key not in ka and tb.name in tied_b:
            e = _tied_pair(ma, tied_b[tb.name], mb, tb, walker, values, atol, rtol, "A")
            e.name_a = None     # listed under B's name: A stores it once under the other
            entries.append(e)
        elif key not in ka and tb.name not in renamed_b:
            entries.append(TensorDiff("added", None, tb.name, None, tb))

    try:
        entries = [e.result() if isinstance(e, Future) else e for e in entries]
    except BaseException:
        for f in lanes:   # the models are closed next: no lane may still be reading them
            f.cancel()
        wait(lanes)
        raise
    rel_a.flush()
    rel_b.flush()
    result = DiffResult(a_path=ma.path, b_path=mb.path, a_format=ma.format, b_format=mb.format,
                        entries=entries, prefix_a=pa, prefix_b=pb,
                        metadata=_metadata_diff(ma, mb), atol=float(atol), rtol=float(rtol),
                        values_compared=bool(values), strip_prefix=tuple(strip),
                        maps=tuple(maps), tolerance_given=bool(tolerance_given))
    if verdicts:
        judge_all(entries, ma, mb, tolerance_given=tolerance_given)
        result.verdict = pair_verdict(entries, values_compared=bool(values),
                                      formats=(ma.format, mb.format))
    return result
