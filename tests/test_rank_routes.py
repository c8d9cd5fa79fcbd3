"""The rank test's fast routes are held to the slow ones they replace.

- `blas.cholesky_succeeds` (LAPACK ?potrf through numpy's OpenBLAS) says what
  ``numpy.linalg.cholesky`` says, in float64 and float32, on matrices either side of positive
  definite.
- `lowrank._full_rank_f32` (the float32 certificate) never calls a sample full rank that the
  float64 test does not, and does call the fine-tune's noise full rank (else it saves nothing):
  the whole `rank_of_sample` is the same with and without it, on noise, low-rank updates of every
  rank up to past `max_rank`, scaled to the edge of the noise threshold, in every float dtype.
"""
from __future__ import annotations

import numpy as np
import pytest

from tensorscope import blas, lowrank


def _numpy_says(m: np.ndarray) -> bool:
    try:
        np.linalg.cholesky(m)
        return True
    except np.linalg.LinAlgError:
        return False


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cholesky_succeeds_is_numpys_answer(dtype):
    rng = np.random.default_rng(7)
    seen = set()
    for _ in range(600):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 60))
        x = rng.standard_normal((n, k))
        g = x @ x.T
        # shifted to either side of the smallest eigenvalue, and exactly singular ones
        ev = np.linalg.eigvalsh(g)
        shift = ev[0] + rng.uniform(-1, 1) * abs(ev[0]) + 1e-9 * rng.standard_normal()
        if dtype == np.float32 and abs(shift - ev[0]) < 1e-4 * ev[-1]:
            continue   # within float32's rounding of the edge: either answer is right
        g = np.ascontiguousarray((g - shift * np.eye(n)).astype(dtype))
        want = _numpy_says(g.copy())
        assert blas.cholesky_succeeds(g.copy()) == want
        seen.add(want)
    assert seen == {True, False}


def test_cholesky_succeeds_refuses_what_lapack_cannot_take():
    for bad in (np.eye(3, dtype=np.float16), np.eye(4)[:, :3], np.eye(4)[::2, ::2],
                np.eye(3, dtype=np.int64)):
        with pytest.raises(ValueError):
            blas.cholesky_succeeds(bad)
    frozen = np.eye(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        blas.cholesky_succeeds(frozen)


def _pair(rng, dtype, shape, rank, scale):
    """A sample-sized (A, B) pair in ``dtype``: B = A + a rank-``rank`` update (full-rank noise
    when ``rank`` is None) of size ``scale`` relative to A."""
    s, c = shape
    a = rng.standard_normal((s, c)) * 0.02
    if rank is None:
        delta = rng.standard_normal((s, c))
    else:
        delta = rng.standard_normal((s, rank)) @ rng.standard_normal((rank, c)) / np.sqrt(rank)
    b = a + 0.02 * scale * delta
    cast = (lambda x: x.astype(dtype)) if not isinstance(dtype, str) else \
        (lambda x: x.astype(np.dtype(dtype)))
    return cast(a), cast(b)


DTYPES = [np.float16, np.float32, np.float64, "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "float32", "float64", "bfloat16"])
def test_float32_certificate_agrees_with_the_float64_test(dtype, monkeypatch):
    if dtype == "bfloat16":
        import ml_dtypes
        dtype = ml_dtypes.bfloat16
    name = np.dtype(dtype).name
    unit = lowrank.rounding_unit(name)
    rng = np.random.default_rng(11)
    shape = (4096, 4096)
    s, c = lowrank.sample_index(shape)[0].size, lowrank.sample_index(shape)[1].size
    certified = 0
    cases = [(None, sc) for sc in (0.5, 1e-1, 1e-3, 1e-5)]
    cases += [(r, sc) for r in (1, 8, 64, lowrank.max_rank(shape), lowrank.max_rank(shape) + 1,
                                s - 2, s) for sc in (1e-1, 1e-3, 1e-6)]
    for rank, scale in cases:
        a, b = _pair(rng, dtype, (s, c), rank, scale)
        fast = lowrank.rank_of_sample(shape, unit, (a, b))
        certified += lowrank._full_rank_f32(shape, unit, (a, b))
        with monkeypatch.context() as m:
            m.setattr(lowrank, "_full_rank_f32", lambda *args: False)
            slow = lowrank.rank_of_sample(shape, unit, (a, b))
        assert fast == slow, (rank, scale)
    assert certified >= 1   # a fine-tune's noise (above B's rounding) at least: the route is taken


def test_float32_certificate_is_taken_by_a_fine_tunes_noise_and_not_by_a_lora():
    rng = np.random.default_rng(3)
    shape = (4096, 11008)
    rows, cols = lowrank.sample_index(shape)
    unit = lowrank.rounding_unit("float16")
    a, b = _pair(rng, np.float16, (rows.size, cols.size), None, 0.05)
    assert lowrank._full_rank_f32(shape, unit, (a, b))
    a, b = _pair(rng, np.float16, (rows.size, cols.size), 16, 0.05)
    assert not lowrank._full_rank_f32(shape, unit, (a, b))
    assert lowrank.rank_of_sample(shape, unit, (a, b)).rank == 16
