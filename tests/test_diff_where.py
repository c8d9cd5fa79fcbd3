"""`diff` for fine-tunes: the fused statistics against torch in float64 over every dtype and piece
boundary (the threaded path included), "where did it change" (grouped norms against an
independent sum), the CLI's --by/--top/-v, names from the file through safetext, and the TUI diff
screen through Textual's Pilot."""
from __future__ import annotations

import json
import math
import os
import time

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tensorscope import diffing, grouping, safetext
from tensorscope.diffing import diff_models, group_changes
from helpers import run_cli

from test_diff import NP_NAMES, check_against, oracle, raw_model, to_torch

NP_NAMES.setdefault(np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn")
NP_NAMES.setdefault(np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2")
_TORCH_FP8 = {np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn,
              np.dtype(ml_dtypes.float8_e5m2): torch.float8_e5m2}
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2, np.int8]


def torch_of(arr: np.ndarray) -> torch.Tensor:
    if arr.dtype in _TORCH_FP8:
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.uint8).copy()).view(
            _TORCH_FP8[arr.dtype])
    return to_torch(arr)


def pair(r, n, da, db, zeros):
    base = r.standard_normal(n) * 4
    xa = base.astype(da)
    xb = (base + r.standard_normal(n) * 0.05).astype(db)
    if zeros:  # exact zeros of the reference: left out of max_rel, counted in zero_ref
        xb[r.random(n) < 0.2] = 0
    return xa, xb


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # monkeypatch.context() per input
@given(n=st.integers(1, 3000), da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES),
       elems=st.sampled_from([1, 7, 64, 8192]), parallel=st.booleans(), zeros=st.booleans(),
       seed=st.integers(0, 2**31), kernel=st.booleans())
def test_fused_statistics_match_torch_float64(tmp_path_factory, monkeypatch, n, da, db, elems,
                                              parallel, zeros, seed, kernel):
    """max_abs and every count exactly, the rest to 1e-6 relative, whatever the dtypes, the
    piece size (``elems`` elements per fused step), the thread split, and with or without the
    compiled pass."""
    xa, xb = pair(np.random.default_rng(seed), n, da, db, zeros)
    d = tmp_path_factory.mktemp("f")
    ma = raw_model(d / "a.bin", {"t": xa})
    mb = raw_model(d / "b.bin", {"t": xb})
    with monkeypatch.context() as m:
        m.setattr(diffing, "FLOAT_ELEMS", elems)
        m.setattr(diffing, "PARALLEL_ELEMS", 100 if parallel else 1 << 40)
        m.setattr(diffing, "RELEASE_BYTES", 256)  # many read-ahead / release steps per slice
        if not kernel:
            m.setattr(diffing, "_KERNEL", None)
        (e,) = diff_models(ma, mb, chunk_bytes=elems * 32).entries
    if e.values.identical_bytes:
        assert xa.dtype == xb.dtype and np.array_equal(xa.view(np.uint8), xb.view(np.uint8))
        return
    check_against(e.values, oracle(torch_of(xa), torch_of(xb)), rel=1e-6)


def test_threaded_slices_fold_to_the_serial_figures(tmp_path, monkeypatch):
    r = np.random.default_rng(5)
    xa, xb = pair(r, 300_000, np.float16, np.float16, zeros=True)
    ma = raw_model(tmp_path / "a.bin", {"t": xa})
    mb = raw_model(tmp_path / "b.bin", {"t": xb})
    monkeypatch.setattr(diffing, "PARALLEL_ELEMS", 1 << 40)
    serial = diff_models(ma, mb).entries[0].values
    monkeypatch.setattr(diffing, "PARALLEL_ELEMS", 1000)
    threaded = diff_models(ma, mb).entries[0].values
    assert threaded.max_abs == serial.max_abs and threaded.mismatched == serial.mismatched
    assert threaded.zero_ref == serial.zero_ref > 0
    for k in ("max_rel", "mean_abs", "rms", "cosine", "norm_a", "norm_diff"):
        assert getattr(threaded, k) == pytest.approx(getattr(serial, k), rel=1e-12), k
    check_against(threaded, oracle(torch_of(xa), torch_of(xb)), rel=1e-9)


