"""One pass over a tensor's values: min, max, mean, std, NaN/Inf/zero counts and a histogram.

Shared by `inspect --stats` (`tensorscope.dequant.value_stats`), the TUI's statistics and
histogram (`tensorscope.tui.compute`) and `tensorscope.reader.tensor_stats`. Each element is read
once, the sums are kept in float64, pieces are merged by Chan's update, large contiguous tensors
are split over threads, and the pages of the file's map are handed back behind the pass.

How each dtype is read (the plan, `_plan`):

- **count**: one-byte dtypes (every float8, int8, uint8, bool) of `COUNT_ELEMS` or more, and
  two-byte ones (float16, bfloat16, int16, uint16) where a histogram is wanted (the TUI): one
  increment per element of the counter of its bit pattern
  (`_statskernel.count`, twin ``np.bincount``). The statistics then come from the 256 or 65,536
  (value, count) pairs exactly, and a histogram of any bins is the same as numpy's over the values
  (``np.histogram`` of the pattern values weighted by their counts: same edges, same rule). The
  values of the patterns are numpy's own conversion of each pattern to float64.
- **moments**: every other real dtype numpy widens exactly or by its own rounding (float16,
  bfloat16, float32/64, int16/32/64, uint16/32/64), and small one-byte tensors: `_statskernel.moments` widens blocks of 1,024 elements into float64, takes each
  block's mean and squared deviations in two passes over the cached block and merges the blocks
  by Chan's update. float16 on a CPU with AVX2/F16C (or AVX-512) takes a vector path: blocks of
  2,048 summed exactly in float64, NaN/Inf/zero/min/max in 16-bit integer lanes, blocks with an
  Inf or a NaN handed to the portable loop (``_statskernel.simd(level)`` chooses the route: the
  tests hold each to the others and to numpy). Its twin (`_moments_numpy`) does the same with
  numpy over the piece.
- **numpy**: complex (magnitudes, as `reader.numeric`), non-native byte order and any dtype
  without a code: converted with numpy, then the moments twin.

Semantics (`reader.TensorStats`): ``numel`` every element, ``nan``/``inf`` counted apart, min,
max, mean and std (population) over the finite values, ``zeros`` among them (-0.0 included).

Threads: a contiguous tensor of `PARALLEL_BYTES` or more is cut into one slice per worker
(element-aligned), each slice walked in `STEP_BYTES` steps on the pool with the GIL released in
the kernel, its pages released after each step; the slices' partial results are merged in slice
order, so the figures do not depend on timing. Without the compiled kernel (no C compiler at
install) the twins compute the same figures (``tests/test_stats_kernel.py`` holds them to each
other and to numpy in float64).
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterable, Iterator

from .lazyimport import lazy_module
from .native import optional_extension

np = lazy_module("numpy")   # imported by the first value that goes through numpy


def iter_flat_chunks(arr: np.ndarray, chunk_bytes: int = 8 << 20) -> Iterator[np.ndarray]:
    """Yield 1-D pieces of ``arr`` in C order, each at most ~chunk_bytes, copying only a piece at a
    time when ``arr`` is not contiguous."""
    if arr.size == 0:
        return
    if arr.ndim == 0:
        yield arr.reshape(1)
        return
    per = max(1, chunk_bytes // max(arr.itemsize, 1))
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1)
        for i in range(0, flat.size, per):
            yield flat[i:i + per]
        return
    # Split along the leading axis so each piece is a bounded sub-block.
    row = math.prod(arr.shape[1:]) or 1
    rows = max(1, per // row)
    if rows == 1 and row > per and arr.ndim > 1:
        for i in range(arr.shape[0]):
            yield from iter_flat_chunks(arr[i], chunk_bytes)
        return
    for i in range(0, arr.shape[0], rows):
        yield np.ascontiguousarray(arr[i:i + rows]).reshape(-1)


@dataclass(frozen=True, slots=True)
class TensorStats:
    numel: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int
    zeros: int

    @property
    def zero_fraction(self) -> float:
        return self.zeros / self.numel if self.numel else 0.0

    def to_dict(self) -> dict:
        return {"numel": self.numel, "min": self.min, "max": self.max, "mean": self.mean,
                "std": self.std, "nan": self.nan, "inf": self.inf, "zeros": self.zeros}


__all__ = ["Cancelled", "Summary", "summarize", "STEP_BYTES", "PARALLEL_BYTES"]

KERNEL_ABI = 3   # what `_statskernel.c` must say it is (a stale build is ignored, never called)
_KERNEL = optional_extension("_statskernel", KERNEL_ABI)

STEP_BYTES = 8 << 20        # pages are released behind the pass in steps of this many bytes
PARALLEL_BYTES = 32 << 20   # contiguous tensors this large are split over the thread pool
# Narrow tensors this large use the counters. Measured on one core (ns per element, random
# float16 / all zeros): 16-bit counters 0.44 / 1.81 with one lane, 0.69 / 0.94 with two, the
# moments 0.73 / 0.73 with no folding of 65,536 counters after (~1 ms), and float16's vector
# path 0.22 (AVX-512) / 0.31 (AVX2); 8-bit counters 0.27 with any lanes against 0.73. So
# two-byte dtypes keep counters only where a histogram is wanted.
COUNT_ELEMS = {1: 1 << 12, 2: 1 << 62}
LANES = {1: 4, 2: 2}        # counter lanes per width (runs of one value spread over lanes)
TWIN_ELEMS = 1 << 20        # the numpy twin widens at most this many elements at a time


class Cancelled(Exception):
    """``cancelled()`` said stop between two steps."""


# ml_dtypes is not imported here (0.6 s of start-up, measured): a bfloat16 array exists only
# where the reader imported it, and is recognised by its type's module and name.
# native-order numpy dtypes by (kind, itemsize), told without importing numpy
_CODES = {("f", 2): "e", ("i", 2): "h", ("u", 2): "H", ("f", 4): "f", ("f", 8): "d", ("i", 4): "i",
          ("u", 4): "I", ("i", 8): "q", ("u", 8): "Q"}


def _code(dt: np.dtype) -> str | None:
    if dt.type.__module__.startswith("ml_dtypes"):
        return "b" if dt.name == "bfloat16" and dt.itemsize == 2 else None
    return _CODES.get((dt.kind, dt.itemsize)) if dt.isnative else None


@lru_cache(maxsize=64)
def _pattern_values(dt: np.dtype) -> np.ndarray:
    """numpy's float64 value of every bit pattern of a one- or two-byte dtype."""
    bits = np.arange(1 << (8 * dt.itemsize), dtype=np.uint8 if dt.itemsize == 1 else np.uint16)
    with np.errstate(invalid="ignore", over="ignore"):
        out = bits.view(dt).astype(np.float64)
    out.flags.writeable = False
    return out


