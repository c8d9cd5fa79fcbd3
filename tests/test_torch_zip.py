"""torch.save zip archives: our listing and zero-copy values against torch.load, live."""
from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorscope
from tensorscope import cli
from torch_oracle import FIXTURES, dtype_name, flatten, our_bytes, stored_bytes

TORCH_DIR = FIXTURES / "torch"
FILES = sorted(p.name for p in TORCH_DIR.iterdir())


def _oracle(path: Path):
    return flatten(torch.load(path, weights_only=False, map_location="cpu"))


@pytest.mark.parametrize("name", FILES)
def test_matches_torch_load(name):
    path = TORCH_DIR / name
    expected = _oracle(path)
    with tensorscope.open(path) as model:
        assert model.format == "torch-zip"
        ours = {t.name: t for t in model.tensors}
        assert set(ours) == set(expected), (set(ours) ^ set(expected))
        for tname, t in expected.items():
            info = ours[tname]
            assert info.dtype == dtype_name(t), tname
            assert info.shape == tuple(t.shape), tname
            if t.device.type == "meta":
                assert info.byte_offset is None
                continue
            if not t.is_sparse and t.layout == torch.strided:
                assert info.stride == t.stride(), tname
                assert info.storage_offset == t.storage_offset(), tname
            if t.dtype in (torch.quint4x2,):
                continue
            assert our_bytes(model.read(tname)) == stored_bytes(t), tname


@pytest.mark.parametrize("name", FILES)
def test_records_equal_validated_ones(name):
    """Records made without re-validation (`TensorInfo.trusted`) equal the same fields passed
    through TensorInfo's checks, nbytes recomputed, and give torch's nbytes."""
    from dataclasses import fields
    from tensorscope.model import TensorInfo
    expected = _oracle(TORCH_DIR / name)
    with tensorscope.open(TORCH_DIR / name) as model:
        for info in model.tensors:
            kw = {f.name: getattr(info, f.name) for f in fields(TensorInfo)}
            again = TensorInfo(**{**kw, "nbytes": -1})
            assert again == info and again.extras == info.extras, info.name
            assert type(info.shape) is tuple and type(info.stride) is tuple, info.name
            t = expected.get(info.name)
            if t is not None and t.layout == torch.strided and t.dtype.itemsize and \
                    info.dtype == dtype_name(t):
                assert info.nbytes == t.numel() * t.dtype.itemsize, info.name


@pytest.mark.parametrize("name", ["views.pt", "tied.bin", "align4096.pt"])
def test_byte_offsets_point_at_the_storage_record(name):
    """byte_offset = data offset of archive/data/<key> (as zipfile sees it) + storage_offset*itemsize."""
    path = TORCH_DIR / name
    with zipfile.ZipFile(path) as zf, tensorscope.open(path) as model:
        raw = path.read_bytes()
        for info in model.tensors:
            if info.numel == 0:
                continue
            member = zf.getinfo(info.extras["member"])
            payload = zf.read(member)
            start = raw.index(payload[: max(8, min(len(payload), 64))])
            itemsize = np.dtype(model.read(info).dtype).itemsize
            assert info.byte_offset == start + info.storage_offset * itemsize
            if name == "align4096.pt":
                assert (info.byte_offset - info.storage_offset * itemsize) % 4096 == 0


def test_views_are_zero_copy_and_read_only():
    with tensorscope.open(TORCH_DIR / "views.pt") as model:
        arr = model.read("transposed")
        assert not arr.flags.writeable
        assert not arr.flags.owndata
        base = model.read("matrix")
        assert np.shares_memory(arr, base)  # one storage, two views
        assert model.tensor("slice").storage_nbytes == 4000  # the whole storage is stored


def test_names_and_roles():
    with tensorscope.open(TORCH_DIR / "module.pt") as model:
        roles = {t.name: t.role for t in model.tensors}
        assert roles["features.0.weight"] == "parameter"
        assert roles["steps"] == "buffer"
        assert roles["scratch"] == "buffer(non-persistent)"
        assert model.tensor("features.0.weight").extras["raw_path"] == \
            "_modules.features._modules.0._parameters.weight"
    with tensorscope.open(TORCH_DIR / "nested.pth") as model:
        assert "optimizer.state.0.exp_avg" in model
        assert "ordered.a.b" in model
        assert model.tensor("ordered.a.b").path == ("ordered", "a.b")
    with tensorscope.open(TORCH_DIR / "root_tensor.pt") as model:
        assert model.names == ["<root>"]


