"""Sharded checkpoints and model folders: merged listing against torch.load / safe_open per shard."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import tensorscope
from tensorscope import cli, formats
from torch_oracle import FIXTURES, dtype_name, our_bytes, stored_bytes

SHARDED = FIXTURES / "distributed" / "sharded"
NEW_REV = "2222222222222222222222222222222222222222"
OLD_REV = "1111111111111111111111111111111111111111"


def _blob(blobs: Path, src: Path) -> str:
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    shutil.copyfile(src, blobs / digest)
    return digest


@pytest.fixture(scope="module")
def hf_repo(tmp_path_factory) -> Path:
    """A huggingface_hub cache entry: ``blobs/<sha256>``, ``refs/main`` and two snapshots whose
    files are relative symlinks into ``../../blobs/`` (refs/main names the newer, sharded one)."""
    repo = tmp_path_factory.mktemp("hf_cache") / "models--org--tiny"
    blobs = repo / "blobs"
    blobs.mkdir(parents=True)
    revisions = {
        OLD_REV: {"model.safetensors": SHARDED / "single" / "model.safetensors"},
        NEW_REV: {p.name: p for p in (SHARDED / "st_index").iterdir()},
    }
    for rev, files in revisions.items():
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        for name, src in files.items():
            os.symlink(f"../../blobs/{_blob(blobs, src)}", snap / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(NEW_REV)
    return repo


def _shard_tensors(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        with safe_open(path, "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    return torch.load(path, weights_only=True, mmap=True)


def _expected(folder: Path) -> tuple[list[str], dict[str, tuple[str, torch.Tensor]]]:
    """(names in expected order, {name: (shard file name, tensor)}) from the index or the shards."""
    indexes = sorted(folder.glob("*.index.json"))
    if indexes:
        wm = json.loads(indexes[0].read_text())["weight_map"]
        shards = {s: _shard_tensors(folder / s) for s in dict.fromkeys(wm.values())}
        return list(wm), {k: (s, shards[s][k]) for k, s in wm.items()}
    out: dict[str, tuple[str, torch.Tensor]] = {}
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
    for p in files:
        for k, t in _shard_tensors(p).items():
            out.setdefault(k, (p.name, t))
    if len(files) == 1:   # one model file: its own order
        with tensorscope.open(files[0]) as m:
            return m.names, out
    return list(out), out


# (case, path to open, folder whose files are the oracle); "HF/..." is inside the hf_repo fixture.
CASES = [("st_index", SHARDED / "st_index", SHARDED / "st_index"),
         ("bin_index", SHARDED / "bin_index", SHARDED / "bin_index"),
         ("index_file", SHARDED / "st_index" / "model.safetensors.index.json", SHARDED / "st_index"),
         ("no_index", SHARDED / "no_index", SHARDED / "no_index"),
         ("single", SHARDED / "single", SHARDED / "single"),
         ("hf_repo", "HF", f"HF/snapshots/{NEW_REV}"),
         ("hf_snapshot_old", f"HF/snapshots/{OLD_REV}", f"HF/snapshots/{OLD_REV}")]


def _in_repo(p, repo: Path) -> Path:
    return repo / p[3:] if isinstance(p, str) and p.startswith("HF/") else repo if p == "HF" else p


@pytest.mark.parametrize("case,path,folder", CASES, ids=[c[0] for c in CASES])
def test_matches_shards(case, path, folder, hf_repo):
    path, folder = _in_repo(path, hf_repo), _in_repo(folder, hf_repo)
    order, expected = _expected(folder)
    with tensorscope.open(path) as model:
        single = len(expected) and len({s for s, _ in expected.values()}) == 1 \
            and not list(Path(folder).glob("*.index.json"))
        # A folder of one model file is that file, in its own format (not a one-shard "sharded").
        assert model.format == ("safetensors" if single else "sharded")
        assert model.names == order
        for name, (shard, t) in expected.items():
            info = model.tensor(name)
            assert Path(info.file).name == shard, name
            assert info.dtype == dtype_name(t) and info.shape == tuple(t.shape), name
            assert our_bytes(model.read(name)) == stored_bytes(t), name
        shards = list(dict.fromkeys(s for s, _ in expected.values()))
        if single:
            assert model.metadata["model_file"] == shards[0] and model.path == str(path)
        else:
            assert [s["file"] for s in model.metadata["shards"]] == shards
        assert not model.evidence.anomalies


def test_index_metadata_and_revision(hf_repo):
    with tensorscope.open(hf_repo) as model:
        assert model.metadata["hf_revision"] == NEW_REV
        assert model.metadata["index"] == "model.safetensors.index.json"
        assert model.metadata["index_metadata"] == {"total_size": model.total_bytes}
        assert [s["format"] for s in model.metadata["shards"]] == ["safetensors", "safetensors"]
        assert model.metadata["shards"][0]["metadata"]["__metadata__"] == {"format": "pt"}


def test_refs_main_absent_picks_newest_snapshot(tmp_path, hf_repo):
    repo = tmp_path / "models--org--tiny"
    shutil.copytree(hf_repo, repo, symlinks=True)
    (repo / "refs" / "main").unlink()
    os.utime(repo / "snapshots" / OLD_REV, (2e9, 2e9), follow_symlinks=False)
    with tensorscope.open(repo) as model:
        assert model.metadata["hf_revision"] == OLD_REV


@pytest.mark.parametrize("path,expected", [
    (SHARDED / "st_index", ["sharded"]), ("HF", ["sharded"]), (SHARDED / "single", ["safetensors"]),
    (SHARDED, []), (FIXTURES / "distributed" / "dcp" / "single", ["dcp"]),
])
def test_identify_folders(path, expected, hf_repo):
    assert formats.identify(_in_repo(path, hf_repo)) == expected


def test_blob_symlinks_outside_the_repo_are_refused(tmp_path, hf_repo, capsys):
    """Inside a cache the boundary is the models--* folder: a link to another repo's blob escapes."""
    repo = tmp_path / "models--org--tiny"
    shutil.copytree(hf_repo, repo, symlinks=True)
    other = tmp_path / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    snap = repo / "snapshots" / NEW_REV
    target = other / "x"
    shutil.copyfile(snap / "model-00001-of-00002.safetensors", target)
    (snap / "model-00001-of-00002.safetensors").unlink()
    os.symlink("../../../models--org--other/blobs/x", snap / "model-00001-of-00002.safetensors")
    assert _error(capsys, repo) == (
        f"sharded: {snap.resolve() / 'model.safetensors.index.json'}: shard "
        f"'model-00001-of-00002.safetensors' resolves to {target}, outside the model folder "
        f"{repo.resolve()} (symlink escape refused)")


