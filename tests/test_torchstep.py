"""The compiled torch step (tensorscope/_torchstep.c) against the Python step
(`pickle_vm._VM.torch_tensor`) and the opcode-by-opcode run (`pickle_vm._FAST_TORCH = False`):
the VM's whole result (value, opcode count, globals, calls and persistent ids when recorded,
error message and offset), its memo and stacks (the stacks of a successful run), the resolver's
storages, and the model a file opens to (every TensorInfo field, anomalies, `inspect --json`)
must be the same all three ways.

Inputs: every torch fixture, the attack corpus (tests/make_attack_corpus.py), hypothesis state
dicts saved by torch (protocols 2 and 4), and their data.pkl damaged by hypothesis (cut short,
bytes flipped inside tensor sequences, memo indices changed, huge ints, wrong tuple arity, low
limits), run with the real resolver of the undamaged archive, so that the compiled step's own
storage and record paths are the ones exercised.
"""
from __future__ import annotations

import contextlib
import io
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorscope import cli, formats
from tensorscope.parsers import (pickle_hooks, pickle_torchpath, pickle_vm, torch_pickle, torch_zip,
                                zip_reader, zipfmt)
from tensorscope.source import ByteSource
from torch_oracle import FIXTURES

from test_random_checkpoints import state_dicts  # noqa: E402
from test_vm_torch_step import _shown  # noqa: E402

needs_step = pytest.mark.skipif(pickle_vm._STEP is None, reason="the compiled step is not built")
MODES = ("compiled", "python", "slow")   # the compiled step; the Python step; neither


@contextlib.contextmanager
def _mode(mode: str, monkeypatch):
    with monkeypatch.context() as m:
        if mode != "compiled":
            m.setattr(pickle_vm, "_STEP", None)
        m.setattr(pickle_vm, "_FAST_TORCH", mode != "slow")
        yield


def _zip_pickle(archive_bytes: bytes) -> tuple[bytes, str]:
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as z:
        name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
        return z.read(name), name


def _storage(s):
    return ("storage", s.key, s.dtype, s.numel, s.location, s.file, s.member, s.data_offset,
            s.nbytes, s.error)


def _value(v, depth=0):
    """`_shown`, with every field of a storage (the compiled step makes them itself)."""
    if type(v) is torch_pickle.TensorRef:
        return (_shown(v), None if v.storage is None else _storage(v.storage))
    if depth < 40 and type(v) is dict:
        return ("dict", [(_shown(k), _value(x, depth + 1)) for k, x in v.items()])
    if depth < 40 and type(v) in (list, tuple):
        return (type(v).__name__, [_value(x, depth + 1) for x in v])
    return _shown(v)


def vm_picture(archive_bytes: bytes, data: bytes, mode: str, monkeypatch, *, recording=True,
               limits=pickle_vm.DEFAULT_LIMITS, torch_hooks=True):
    """Run ``data`` (a data.pkl, maybe damaged) with the resolver `torch_zip.open_zip` builds for
    ``archive_bytes`` in listing mode; a comparable picture of everything the run did."""
    archive = zip_reader.read_zip(ByteSource.from_bytes(archive_bytes))
    prefix = archive.torch_prefix()
    records = torch_zip.data_records(archive, prefix)
    load, storages = torch_zip.make_storage_resolver(archive, prefix, records=records)
    kw = dict(persistent_load=load, hooks=torch_pickle.rebuild_hooks()) if torch_hooks else {}
    vms = []
    execute = pickle_vm._VM.execute

    def keep(vm):   # the run's VM, for its memo and stacks (not part of the result)
        vms.append(vm)
        return execute(vm)

    with _mode(mode, monkeypatch):
        monkeypatch.setattr(pickle_vm._VM, "execute", keep)
        r = pickle_vm.run(data, file="f", member="m", limits=limits, record_calls=recording, **kw)
        monkeypatch.setattr(pickle_vm._VM, "execute", execute)
    vm = vms[0]
    memo = vm.memo.items() if type(vm.memo) is dict else enumerate(vm.memo)
    return {
        "memo": [(i, _value(x)) for i, x in memo],
        "stacks": [_value(x) for x in (*vm.metastack, vm.stack)],
        "value": _value(r.value), "opcodes": r.opcodes, "end": r.end, "stopped": r.stopped,
        "protocol": r.protocol, "error": None if r.error is None else str(r.error),
        "offset": None if r.error is None else r.error.offset,
        "globals": [(g.module, g.name, g.pos, g.opcode) for g in r.globals],
        "calls": [(_value(c.func), _value(c.args), c.kwargs, c.pos, c.opcode) for c in r.calls]
        if recording else None,
        "pids": [(_value(p), pos) for p, pos in r.persistent_ids] if recording else None,
        "disagreements": r.reader_disagreements,
        "storages": [(k, _storage(s)) for k, s in storages.items()],
    }


