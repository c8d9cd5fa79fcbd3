"""`tensorscope convert`: every trusted fixture converts to a safetensors file that equals what the
real loader returns, bit for bit, and that is byte-identical to `safetensors.torch.save_file`'s;
hostile input is refused by default and converted without executing anything when allowed;
failures never leave a file behind."""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import tensorscope
from tensorscope import TensorscopeError
from tensorscope import convert as convert_mod
from tensorscope.convert import writer as convert_writer
from tensorscope.cli import main
from tensorscope.convert import UnsafeSource, Unconvertible, convert, parse_size, plan
from tensorscope.model import Chunk, ModelFile, TensorInfo

from torch_oracle import FIXTURES, flatten
from helpers import audit

# dtypes safetensors cannot hold: the oracle side of "refused, naming them"
UNSUPPORTED_TORCH = {torch.complex128, torch.complex32, torch.qint8, torch.quint8, torch.qint32,
                     torch.quint4x2, torch.quint2x4}


# ------------------------------------------------------------------------------------------------
# Oracles
# ------------------------------------------------------------------------------------------------

def _torch_fixtures() -> list[Path]:
    out = sorted(p for p in (FIXTURES / "torch").iterdir() if p.is_file())
    containers = FIXTURES / "containers"
    if containers.is_dir():  # legacy, TorchScript, .pt2 (plain pickles are not torch.load files)
        out += sorted(p for p in containers.iterdir()
                      if p.is_file() and p.suffix in (".pt", ".ptl", ".pt2", ".pth", ".bin", ".ckpt"))
    dist = FIXTURES / "distributed"
    if dist.is_dir():  # .pt2 files; DCP checkpoints and sharded checkpoints: one folder each
        out += sorted(dist.rglob("*.pt2"))
        for kind in ("dcp", "sharded"):
            if (dist / kind).is_dir():
                out += sorted(p for p in (dist / kind).iterdir() if p.is_dir())
    return out


def _torch_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """What the real loaders return for a trusted fixture, as a state dict."""
    fmt = tensorscope.identify(path)
    if path.is_dir():
        return _folder_state_dict(path, fmt)
    if fmt and fmt[0] in ("torchscript",):
        obj = torch.jit.load(str(path))
    elif path.suffix == ".pt2":
        obj = dict(torch.export.load(str(path)).state_dict)  # parameters and persistent buffers
    else:
        obj = torch.load(str(path), weights_only=False)
    if isinstance(obj, torch.nn.Module):
        return dict(obj.state_dict())
    return flatten(obj)


def _folder_state_dict(path: Path, fmt: list[str]) -> dict[str, torch.Tensor]:
    if (path / ".metadata").exists():  # DCP: torch's own converter to a torch.save file
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
        buf = path.parent / f".{path.name}.oracle.pt"
        try:
            dcp_to_torch_save(str(path), str(buf))
            return flatten(torch.load(str(buf), weights_only=False))
        finally:
            buf.unlink(missing_ok=True)
    cache_ref = next(iter(sorted(path.glob("models--*/refs/main"))), None)
    if cache_ref is not None:  # a Hugging Face cache: the snapshot refs/main points at
        path = cache_ref.parent.parent / "snapshots" / cache_ref.read_text().strip()
    sd: dict[str, torch.Tensor] = {}
    index = next(iter(sorted(path.glob("*.index.json"))), None)
    if index is not None:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = sorted(p.name for p in path.iterdir() if p.suffix in (".safetensors", ".bin"))
    for shard in shards:
        if shard.endswith(".safetensors"):
            sd.update(load_file(str(path / shard)))
        else:
            sd.update(flatten(torch.load(str(path / shard), weights_only=False)))
    return sd


def _is_unsupported(t: torch.Tensor) -> bool:
    subclass = type(t) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer)
    return t.dtype in UNSUPPORTED_TORCH or t.is_quantized or t.is_meta or subclass


def _load_output(out: Path) -> dict[str, torch.Tensor]:
    index = out.parent / (out.name + ".index.json")
    if index.exists():
        sd = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            sd.update(load_file(str(out.parent / shard)))
        return sd
    return load_file(str(out))