# -- the kernel's own shortcuts, each against the exact route -------------------------------------
def test_half_fast_widening_is_exact_on_every_float16():
    """All 65,536 float16 bit patterns: the integer-pass widening equals numpy's cast on every
    finite value (signed zeros and subnormals included), and every Inf/NaN pattern is caught by
    the x·x >= HALF_OVER test that sends a piece back to the exact cast, which no finite value
    reaches."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    out = np.empty(h.size)
    diffing._half_fast(h, out, np.empty(h.size, np.uint32))
    exact = h.astype(np.float64)
    fin = np.isfinite(exact)
    assert np.array_equal(out[fin], exact[fin])
    assert np.array_equal(np.signbit(out[fin]), np.signbit(exact[fin]))
    assert (out[fin] ** 2 < diffing.HALF_OVER).all()
    assert (out[~fin] ** 2 >= diffing.HALF_OVER).all() and (~fin).sum() == 2 * 1024


@pytest.mark.parametrize("dt,big,small", [(np.float16, 2048.0, 2.0 ** -14),
                                           (ml_dtypes.bfloat16, 2.0 ** 20, 2.0 ** -20)])
def test_differences_that_float32_would_round_are_exact(tmp_path, dt, big, small):
    """Why the pass stays float64 after widening: two float16 (bfloat16) values whose exponents
    are far apart have a difference that float32 rounds (2048 - 2^-14 needs 26 significant bits),
    so max_abs would be off; the float64 pass gets torch's float64 figure exactly."""
    a = np.array([big, 1.0, 0.5], dtype=dt)
    b = np.array([small, 1.0, -0.5], dtype=dt)
    f32 = np.float32(a[0]) - np.float32(b[0])
    assert float(f32) != float(a[0]) - float(b[0])  # float32 rounds it
    ma = raw_model(tmp_path / "a.bin", {"t": a})
    mb = raw_model(tmp_path / "b.bin", {"t": b})
    (e,) = diff_models(ma, mb).entries
    check_against(e.values, oracle(torch_of(a), torch_of(b)), rel=1e-12)
    assert e.values.max_abs == big - small


def test_sums_keep_float64_accuracy_at_tensor_scale(tmp_path):
    """A million float16 normals through the pool's pieces: the norms, the cosine and the sums to
    1e-9 of torch's float64 figures. OpenBLAS's float32 dot product of these same values is off by
    ~5e-6 (float32 accumulation): the reason the sums run on float64 copies."""
    r = np.random.default_rng(6)
    xa = r.standard_normal(1 << 20).astype(np.float16)
    xb = (xa + r.standard_normal(1 << 20) * 0.01).astype(np.float16)
    ma = raw_model(tmp_path / "a.bin", {"t": xa})
    mb = raw_model(tmp_path / "b.bin", {"t": xb})
    (e,) = diff_models(ma, mb).entries
    check_against(e.values, oracle(torch_of(xa), torch_of(xb)), rel=1e-9)


_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, -65504.0, 6e-8, -6e-8, 1e-5,
                      3.0e38, -3.0e38])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40_000), da=st.sampled_from(DTYPES), db=st.sampled_from(DTYPES),
       elems=st.sampled_from([3, 64, 1000, 8192]), specials=st.integers(0, 6),
       seed=st.integers(0, 2**31), kernel=st.booleans())
@example(n=20_000, da=np.float16, db=np.float16, elems=64, specials=6, seed=2, kernel=False)
@example(n=20_000, da=ml_dtypes.bfloat16, db=np.float16, elems=1000, specials=6, seed=3,
         kernel=False)
@example(n=20_000, da=np.float16, db=np.float16, elems=64, specials=6, seed=2, kernel=True)
@example(n=20_000, da=ml_dtypes.bfloat16, db=np.float32, elems=1000, specials=6, seed=3,
         kernel=True)
