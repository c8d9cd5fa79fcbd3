"""The one statistics pass (`tensorscope.valuestats`, `_statskernel.c`) against numpy in float64.

Counts (NaN, Inf, zeros, numel) and extremes exactly; mean and std to 1e-9 relative, for every
dtype the pass reads, any shape and layout, special values, any piece size and any thread split,
with the compiled kernel and with its numpy twins; the kernel's entry points held to the twins
byte for byte, and its argument checks.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorscope import valuestats
from tensorscope.reader import tensor_stats

KERNEL = valuestats._KERNEL
KERNELS = [False, True] if KERNEL is not None else [False]

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8, np.uint8, np.int16,
          np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.bool_, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2fnuz,
          ml_dtypes.float8_e4m3b11fnuz, ml_dtypes.float8_e8m0fnu, np.complex64, np.complex128]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 65504.0, 6e-8, 1e30]


def oracle(arr: np.ndarray) -> dict:
    """What numpy says in float64 (complex: magnitudes), the definition of every figure."""
    with np.errstate(invalid="ignore", over="ignore"):
        x = (np.abs(arr) if arr.dtype.kind == "c" else arr).astype(np.float64).reshape(-1)
    fin = x[np.isfinite(x)]
    out = {"numel": x.size, "nan": int(np.isnan(x).sum()), "inf": int(np.isinf(x).sum()),
           "zeros": int((fin == 0).sum()), "min": None, "max": None, "mean": None, "std": None,
           "mean_abs": float(np.abs(fin).mean()) if fin.size else 0.0}
    if fin.size:
        out.update(min=float(fin.min()), max=float(fin.max()), mean=float(fin.mean()),
                   std=float(fin.std()))
    return out


def assert_matches(got, want: dict) -> None:
    for k in ("numel", "nan", "inf", "zeros", "min", "max"):
        assert getattr(got, k) == want[k], (k, getattr(got, k), want[k])
    if want["mean"] is None:
        assert got.mean is None and got.std is None
        return
    scale = want["mean_abs"]
    assert abs(got.mean - want["mean"]) <= 1e-9 * (abs(want["mean"]) + scale) + 1e-300, (got.mean, want)
    assert abs(got.std - want["std"]) <= 1e-9 * want["std"] + 1e-12 * scale + 1e-300, (got.std, want)


@st.composite
def arrays(draw):
    dt = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 40), min_size=0, max_size=3)))
    n = math.prod(shape)
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    if dt.kind in "iub":
        info = np.iinfo(dt) if dt.kind != "b" else None
        lo, hi = (0, 2) if info is None else (max(info.min, -2 ** 62), min(info.max, 2 ** 62))
        arr = rng.integers(lo, hi, size=n, endpoint=False).astype(dt)
    else:
        spread = draw(st.sampled_from([1.0, 1e-3, 300.0]))
        offset = draw(st.sampled_from([0.0, 0.0, 7.0, -1e4]))
        with np.errstate(over="ignore", invalid="ignore"):
            base = rng.standard_normal(n) * spread + offset
            if dt.kind == "c":
                base = base + 1j * rng.standard_normal(n)
            arr = base.astype(dt)
            for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=6)) if n else []:
                arr[i] = np.asarray(draw(st.sampled_from(SPECIALS))).astype(dt)
    arr = arr.reshape(shape)
    if arr.ndim >= 2 and draw(st.booleans()):
        arr = arr.T            # a strided view: walked a copied piece at a time
    elif arr.ndim >= 1 and arr.shape[0] > 2 and draw(st.booleans()):
        arr = arr[::2]
    return arr


# The compiled float16 routes: 0 the portable loop, 1 AVX2/F16C, 2 AVX-512, as far as the CPU has them.
SIMD = list(range(KERNEL.SIMD + 1)) if KERNEL is not None else [0]


class simd_path:
    """``with simd_path(level):`` the kernel's float16 route for the block (restored after)."""

    def __init__(self, level: int):
        self.level = level

    def __enter__(self):
        self.was = KERNEL.simd(self.level) if KERNEL is not None else 0

    def __exit__(self, *exc):
        if KERNEL is not None:
            KERNEL.simd(self.was)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(arr=arrays(), step=st.sampled_from([1, 7, 64, 1024, 1 << 20]), workers=st.integers(1, 4),
       counts=st.booleans(), kernel=st.sampled_from(KERNELS), simd=st.sampled_from(SIMD))
