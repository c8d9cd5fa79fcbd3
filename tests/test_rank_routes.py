"""The rank test's sketch pass, held to the slow routes it replaces and to the exact SVD.

- `lowrank._to_float32` widens every float16 and bfloat16 bit pattern as numpy and ml_dtypes do.
- `lowrank.sketch_rank` (float32 sketches, X = pinv(ΨQ)·Z) is the single-pass algorithm it
  names (a float64 lstsq reference on the same test matrices), and its share of ‖ΔW‖² is off
  the exact SVD's by about the share outside the top r, in every float dtype.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tensorscope import lowrank


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_to_float32_is_the_exact_cast_of_every_bit_pattern(dtype):
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype).reshape(256, 256)
    for view in (x, x[:, ::3], x[::2]):     # contiguous, strided columns, strided rows
        out = np.empty(view.shape, np.float32)
        lowrank._to_float32(view, out)
        want = view.astype(np.float32)
        nan = np.isnan(want)
        assert (np.isnan(out) == nan).all()
        assert (out[~nan].view(np.uint32) == want[~nan].view(np.uint32)).all()


def _alg7_share(a, b, rank: int) -> float:
    """Tropp, Yurtsever, Udell and Cevher's alg. 7 in float64 with lstsq, on the test matrices
    `sketch_rank` draws: the reference its float32 sketches and pinv are held to."""
    d = b.astype(np.float64) - a.astype(np.float64)
    m, n = d.shape
    k = min(rank + lowrank.OVERSAMPLE, m, n)
    omega, psi = (x.astype(np.float64) for x in lowrank._test_matrices(m, n, k, min(2 * k + 1, m)))
    q, _ = np.linalg.qr(d @ omega)
    x = np.linalg.lstsq(psi @ q, psi @ d, rcond=None)[0]
    sv = np.linalg.svd(x, compute_uv=False)
    return float(min(1.0, np.sum(sv[:rank] ** 2) / np.sum(d * d)))


def _exact_share(a, b, rank: int) -> float:
    d = b.astype(np.float64) - a.astype(np.float64)
    sv = np.linalg.svd(d, compute_uv=False)
    return float(np.sum(sv[:rank] ** 2) / np.sum(sv ** 2))


def _pair(dtype, rank, noise):
    rng = np.random.default_rng(rank)
    m, n = 300, 420
    a = rng.standard_normal((m, n)) * 0.02
    delta = rng.standard_normal((m, rank)) @ rng.standard_normal((rank, n)) * 1e-3 / rank
    delta += noise * np.linalg.norm(delta) / np.sqrt(m * n) * rng.standard_normal((m, n))
    return a.astype(dtype), (a + delta).astype(dtype)


DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
IDS = ["float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rank,noise", [(4, 0.0), (16, 0.05), (40, 0.3)])
def test_sketch_is_the_single_pass_algorithm(dtype, rank, noise):
    a, b = _pair(dtype, rank, noise)
    d = b.astype(np.float64) - a.astype(np.float64)
    est = lowrank.sketch_rank(a, b, rank, float(np.sum(d * d)))
    assert est.stage == "sketch" and est.rank == rank
    assert abs(est.explained - _alg7_share(a, b, rank)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rank,noise", [(1, 0.0), (8, 0.0), (64, 0.0), (16, 0.05), (40, 0.3)])
def test_sketch_share_is_off_by_about_the_remainder(dtype, rank, noise):
    """The estimate against the exact SVD of ΔW: its error is of the order of the share of ΔW
    outside the top r (what the module docstring says: here within twice it, plus 0.2%), and
    none where that share is float32's rounding. The same whether its test matrices come from
    the cache or are drawn afresh."""
    a, b = _pair(dtype, rank, noise)
    d = b.astype(np.float64) - a.astype(np.float64)
    est = lowrank.sketch_rank(a, b, rank, float(np.sum(d * d))).explained
    exact = _exact_share(a, b, rank)
    assert abs(est - exact) <= 2 * (1 - exact) + 2e-3, (est, exact)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(lowrank, "CACHED_TEST_ELEMS", 0)   # drawn afresh: the same matrices
        assert lowrank.sketch_rank(a, b, rank, float(np.sum(d * d))).explained == est
    if noise == 0 and np.dtype(dtype).itemsize >= 4:
        assert abs(est - exact) < 1e-4, (est, exact)


# -- stage 1 in C (`_diffkernel.spectrum`) against its numpy twin -----------------------------------

needs_kernel = pytest.mark.skipif(lowrank._KERNEL is None, reason="the compiled pass is not built")


def assert_same_estimate(got: lowrank.RankEstimate, want: lowrank.RankEstimate) -> None:
    """Two routes' stage-1 estimates: the rank, stage and sketch size exactly; the share and the
    singular values to float64's rounding of their different summation orders."""
    assert (got.rank, got.stage, got.sketch) == (want.rank, want.stage, want.sketch)
    assert got.explained == pytest.approx(want.explained, rel=1e-9, abs=1e-12)
    top = max(want.singular, default=0.0)
    assert len(got.singular) == len(want.singular)
    assert got.singular == pytest.approx(want.singular, rel=1e-7, abs=1e-7 * top)