def _bits(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(sorted(got)) == list(sorted(want))
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, name
        assert tuple(g.shape) == tuple(w.shape), name
        assert _bits(g) == _bits(w), name


def _convert_skipping(src: Path, out: Path, refused: set[str], everything: set[str], **kw):
    """Convert; when the oracle says some tensors cannot be held, the default run must refuse
    naming each of them, and --skip-unsupported converts the rest (None: nothing is left)."""
    if refused:
        with pytest.raises(Unconvertible) as e:
            convert(src, out, **kw)
        for name in [r["name"] for r in e.value.report.refused][:8]:
            assert name in str(e.value)
        assert not out.exists()
        assert sorted(r["name"] for r in e.value.report.refused) == sorted(refused)
        if refused == everything:
            with pytest.raises(Unconvertible, match="nothing to convert"):
                convert(src, out, skip_unsupported=True, **kw)
            assert not out.exists()
            return None
        return convert(src, out, skip_unsupported=True, **kw)
    return convert(src, out, **kw)


# ------------------------------------------------------------------------------------------------
# Every trusted fixture, against the real loaders
# ------------------------------------------------------------------------------------------------

TORCH_FIXTURES = _torch_fixtures()


@pytest.mark.parametrize("src", TORCH_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_torch_fixture_converts_bit_for_bit(src, tmp_path):
    if src.is_dir() and not tensorscope.identify(src):
        pytest.skip(f"no parser for this folder yet ({src.name})")
    want = _torch_state_dict(src)
    refused = {n for n, t in want.items() if _is_unsupported(t)}
    out = tmp_path / "model.safetensors"
    report = _convert_skipping(src, out, refused, set(want), verify=True)
    if report is None:
        return
    assert report.verified is True
    expected = {n: t for n, t in want.items() if n not in refused}
    _assert_same(_load_output(out), expected)
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def _same_as_save_file_candidates() -> list[Path]:
    return [p for p in TORCH_FIXTURES if p.is_file()]


@pytest.mark.parametrize("src", _same_as_save_file_candidates(), ids=lambda p: p.name)
def test_bytes_equal_safetensors_save_file(src, tmp_path):
    """Same state dict, same metadata: our file is byte-identical to safetensors' own writer's."""
    want = {n: t.detach().contiguous().clone() for n, t in _torch_state_dict(src).items()
            if not _is_unsupported(t)}
    if not want:
        pytest.skip("no tensor safetensors can hold")
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    convert(src, ours, skip_unsupported=True, record_source=False, metadata={"format": "pt"})
    meta = _header(ours)[1]["__metadata__"]
    save_file(want, str(theirs), metadata=meta)
    if len(meta) == 1:
        assert ours.read_bytes() == theirs.read_bytes()
    else:  # the reference writer orders __metadata__ keys by a HashMap: compare all but that
        _assert_same_layout(ours, theirs)


def _assert_same_layout(a: Path, b: Path) -> None:
    """Same header length, same tensor entries in the same order, same metadata, same data."""
    ra, rb = a.read_bytes(), b.read_bytes()
    (na,), (nb,) = struct.unpack("<Q", ra[:8]), struct.unpack("<Q", rb[:8])
    assert na == nb
    ha = json.loads(ra[8:8 + na], object_pairs_hook=list)
    hb = json.loads(rb[8:8 + nb], object_pairs_hook=list)
    assert [kv for kv in ha if kv[0] != "__metadata__"] == [kv for kv in hb if kv[0] != "__metadata__"]
    assert dict(dict(ha)["__metadata__"]) == dict(dict(hb)["__metadata__"])
    assert ra[8 + na:] == rb[8 + nb:]


def _onnx_fixtures() -> list[Path]:
    root = FIXTURES / "onnx"
    if not root.is_dir():
        return []
    return sorted(root.rglob("*.onnx"))


def _onnx_initializers(path: Path) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(path), load_external_data=True)
    out: dict[str, np.ndarray] = {}

    def walk(graph):
        for init in graph.initializer:
            out[init.name] = (init.data_type, numpy_helper.to_array(init))
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)
    walk(model.graph)
    return out


# ONNX data types safetensors holds (the rest are refused): FLOAT..BOOL, FLOAT16, DOUBLE, UINT32/64,
# COMPLEX64, BFLOAT16, the float8 family.
_ONNX_OK = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 24}


@pytest.mark.parametrize("src", _onnx_fixtures(), ids=lambda p: str(p.relative_to(FIXTURES)))
def test_onnx_fixture_converts_initializers(src, tmp_path):
    inits = _onnx_initializers(src)
    refused = {n for n, (dt, _) in inits.items() if dt not in _ONNX_OK}
    out = tmp_path / "model.safetensors"
    _convert_skipping(src, out, refused, set(inits), verify=True)
    with safe_open(str(out), "np") as f:
        got_names = set(f.keys())
    assert got_names == set(inits) - refused
    got = load_file(str(out))
    for name in got_names:
        _, arr = inits[name]
        assert tuple(got[name].shape) == arr.shape, name
        assert _bits(got[name]) == np.ascontiguousarray(arr).tobytes(), name


