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
