"""Random state dicts, saved by the real libraries, listed and read back by tensorscope and
compared with what torch.load / safetensors report for the same file.

Hypothesis draws the names users have (flat dotted keys with layer and expert indices, digits
inside components, unicode, escape sequences), dtypes, shapes, and views sharing one storage
(offsets, transposes, slices), so every fast path (the VM's torch step, the zip reader's
regular members, trusted records, JSON row templates) meets the general case.
"""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorscope
from tensorscope.cli import main

from torch_oracle import dtype_name, our_bytes, stored_bytes

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
          torch.float8_e4m3fn, torch.float8_e5m2]

_WORDS = ["model", "layers", "mlp", "experts", "gate_proj", "weight", "bias", "layer1", "layer2",
          "conv1", "conv2", "w0", "w1", "attn", "q", "é", "\x1b[31m", "[bold]x[/bold]", "a\u202eb", "\t", "0", "17", "007"]

names = st.lists(st.one_of(st.sampled_from(_WORDS), st.integers(0, 300).map(str),
                           st.text(min_size=1, max_size=4)),
                 min_size=1, max_size=6).map(".".join)


@st.composite
def state_dicts(draw):
    keys = draw(st.lists(names, min_size=1, max_size=12, unique=True))
    sd = {}
    bases = []
    for key in keys:
        dtype = draw(st.sampled_from(DTYPES))
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        numel = int(np.prod(shape)) if shape else 1
        base = torch.arange(numel + 6, dtype=torch.float64).mul_(0.37).sub_(2)
        t = base.to(dtype) if dtype is not torch.bool else base > 0
        kind = draw(st.sampled_from(["plain", "offset", "transpose", "shared"]))
        if kind == "offset":
            t = t[6:].reshape(shape)            # a storage offset
        else:
            t = t[:numel].reshape(shape).clone()
        if kind == "transpose" and t.dim() >= 2:
            t = t.transpose(0, 1)               # a non-contiguous stride
        if kind == "shared" and bases:
            b = draw(st.sampled_from(bases))
            t = b.reshape(-1)[1:] if b.numel() > 1 else b   # a view into another tensor
        bases.append(t)
        sd[key] = t
    return sd


def _rows(path) -> list[dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["inspect", "--json", str(path)]) == 0
    return json.loads(out.getvalue())["tensors"]


def _check_against_torch(path, sd):
    loaded = torch.load(path, weights_only=True)
    assert list(loaded) == list(sd)
    with tensorscope.open(path) as model:
        by_name = {t.name: t for t in model.tensors}
        assert [t.name for t in model.tensors] == list(loaded)
        for name, t in loaded.items():
            info = by_name[name]
            assert info.dtype == dtype_name(t), name
            assert info.shape == tuple(t.shape), name
            assert info.stride == tuple(t.stride()), name
            assert info.storage_offset == t.storage_offset(), name
            assert our_bytes(model.read(info)) == stored_bytes(t), name
        full = [t.to_dict() for t in model.tensors]
    assert _rows(path) == full      # the listing-only path and its JSON rows: the same records
    with tensorscope.open(path, listing=True) as light:
        assert [t.to_dict() for t in light.tensors] == full


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sd=state_dicts())
def test_torch_zip_matches_torch_load(tmp_path_factory, sd):
    path = tmp_path_factory.mktemp("zip") / "model.pt"
    torch.save(sd, path)
    _check_against_torch(path, sd)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sd=state_dicts())
def test_legacy_torch_matches_torch_load(tmp_path_factory, sd):
    # torch's own legacy loader cannot read float8 storages back (UntypedStorage has no dtype)
    sd = {k: v for k, v in sd.items() if v.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2)}
    path = tmp_path_factory.mktemp("legacy") / "model.pkl"
    torch.save(sd, path, _use_new_zipfile_serialization=False)
    _check_against_torch(path, sd)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sd=state_dicts())
def test_safetensors_matches_safe_open(tmp_path_factory, sd):
    from safetensors import safe_open
    from safetensors.torch import save_file
    sd = {k: v.contiguous().clone() for k, v in sd.items()}   # no shared or strided storage
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    save_file(sd, path)
    with safe_open(path, "pt") as f, tensorscope.open(path) as model:
        names = sorted(f.keys())
        assert sorted(t.name for t in model.tensors) == names
        for info in model.tensors:
            t = f.get_tensor(info.name)
            assert (info.dtype, info.shape) == (dtype_name(t), tuple(t.shape))
            assert our_bytes(model.read(info)) == stored_bytes(t)
        full = [t.to_dict() for t in model.tensors]
    assert _rows(path) == full


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sd=state_dicts())
def test_convert_writes_what_torch_load_reads(tmp_path_factory, sd):
    """`tensorscope convert` of a torch.save file (views, offsets, shared storages, every dtype
    safetensors has): safe_open reads back each tensor's values in C order, as torch.load gives
    them, under the same names."""
    from safetensors import safe_open
    folder = tmp_path_factory.mktemp("convert")
    src, dst = folder / "model.pt", folder / "model.safetensors"
    torch.save(sd, src)
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["convert", str(src), str(dst)])
    loaded = torch.load(src, weights_only=True)
    if code != 0:   # a dtype safetensors cannot hold (complex): refused, nothing written
        assert any(t.is_complex() for t in loaded.values()) and not dst.exists()
        return
    with safe_open(dst, "pt") as f:
        assert sorted(f.keys()) == sorted(loaded)
        for name, t in loaded.items():
            got = f.get_tensor(name)
            assert (got.dtype, tuple(got.shape)) == (t.dtype, tuple(t.shape)), name
            assert stored_bytes(got) == stored_bytes(t), name