def _numpy_fixtures() -> list[Path]:
    root = FIXTURES / "formats"
    return sorted(p for p in root.glob("*.np[yz]")) if root.is_dir() else []


@pytest.mark.parametrize("src", _numpy_fixtures(), ids=lambda p: p.name)
def test_numpy_fixture_converts(src, tmp_path):
    loaded = np.load(src, allow_pickle=False) if src.name != "object.npy" else None
    if src.suffix == ".npz":
        arrays = {k: loaded[k] for k in loaded.files}
    elif loaded is None:
        arrays = {"<root>": np.empty(5, dtype=object)}  # np.load would need allow_pickle
    else:
        arrays = {"<root>": loaded}
    refused = {n for n, a in arrays.items() if a.dtype.kind in "OUSVc" and a.dtype != np.complex64
               or a.dtype.fields is not None}
    refused |= {n for n, a in arrays.items() if a.dtype == np.complex128}
    out = tmp_path / "model.safetensors"
    if refused == set(arrays):
        with pytest.raises(Unconvertible, match="cannot convert"):
            convert(src, out)
        assert not out.exists()
        return
    _convert_skipping(src, out, refused, set(arrays), verify=True)
    got = load_file(str(out))
    assert set(got) == set(arrays) - refused
    for name, arr in arrays.items():
        if name in refused:
            continue
        le = arr.astype(arr.dtype.newbyteorder("<"))
        assert tuple(got[name].shape) == arr.shape
        assert _bits(got[name]) == np.ascontiguousarray(le).tobytes()


# ------------------------------------------------------------------------------------------------
# Layout of the file: header, order, metadata, names
# ------------------------------------------------------------------------------------------------

def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8:8 + n])


def test_metadata_records_source_format_and_sha256(tmp_path):
    src = FIXTURES / "torch" / "tied.bin"
    out = tmp_path / "t.safetensors"
    report = convert(src, out)
    n, header = _header(out)
    meta = header["__metadata__"]
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert meta == {"format": "pt", "source_format": "torch-zip", "source_sha256": digest,
                    "converted_by": f"tensorscope {tensorscope.__version__}"}
    assert report.source_sha256 == digest
    assert n % 8 == 0
    with safe_open(str(out), "pt") as f:
        assert f.metadata() == meta


def test_multi_file_input_hash_is_a_manifest_digest(tmp_path):
    src = FIXTURES / "distributed" / "sharded" / "bin_index"
    if not tensorscope.identify(src):
        pytest.skip("no parser for sharded folders yet")
    report = convert(src, tmp_path / "model.safetensors")
    files = sorted(p for p in src.iterdir() if p.is_file())
    manifest = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n" for p in files)
    digest = hashlib.sha256(manifest.encode()).hexdigest()
    assert report.source_sha256 == digest
    assert {os.path.basename(k): v for k, v in report.source_files.items()} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    for out in report.outputs:
        assert _header(Path(out["path"]))[1]["__metadata__"]["source_sha256"] == digest


def test_random_state_dicts_match_save_file(tmp_path):
    """Seeded random state dicts (every dtype, odd shapes, names needing JSON escapes, unicode,
    views sharing storages) through torch.save -> convert: byte-identical to save_file."""
    dtypes_ = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.uint16,
               torch.uint32, torch.uint64, torch.complex64, torch.float8_e4m3fn,
               torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]
    names = ["a", "B", "é.weight", 'q"uote', "back\\slash", "tab\there", "nl\nx", "\x01ctl",
             "z" * 50, "layers.10.w", "layers.9.w", "日本", "\x7fdel", "emoji😀", "sp ace"]
    rng = random.Random(1234)
    gen = torch.Generator().manual_seed(1234)
    for case in range(6):
        sd = {}
        for name in rng.sample(names, 8):
            dt = rng.choice(dtypes_)
            shape = tuple(rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.randint(0, 3)))
            numel = int(np.prod(shape))
            nbytes = numel * torch.empty((), dtype=dt).element_size()
            raw = torch.randint(0, 2 if dt == torch.bool else 256, (nbytes,), dtype=torch.uint8,
                                generator=gen)  # bool bytes other than 0/1 are not bools
            t = raw.view(dt).reshape(shape) if numel else torch.empty(shape, dtype=dt)
            if rng.random() < 0.3 and t.dim() == 2:
                t = t.t()  # non-contiguous view
            sd[name] = t
        if len(sd) > 1 and rng.random() < 0.5:
            first = next(iter(sd))
            sd["shared.alias"] = sd[first]  # a second name for one storage
        src = tmp_path / f"case{case}.pt"
        torch.save(sd, src)
        ours, theirs = tmp_path / f"o{case}.safetensors", tmp_path / f"t{case}.safetensors"
        convert(src, ours, record_source=False, metadata={"format": "pt"}, verify=True)
        save_file({k: v.contiguous().clone() for k, v in sd.items()}, str(theirs),
                  metadata={"format": "pt"})
        assert ours.read_bytes() == theirs.read_bytes(), case


