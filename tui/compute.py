"""Value work for the UI, in bounded memory and cancellable between chunks.

`summary` is the library's one pass over a tensor's values (`tensorscope.valuestats`: each
element read once, float64 sums merged by Chan's update, the worker can stop between steps);
its `Summary` gives `chunked_stats` and, for one- and two-byte dtypes (float16, bfloat16, float8,
int8), the `histogram` from the same read (counts per bit pattern); wider dtypes read the values a
second time for the histogram, once its range is known. `diff_histogram` counts values into fixed
bins chunk by chunk, so memory never grows with the tensor; `preview_window` cuts a 2-D window for the value table.
None of these copy more than one chunk at a time.

Quantized, packed and block dtypes are shown by their decoded values (`tensorscope.dequant`):
`stream_values` gives a `Decoded` stand-in that `chunked_stats` and `histogram` stream piece by
piece, `values_of` the decoded float32 array (a copy) for the preview and the diff histogram.
A dtype that cannot be decoded falls back to its stored bytes (`is_raw` then says so).
"""
from __future__ import annotations

import math
from typing import Callable, Iterator

import numpy as np

from tensorscope.dequant import is_decoded, iter_decoded
from tensorscope.errors import FormatError, TensorscopeError
from tensorscope.reader import TensorStats, iter_flat_chunks
from tensorscope.valuestats import Cancelled, Summary, summarize

__all__ = ["Cancelled", "Decoded", "stream_values", "values_of", "is_raw", "summary", "chunked_stats", "histogram", "diff_histogram", "paired_chunks",
           "as_matrix", "step_lead", "preview_window", "HIST_BINS"]

HIST_BINS = 40
_CHUNK = 4 << 20  # float64 working copies stay at a few MiB per chunk


def _check(cancelled: Callable[[], bool] | None) -> None:
    if cancelled is not None and cancelled():
        raise Cancelled()


