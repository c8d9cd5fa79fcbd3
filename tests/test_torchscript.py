"""TorchScript archives: our listing against torch.jit.load(f).state_dict(), live."""
from __future__ import annotations

import struct
import sys
import warnings
import zipfile

import pytest
import torch

import tensorscope
from tensorscope import cli
from tensorscope.parsers import torchscript
from helpers import audited_open
from torch_oracle import FIXTURES, dtype_name, our_bytes, stored_bytes

DIR = FIXTURES / "containers"
SCRIPTS = ["ts_scripted.pt", "ts_traced.pt", "ts_lite.ptl", "ts_dtypes.pt"]

# Parsed under an audit hook: exec/compile/import of a new module fail (helpers.py).
_open = audited_open


def _jit(path, extra=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.load(str(path), map_location="cpu", _extra_files=extra or {})


def _resolve(module, path: tuple[str, ...]):
    """Follow a tensor path through a loaded ScriptModule: attributes, dict keys, list indices."""
    obj = module
    for part in path:
        if isinstance(obj, dict):
            obj = obj[part]
        elif isinstance(obj, (list, tuple)):
            obj = obj[int(part)]
        else:
            obj = getattr(obj, part)
    return obj


def _same(model, info, t):
    assert (info.dtype, info.shape, info.stride, info.storage_offset) == \
        (dtype_name(t), tuple(t.shape), t.stride(), t.storage_offset()), info.name
    assert our_bytes(model.read(info)) == stored_bytes(t), info.name


@pytest.mark.parametrize("name", SCRIPTS)
def test_state_dict_matches_jit_load(name):
    path = DIR / name
    m = _jit(path)
    expected = m.state_dict()
    params = {n for n, _ in m.named_parameters()}
    buffers = {n for n, _ in m.named_buffers()}
    with _open(path) as model:
        assert model.format == "torchscript"
        in_state = [t for t in model.tensors if t.role in ("parameter", "buffer")]
        assert [t.name for t in in_state] == list(expected)  # same names, same order
        for info in in_state:
            assert info.role == ("parameter" if info.name in params else "buffer")
            assert info.name in params | buffers
            _same(model, info, expected[info.name])
        assert model.evidence.anomalies == []


def _attribute_tensors(m) -> dict[str, torch.Tensor]:
    """Tensor attributes of a loaded ScriptModule that are neither parameters nor buffers, with
    tensors inside Dict/List attributes, named as dotted paths. TorchScript attributes are not
    Python attributes: their names come from torch's own dump of each module's first
    ``attributes {`` block."""
    out = {}
    for prefix, sm in m.named_modules():
        own = {n for n, _ in sm.named_parameters(recurse=False)} | \
            {n for n, _ in sm.named_buffers(recurse=False)}
        lines = sm._c.dump_to_str(False, True, False).splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip() == "attributes {")
        indent = len(lines[start]) - len(lines[start].lstrip()) + 2
        names = [line.split(" = ", 1)[0].strip() for line in lines[start + 1:]
                 if len(line) - len(line.lstrip()) == indent and " = " in line]
        names = [n for n in names if n.isidentifier()]  # not "(2,.,.)" rows of a printed tensor
        for a in names:
            if a in own:
                continue
            v = sm._c.getattr(a)
            items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else \
                [(None, v)]
            for k, x in items:
                if isinstance(x, torch.Tensor):
                    out[".".join(str(p) for p in (prefix, a, k) if p not in ("", None))] = x
    return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_attribute_tensors_match_the_module(name):
    m = _jit(DIR / name)
    expected = _attribute_tensors(m)
    with tensorscope.open(DIR / name) as model:
        ours = {t.name: t for t in model.tensors if t.role == "attribute"}
        assert sorted(ours) == sorted(expected)   # the same attributes, none missed, none invented
        for info in ours.values():
            _same(model, info, _resolve(m, info.path))
    if name == "ts_scripted.pt":
        assert expected  # the fixture made to hold attribute tensors holds them


def test_attribute_roles_and_names():
    with tensorscope.open(DIR / "ts_scripted.pt") as model:
        roles = {t.name: t.role for t in model.tensors}
        assert roles["leaf.scale"] == "attribute"          # plain tensor attribute
        assert roles["table.alpha"] == roles["stack.1"] == "attribute"  # Dict/List[Tensor]
        assert roles["transient"] == "buffer"              # non-persistent: still in state_dict
        assert "layers.1.bias" not in model                # Linear(bias=False): None parameter
        assert model.tensor("stack.1").storage_offset == 1  # a view of eye(2)
        assert model.tensor("w").extras.get("requires_grad") is True