def test_pass_equals_numpy(arr, step, workers, counts, kernel, simd, monkeypatch):
    # thresholds down so that small arrays take every route: threads, counters, steps
    monkeypatch.setattr(valuestats, "PARALLEL_BYTES", 64)
    monkeypatch.setattr(valuestats, "COUNT_ELEMS", {1: 16, 2: 64})
    with simd_path(simd):
        got = valuestats.summarize(arr, step_bytes=step, workers=workers, want_counts=counts,
                                   kernel=kernel)
    assert_matches(got.stats(), oracle(arr))


F16_SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, -65504.0, 6e-8, -6e-8,
                         6.1e-5, 1.0, -1.0], dtype=np.float16)


@pytest.mark.skipif(len(SIMD) < 2, reason="no float16 vector path on this CPU")
@settings(max_examples=200, deadline=None)
@given(n=st.sampled_from([0, 1, 15, 16, 17, 31, 32, 33, 48, 2047, 2048, 2049, 2064, 4096, 4111,
                          10_000, 70_001]),
       seed=st.integers(0, 2 ** 32 - 1), skip=st.integers(0, 7),
       scale=st.sampled_from([1.0, 1e-3, 3e4, 1e-7]), offset=st.sampled_from([0.0, 7.0, -2e3]),
       specials=st.lists(st.tuples(st.floats(0, 1), st.integers(0, len(F16_SPECIALS) - 1)), max_size=5),
       first=st.booleans())
def test_f16_vector_path_equals_portable_and_numpy(n, seed, skip, scale, offset, specials, first):
    """The AVX2/F16C and AVX-512 float16 blocks (all-finite blocks summed exactly, blocks with an
    Inf or a NaN handed to the portable path, the tail of fewer than 16 elements too) against the
    portable loop and numpy, at every alignment, around the block and vector edges."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(n) * scale + offset).astype(np.float16)
    for where, which in specials:
        if n:
            x[min(n - 1, int(where * n))] = F16_SPECIALS[which]
    head = x[np.isfinite(x)][:1]
    shift = float(head[0]) if first and head.size else 0.0   # what the pass gives: `_shift_of`
    buf = bytearray(b"\0" * skip + x.tobytes())
    view = memoryview(buf)[skip:]
    with simd_path(0):
        slow = KERNEL.moments(view, "e", b"", shift)
    fasts = []
    for level in SIMD[1:]:
        with simd_path(level):
            fasts.append(KERNEL.moments(view, "e", b"", shift))
    want = valuestats._moments_numpy(x.astype(np.float64), shift)
    fin = x[np.isfinite(x)].astype(np.longdouble)
    big = float(np.abs(fin).max(initial=0))
    for got in [slow] + fasts:
        assert got[:6] == want[:6]                       # counts and extremes exactly
        assert got[6] == pytest.approx(want[6], rel=1e-12, abs=1e-15 * (big + abs(shift)))
        assert got[7] == pytest.approx(want[7], rel=1e-9, abs=1e-300)
    if fin.size:
        # the vector path sums the halves exactly (no shift is taken off them first): its m2
        # is the exact one (long double, from the exact mean) to rounding
        d = fin - fin.sum() / fin.size
        for fast in fasts:
            assert fast[7] == pytest.approx(float((d * d).sum()), rel=1e-11, abs=1e-300)


@pytest.mark.skipif(KERNEL is None, reason="the compiled kernel is not built")
@pytest.mark.parametrize("simd", SIMD)
def test_f16_every_pattern(simd):
    """All 65,536 float16 bit patterns, shuffled: NaN/Inf/zero counts and extremes exactly, by
    the block (with NaNs and Infs) and by all-finite blocks (the finite patterns alone)."""
    bits = np.random.default_rng(4).permutation(np.arange(1 << 16, dtype=np.uint32)).astype(np.uint16)
    every = bits.view(np.float16)
    finite = every[np.isfinite(every)]
    for arr in (every, finite, finite[finite <= 0], finite[finite >= 0]):
        with simd_path(simd):
            got = valuestats.summarize(arr, kernel=True).stats()
        assert_matches(got, oracle(arr))


@pytest.mark.skipif(KERNEL is None, reason="the compiled kernel is not built")
@pytest.mark.parametrize("simd", SIMD)
@pytest.mark.parametrize("value", [0.0, -0.0, 65504.0, -65504.0, 6e-8, 2.0 ** -14, 1.0, -7.5])
def test_f16_constant_blocks(simd, value):
    """One value throughout (std exactly 0: the block mean of an exact sum is the value)."""
    arr = np.full(3 * 2048 + 5, value, dtype=np.float16)
    with simd_path(simd):
        got = valuestats.summarize(arr, kernel=True).stats()
    assert_matches(got, oracle(arr))
    assert got.std == 0.0 and got.mean == float(arr[0])


@settings(max_examples=100, deadline=None)
@given(arr=arrays(), pieces=st.integers(1, 9), kernel=st.sampled_from(KERNELS))
def test_pieces_merge_like_one_pass(arr, pieces, kernel):
    """An iterable of pieces (decoded values arrive so) merges to numpy's figures."""
    flat = arr.reshape(-1)
    cuts = np.array_split(flat, pieces)
    assert_matches(valuestats.summarize(iter(cuts), kernel=kernel).stats(), oracle(arr))