def test_pool_pieces_and_special_values_match_torch_float64(tmp_path_factory, monkeypatch, n, da,
                                                             db, elems, specials, seed, kernel):
    """The pool's larger pieces (8 x FLOAT_ELEMS with BLAS pinned) over piece boundaries, with
    Inf, NaN, signed zeros, subnormals and the largest finite values sprinkled in (each dtype
    rounds them its own way: float16 overflows 3e38 to Inf, int8 casts wrap): the float16 fast
    widening's fallback, the careful path and the zero-of-B path, against torch in float64."""
    r = np.random.default_rng(seed)
    xa, xb = pair(r, n, da, db, zeros=bool(seed % 2))
    for x in (xa, xb):
        if specials:
            pos = r.integers(0, n, specials)
            with np.errstate(all="ignore"):
                x[pos] = _SPECIALS[r.integers(0, len(_SPECIALS), specials)].astype(x.dtype)
    d = tmp_path_factory.mktemp("s")
    ma = raw_model(d / "a.bin", {"t": xa})
    mb = raw_model(d / "b.bin", {"t": xb})
    with monkeypatch.context() as m:
        m.setattr(diffing, "FLOAT_ELEMS", elems)
        m.setattr(diffing, "PARALLEL_ELEMS", 100)
        m.setattr(diffing, "RELEASE_BYTES", 4096)
        if not kernel:
            m.setattr(diffing, "_KERNEL", None)
        (e,) = diff_models(ma, mb, chunk_bytes=elems * 32).entries
    if e.values.identical_bytes:
        return
    check_against(e.values, oracle(torch_of(xa), torch_of(xb)), rel=1e-6)


def test_the_compiled_pass_is_built_where_a_compiler_is():
    # `pip install` builds tensorscope/_diffkernel.c (optional: without a compiler numpy computes
    # the same figures). Where a C compiler exists, a missing kernel is a broken build.
    import shutil
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the numpy path is the one in use")
    assert diffing._KERNEL is not None, ("tensorscope/_diffkernel.c is not built, or its build "
                                         "is stale (ABI): run pip install -e . again")


@pytest.fixture
def kernel_path(kernel_route):
    """Each compiled route in turn (conftest's `kernel_route`)."""
    return kernel_route


def _both(xa, xb, atol=1e-5, rtol=1.3e-6):
    """The compiled pass's and the numpy passes' accumulators over one pair of pieces."""
    figures = []
    for kernel in (diffing._KERNEL, None):
        acc = diffing._Accumulator(atol, rtol, max(xa.size, 8), False)
        saved, diffing._KERNEL = diffing._KERNEL, kernel
        try:
            acc.add(xa, xb)
        finally:
            diffing._KERNEL = saved
        figures.append(acc)
    return figures


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int8,
                                np.uint8, np.int16, np.int32, ml_dtypes.float8_e4m3fn,
                                ml_dtypes.float8_e5m2])