@pytest.mark.parametrize("name", SCRIPTS)
def test_byte_offsets_point_into_the_records(name):
    path = DIR / name
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as zf, tensorscope.open(path) as model:
        for info in model.tensors:
            if info.byte_offset is None:
                continue
            member = zf.getinfo(info.extras["member"])
            payload = zf.read(member)
            start = info.byte_offset - info.storage_offset * model.read(info).dtype.itemsize
            assert raw[start:start + len(payload)] == payload, info.name
            assert start % 64 == 0


def test_constants_and_traced_inputs():
    with tensorscope.open(DIR / "ts_traced.pt") as model:
        const = model.tensor("constants.0")
        assert const.role == "constant" and const.storage_key == "0"
        assert const.extras["member"] == "ts_traced/constants/0"
        assert model.read(const).tolist() == [0.25]
        inp = model.tensor("traced_inputs.forward.0")
        assert inp.role == "input" and inp.shape == (4, 2, 5) and inp.byte_offset is None
        assert "stored empty" in inp.extras["error"]
        assert model.metadata["traced_inputs"] == 1 and model.evidence.anomalies == []
        roles = [p.role for p in model.evidence.pickles]
        assert roles == ["data", "constants", "traced_inputs"]
    with tensorscope.open(DIR / "ts_lite.ptl") as model:
        # The lite archive keys its constants "0.storage": a separate key space from data/.
        assert model.tensor("constants.0").extras["member"] == "ts_lite/constants/0.storage"
        assert model.read("constants.0").tolist() == [0.25]


def test_lite_interpreter_bytecode():
    from torch.jit.mobile import _get_model_bytecode_version
    path = DIR / "ts_lite.ptl"
    with tensorscope.open(path) as model:
        assert model.metadata["lite_interpreter"] is True
        assert model.metadata["bytecode_version"] == _get_model_bytecode_version(str(path))
        bytecode = [p for p in model.evidence.pickles if p.role == "bytecode"]
        assert len(bytecode) == 1 and bytecode[0].member == "ts_lite/bytecode.pkl"
        assert bytecode[0].result.stopped
    with tensorscope.open(DIR / "ts_traced.pt") as model:
        assert model.metadata["lite_interpreter"] is False


def test_code_and_extra_files():
    path = DIR / "ts_scripted.pt"
    extra = {"meta.json": "", "blob.bin": ""}
    _jit(path, extra)
    with zipfile.ZipFile(path) as zf, tensorscope.open(path) as model:
        code_members = [n for n in zf.namelist() if "/code/" in n and n.endswith(".py")]
        assert sorted(model.evidence.code) == sorted(code_members)
        assert model.extras["code"] is not None and set(model.extras["code"]) == set(code_members)
        for n in code_members:
            assert model.evidence.code[n] == zf.read(n).decode()
        files = model.extras["extra_files"]
        assert files["meta.json"]["text"] == extra["meta.json"].decode()
        assert files["blob.bin"]["size"] == len(extra["blob.bin"])
        assert files["blob.bin"]["text"] is None and files["blob.bin"]["head"] == extra["blob.bin"].hex()
        classes = model.extras["classes"]
        assert classes["__torch__.torch.nn.modules.linear.Linear"]["parameters"] == ["weight", "bias"]
        assert classes["__torch__.gen_containers.Leaf"]["buffers"] == ["count"]
        assert model.metadata["root_class"] == "__torch__.gen_containers.Scripted"


@pytest.mark.parametrize("text, expected", [
    ('class A(Module):\n  __parameters__ = ["w", "b", ]\n  __buffers__ = []\n',
     {"A": (["w", "b"], [])}),
    ('class A(Module):\n  __parameters__ = []\n  __buffers__ = ["0", ]\nclass B(Module):\n'
     '  __parameters__ = ["x", ]\n', {"A": ([], ["0"]), "B": (["x"], [])}),
    ('def f():\n  __parameters__ = ["no_class"]\n', {}),
    ('class C:\n  x : Tensor\n', {"C": ([], [])}),
])
def test_class_table_is_static_text(text, expected):
    table = torchscript.parse_class_table({"P/code/__torch__/m.py": text}, "P")
    got = {k.rsplit(".", 1)[1]: (v.parameters, v.buffers) for k, v in table.items()}
    assert got == expected
    assert all(k.startswith("__torch__.m.") for k in table)


# -- broken and hostile archives --------------------------------------------------------------------
def _rewrite(src, dst, *, drop=(), replace=None):
    replace = replace or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            if any(info.filename.endswith(d) or d in info.filename for d in drop):
                continue
            data = zin.read(info)
            for suffix, fn in replace.items():
                if info.filename.endswith(suffix):
                    data = fn(data)
            zout.writestr(info.filename, data)
    return dst


