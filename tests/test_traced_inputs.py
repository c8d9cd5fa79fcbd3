"""Tensors saved without data (TorchScript traced inputs): listed, never counted in byte totals,
the same way in the model, `inspect`, `diff` and the TUI (they all read `TensorInfo.has_data`)."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import torch

import tensorscope
from tensorscope import cli
from tensorscope.tui.model_index import build_tree

PATH = Path(__file__).resolve().parent.parent / "fixtures" / "containers" / "ts_traced.pt"
NAME = "traced_inputs.forward.0"


def _stored_bytes() -> int:
    """What torch.jit.load holds: parameters, buffers and constants; traced inputs have no record."""
    module = torch.jit.load(PATH)
    state = sum(t.nbytes for t in module.state_dict().values())
    with zipfile.ZipFile(PATH) as zf:
        consts = sum(i.file_size for i in zf.infolist() if "/constants/" in i.filename)
        inputs = [i.file_size for i in zf.infolist() if "/traced_inputs/" in i.filename]
    assert inputs == [0]   # torch writes the record empty
    return state + consts


def test_model_lists_the_input_without_counting_it():
    with tensorscope.open(PATH) as model:
        inp = model.tensor(NAME)
        assert inp.has_data is False and inp.byte_offset is None and inp.role == "input"
        assert all(t.has_data for t in model.tensors if t.name != NAME)
        assert model.total_bytes == _stored_bytes()
        assert model.summary()["bytes"] == model.total_bytes
        assert sum(d["bytes"] for d in model.summary()["by_dtype"].values()) == model.total_bytes
        assert build_tree(model.tensors).nbytes == model.total_bytes   # the TUI's tree total


def test_inspect_shows_no_bytes_for_it(capsys):
    assert cli.main(["inspect", str(PATH), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["bytes"] == _stored_bytes()
    row = next(r for r in doc["tensors"] if r["name"] == NAME)
    assert row["byte_offset"] is None and row["has_data"] is False
    assert all("has_data" not in r for r in doc["tensors"] if r["name"] != NAME)
    assert cli.main(["inspect", str(PATH)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(NAME))
    assert line.split()[-2:] == ["-", "-"]   # bytes and offset


def test_diff_of_the_file_with_itself_is_identical(capsys):
    assert cli.main(["diff", str(PATH), str(PATH), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    entry = next(e for e in doc["entries"] if e["name"] == NAME)
    assert entry["status"] == "same"