def _narrow(dt: np.dtype) -> bool:
    """Dtypes whose values are a function of a 1- or 2-byte pattern (real, native order)."""
    return (dt.itemsize in (1, 2) and dt.isnative and dt.names is None and dt.subdtype is None
            and (dt.kind in "biuf" or (dt.kind == "V" and dt.type.__module__.startswith("ml_dtypes"))))


class _Plan:
    __slots__ = ("how", "code", "table", "width", "dtype")

    def __init__(self, how, dtype, code="", table=b"", width=0):
        self.how, self.dtype, self.code, self.table, self.width = how, dtype, code, table, width


def _plan(dt: np.dtype, numel: int, want_counts: bool) -> _Plan:
    if _narrow(dt):
        if want_counts or numel >= COUNT_ELEMS[dt.itemsize]:
            return _Plan("count", dt, width=dt.itemsize)
        if dt.itemsize == 1:
            return _Plan("moments", dt, "t", _pattern_values(dt).tobytes())
    code = _code(dt) if dt.isnative else None
    if code is not None:
        return _Plan("moments", dt, code)
    return _Plan("numpy", dt)


class _Partial:
    """Mergeable sums of some pieces: moments (Chan) and, for the count plan, counters."""

    __slots__ = ("n", "nan", "inf", "zeros", "count", "mean", "m2", "lo", "hi", "counts", "shift")

    def __init__(self, counts: np.ndarray | None = None, shift: float = 0.0):
        self.shift = shift   # the moments' sums are of x - shift (`mean` too)
        self.n = self.nan = self.inf = self.zeros = self.count = 0
        self.mean = self.m2 = 0.0
        self.lo, self.hi = math.inf, -math.inf
        self.counts = counts

    def add(self, count, nan, inf, zeros, lo, hi, mean, m2) -> None:
        count = int(count)
        self.nan += int(nan)
        self.inf += int(inf)
        self.zeros += int(zeros)
        if count == 0:
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean += delta * (count / total)
        self.m2 += m2 + delta * delta * (self.count * count / total)
        self.count = total
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)

    def merge(self, o: "_Partial") -> None:
        assert o.shift == self.shift, "partials of one pass share its shift"
        self.n += o.n
        if o.counts is not None:
            if self.counts is None:
                self.counts = o.counts.copy()
            else:
                self.counts += o.counts
        self.add(o.count, o.nan, o.inf, o.zeros, o.lo, o.hi, o.mean, o.m2)


