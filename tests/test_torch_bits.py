"""torch's bit-container dtypes (bits8 ... bits16) and dtypes a newer torch may write.

Known ones are listed and read like torch.load reads them; a dtype this tool does not know (a
storage class or ``torch.<dtype>`` global of a future torch) lists the tensor with its raw bytes
and an anomaly instead of failing the whole file.
"""
from __future__ import annotations

import io
import zipfile

import pytest
import torch

import tensorscope
from tensorscope import cli, dtypes

BITS = ["bits8", "bits16", "bits1x8", "bits2x4", "bits4x2"]


def _bits_tensors() -> dict[str, torch.Tensor]:
    raw = torch.arange(12, dtype=torch.uint8) * 17
    # A storage each: TorchScript types a shared storage by its first tensor (bits16 would load
    # as bits8, in torch as here).
    return {n: raw.clone().view(getattr(torch, n)).reshape(2, -1) for n in BITS}


def _stored(t: torch.Tensor) -> bytes:
    """The tensor's bytes (contiguous, at the start of its storage)."""
    assert t.is_contiguous() and t.storage_offset() == 0
    return bytes(t.untyped_storage().tolist())[: t.numel() * t.element_size()]


class Bits(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name, t in _bits_tensors().items():
            self.register_buffer(name, t)

    def forward(self, x):
        return x


def _save(kind: str, path):
    if kind == "zip":
        torch.save(_bits_tensors(), path)
    else:
        torch.jit.save(torch.jit.script(Bits()), path)


@pytest.mark.parametrize("kind", ["zip", "torchscript"])
def test_bits_dtypes_match_torch_load(kind, tmp_path):
    path = tmp_path / f"bits_{kind}.pt"
    _save(kind, path)
    expected = torch.load(path) if kind == "zip" else dict(torch.jit.load(path).named_buffers())
    with tensorscope.open(path) as model:
        assert set(model.names) == set(expected)
        for name, t in expected.items():
            info = model.tensor(name)
            assert info.dtype == str(t.dtype).removeprefix("torch."), name
            assert info.shape == tuple(t.shape) and info.stride == t.stride(), name
            assert model.read(name).tobytes() == _stored(t), name
            assert dtypes.spec(info.dtype).itemsize == t.element_size(), name
        assert not model.evidence.anomalies


def _patched(path, out, old: bytes, new: bytes):
    """A copy of a torch zip whose pickles name ``new`` where torch wrote ``old`` (GLOBAL lines)."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        hits = 0
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith(".pkl"):
                hits += data.count(old)
                data = data.replace(old, new)
            dst.writestr(item, data)
    assert hits, f"{old!r} not in the pickles"


@pytest.mark.parametrize("kind,old,new,dtype", [
    # a future torch.save: a dtype global _rebuild_tensor_v3 names over an untyped storage
    ("zip", b"torch\nbits16\n", b"torch\nfloat3_e1m1\n", "unknown:torch.float3_e1m1"),
    # a future TorchScript: a typed storage class of its own
    ("torchscript", b"torch\nBits16Storage\n", b"torch\nFloat3Storage\n", "unknown:Float3Storage"),
])
def test_unknown_dtype_lists_the_tensor_with_raw_bytes(kind, old, new, dtype, tmp_path, capsys):
    path, cut = tmp_path / "orig.pt", tmp_path / "future.pt"
    _save(kind, path)
    _patched(path, cut, old, new)
    with pytest.raises(Exception):  # the oracle of today cannot load it ...
        torch.load(cut) if kind == "zip" else torch.jit.load(cut)
    t = (torch.load(path) if kind == "zip" else dict(torch.jit.load(path).named_buffers()))["bits16"]
    with tensorscope.open(cut) as model:  # ... we list it, from the bytes it wrote
        assert len(model.tensors) == len(BITS)
        info = model.tensor("bits16")
        assert info.dtype == dtype and info.shape == tuple(t.shape)
        assert dtypes.spec(info.dtype).itemsize == t.element_size()  # storage bytes / elements
        assert info.nbytes == t.numel() * t.element_size()
        assert model.read(info).tobytes() == _stored(t)
        kinds = [a.kind for a in model.evidence.anomalies]
        assert kinds == ["torch.unknown_dtype"]
        assert dtype.partition(":")[2] in model.evidence.anomalies[0].message
        for name in BITS[:1] + BITS[2:]:   # the others are untouched
            assert model.tensor(name).dtype == name
    assert cli.main(["inspect", str(cut)]) == 0
    out = capsys.readouterr().out
    assert dtype in out and "torch.unknown_dtype" in out


def test_unknown_dtype_name_from_the_file_is_reduced_to_a_safe_label():
    name = dtypes.register_unknown("Evil\x1b[2JStorage")
    assert name == "unknown:Evil__2JStorage" and dtypes.spec(name).kind == "unknown"


def test_torch_writes_no_sub_byte_ints():
    """torch 2.13 refuses to save int1..int7 / uint1..uint7: nothing to add for them (if a newer
    torch saves them, this fails and they get a table entry)."""
    for n in [f"{p}int{i}" for p in ("", "u") for i in range(1, 8)]:
        dt = getattr(torch, n, None)
        if dt is None:
            continue
        with pytest.raises(Exception):
            torch.save(torch.empty(4, dtype=dt), io.BytesIO())