# -- hostile / inconsistent ---------------------------------------------------------------------
def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(SHARDED / name, dst, symlinks=True)
    return dst


def _edit_index(folder: Path, edit) -> Path:
    index = next(folder.glob("*.index.json"))
    doc = json.loads(index.read_text())
    edit(doc)
    index.write_text(json.dumps(doc))
    return index


def _error(capsys, path) -> str:
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err.removeprefix("tensorscope inspect: error: ").rstrip("\n")


def test_missing_shard_is_named(tmp_path, capsys):
    folder = _copy(tmp_path, "st_index")
    (folder / "model-00002-of-00002.safetensors").unlink()
    assert _error(capsys, folder) == (
        f"sharded: {folder}/model-00002-of-00002.safetensors: shard model-00002-of-00002.safetensors "
        "(named by the index for 'layers.1.attn.bias') does not exist")


def test_tensor_missing_from_its_shard(tmp_path, capsys):
    folder = _copy(tmp_path, "st_index")
    index = _edit_index(folder, lambda d: d["weight_map"].update(
        {"ghost.weight": "model-00001-of-00002.safetensors"}))
    assert _error(capsys, folder) == (
        f"sharded: {index}: tensor 'ghost.weight' is mapped to shard "
        "model-00001-of-00002.safetensors, which does not hold it")