def test_float4_header_shape_doubles_the_last_dimension(tmp_path):
    t = torch.arange(12, dtype=torch.uint8).reshape(3, 4).view(torch.float4_e2m1fn_x2)
    src, out, theirs = tmp_path / "f4.pt", tmp_path / "f4.safetensors", tmp_path / "t.safetensors"
    torch.save({"w": t}, src)
    convert(src, out, record_source=False, metadata={"format": "pt"}, verify=True)
    save_file({"w": t}, str(theirs), metadata={"format": "pt"})
    assert _header(out)[1]["w"] == {"dtype": "F4", "shape": [3, 8], "data_offsets": [0, 12]}
    assert out.read_bytes() == theirs.read_bytes()


def test_report_names_shared_expanded_and_contiguous(tmp_path):
    report = convert(FIXTURES / "torch" / "views.pt", tmp_path / "v.safetensors")
    assert report.shared == {"views/data/0": ["base", "slice", "strided"],
                             "views/data/1": ["matrix", "transposed"]}
    assert report.expanded == ["expanded"]
    assert report.contiguous == ["strided", "transposed"]
    d = report.to_dict()
    assert d["schema"] == "tensorscope.convert/1" and d["status"] == "converted"
    assert d["shared"][0] == {"storage": "views/data/0", "tensors": ["base", "slice", "strided"]}
    assert d["tensors_written"] == 9


def test_module_skips_non_persistent_buffers_unless_all(tmp_path):
    src = FIXTURES / "torch" / "module.pt"
    report = convert(src, tmp_path / "a.safetensors")
    assert report.skipped == [{"name": "scratch", "dtype": "float32",
                               "reason": "role buffer(non-persistent): not part of the state dict"}]
    report = convert(src, tmp_path / "b.safetensors", include_all=True)
    assert "scratch" in load_file(str(tmp_path / "b.safetensors"))
    assert report.skipped == []


def test_sparse_components_recorded_in_metadata(tmp_path):
    out = tmp_path / "s.safetensors"
    convert(FIXTURES / "torch" / "sparse.pt", out)
    sparse = json.loads(_header(out)[1]["__metadata__"]["tensorscope.sparse"])
    assert sparse == {"coo": {"layout": "sparse_coo", "shape": [2, 3]},
                      "csr": {"layout": "sparse_csr", "shape": [2, 3]}}


def test_refusals_name_the_tensors(tmp_path):
    out = tmp_path / "x.safetensors"
    with pytest.raises(Unconvertible) as e:
        convert(FIXTURES / "torch" / "dtypes.pt", out)
    assert str(e.value) == (
        f"{FIXTURES / 'torch' / 'dtypes.pt'}: cannot convert 2 tensor(s) to safetensors: "
        "complex128 (dtype complex128: no safetensors equivalent); complex32 (dtype complex32: no "
        "safetensors equivalent). Pass --skip-unsupported to leave them out")
    with pytest.raises(Unconvertible, match=r"m \(no stored values \(meta tensor\)\)"):
        convert(FIXTURES / "torch" / "meta.pt", out)
    with pytest.raises(Unconvertible, match=r"per_tensor \(dtype quint8: a quantized torch dtype"):
        convert(FIXTURES / "torch" / "quantized.pt", out)
    with pytest.raises(Unconvertible, match=r"nothing to convert: no tensor is left to write"):
        convert(FIXTURES / "torch" / "quantized.pt", out, skip_unsupported=True)
    assert list(tmp_path.iterdir()) == []


def test_name_collisions_are_refused(tmp_path):
    a = TensorInfo("w", "float32", (1,), byte_offset=0, file=str(tmp_path / "x"))
    model = ModelFile("test", "m", [a, a])
    with pytest.raises(Unconvertible, match="several tensors are named 'w'"):
        plan(model)
    model = ModelFile("test", "m", [TensorInfo("__metadata__", "float32", (1,), byte_offset=0)])
    with pytest.raises(Unconvertible, match="safetensors reserves"):
        plan(model)


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("1.5KB") == 1500
    assert parse_size("4096") == 4096
    for bad in ("", "GB", "5XB", "-1", "0"):
        with pytest.raises(ValueError):
            parse_size(bad)


# ------------------------------------------------------------------------------------------------
# Sharding
# ------------------------------------------------------------------------------------------------