def test_quantized_parameters():
    with tensorscope.open(TORCH_DIR / "quantized.pt") as model:
        q = model.tensor("per_tensor").extras
        assert q["qscheme"] == "per_tensor_affine" and q["scale"] == 0.1 and q["zero_point"] == 3
        pc = model.tensor("per_channel").extras
        assert pc["qscheme"] == "per_channel_affine" and pc["axis"] == 0
        assert pc["scales"]["dtype"] == "float64"


def test_archive_metadata():
    with tensorscope.open(TORCH_DIR / "my.model.v2.pth") as model:
        assert model.metadata["archive_prefix"] == "my.model.v2"
        assert model.metadata["byteorder"] == "little"
        assert model.metadata["version"] == "3"
        assert "serialization_id" in model.metadata
    with tensorscope.open(TORCH_DIR / "buffer_saved.ckpt") as model:
        assert model.metadata["archive_prefix"] == "archive"


def test_ordinary_archives_have_no_anomalies():
    for name in FILES:
        with tensorscope.open(TORCH_DIR / name) as model:
            assert model.evidence.anomalies == [], name


def test_inspect_json(capsys):
    assert cli.main(["inspect", str(TORCH_DIR / "tied.bin"), "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "tensorscope.inspect/1"
    assert [t["name"] for t in doc["tensors"]] == ["embed.weight", "lm_head.weight"]
    assert doc["summary"]["format"] == "torch-zip"


def test_inspect_group_and_filter(capsys):
    assert cli.main(["inspect", str(TORCH_DIR / "nested.pth"), "--json", "--group",
                     "--filter", "optimizer.state.*"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    names = [t["name"] for t in doc["tensors"]]
    assert names and all(n.startswith("optimizer.state.") for n in names)
    exp_avg = [g for g in doc["groups"] if g["pattern"] == "optimizer.state.#.exp_avg"]
    assert exp_avg and sum(g["count"] for g in exp_avg) == 4


def test_inspect_stats_match_numpy(capsys):
    assert cli.main(["inspect", str(TORCH_DIR / "views.pt"), "--json", "--stats"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    t = torch.load(TORCH_DIR / "views.pt")
    by_name = {row["name"]: row for row in doc["tensors"]}
    m = t["transposed"].double()
    s = by_name["transposed"]["stats"]
    assert s["max"] == pytest.approx(m.max().item())
    assert s["min"] == pytest.approx(m.min().item())
    assert s["mean"] == pytest.approx(m.mean().item())
    assert s["std"] == pytest.approx(m.std(unbiased=False).item())


def test_human_output_lists_tensors(capsys):
    assert cli.main(["inspect", str(TORCH_DIR / "tied.bin")]) == 0
    out = capsys.readouterr().out
    assert "embed.weight" in out and "torch-zip" in out


BAD_INPUTS = {
    "empty.pt": (b"", "empty file"),
    "garbage.pt": (b"this is not a model" * 10, "not a model file"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, name):
    content, needle = BAD_INPUTS[name]
    path = tmp_path / name
    path.write_bytes(content)
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and name in err


def test_truncated_zip(tmp_path, capsys):
    data = (TORCH_DIR / "views.pt").read_bytes()
    path = tmp_path / "truncated.pt"
    path.write_bytes(data[: len(data) // 2])
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "truncated.pt" in err


def test_truncated_pickle(tmp_path, capsys):
    """data.pkl cut short inside a valid zip: the error names the member and the offset."""
    src = TORCH_DIR / "tied.bin"
    path = tmp_path / "short_pickle.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("data.pkl"):
                data = data[:40]
            zout.writestr(info.filename, data)
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "tied/data.pkl" in err and "at byte" in err


def test_zip_without_data_pkl(tmp_path, capsys):
    path = tmp_path / "nodata.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/version", "3\n")
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.pkl" in err and "nodata.pt" in err


def test_missing_storage_record_still_lists(tmp_path):
    src = TORCH_DIR / "tied.bin"
    path = tmp_path / "missing_storage.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            if "/data/" in info.filename:
                continue
            zout.writestr(info.filename, zin.read(info))
    with tensorscope.open(path) as model:
        assert model.names == ["embed.weight", "lm_head.weight"]
        assert any(a.kind == "torch.storage_unreadable" for a in model.evidence.anomalies)
        with pytest.raises(tensorscope.TensorscopeError, match="no stored bytes"):
            model.read("embed.weight")


def test_python_m_entry_point():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "tensorscope", "inspect", "--json",
                        str(TORCH_DIR / "tied.bin")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert '"embed.weight"' in r.stdout