def test_unmapped_tensor_is_an_anomaly(tmp_path):
    folder = _copy(tmp_path, "st_index")
    _edit_index(folder, lambda d: d["weight_map"].pop("head.weight"))
    with tensorscope.open(folder) as model:
        kinds = [a.kind for a in model.evidence.anomalies]
        assert kinds == ["sharded.unmapped_tensor", "sharded.total_size_mismatch"]
        assert model.names[-1] == "head.weight"


def test_tensor_in_two_shards_and_in_the_wrong_one(tmp_path):
    """The in-place mapping table (`sharded._mapped`) refuses these, and the slow path names them
    with the map's keys intact."""
    from safetensors.torch import load_file, save_file
    folder = _copy(tmp_path, "st_index")
    one, two = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    first, second = load_file(str(folder / one)), load_file(str(folder / two))
    name = next(iter(first))
    save_file({**second, name: first[name]}, str(folder / two))          # in both shards
    with tensorscope.open(folder) as model:
        kinds = [a.kind for a in model.evidence.anomalies]
        assert "sharded.duplicate_tensor" in kinds
        assert model.names.count(name) == 1 and model.tensor(name).file.endswith(one)
    _edit_index(folder, lambda d: d["weight_map"].update({name: two}))    # mapped to the other
    with tensorscope.open(folder) as model:
        assert model.tensor(name).file.endswith(two)
        assert [t.name for t in model.tensors] == list(json.loads(
            (folder / "model.safetensors.index.json").read_text())["weight_map"])


@pytest.mark.parametrize("dup_text", [
    '"embed.weight": "model-00002-of-00002.safetensors"',        # the key again, plainly
    '"embed\\u002eweight": 3',                                   # escaped, another type
])
def test_duplicate_index_key_is_an_anomaly(tmp_path, dup_text):
    """json keeps the last of a repeated key: the index is read without a hook per pair, so a
    repeat is found by counting the strings of the text against those parsed."""
    folder = _copy(tmp_path, "st_index")
    index = next(folder.glob("*.index.json"))
    text = index.read_text()
    index.write_text(text.replace('"weight_map": {', '"weight_map": {' + dup_text + ", ", 1))
    with tensorscope.open(folder) as model:
        kinds = [a.kind for a in model.evidence.anomalies]
        assert kinds[0] == "sharded.duplicate_key" and "'embed.weight'" in \
            model.evidence.anomalies[0].message
        assert sorted(model.names) == sorted(json.loads(text)["weight_map"])


def test_index_and_records_agree_with_the_one_tensor_at_a_time_mapping(tmp_path, monkeypatch):
    """The mapping in C over whole columns (`_mapped`) and the general loop give one listing."""
    from tensorscope.parsers import sharded
    folder = _copy(tmp_path, "st_index")
    with tensorscope.open(folder) as model:
        fast = [(t.name, t.file, t.byte_offset) for t in model.tensors], model.metadata
    monkeypatch.setattr(sharded, "_mapped", lambda *a: None)
    with tensorscope.open(folder) as model:
        assert ([(t.name, t.file, t.byte_offset) for t in model.tensors], model.metadata) == fast
        assert not model.evidence.anomalies


@pytest.mark.parametrize("shard", ["../st_index/model-00001-of-00002.safetensors", "/etc/passwd"])
def test_escaping_shard_names_are_refused(tmp_path, capsys, shard):
    folder = _copy(tmp_path, "st_index")
    index = _edit_index(folder, lambda d: d["weight_map"].update({"embed.weight": shard}))
    assert _error(capsys, folder) == (
        f"sharded: {index}: shard name {shard!r} is not a plain relative path inside the model "
        "folder (path traversal refused)")


