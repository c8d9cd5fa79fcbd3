"""`tensorscope diff`: the engine against torch as the oracle, on raw models built here and on the
real fixture pairs of ``fixtures/gen_diff.py``; the CLI's exit codes and JSON."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorscope
from tensorscope.diffing import SCHEMA, detect_prefixes, diff_models
from tensorscope.errors import FormatError, TensorscopeError
from tensorscope.model import ModelFile, TensorInfo
from helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "diff"
sys.path.insert(0, str(ROOT / "fixtures"))
from gen_diff import PAIRS  # noqa: E402

NP_NAMES = {np.dtype(np.float64): "float64", np.dtype(np.float32): "float32",
            np.dtype(np.float16): "float16", np.dtype(ml_dtypes.bfloat16): "bfloat16",
            np.dtype(np.int32): "int32", np.dtype(np.int64): "int64", np.dtype(np.int8): "int8",
            np.dtype(np.bool_): "bool", np.dtype(np.complex64): "complex64",
            np.dtype(np.complex128): "complex128", np.dtype(np.uint8): "uint8"}


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------

def raw_model(path: Path, tensors: dict, *, prefix: str = "", metadata=None) -> ModelFile:
    """Write raw little-endian bytes and describe them. A value is an array (stored C-contiguous)
    or ``(array, "T")`` to store the transpose's bytes and describe it with Fortran strides, or
    ``(bytes, dtype, shape)`` for packed dtypes."""
    infos, off = [], 0
    with open(path, "wb") as f:
        for name, value in tensors.items():
            if isinstance(value, tuple) and value[1] == "T":
                arr = value[0]
                data = np.ascontiguousarray(arr.T).tobytes()
                stride = tuple(int(np.prod(arr.shape[:i])) for i in range(arr.ndim))
                info = TensorInfo(prefix + name, NP_NAMES[arr.dtype], arr.shape, stride,
                                  byte_offset=off, file=str(path), source_format="raw")
            elif isinstance(value, tuple):
                data, dtype, shape = value
                info = TensorInfo(prefix + name, dtype, shape, byte_offset=off, file=str(path),
                                  source_format="raw")
            else:
                arr = np.asarray(value)
                data = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
                info = TensorInfo(prefix + name, NP_NAMES[arr.dtype], arr.shape, byte_offset=off,
                                  file=str(path), source_format="raw")
            f.write(data)
            infos.append(info)
            off += len(data)
    return ModelFile("raw", str(path), infos, metadata=metadata)


def to_torch(arr: np.ndarray) -> torch.Tensor:
    arr = np.ascontiguousarray(arr)
    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


def oracle(ta: torch.Tensor, tb: torch.Tensor, atol=1e-8, rtol=1e-5) -> dict:
    """Every statistic, computed by torch in float64 (complex128) as the module docstring defines."""
    cplx = ta.is_complex() or tb.is_complex()
    wt = torch.complex128 if cplx else torch.float64
    a, b = ta.to(wt).reshape(-1), tb.to(wt).reshape(-1)
    mismatched = int((~torch.isclose(a, b, rtol=rtol, atol=atol)).sum())
    nan = torch.isnan(a) | torch.isnan(b)
    both = torch.isfinite(a) & torch.isfinite(b)
    inf = ~both & ~nan & (a != b)
    out = {"mismatched": mismatched, "nan_mismatch": int(nan.sum()), "inf_mismatch": int(inf.sum())}
    a, b = a[both], b[both]
    if a.numel() == 0:
        return dict(out, max_abs=None, max_rel=None, mean_abs=None, rms=None, cosine=None,
                    norm_a=None, norm_b=None, norm_diff=None, zero_ref=0)
    d = (a - b).abs()
    ref = b != 0   # max_rel leaves out exact zeros of the reference; they are counted apart
    rel = d[ref] / b[ref].abs()
    na, nb = torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)
    dot = (a.conj() * b).sum().real if cplx else (a * b).sum()
    cosine = None if na == 0 or nb == 0 else float(dot / (na * nb))
    max_rel = float(rel.max()) if rel.numel() else (0.0 if float(d.max()) == 0 else None)
    return dict(out, max_abs=float(d.max()), max_rel=max_rel,
                mean_abs=float(d.mean()), rms=float((d * d).mean().sqrt()), cosine=cosine,
                norm_a=float(na), norm_b=float(nb), norm_diff=float(torch.linalg.vector_norm(d)),
                zero_ref=int((~ref & (d != 0)).sum()))


def check_against(vd, expected: dict, rel: float = 1e-12) -> None:
    """max_abs exactly; the other statistics to ``rel`` relative; the counts exactly."""
    assert vd is not None
    for key in ("mismatched", "nan_mismatch", "inf_mismatch", "zero_ref"):
        assert getattr(vd, key) == expected[key], key
    assert vd.max_abs == expected["max_abs"]
    for key in ("max_rel", "mean_abs", "rms", "cosine", "norm_a", "norm_b", "norm_diff"):
        got, want = getattr(vd, key), expected[key]
        if want is None or got is None:
            assert got == want, key
        elif math.isinf(want):
            assert got == want, key
        else:
            assert got == pytest.approx(want, rel=rel, abs=1e-15), key
    if expected["norm_a"]:
        assert vd.rel_change == pytest.approx(expected["norm_diff"] / expected["norm_a"], rel=rel)


def rng():
    return np.random.default_rng(20240611)


# ------------------------------------------------------------------------------------------------
# The engine on raw models, statistics against torch
# ------------------------------------------------------------------------------------------------

def _value_cases():
    r = rng()
    x32 = r.standard_normal((37, 29)).astype(np.float32)
    y32 = x32.copy()
    y32[5, :7] += np.float32(0.25)
    y32[20, 3] *= -1
    noisy = (x32 + 1e-4 * r.standard_normal(x32.shape)).astype(np.float32)
    x64 = r.standard_normal(1000)
    y64 = x64 + 1e-6 * r.standard_normal(1000)
    x64n, y64n = x64.copy(), y64.copy()
    x64n[:4] = [np.nan, 1.0, np.inf, np.inf]
    y64n[:4] = [np.nan, np.nan, np.inf, -np.inf]
    y64n[10] = 0.0
    x64n[11] = y64n[11] = 0.0
    ints_a = r.integers(-1000, 1000, 500).astype(np.int32)
    ints_b = ints_a.astype(np.int64)
    ints_b[::50] += 1
    ca = (r.standard_normal(300) + 1j * r.standard_normal(300)).astype(np.complex64)
    cb = ca.copy()
    cb[17] += 0.5j
    return [
        ("f32_perturbed", x32, y32),
        ("f32_noise", x32, noisy),
        ("f32_vs_f16", x32, x32.astype(np.float16)),
        ("f32_vs_bf16", x32, x32.astype(ml_dtypes.bfloat16)),
        ("f64_close", x64, y64),
        ("f64_nan_inf", x64n, y64n),
        ("int32_vs_int64", ints_a, ints_b),
        ("complex64", ca, cb),
        ("complex_vs_real", ca, ca.real.astype(np.float64)),
        ("zeros", np.zeros(40, np.float32), np.zeros(40, np.float32) + np.float32(1e-3)),
        ("bool_vs_int8", x32[0] > 0, (x32[0] > 0.5).astype(np.int8)),
        ("scalar", np.array(3.5, np.float32), np.array(3.25, np.float64)),
    ]


@pytest.mark.parametrize("chunk_bytes", [16 << 20, 64, 7 * 4])
@pytest.mark.parametrize("case,xa,xb", _value_cases(), ids=[c[0] for c in _value_cases()])
def test_value_statistics_match_torch(tmp_path, case, xa, xb, chunk_bytes):
    ma = raw_model(tmp_path / "a.bin", {"pad": np.arange(3, dtype=np.int8), "t": xa})
    mb = raw_model(tmp_path / "b.bin", {"t": xb})
    r = diff_models(ma, mb, chunk_bytes=chunk_bytes)
    (entry,) = [e for e in r.entries if e.name == "t"]
    check_against(entry.values, oracle(to_torch(xa), to_torch(xb)))
    differs = entry.values.mismatched > 0 or xa.dtype != xb.dtype
    assert entry.status == ("changed" if differs else "same")
    assert ("values" in entry.changes) == (entry.values.mismatched > 0)
    assert entry.values.identical_bytes is False
    assert entry.values.compared_as == ("complex128" if np.iscomplexobj(xa) or np.iscomplexobj(xb)
                                        else "float64")


@pytest.mark.parametrize("atol,rtol", [(0.0, 0.0), (1e-3, 0.0), (0.0, 1e-3), (0.3, 0.1)])
def test_tolerances_follow_torch_isclose(tmp_path, atol, rtol):
    r = rng()
    xa = r.standard_normal(2000)
    xb = xa * (1 + 1e-3 * r.standard_normal(2000)) + 1e-3 * r.standard_normal(2000)
    ma = raw_model(tmp_path / "a.bin", {"t": xa})
    mb = raw_model(tmp_path / "b.bin", {"t": xb})
    res = diff_models(ma, mb, atol=atol, rtol=rtol, chunk_bytes=1000)
    check_against(res.entries[0].values, oracle(to_torch(xa), to_torch(xb), atol, rtol))
    assert (res.atol, res.rtol) == (atol, rtol)


def test_identical_bytes_fast_path(tmp_path):
    x = rng().standard_normal((64, 33)).astype(np.float32)
    x[0, 0] = np.nan  # identical bytes are the same tensor, NaN included
    ma = raw_model(tmp_path / "a.bin", {"w": x, "b": np.arange(5, dtype=np.int64)})
    mb = raw_model(tmp_path / "b.bin", {"w": x, "b": np.arange(5, dtype=np.int64)})
    res = diff_models(ma, mb, chunk_bytes=100)
    assert res.identical and res.exit_code == 0
    assert res.counts == {"same": 2, "changed": 0, "added": 0, "removed": 0, "renamed": 0}
    for e in res.entries:
        v = e.values
        assert (v.identical_bytes, v.compared_as, v.max_abs, v.mismatched, v.cosine) == \
            (True, "bytes", 0.0, 0, None)
        assert e.changes == []


def test_bytes_differ_within_tolerance_is_same(tmp_path):
    a = np.array([0.0, 1.0, 2.0], np.float32)
    b = np.array([-0.0, 1.0, np.nextafter(np.float32(2), np.float32(3))], np.float32)
    res = diff_models(raw_model(tmp_path / "a.bin", {"t": a}), raw_model(tmp_path / "b.bin", {"t": b}))
    (e,) = res.entries
    assert e.status == "same" and e.changes == [] and res.exit_code == 0
    assert e.values.identical_bytes is False and e.values.mismatched == 0
    assert e.values.max_abs == float(np.float32(b[2]) - np.float32(2))


def test_stride_only_change_is_layout_and_values_are_logical(tmp_path):
    x = rng().standard_normal((6, 11)).astype(np.float32)
    ma = raw_model(tmp_path / "a.bin", {"t": (x, "T")})   # Fortran order on disk
    mb = raw_model(tmp_path / "b.bin", {"t": x})
    assert ma.tensors[0].stride == (1, 6)
    np.testing.assert_array_equal(ma.read("t"), x)
    for chunk in (16 << 20, 40, 12):
        (e,) = diff_models(ma, mb, chunk_bytes=chunk).entries
        assert e.status == "same"
        assert e.changes == ["stride (1, 6) -> (11, 1)"]
        assert e.values.identical_bytes is True
    y = x.copy()
    y[2, 9] += 1
    (e,) = diff_models(ma, raw_model(tmp_path / "c.bin", {"t": y}), chunk_bytes=40).entries
    assert e.status == "changed" and e.changes == ["stride (1, 6) -> (11, 1)", "values"]
    check_against(e.values, oracle(to_torch(x), to_torch(y)))


def test_shape_and_dtype_changes(tmp_path):
    x = rng().standard_normal((2, 3)).astype(np.float32)
    ma = raw_model(tmp_path / "a.bin", {"s": x, "d": x, "empty": np.zeros((0, 3), np.float32)})
    mb = raw_model(tmp_path / "b.bin", {"s": np.ascontiguousarray(x.T), "d": x.astype(np.float64),
                                        "empty": np.zeros((0, 3), np.float32)})
    res = {e.name: e for e in diff_models(ma, mb).entries}
    assert res["s"].status == "changed" and res["s"].changes == ["shape (2, 3) -> (3, 2)"]
    assert res["s"].values is None
    # float32 -> float64 is exact: the dtype changed, the values did not.
    assert res["d"].changes == ["dtype float32 -> float64"] and res["d"].values.mismatched == 0
    assert res["d"].values.max_abs == 0.0 and res["d"].values.cosine == pytest.approx(1.0)
    assert res["empty"].status == "same" and res["empty"].values.identical_bytes


def test_packed_dtypes_compare_decoded_values(tmp_path):
    # Packed int4 is compared by its decoded values (tensorscope.dequant): 0x34 -> 0x35 changes
    # element 2 from 4 to 5. Identical bytes stay "same" without decoding.
    ma = raw_model(tmp_path / "a.bin", {"q": (bytes([0x12, 0x34, 0x56]), "int4", (6,)),
                                        "same": (bytes([1, 2]), "uint4", (4,))})
    mb = raw_model(tmp_path / "b.bin", {"q": (bytes([0x12, 0x35, 0x56]), "int4", (6,)),
                                        "same": (bytes([1, 2]), "uint4", (4,))})
    res = {e.name: e for e in diff_models(ma, mb).entries}
    q = res["q"]
    assert q.status == "changed" and q.changes == ["values"]
    assert (q.values.identical_bytes, q.values.mismatched, q.values.max_abs, q.values.compared_as) == \
        (False, 1, 1.0, "float64")
    assert res["same"].status == "same" and res["same"].values.identical_bytes


def test_undecodable_dtypes_compare_bytes_only(tmp_path):
    import tensorscope.parsers.gguf  # noqa: F401  (registers the GGUF block dtypes)
    ma = raw_model(tmp_path / "a.bin", {"q": (bytes(66), "iq2_xxs", (256,))})
    mb = raw_model(tmp_path / "b.bin", {"q": (bytes(65) + b"\x01", "iq2_xxs", (256,))})
    q = diff_models(ma, mb).entries[0]
    assert q.status == "changed" and q.changes == ["values"]
    assert (q.values.identical_bytes, q.values.mismatched, q.values.max_abs, q.values.compared_as) == \
        (False, None, None, "bytes")


# ------------------------------------------------------------------------------------------------
# Alignment: prefixes, maps, renames
# ------------------------------------------------------------------------------------------------

NAMES = ["embed.weight", "layers.0.weight", "layers.0.bias", "norm.weight"]


@pytest.mark.parametrize("a,b,expected", [
    (NAMES, NAMES, ("", "")),
    (["module." + n for n in NAMES], NAMES, ("module.", "")),
    (NAMES, ["_orig_mod." + n for n in NAMES], ("", "_orig_mod.")),
    (["_orig_mod.module." + n for n in NAMES], NAMES, ("_orig_mod.module.", "")),
    (["module." + n for n in NAMES], ["model." + n for n in NAMES], ("module.", "model.")),
    (["model." + n for n in NAMES], NAMES[:2], ("model.", "")),
    # Both sides share the prefix: the prefix is part of the names, nothing to strip.
    (["module." + n for n in NAMES], ["module." + n for n in NAMES], ("", "")),
    # All of A is under layers.0. but stripping it matches nothing more.
    (["layers.0.weight", "layers.0.bias"], ["layers.0.weight", "layers.0.bias"], ("", "")),
    (["a.x", "a.y"], ["b.z"], ("", "")),
    ([], NAMES, ("", "")),
])
def test_detect_prefixes(a, b, expected):
    assert detect_prefixes(a, b) == expected


def test_prefix_strip_maps_and_renames(tmp_path):
    r = rng()
    w, v, u = (r.standard_normal(n).astype(np.float32) for n in (8, 9, 10))
    ma = raw_model(tmp_path / "a.bin", {"enc.w": w, "old_name": v, "gone": u, "x.b": v},
                   prefix="module.")
    mb = raw_model(tmp_path / "b.bin", {"model.encoder.w": w, "new_name": v, "fresh": v[:8],
                                        "x.b": v})
    res = diff_models(ma, mb, maps=[("enc.", "model.encoder.")])
    assert (res.prefix_a, res.prefix_b) == ("module.", "")
    got = {(e.status, e.name_a, e.name_b) for e in res.entries}
    assert got == {("same", "module.enc.w", "model.encoder.w"),
                   ("renamed", "module.old_name", "new_name"),
                   ("removed", "module.gone", None), ("added", None, "fresh"),
                   ("same", "module.x.b", "x.b")}
    assert res.exit_code == 1
    # Without detection, the prefix is the user's to strip.
    res = diff_models(ma, mb, strip_prefix=["module."], maps=[("enc.", "model.encoder.")],
                      detect_prefix=False, detect_renames=False)
    assert (res.prefix_a, res.prefix_b) == ("", "")
    assert res.counts == {"same": 2, "changed": 0, "added": 2, "removed": 2, "renamed": 0}


def test_renames_pair_only_equal_content(tmp_path):
    r = rng()
    a1, a2 = (r.standard_normal(16).astype(np.float32) for _ in range(2))
    ma = raw_model(tmp_path / "a.bin", {"p": a1, "q": a2, "r": a1.astype(np.float64)})
    mb = raw_model(tmp_path / "b.bin", {"P": a2, "Q": a1 + 1, "R": a1})
    res = diff_models(ma, mb)
    got = sorted((e.status, e.name_a or "", e.name_b or "") for e in res.entries)
    # q -> P and p -> R by content; Q differs; r (float64) cannot be R (float32).
    assert got == [("added", "", "Q"), ("removed", "r", ""), ("renamed", "p", "R"),
                   ("renamed", "q", "P")]


def test_no_values_reads_no_tensor_bytes(tmp_path):
    good = raw_model(tmp_path / "a.bin", {"w": np.ones(4, np.float32)})
    (tmp_path / "short.bin").write_bytes(b"\0" * 4)
    bad = ModelFile("raw", str(tmp_path / "short.bin"),
                    [TensorInfo("w", "float32", (4,), byte_offset=0, file=str(tmp_path / "short.bin"),
                                source_format="raw")])
    res = diff_models(good, bad, values=False)
    assert res.identical and res.entries[0].values is None and not res.values_compared
    with pytest.raises(FormatError, match=r"tensor 'w' wants 16 bytes at offset 0, the file has 4"):
        diff_models(good, bad)


def test_metadata_differences_flattened_and_not_counted(tmp_path):
    ma = raw_model(tmp_path / "a.bin", {"w": np.ones(2, np.float32)},
                   metadata={"producer": {"name": "x", "version": 1}, "same": 3, "only_a": [1, 2]})
    mb = raw_model(tmp_path / "b.bin", {"w": np.ones(2, np.float32)},
                   metadata={"producer": {"name": "x", "version": 2}, "same": 3, "only_b": 1.5})
    res = diff_models(ma, mb)
    assert res.metadata == [("only_a", [1, 2], None), ("only_b", None, 1.5),
                            ("producer.version", 1, 2)]
    assert res.exit_code == 0
    assert res.to_dict()["metadata"][0] == {"key": "only_a", "a": [1, 2], "b": None, "per_save": False}
    # Across formats only the keys both sides have are compared.
    mb.format = "other"
    res = diff_models(ma, mb)
    assert res.metadata == [("format", "raw", "other"), ("producer.version", 1, 2)]


def test_to_dict_is_json_with_non_finite_as_strings(tmp_path):
    ma = raw_model(tmp_path / "a.bin", {"t": np.array([1.0, 2.0, 1e308])})
    mb = raw_model(tmp_path / "b.bin", {"t": np.array([0.0, 2.0, -1e308])})
    d = diff_models(ma, mb).to_dict()
    text = json.dumps(d, allow_nan=False, sort_keys=True)  # strict JSON
    v = d["entries"][0]["values"]
    assert d["schema"] == SCHEMA == "tensorscope.diff/3"
    assert (v["max_abs"], v["zero_ref"], v["max_rel"]) == ("inf", 1, "inf")  # 2e308 overflows
    assert set(d) == {"schema", "a_path", "b_path", "a_format", "b_format", "prefix_a", "prefix_b",
                      "strip_prefix", "maps", "atol", "rtol", "values_compared", "identical",
                      "exit_code", "counts", "metadata", "entries", "tolerance_given", "verdict"}
    assert set(d["entries"][0]) == {"status", "name", "name_a", "name_b", "a", "b", "changes",
                                    "values", "verdict"}
    assert json.loads(text)["exit_code"] == 1


def test_paths_are_opened_and_closed(tmp_path, monkeypatch):
    closed = []
    orig = ModelFile.close
    monkeypatch.setattr(ModelFile, "close", lambda self: (closed.append(self.path), orig(self)))
    f = FIXTURES / "base.safetensors"
    res = diff_models(f, str(f))
    assert res.identical and closed == [str(f), str(f)]
    assert res.a_format == res.b_format == "safetensors"


# ------------------------------------------------------------------------------------------------
# Bounded memory: peak RSS does not grow with the file (subprocess, fresh ru_maxrss)
# ------------------------------------------------------------------------------------------------

_RSS_SCRIPT = textwrap.dedent("""
    import resource, sys, numpy as np
    from tensorscope.model import ModelFile, TensorInfo
    from tensorscope.diffing import diff_models
    n = int(sys.argv[3])
    def model(p):
        return ModelFile("raw", p, [TensorInfo("w", "float32", (n // 4,), byte_offset=0, file=p)])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = diff_models(model(sys.argv[1]), model(sys.argv[2]), chunk_bytes=1 << 20)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    v = r.entries[0].values
    print((after - before) // 1024, v.identical_bytes, v.mismatched)
""")


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
@pytest.mark.parametrize("perturb", [False, True])
def test_peak_memory_stays_flat(tmp_path, perturb):
    n = 96 << 20
    block = np.arange(1 << 20, dtype=np.float32)
    for name in ("a", "b"):
        with open(tmp_path / name, "wb") as f:
            for i in range(n // block.nbytes):
                f.write((block + 1 if perturb and name == "b" and i == 10 else block).tobytes())
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(tmp_path / "a"), str(tmp_path / "b"),
                          str(n)], capture_output=True, text=True, check=True).stdout.split()
    grew_mb = int(out[0])
    outside = int(np.count_nonzero(~np.isclose(block.astype(np.float64), block + 1.0)))
    assert out[1:] == (["False", str(outside)] if perturb else ["True", "0"])
    # 192 MB were compared; without releasing the map pages RSS would grow by about that much.
    assert grew_mb < 48, f"peak RSS grew by {grew_mb} MB"


# ------------------------------------------------------------------------------------------------
# Real fixture pairs through tensorscope.open, against torch.load / safetensors
# ------------------------------------------------------------------------------------------------

def _open_or_skip(path: Path):
    try:
        return tensorscope.open(path)
    except ImportError as e:  # a format parser still being written by another engineer
        pytest.skip(f"parser for {path.name} not importable yet: {e}")


def torch_tensors(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".onnx":
        import onnx
        from onnx import numpy_helper
        return {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
                for t in onnx.load(str(path)).graph.initializer}
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    return torch.load(path, weights_only=True)  # our own trusted fixture, as the oracle


@pytest.mark.parametrize("case,fa,fb,counts,pa,pb", PAIRS, ids=[p[0] for p in PAIRS])
def test_fixture_pairs_against_torch(case, fa, fb, counts, pa, pb):
    ma, mb = _open_or_skip(FIXTURES / fa), _open_or_skip(FIXTURES / fb)
    with ma, mb:
        res = diff_models(ma, mb)
    assert res.counts == dict(dict.fromkeys(["same", "changed", "added", "removed", "renamed"], 0),
                              **counts)
    assert (res.prefix_a, res.prefix_b) == (pa, pb)
    assert res.exit_code == (0 if set(counts) == {"same"} else 1)
    ta, tb = torch_tensors(FIXTURES / fa), torch_tensors(FIXTURES / fb)
    for e in res.entries:
        if e.a is None or e.b is None:
            assert (e.name_a in ta) if e.a is not None else (e.name_b in tb)
            continue
        x, y = ta[e.name_a], tb[e.name_b]
        if e.values.identical_bytes:
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x.reshape(-1).contiguous().view(torch.uint8),
                               y.reshape(-1).contiguous().view(torch.uint8))
        else:
            check_against(e.values, oracle(x, y))
        assert ("values" in e.changes) == (not e.values.identical_bytes and e.values.mismatched > 0)


def test_fixture_details():
    def run(a, b, **kw):
        ma, mb = _open_or_skip(FIXTURES / a), _open_or_skip(FIXTURES / b)
        with ma, mb:
            return {e.name: e for e in diff_models(ma, mb, **kw).entries}
    e = run("base.pt", "perturbed.pt")["layers.1.weight"]
    assert e.changes == ["values"] and e.values.mismatched == 6
    e = run("base.pt", "renamed.pt")["embed.weight"]
    assert (e.status, e.name_b, e.changes) == ("renamed", "embedding.weight",
                                                ["name embed.weight -> embedding.weight"])
    e = run("base.pt", "bf16.pt")
    assert e["norm.weight"].changes == ["dtype float32 -> bfloat16"]
    assert e["layers.0.weight"].changes == ["dtype float32 -> bfloat16", "values"]
    e = run("layout.pt", "layout.safetensors")["transposed"]
    assert (e.status, e.changes, e.values.identical_bytes) == ("same", ["stride (1, 5) -> (8, 1)"], True)
    e = run("nan_a.pt", "nan_b.pt")
    assert (e["x"].values.nan_mismatch, e["x"].values.inf_mismatch) == (2, 2)
    assert (e["half"].values.nan_mismatch, e["half"].values.mismatched) == (1, 1)


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------

def _cli(capsys, *argv):
    return run_cli(capsys, "diff", *argv)


def _needs(*names):
    for n in names:
        _open_or_skip(FIXTURES / n).close()


@pytest.mark.parametrize("case,fa,fb,counts,pa,pb", PAIRS, ids=[p[0] for p in PAIRS])
def test_cli_json_and_exit_codes(capsys, case, fa, fb, counts, pa, pb):
    _needs(fa, fb)
    code, out, err = _cli(capsys, FIXTURES / fa, FIXTURES / fb, "--json")
    doc = json.loads(out)
    assert code == doc["exit_code"] == (0 if set(counts) == {"same"} else 1)
    assert doc["schema"] == SCHEMA and (doc["prefix_a"], doc["prefix_b"]) == (pa, pb)
    assert {k: v for k, v in doc["counts"].items() if v} == counts
    assert len(doc["entries"]) == sum(counts.values())
    assert err == ""


def test_cli_human_output_sorted_by_largest_change(capsys):
    _needs("base.pt", "addrm.pt", "module.pt")
    code, out, _ = _cli(capsys, FIXTURES / "base.pt", FIXTURES / "addrm.pt")
    assert code == 1
    assert "6 same, 0 changed, 2 added, 2 removed, 0 renamed" in out
    lines = [ln for ln in out.splitlines() if ln.split()[:1] and ln.split()[0] in
             ("same", "changed", "added", "removed", "renamed")]
    assert [ln.split()[0] for ln in lines[:4]] == ["removed", "removed", "added", "added"]
    code, out, _ = _cli(capsys, FIXTURES / "module.pt", FIXTURES / "base.pt", "--only-changed")
    assert code == 0 and "wrapper prefix 'module.' stripped" in " ".join(out.split())
    assert "8 same, 0 changed" in out and "max_abs" not in out  # no rows, so no table


def test_cli_options(capsys):
    _needs("base.pt", "perturbed.pt", "bf16.pt")
    a, b = FIXTURES / "base.pt", FIXTURES / "perturbed.pt"
    code, out, _ = _cli(capsys, a, b, "--json", "--only-changed")
    doc = json.loads(out)
    assert code == 1 and [e["name"] for e in doc["entries"]] == ["layers.1.weight"]
    # A loose enough tolerance makes the perturbation disappear (2*|w| covers the sign flip).
    code, out, _ = _cli(capsys, a, b, "--json", "--atol", "10")
    assert code == 0 and json.loads(out)["counts"]["same"] == 8
    code, out, _ = _cli(capsys, a, b, "--no-values", "--json")
    assert code == 0 and all(e["values"] is None for e in json.loads(out)["entries"])
    code, out, _ = _cli(capsys, a, FIXTURES / "bf16.pt", "--json", "--limit", "2")
    doc = json.loads(out)
    assert code == 1 and len(doc["entries"]) == 2 and doc["counts"]["changed"] == 6
    assert all(e["status"] == "changed" for e in doc["entries"])


@pytest.mark.parametrize("argv,message", [
    (["missing.pt", "base.safetensors"], "missing.pt: no such file or directory"),
    (["base.safetensors", "base.safetensors", "--map", "nonsense"], "expected OLD=NEW"),
    (["base.safetensors"], "the following arguments are required: b"),
    (["base.safetensors", "base.safetensors", "--atol", "-1"], "atol must be a number >= 0, got -1.0"),
    (["base.safetensors", "base.safetensors", "--rtol", "nan"], "rtol must be a number >= 0, got nan"),
])
def test_cli_errors_exit_2(capsys, argv, message):
    argv = [str(FIXTURES / x) if x.endswith((".pt", ".safetensors")) else x for x in argv]
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and message in err and out == ""


def test_cli_help_has_example():
    from tensorscope.commands import diff
    assert "Example:\n  tensorscope diff" in diff.DESCRIPTION and diff.HELP


def test_progress_counts_every_compared_byte_once(tmp_path):
    x = rng().standard_normal(1000).astype(np.float32)
    y = x.copy()
    y[500] += 1
    seen = []
    ma = raw_model(tmp_path / "a.bin", {"same": x, "diff": x, "cast": x})
    mb = raw_model(tmp_path / "b.bin", {"same": x, "diff": y, "cast": x.astype(np.float16)})
    diff_models(ma, mb, progress=seen.append, chunk_bytes=256)
    assert sum(seen) == ma.total_bytes + mb.total_bytes == 8000 + 8000 + 6000
    assert max(seen) <= 512


from hypothesis import given, settings, strategies as st  # noqa: E402

_DT = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16, np.int32, np.int8]


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(0, 7), min_size=0, max_size=3), da=st.sampled_from(_DT),
       db=st.sampled_from(_DT), chunk=st.integers(1, 200), transpose=st.booleans(),
       seed=st.integers(0, 2**31))
def test_any_pair_matches_torch(tmp_path_factory, shape, da, db, chunk, transpose, seed):
    r = np.random.default_rng(seed)
    base = r.standard_normal(shape) * 50
    xa = base.astype(da)
    xb = (base + r.standard_normal(shape) * (r.random(shape) < 0.3)).astype(db)
    d = tmp_path_factory.mktemp("h")
    ma = raw_model(d / "a.bin", {"t": (xa, "T") if transpose and xa.ndim == 2 else xa})
    mb = raw_model(d / "b.bin", {"t": xb})
    (e,) = diff_models(ma, mb, chunk_bytes=chunk).entries
    if e.values.identical_bytes:
        assert xa.dtype == xb.dtype and np.array_equal(xa, xb)
    else:
        check_against(e.values, oracle(to_torch(xa), to_torch(xb)))