@pytest.mark.skipif(KERNEL is None, reason="the compiled kernel is not built")
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=4000), code=st.sampled_from("tebhHfdiIqQ"), skip=st.integers(0, 7),
       shift=st.sampled_from([0.0, 1.0, -3.5, 1e4]), simd=st.sampled_from(SIMD))
def test_kernel_moments_equal_twin(data, code, skip, shift, simd):
    """Any bytes, at any alignment: the kernel's moments are the twin's (counts and extremes
    exactly, sums to rounding)."""
    dt = {"t": np.dtype(ml_dtypes.float8_e4m3fn), "e": np.dtype(np.float16),
          "b": np.dtype(ml_dtypes.bfloat16), "h": np.dtype(np.int16), "H": np.dtype(np.uint16),
          "f": np.dtype(np.float32), "d": np.dtype(np.float64), "i": np.dtype(np.int32),
          "I": np.dtype(np.uint32), "q": np.dtype(np.int64), "Q": np.dtype(np.uint64)}[code]
    data = data[skip:]
    data = data[: len(data) // dt.itemsize * dt.itemsize]
    buf = bytearray(b"\0" * skip + data)
    view = memoryview(buf)[skip:]   # misaligned on purpose: loads go through memcpy
    table = valuestats._pattern_values(dt).tobytes() if code == "t" else b""
    with simd_path(simd):
        got = KERNEL.moments(view, code, table, shift)
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.frombuffer(data, dtype=dt).astype(np.float64)
    if code == "d":   # squares of float64 beyond 1e154 overflow (numpy's too): compare the rest
        x = x[~(np.abs(x) > 1e150)]
        if x.size != len(data) // 8:
            return
    want = valuestats._moments_numpy(x, shift)
    assert got[:6] == pytest.approx(want[:6], rel=0, abs=0, nan_ok=True) or got[:6] == want[:6]
    assert got[6] == pytest.approx(want[6], rel=1e-9, abs=1e-12 * (np.abs(x[np.isfinite(x)]).max(initial=0)))
    assert got[7] == pytest.approx(want[7], rel=1e-9, abs=1e-12 * (float(np.square(x[np.isfinite(x)]).sum()) + 1e-300))


@pytest.mark.skipif(KERNEL is None, reason="the compiled kernel is not built")
@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), width=st.sampled_from([1, 2]), lanes=st.integers(1, 8),
       skip=st.integers(0, 3))