def test_symlink_out_of_the_folder_is_refused(tmp_path, capsys):
    folder = _copy(tmp_path, "st_index")
    outside = tmp_path / "outside.safetensors"
    shutil.move(folder / "model-00001-of-00002.safetensors", outside)
    os.symlink(outside, folder / "model-00001-of-00002.safetensors")
    index = folder / "model.safetensors.index.json"
    assert _error(capsys, folder) == (
        f"sharded: {index}: shard 'model-00001-of-00002.safetensors' resolves to {outside}, outside "
        f"the model folder {folder} (symlink escape refused)")


def test_missing_numbered_shard(tmp_path, capsys):
    folder = _copy(tmp_path, "no_index")
    (folder / "model-00002-of-00003.safetensors").unlink()
    assert _error(capsys, folder) == (
        f"sharded: {folder}/model-00002-of-00003.safetensors: shard model-00002-of-00003.safetensors "
        "is missing (the shards are numbered 1..3, no index)")


def test_truncated_shard_names_the_shard(tmp_path, capsys):
    folder = _copy(tmp_path, "bin_index")
    shard = folder / "pytorch_model-00002-of-00002.bin"
    shard.write_bytes(shard.read_bytes()[:500])
    msg = _error(capsys, folder)
    assert str(shard) in msg


@pytest.mark.parametrize("text,message", [
    ('{"weight_map": ', "invalid index JSON: Expecting value: line 1 column 16 (char 15)"),
    ('{"metadata": {}}', 'index has no "weight_map" object'),
    ('{"weight_map": {"a": 3}}', "weight_map['a'] is int, not a shard file name"),
    ("[" * 100000, "index JSON nests too deeply"),
])
def test_bad_index_json(tmp_path, capsys, text, message):
    folder = _copy(tmp_path, "st_index")
    index = folder / "model.safetensors.index.json"
    index.write_text(text)
    at = " at byte 15" if "char 15" in message else ""
    assert _error(capsys, index) == f"sharded: {index}{at}: {message}"


def test_model_file_beside_training_args(tmp_path):
    """A fine-tuning output folder: pytorch_model.bin is the model, training_args.bin is not."""
    folder = tmp_path / "out"
    folder.mkdir()
    shutil.copyfile(SHARDED / "bin_index" / "pytorch_model-00001-of-00002.bin", folder / "pytorch_model.bin")
    torch.save({"lr": 0.1}, folder / "training_args.bin")
    with tensorscope.open(folder) as model:
        assert model.format == "torch-zip" and model.metadata["model_file"] == "pytorch_model.bin"
        assert model.metadata["ignored_files"] == ["training_args.bin"]
    (folder / "other.bin").write_bytes((folder / "training_args.bin").read_bytes())
    (folder / "pytorch_model.bin").rename(folder / "weights.bin")
    assert formats.identify(folder) == []   # three .bin files, none named as a model: ambiguous


@pytest.mark.parametrize("name", sorted(p.name for p in SHARDED.iterdir() if p.is_dir()))
def test_scan_of_an_opened_folder_reuses_its_shards(name, tmp_path, monkeypatch):
    """`scan_opened` (convert, the TUI) on a folder: the same report as `scan_paths`, without
    parsing the shards (or the index, which opens as the whole model) a second time."""
    from tensorscope.scanning import scan_paths
    from tensorscope.scanning.walk import scan_opened
    folder = _copy(tmp_path, name)
    expected = scan_paths(str(folder)).to_dict()
    with tensorscope.open(str(folder)) as model:
        opens = []
        real_open = formats.open_model
        monkeypatch.setattr(formats, "open_model", lambda *a, **k: opens.append(a) or real_open(*a, **k))
        got = scan_opened(str(folder), model).to_dict()
    assert got == expected
    if model.format == "sharded":
        assert model.parts and not opens