def same_vm_every_way(archive_bytes: bytes, data: bytes, monkeypatch, label="", **kw):
    compiled, python, slow = (vm_picture(archive_bytes, data, mode, monkeypatch, **kw)
                              for mode in MODES)
    assert compiled == python, label
    if compiled["error"] is not None:
        # A step that fails has not pushed its MARKs and items, as the opcode loop had by then:
        # the VM's stacks after a failure are not part of the result (the memo is).
        compiled = {k: v for k, v in compiled.items() if k != "stacks"}
        slow = {k: v for k, v in slow.items() if k != "stacks"}
    assert compiled == slow, label
    return compiled


def model_picture(path: Path, mode: str, monkeypatch, light: bool):
    with _mode(mode, monkeypatch):
        try:
            model = formats.open_model(str(path), listing=light)
        except Exception as e:  # the same failure every way
            return ("error", type(e).__name__, str(e))
    tensors = [tuple(getattr(t, f) for f in t.__slots__ if f != "extras") + (dict(t.extras),)
               for t in model.tensors]
    return (model.format, tensors, [(a.kind, a.message, a.file, a.member, a.offset)
                                    for a in model.evidence.anomalies], model.metadata)


def json_picture(path: Path, mode: str, monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    with _mode(mode, monkeypatch), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        rc = cli.main(["inspect", "--json", str(path)])
    return rc, out.getvalue(), err.getvalue()


def same_model_every_way(path: Path, monkeypatch):
    for light in (True, False):
        pictures = [model_picture(path, mode, monkeypatch, light) for mode in MODES]
        assert pictures[0] == pictures[1], (path, light)
        assert pictures[0] == pictures[2], (path, light)
    jsons = [json_picture(path, mode, monkeypatch) for mode in MODES]
    assert jsons[0] == jsons[1] == jsons[2], path


def _torch_zips(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and zipfile.is_zipfile(p):
            try:
                with zipfile.ZipFile(p) as z:
                    if any(n.endswith("/data.pkl") for n in z.namelist()):
                        out.append(p)
            except (zipfile.BadZipFile, ValueError, OSError):
                continue
    return out


TORCH_FIXTURES = _torch_zips(FIXTURES)


def test_the_compiled_step_is_built_where_a_compiler_is():
    # `pip install` builds tensorscope/_torchstep.c (optional: without a compiler the Python step
    # runs). Where a C compiler exists, a missing step is a broken build.
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python step is the one in use")
    assert pickle_vm._STEP is not None, ("tensorscope/_torchstep.c is not built, or its build is "
                                         "stale (ABI): run pip install -e . again")


@needs_step
def test_bind_refuses_classes_without_the_slots():
    class NotAGlobal:
        __slots__ = ("module",)

    class NotAStorage:
        __slots__ = ("key", "dtype")

    with pytest.raises(TypeError):
        pickle_vm._STEP.bind_vm(NotAGlobal, {}, pickle_torchpath._small_tuple,
                                pickle_hooks._ordered_dict)
    with pytest.raises(TypeError):
        pickle_vm._STEP.bind_torch(NotAStorage, torch_pickle.TensorRef,
                                   torch_pickle._rebuild_tensor_v2, torch_pickle._NO_EXTRAS,
                                   torch_pickle.TensorInfo, torch_pickle.FrozenDict)


@needs_step
def test_the_compiled_step_runs_on_what_torch_saves(monkeypatch, tmp_path):
    """Not a test that cannot fail: on a torch.save state dict the compiled step takes every
    tensor (the Python step is never called), and the records come from its own builder."""
    buf = io.BytesIO()
    torch.save({f"layers.{i}.w": torch.ones(2, 3) for i in range(300)}, buf)
    data, _ = _zip_pickle(buf.getvalue())
    path = tmp_path / "sd.pt"
    path.write_bytes(buf.getvalue())

    def refuse(*a, **k):
        raise AssertionError("the Python step ran")

    monkeypatch.setattr(pickle_vm._VM, "torch_tensor", refuse)
    monkeypatch.setattr(pickle_vm._VM, "load_storage", refuse)
    monkeypatch.setattr(pickle_vm._VM, "reduce_global", refuse)
    monkeypatch.setattr(torch_pickle, "to_tensor_info", refuse)
    r = vm_picture(buf.getvalue(), data, "compiled", monkeypatch, recording=False)
    assert r["error"] is None and len(r["storages"]) == 300
    model = formats.open_model(str(path), listing=True)
    assert [t.name for t in model.tensors] == [f"layers.{i}.w" for i in range(300)]


@pytest.mark.parametrize("path", TORCH_FIXTURES, ids=[str(p.relative_to(FIXTURES)) for p in
                                                      TORCH_FIXTURES])
def test_fixtures_every_way(path, monkeypatch):
    data = path.read_bytes()
    pkl, _ = _zip_pickle(data)
    for recording in (True, False):
        same_vm_every_way(data, pkl, monkeypatch, path.name, recording=recording)
    same_vm_every_way(data, pkl, monkeypatch, path.name, torch_hooks=False)
    same_model_every_way(path, monkeypatch)


@pytest.fixture(scope="module")
def corpus(attack_corpus):
    return sorted(p for p in attack_corpus.root.rglob("*") if p.is_file())


def test_attack_corpus_every_way(corpus, attack_corpus, monkeypatch):
    zips = 0
    torch_zips = set(_torch_zips(attack_corpus.root))   # once, not the folder again per file
    for path in corpus:
        if path in torch_zips and path.stat().st_size < (8 << 20):
            zips += 1
            data = path.read_bytes()
            try:
                pkl, _ = _zip_pickle(data)
                zip_reader.read_zip(ByteSource.from_bytes(data)).torch_prefix()
            except Exception:
                pkl = None
            if pkl is not None:
                try:
                    same_vm_every_way(data, pkl, monkeypatch, path.name, recording=False)
                except zipfmt.FormatError:
                    pass    # not a zip our reader opens: the model comparison covers it
        same_model_every_way(path, monkeypatch)
    assert zips > 5


def _saved(sd, protocol: int) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf, pickle_protocol=protocol)
    return buf.getvalue()


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(sd=state_dicts(), protocol=st.sampled_from([2, 4]))
def test_random_state_dicts_every_way(sd, protocol, monkeypatch, tmp_path_factory):
    data = _saved(sd, protocol)
    pkl, _ = _zip_pickle(data)
    for recording in (True, False):
        same_vm_every_way(data, pkl, monkeypatch, recording=recording)
    path = tmp_path_factory.mktemp("sd") / "model.pt"
    path.write_bytes(data)
    same_model_every_way(path, monkeypatch)


_BYTES = st.sampled_from([0x00, 0x01, 0x04, 0x28, 0x29, 0x4a, 0x4b, 0x4d, 0x68, 0x6a, 0x71, 0x72,
                          0x74, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8c, 0x94, 0xff, 0x30, 0x58])


@st.composite
def damaged(draw):
    """A saved state dict and its data.pkl with one kind of damage inside its tensor sequences."""
    sd = draw(state_dicts())
    data = _saved(sd, draw(st.sampled_from([2, 4])))
    pkl, _ = _zip_pickle(data)
    seqs = [m.start() for m in pickle_torchpath._TORCH_TENSOR.finditer(pkl)] or [0]
    at = draw(st.sampled_from(seqs)) + draw(st.integers(0, 90))
    at = min(at, len(pkl) - 1)
    kind = draw(st.sampled_from(["cut", "flip", "memo", "huge", "arity", "insert", "key"]))
    if kind == "cut":
        out = pkl[:at]
    elif kind == "flip":
        out = pkl[:at] + bytes([draw(_BYTES)]) + pkl[at + 1:]
    elif kind == "memo":      # a GET/PUT argument pointing elsewhere
        i = pkl.find(b"h", at)
        i = i if i >= 0 else at
        out = pkl[:i + 1] + bytes([draw(st.integers(0, 255))]) + pkl[i + 2:]
    elif kind == "huge":      # an int opcode made a 4-byte one with an extreme value
        i = pkl.find(b"K", at)
        i = i if i >= 0 else at
        value = draw(st.sampled_from([0x7fffffff, 0x80000000, 0xffffffff, 0x10000]))
        out = pkl[:i] + b"J" + value.to_bytes(4, "little") + pkl[i + 2:]
    elif kind == "arity":     # TUPLE2 of a size or stride made TUPLE1/TUPLE3
        i = pkl.find(b"\x86", at)
        i = i if i >= 0 else at
        out = pkl[:i] + bytes([draw(st.sampled_from([0x85, 0x87]))]) + pkl[i + 1:]
    elif kind == "insert":
        out = pkl[:at] + bytes([draw(_BYTES)]) + pkl[at:]
    else:                     # a storage key that is not ASCII digits, or longer
        i = pkl.find(b"X\x01\x00\x00\x00", at)
        i = i if i >= 0 else at
        out = pkl[:i] + "X\x02\x00\x00\x00é".encode() + pkl[i + 6:] if draw(st.booleans()) \
            else pkl[:i] + b"X\x02\x00\x00\x0012" + pkl[i + 6:]
    return data, out


def _low(high: int, default: int):
    return st.one_of(st.integers(1, high), st.just(default))


_D = pickle_vm.DEFAULT_LIMITS
_LIMITS = st.builds(   # each limit low or not, so that each is the one that fails in some runs
    pickle_vm.Limits, max_opcodes=_low(400, _D.max_opcodes), max_memo=_low(80, _D.max_memo),
    max_stack=_low(40, _D.max_stack), max_objects=_low(40, _D.max_objects),
    max_depth=_low(6, _D.max_depth))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=damaged(), recording=st.booleans(), limited=st.booleans(), limits=_LIMITS)