def _moments_numpy(x: np.ndarray, shift: float = 0.0) -> tuple:
    """The twin of `_statskernel.moments` over float64 values ``x``: the mean is of x - shift."""
    isnan, isinf = np.isnan(x), np.isinf(x)
    nan, inf = int(np.count_nonzero(isnan)), int(np.count_nonzero(isinf))
    fin = x[~(isnan | isinf)] if nan or inf else x
    zeros = int(np.count_nonzero(fin == 0))
    if fin.size == 0:
        return 0, nan, inf, zeros, math.inf, -math.inf, 0.0, 0.0
    y = fin - shift if shift else fin
    mean = float(y.mean())
    d = y - mean
    return fin.size, nan, inf, zeros, float(fin.min()), float(fin.max()), mean, float(np.dot(d, d))


def _widen_numpy(piece: np.ndarray, plan: _Plan) -> np.ndarray:
    if plan.how == "numpy" and piece.dtype.kind == "c":
        return np.abs(piece).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return piece.astype(np.float64)


def _piece(piece: np.ndarray, plan: _Plan, acc: _Partial, kernel) -> None:
    """Fold one 1-D C-contiguous piece into ``acc``."""
    acc.n += piece.size
    if plan.how == "count":
        bits = piece.view(np.uint8 if plan.width == 1 else np.uint16)
        if kernel is not None:
            kernel.count(bits, plan.width, acc.counts)
        else:
            acc.counts[0] += np.bincount(bits, minlength=1 << (8 * plan.width)).astype(np.uint64)
        return
    if plan.how == "moments" and kernel is not None:
        acc.add(*kernel.moments(piece.view(np.uint8), plan.code, plan.table, acc.shift))
        return
    for i in range(0, piece.size, TWIN_ELEMS):
        acc.add(*_moments_numpy(_widen_numpy(piece[i:i + TWIN_ELEMS], plan), acc.shift))


def _shift_of(flat: np.ndarray, plan: _Plan) -> float:
    """A typical value to sum deviations from: the first finite one among the first few (values
    far from zero with a small spread keep their digits; any choice is correct, a near one exact)."""
    if plan.how == "count" or flat.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        head = _widen_numpy(flat[:64], plan)
    head = head[np.isfinite(head)]
    return float(head[0]) if head.size else 0.0


def _new_partial(plan: _Plan, shift: float = 0.0) -> _Partial:
    if plan.how != "count":
        return _Partial(shift=shift)
    return _Partial(np.zeros((LANES[plan.width], 1 << (8 * plan.width)), dtype=np.uint64))


class Summary:
    """The result of one pass: `stats` (a `reader.TensorStats`) and, for the dtypes read by their
    bit patterns, `histogram` over any range without reading the values again."""

    __slots__ = ("numel", "nan", "inf", "zeros", "count", "mean", "m2", "lo", "hi", "_values",
                 "_weights")

    def __init__(self, acc: _Partial, dtype: np.dtype | None):
        self._values = self._weights = None
        if acc.counts is not None:
            self._fold_counts(acc, dtype)
        self.numel, self.nan, self.inf, self.zeros = acc.n, acc.nan, acc.inf, acc.zeros
        self.count, self.m2, self.lo, self.hi = acc.count, acc.m2, acc.lo, acc.hi
        self.mean = acc.mean + acc.shift

    def _fold_counts(self, acc: _Partial, dtype: np.dtype) -> None:
        """Moments of the (pattern value, count) pairs, merged into ``acc`` (exact counts; the
        mean refined by one correction pass over the 65,536 values)."""
        counts = acc.counts.sum(axis=0, dtype=np.uint64)
        acc.counts = None
        values = _pattern_values(dtype)
        seen = counts > 0
        v, c = values[seen], counts[seen]
        isnan, isinf = np.isnan(v), np.isinf(v)
        fin = ~(isnan | isinf)
        vf, cf = v[fin], c[fin]
        count = int(cf.sum(dtype=np.uint64))
        nan, inf = int(c[isnan].sum(dtype=np.uint64)), int(c[isinf].sum(dtype=np.uint64))
        zeros = int(cf[vf == 0].sum(dtype=np.uint64))
        if count == 0:
            acc.add(0, nan, inf, zeros, math.inf, -math.inf, 0.0, 0.0)
            return
        w = cf.astype(np.float64)
        mean = float(np.dot(w, vf)) / count
        mean += float(np.dot(w, vf - mean)) / count
        d = vf - mean
        acc.add(count, nan, inf, zeros, float(vf.min()), float(vf.max()), mean, float(np.dot(w * d, d)))
        self._values, self._weights = vf, w

    @property
    def has_histogram(self) -> bool:
        """True when `histogram` answers without reading the values again."""
        return self._values is not None or self.count == 0

    def histogram(self, lo: float, hi: float, bins: int) -> list[int] | None:
        """Counts of the finite values in ``bins`` equal bins over ``[lo, hi]`` (numpy's edges and
        rule), or None when this pass kept no counters (wide dtypes: read the values again)."""
        if self.count == 0:
            return [0] * bins
        if self._values is None:
            return None
        got = np.histogram(self._values, bins=bins, range=(lo, hi), weights=self._weights)[0]
        return [int(x) for x in got]

    def stats(self):
        if self.count == 0:
            return TensorStats(self.numel, None, None, None, None, self.nan, self.inf, self.zeros)
        return TensorStats(self.numel, self.lo, self.hi, self.mean, math.sqrt(self.m2 / self.count),
                           self.nan, self.inf, self.zeros)


