"""The VM's one-step run of torch's tensor sequence (`pickle_vm._VM.torch_tensor`) against the
opcode-by-opcode run of the same bytes: every effect a consumer sees must be the same.

Inputs are real ``torch.save`` pickles (protocols 2 and 4, shapes of rank 0 to 5, offsets,
parameters, more than 256 memo entries, numels needing BININT), every fixture under
``fixtures/torch``, and those pickles cut short or with a byte changed inside a tensor sequence
(where a failure must be placed, and counted, as the opcode loop places and counts it).
"""
from __future__ import annotations

import io
import zipfile
from collections import OrderedDict

import pytest
import torch

from tensorscope.parsers import pickle_torchpath, pickle_vm, torch_pickle
from torch_oracle import FIXTURES


def _pickle_of(obj, protocol: int = 2) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name)


def _state_dicts():
    g = torch.Generator().manual_seed(0)
    many = {f"layers.{i}.w": torch.randn(2, 3, generator=g) for i in range(300)}  # LONG_BINPUT
    base = torch.arange(40, dtype=torch.float16)
    shapes = OrderedDict([
        ("scalar", torch.tensor(3.0)), ("vec", torch.ones(5)), ("cube", torch.ones(2, 3, 4)),
        ("five", torch.ones(1, 2, 1, 2, 3)), ("empty", torch.ones(0, 4)),
        ("view", base[7:19].view(3, 4)), ("strided", base.view(5, 8)[:, ::2]),
        ("big", torch.zeros(70_000, dtype=torch.int8)),   # numel and stride > 65535: BININT
        ("bf16", torch.ones(4, 4, dtype=torch.bfloat16)),
    ])
    params = torch.nn.Linear(3, 2).state_dict(keep_vars=True)    # Parameters around tensors
    grad = {"w": torch.ones(2, requires_grad=True)}
    return {"many": many, "shapes": shapes, "params": params, "grad": grad,
            "nested": {"a": [torch.ones(2), {"b": torch.zeros(3, 1)}], "c": (torch.ones(1),)}}


def _pickles():
    out = []
    for label, sd in _state_dicts().items():
        for protocol in (2, 4):
            out.append((f"{label}-p{protocol}", _pickle_of(sd, protocol)))
    for path in sorted((FIXTURES / "torch").iterdir()):
        try:
            with zipfile.ZipFile(path) as z:
                name = next((n for n in z.namelist() if n.endswith("/data.pkl")), None)
                if name is not None:
                    out.append((path.name, z.read(name)))
        except zipfile.BadZipFile:
            continue
    return out


PICKLES = _pickles()


def _shown(value, depth=0):
    """A comparable picture of a VM value (tensors by their fields, inert objects by kind)."""
    if depth > 40:
        return "..."
    kind = type(value)
    if kind is torch_pickle.TensorRef:
        s = value.storage
        return ("tensor", None if s is None else (s.key, s.dtype, s.numel, s.location),
                value.storage_offset, value.shape, value.stride, value.dtype,
                value.requires_grad, value.role, value.pos, dict(value.extras))
    if kind is torch_pickle.StorageRef:
        return ("storage", value.key, value.dtype, value.numel, value.location)
    if kind is pickle_vm.Global:
        return ("global", value.module, value.name, value.pos)
    if kind is pickle_vm.Call:
        return ("call", _shown(value.func, depth + 1), _shown(value.args, depth + 1), value.pos,
                value.opcode, _shown(value.state, depth + 1))
    if kind is pickle_vm.PersistentRef:
        return ("pid", _shown(value.pid, depth + 1), value.pos)
    if kind in (tuple, list):
        return (kind.__name__, [_shown(v, depth + 1) for v in value])
    if kind is dict:
        return ("dict", [(_shown(k, depth + 1), _shown(v, depth + 1)) for k, v in value.items()])
    return repr(value)