def test_damaged_pickles_every_way(case, recording, limited, limits, monkeypatch):
    data, pkl = case
    same_vm_every_way(data, pkl, monkeypatch, recording=recording,
                      limits=limits if limited else pickle_vm.DEFAULT_LIMITS)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(sd=state_dicts(), limits=_LIMITS)
def test_low_limits_every_way(sd, limits, monkeypatch):
    data = _saved(sd, 2)
    pkl, _ = _zip_pickle(data)
    same_vm_every_way(data, pkl, monkeypatch, recording=False, limits=limits)


@pytest.mark.parametrize("resource,values", [
    ("max_opcodes", range(1, 260, 7)), ("max_memo", range(1, 60, 3)),
    ("max_objects", range(1, 50, 2)), ("max_depth", range(1, 7))])   # (the stack is checked
                                                                       # where it is short)
@pytest.mark.parametrize("protocol", [2, 4])
def test_each_limit_swept_every_way(resource, values, protocol, monkeypatch):
    sd = {"scalar": torch.tensor(1.0), "w": torch.ones(2, 3), "view": torch.arange(9.0)[3:7],
          "t": torch.ones(3, 2).t(), "big": torch.zeros(300, dtype=torch.int8)}
    data = _saved(sd, protocol)
    pkl, _ = _zip_pickle(data)
    errors = set()
    for value in values:
        limits = pickle_vm.Limits(**{resource: value})
        errors.add(same_vm_every_way(data, pkl, monkeypatch, f"{resource}={value}",
                                     recording=False, limits=limits)["error"])
    assert len(errors) > 1      # the limit was the failure in some runs, not in others


@needs_step
@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("resource,values", [
    ("max_memo", (4000, 6000, 6600, 9000, 13000)), ("max_objects", (2000, 3400, 5000, 8000)),
    ("max_opcodes", (4097, 20000, 40001, 52000))])
def test_checkpoints_fall_where_the_python_step_has_them(protocol, resource, values, monkeypatch):
    """Stack, memo and object limits are checked every 4096 dispatches of the loop. The compiled
    step runs several dispatches at once (tensors and the opcodes between them) and stops where
    the batch ends: the checks fall where the Python step has them (the opcode-by-opcode run
    dispatches more often, so its checks fall elsewhere: it is not compared here)."""
    sd = {f"layers.{i}.w": torch.ones(i % 3 + 1, 2) for i in range(1500)}
    data = _saved(sd, protocol)
    pkl, _ = _zip_pickle(data)
    errors = set()
    for value in values:
        limits = pickle_vm.Limits(**{resource: value})
        compiled, python = (vm_picture(data, pkl, mode, monkeypatch, recording=False,
                                       limits=limits) for mode in ("compiled", "python"))
        assert compiled == python, value
        errors.add(compiled["error"])
    assert len(errors) > 1
