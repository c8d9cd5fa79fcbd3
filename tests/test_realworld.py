"""Real-world checkpoints: files written by transformers, Lightning, PEFT, scikit-learn/joblib and
everyday train.py code (fixtures/gen_realworld.py), read by tensorscope and checked against the
real libraries.

What the generating libraries reported (names, shapes, dtypes, sha256 of the bytes;
transformers' own ``state_dict()`` of each folder; torch's ``weights_only`` verdict) is in
``fixtures/realworld/manifest.json``, so these tests need neither transformers, lightning nor
scikit-learn. torch and safetensors stay live oracles for the files they can read.
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import pickle
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

import tensorscope
from tensorscope import cli
from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.parsers import joblib_fmt, pickle_vm
from tensorscope.scanning import Severity, scan_paths

from torch_oracle import flatten, stored_bytes

ROOT = Path(__file__).resolve().parent.parent / "fixtures" / "realworld"
MANIFEST = json.loads((ROOT / "manifest.json").read_text())
FILES = sorted(k for k, v in MANIFEST.items() if not k.startswith("_") and v["kind"] != "hf-folder")
FOLDERS = sorted(k for k, v in MANIFEST.items() if v.get("kind") == "hf-folder")
HF_ARCHS = ("gpt2", "bert", "llama")

# The worst finding above INFO that scanning each fixture MAY give (None: nothing above INFO),
# and why that is the right verdict. Checked both ways: a higher or a lower result fails.
SEVERITY = {
    # transformers' own saves: OrderedDict + torch rebuild functions only (weights_only loads them)
    "hf/*": (None, "state dicts of tensors: exactly what torch.load(weights_only=True) accepts"),
    "peft/*": (None, "a LoRA adapter is a plain state dict"),
    # Lightning 2.6 checkpoints hold hyper_parameters, optimizer/scheduler states, callback and
    # loop states as plain dicts, lists, numbers and strings; torch's weights_only loads it too.
    "lightning/tiny.ckpt": (None, "only containers, numbers, strings and tensors"),
    "torch/compiled_state_dict.pt": (None, "a state dict whose keys carry _orig_mod."),
    "torch/ddp_state_dict.pt": (None, "a state dict whose keys carry module."),
    # weights_only REJECTS it (numpy._core.multiarray._reconstruct, numpy.ndarray, numpy.dtype,
    # numpy scalar: the numpy RNG state and a np.float64 metric), but those globals only rebuild
    # NumPy arrays and scalars from bytes: no code of the file's choosing runs. Reporting them
    # would flag every training checkpoint; they are allowed (policy.NUMPY_GLOBALS).
    "torch/train_ckpt.pt": (None, "numpy RNG state and scalars are NumPy's data reconstruction"),
    # the same with argparse.Namespace (saved train.py arguments): a bag of attributes set by
    # BUILD, allowed like the builtin containers (weights_only rejects it too).
    "torch/train_ckpt_args.pt": (None, "argparse.Namespace is plain data"),
    # joblib.dump of arrays only: joblib's NumpyArrayWrapper placeholder is INFO (joblib.load
    # reads the raw array bytes after it); numpy dtype/ndarray are allowed.
    "sklearn/arrays*.joblib": (None, "joblib's array placeholder and NumPy dtypes only"),
    "sklearn/arrays_zf.pkl": (None, "a ZF-wrapped pickle of a NumPy array"),
    # estimators: loading imports sklearn classes and runs their __setstate__ (and
    # sklearn.tree._tree.Tree's constructor): library code, but chosen by the file: MEDIUM.
    "sklearn/logreg*": (Severity.MEDIUM, "loading imports sklearn classes"),
    "sklearn/pipeline.joblib": (Severity.MEDIUM, "loading imports sklearn classes"),
}


def _severity_rule(rel: str):
    return next(v for k, v in SEVERITY.items() if fnmatch.fnmatchcase(rel, k))


def _sha(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


# -- listing and values against the manifest (what the real libraries reported) ------------------
@pytest.mark.parametrize("rel", FILES)
def test_lists_exactly_what_the_library_saved(rel):
    expected = MANIFEST[rel]["tensors"]
    with tensorscope.open(ROOT / rel) as model:
        got = {t.name: t for t in model.tensors}
        assert sorted(got) == sorted(expected)
        for name, meta in expected.items():
            t = got[name]
            assert (list(t.shape), t.dtype) == (meta["shape"], meta["dtype"]), name
            assert _sha(model.read(t)) == meta["sha256"], name


@pytest.mark.parametrize("rel", [f for f in FILES if MANIFEST[f]["kind"] == "torch"])
def test_torch_files_match_torch_load(rel):
    ref = flatten(torch.load(ROOT / rel, map_location="cpu", weights_only=False))
    with tensorscope.open(ROOT / rel) as model:
        assert [t.name for t in model.tensors if t.name in ref] == [t.name for t in model.tensors]
        assert sorted(t.name for t in model.tensors) == sorted(ref)
        for t in model.tensors:
            assert np.ascontiguousarray(model.read(t)).tobytes() == stored_bytes(ref[t.name]), t.name


@pytest.mark.parametrize("rel", [f for f in FILES if MANIFEST[f]["kind"] == "safetensors"])
def test_safetensors_files_match_safe_open(rel):
    with safe_open(ROOT / rel, "pt") as f, tensorscope.open(ROOT / rel) as model:
        assert sorted(model.names) == sorted(f.keys())
        for name in f.keys():
            assert model.read(name).tobytes() == stored_bytes(f.get_tensor(name)), name


@pytest.mark.parametrize("folder", FOLDERS)
def test_hf_folder_is_transformers_state_dict_minus_tied(folder):
    entry = MANIFEST[folder]
    in_files = {n for rel, v in MANIFEST.items() if rel.startswith(folder) and rel != folder
                for n in v["tensors"]}
    with tensorscope.open(ROOT / folder) as model:
        names = set(model.names)
    assert names == in_files
    assert names | set(entry["tied"]) == set(entry["state_dict"])
    assert not names & set(entry["tied"])


def test_gpt2_bin_keeps_the_tied_name_over_one_storage():
    # transformers 4.x .bin keeps lm_head.weight and wte over one storage; safetensors drops it.
    assert MANIFEST["hf/gpt2/safetensors/"]["tied"] == ["lm_head.weight"]
    assert MANIFEST["hf/gpt2/bin/"]["tied"] == []
    with tensorscope.open(ROOT / "hf/gpt2/bin/pytorch_model.bin") as m:
        a, b = m.tensor("lm_head.weight"), m.tensor("transformer.wte.weight")
        assert (a.byte_offset, a.storage_key) == (b.byte_offset, b.storage_key)


# -- joblib specifics -------------------------------------------------------------------------------
@pytest.mark.parametrize("rel", ["sklearn/arrays.joblib", "sklearn/arrays_p2.joblib",
                                 "sklearn/logreg.joblib", "sklearn/pipeline.joblib"])
def test_joblib_arrays_are_zero_copy_views_at_their_file_offsets(rel):
    raw = (ROOT / rel).read_bytes()
    with tensorscope.open(ROOT / rel) as model:
        assert model.format == "joblib" and model.metadata["joblib_arrays"] >= len(model.tensors)
        for t in model.tensors:
            assert t.byte_offset is not None and t.name not in model.custom_readers
            value = model.read(t)
            order = "F" if t.extras["order"] == "F" else "C"
            assert value.tobytes(order) == raw[t.byte_offset:t.byte_offset + t.nbytes], t.name
            assert not value.flags.writeable


def test_joblib_alignment_and_fortran_order():
    with tensorscope.open(ROOT / "sklearn/arrays.joblib") as m:
        # joblib >= 1.2 pads so that every array starts at a multiple of 16 in the file
        assert all(t.byte_offset % 16 == 0 for t in m.tensors)
        f = m.tensor("f")
        assert (f.stride, f.extras["order"]) == ((1, 2), "F")
        assert m.read("f").tolist() == [[0, 1, 2], [3, 4, 5]]
        assert m.read("scalar").shape == () and m.read("scalar")[()] == 3.5
        assert "names" not in m    # a unicode array stays an object


@pytest.mark.parametrize("rel,kind", [("sklearn/logreg_z3.joblib", "zlib"),
                                      ("sklearn/logreg_gz.joblib", "gzip"),
                                      ("sklearn/logreg_xz.joblib", "xz"),
                                      ("sklearn/arrays_zf.pkl", "zf")])
def test_compressed_joblib_is_read_from_a_decompressed_copy(rel, kind):
    with tensorscope.open(ROOT / rel) as model:
        assert model.format == "joblib" and model.metadata["compression"] == kind
        assert model.tensors and all(t.byte_offset is None for t in model.tensors)
        assert all(t.name in model.custom_readers for t in model.tensors)
    # the same values as the uncompressed dump
    if rel.startswith("sklearn/logreg"):
        with tensorscope.open(ROOT / "sklearn/logreg.joblib") as plain, \
                tensorscope.open(ROOT / rel) as comp:
            for t in plain.tensors:
                assert np.array_equal(plain.read(t), comp.read(t.name))


@pytest.mark.parametrize("kind", ["gzip", "bz2", "xz"])
def test_compressed_legacy_torch_stream_lists_like_torch_load(tmp_path, kind):
    # `model.pt.gz`: a legacy torch.save stream through a compressor, which torch.load reads from
    # gzip.open(...). Read as one pickle it would list nothing after the magic number.
    import bz2, gzip, lzma
    codec = {"gzip": gzip, "bz2": bz2, "xz": lzma}[kind]
    state = {"model.layers.0.mlp.up_proj.weight": torch.randn(3, 4),
             "model.layers.1.mlp.up_proj.weight": torch.randn(3, 4).to(torch.bfloat16),
             "step": torch.tensor(7)}
    buf = io.BytesIO()
    torch.save(state, buf, _use_new_zipfile_serialization=False)
    path = tmp_path / f"model.pt.{kind}"
    path.write_bytes(codec.compress(buf.getvalue()))
    with codec.open(path, "rb") as f:
        expected = torch.load(io.BytesIO(f.read()), weights_only=True)
    with tensorscope.open(path) as model:
        assert model.format == "torch-legacy" and model.metadata["compression"] == kind
        assert [t.name for t in model.tensors] == list(expected)
        for t in model.tensors:
            want = expected[t.name]
            assert list(t.shape) == list(want.shape)
            assert model.read(t).tobytes() == want.reshape(-1).view(torch.uint8).numpy().tobytes()
    assert scan_paths(path).exit_code() == 0


@pytest.mark.parametrize("fmt", ["torch-zip", "safetensors", "npy"])
def test_a_gzipped_model_file_is_its_format_inside(tmp_path, fmt):
    import gzip
    from safetensors.torch import save_file
    state = {"model.layers.0.self_attn.q_proj.weight": torch.randn(4, 3),
             "model.embed_tokens.weight": torch.randn(5, 3).to(torch.float16)}
    plain = tmp_path / "plain"
    if fmt == "torch-zip":
        torch.save(state, plain)
    elif fmt == "safetensors":
        save_file(state, plain)
    else:
        state = {"<root>": torch.arange(6.0).reshape(2, 3)}
        with open(plain, "wb") as f:
            np.save(f, state["<root>"].numpy())
    packed = tmp_path / "model.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    with tensorscope.open(packed) as model:
        assert model.format == fmt and model.metadata["compression"] == "gzip"
        assert sorted(t.name for t in model.tensors) == sorted(state)
        for t in model.tensors:
            assert model.read(t).tobytes() == state[t.name].reshape(-1).numpy().tobytes()
    assert scan_paths(packed).exit_code() == 0


# -- scan: the severity table ---------------------------------------------------------------------
SCAN_TARGETS = sorted({"/".join(f.split("/")[:3]) + "/" if f.startswith("hf/") else f
                       for f in FILES} | set(FOLDERS))


@pytest.mark.parametrize("rel", SCAN_TARGETS)
def test_scan_severity_is_what_the_table_says(rel):
    expected, reason = _severity_rule(rel)
    report = scan_paths(ROOT / rel)
    above = [f for f in report.findings if f.severity > Severity.INFO]
    worst = max((f.severity for f in above), default=None)
    assert worst == expected, (reason, [str(f) for f in above])
    assert report.errors == 0
    if expected is Severity.MEDIUM:
        assert {f.rule for f in above} <= {"pickle.library-class", "pickle.user-class", "pickle.unknown-call"}
        assert any(f.trigger and f.trigger.startswith("sklearn.") for f in above)


@pytest.mark.parametrize("rel", ["torch/train_ckpt.pt", "torch/train_ckpt_args.pt"])
def test_train_checkpoint_is_clean_although_weights_only_rejects_it(rel):
    # the oracle's verdict, live: weights_only refuses numpy's globals; the scan judges them safe
    unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(ROOT / rel)
    assert "numpy.ndarray" in unsafe and sorted(unsafe) == MANIFEST[rel]["unsafe_globals"]
    with pytest.raises(pickle.UnpicklingError):
        torch.load(ROOT / rel, weights_only=True)
    assert scan_paths(ROOT / rel).exit_code() == 0


def test_joblib_placeholder_is_info_and_joblib_load_stays_critical():
    report = scan_paths(ROOT / "sklearn/arrays.joblib")
    assert {(f.severity, f.rule, f.trigger) for f in report.findings} == {
        (Severity.INFO, "pickle.framework-class", "joblib.numpy_pickle.NumpyArrayWrapper"),
        (Severity.INFO, "joblib.array-not-listed", None)}   # its unicode array: said, not dropped
    from tensorscope import policy
    assert policy.classify("joblib", "load").category == policy.DENIED
    assert policy.classify("joblib.numpy_pickle_compat", "NDArrayWrapper").category == policy.DENIED


# -- diff and convert against HF's own saves --------------------------------------------------------
@pytest.mark.parametrize("arch", HF_ARCHS)
@pytest.mark.parametrize("a,b", [("bin/pytorch_model.bin", "safetensors/model.safetensors"),
                                 ("safetensors/model.safetensors", "bin/pytorch_model.bin"),
                                 ("sharded_bin", "sharded_st")])
def test_diff_of_bin_and_safetensors_saves_is_identical(arch, a, b, capsys):
    base = ROOT / "hf" / arch
    assert cli.main(["diff", str(base / a), str(base / b)]) == 0
    out = capsys.readouterr().out
    assert "0 changed, 0 added, 0 removed" in out
    if arch == "gpt2":
        assert "tied:" in out    # lm_head.weight, stored once by the safetensors save


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_convert_of_bin_equals_hf_safetensors_save(arch, tmp_path, capsys):
    base = ROOT / "hf" / arch
    out = tmp_path / "converted.safetensors"
    assert cli.main(["convert", str(base / "bin/pytorch_model.bin"), str(out)]) == 0
    tied = MANIFEST[f"hf/{arch}/safetensors/"]["tied"]
    with safe_open(base / "safetensors/model.safetensors", "pt") as hf, safe_open(out, "pt") as ours:
        assert sorted(set(ours.keys()) - set(hf.keys())) == tied
        assert not set(hf.keys()) - set(ours.keys())
        for name in hf.keys():
            x, y = hf.get_tensor(name), ours.get_tensor(name)
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
        for name in tied:   # written as its own copy of the tied weight
            assert torch.equal(ours.get_tensor(name), ours.get_tensor("transformer.wte.weight"))


# -- hostile and broken joblib files: exact errors --------------------------------------------------
WRAPPER = b"cjoblib.numpy_pickle\nNumpyArrayWrapper\n)\x81"


def _wrapper(shape: bytes, typestr: bytes, align: bool) -> bytes:
    """A protocol-2 NumpyArrayWrapper + BUILD as joblib writes it (shape as pickle opcodes)."""
    state = (b"}(U\x05shape" + shape + b"U\x05orderU\x01CU\x05dtypecnumpy\ndtype\n(U" +
             bytes([len(typestr)]) + typestr + b"\x89\x88tR" +
             (b"U\x1bnumpy_array_alignment_bytesK\x10" if align else b"") + b"ub")
    return WRAPPER + state


def _vm(data: bytes):
    return pickle_vm.run(data, hooks=pickle_vm.CONTAINER_HOOKS,
                         build_hooks=joblib_fmt.build_hooks(data))


def test_vm_reads_inline_bytes_and_goes_on_after_them():
    head = b"\x80\x02]" + _wrapper(b"K\x03\x85", b"u1", True)
    data = head + b"\x02\xff\xff" + b"\x01\x02\x03" + b"a."
    r = _vm(data)
    assert r.stopped and r.error is None and r.end == len(data)
    assert len(r.value) == 1 and r.value[0].func.name == "NumpyArrayWrapper"
    plain = pickle_vm.run(data)            # pickle.load's reading breaks on the bytes
    assert plain.error.reason == "unknown opcode 0x02"


def test_object_arrays_are_nested_pickles_merged_into_the_run():
    inner = b"\x80\x02cbuiltins\nlist\n)R."
    data = b"\x80\x02" + _wrapper(b"K\x01\x85", b"O8", False) + inner + b"."
    r = _vm(data)
    assert r.error is None and r.stopped and r.end == len(data)
    assert [g.dotted for g in r.globals] == ["joblib.numpy_pickle.NumpyArrayWrapper",
                                             "numpy.dtype", "builtins.list"]


def test_nested_object_arrays_are_bounded():
    data = b"\x80\x02]."
    for _ in range(pickle_vm.MAX_NESTED_RUNS + 1):
        data = b"\x80\x02" + _wrapper(b"K\x01\x85", b"O8", False) + data + b"."
    r = _vm(data)
    assert isinstance(r.error, LimitExceeded) and "nested pickle depth" in str(r.error)


@pytest.mark.parametrize("tail,message", [
    # padding length 0, then 3 of the 8 bytes of one float64
    (b"\x00\x01\x02\x03", "pickle: <memory> at byte 126: truncated: NumpyArrayWrapper array wants "
                          "8 bytes at 128, 3 remain; the file ends at 131"),
    (b"", "pickle: <memory> at byte 126: truncated: NumpyArrayWrapper padding byte is missing: the "
          "data ends; the file ends at 127"),
])
def test_truncated_inline_array(tail, message, tmp_path):
    data = b"\x80\x02" + _wrapper(b"K\x01\x85", b"f8", True) + tail
    assert data[126:127] == b"b"        # the BUILD
    path = tmp_path / "cut.joblib"
    path.write_bytes(data)
    with pytest.raises(FormatError) as e:
        tensorscope.open(path, format="pickle")
    assert str(e.value).replace(str(path), "<memory>") == message


def test_wrapper_without_a_numpy_dtype_is_refused():
    data = b"\x80\x02" + WRAPPER + b"}(U\x05shapeK\x01\x85U\x05dtypeK\x01ub."
    r = _vm(data)
    assert r.error.reason == "NumpyArrayWrapper dtype is a int, not numpy.dtype(...): the array's " \
                             "size is unknown"


def test_build_hook_cannot_jump_outside_the_data():
    data = b"\x80\x02cm\nC\n)\x81}b."
    r = pickle_vm.run(data, build_hooks={("m", "C"): lambda obj, end, nested: (1, len(data) + 1)})
    assert r.error.reason == f"BUILD of m.C: the data after it ends at {len(data) + 1}, outside " \
                             f"{len(data) - 1}..{len(data)}"


def test_lz4_and_broken_streams_say_why(tmp_path):
    lz4 = tmp_path / "m.joblib"
    lz4.write_bytes(b"\x04\x22\x4d\x18" + bytes(60))
    with pytest.raises(FormatError, match="lz4-compressed joblib file: reading it needs the lz4 "
                                          "package, which tensorscope does not use"):
        tensorscope.open(lz4)
    cut = tmp_path / "cut.joblib"
    cut.write_bytes((ROOT / "sklearn/logreg_z3.joblib").read_bytes()[:300])
    with pytest.raises(FormatError, match=r"zlib stream ends early \(\d+ bytes decompressed\): "
                                          "the file is truncated"):
        tensorscope.open(cut)


def test_compressed_output_is_capped():
    bomb = zlib.compress(b"\x80\x02]" + b"\x00" * (1 << 20))
    with pytest.raises(LimitExceeded):
        joblib_fmt.decompress(bomb, "zlib", cap=1 << 16)


def test_pickle_load_reading_of_inline_bytes_is_scanned(tmp_path):
    # joblib.load skips the padding; pickle.load reads the padding byte 'c' as GLOBAL os.system
    pad = b"os\nsystem\n"
    data = (b"\x80\x02]" + _wrapper(b"K\x01\x85", b"u1", True) + b"c" + pad.ljust(ord("c"), b"\xff")
            + b"\x07a.")
    assert _vm(data).error is None
    path = tmp_path / "hidden.joblib"
    path.write_bytes(data)
    report = scan_paths(path)
    assert report.severity == Severity.CRITICAL
    assert any(f.rule == "pickle.dangerous-global" and f.trigger == "os.system" and
               "pickle.load instead of joblib.load" in f.message for f in report.findings)


def test_zf_wrapper_is_scanned(tmp_path):
    payload = b"cos\nsystem\n(S'echo hi'\ntR."
    path = tmp_path / "old.pkl"
    path.write_bytes(b"ZF" + hex(len(payload)).encode().ljust(19) + zlib.compress(payload))
    report = scan_paths(path)
    assert report.severity == Severity.CRITICAL
    assert any(f.trigger == "os.system" for f in report.findings)
    with tensorscope.open(path) as m:
        assert m.format == "joblib" and m.metadata["compression"] == "zf"


def test_manifest_versions_recorded():
    v = MANIFEST["_versions"]
    assert v["torch"].startswith("2.13") and v["transformers"].startswith("4.")
    assert io and pickle  # imported for the oracles above