def test_compiled_pass_equals_the_numpy_pass(dt, kernel_path):
    """Counts and maxima identical, sums to rounding (their order differs), on pieces that are
    not a multiple of the kernel's block nor of its 16-element vector step, with exact zeros of
    B, subnormals and the largest finite values; a NaN or an Inf sends the piece to the careful
    path in both."""
    r = np.random.default_rng(5)
    floating = np.dtype(dt).kind not in "iu"
    info = ml_dtypes.finfo(dt) if floating else np.iinfo(dt)
    for n in (1, 15, 17, 511, 513, 1025, 4099):
        with np.errstate(invalid="ignore"):   # integer casts of the random values wrap: fine
            xa, xb = pair(r, n, dt, dt, zeros=True)
        edge = [info.smallest_subnormal, info.max, -info.max] if floating else [info.min, info.max, 0]
        xa[: min(n, 3)] = np.array(edge, dt)[: min(n, 3)]
        for special in (None, np.nan, np.inf) if floating else (None,):
            if special is not None:
                xb = xb.copy()
                xb[n // 2] = special
            _same_figures(*_both(xa, xb), (n, special))


def _same_figures(k, ref, where) -> None:
    for f in ("count", "mismatched", "nan", "inf", "zero_ref", "max_abs", "max_rel"):
        assert getattr(k, f) == getattr(ref, f), (where, f)
    for f in ("sum_sq", "sum_abs", "xx", "yy", "dot"):
        assert getattr(k, f) == pytest.approx(getattr(ref, f), rel=1e-12, abs=1e-300,
                                              nan_ok=True), (where, f)


@pytest.mark.parametrize("dt", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
@pytest.mark.parametrize("case", ["rising", "ulp", "zeros_late", "zeros_first", "b_all_zero",
                                  "equal", "recurring"])
def test_compiled_ratio_without_division_is_exact(dt, case, kernel_path):
    """The AVX-512 pass divides only in blocks where |d| > t·|b| for the largest ratio t so far:
    max_rel must still be the exact maximum and zero_ref the exact count when each block holds
    a new maximum ("rising"), when a later ratio exceeds the earlier one by one ulp ("ulp": the
    shaved threshold), when zeros of B first appear after many blocks ("zeros_late": counted by
    the exact re-run, then in the loop) or from the start, when B is all zero (no ratio: None),
    and when nothing differs; and when the largest ratio recurs block after block ("recurring":
    the loop then divides in place, zeros of B and a later maximum included)."""
    n = 20 * 512 + 7     # many blocks of 512, and a tail
    b = np.full(n, 1.0)
    a = b.copy()
    if case == "rising":
        a = b + np.linspace(2.0 ** -8, 0.5, n)            # every later ratio is larger
    elif case == "ulp":
        a[:] = 1.5                                        # |d|/|b| = 0.5 in every block ...
    elif case == "zeros_late":
        a = b + 0.25
        b[15 * 512 + 3::97] = 0.0
        b[-1] = 0.0
    elif case == "zeros_first":
        a = b + 0.25
        b[::3] = 0.0
    elif case == "b_all_zero":
        b[:] = 0.0
    elif case == "recurring":   # the largest ratio in every block: the loop turns to dividing
        b = np.full(100 * 512 + 7, 1.0)                   # (after 64 blocks)
        a = b.copy()
        a[::300] = 2.0
        b[72 * 512 + 5::211] = 0.0                        # then zeros of B ...
        a[85 * 512 + 9] = 4.0                             # ... and a larger ratio, late
    xa, xb = a.astype(dt), b.astype(dt)
    if case == "ulp":   # ... and, 10 blocks on, the next value above 1.5: a ratio just above
        bits = xa.view(f"u{xa.itemsize}")
        bits[n - 3] += 1
    k, ref = _both(xa, xb)
    _same_figures(k, ref, case)
    expect = oracle(torch_of(xa), torch_of(xb))
    assert k.zero_ref == expect["zero_ref"]
    got_rel = k.max_rel if k.max_rel >= 0 else None
    assert (got_rel if k.max_abs else 0.0) == (expect["max_rel"] if expect["max_abs"] else 0.0)


@pytest.mark.skipif(diffing._KERNEL is None, reason="the compiled pass is not built")
def test_compiled_ratio_that_overflows_keeps_counting_zeros(kernel_path):
    """float64: a ratio |d|/|b| beyond the largest float64 (1e10 / 1e-300) makes the threshold
    infinite, where inf·0 would hide the zeros of B that follow: every later block is then run
    exactly, and zero_ref stays exact."""
    b = np.full(4000, 1.0)
    a = b + 0.5
    b[10], a[10] = 1e-300, 1e10
    b[3000::7] = 0.0
    _same_figures(*_both(a, b), "overflow")
    k, _ = _both(a, b)
    assert k.max_rel == math.inf and k.zero_ref == len(range(3000, 4000, 7))


def test_pool_threads_pin_blas_to_one_thread():
    """numpy's OpenBLAS can pin a thread's BLAS to one thread: the pool's threads are pinned
    and take POOL_ELEMS pieces; without it they keep below OpenBLAS's own threading threshold."""
    lib = diffing._openblas()
    if lib is None:
        assert diffing._pool_elems() == diffing.FLOAT_ELEMS <= 10_000
        pytest.skip("numpy's BLAS is not an OpenBLAS with openblas_set_num_threads_local")
    assert diffing._pool_elems() == diffing.POOL_ELEMS
    # the setter returns the calling thread's previous count: 1 on a pool thread
    got = diffing._pool().submit(lambda: lib.openblas_set_num_threads_local(1)).result()
    assert got == 1


def test_norms_of_identical_tensors_come_from_the_byte_pass(tmp_path, monkeypatch):
    """--by (norms=True): an identical pair is read once, its norm taken while its bytes are
    compared (no second pass over A), equal to torch's."""
    x = np.random.default_rng(4).standard_normal(50_000).astype(np.float16)
    ma = raw_model(tmp_path / "a.bin", {"t": x})
    mb = raw_model(tmp_path / "b.bin", {"t": x.copy()})
    handed: list[int] = []
    orig = diffing.iter_flat_chunks
    monkeypatch.setattr(diffing, "iter_flat_chunks",
                        lambda arr, n: (handed.append(p.size) or p for p in orig(arr, n)))
    (e,) = diff_models(ma, mb, norms=True, chunk_bytes=4096).entries
    assert e.values.identical_bytes and e.values.cosine == 1.0
    assert sum(handed) == 2 * x.size  # A and B once each
    assert e.values.norm_a == pytest.approx(float(torch.from_numpy(x).double().norm()), rel=1e-12)


# -- where did it change ----------------------------------------------------------------------------
def _llama(r, layers=3):
    a = {"model.embed_tokens.weight": r.standard_normal((16, 8)).astype(np.float32)}
    for i in range(layers):
        for m in ("self_attn.q_proj", "self_attn.k_proj", "mlp.up_proj"):
            a[f"model.layers.{i}.{m}.weight"] = r.standard_normal((8, 8)).astype(np.float32)
        a[f"model.layers.{i}.input_layernorm.weight"] = np.ones(8, np.float32)
    a["lm_head.weight"] = r.standard_normal((16, 8)).astype(np.float32)
    b = {}
    for k, v in a.items():  # layer 1 changes most, layer 2 and the norms not at all
        scale = 0.3 if ".1." in k else 0.0 if (".2." in k or "norm" in k) else 0.01
        b[k] = (v + scale * r.standard_normal(v.shape)).astype(np.float32)
    return a, b


@pytest.mark.parametrize("by,keyf", [("layer", grouping.layer_key),
                                     ("module", grouping.module_key)])
def test_grouped_norms_are_sums_of_squares_over_the_group(tmp_path, by, keyf):
    a, b = _llama(np.random.default_rng(1))
    ma = raw_model(tmp_path / "a.bin", a)
    mb = raw_model(tmp_path / "b.bin", b)
    res = diff_models(ma, mb, norms=True)
    groups = group_changes(res.entries, by)
    want: dict[str, list[float]] = {}
    for k in a:  # independently: torch, float64, per group
        ta, tb = torch.from_numpy(a[k]).double(), torch.from_numpy(b[k]).double()
        w = want.setdefault(keyf(k), [0.0, 0.0, 0])
        w[0] += float((ta * ta).sum())
        w[1] += float(((tb - ta) ** 2).sum())
        w[2] += 1
    assert {g.key for g in groups} == set(want)
    for g in groups:
        sq_a, sq_d, n = want[g.key]
        assert (g.tensors, g.compared, g.unknown) == (n, n, 0)
        assert g.norm_a == pytest.approx(math.sqrt(sq_a), rel=1e-9)
        assert g.norm_diff == pytest.approx(math.sqrt(sq_d), rel=1e-9)
        assert g.rel_change == pytest.approx(math.sqrt(sq_d / sq_a), rel=1e-9)
    rels = [g.rel_change for g in groups]
    assert rels == sorted(rels, reverse=True)
    if by == "layer":
        assert groups[0].key == "model.layers.1" and groups[-1].rel_change == 0.0


def test_identical_tensors_count_in_the_denominator_only_with_norms(tmp_path):
    a, b = _llama(np.random.default_rng(2))
    ma = raw_model(tmp_path / "a.bin", a)
    mb = raw_model(tmp_path / "b.bin", b)
    without = {g.key: g for g in group_changes(diff_models(ma, mb).entries, "layer")}
    with_norms = {g.key: g for g in group_changes(diff_models(ma, mb, norms=True).entries, "layer")}
    # layer 2 is byte-identical: its norms are unknown unless read
    assert without["model.layers.2"].unknown == 4 and without["model.layers.2"].rel_change is None
    assert with_norms["model.layers.2"].rel_change == 0.0
    e = [x for x in diff_models(ma, mb, norms=True).entries if x.name == "lm_head.weight"]
    assert e and e[0].values.cosine is not None


def _cli(capsys, *argv):
    return run_cli(capsys, "diff", *argv)


def test_cli_by_layer_top_json(tmp_path, capsys):
    from safetensors.numpy import save_file
    a, b = _llama(np.random.default_rng(3))
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    code, out, _ = _cli(capsys, tmp_path / "a.safetensors", tmp_path / "b.safetensors",
                        "--by", "layer", "--top", "2", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["schema"] == "tensorscope.diff/3" and doc["by"] == "layer"
    assert [g["key"] for g in doc["groups"]][:1] == ["model.layers.1"] and len(doc["groups"]) == 2
    assert len(doc["entries"]) == 2 and all(e["status"] == "changed" for e in doc["entries"])
    rel = [e["values"]["rel_change"] for e in doc["entries"]]
    assert rel == sorted(rel, reverse=True) and all(".1." in e["name"] for e in doc["entries"])
    code, out, _ = _cli(capsys, tmp_path / "a.safetensors", tmp_path / "b.safetensors",
                        "--by", "module")
    assert "relative change ||B-A||/||A|| per module" in out and "self_attn.q_proj" in out


def test_per_save_metadata_only_with_verbose(tmp_path, capsys):
    t = {"w": torch.arange(6.0)}
    torch.save(t, tmp_path / "one.pt")
    torch.save(t, tmp_path / "two.pt")  # another archive name and serialization id
    code, out, _ = _cli(capsys, tmp_path / "one.pt", tmp_path / "two.pt")
    assert code == 0 and "serialization_id" not in out and "archive_prefix" not in out
    assert "-v shows them" in out
    code, out, _ = _cli(capsys, tmp_path / "one.pt", tmp_path / "two.pt", "-v")
    assert "archive_prefix" in out
    _, out, _ = _cli(capsys, tmp_path / "one.pt", tmp_path / "two.pt", "--json")
    rows = {m["key"]: m["per_save"] for m in json.loads(out)["metadata"]}
    assert rows.get("archive_prefix") is True


EVIL = "layers.0.\x1b]0;pwned\x07\x1b[31m[bold red]x[/bold red]\u202e.weight"


def _evil_pair(tmp_path):
    from safetensors.numpy import save_file
    a = {EVIL: np.arange(4, dtype=np.float32), "ok": np.ones(3, np.float32)}
    b = {EVIL: np.arange(4, dtype=np.float32) + 1, "ok": np.ones(3, np.float32)}
    save_file(a, str(tmp_path / "a.safetensors"), metadata={"\x1b[2Jk": "[blink]v\x1b[0m"})
    save_file(b, str(tmp_path / "b.safetensors"), metadata={"\x1b[2Jk": "w"})
    return tmp_path / "a.safetensors", tmp_path / "b.safetensors"


@pytest.mark.parametrize("extra", [[], ["--by", "layer"], ["--by", "module", "--top", "1"],
                                   ["--all"]])
def test_names_from_the_file_are_shown_escaped(tmp_path, capsys, extra):
    a, b = _evil_pair(tmp_path)
    code, out, err = _cli(capsys, a, b, *extra)
    assert code == 1
    assert safetext.is_clean(out) and safetext.is_clean(err)
    assert "[bold red]x[/bold red]" in out  # markup printed, never interpreted
    assert "\\x1b]0;pwned" in out and "\\u202e" in out


def test_large_diff_lists_what_differs_and_the_name_patterns(tmp_path, capsys):
    from safetensors.numpy import save_file
    n = 2100
    a = {f"model.layers.{i // 3}.mlp.experts.{i % 3}.w": np.full(2, i, np.float32)
         for i in range(n)}
    b = dict(a)
    b["model.layers.5.mlp.experts.1.w"] = np.zeros(2, np.float32)
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    code, out, _ = _cli(capsys, tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert code == 1 and f"{n - 1:,} tensors the same, not listed" in out
    assert "model.layers.#.mlp.experts.#.w ×2,100: 1 differ" in out
    assert out.count("model.layers.5.mlp.experts.1.w") == 1
    code, out, _ = _cli(capsys, tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--all")
    assert out.count("\nsame ") == n - 1  # plain rows above 500, one per tensor


def test_reason_says_why_a_row_is_changed(tmp_path):
    xa = np.array([1.0, np.nan, 3.0], np.float32)
    xb = np.array([1.0, np.nan, 3.0], np.float32)
    ma = raw_model(tmp_path / "a.bin", {"t": xa})
    mb = raw_model(tmp_path / "b.bin", {"t": xb.copy()})
    (e,) = diff_models(ma, mb).entries  # same bytes: NaN included, the same tensor
    assert e.status == "same" and diffing.reason(e) == "identical"
    xb2 = xb.copy()
    xb2.view(np.uint32)[1] ^= 1  # another NaN payload: bytes differ, NaN never matches
    mb = raw_model(tmp_path / "c.bin", {"t": xb2})
    (e,) = diff_models(ma, mb).entries
    assert e.status == "changed" and e.values.max_abs == 0.0
    assert diffing.reason(e) == "values: 1 of 3 outside tolerance; NaN on a side at 1"


def test_help_group_choices_match_the_engine():
    from tensorscope.commands import diff as cmd
    assert cmd.GROUP_BY == diffing.GROUP_BY


# -- large pairs compared two at a time (lanes) ----------------------------------------------------
def _many_pairs(tmp_path, n=7):
    r = np.random.default_rng(11)
    xs = {f"layers.{i}.w": r.standard_normal(40_000 + 999 * i).astype(np.float16)
          for i in range(n)}   # each above SMALL_BYTES: a lane's
    ys = {k: (v + r.standard_normal(v.size) * (0.01 * (i % 3))).astype(np.float16)
          for i, (k, v) in enumerate(xs.items())}
    return xs, ys, raw_model(tmp_path / "a.bin", xs), raw_model(tmp_path / "b.bin", ys)


def test_lanes_keep_the_order_and_the_figures_of_one_pair_at_a_time(tmp_path, monkeypatch):
    """Large pairs go to the lanes, two at a time: the entries keep A's order, and each one's
    figures are those of the pair compared on its own (`compare_values`) and torch's."""
    monkeypatch.setattr(diffing, "PARALLEL_ELEMS", 5000)   # and each one over the pool
    xs, ys, ma, mb = _many_pairs(tmp_path)
    res = diff_models(ma, mb)
    assert [e.name for e in res.entries] == list(xs)
    for e, ta, tb in zip(res.entries, ma.tensors, mb.tensors):
        alone = diffing.compare_values(ma, ta, mb, tb)
        if alone.identical_bytes:
            assert e.values.identical_bytes and e.status == "same"
            continue
        for k in ("max_abs", "max_rel", "mismatched", "zero_ref", "norm_a", "norm_diff"):
            assert getattr(e.values, k) == getattr(alone, k), (e.name, k)
        check_against(e.values, oracle(torch_of(xs[e.name]), torch_of(ys[e.name])), rel=1e-9)


def test_a_failing_lane_stops_the_diff_and_no_lane_outlives_it(tmp_path, monkeypatch):
    """A pair whose stored bytes run past its file fails in its lane: the diff raises that error
    (the CLI's exit 2), and every lane has finished by then (the models are closed next)."""
    import dataclasses
    from tensorscope.errors import FormatError
    from tensorscope.model import ModelFile
    xs, ys, ma, mb = _many_pairs(tmp_path)
    end = (tmp_path / "a.bin").stat().st_size
    bad = dataclasses.replace(ma.tensors[2], byte_offset=end - 10)
    ma = ModelFile("raw", ma.path, [*ma.tensors[:2], bad, *ma.tensors[3:]])
    running = set()
    real = diffing._pair

    def tracked(*args):
        running.add(args[1].name)
        try:
            if args[1].name != "layers.2.w":
                time.sleep(0.05)          # the other lanes are still busy when the bad one fails
            return real(*args)
        finally:
            running.discard(args[1].name)

    monkeypatch.setattr(diffing, "_pair", tracked)
    with pytest.raises(FormatError, match="layers.2.w"):
        diff_models(ma, mb)
    assert not running


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
@pytest.mark.parametrize("how", ["cli", "plain", "user"])
def test_commands_load_numpy_without_blas_threads_unless_told(how, tmp_path):
    """A command that loads numpy (diff, --stats, convert, the TUI) loads it with OpenBLAS
    single-threaded (no server thread to spin on the command's cores: one thread after the
    command, where a plain import starts one per core), leaves the environment as it found it,
    and keeps a user's own OPENBLAS_NUM_THREADS."""
    import subprocess
    import sys
    path = tmp_path / "w.npy"
    np.save(path, np.arange(6.0))
    run = ("from tensorscope.cli import main\n"   # --stats loads numpy, starts no thread itself
           f"assert main(['inspect', '--stats', {str(path)!r}]) == 0\n" if how != "plain" else
           "import numpy\n")
    code = ("import os, sys\n"
            "assert 'numpy' not in sys.modules\n"
            f"{run}"
            "assert 'numpy' in sys.modules\n"
            "print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')))\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if how == "user":
        env["OPENBLAS_NUM_THREADS"] = "2"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    var, threads = out[-2:]
    assert var == ("2" if how == "user" else "None")
    if how == "cli":
        assert threads == "1"
    elif how == "plain" and diffing._openblas() is not None and diffing._workers() > 1:
        assert int(threads) > 1   # what the commands avoid


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_diffs_with_pools_of_its_own(tmp_path):
    """The pool and lane threads do not survive a fork: a child that diffs after its parent did
    starts pools of its own instead of waiting on threads that are not there."""
    xs, ys, ma, mb = _many_pairs(tmp_path, n=3)
    want = [e.values.max_abs for e in diff_models(ma, mb).entries]   # the parent's pools exist
    pid = os.fork()
    if pid == 0:   # the child: exit 0 only when its diff finishes with the parent's figures
        code = 1
        try:
            got = [e.values.max_abs for e in diff_models(ma, mb).entries]
            code = 0 if got == want else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's diff hung")


@pytest.mark.parametrize("dt", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_compiled_float8_by_their_bits_on_every_pattern(dt, kernel_path):
    """float8_e5m2 and float8_e4m3fn are widened from their bits, not a table: every finite byte
    pattern (subnormals, signed zeros, the largest) against every other one gives the numpy
    passes' figures, and every Inf or NaN pattern sends the piece back (None)."""
    every = np.arange(256, dtype=np.uint8).view(dt)
    finite = every[np.isfinite(every.astype(np.float64))]
    for shift in (1, 7, 100):
        _same_figures(*_both(finite, np.roll(finite, shift)), (np.dtype(dt).name, shift))
    code = diffing._kernel_code(np.dtype(dt))
    assert code in ("E", "F")   # by the bits, not through the table
    zero = np.zeros(1, np.uint8)
    for pattern in np.flatnonzero(~np.isfinite(every.astype(np.float64))):
        one = np.array([pattern], np.uint8)
        assert diffing._KERNEL.stats(one, code, zero, code, 1e-8, 1e-5, b"", b"") is None
        assert diffing._KERNEL.stats(zero, code, one, code, 1e-8, 1e-5, b"", b"") is None
