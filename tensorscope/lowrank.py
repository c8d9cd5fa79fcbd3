"""Is ΔW = B − A a low-rank update? Its numerical rank, estimated without a full SVD.

Two stages, so that a pair of full-rank changes (a fine-tune, where every tensor is a candidate)
costs almost nothing and only a true candidate pays for a pass over its delta:

1. `sample_rank`: the rank of ΔW restricted to a random submatrix of at most `SAMPLE_ROWS` rows
   and `SAMPLE_ROWS` + 32 columns, gathered from the zero-copy views (a few pages per row), or
   by the diff's value pass from the pieces it reads (`sample_positions`, `rank_of_sample`);
   its rows and columns are drawn by a splitmix64 stream seeded by `SEED`. A submatrix of a
   rank-r matrix has rank at most r, and for a generic rank-r update exactly r, so a full-rank
   sample rejects the tensor at once (the cost of a fine-tune's pair is ~0.1 ms). A sample the
   compiled pass copied from stored bytes (`StoredSample`) is judged in C (`_diffkernel.c`,
   ``spectrum``), without numpy; the numpy route is its twin.
2. `sketch_rank`: the single-pass randomized SVD of Tropp, Yurtsever, Udell and Cevher (2017,
   "Practical sketching algorithms for low-rank matrix approximation", alg. 7): ΔW is read ONCE,
   in blocks of rows, into a range sketch Y = ΔW·Ω (m × k) and a co-range sketch Z = Ψ·ΔW
   (l × n), k = r₀ + `OVERSAMPLE`, l = 2k + 1, with Gaussian Ω and Ψ (a fixed seed: the figures
   do not change between runs). Then Q = qr(Y), X = (ΨQ)⁺Z ≈ QᵀΔW and the singular values of the
   small X estimate the top k of ΔW: the share of ‖ΔW‖²_F that the top r explain. An estimate:
   what lies outside the range of Q leaks into X (its energy, times k/(l - k - 1) = 1, spread
   over X's rows), so its error is of the order of the share of ΔW outside the top r, mostly
   upward: exact where the remainder is float32 rounding, a few points high where it is a tenth
   of ΔW (a small update rounded to bfloat16, or an update plus a fine-tune's noise); measured
   against the exact SVD in tests/test_rank_routes.py.

The rank r is stage 1's: the singular values of the sample that stand above its noise, the
rounding floor of B's dtype (a merge in bfloat16 adds rounding error of full rank: |e| ≤ u·|b|,
u = 2^-p, so Σe² ≤ u²‖B‖² = F) — above what a random matrix of energy F reaches.

No full SVD of a big matrix is ever taken: the decompositions are of the sample (at most
160 x 192, as the eigenvalues of its Gram matrix) and of X (k x n, k <= ~150).
"""
from __future__ import annotations

import functools
import math
import threading
from array import array
from dataclasses import dataclass
from typing import Iterator

from . import dtypes
from .lazyimport import lazy_module
from .native import optional_extension

np = lazy_module("numpy")   # imported by the first value that goes through numpy


__all__ = ["RankEstimate", "StoredSample", "gather", "sample_index", "sample_shape",
           "sample_positions", "stored_positions", "sample_rank",
           "rank_of_sample", "sketch_rank", "rounding_unit", "max_rank", "SAMPLE_ROWS",
           "OVERSAMPLE"]

SAMPLE_ROWS = 160       # rows of the stage-1 sample (columns: 32 more, so that a noise sample's
                        # smallest singular value stays well above the rounding threshold)
OVERSAMPLE = 10         # sketch columns beyond the sample's rank
BLOCK_ELEMS = 1 << 18   # elements of ΔW per block of rows in the sketch pass (1 MiB buffers)
SEED = 0x7E5C0

# The compiled pass (`_diffkernel.c`), shared with `tensorscope.diffing`: its ``spectrum`` is stage
# 1 (`rank_of_sample`) on a `StoredSample`, whose twin is the numpy route below.
KERNEL_ABI = 8   # what `_diffkernel.c` must say it is (a stale build is ignored, not called)
_KERNEL = optional_extension("_diffkernel", KERNEL_ABI)
# the kernel's codes of the dtypes whose stored bytes it reads as they are
STORED_CODES = {"float16": "e", "bfloat16": "b", "float32": "f", "float64": "d", "int8": "c",
                "uint8": "B", "int16": "h", "int32": "i", "float8_e5m2": "E",
                "float8_e4m3fn": "F"}

