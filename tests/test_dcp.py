"""DCP folders: our listing against FileSystemReader's metadata and our values against the
checkpoint converted by torch (``dcp_to_torch_save``), bit for bit."""
from __future__ import annotations

import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

import tensorscope
from tensorscope import cli
from torch_oracle import FIXTURES, dtype_name, flatten, our_bytes, stored_bytes

DCP_DIR = FIXTURES / "distributed" / "dcp"
FOLDERS = sorted(p.name for p in DCP_DIR.iterdir() if p.is_dir())


def _converted(folder: Path, tmp_path: Path) -> dict:
    out = tmp_path / "converted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(folder, out)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("name", FOLDERS)
def test_values_match_torch(name, tmp_path):
    folder = DCP_DIR / name
    loaded = _converted(folder, tmp_path)
    expected = flatten(loaded)
    with tensorscope.open(folder) as model:
        assert model.format == "dcp"
        assert set(model.names) == set(expected)
        for tname, t in expected.items():
            info = model.tensor(tname)
            assert info.dtype == dtype_name(t), tname
            assert info.shape == tuple(t.shape), tname
            assert our_bytes(model.read(tname)) == stored_bytes(t), tname
        items = model.metadata.get("dcp_items", {})
        for key, item in items.items():
            value = loaded
            for part in key.split("."):
                value = value[part]
            assert item["value"] == (list(value) if isinstance(value, tuple) else value), key


@pytest.mark.parametrize("name", FOLDERS)
def test_listing_matches_metadata(name):
    folder = DCP_DIR / name
    meta = FileSystemReader(str(folder)).read_metadata()
    with tensorscope.open(folder) as model:
        ours = {t.name: t for t in model.tensors}
        for fqn, md in meta.state_dict_metadata.items():
            if isinstance(md, BytesStorageMetadata):
                place = meta.storage_data[next(k for k in meta.storage_data if k.fqn == fqn)]
                item = model.metadata["dcp_items"][fqn]
                assert (item["file"], item["offset"], item["length"]) == (
                    place.relative_path, place.offset, place.length)
                continue
            info = ours[fqn]
            assert info.shape == tuple(md.size)
            assert info.dtype == dtype_name(torch.empty(0, dtype=md.properties.dtype))
            assert info.path == meta.planner_data[fqn]
            assert info.extras["dcp_chunks"] == len(md.chunks)
            if len(md.chunks) > 1:
                assert info.byte_offset is None
                got = [(c.offsets, c.sizes) for c in info.chunks]
                assert got == [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]
                for c in info.chunks:
                    place = next(v for k, v in meta.storage_data.items()
                                 if k.fqn == fqn and tuple(k.offset) == c.offsets)
                    assert Path(c.tensor.file).name == place.relative_path
                    assert place.offset < c.tensor.byte_offset < place.offset + place.length
        assert model.metadata["version"] == meta.version
        assert model.metadata["save_id"] == meta.storage_meta.save_id
        roles = [r.role for r in model.evidence.pickles]
        assert roles[0] == "dcp.metadata"
        assert roles.count("dcp.bytes") == len(model.metadata.get("dcp_items", {}))
        assert roles.count("dcp.chunk") == len(meta.storage_data) - roles.count("dcp.bytes")
        assert not model.evidence.anomalies


def test_two_ranks_layout():
    """Shard(0) splits rows and Shard(1) columns over two files; one-chunk tensors are views."""
    with tensorscope.open(DCP_DIR / "two_ranks") as model:
        rows, cols = model.tensor("rows"), model.tensor("cols")
        assert [c.offsets for c in rows.chunks] == [(0, 0), (3, 0)]
        assert [c.offsets for c in cols.chunks] == [(0, 0), (0, 3)]
        assert {Path(c.tensor.file).name for c in rows.chunks} == {"__0_0.distcp", "__1_0.distcp"}
        t = model.tensor("transposed")
        assert t.stride == (1, 5) and not t.chunks   # stored transposed, read in place
        arr = model.read("transposed")
        assert not arr.flags.owndata and not arr.flags.writeable


# -- hostile / inconsistent folders -------------------------------------------------------------
def _copy(tmp_path: Path, name: str = "two_ranks") -> Path:
    dst = tmp_path / name
    shutil.copytree(DCP_DIR / name, dst)
    return dst


def _edit_metadata(folder: Path, edit) -> None:
    meta = FileSystemReader(str(folder)).read_metadata()
    edit(meta)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(meta, f, protocol=4)


def _info(meta, fqn, offset):
    return next(v for k, v in meta.storage_data.items()
                if k.fqn == fqn and (offset is None or tuple(k.offset) == offset))