# -- the pass ------------------------------------------------------------------------------------

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_POOL_PID = 0


def _workers() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(8, os.cpu_count() or 1))


def _pool() -> ThreadPoolExecutor:
    """One pool per process (made on first use, remade after a fork)."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL_PID != os.getpid():
            _POOL = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix="tensorscope-stats")
            _POOL_PID = os.getpid()
        return _POOL


def _walk(flat: np.ndarray, plan: _Plan, kernel, step: int, release, cancelled,
          shift: float) -> _Partial:
    acc = _new_partial(plan, shift)
    for i in range(0, flat.size, step):
        if cancelled is not None and cancelled():
            raise Cancelled()
        piece = flat[i:i + step]
        _piece(piece, plan, acc, kernel)
        if release is not None:
            release(piece)
    return acc


def summarize(values: np.ndarray | Iterable[np.ndarray], *, release: Callable[[np.ndarray], None] | None = None,
              cancelled: Callable[[], bool] | None = None, workers: int | None = None,
              want_counts: bool = False, step_bytes: int = STEP_BYTES, kernel: bool = True) -> Summary:
    """One pass over ``values`` (an array, any layout, or an iterable of 1-D pieces: decoded
    values). ``release(piece)`` is called on every zero-copy step once it has been read (drop its
    pages); ``cancelled()`` is asked between steps (raises `Cancelled`); ``workers`` caps the
    threads (default: one per usable core); ``want_counts`` makes narrow dtypes keep their
    counters whatever their size (a histogram follows for free); ``kernel=False`` runs the twins.
    """
    k = _KERNEL if kernel else None
    if not isinstance(values, np.ndarray):
        acc, dt = None, None
        for piece in values:
            piece = np.ascontiguousarray(piece).reshape(-1)
            if acc is None:
                dt = piece.dtype
                plan = _plan(dt, 0, want_counts)
                acc = _new_partial(plan, _shift_of(piece, plan))
            elif piece.dtype != dt:
                raise TypeError(f"pieces of one tensor changed dtype: {dt} then {piece.dtype}")
            if cancelled is not None and cancelled():
                raise Cancelled()
            _piece(piece, plan, acc, k)
        return Summary(acc or _Partial(), dt)
    arr = values
    plan = _plan(arr.dtype, arr.size, want_counts)
    step = max(1, int(step_bytes) // max(arr.itemsize, 1))
    if arr.size == 0:
        return Summary(_new_partial(plan), arr.dtype)
    if not (arr.flags.c_contiguous or arr.ndim == 0):
        # a piece copied at a time (iter_flat_chunks); nothing to release
        acc = _new_partial(plan, _shift_of(arr.reshape(-1)[:64] if arr.ndim <= 1 else arr[(0,) * (arr.ndim - 1)], plan))
        for piece in iter_flat_chunks(arr, step_bytes):
            if cancelled is not None and cancelled():
                raise Cancelled()
            _piece(np.ascontiguousarray(piece), plan, acc, k)
        return Summary(acc, arr.dtype)
    flat = arr.reshape(-1)
    shift = _shift_of(flat, plan)
    n_workers = min(workers or _workers(), max(1, arr.nbytes // (PARALLEL_BYTES // 2)))
    if n_workers <= 1 or arr.nbytes < PARALLEL_BYTES:
        return Summary(_walk(flat, plan, k, step, release, cancelled, shift), arr.dtype)
    per = -(-flat.size // n_workers)
    jobs = [_pool().submit(_walk, flat[i:i + per], plan, k, step, release, cancelled, shift)
            for i in range(0, flat.size, per)]
    acc = _new_partial(plan, shift)
    error = None
    for job in jobs:   # every job is waited for, in slice order, before anything is raised
        try:
            acc.merge(job.result())
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the other slices
            error = error or e
    if error is not None:
        raise error
    return Summary(acc, arr.dtype)