def _stored(a: np.ndarray, b: np.ndarray, name: str) -> lowrank.StoredSample:
    return lowrank.StoredSample(a.tobytes(), b.tobytes(), name, a.shape[0], a.shape[1])


_SAMPLE_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
                  "float64": np.float64, "int8": np.int8, "int16": np.int16, "int32": np.int32,
                  "uint8": np.uint8, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
                  "float8_e5m2": ml_dtypes.float8_e5m2}


def _sample_pair(rng, kind: str, s: int, c: int, dt):
    a = rng.standard_normal((s, c)) * 0.5
    if kind == "noise":          # a fine-tune's change: full rank
        d = rng.standard_normal((s, c)) * 1e-2
    elif kind == "square":       # the same, but read from a matrix that the sample is all of
        d = rng.standard_normal((s, c)) * 1e-2
    elif kind == "lowrank":      # a merged adapter
        d = rng.standard_normal((s, 4)) @ rng.standard_normal((4, c)) * 1e-2
    elif kind == "lowrank+noise":
        d = rng.standard_normal((s, 6)) @ rng.standard_normal((6, c)) * 1e-2 \
            + rng.standard_normal((s, c)) * 1e-5
    else:                        # nothing changed in the sample
        d = np.zeros((s, c))
    if np.dtype(dt).kind in "iu":
        a, d = np.round(a * 20), np.round(d * 2000)
        if np.dtype(dt).kind == "u":
            a = np.abs(a)
            d = np.abs(d)
    return a.astype(dt), (a + d).astype(dt)