def _run(capsys, folder) -> str:
    assert cli.main(["inspect", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err.removeprefix("tensorscope inspect: error: ").rstrip("\n")


def test_missing_storage_file_is_named(tmp_path, capsys):
    folder = _copy(tmp_path)
    (folder / "__1_0.distcp").unlink()
    assert _run(capsys, folder) == (f"dcp: {folder}/__1_0.distcp: storage file __1_0.distcp "
                                    "(holding 'rows') does not exist")


def test_truncated_storage_file(tmp_path, capsys):
    folder = _copy(tmp_path)
    data = (folder / "__1_0.distcp").read_bytes()
    (folder / "__1_0.distcp").write_bytes(data[:4000])
    place = _info(FileSystemReader(str(folder)).read_metadata(), "rows", (3, 0))
    assert _run(capsys, folder) == (
        f"dcp: {folder}/__1_0.distcp at byte {place.offset}: tensor 'rows' chunk 1 at [3, 0] blob "
        f"wants {place.length} bytes at offset {place.offset}, the file has 4000 bytes "
        f"({max(0, 4000 - place.offset)} remain)")


def test_truncated_metadata(tmp_path, capsys):
    folder = _copy(tmp_path)
    data = (folder / ".metadata").read_bytes()
    (folder / ".metadata").write_bytes(data[:300])
    msg = _run(capsys, folder)
    assert msg.startswith(f"pickle: {folder}/.metadata at byte ")


def test_path_traversal_is_refused(tmp_path, capsys):
    folder = _copy(tmp_path)
    _edit_metadata(folder, lambda m: setattr(_info(m, "rows", (0, 0)), "relative_path", "../secret"))
    assert _run(capsys, folder) == (
        f"dcp: {folder}/.metadata: storage entry of 'rows' names str '../secret': only a file "
        "directly in the checkpoint folder is accepted (path traversal refused)")


def test_chunk_outside_tensor(tmp_path, capsys):
    folder = _copy(tmp_path)

    def edit(m):
        m.state_dict_metadata["rows"].chunks[1].sizes = torch.Size([4, 4])
    _edit_metadata(folder, edit)
    assert _run(capsys, folder) == (
        f"dcp: {folder}/.metadata: tensor 'rows' chunk 1 (offsets [3, 0], sizes [4, 4]) does not "
        "fit the tensor's size [6, 4]")


def test_chunk_blob_disagrees_with_metadata(tmp_path, capsys):
    folder = _copy(tmp_path)

    def edit(m):
        m.state_dict_metadata["rows"].chunks[1].sizes = torch.Size([2, 4])
    _edit_metadata(folder, edit)
    place = _info(FileSystemReader(str(folder)).read_metadata(), "rows", (3, 0))
    assert _run(capsys, folder) == (
        f"dcp: {folder}/__1_0.distcp:__1_0.distcp[rows@3,0] at byte {place.offset}: tensor 'rows' "
        "chunk 1 at [3, 0]: the blob holds a float32 tensor of shape [3, 4], the metadata says "
        "float32 [2, 4]")


def test_corrupt_blob(tmp_path, capsys):
    folder = _copy(tmp_path)
    place = _info(FileSystemReader(str(folder)).read_metadata(), "rows", (3, 0))
    data = bytearray((folder / "__1_0.distcp").read_bytes())
    data[place.offset:place.offset + 4] = b"JUNK"
    (folder / "__1_0.distcp").write_bytes(bytes(data))
    assert _run(capsys, folder) == (
        f"dcp: {folder}/__1_0.distcp:__1_0.distcp[rows@3,0] at byte {place.offset}: blob does not "
        f"start with a zip signature (starts with {bytes(data[place.offset:place.offset + 8])!r}): "
        "not a torch.save archive")


def test_missing_chunk_is_an_anomaly(tmp_path):
    folder = _copy(tmp_path)

    def edit(m):
        del m.state_dict_metadata["rows"].chunks[1]
    _edit_metadata(folder, edit)
    with tensorscope.open(folder) as model:
        (a,) = model.evidence.anomalies
        assert a.kind == "dcp.chunk_coverage"
        assert a.message == "tensor 'rows': its 1 chunks cover 12 of 24 elements"


def test_unknown_metadata_object(tmp_path, capsys):
    folder = _copy(tmp_path)
    (folder / ".metadata").write_bytes(pickle.dumps({"not": "metadata"}, protocol=4))
    assert _run(capsys, folder) == (f"dcp: {folder}/.metadata: the metadata pickle: expected "
                                    "Metadata, got dict {'not': 'metadata'}")