def _run(data: bytes, fast: bool, monkeypatch, *, torch_hooks: bool, **kw):
    monkeypatch.setattr(pickle_vm, "_FAST_TORCH", fast)
    storages: dict = {}

    def persistent_load(pid, pos):
        dtype, key, location, numel, _ = torch_pickle.parse_storage_pid(pid, pos)
        return storages.setdefault(key, torch_pickle.StorageRef(key, dtype, numel, location))

    if torch_hooks:
        kw.update(persistent_load=persistent_load, hooks=torch_pickle.rebuild_hooks())
    r = pickle_vm.run(data, file="f", member="m", **kw)
    return {
        "value": _shown(r.value), "opcodes": r.opcodes, "end": r.end, "stopped": r.stopped,
        "protocol": r.protocol, "error": None if r.error is None else str(r.error),
        "globals": [(g.module, g.name, g.pos, g.opcode) for g in r.globals],
        "calls": [(_shown(c.func), _shown(c.args), c.kwargs, c.pos, c.opcode) for c in r.calls],
        "pids": [(_shown(p), pos) for p, pos in r.persistent_ids],
        "disagreements": r.reader_disagreements,
    }


def _used(data: bytes) -> bool:
    return pickle_torchpath._TORCH_TENSOR.search(data) is not None


@pytest.mark.parametrize("torch_hooks", [True, False], ids=["torch", "bare"])
@pytest.mark.parametrize("label,data", PICKLES, ids=[p[0] for p in PICKLES])
def test_same_effects_as_the_opcode_loop(label, data, torch_hooks, monkeypatch):
    assert _run(data, True, monkeypatch, torch_hooks=torch_hooks) == \
        _run(data, False, monkeypatch, torch_hooks=torch_hooks)


def test_the_step_is_taken_on_torch_pickles(monkeypatch):
    """Not a test that cannot fail: the step must really run on what torch.save writes."""
    calls = []
    original = pickle_vm._VM.torch_tensor
    monkeypatch.setattr(pickle_vm, "_STEP", None)    # the Python step (test_torchstep: compiled)

    def spy(self, m, budget):
        out = original(self, m, budget)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(pickle_vm._VM, "torch_tensor", spy)
    for label in ("many-p2", "many-p4", "shapes-p2", "params-p4"):
        calls.clear()
        data = dict(PICKLES)[label]
        _run(data, True, monkeypatch, torch_hooks=True)
        # (a tensor whose memo indices cross 256 mixes BINPUT and LONG_BINPUT: left to the loop)
        assert calls and sum(calls) >= 0.9 * len(calls), label


def _damaged():
    data = dict(PICKLES)["shapes-p2"]
    first = data.index(b"((")
    out = [("cut", data[:cut]) for cut in range(first, first + 140, 3)]
    for at in range(first, first + 120):
        for byte in (0x00, 0x4b, 0x68, 0x71, 0x72, 0xff):
            if data[at] != byte:
                out.append((f"flip{at}-{byte}", data[:at] + bytes([byte]) + data[at + 1:]))
    return out


@pytest.mark.parametrize("torch_hooks", [True, False], ids=["torch", "bare"])
def test_damaged_sequences_fail_in_the_same_place(torch_hooks, monkeypatch):
    for label, data in _damaged():
        fast = _run(data, True, monkeypatch, torch_hooks=torch_hooks)
        slow = _run(data, False, monkeypatch, torch_hooks=torch_hooks)
        assert fast == slow, label


@pytest.mark.parametrize("limit", [5, 20, 33, 40, 61, 100, 301])
def test_opcode_limit_is_exact(limit, monkeypatch):
    data = dict(PICKLES)["shapes-p2"]
    limits = pickle_vm.Limits(max_opcodes=limit)
    assert _run(data, True, monkeypatch, torch_hooks=True, limits=limits) == \
        _run(data, False, monkeypatch, torch_hooks=True, limits=limits)
