"""A cut download says so: "truncated: ... needs N bytes, the file ends at M", exit 2.

Real files made by the libraries, cut at several fractions; the libraries themselves refuse every
cut (the oracle that the file is broken), and our message names the cut.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from tensorscope import cli

FRACTIONS = [0.02, 0.3, 0.6, 0.9, 0.99, 0.999]


def _state():
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(64, 32, generator=g), "a.bias": torch.randn(64, generator=g),
            "b.weight": torch.randn(16, 64, generator=g)}


def _make_torch(path):
    torch.save(_state(), path)


def _make_legacy(path):
    torch.save(_state(), path, _use_new_zipfile_serialization=False)


def _make_pickle(path):   # pickle.dump of NumPy arrays (scikit-learn-style .pkl), protocol 4
    import pickle
    with open(path, "wb") as f:
        pickle.dump({k: v.numpy() for k, v in _state().items()}, f, protocol=4)


def _make_safetensors(path):
    import safetensors.torch
    safetensors.torch.save_file(_state(), str(path))


def _make_onnx(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(v.numpy(), k) for k, v in _state().items()]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "a.weight"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], inits)
    onnx.save(helper.make_model(graph), str(path))


def _make_gguf(path):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    # a tokenizer-sized key/value section, so that early cuts land in it, as in real GGUF files
    w.add_array("tokenizer.ggml.tokens", [f"token{i}" for i in range(1500)])
    w.add_array("tokenizer.ggml.scores", [float(i) for i in range(1500)])
    for k, v in _state().items():
        w.add_tensor(k, v.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _make_npy(path):
    np.save(path, np.random.default_rng(0).random((50, 40), dtype=np.float32))


def _make_npz(path):
    np.savez(path, x=np.random.default_rng(0).random((50, 40)), y=np.arange(100))


def _load_torch(p):
    torch.load(p)


def _load_pickle(p):
    import pickle
    with open(p, "rb") as f:
        pickle.load(f)


def _load_safetensors(p):
    from safetensors.numpy import load_file
    load_file(str(p))


def _load_onnx(p):
    import onnx
    onnx.load(str(p))


def _load_gguf(p):
    import gguf
    r = gguf.GGUFReader(str(p))
    for t in r.tensors:   # the reader maps lazily: touch every tensor's data
        np.asarray(t.data).sum()


def _load_npy(p):
    np.load(p)


def _load_npz(p):
    with np.load(p) as z:
        for k in z.files:
            z[k]


CASES = {"pt": (_make_torch, _load_torch), "legacy.pt": (_make_legacy, _load_torch),
         "pkl": (_make_pickle, _load_pickle),
         "safetensors": (_make_safetensors, _load_safetensors),
         "onnx": (_make_onnx, _load_onnx), "gguf": (_make_gguf, _load_gguf),
         "npy": (_make_npy, _load_npy), "npz": (_make_npz, _load_npz)}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    folder = tmp_path_factory.mktemp("whole")
    out = {}
    for ext, (make, load) in CASES.items():
        path = folder / f"model.{ext}"
        make(path)
        load(path)   # the whole file loads
        out[ext] = path
    return out


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("ext", list(CASES))
def test_cut_file_says_truncated(ext, fraction, originals, tmp_path, capsys):
    whole = originals[ext].read_bytes()
    cut = int(len(whole) * fraction)
    path = tmp_path / f"cut.{ext}"
    path.write_bytes(whole[:cut])
    with pytest.raises(Exception):   # the library refuses the cut file too
        CASES[ext][1](path)
    assert cli.main(["inspect", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"tensorscope inspect: error: ") and str(path) in err
    assert "truncated: " in err, err
    assert re.search(rf"the (file|data) ends at {cut}\b", err), err
    need = re.search(r"needs (\d+) bytes", err)
    if need:   # what the structure promises: past the cut, within the whole file
        assert cut < int(need.group(1)) <= len(whole), err