@needs_kernel
@pytest.mark.parametrize("name", sorted(_SAMPLE_DTYPES))
@pytest.mark.parametrize("kind", ["noise", "square", "lowrank", "lowrank+noise", "zero"])
@pytest.mark.parametrize("shape", [(160, 192), (192, 100), (37, 53), (16, 16)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_compiled_stage_one_is_the_numpy_route(name, kind, shape):
    """`rank_of_sample` on a `StoredSample` (C: Gram matrix, Cholesky certificate, else its
    eigenvalues by Householder tridiagonalisation and Sturm bisection) gives what the numpy
    route (BLAS Gram matrix, LAPACK's cholesky and eigvalsh) gives on the same sample, for every
    dtype the compiled pass reads as stored, both orientations of the Gram matrix, full-rank,
    square, low-rank and all-zero changes."""
    rng = np.random.default_rng(abs(hash((name, kind, shape))) % 2**32)
    s, c = shape
    if kind == "square":
        c = s
    a, b = _sample_pair(rng, kind, s, c, _SAMPLE_DTYPES[name])
    matrix = (s, c) if kind == "square" else (4 * s, 4 * c)
    unit = lowrank.rounding_unit(name)
    got = lowrank.rank_of_sample(matrix, unit, _stored(a, b, name))
    want = lowrank.rank_of_sample(matrix, unit, (a, b))
    assert_same_estimate(got, want)
    if kind == "lowrank" and np.dtype(_SAMPLE_DTYPES[name]).kind == "f" and unit <= 2.0 ** -8:
        assert got.rank == 4, got   # the rounding of B's dtype stays under the noise threshold


@needs_kernel
@pytest.mark.parametrize("shape", [(50, 80), (90, 40), (1, 7), (7, 1), (2, 2), (160, 192)])
@pytest.mark.parametrize("scale", [1.0, 1e-150, 1e150], ids=["unit", "tiny", "huge"])
def test_compiled_count_is_lapacks(shape, scale):
    """For a Gram matrix the certificate rejects, the C count (Householder tridiagonalisation,
    eigenvalues by Sturm bisection, scaled by a power of two) gives the rank, the largest
    eigenvalues and their sum that LAPACK's eigvalsh gives, to float64's resolution (ε·λmax),
    whatever the magnitude of the values."""
    rng = np.random.default_rng(shape[0] * 100 + shape[1])
    s, c = shape
    a = rng.standard_normal((s, c)) * scale
    b = a + rng.standard_normal((s, 3)) @ rng.standard_normal((3, c)) * scale   # rank <= 3
    unit = 2.0 ** -53
    got = lowrank._KERNEL.spectrum(a.tobytes(), "d", b.tobytes(), "d", s, c, unit, True)
    d = b - a
    gram = d @ d.T if s <= c else d.T @ d
    sq = np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, None)
    if not isinstance(got, tuple):   # full rank of a 1 x n or n x 1 sample: certified
        assert got == 1 and min(s, c) <= 3
        return
    total, sumsq_b, r, top_sum, top = got
    assert total == pytest.approx(np.trace(gram), rel=1e-12)
    assert sumsq_b == pytest.approx(float(np.sum(b * b)), rel=1e-12)
    floor = unit * unit * float(np.sum(b * b))
    assert r == lowrank._noise_rank(sq.tolist(), float(np.trace(gram)), floor, (s, c)) == \
        min(3, s, c)
    resolution = 64 * np.finfo(float).eps * sq[0]
    assert top_sum == pytest.approx(float(sq[:r].sum()), abs=resolution)
    assert len(top) == min(r + 4, 12, s, c)
    np.testing.assert_allclose(top, sq[:len(top)], rtol=0, atol=resolution)


@needs_kernel
def test_compiled_stage_one_flags_what_is_not_finite_and_refuses_bad_samples():
    k = lowrank._KERNEL
    a = np.ones((4, 5), np.float32)
    for bad in (np.nan, np.inf):
        b = a.copy()
        b[2, 3] = bad
        assert k.spectrum(a.tobytes(), "f", b.tobytes(), "f", 4, 5, 2.0 ** -24, True) == -1
        est = lowrank.rank_of_sample((40, 50), 2.0 ** -24, _stored(a, b, "float32"))
        assert est == lowrank.rank_of_sample((40, 50), 2.0 ** -24, (a, b))
    raw = a.tobytes()
    for args in ((raw, "f", raw, "f", 4, 4, 0.1),         # not s x c elements
                 (raw, "f", raw, "f", 5, 5, 0.1),
                 (raw, "t", raw, "t", 4, 5, 0.1),         # a table code: not taken here
                 (raw, "x", raw, "f", 4, 5, 0.1),         # no such code
                 (raw, "f", raw, "f", 0, 5, 0.1),
                 (raw, "f", raw, "f", -4, -5, 0.1),
                 (raw, "f", raw, "f", 1 << 40, 1 << 40, 0.1),   # s·c overflows: refused first
                 (raw, "f", raw, "f", 4, 5, 1.0),         # a unit outside [0, 1)
                 (raw, "f", raw, "f", 4, 5, float("nan"))):
        with pytest.raises(ValueError):
            k.spectrum(*args, True)