# float dtypes -> bits of significand (with the implicit bit): the unit roundoff is 2^-p
_SIGNIFICAND = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8, "float8_e4m3fn": 4,
                "float8_e4m3fnuz": 4, "float8_e5m2": 3, "float8_e5m2fnuz": 3}


def rounding_unit(dtype: str) -> float:
    """Unit roundoff 2^-p of a float dtype (0.0 for integer dtypes, whose values are exact)."""
    p = _SIGNIFICAND.get(dtype)
    return 0.0 if p is None else 2.0 ** -p


def max_rank(shape: tuple[int, ...]) -> int:
    """The largest rank still called low: a quarter of min(shape) ("r ≪ min(shape)"), and below
    what the stage-1 sample can tell from full rank."""
    m, n = _matrix_shape(shape)
    return min(min(m, n) // 4, SAMPLE_ROWS - 2 * OVERSAMPLE)


@dataclass(slots=True)
class RankEstimate:
    rank: int               # numerical rank (as defined in the module docstring)
    explained: float        # share of ‖ΔW‖²_F explained by the top `rank` singular values
    sketch: int             # columns of the range sketch (or rows of the sample, stage 1)
    singular: list[float]   # the leading estimated singular values (at most rank + 4)
    stage: str              # "sample" (rejected at stage 1) or "sketch"

    def to_dict(self) -> dict:
        return {"rank": self.rank, "explained": self.explained, "sketch": self.sketch,
                "singular_values": self.singular, "stage": self.stage}


def _matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """A tensor of rank >= 2 as a matrix: (shape[0], prod(shape[1:])) (a conv kernel's
    (out, in·kh·kw), as LoRA for convolutions factors it)."""
    m = int(shape[0])
    return m, int(math.prod(shape[1:]))


def _noise_rank(sq: list[float], total: float, floor: float, shape: tuple[int, int]) -> int:
    """How many squared singular values ``sq`` (descending) of an s × c matrix stand above its
    noise: above what a full-rank rounding error of total energy ``floor`` can reach (the largest
    squared singular value of a random s × c matrix of energy F is about F·(1/√s + 1/√c)², taken
    4x), and above 1e-12 of the largest (float64's own error)."""
    if total <= 0 or not sq:
        return 0
    tau = _threshold(sq[0], floor, shape)
    return sum(1 for x in sq if x > tau)


def _counted(sq: list[float], total: float, floor: float, shape: tuple[int, int]) -> RankEstimate:
    """Stage 1's estimate from the sample's squared singular values ``sq`` (descending, >= 0)."""
    r = _noise_rank(sq, total, floor, shape)
    share = min(1.0, sum(sq[:r]) / total) if total > 0 else 1.0
    return RankEstimate(r, share, shape[0], [math.sqrt(x) for x in sq[:min(r + 4, 12)]], "sample")


def _threshold(top: float, floor: float, shape: tuple[int, int]) -> float:
    """The noise threshold of `_noise_rank` (``top``: the largest squared singular value, or a
    bound of it: the largest diagonal entry of the Gram matrix is at most that)."""
    s, c = shape
    return max(1e-12 * top, 4.0 * floor * (1 / math.sqrt(s) + 1 / math.sqrt(c)) ** 2)


def _float(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def _splitmix64(state: int) -> Iterator[int]:
    """The splitmix64 generator (Steele, Lea and Flood 2014): 64-bit words from a 64-bit state."""
    mask = (1 << 64) - 1
    while True:
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        yield z ^ (z >> 31)


def _below(words: Iterator[int], bound: int) -> int:
    """A uniform integer in [0, bound) (bound < 2^64), by rejection: no modulo bias."""
    limit = (1 << 64) - (1 << 64) % bound
    while True:
        w = next(words)
        if w < limit:
            return w % bound


def _choose(words: Iterator[int], population: int, count: int) -> list[int]:
    """``count`` distinct integers of [0, population), sorted: Floyd's algorithm (count draws)."""
    if count >= population:
        return list(range(population))
    chosen: set[int] = set()
    for j in range(population - count, population):
        t = _below(words, j + 1)
        chosen.add(j if t in chosen else t)
    return sorted(chosen)


@functools.lru_cache(maxsize=64)
def _sample_rows_cols(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """`sample_index` as tuples of ints, drawn in Python (no numpy, so that a diff whose values
    the compiled pass reads from their stored bytes never imports it): rows, then columns, from
    one splitmix64 stream seeded by `SEED`."""
    m, n = _matrix_shape(shape)
    words = _splitmix64(SEED)
    s, c = sample_shape(shape)
    rows, cols = _choose(words, m, s), _choose(words, n, c)
    return tuple(rows), tuple(cols)


def sample_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of stage 1's submatrix of a tensor of this shape."""
    m, n = _matrix_shape(shape)
    return min(m, SAMPLE_ROWS), min(n, SAMPLE_ROWS + 32)


@functools.lru_cache(maxsize=64)
def sample_index(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1's rows and columns of a tensor of this shape (as a matrix, `_matrix_shape`):
    sorted, fixed by `SEED` and the shape (the same positions on both sides and in every run;
    cached, read-only: a checkpoint has few distinct shapes)."""
    rows, cols = _sample_rows_cols(tuple(shape))
    r, c = np.array(rows, np.intp), np.array(cols, np.intp)
    r.flags.writeable = c.flags.writeable = False
    return r, c


@functools.lru_cache(maxsize=64)
def stored_positions(shape: tuple[int, ...]) -> array:
    """The flat (C-order) element positions of `sample_index`'s submatrix, row by row, as int64
    (an ``array``, no numpy): ascending, so the elements a piece ``[lo, hi)`` of the flattened
    tensor holds are one run of them. The value pass gathers the sample from the pieces it reads
    (`tensorscope.diffing`), which `gather` of a C-contiguous view equals element for element."""
    _, n = _matrix_shape(shape)
    rows, cols = _sample_rows_cols(tuple(shape))
    return array("q", [r * n + c for r in rows for c in cols])


@functools.lru_cache(maxsize=64)
def sample_positions(shape: tuple[int, ...]) -> np.ndarray:
    """`stored_positions` as a read-only int64 numpy array (over the same memory)."""
    pos = np.frombuffer(stored_positions(tuple(shape)), np.int64)
    pos.flags.writeable = False
    return pos


@dataclass(frozen=True, slots=True)
class StoredSample:
    """Stage 1's submatrix of A and B as the compiled pass copied it out: ``s`` x ``c`` elements
    of ``dtype`` (our name) a side, their stored bytes in C order (no numpy: `rank_of_sample`
    judges them in C, and makes arrays of them only where the compiled pass is not built)."""
    a: bytes
    b: bytes
    dtype: str
    s: int
    c: int

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        dt = dtypes.numpy_dtype(self.dtype)
        return (np.frombuffer(self.a, dt).reshape(self.s, self.c),
                np.frombuffer(self.b, dt).reshape(self.s, self.c))


def gather(va: np.ndarray, vb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1's random submatrix of both views (same shape, rank >= 2), as float64 copies: rows
    and columns sorted, fixed by `SEED` and the shape (the same positions on both sides and in
    every run). Touches only the pages of the sampled rows."""
    m, n = _matrix_shape(va.shape)
    a2 = va.reshape(m, n) if va.flags.c_contiguous else None
    b2 = vb.reshape(m, n) if vb.flags.c_contiguous else None
    rows, cols = sample_index(tuple(va.shape))
    s = rows.size
    if a2 is None or b2 is None:   # strided views: gather rows first (s rows, not the tensor)
        return (_float(np.take(va[rows].reshape(s, n), cols, axis=1)),
                _float(np.take(vb[rows].reshape(s, n), cols, axis=1)))
    # rows, then columns: two takes cost a fifth of one 2-D fancy index (measured)
    return (_float(np.take(np.take(a2, rows, axis=0), cols, axis=1)),
            _float(np.take(np.take(b2, rows, axis=0), cols, axis=1)))


_LOCAL = threading.local()


def _scratch(s: int, c: int) -> tuple[np.ndarray, ...]:
    """This thread's buffers for `rank_of_sample` on an s x c sample: A and B in float64, their
    difference, the Gram matrix and its shifted copy (made once per thread and sample shape)."""
    got = getattr(_LOCAL, "scratch", None)
    if got is None or got[0].shape != (s, c):
        k = min(s, c)
        got = _LOCAL.scratch = (np.empty((s, c)), np.empty((s, c)), np.empty((s, c)),
                                np.empty((k, k)), np.empty((k, k)))
    return got


def _to_float32(x: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = x`` as float32 (``out`` C-contiguous, x's shape), exactly: bfloat16, which
    ml_dtypes casts element by element, by shifting its bits into float32's upper half; the rest
    by numpy's cast (for float16 a 65,536-entry table was faster alone and slower beside the
    diff's streaming pass, whose traffic evicts it: measured on the LoRA pair)."""
    if x.dtype.name == "bfloat16" and x.dtype.itemsize == 2:
        np.left_shift(x.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)
    else:
        np.copyto(out, x, casting="unsafe")


CACHED_TEST_ELEMS = 1 << 20   # test matrices up to this many elements (4 MiB) are kept


def _test_matrices(m: int, n: int, k: int, l_: int) -> tuple[np.ndarray, np.ndarray]:
    """The sketch's Gaussian Ω (n x k) and Ψ (l x m) in float32, fixed by `SEED` (read-only).
    Small ones are cached (a checkpoint has few shapes, and drawing them cost ~1 ms a matrix);
    an embedding's (Ψ is l x vocabulary) are drawn each time, so the cache stays a few MiB."""
    if n * k + l_ * m <= CACHED_TEST_ELEMS:
        return _cached_test_matrices(m, n, k, l_)
    return _draw_test_matrices(m, n, k, l_)


def _draw_test_matrices(m: int, n: int, k: int, l_: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    omega = rng.standard_normal((n, k)).astype(np.float32)
    psi = rng.standard_normal((l_, m)).astype(np.float32)
    omega.flags.writeable = psi.flags.writeable = False
    return omega, psi


_cached_test_matrices = functools.lru_cache(maxsize=8)(_draw_test_matrices)


def sample_rank(va: np.ndarray, vb: np.ndarray, unit: float,
                sample: tuple[np.ndarray, np.ndarray] | None = None) -> RankEstimate:
    """Stage 1 over the views ``va``, ``vb``: the numerical rank of ΔW on the random submatrix
    (`gather`, or ``sample`` when the caller gathered it already: the diff does while the pair's
    pages are in memory)."""
    return rank_of_sample(va.shape, unit, sample if sample is not None else gather(va, vb))


def rank_of_sample(shape: tuple[int, ...], unit: float,
                   sample: tuple[np.ndarray, np.ndarray] | StoredSample) -> RankEstimate:
    """Stage 1 on a gathered ``sample`` (A's and B's submatrices: `gather`'s float64 copies, the
    elements in their own dtype, or a `StoredSample`) of a tensor of ``shape``: what
    `sample_rank` computes, without the views (the diff gathers the sample in its value pass, so
    a rejected candidate costs no view and no page). A `StoredSample` is judged by the compiled
    ``spectrum``: the same Cholesky test in C and, when it fails, the same count, from the
    eigenvalues it needs (`_counted`'s figures), without numpy."""
    m, n = _matrix_shape(shape)
    if isinstance(sample, StoredSample):
        code = STORED_CODES.get(sample.dtype)
        if _KERNEL is not None and code is not None:
            # the same steps in C, without numpy (most candidates are a fine-tune's: full rank)
            s, c = sample.s, sample.c
            got = _KERNEL.spectrum(sample.a, code, sample.b, code, s, c, unit,
                                   min(s, c) > max_rank((m, n)))
            if got == 1:
                return RankEstimate(min(s, c), 1.0, s, [], "sample")
            if got == -1:
                return RankEstimate(min(s, c), 0.0, s, [], "sample")
            total, _, r, top_sum, top = got   # `_counted`'s figures, counted in C
            share = min(1.0, top_sum / total) if total > 0 else 1.0
            return RankEstimate(r, share, s, [math.sqrt(x) for x in top], "sample")
        sample = sample.arrays()
    s, c = sample[0].shape
    ra, rb, d, gram, shifted = _scratch(s, c)
    with np.errstate(all="ignore"):
        # float64 copies (exact) of either side, in buffers of this thread: arrays of ~250 KB
        # made per tensor came from fresh maps, faulted in page by page (measured: most of the
        # cost of a fine-tune's rejected samples)
        np.copyto(ra, sample[0], casting="unsafe")
        np.copyto(rb, sample[1], casting="unsafe")
        np.subtract(rb, ra, out=d)
        # the squared singular values as the eigenvalues of the small Gram matrix (a fifth of
        # an SVD's time; their absolute error, ~1e-16·σ₁², is far below the energies compared)
        np.matmul(d, d.T, out=gram) if s <= c else np.matmul(d.T, d, out=gram)
        total = float(np.trace(gram))
        if not math.isfinite(total):   # a NaN or Inf in ΔW (or squares past float64's range)
            return RankEstimate(min(s, c), 0.0, s, [], "sample")
        floor = unit * unit * float(np.dot(rb.ravel(), rb.ravel()))
        # Every eigenvalue above the noise threshold (a full-rank sample, a fine-tune's case)
        # exactly when Cholesky of gram - tau*I succeeds: a tenth of the eigenvalues' cost
        tau = _threshold(float(np.max(np.diag(gram))) if total > 0 else 0.0, floor, d.shape)
        k = gram.shape[0]
        if total > 0 and k > max_rank((m, n)):
            np.copyto(shifted, gram)   # gram - tau*I: the same values, without a k x k eye
            diag = shifted.reshape(-1)[::k + 1]
            np.subtract(diag, tau, out=diag)
            try:
                np.linalg.cholesky(shifted)
                return RankEstimate(k, 1.0, s, [], "sample")
            except np.linalg.LinAlgError:
                pass   # some eigenvalue is at or below tau: count them
        sq = np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None)
    return _counted(sq.tolist(), total, floor, (s, c))


def sketch_rank(va: np.ndarray, vb: np.ndarray, rank: int, total: float,
                release=None) -> RankEstimate:
    """Stage 2: the single-pass sketch (module docstring) of ΔW = vb − va with ``rank`` +
    `OVERSAMPLE` range columns, reading both views once in blocks of rows: the share of ‖ΔW‖²_F
    (``total``, exact from the value pass) that the top ``rank`` singular
    values explain. The sketches are float32 products (their error, ~√n·2⁻²⁴ relative, is far
    below the estimate's own; float16 and bfloat16 values are exact in float32), into buffers
    made once. ``release(side, piece)`` is called with each block of rows
    once it is used (map pages handed back)."""
    m, n = _matrix_shape(va.shape)
    k = max(1, min(rank + OVERSAMPLE, m, n))
    l_ = min(2 * k + 1, m)
    omega, psi = _test_matrices(m, n, k, l_)
    y = np.empty((m, k), np.float32)
    z = np.zeros((l_, n), np.float32)
    step = max(1, min(m, BLOCK_ELEMS // max(n, 1)))
    da, db = np.empty((step, n), np.float32), np.empty((step, n), np.float32)
    fa, fb = va.reshape(m, n), vb.reshape(m, n)   # a copy only for strided views
    with np.errstate(all="ignore"):
        for i in range(0, m, step):
            j = min(m, i + step)
            pa, pb = fa[i:j], fb[i:j]
            d, t = db[:j - i], da[:j - i]
            _to_float32(pb, d)
            _to_float32(pa, t)
            np.subtract(d, t, out=d)
            np.matmul(d, omega, out=y[i:j])
            z += psi[:, i:j] @ d
            if release is not None:
                release("a", pa)
                release("b", pb)
    if not (math.isfinite(total) and total > 0 and np.isfinite(y).all() and np.isfinite(z).all()):
        return RankEstimate(k, 0.0, k, [], "sketch")
    y, z, psi = y.astype(np.float64), z.astype(np.float64), psi.astype(np.float64)
    q, _ = np.linalg.qr(y)
    # X = (ΨQ)⁺Z: ΨQ is a small (2k+1) x k Gaussian-like matrix, well conditioned; its
    # pseudo-inverse times Z is lstsq's minimum-norm solution at a tenth of gelsd's time (which
    # solves the n right-hand sides one SVD step at a time: 2.5 ms of a 1280-column sketch's 11)
    x = np.linalg.pinv(psi @ q) @ z
    sv = np.linalg.svd(x, compute_uv=False)
    r = min(rank, sv.size)
    share = float(min(1.0, np.sum(sv[:r] ** 2) / total))
    return RankEstimate(r, share, k, [float(v) for v in sv[:min(r + 4, 12)]], "sketch")
