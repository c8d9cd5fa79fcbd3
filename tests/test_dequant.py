"""tensorscope.dequant and ModelFile.values against the real libraries, live.

Oracles: ``gguf.quants.dequantize`` (GGUF blocks; bit for bit: same float32 operations),
``torch.Tensor.dequantize`` (torch quantized types; bit for bit), ``onnx.numpy_helper.to_array``
cast to float32 (packed sub-byte types; exact). Q8_K has no gguf dequantizer: it is checked
against d * qs computed here from the raw bytes.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tensorscope as ts
from tensorscope import dequant
from tensorscope.diffing import diff_models
from tensorscope.errors import FormatError, TensorscopeError
from tensorscope.model import ModelFile, TensorInfo
from tensorscope.reader import tensor_stats

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "fixtures"
DQ = FIX / "dequant"
GGUF_FILES = [DQ / "quants.gguf", FIX / "formats" / "gguf_alltypes.gguf",
              FIX / "formats" / "gguf_v3.gguf", FIX / "formats" / "gguf_be.gguf"]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-for-bit float32 equality (NaN payloads and -0.0 included)."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _gguf_cases():
    out = []
    for path in GGUF_FILES:
        with ts.open(str(path)) as m:
            out += [(path, t.name, t.dtype) for t in m.tensors if dequant.is_decoded(t.dtype)]
    return out


GGUF_CASES = _gguf_cases()
GGUF_ORACLE = [c for c in GGUF_CASES if c[2] in dequant.DECODABLE_BLOCK_TYPES and c[2] != "q8_k"]


def test_every_gguf_oracle_type_is_covered():
    # Every block type gguf-py can dequantize, except the grid i-quants, is decoded and tested.
    assert {c[2] for c in GGUF_ORACLE} == set(dequant.DECODABLE_BLOCK_TYPES) - {"q8_k"}


@pytest.mark.parametrize("path,name,dtype", GGUF_ORACLE, ids=lambda v: getattr(v, "name", v))
def test_gguf_blocks_match_gguf_py(path, name, dtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    with ts.open(str(path)) as m:
        t = m.tensor(name)
        raw = np.asarray(m.read(t)).reshape(-1, t.nbytes // t.shape[0] if t.shape else t.nbytes)
        with np.errstate(all="ignore"):
            ref = dequantize(raw, GGMLQuantizationType[dtype.upper()]).reshape(t.shape)
        got = m.values(t)
        assert got.dtype == np.float32 and got.shape == t.shape
        assert _bits_equal(got, ref)
        # Chunked decoding (pieces of whole blocks, across rows) gives the same values.
        pieces = list(dequant.iter_decoded(m, t, chunk_elems=300))
        assert max(p.size for p in pieces) <= max(300, 256)
        assert _bits_equal(np.concatenate(pieces).reshape(t.shape), ref)


def test_q8_k_is_d_times_qs():
    with ts.open(str(DQ / "quants.gguf")) as m:
        t = m.tensor("raw.q8_k")
        blocks = np.asarray(m.read(t)).reshape(-1, 292)
        d = blocks[:, :4].copy().view(np.float32)
        ref = (d * blocks[:, 4:260].view(np.int8).astype(np.float32)).reshape(t.shape)
        assert _bits_equal(m.values(t), ref)


@pytest.mark.parametrize("dtype,message", [
    ("iq2_xxs", "cannot decode iq2_xxs: iq2_xxs blocks are not decoded by tensorscope (supported: "
                + ", ".join(dequant.DECODABLE_BLOCK_TYPES) + ")"),
    ("q8_1", "cannot decode q8_1: q8_1 is an intermediate type of ggml's matrix products whose "
             "stored layout is ambiguous (gguf-py 0.19 gives it 40-byte blocks, ggml 36)"),
    ("q1_0", "cannot decode q1_0: q1_0 blocks are not decoded"),
])
def test_undecodable_block_types_name_the_type(dtype, message):
    with ts.open(str(FIX / "formats" / "gguf_alltypes.gguf")) as m:
        with pytest.raises(TensorscopeError) as err:
            m.values(f"t.{dtype}")
        assert str(err.value).startswith(f"tensor 't.{dtype}': {message}")
        assert m.read(f"t.{dtype}").dtype == np.uint8  # the stored bytes stay readable


# -- torch quantized and float4_e2m1fn_x2 ------------------------------------------------------

def _torch_cases():
    out = []
    for path in (FIX / "torch" / "quantized.pt", DQ / "torch_quant.pt"):
        with ts.open(str(path)) as m:
            out += [(path, t.name) for t in m.tensors]
    return out


@pytest.mark.parametrize("path,name", _torch_cases(), ids=lambda v: getattr(v, "name", v))
def test_torch_values_match_torch(path, name):
    torch = pytest.importorskip("torch")
    ref_t = torch.load(path, weights_only=False)[name]  # our own trusted fixture, as the oracle
    with ts.open(str(path)) as m:
        t = m.tensor(name)
        got = m.values(t)
    if ref_t.is_quantized:
        assert _bits_equal(got, ref_t.dequantize().numpy())
    else:  # float4_e2m1fn_x2: torch cannot convert it; unpack its bytes low nibble first
        import ml_dtypes
        b = ref_t.contiguous().view(torch.uint8).numpy()
        pairs = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[:-1] + (-1,))
        ref = pairs.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
        assert got.shape == t.shape[:-1] + (2 * t.shape[-1],) == dequant.decoded_shape(t)
        assert _bits_equal(got, ref)


def test_safetensors_f4_x2_doubles_the_last_dimension():
    with ts.open(str(FIX / "formats" / "st_torch.safetensors")) as m:
        t = m.tensor("f4_x2")
        got = m.values(t)
        assert got.shape == tuple(t.extras["header_shape"])
        raw = np.asarray(m.read(t))
        assert got.reshape(-1)[:2].tolist() == [_e2m1(raw.reshape(-1)[0] & 15), _e2m1(raw.reshape(-1)[0] >> 4)]


def _e2m1(code: int) -> float:
    mag = [0, 0.5, 1, 1.5, 2, 3, 4, 6][code & 7]
    return -mag if code & 8 else mag


# -- packed sub-byte (ONNX) --------------------------------------------------------------------

def _onnx_cases():
    out = []
    for path in (FIX / "onnx" / "all_types_raw.onnx", FIX / "onnx" / "typed.onnx", DQ / "subbyte.onnx"):
        with ts.open(str(path)) as m:
            out += [(path, t.name) for t in m.tensors if dequant.is_decoded(t.dtype)]
    return out


ONNX_CASES = _onnx_cases()


def test_onnx_cases_cover_every_packed_type():
    with ts.open(str(DQ / "subbyte.onnx")) as m:
        assert {t.dtype for t in m.tensors} == {"int4", "uint4", "float4_e2m1fn", "int2", "uint2",
                                                "float6_e2m3fn", "float6_e3m2fn"}


@pytest.mark.parametrize("path,name", ONNX_CASES, ids=lambda v: getattr(v, "name", v))
def test_onnx_packed_match_onnx(path, name):
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(path))
    proto = next(i for i in model.graph.initializer if i.name == name)
    ref = numpy_helper.to_array(proto).astype(np.float32)
    with ts.open(str(path)) as m:
        t = m.tensor(name)
        assert _bits_equal(m.values(t), ref)
        for chunk in (1, 7, 100):  # piece boundaries inside 3-byte groups and bytes
            got = np.concatenate(list(dequant.iter_decoded(m, t, chunk))).reshape(ref.shape)
            assert _bits_equal(got, ref)


# -- the API contract ----------------------------------------------------------------------------

def test_values_of_plain_dtypes_is_the_zero_copy_view():
    with ts.open(str(FIX / "formats" / "st_torch.safetensors")) as m:
        v, r = m.values("f32"), m.read("f32")
        assert v.dtype == np.float32 and not v.flags.writeable and np.shares_memory(v, r)
        with pytest.raises(TensorscopeError, match="stored as its values"):
            dequant.decode(m, m.tensor("f32"))


def test_decoded_values_are_a_writable_copy():
    with ts.open(str(DQ / "quants.gguf")) as m:
        t = m.tensor("quant.q4_0")
        v = m.values(t)
        assert v.flags.writeable
        assert not np.shares_memory(v, m.read(t))
        v[...] = 0  # never touches the file
        assert m.values(t).any()


# -- bad input -----------------------------------------------------------------------------------

def _raw_model(tmp_path, data: bytes, *infos: TensorInfo) -> ModelFile:
    path = tmp_path / "raw.bin"
    path.write_bytes(data)
    return ModelFile("raw", str(path), [TensorInfo(**{**i, "file": str(path)}) for i in infos])


def test_per_channel_scales_outside_the_file(tmp_path):
    m = _raw_model(tmp_path, bytes(16), dict(
        name="q", dtype="qint8", shape=(4, 2), byte_offset=0, source_format="raw",
        extras={"qscheme": "per_channel_affine", "axis": 0,
                "scales": {"dtype": "float64", "shape": [4], "storage_key": "1", "byte_offset": 8},
                "zero_points": {"dtype": "int64", "shape": [4], "storage_key": "2", "byte_offset": 0}}))
    with pytest.raises(FormatError) as err:
        m.values("q")
    assert str(err.value).endswith("scales of tensor 'q' wants 32 bytes at offset 8, the file has "
                                   "16 bytes (8 remain)")


def test_packed_bytes_short_of_the_shape(tmp_path):
    m = _raw_model(tmp_path, bytes(3), dict(name="p", dtype="int4", shape=(7,), byte_offset=0,
                                            source_format="raw", storage_nbytes=3))
    with pytest.raises(FormatError) as err:
        m.values("p")
    assert str(err.value).endswith("tensor 'p' needs 4 bytes for 7 4-bit values, its storage holds 3")


def test_block_count_not_whole(tmp_path):
    import tensorscope.parsers.gguf  # noqa: F401  (registers the block dtypes)
    m = _raw_model(tmp_path, bytes(64), dict(name="b", dtype="q4_0", shape=(40,), byte_offset=0,
                                             nbytes=36, source_format="raw"))
    with pytest.raises(FormatError) as err:
        m.values("b")
    assert str(err.value).endswith("tensor 'b' of q4_0 has 40 values, not a multiple of its block of 32")


# -- consumers: diff, inspect --stats --------------------------------------------------------------

def test_diff_f16_safetensors_against_its_q8_0_gguf():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    a, b = DQ / "model.f16.safetensors", DQ / "model.q8_0.gguf"
    res = diff_models(str(a), str(b))
    assert res.exit_code == 1 and res.counts["changed"] == 3
    with ts.open(str(a)) as ma, ts.open(str(b)) as mb:
        for e in res.entries:
            tb = mb.tensor(e.name)
            x = np.asarray(ma.read(e.name), np.float64)
            raw = np.asarray(mb.read(tb)).reshape(-1, 34)
            y = dequantize(raw, GGMLQuantizationType.Q8_0).reshape(tb.shape).astype(np.float64)
            assert e.changes[0] == "dtype float16 -> q8_0" and e.values.compared_as == "float64"
            assert e.values.max_abs == float(np.abs(x - y).max())
            assert e.values.max_abs < 0.05 * float(np.abs(x).max())   # Q8_0 is close
            assert e.values.mismatched == int((~np.isclose(y, x, rtol=1e-5, atol=1e-8)).sum())
            assert e.values.cosine > 0.999


def test_diff_quantized_same_bytes_other_scale(tmp_path):
    common = dict(dtype="quint8", shape=(4,), byte_offset=0, source_format="raw")
    m1 = _raw_model(tmp_path, bytes([1, 2, 3, 4]),
                    dict(name="q", extras={"qscheme": "per_tensor_affine", "scale": 0.5, "zero_point": 0}, **common))
    m2 = _raw_model(tmp_path, bytes([1, 2, 3, 4]),
                    dict(name="q", extras={"qscheme": "per_tensor_affine", "scale": 0.25, "zero_point": 0}, **common))
    e = diff_models(m1, m2).entries[0]
    assert e.status == "changed" and e.values.max_abs == 1.0 and e.values.mismatched == 4


def test_inspect_stats_of_decoded_values():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    out = subprocess.run([sys.executable, "-m", "tensorscope", "inspect", str(DQ / "quants.gguf"),
                          "--stats", "--json", "--filter", "raw.q4_k"],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    row = next(r for r in doc["tensors"] if r["name"] == "raw.q4_k")
    with ts.open(str(DQ / "quants.gguf")) as m:
        t = m.tensor("raw.q4_k")
        ref = dequantize(np.asarray(m.read(t)).reshape(3, -1), GGMLQuantizationType.Q4_K)
    expect = tensor_stats(ref).to_dict()
    for key in ("numel", "min", "max", "nan", "inf", "zeros"):
        assert row["stats"][key] == expect[key]
    assert row["stats"]["mean"] == pytest.approx(expect["mean"], rel=1e-12)
    assert row["stats"]["std"] == pytest.approx(expect["std"], rel=1e-12)


# -- bounded memory ------------------------------------------------------------------------------

_MEM_PROBE = r"""
import sys
import tensorscope as ts
from tensorscope import dequant
def mb(key):  # VmHWM is this process's peak (ru_maxrss would carry the forking parent's)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) / 1024
m = ts.open(sys.argv[1]); t = m.tensor("big")
base = mb("VmRSS")
st = dequant.value_stats(m, t, 1 << 18) if sys.argv[2] == "stream" else dequant.decode(m, t)
print(mb("VmHWM") - base)
"""


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_large_q4_k_decodes_in_bounded_memory(tmp_path):
    import gguf
    sys.path.insert(0, str(FIX))
    from gen_dequant import sane_blocks
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    q4k = gguf.GGMLQuantizationType.Q4_K
    w.add_tensor("big", sane_blocks(q4k, 4096, 4096, np.random.default_rng(1)), raw_dtype=q4k)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    full_mb = 4096 * 4096 * 4 / 2**20  # 64 MiB of float32

    def growth(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _MEM_PROBE, str(path), mode],
                             capture_output=True, text=True, check=True)
        return float(out.stdout.strip())

    streamed, whole = growth("stream"), growth("whole")
    assert whole > full_mb * 0.9            # the probe sees a full decode
    assert streamed < full_mb / 3           # ~13 MiB measured: one piece plus the touched pages
