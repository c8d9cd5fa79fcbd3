"""The rank test's sample gathered by the value pass (issue 26): the compiled pass copies the
sampled elements out of each block it reads (`_diffkernel.stats` with positions) and numpy's
take is its twin; both are held to `lowrank.gather` (the sample read apart), at any alignment,
over the serial and the threaded pass, and the verdicts they lead to are those of the sample
read apart."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tensorscope import diffing, lowrank
from tensorscope.diffing import diff_models

from test_diff import raw_model
from test_rank_routes import assert_same_estimate

needs_kernel = pytest.mark.skipif(diffing._KERNEL is None, reason="the compiled pass is not built")

_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.uint8, np.int16,
           np.int32, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz]


def _values(rng, dt, n: int) -> np.ndarray:
    dt = np.dtype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -100), min(info.max, 100), n).astype(dt)
    return (rng.standard_normal(n) * 2).astype(dt)


def _at_offset(arr: np.ndarray, offset: int) -> np.ndarray:
    """``arr``'s bytes ``offset`` bytes into a fresh buffer (any alignment), as ``arr``'s dtype
    (a writable view)."""
    raw = np.zeros(offset + arr.nbytes + 16, np.uint8)
    out = raw[offset:offset + arr.nbytes].view(arr.dtype)
    out[...] = arr
    return out


@pytest.fixture
def route(kernel_route):
    """Each compiled route in turn (conftest's `kernel_route`)."""
    return kernel_route


@needs_kernel
@pytest.mark.parametrize("dt", _DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mixed", [False, True])
def test_compiled_gather_equals_numpy_take(dt, mixed, route):
    """Every dtype code (and a pair of two codes, widened block by block), pieces that are not a
    multiple of the kernel's block, positions first, last, dense, sparse and none, inputs and
    outputs at odd addresses: the copies equal numpy's take and the figures those of the call
    without positions."""
    rng = np.random.default_rng(26)
    other = np.float32 if mixed else dt
    for n in (1, 17, 511, 512, 513, 3001):
        a, b = _values(rng, dt, n), _values(rng, other, n)
        lo = int(rng.integers(0, 1 << 40))   # the piece's place in a large tensor
        for pick in ("all", "first_last", "sparse", "none"):
            if pick == "all":
                rel = np.arange(n)
            elif pick == "first_last":
                rel = np.unique([0, n - 1])
            elif pick == "sparse":
                rel = np.sort(rng.choice(n, max(1, n // 7), replace=False))
            else:
                rel = np.arange(0)
            pos = rel.astype(np.int64) + lo
            want_a, want_b = np.zeros(pos.size, a.dtype), np.zeros(pos.size, b.dtype)
            diffing.take(a, b, pos, lo, want_a, want_b)
            assert np.array_equal(want_a.view(np.uint8), a[rel].view(np.uint8))
            for off in (0, 1, 3):
                pa, pb = _at_offset(a, off), _at_offset(b, off + 2)
                out_a = _at_offset(np.zeros(pos.size, a.dtype), off + 1)
                out_b = _at_offset(np.zeros(pos.size, b.dtype), off + 5)
                acc = diffing._Accumulator(1e-8, 1e-5, max(n, 8), False)
                assert acc._kernel(pa, pb, (_at_offset(pos, off), lo, out_a, out_b)), (n, pick)
                ref = diffing._Accumulator(1e-8, 1e-5, max(n, 8), False)
                assert ref._kernel(a, b)
                assert np.array_equal(out_a.view(np.uint8), want_a.view(np.uint8)), (n, pick, off)
                assert np.array_equal(out_b.view(np.uint8), want_b.view(np.uint8)), (n, pick, off)
                for f in ("sum_sq", "xx", "yy", "dot", "sum_abs", "max_abs", "max_rel",
                          "mismatched", "zero_ref", "count"):
                    assert getattr(acc, f) == getattr(ref, f), (f, n, pick, off)


@needs_kernel
def test_compiled_gather_refuses_positions_outside_the_piece():
    """Positions before or past the piece, descending, a negative start, outputs of another
    length, a positions buffer that is not whole int64s: refused before the pass (ValueError),
    nothing read or written out of bounds (the sanitizer builds run this too)."""
    k = diffing._KERNEL
    a = np.arange(100, dtype=np.float16).view(np.uint16)
    b = (np.arange(100, dtype=np.float16) + 1).view(np.uint16)

    def call(pos, lo, na=None, nb=None):
        pos = np.asarray(pos, np.int64)
        oa = np.zeros(len(pos) if na is None else na, np.uint16)
        ob = np.zeros(len(pos) if nb is None else nb, np.uint16)
        return k.stats(a, "e", b, "e", 1e-8, 1e-5, b"", b"", pos, lo, oa, ob), oa, ob

    got, oa, ob = call([1000, 1050, 1099], 1000)
    assert got is not None and list(oa) == list(a[[0, 50, 99]]) and list(ob) == list(b[[0, 50, 99]])
    for pos, lo, na, nb in (([999], 1000, None, None), ([1100], 1000, None, None),
                            ([5, 3], 0, None, None), ([0], -1, None, None),
                            ([-1], -1, None, None), ([1, 2], 0, 1, None), ([1, 2], 0, None, 3),
                            ([2**63 - 1], 0, None, None), ([-2**63], -2**63, None, None)):
        with pytest.raises(ValueError):
            call(pos, lo, na, nb)
    with pytest.raises(ValueError):
        k.stats(a, "e", b, "e", 1e-8, 1e-5, b"", b"", b"1234567", 0, np.zeros(0, np.uint16),
                np.zeros(0, np.uint16))
    # at the largest start, a position within the piece is taken, one past it refused
    top = 2**63 - 101
    got, oa, _ = call([top + 99], top)
    assert got is not None and oa[0] == a[99]
    with pytest.raises(ValueError):
        call([top + 100], top)


def _matrices(rng, shapes, dt):
    """A, and B = A plus noise (full rank) or plus a rank-3 update, per shape."""
    xs, ys = {}, {}
    for i, shape in enumerate(shapes):
        a = (rng.standard_normal(shape) * 0.02).astype(dt)
        if i % 2:
            delta = rng.standard_normal((shape[0], 3)) @ rng.standard_normal((3, shape[1])) * 1e-2
        else:
            delta = rng.standard_normal(shape) * 1e-3
        xs[f"m{i}.weight"], ys[f"m{i}.weight"] = a, (a.astype(np.float64) + delta).astype(dt)
    return xs, ys


@pytest.mark.parametrize("kernel", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("threaded", [True, False], ids=["pool", "serial"])
@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16, np.float32],
                         ids=lambda d: np.dtype(d).name)
def test_sample_from_the_pass_equals_the_sample_read_apart(tmp_path, monkeypatch, kernel,
                                                           threaded, dt):
    """Over pieces of every size (small release steps: many pieces per pair; the pool's slices
    or one thread), with the compiled pass or the numpy passes: the sample the value pass
    gathers is `lowrank.gather`'s element for element, stage 1 gives the same estimate, and a
    whole diff gives the verdicts of one whose samples are read apart (a full-rank change is
    "changed", the rank-3 updates "low_rank" of rank 3)."""
    if kernel and diffing._KERNEL is None:
        pytest.skip("the compiled pass is not built")
    if not kernel:
        monkeypatch.setattr(diffing, "_KERNEL", None)
    monkeypatch.setattr(diffing, "RELEASE_BYTES", 4096 + 6)
    monkeypatch.setattr(diffing, "PARALLEL_ELEMS", 5000 if threaded else 1 << 40)
    rng = np.random.default_rng(7)
    shapes = [(160, 192), (203, 77), (48, 1000), (300, 301), (64, 64, 3, 3)]
    xs, ys = _matrices(rng, shapes, dt)
    ma, mb = raw_model(tmp_path / "a.bin", xs), raw_model(tmp_path / "b.bin", ys)
    for ta, tb in zip(ma.tensors, mb.tensors):
        w = diffing._Walker(diffing._Pages(ma), diffing._Pages(mb), None, 16 << 20)
        w.sampling = True
        diffing._compare(w, ma, ta, mb, tb, 1e-8, 1e-5)
        ga, gb = lowrank.gather(ma.read(ta), mb.read(tb))
        # the compiled pass on the stored bytes (one thread) copies it out as stored
        stored = isinstance(w.sample, lowrank.StoredSample)
        assert stored == (kernel and not threaded)
        sa, sb = w.sample.arrays() if stored else w.sample
        assert sa.dtype == np.dtype(dt) and sa.shape == ga.shape
        assert np.array_equal(sa.astype(np.float64), ga)
        assert np.array_equal(sb.astype(np.float64), gb)
        unit = lowrank.rounding_unit(tb.dtype)
        assert_same_estimate(lowrank.rank_of_sample(ta.shape, unit, w.sample),
                             lowrank.sample_rank(ma.read(ta), mb.read(tb), unit))
    got = diff_models(ma, mb)
    with monkeypatch.context() as m:   # the samples read apart, after the pass (as before)
        m.setattr(diffing._Sample, "result", lambda self: None)
        apart = diff_models(ma, mb)
    for e, f in zip(got.entries, apart.entries):
        assert e.verdict.to_dict() == f.verdict.to_dict(), e.name
    kinds = {e.name: e.verdict.kind for e in got.entries}
    assert kinds == {"m0.weight": "changed", "m1.weight": "low_rank", "m2.weight": "changed",
                     "m3.weight": "low_rank", "m4.weight": "changed"}, kinds
    assert {e.verdict.evidence["rank"]["rank"] for e in got.entries
            if e.verdict.kind == "low_rank"} == {3}
    assert got.verdict.to_dict() == apart.verdict.to_dict()


def test_sample_positions_are_the_gathered_submatrix():
    """`lowrank.sample_positions` lists `gather`'s submatrix in C order, ascending."""
    for shape in ((160, 192), (1000, 37), (5, 7), (64, 64, 3, 3), (32000, 1280)):
        m = shape[0]
        n = int(np.prod(shape[1:]))
        rows, cols = lowrank.sample_index(shape)
        pos = lowrank.sample_positions(shape)
        assert pos.size == rows.size * cols.size and np.all(np.diff(pos) > 0)
        x = np.arange(m * n, dtype=np.int64).reshape(shape)
        ga, _ = lowrank.gather(x, x)
        assert np.array_equal(ga.reshape(-1), pos.astype(np.float64))
