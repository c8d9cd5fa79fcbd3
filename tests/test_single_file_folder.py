"""A folder holding one model file (a Lightning ``.ckpt``, a ``.pt``, a ``.bin``) is that file: its
own format, not a one-shard "sharded" model with "index None"."""
from __future__ import annotations

import json

import pytest
import torch

import tensorscope
from tensorscope import cli


@pytest.mark.parametrize("name", ["last.ckpt", "model.pt", "pytorch_model.bin"])
def test_folder_of_one_torch_file(name, tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    state = {"state_dict": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}, "epoch": 3}
    torch.save(state, folder / name)
    (folder / "hparams.yaml").write_text("lr: 0.1\n")
    loaded = torch.load(folder / name)["state_dict"]
    assert tensorscope.identify(folder) == tensorscope.identify(folder / name)
    with tensorscope.open(folder) as model, tensorscope.open(folder / name) as alone:
        assert model.format == alone.format == "torch-zip"
        assert model.metadata["model_file"] == name and model.path == str(folder)
        assert model.names == alone.names == [f"state_dict.{k}" for k in loaded]
        for k, t in loaded.items():
            assert model.read(f"state_dict.{k}").tolist() == t.tolist()
    assert cli.main(["inspect", str(folder), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["format"] == "torch-zip" and "index" not in doc["metadata"]
    assert cli.main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "format torch-zip" in out and "sharded" not in out and "index None" not in out