class Decoded:
    """The decoded values of a quantized/packed tensor, streamed (never whole in memory)."""

    dtype = np.dtype(np.float32)

    def __init__(self, model, info):
        self.model, self.info = model, info

    def pieces(self) -> Iterator[np.ndarray]:
        return iter_decoded(self.model, self.info, _CHUNK // 8)


def stream_values(model, info):
    """What `chunked_stats`/`histogram` walk: a `Decoded` for decodable dtypes, else `read`."""
    if is_decoded(info.dtype):
        try:
            iter_decoded(model, info, _CHUNK // 8)  # checks the dtype and the bytes up front
            return Decoded(model, info)
        except FormatError:
            raise
        except TensorscopeError:  # a dtype we cannot decode: show its stored bytes
            pass
    return model.read(info)


def values_of(model, info) -> np.ndarray:
    """`ModelFile.values` (decoded float32 copy for quantized/packed dtypes), or the stored bytes
    for a dtype that cannot be decoded."""
    try:
        return model.values(info)
    except FormatError:
        raise
    except TensorscopeError:
        return model.read(info)


def _pieces(arr) -> Iterator[np.ndarray]:
    return arr.pieces() if isinstance(arr, Decoded) else iter_flat_chunks(arr, _CHUNK)


def is_raw(info, arr: np.ndarray) -> bool:
    """True when ``read`` gave raw bytes (packed/block-quantized dtypes) or non-numeric values."""
    if arr.dtype == np.uint8 and info.dtype != "uint8":
        return True
    return arr.dtype.kind not in "biufcV" or (arr.dtype.kind == "V" and arr.dtype.names is not None)


def _float(piece: np.ndarray) -> np.ndarray:
    if piece.dtype.kind == "c":
        return np.abs(piece).astype(np.float64)
    return piece.astype(np.float64)


def summary(arr, cancelled: Callable[[], bool] | None = None) -> Summary:
    """One pass over ``arr`` (an array or a `Decoded`): `Summary.stats` and, for one- and
    two-byte dtypes, `Summary.histogram` without a second read. Raises `Cancelled` between steps."""
    values = arr.pieces() if isinstance(arr, Decoded) else arr
    return summarize(values, cancelled=cancelled, want_counts=True, step_bytes=_CHUNK)


def chunked_stats(arr: np.ndarray, cancelled: Callable[[], bool] | None = None) -> TensorStats:
    """`tensor_stats` over ``arr`` in one pass (`summary`); raises `Cancelled` between chunks."""
    return summary(arr, cancelled).stats()


def _bin_range(lo: float, hi: float) -> tuple[float, float]:
    if lo == hi:  # a constant tensor still gets a visible bar in the middle
        return lo - 0.5, hi + 0.5
    return lo, hi


def histogram(arr: np.ndarray, lo: float, hi: float, bins: int = HIST_BINS,
              cancelled: Callable[[], bool] | None = None, done: Summary | None = None) -> list[int]:
    """Counts of finite values of ``arr`` in ``bins`` equal bins over ``[lo, hi]``: from ``done``
    (the `summary` of ``arr``) when it kept its counters, else by reading the values again."""
    rng = _bin_range(lo, hi)
    if done is not None:
        got = done.histogram(rng[0], rng[1], bins)
        if got is not None:
            return got
    counts = np.zeros(bins, dtype=np.int64)
    for piece in _pieces(arr):
        _check(cancelled)
        x = _float(piece)
        x = x[np.isfinite(x)]
        counts += np.histogram(x, bins=bins, range=rng)[0]
    return counts.tolist()


def paired_chunks(a: np.ndarray, b: np.ndarray, chunk_elems: int = _CHUNK // 8
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Matching 1-D pieces of two arrays of the same shape (C order), one piece copied at a time."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size == 0:
        return
    if a.ndim == 0:
        yield a.reshape(1), b.reshape(1)
        return
    row = math.prod(a.shape[1:]) or 1
    if row > chunk_elems and a.ndim > 1:
        for i in range(a.shape[0]):
            yield from paired_chunks(a[i], b[i], chunk_elems)
        return
    rows = max(1, chunk_elems // row)
    for i in range(0, a.shape[0], rows):
        yield (np.ascontiguousarray(a[i:i + rows]).reshape(-1),
               np.ascontiguousarray(b[i:i + rows]).reshape(-1))


def diff_histogram(a: np.ndarray, b: np.ndarray, bins: int = HIST_BINS,
                   cancelled: Callable[[], bool] | None = None) -> tuple[list[int], float, float]:
    """Histogram of ``a - b`` in float64 over finite differences; two chunked passes
    (range, then counts). Returns ``(counts, lo, hi)``."""
    lo, hi = math.inf, -math.inf
    for x, y in paired_chunks(a, b):
        _check(cancelled)
        d = _float(x) - _float(y)
        d = d[np.isfinite(d)]
        if d.size:
            lo, hi = min(lo, float(d.min())), max(hi, float(d.max()))
    if lo > hi:
        return [0] * bins, 0.0, 0.0
    rng = _bin_range(lo, hi)
    counts = np.zeros(bins, dtype=np.int64)
    for x, y in paired_chunks(a, b):
        _check(cancelled)
        d = _float(x) - _float(y)
        counts += np.histogram(d[np.isfinite(d)], bins=bins, range=rng)[0]
    return counts.tolist(), lo, hi


ROW_WIDTH_1D = 10  # a 1-D tensor is laid out in rows of 10, labelled by their first index


def as_matrix(arr: np.ndarray, lead: tuple[int, ...] | None = None) -> tuple[np.ndarray | None, int, str]:
    """A 2-D view for the preview: ndim>2 takes the slice at leading indices ``lead`` (zeros by
    default), 1-D is shown in rows of `ROW_WIDTH_1D` (returned as the 1-D array with ``width``);
    returns ``(view, width, label)``."""
    if arr.ndim == 0:
        return arr.reshape(1, 1), 1, "scalar"
    if arr.ndim == 1:
        return arr, ROW_WIDTH_1D, "1-D, 10 per row"
    if arr.ndim == 2:
        return arr, arr.shape[1], "2-D"
    lead = tuple(lead) if lead is not None else (0,) * (arr.ndim - 2)
    return arr[lead], arr.shape[-1], "[" + ", ".join(str(i) for i in lead) + ", :, :]"


def step_lead(lead: tuple[int, ...], shape: tuple[int, ...], step: int, axis: int | None = None
              ) -> tuple[int, ...]:
    """The next (``step`` 1) or previous (-1) leading index: along ``axis`` only, or, when
    ``axis`` is None, like an odometer over every leading axis (the last one turns fastest), so
    one key walks every 2-D slice. Stays put at either end."""
    dims = shape[:len(lead)]
    if axis is not None:
        new = lead[axis] + step
        return lead if not 0 <= new < dims[axis] else lead[:axis] + (new,) + lead[axis + 1:]
    flat = 0
    for i, d in zip(lead, dims):
        flat = flat * d + i
    flat += step
    total = math.prod(dims)
    if not 0 <= flat < total:
        return lead
    out = []
    for d in reversed(dims):
        out.append(flat % d)
        flat //= d
    return tuple(reversed(out))


def preview_window(arr: np.ndarray, row0: int, col0: int, rows: int, cols: int,
                   lead: tuple[int, ...] | None = None) -> tuple[list[int], list[int], list[list]]:
    """Row labels, column labels and the values (Python scalars) of a window of the matrix view."""
    view, width, _ = as_matrix(arr, lead)
    if view.ndim == 1:
        n = view.shape[0]
        nrows = -(-n // width)
        r_idx = list(range(row0, min(row0 + rows, nrows)))
        c_idx = list(range(col0, min(col0 + cols, width)))
        cells = []
        for r in r_idx:
            line = []
            for c in c_idx:
                k = r * width + c
                line.append(view[k].item() if k < n else None)
            cells.append(line)
        return [r * width for r in r_idx], c_idx, cells
    r_idx = list(range(row0, min(row0 + rows, view.shape[0])))
    c_idx = list(range(col0, min(col0 + cols, view.shape[1])))
    block = view[r_idx[0]:r_idx[-1] + 1, c_idx[0]:c_idx[-1] + 1] if r_idx and c_idx else None
    if block is None:
        return r_idx, c_idx, [[] for _ in r_idx]
    if block.dtype.kind == "V":  # ml_dtypes (bfloat16, float8): widen for display
        block = block.astype(np.float64)
    return r_idx, c_idx, block.tolist()