def test_kernel_counts_equal_bincount(data, width, lanes, skip):
    data = data[: len(data) // width * width]
    buf = bytearray(b"\0" * skip + data)
    counts = np.zeros((lanes, 1 << (8 * width)), dtype=np.uint64)
    KERNEL.count(memoryview(buf)[skip:], width, counts)
    KERNEL.count(memoryview(buf)[skip:], width, counts)   # counters add up across calls
    want = np.bincount(np.frombuffer(data, dtype=np.uint8 if width == 1 else np.uint16),
                       minlength=1 << (8 * width)) * 2
    assert (counts.sum(axis=0) == want).all()


@pytest.mark.skipif(KERNEL is None, reason="the compiled kernel is not built")
def test_kernel_refuses_what_it_cannot_prove():
    c16 = np.zeros(65536, np.uint64)
    with pytest.raises(ValueError):
        KERNEL.count(b"abc", 2, c16)                        # not whole elements
    with pytest.raises(ValueError):
        KERNEL.count(b"ab", 3, c16)                         # no such width
    with pytest.raises(ValueError):
        KERNEL.count(b"ab", 2, np.zeros(65535, np.uint64))  # counters of the wrong size
    with pytest.raises(ValueError):
        KERNEL.count(b"ab", 1, np.zeros((9, 256), np.uint64))  # too many lanes
    with pytest.raises(TypeError):
        KERNEL.count(b"ab", 1, b"\0" * 2048)                # counters must be writable
    with pytest.raises(ValueError):
        KERNEL.moments(b"abc", "f", b"", 0.0)                    # not whole elements
    with pytest.raises(ValueError):
        KERNEL.moments(b"abcd", "z", b"", 0.0)                   # unknown code
    with pytest.raises(ValueError):
        KERNEL.moments(b"a", "t", b"\0" * 100, 0.0)              # table of the wrong size
    with pytest.raises(ValueError):
        KERNEL.moments(b"abcd", "f", b"", math.nan)         # a shift must be finite
    assert KERNEL.moments(b"", "d", b"", 0.0)[:4] == (0.0, 0, 0, 0)


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.int8,
                                np.uint16, np.bool_])
@pytest.mark.parametrize("bins,lo,hi", [(40, None, None), (7, -1.0, 0.5), (3, 2.0, 2.0)])
def test_histogram_from_counters_equals_numpy(dt, bins, lo, hi):
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal(5000) * 4).astype(dt)
    s = valuestats.summarize(arr, want_counts=True)
    x = arr.astype(np.float64)
    x = x[np.isfinite(x)]
    lo = float(x.min()) if lo is None else lo
    hi = float(x.max()) if hi is None else hi
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    assert s.has_histogram
    assert s.histogram(lo, hi, bins) == np.histogram(x, bins=bins, range=(lo, hi))[0].tolist()


def test_wide_dtypes_keep_no_counters():
    s = valuestats.summarize(np.arange(10, dtype=np.float32))
    assert not s.has_histogram and s.histogram(0, 9, 4) is None


def test_offset_data_is_stable():
    """Values far from zero with a tiny spread: the naive sum of squares loses every digit of
    the variance; deviations from a near value, per block, merged by Chan's update keep them. The
    reference is exact to ~1e-16 (x - x[0] is exact, then long double); numpy's own std is
    2.4e-9 off here (its float64 mean is one ulp of 1e9 away from the true one)."""
    rng = np.random.default_rng(2)
    x = 1e9 + rng.standard_normal(3_000_000) * 1e-3
    y = (x - x[0]).astype(np.longdouble)
    d = y - y.mean()
    exact = float(np.sqrt((d * d).mean()))
    for kernel in KERNELS:
        got = valuestats.summarize(x, kernel=kernel, step_bytes=1 << 16, workers=3).stats()
        assert got.std == pytest.approx(exact, rel=1e-12)
        assert got.mean == pytest.approx(float(x.mean()), rel=1e-15)


def test_threads_give_the_same_figures_as_one(monkeypatch):
    monkeypatch.setattr(valuestats, "PARALLEL_BYTES", 1 << 16)
    rng = np.random.default_rng(3)
    for arr in (rng.standard_normal(400_001).astype(np.float16),
                rng.standard_normal(300_001).astype(np.float32)):
        one = valuestats.summarize(arr, workers=1).stats()
        for w in (2, 3, 8):
            many = valuestats.summarize(arr, workers=w).stats()
            assert (many.numel, many.nan, many.inf, many.zeros, many.min, many.max) == \
                (one.numel, one.nan, one.inf, one.zeros, one.min, one.max)
            assert many.mean == pytest.approx(one.mean, rel=1e-12)
            assert many.std == pytest.approx(one.std, rel=1e-12)