def test_truncated_data_pkl(tmp_path, capsys):
    path = _rewrite(DIR / "ts_scripted.pt", tmp_path / "short.pt",
                    replace={"/data.pkl": lambda d: d[:200]})
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "short.pt" in err and "ts_scripted/data.pkl" in err and "at byte" in err


def test_truncated_constants_pkl(tmp_path, capsys):
    path = _rewrite(DIR / "ts_traced.pt", tmp_path / "short_const.pt",
                    replace={"/constants.pkl": lambda d: d[:50]})
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ts_traced/constants.pkl" in err


def test_missing_data_record_still_lists(tmp_path):
    path = _rewrite(DIR / "ts_scripted.pt", tmp_path / "nodata.pt", drop=("/data/0",))
    with tensorscope.open(path) as model:
        assert model.tensor("w").byte_offset is None
        assert any(a.kind == "torch.storage_unreadable" for a in model.evidence.anomalies)
        with pytest.raises(tensorscope.TensorscopeError, match="no stored bytes"):
            model.read("w")


def test_short_data_record_is_an_anomaly(tmp_path):
    path = _rewrite(DIR / "ts_scripted.pt", tmp_path / "shortrec.pt",
                    replace={"/data/0": lambda d: d[:4]})
    with tensorscope.open(path) as model:
        assert [a.kind for a in model.evidence.anomalies] == ["torch.tensor_out_of_storage"]
        with pytest.raises(tensorscope.TensorscopeError):
            model.read("w")


def test_without_code_names_still_come_from_the_object_graph(tmp_path):
    path = _rewrite(DIR / "ts_scripted.pt", tmp_path / "nocode.pt", drop=("/code/",))
    with tensorscope.open(path) as model:
        assert model.format == "torchscript"  # constants.pkl still marks it
        assert "leaf.lin.weight" in model and model.tensor("leaf.lin.weight").role == "tensor"
        kinds = {a.kind for a in model.evidence.anomalies}
        assert kinds == {"torchscript.class_without_code"}


def test_code_is_never_run(tmp_path):
    """A code file with a side effect is text: the audit hook sees no compile/exec/import."""
    evil = 'import os\nos.system("echo pwned")\nclass Scripted(Module):\n  __parameters__ = ["w", ]\n'
    path = _rewrite(DIR / "ts_scripted.pt", tmp_path / "evil.pt",
                    replace={"/code/__torch__/gen_containers.py": lambda d: d + evil.encode()})
    with _open(path) as model:
        assert "os.system" in "".join(model.evidence.code.values())
        assert model.tensor("w").role == "parameter"


def test_big_endian_archive(tmp_path):
    """byteorder 'big': values come back through a byte-swapping reader (a copy)."""
    def swap(data):
        return b"".join(struct.pack(">f", v) for v in struct.unpack(f"<{len(data) // 4}f", data))
    path = _rewrite(DIR / "ts_scripted.pt", tmp_path / "big.pt",
                    replace={"/byteorder": lambda d: b"big", "/data/0": swap})
    m = _jit(DIR / "ts_scripted.pt")
    with tensorscope.open(path) as model:
        assert model.metadata["byteorder"] == "big"
        assert model.read("w").tolist() == m.w.tolist()


def test_inspect_json(capsys):
    import json
    assert cli.main(["inspect", str(DIR / "ts_traced.pt"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["format"] == "torchscript"
    assert "conv.weight" in [t["name"] for t in doc["tensors"]]


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
def test_shared_attribute_values_are_walked_once(tmp_path):
    """Hostile: 2000 attributes share one list of 20000 items (one BINGET each). A walk per
    reference would cost 4e7 steps; the listing stays linear."""
    import pickle
    import time
    import types

    fake = types.ModuleType("__torch__")

    class M:
        pass
    M.__module__, M.__qualname__ = "__torch__", "M"
    fake.M = M
    sys.modules["__torch__"] = fake
    try:
        shared = list(range(20000))
        obj = M()
        obj.__dict__.update({f"a{i}": shared for i in range(2000)}, training=True)
        data = pickle.dumps(obj, protocol=2)
    finally:
        del sys.modules["__torch__"]
    path = tmp_path / "dag.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("dag/data.pkl", data)
        z.writestr("dag/constants.pkl", pickle.dumps((), protocol=2))
        z.writestr("dag/code/__torch__.py", "class M(Module):\n  __parameters__ = []\n"
                                            "  __buffers__ = []\n")
    t0 = time.perf_counter()
    with tensorscope.open(path) as model:
        assert model.tensors == [] and model.evidence.anomalies == []
    assert time.perf_counter() - t0 < 15  # a walk per attribute: 4e7 steps, minutes