def test_max_shard_size_writes_shards_and_index(tmp_path):
    src = FIXTURES / "torch" / "nested.pth"
    out = tmp_path / "model.safetensors"
    report = convert(src, out, max_shard_size=100, verify=True)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    n = len(report.outputs)
    assert n > 1 and not out.exists()
    assert [Path(o["path"]).name for o in report.outputs] == [
        f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    want = flatten(torch.load(src, weights_only=False))
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in want.values())
    assert set(index["weight_map"]) == set(want)
    _assert_same(_load_output(out), want)
    # greedy, in state-dict order: each shard under the limit unless one tensor exceeds it
    sizes = {}
    for name, shard in index["weight_map"].items():
        sizes[shard] = sizes.get(shard, 0) + want[name].numel() * want[name].element_size()
    for shard, size in sizes.items():
        assert size <= 100 or len([k for k, v in index["weight_map"].items() if v == shard]) == 1


def _write_sharded_bin(folder: Path) -> dict[str, torch.Tensor]:
    """An HF-style sharded .bin checkpoint (what save_pretrained writes with safe_serialization off)."""
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    shard1 = {"embed.weight": torch.randn(8, 4, generator=g), "layers.0.w": torch.randn(4, 4, generator=g)}
    shard2 = {"layers.1.w": torch.randn(4, 4, generator=g).half(), "head.bias": torch.zeros(3)}
    names = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    torch.save(shard1, folder / names[0])
    torch.save(shard2, folder / names[1])
    wm = {**{k: names[0] for k in shard1}, **{k: names[1] for k in shard2}}
    total = sum(t.numel() * t.element_size() for t in {**shard1, **shard2}.values())
    (folder / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))
    return {**shard1, **shard2}


def test_sharded_input_gives_sharded_output(tmp_path):
    src = tmp_path / "ckpt"
    want = _write_sharded_bin(src)
    try:
        model = tensorscope.open(src)
    except TensorscopeError:
        pytest.skip("no parser for sharded folders yet")
    model.close()
    out = tmp_path / "out"
    out.mkdir()
    report = convert(src, out, verify=True)
    assert [Path(o["path"]).name for o in report.outputs] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"embed.weight": "model-00001-of-00002.safetensors",
                                   "layers.0.w": "model-00001-of-00002.safetensors",
                                   "layers.1.w": "model-00002-of-00002.safetensors",
                                   "head.bias": "model-00002-of-00002.safetensors"}
    _assert_same(_load_output(out / "model.safetensors"), want)


# ------------------------------------------------------------------------------------------------
# Chunked tensors (DCP): assembled block by block
# ------------------------------------------------------------------------------------------------

def test_chunked_tensor_is_assembled_in_c_order(tmp_path):
    full = np.arange(6 * 5, dtype=np.float32).reshape(6, 5)
    # four chunks: rows split at 4, columns at 2 (DCP Shard(0) x Shard(1)); one stored transposed
    pieces = [((0, 0), (4, 2)), ((0, 2), (4, 3)), ((4, 0), (2, 2)), ((4, 2), (2, 3))]
    blob = bytearray()
    chunks = []
    path = str(tmp_path / "blob")
    for i, (off, size) in enumerate(pieces):
        part = full[off[0]:off[0] + size[0], off[1]:off[1] + size[1]]
        if i == 1:  # stored column-major: strides (1, rows)
            stored, stride = np.asfortranarray(part), (1, size[0])
        else:
            stored, stride = np.ascontiguousarray(part), None
        info = TensorInfo(f"w.{i}", "float32", size, stride=stride, byte_offset=len(blob), file=path)
        blob += stored.tobytes(order="A")
        chunks.append(Chunk(off, size, info))
    Path(path).write_bytes(bytes(blob))
    model = ModelFile("dcp", str(tmp_path), [TensorInfo("w", "float32", (6, 5), file=path,
                                                        chunks=tuple(chunks))])
    try:
        for chunk_bytes in (20, 64, 1 << 20):  # one row per block, a few rows, everything
            got = np.concatenate(list(convert_writer._chunked_pieces(model, model.tensors[0], chunk_bytes)))
            assert got.tobytes() == full.tobytes()
        p = plan(model)
        assert [t.name for t in p.tensors] == ["w"]
    finally:
        model.close()


# ------------------------------------------------------------------------------------------------
# Hostile input: refused by default, converted without executing anything when allowed
# ------------------------------------------------------------------------------------------------

class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _malicious(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], Path]:
    marker = tmp_path / "PWNED"
    weights = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
    src = tmp_path / "evil.pt"
    torch.save({**weights, "payload": _Payload(str(marker))}, src)  # pickled, never run
    return src, weights, marker


