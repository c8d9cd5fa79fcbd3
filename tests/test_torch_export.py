"""torch.export ``.pt2`` archives: our listing and values against torch.export.load, live."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorscope
from tensorscope import cli
from tensorscope.parsers.torch_export import SCALAR_TYPES
from torch_oracle import FIXTURES, dtype_name, our_bytes, stored_bytes

PT2_DIR = FIXTURES / "distributed" / "pt2"
FILES = sorted(p.name for p in PT2_DIR.glob("*.pt2"))


def _oracle(path: Path) -> tuple[dict, dict]:
    ep = torch.export.load(path)
    return dict(ep.state_dict), {k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}


def _is_subclass(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, torch.nn.Parameter)


@pytest.mark.parametrize("name", FILES)
def test_matches_torch_export_load(name):
    path = PT2_DIR / name
    state, constants = _oracle(path)
    with tensorscope.open(path) as model:
        assert model.format == "pt2"
        assert model.names == list(state) + list(constants)   # state_dict order, then constants
        for tname, t in {**state, **constants}.items():
            info = model.tensor(tname)
            assert info.dtype == dtype_name(t), tname
            assert info.shape == tuple(t.shape), tname
            assert info.stride == t.stride(), tname
            assert info.role == ("constant" if tname in constants else
                                 "parameter" if isinstance(t, torch.nn.Parameter) else "buffer"), tname
            if _is_subclass(t):
                assert info.byte_offset is None
                assert info.extras["subclass"] == f"{type(t).__module__}.{type(t).__name__}"
                continue
            assert info.storage_offset == t.storage_offset(), tname
            assert our_bytes(model.read(tname)) == stored_bytes(t), tname


def test_tied_weights_share_one_record_and_views_keep_strides():
    with tensorscope.open(PT2_DIR / "tied.pt2") as model:
        l1, l3 = model.tensor("l1.weight"), model.tensor("l3.weight")
        assert l1.byte_offset == l3.byte_offset and l1.storage_key == l3.storage_key
        strided = model.tensor("strided")
        assert strided.stride == (1, 3) and strided.storage_offset == 3
        assert strided.storage_nbytes == 15 * 4   # the whole (5, 3) storage is stored
        arr = model.read("strided")
        assert not arr.flags.writeable and not arr.flags.owndata


def test_metadata_signature_and_sample_inputs():
    path = PT2_DIR / "tied.pt2"
    ep = torch.export.load(path)
    with tensorscope.open(path) as model:
        meta = model.metadata
        assert meta["archive_format"] == "pt2" and meta["archive_version"] == "0"
        assert meta["archive_prefix"] == "tied"
        program = meta["models"]["model"]
        assert program["torch_version"] == torch.__version__
        assert program["nodes"] == len(ep.graph_module.graph.nodes) - sum(
            1 for n in ep.graph_module.graph.nodes if n.op in ("placeholder", "output"))
        sig = model.extras["graph_signature"]["inputs"]
        assert sig["parameter"] == list(ep.graph_signature.parameters)
        assert sig["buffer"] == list(ep.graph_signature.buffers)
        assert sig["tensor_constant"] == list(ep.graph_signature.lifted_tensor_constants)
        ops = model.extras["op_counts"]
        expected = {}
        for n in ep.graph_module.graph.nodes:
            if n.op == "call_function":
                expected[f"torch.ops.{n.target}"] = expected.get(f"torch.ops.{n.target}", 0) + 1
        assert ops == expected
        (sample,) = model.extras["sample_inputs"]
        args, _kwargs = ep.example_inputs
        assert sample["shape"] == list(args[0].shape)
        raw = model.source(str(path)).read(sample["byte_offset"], args[0].numel() * 4)
        assert raw == stored_bytes(args[0])
        roles = {r.role for r in model.evidence.pickles}
        assert roles == {"pt2.sample_inputs"}
        assert not model.evidence.anomalies


def test_subclass_payload_is_recorded_as_evidence():
    with tensorscope.open(PT2_DIR / "subclass.pt2") as model:
        rec = [r for r in model.evidence.pickles if r.role == "pt2.pickled_payload"]
        assert len(rec) == 1
        assert "torch._utils._rebuild_wrapper_subclass" in {g.dotted for g in rec[0].result.globals}
        inner = model.tensor("w").extras["inner_tensors"]
        two = torch.export.load(PT2_DIR / "subclass.pt2").state_dict["w"]
        src = model.source(str(PT2_DIR / "subclass.pt2"))
        for part, t in zip(inner, (two.a, two.b)):
            assert src.read(part["byte_offset"], 36) == stored_bytes(t)
        with pytest.raises(tensorscope.errors.FormatError, match="no stored bytes"):
            model.read("w")


def test_scalar_type_codes_match_torch_schema():
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE
    for code, name in SCALAR_TYPES.items():
        assert str(_SERIALIZE_TO_TORCH_DTYPE[ScalarType(code)]) == f"torch.{name}"


# -- hostile / inconsistent archives -------------------------------------------------------------
def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a .pt2 member by member (same order), letting ``edit(name, data)`` change or drop one."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
    return dst


def _config_edit(fqn: str, **changes):
    def edit(name, data):
        if name.endswith("model_weights_config.json"):
            doc = json.loads(data)
            entry = doc["config"][fqn]
            for k, v in changes.items():
                if k in ("dtype", "sizes", "strides", "storage_offset"):
                    entry["tensor_meta"][k] = v
                else:
                    entry[k] = v
            return json.dumps(doc).encode()
        return data
    return edit


def _drop(member: str):
    return lambda name, data: None if name.endswith(member) else data


def _replace(member: str, payload: bytes):
    return lambda name, data: payload if name.endswith(member) else data


BAD = [
    ("unknown_dtype", _config_edit("l1.bias", dtype=99),
     "pt2: {p}:tied/data/weights/model_weights_config.json: entry 'l1.bias': unknown dtype code 99"),
    ("symbolic_size", _config_edit("l1.bias", sizes=[{"as_expr": "s0"}]),
     "pt2: {p}:tied/data/weights/model_weights_config.json: entry 'l1.bias': sizes must be "
     "{{\"as_int\": n >= 0}} (symbolic sizes are not weights), got {{'as_expr': 's0'}}"),
    ("missing_record", _drop("data/weights/weight_3"),
     "pt2: {p}:tied/data/weights/model_weights_config.json: entry 'l1.bias' names record "
     "tied/data/weights/weight_3, which the archive does not hold"),
    ("out_of_storage", _config_edit("l1.bias", storage_offset={"as_int": 2}),
     "pt2: {p}:tied/data/weights/weight_3 at byte {off}: entry 'l1.bias' (float32 [3], strides "
     "[1], offset 2) addresses bytes past the end of its 12-byte record"),
    ("ragged_record", _replace("data/weights/weight_3", b"\0" * 10),
     "pt2: {p}:tied/data/weights/weight_3 at byte {off}: record size 10 is not a multiple of the "
     "4-byte float32 element (entry 'l1.bias')"),
    ("bad_json", _replace("models/model.json", b'{"graph_module": '),
     "pt2: {p}:tied/models/model.json at byte {off}: invalid JSON: Expecting value: line 1 "
     "column 18 (char 17)"),
    ("no_weights_config", _drop("model_weights_config.json"),
     "pt2: {p}: archive has neither tied/data/weights/model_weights_config.json nor "
     "tied/data/weights/model.pt: the program's weights are missing"),
    ("bad_sample_inputs", _replace("data/sample_inputs/model.pt", b"not a zip at all"),
     "pt2: {p}:tied/data/sample_inputs/model.pt at byte {off}: blob does not start with a zip "
     "signature (starts with b'not a zi'): not a torch.save archive"),
]


@pytest.mark.parametrize("case,edit,message", BAD, ids=[b[0] for b in BAD])
def test_inconsistent_archive_is_one_line_exit_2(tmp_path, capsys, case, edit, message):
    path = _rewrite(PT2_DIR / "tied.pt2", tmp_path / "tied.pt2", edit)
    with zipfile.ZipFile(path) as zf:
        members = {i.filename: i for i in zf.infolist()}
    raw = path.read_bytes()

    def data_offset(member):  # local header + 30 + name + extra
        h = members[member].header_offset
        return h + 30 + int.from_bytes(raw[h + 26:h + 28], "little") + int.from_bytes(raw[h + 28:h + 30], "little")
    # (member, byte within it) that the message names
    off = {"out_of_storage": ("tied/data/weights/weight_3", 0),
           "ragged_record": ("tied/data/weights/weight_3", 0),
           "bad_json": ("tied/models/model.json", 17),   # the JSON error's position
           "bad_sample_inputs": ("tied/data/sample_inputs/model.pt", 0)}.get(case)
    expected = message.format(p=path, off=data_offset(off[0]) + off[1] if off else None)
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"tensorscope inspect: error: {expected}\n"


def test_truncated_archive_is_an_error(tmp_path, capsys):
    raw = (PT2_DIR / "tied.pt2").read_bytes()
    path = tmp_path / "cut.pt2"
    path.write_bytes(raw[: len(raw) // 2])
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tensorscope inspect: error: zip: ") and err.count("\n") == 1


def test_empty_record_reads_as_zeros(tmp_path):
    path = _rewrite(PT2_DIR / "tied.pt2", tmp_path / "tied.pt2", _replace("data/weights/weight_3", b""))
    ep = torch.export.load(path)
    with tensorscope.open(path) as model:
        arr = model.read("l1.bias")
        assert np.array_equal(arr, ep.state_dict["l1.bias"].detach().numpy())
        assert model.tensor("l1.bias").extras["empty_record"] is True