def test_release_sees_every_step_as_a_view(monkeypatch):
    arr = np.arange(1 << 16, dtype=np.float32)
    seen = []
    valuestats.summarize(arr, release=lambda p: seen.append((p.__array_interface__["data"][0], p.nbytes)),
                         step_bytes=1 << 12, workers=1)
    base = arr.__array_interface__["data"][0]
    assert sorted(seen) == [(base + i, 1 << 12) for i in range(0, arr.nbytes, 1 << 12)]


def test_cancelled_between_steps():
    with pytest.raises(valuestats.Cancelled):
        valuestats.summarize(np.ones(1000), cancelled=lambda: True)


def test_tensor_stats_is_the_pass():
    arr = np.array([1.0, np.nan, np.inf, -2.0, 0.0, -0.0] * 301)
    assert_matches(tensor_stats(arr), oracle(arr))


_SANITIZED = r"""
import importlib.util, sys, random
import numpy as np
spec = importlib.util.spec_from_file_location("_statskernel", sys.argv[1])
K = importlib.util.module_from_spec(spec); spec.loader.exec_module(K)
rnd = random.Random(0)
table = np.arange(256, dtype=np.float64).tobytes()
for trial in range(3000):
    K.simd(trial % 3)   # each float16 route: portable, AVX2/F16C, AVX-512 (as far as the CPU has them)
    n = rnd.choice([0, 1, 2, 3, 7, 8, 15, 16, 17, 1023, 1024, 1025, 4095, 4096, 4099, 8210])
    skip = rnd.randrange(8)
    raw = bytearray(rnd.getrandbits(8) for _ in range(n + skip))
    view = memoryview(raw)[skip:]
    for code, size in (("t", 1), ("e", 2), ("b", 2), ("h", 2), ("H", 2), ("f", 4), ("i", 4),
                       ("I", 4), ("d", 8), ("q", 8), ("Q", 8)):
        part = view[: len(view) // size * size]
        K.moments(part, code, table if code == "t" else b"", rnd.choice([0.0, 1.5, -1e300]))
    # finite halves only (exponent bits below 31): the all-finite vector blocks, not only the
    # hand-over of blocks with an Inf or a NaN that random bytes nearly always have
    halves = np.frombuffer(bytes(raw[skip:skip + (n // 2) * 2]), dtype=np.uint16) & 0xBFFF
    fin = bytearray(b"\0" * skip + halves.tobytes())
    K.moments(memoryview(fin)[skip:], "e", b"", rnd.choice([0.0, 1.5, -1e300]))
    for width in (1, 2):
        part = view[: len(view) // width * width]
        lanes = rnd.randint(1, 8)
        K.count(part, width, np.zeros((lanes, 1 << (8 * width)), np.uint64))
for bad in ((b"abc", 2, np.zeros(65536, np.uint64)), (b"ab", 1, np.zeros(255, np.uint64))):
    try:
        K.count(*bad)
    except ValueError:
        pass
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gcc's sanitizers, Linux")
def test_kernel_under_asan_and_ubsan(tmp_path):
    """The kernel built with AddressSanitizer and UndefinedBehaviorSanitizer (any report aborts)
    over random bytes at every alignment, every code, lane count and length around the block."""
    import shutil
    import sysconfig
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    src = Path(__file__).resolve().parent.parent / "tensorscope" / "_statskernel.c"
    so = tmp_path / "_statskernel.so"
    build = subprocess.run([gcc, "-O1", "-g", "-fsanitize=address,undefined",
                            "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-fopenmp-simd",
                            "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(src),
                            "-o", str(so)], capture_output=True, text=True)
    if build.returncode != 0:
        pytest.skip(f"no sanitizer runtime: {build.stderr[-300:]}")
    libs = [subprocess.run([gcc, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
            for lib in ("libasan.so", "libubsan.so")]
    env = {**os.environ, "LD_PRELOAD": ":".join(libs), "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    out = subprocess.run([sys.executable, "-c", _SANITIZED, str(so)], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