def test_malicious_source_is_refused_by_default(tmp_path, capsys):
    src, _, marker = _malicious(tmp_path)
    out = tmp_path / "out.safetensors"
    with pytest.raises(UnsafeSource) as e:
        convert(src, out)
    assert "refused: the scan found critical issues (pickle.dangerous-global" in str(e.value)
    assert e.value.report.status == "refused-unsafe"
    assert not out.exists() and not marker.exists()
    assert main(["convert", str(src), str(out)]) == 1
    captured = capsys.readouterr()
    assert "scan: " in captured.out and "critical" in captured.out
    assert "--allow-unsafe-source" in captured.err
    assert not out.exists()


def test_malicious_source_converts_without_executing_when_allowed(tmp_path):
    src, weights, marker = _malicious(tmp_path)
    out = tmp_path / "out.safetensors"
    convert(src, tmp_path / "warm.safetensors", allow_unsafe_source=True, verify=True)  # lazy imports
    with audit():
        report = convert(src, out, allow_unsafe_source=True, verify=True)
    assert not marker.exists()
    assert report.allowed_unsafe and report.scan.unsafe
    _assert_same(load_file(str(out)), weights)


# ------------------------------------------------------------------------------------------------
# Durability: no half-written output, ever
# ------------------------------------------------------------------------------------------------

def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "out.safetensors"
    real = convert_writer._Sink._account
    calls = {"n": 0}

    def failing(self, n):  # every write and kernel copy is accounted here
        calls["n"] += 1
        if calls["n"] == 5:
            raise OSError("disk on fire")
        real(self, n)

    monkeypatch.setattr(convert_writer._Sink, "_account", failing)
    with pytest.raises(OSError, match="disk on fire"):
        convert(FIXTURES / "torch" / "nested.pth", out)
    assert list(tmp_path.iterdir()) == []
    # an existing output survives a failed --force run untouched
    out.write_bytes(b"previous")
    calls["n"] = 0
    with pytest.raises(OSError):
        convert(FIXTURES / "torch" / "nested.pth", out, force=True)
    assert out.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["out.safetensors"]


@pytest.mark.parametrize("kernel_copy", [True, False, "gathered"],
                         ids=["copy_file_range", "mmap-writes", "gathered-preads"])
def test_both_copy_paths_give_the_same_file(tmp_path, monkeypatch, kernel_copy):
    """Contiguous tensors go through os.copy_file_range; where the kernel refuses it (EXDEV,
    ENOSYS) the bytes go through the memory map; small ones are gathered by pread into batched
    writes (here flushed every 100 bytes): the file is the same."""
    if kernel_copy == "gathered":
        monkeypatch.setattr(convert_writer._Sink, "GATHER_STEP", 100)
    else:
        monkeypatch.setattr(convert_writer._Sink, "GATHER_BELOW", 0)
    if not kernel_copy:
        def refuse(*a, **kw):
            raise OSError(18, "Invalid cross-device link")
        monkeypatch.setattr(convert_writer.os, "copy_file_range", refuse, raising=False)
    src = FIXTURES / "torch" / "nested.pth"
    out = tmp_path / "out.safetensors"
    convert(src, out, record_source=False, metadata={"format": "pt"}, verify=True)
    theirs = tmp_path / "theirs.safetensors"
    save_file(flatten(torch.load(src, weights_only=False)), str(theirs), metadata={"format": "pt"})
    assert out.read_bytes() == theirs.read_bytes()


def test_existing_output_needs_force(tmp_path):
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"previous")
    with pytest.raises(TensorscopeError, match=r"exists; pass --force to replace it"):
        convert(FIXTURES / "torch" / "tied.bin", out)
    assert out.read_bytes() == b"previous"
    convert(FIXTURES / "torch" / "tied.bin", out, force=True)
    assert set(load_file(str(out))) == {"embed.weight", "lm_head.weight"}


def test_output_never_overwrites_the_input(tmp_path):
    src = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(2)}, str(src))
    with pytest.raises(TensorscopeError, match="would overwrite the input"):
        convert(src, src, force=True)
    assert set(load_file(str(src))) == {"a"}


def test_verify_catches_a_corrupted_output(tmp_path, monkeypatch):
    real = convert_mod._write_file

    def corrupting(path, *a, **kw):
        hlen = real(path, *a, **kw)
        with open(path, "r+b") as f:  # flip one bit of the last tensor byte
            f.seek(-1, os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([b[0] ^ 1]))
        return hlen

    monkeypatch.setattr(convert_mod, "_write_file", corrupting)
    out = tmp_path / "out.safetensors"
    with pytest.raises(TensorscopeError, match=r"verification failed for .*out\.safetensors\.tmp-"):
        convert(FIXTURES / "torch" / "tied.bin", out, verify=True)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------

def test_cli_json_report_and_exit_codes(tmp_path, capsys):
    out = tmp_path / "v.safetensors"
    assert main(["convert", str(FIXTURES / "torch" / "views.pt"), str(out), "--json", "--verify"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "converted" and doc["verified"] is True
    assert doc["tensors_written"] == 9 and doc["outputs"][0]["path"] == str(out)
    assert doc["expanded"] == ["expanded"] and doc["scan"]["schema"] == "tensorscope.scan/1"
    assert doc["source_sha256"] == hashlib.sha256((FIXTURES / "torch" / "views.pt").read_bytes()).hexdigest()
    # unsupported dtypes: exit 2, JSON report names them
    assert main(["convert", str(FIXTURES / "torch" / "dtypes.pt"), str(tmp_path / "d.safetensors"),
                 "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "refused"
    assert [r["name"] for r in doc["refused"]] == ["complex128", "complex32"]
    # exists without --force: one line on stderr, exit 2
    assert main(["convert", str(FIXTURES / "torch" / "views.pt"), str(out)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.pt"), str(tmp_path / "m.safetensors")]) == 2
    assert main(["convert", str(FIXTURES / "torch" / "views.pt"), str(tmp_path / "z.safetensors"),
                 "--max-shard-size", "5XB"]) == 2


def test_cli_human_summary(tmp_path, capsys):
    out = tmp_path / "t.safetensors"
    assert main(["convert", str(FIXTURES / "torch" / "tied.bin"), str(out)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "scan: no findings"
    assert f"wrote {out}: 2 tensors" in text
    assert "shared storage tied/data/0: each written as its own copy: embed.weight, lm_head.weight" in text


def test_cli_help_has_example():
    from tensorscope.commands import convert as cmd
    assert cmd.HELP and "Example:" in cmd.DESCRIPTION


def test_cli_refuse_on_lowers_the_threshold(tmp_path, capsys):
    """module.pt pickles a user class (a medium finding): converted by default, refused with
    --refuse-on medium (exit 1, nothing written), converted again with --allow-unsafe-source."""
    src, out = str(FIXTURES / "torch" / "module.pt"), tmp_path / "m.safetensors"
    assert main(["convert", src, str(out), "--refuse-on", "medium"]) == 1
    assert "pickle.user-class" in capsys.readouterr().err and not out.exists()
    assert main(["convert", src, str(out), "--refuse-on", "medium", "--allow-unsafe-source"]) == 0
    assert main(["convert", src, str(tmp_path / "n.safetensors")]) == 0
    assert out.read_bytes() == (tmp_path / "n.safetensors").read_bytes()


def test_thousands_of_small_tensors_equal_save_file(tmp_path, monkeypatch):
    """A MoE-shaped state dict (2,400 small tensors of mixed dtypes and one large one): gathered
    writes flushed every few KiB, byte-identical to safetensors' own writer."""
    monkeypatch.setattr(convert_writer._Sink, "GATHER_STEP", 4096)
    torch.manual_seed(0)
    sd = {}
    for layer in range(4):
        for e in range(200):
            for p, dt in (("gate", torch.bfloat16), ("up", torch.float16), ("down", torch.float32)):
                sd[f"model.layers.{layer}.mlp.experts.{e}.{p}_proj.weight"] = torch.randn(3, 4).to(dt)
    sd["lm_head.weight"] = torch.randn(300, 300)  # above GATHER_BELOW: the kernel-copy path
    src, ours, theirs = (tmp_path / n for n in ("moe.pt", "ours.safetensors", "theirs.safetensors"))
    torch.save(sd, src)
    convert(src, ours, record_source=False, metadata={"format": "pt"})
    save_file(sd, str(theirs), metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()


def test_arguments_are_checked_before_the_input_is_read(tmp_path, monkeypatch, capsys):
    """An existing OUT without --force, an output that is not .safetensors, a missing output
    folder: one line, exit 2, and neither the scan nor the parser ever ran."""
    import tensorscope.formats
    import tensorscope.scanning

    def never(*a, **kw):
        raise AssertionError("the input was read before the arguments were checked")

    for name in ("scan_paths", "scan_opened", "scan_file"):
        monkeypatch.setattr(tensorscope.scanning, name, never, raising=False)
    monkeypatch.setattr(tensorscope.formats, "open_model", never)
    src = str(FIXTURES / "torch" / "tied.bin")
    existing = tmp_path / "out.safetensors"
    existing.write_bytes(b"previous")
    (tmp_path / "afile").write_bytes(b"")
    cases = [([str(existing)], "exists; pass --force"),
             ([str(tmp_path / "out.bin")], "must be a .safetensors file or a folder (end it with /"),
             ([str(tmp_path / "afile" / "out.safetensors")], "cannot be made: "),
             ([str(tmp_path / "x.safetensors"), "--max-shard-size", "5XB"], "--max-shard-size")]
    for extra, message in cases:
        assert main(["convert", src, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    for extra, message in cases[:3]:
        with pytest.raises(TensorscopeError, match=re.escape(message)):
            convert(src, extra[0])
    assert existing.read_bytes() == b"previous"


def test_human_report_escapes_names_from_the_file(tmp_path, capsys):
    from tensorscope.safetext import is_clean
    evil = "x\x1b]0;t\x07\x1b[2Jy\u202ez"
    src = tmp_path / "evil.pt"
    w = torch.ones(3)
    torch.save({evil: w, evil + ".tied": w, "[bold]c[/bold]": torch.zeros(2, dtype=torch.complex128)},
               src)
    assert main(["convert", str(src), str(tmp_path / "o.safetensors"), "--skip-unsupported"]) == 0
    out = capsys.readouterr().out
    assert is_clean(out)
    assert "x\\x1b]0;t\\x07\\x1b[2Jy\\u202ez" in out and "[bold]c[/bold] (dtype complex128" in out
    assert set(load_file(str(tmp_path / "o.safetensors"))) == {evil, evil + ".tied"}


def test_per_tensor_bounds_check_agrees_with_the_reader(tmp_path):
    """convert's cheap per-tensor check refuses exactly what `ModelFile.read` refuses: bytes past
    the end of the file, bytes past the tensor's storage record."""
    from tensorscope.errors import FormatError
    f = tmp_path / "blob.bin"
    f.write_bytes(bytes(64))
    model = ModelFile("test", str(f))
    cases = [TensorInfo("past_end", "float32", (8,), byte_offset=40, file=str(f)),
             TensorInfo("past_record", "float32", (4,), byte_offset=0, file=str(f), storage_nbytes=8),
             TensorInfo("inside", "float32", (4,), byte_offset=8, file=str(f), storage_nbytes=16),
             TensorInfo("bf16", "bfloat16", (2, 3), byte_offset=52, file=str(f))]
    refused = []
    for info in cases:
        try:
            model.read(info)
        except FormatError as e:
            refused.append(info.name)
            with pytest.raises(FormatError) as got:
                convert_writer._plain_range(model, info)
            assert str(got.value) == str(e)
        else:
            assert convert_writer._plain_range(model, info) == (str(f), info.byte_offset)
    assert refused == ["past_end", "past_record"]
    model.close()


def _reference_header(ordered, metadata) -> bytes:
    """The header as one json.dumps of the whole object (the writer before it was built from
    columns): what `_header` must reproduce byte for byte."""
    doc, begin = {"__metadata__": metadata} if metadata else {}, 0
    for t in ordered:
        doc[t.name] = {"dtype": t.st_dtype, "shape": list(t.st_shape),
                       "data_offsets": [begin, begin + t.nbytes]}
        begin += t.nbytes
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text


@pytest.mark.parametrize("src", [p for p in _torch_fixtures() if p.is_file()], ids=lambda p: p.name)
def test_header_is_the_whole_object_json(src):
    """The column-built header equals json.dumps of the whole header object, on every torch fixture."""
    with tensorscope.open(src) as m:
        p = plan(m, include_all=True, skip_unsupported=True)
    ordered = convert_writer._data_order(p.tensors)
    meta = {"format": "pt", "source_format": "x\"y\\z\n", "converted_by": "tensorscope \u2028é"}
    assert convert_writer._header(ordered, meta) == _reference_header(ordered, meta)
    assert convert_writer._header(ordered, {}) == _reference_header(ordered, {})


def test_names_that_json_escapes_equal_save_file(tmp_path):
    """Names with quotes, backslashes, control characters and non-ASCII text (the escaped path of
    the header writer, next to plain ones): byte-identical to safetensors' own writer."""
    names = ["plain.weight", 'quo"te', "back\\slash", "new\nline", "ctl\x01\x1f", "tab\t",
             "é.ünï", "sep\u2028x", "z"]
    sd = {n: torch.full((2, i + 1), float(i)) for i, n in enumerate(names)}
    src, ours, theirs = (tmp_path / n for n in ("odd.pt", "ours.safetensors", "theirs.safetensors"))
    torch.save(sd, src)
    convert(src, ours, record_source=False, metadata={"format": "pt"})
    save_file(sd, str(theirs), metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()
    with tensorscope.open(src) as m:
        ordered = convert_writer._data_order(plan(m).tensors)
    assert convert_writer._header(ordered, None) == _reference_header(ordered, None)
