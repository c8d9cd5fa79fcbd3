"""The undefined behaviour a file could trigger in the C extensions, each with its reproducing
input, and the contracts that keep the C honest (issue 24). The sanitizer job (`.ci/sanitize.sh`)
runs this file against an ASan+UBSan build: there any of these would be a report, here each
also holds the C to its Python twin's figures.

- `_diffkernel`: every dtype code read at an odd address (a safetensors header of odd length
  puts the data there), by the portable loop and by the AVX-512 pass, equal to an aligned copy;
  and `tensorscope diff` on odd-offset safetensors pairs equal to what torch computes.
- `_torchstep`: a tensor whose stride is ``(2**63-1,)`` (the storage bound's sum overflowed);
  a VM hook that empties the stack or the memo while the step waits on it; a resolver whose
  record class is not a tuple.
- `_zipscan`: members whose name is a str subclass with its own hash; ``prepended`` so large
  that the header offset overflows.
- The classes the C reads or fills have exactly the fields the C knows (else the step would
  silently be off).
"""
from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import struct
import zipfile

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorscope
from tensorscope import diffing
from tensorscope.parsers import pickle_vm, torch_pickle, torch_zip, zip_reader, zipfmt
from tensorscope.source import ByteSource

HAVE_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
needs_kernel = pytest.mark.skipif(diffing._KERNEL is None, reason="the compiled pass is not built")
needs_step = pytest.mark.skipif(pickle_vm._STEP is None, reason="the compiled step is not built")
needs_scan = pytest.mark.skipif(zipfmt._SCAN is None, reason="the compiled step is not built")


# -- the classes the C code reads ---------------------------------------------------------------
def _slots(cls) -> tuple[str, ...]:
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return tuple(cls.__slots__)


def test_every_class_the_c_reads_has_the_fields_the_c_knows():
    """A field added to (or removed from) StorageRef, TensorRef, TensorInfo, ZipMember or the
    record class would make `bind*` refuse the class and the compiled step silently stay off:
    here it fails, naming the class and the difference."""
    if not HAVE_CC:
        pytest.skip("no C compiler: the Python steps are the ones in use")
    from tensorscope import _torchstep, _zipscan
    from tensorscope.model import TensorInfo
    classes = {"StorageRef": torch_pickle.StorageRef, "TensorRef": torch_pickle.TensorRef,
               "TensorInfo": TensorInfo}
    for name, cls in classes.items():
        assert _slots(cls) == _torchstep.FIELDS[name], \
            f"{name}: Python has {_slots(cls)}, _torchstep.c fills {_torchstep.FIELDS[name]}"
    # Global: the C reads these three of its slots (and never makes one)
    assert set(_torchstep.FIELDS["Global"]) <= set(pickle_vm.Global.__slots__)
    assert _slots(zipfmt.ZipMember) == _zipscan.FIELDS["ZipMember"]
    assert torch_zip._Record._fields == _torchstep.FIELDS["_Record"] == _zipscan.FIELDS["_Record"]
    # and the steps are bound, not silently off
    assert pickle_vm._STEP is not None and zipfmt._SCAN is not None and diffing._KERNEL is not None


# -- _diffkernel: every code at any alignment ------------------------------------------------------
_RNG = np.random.default_rng(24)
_CODES = {  # code: (numpy dtype of the values, view the kernel is given)
    "e": (np.float16, np.uint16), "b": (ml_dtypes.bfloat16, np.uint16), "f": (np.float32, np.float32),
    "d": (np.float64, np.float64), "c": (np.int8, np.int8), "B": (np.uint8, np.uint8),
    "h": (np.int16, np.int16), "i": (np.int32, np.int32), "E": (ml_dtypes.float8_e5m2, np.uint8),
    "F": (ml_dtypes.float8_e4m3fn, np.uint8), "t": (ml_dtypes.float8_e4m3fnuz, np.uint8),
}


def _values(dtype, n: int) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return _RNG.integers(max(info.min, -1000), min(info.max, 1000), n).astype(dt)
    return (_RNG.standard_normal(n) * 3).astype(dt)


def _at_offset(arr: np.ndarray, offset: int) -> memoryview:
    """The bytes of ``arr`` starting ``offset`` bytes into a fresh buffer (any alignment)."""
    raw = bytearray(offset + arr.nbytes + 16)
    raw[offset:offset + arr.nbytes] = arr.tobytes()
    return memoryview(raw)[offset:offset + arr.nbytes]


def _table(dtype) -> bytes:
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64).tobytes()


@needs_kernel
@pytest.mark.parametrize("code", sorted(_CODES))
@pytest.mark.parametrize("avx512", [False, True])
def test_kernel_reads_every_code_at_any_address(code, avx512):
    dtype, _ = _CODES[code]
    k = diffing._KERNEL
    was = k.avx512(avx512)
    try:
        for n in (1, 7, 15, 16, 17, 511, 512, 513, 3000):
            a, b = _values(dtype, n), _values(dtype, n)
            ta = tb = _table(dtype) if code == "t" else b""
            want = k.stats(a.tobytes(), code, b.tobytes(), code, 1e-8, 1e-5, ta, tb)
            for off_a, off_b in ((1, 1), (1, 2), (3, 0), (0, 5), (7, 3)):
                # the tables at odd addresses too
                ta2 = _at_offset(np.frombuffer(ta, np.uint8), 3) if ta else b""
                got = k.stats(_at_offset(a, off_a), code, _at_offset(b, off_b), code, 1e-8,
                              1e-5, ta2, ta2)
                assert got == want, (code, n, off_a, off_b)
            if want is not None:   # and the figures are numpy's (float64 widening)
                x, y = a.astype(np.float64), b.astype(np.float64)
                assert want[5] == np.abs(x - y).max()
                assert want[8] == int((np.abs(x - y) > 1e-8 + np.abs(y) * 1e-5).sum())
    finally:
        k.avx512(was)


@needs_kernel
def test_kernel_mixed_codes_at_odd_addresses():
    """Two different codes: the AVX-512 pass widens both sides block by block (`widen`)."""
    k = diffing._KERNEL
    a, b = _values(np.float16, 2000), _values(np.float32, 2000)
    for avx512 in (False, True):    # (the two sum in different orders: each against itself)
        was = k.avx512(avx512)
        try:
            want = k.stats(a.view(np.uint16).tobytes(), "e", b.tobytes(), "f", 1e-8, 1e-5)
            assert k.stats(_at_offset(a, 1), "e", _at_offset(b, 3), "f", 1e-8, 1e-5) == want
        finally:
            k.avx512(was)


_ST_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
              "F64": torch.float64, "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16,
              "I32": torch.int32, "F8_E5M2": torch.float8_e5m2, "F8_E4M3": torch.float8_e4m3fn}


def _odd_safetensors(path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file whose header has an odd length (trailing blanks, which the format
    allows): every tensor's data starts at an odd offset of the file."""
    header, blobs, at = {}, [], 0
    code = {v: k for k, v in _ST_DTYPES.items()}
    for name, t in tensors.items():
        blob = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype.itemsize > 0 else b""
        header[name] = {"dtype": code[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    if len(text) % 2 == 0:
        text += b" "
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@needs_kernel
def test_diff_of_odd_offset_safetensors_for_every_kernel_dtype(tmp_path):
    """`tensorscope diff` on a pair whose data sit at odd offsets (the UBSan reproducer:
    "load of misaligned address"): figures equal to torch's, read through the real library."""
    from safetensors.torch import load_file
    n = 40_000      # past SMALL_BYTES: the compiled pass, not the byte comparison
    a, b = {}, {}
    for code, dt in _ST_DTYPES.items():
        if dt.is_floating_point:
            x = torch.randn(n, dtype=torch.float64) * 2
            y = x + torch.randn(n, dtype=torch.float64) * 0.01
        else:
            lo, hi = (0, 200) if dt == torch.uint8 else (-100, 100)
            x = torch.randint(lo, hi, (n,), dtype=torch.int64)
            y = torch.where(torch.rand(n) < 0.1, torch.randint(lo, hi, (n,)), x)
        a[f"t_{code}"], b[f"t_{code}"] = x.to(dt), y.to(dt)
    _odd_safetensors(tmp_path / "a.safetensors", a)
    _odd_safetensors(tmp_path / "b.safetensors", b)
    real_a, real_b = load_file(tmp_path / "a.safetensors"), load_file(tmp_path / "b.safetensors")
    with tensorscope.open(tmp_path / "a.safetensors") as m:
        assert m.tensors[0].byte_offset % 2 == 1    # every tensor at an odd offset
    result = diffing.diff_models(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    by_name = {e.name_a: e for e in result.entries}
    for name in a:
        x, y = real_a[name].to(torch.float64), real_b[name].to(torch.float64)
        d = (x - y).abs()
        v = by_name[name].values
        assert v is not None, name
        assert v.max_abs == pytest.approx(d.max().item(), rel=0, abs=0), name
        assert v.mean_abs == pytest.approx(d.mean().item(), rel=1e-9), name
        assert v.mismatched == int((d > 1e-8 + y.abs() * 1e-5).sum()), name


# -- _torchstep ----------------------------------------------------------------------------------
def _rewritten(archive: bytes, change) -> bytes:
    """The archive with its data.pkl passed through ``change`` (members rewritten STORED)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as zin, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info.filename, change(data) if info.filename.endswith("data.pkl")
                          else data)
    return out.getvalue()


def _huge_stride_checkpoint(tmp_path):
    """{"w": a 2-element float tensor} whose stride is rewritten to (2**63-1,) (LONG1): the
    storage bound first + (2-1)*stride + 1 does not fit int64."""
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    huge = b"\x8a\x08" + (2 ** 63 - 1).to_bytes(8, "little") + b"\x85"

    def change(pkl):
        new, count = re.subn(rb"K\x02\x85(q.|\x94)K\x01\x85", lambda m: b"K\x02\x85" + m.group(1)
                             + huge, pkl, flags=re.S)
        assert count == 1
        return new
    path = tmp_path / "huge_stride.pt"
    path.write_bytes(_rewritten(buf.getvalue(), change))
    return path


def _listing(path, monkeypatch, compiled: bool):
    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(pickle_vm, "_STEP", None)
        with tensorscope.open(path, listing=True) as model:
            return ([(t.name, t.dtype, t.shape, t.stride, t.storage_offset, t.byte_offset,
                      t.nbytes, dict(t.extras)) for t in model.tensors],
                    [(a.kind, a.message) for a in model.evidence.anomalies])


@needs_step
def test_a_stride_of_int64_max_is_out_of_its_storage_both_ways(tmp_path, monkeypatch):
    path = _huge_stride_checkpoint(tmp_path)
    compiled, python = _listing(path, monkeypatch, True), _listing(path, monkeypatch, False)
    assert compiled == python
    tensors, anomalies = compiled
    assert tensors[0][3] == (2 ** 63 - 1,)
    # the tensor does not fit its 2-element storage: the Python code reports it
    assert any("storage" in (kind + detail) for kind, detail in anomalies), anomalies


def _pickle_of(sd) -> tuple[bytes, bytes]:
    buf = io.BytesIO()
    torch.save(sd, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        name = next(n for n in z.namelist() if n.endswith("data.pkl"))
        return buf.getvalue(), z.read(name)


def _run_with_resolver(archive: bytes, data: bytes, **kw):
    arc = zip_reader.read_zip(ByteSource.from_bytes(archive))
    prefix = arc.torch_prefix()
    records = torch_zip.data_records(arc, prefix)
    load, storages = torch_zip.make_storage_resolver(arc, prefix, records=records)
    return load, pickle_vm.run(data, persistent_load=load, hooks=torch_pickle.rebuild_hooks(),
                               file="f", member="m", record_calls=False, **kw)


@needs_step
@pytest.mark.parametrize("what", ["stack", "memo"])
def test_a_hook_that_empties_the_vm_lists_is_caught_not_read(monkeypatch, what):
    """load_storage (Python) empties the stack or the memo while the compiled step waits on it:
    the step checks them again before it reads the stack top or the rebuild function."""
    archive, data = _pickle_of({f"w{i}": torch.ones(2) for i in range(3)})
    original = pickle_vm._VM.load_storage

    def emptying(self, pid, pos):
        got = original(self, pid, pos)
        getattr(self, what).clear()
        return got

    monkeypatch.setattr(pickle_vm._VM, "load_storage", emptying)
    monkeypatch.setattr(torch_zip, "make_storage_resolver", torch_zip.make_storage_resolver)
    arc = zip_reader.read_zip(ByteSource.from_bytes(archive))
    prefix = arc.torch_prefix()
    # no fast context: every storage goes through (the emptying) load_storage
    load, _ = torch_zip.make_storage_resolver(arc, prefix, records=None)
    with pytest.raises(Exception) as e:
        r = pickle_vm.run(data, persistent_load=load, hooks=torch_pickle.rebuild_hooks(),
                          file="f", member="m", record_calls=False)
        r.raise_for_error()
    assert "changed the VM" in str(e.value) or isinstance(e.value, tensorscope.TensorscopeError)


@needs_step
@pytest.mark.parametrize("record_type", [dict, object, bytes, type("T", (tuple,), {"__slots__": ()})])
def test_a_record_class_that_is_not_the_record_layout_hands_over_to_python(record_type):
    """The fast context's record class is checked to be a tuple with tuple's layout before any
    record is read by position; anything else leaves the storage to the Python resolver."""
    archive, data = _pickle_of({f"w{i}": torch.full((2,), float(i)) for i in range(4)})
    load, want = _run_with_resolver(archive, data)
    storages, records, prefix, path, dtypes, modules, _ = load.torch_fast
    # records of that class: a tuple subclass holds the same items, the others none
    fake = {k: record_type(rec) if issubclass(record_type, tuple) else record_type()
            for k, rec in records.items()}
    arc = zip_reader.read_zip(ByteSource.from_bytes(archive))
    load2, storages2 = torch_zip.make_storage_resolver(arc, arc.torch_prefix(),
                                                       records=dict(records))
    load2.torch_fast = (storages2, fake, prefix, path, dtypes, modules, record_type)
    got = pickle_vm.run(data, persistent_load=load2, hooks=torch_pickle.rebuild_hooks(),
                        file="f", member="m", record_calls=False)
    assert got.error is None and want.error is None
    assert [(k, v.storage.key, v.shape) for k, v in got.value.items()] == \
        [(k, v.storage.key, v.shape) for k, v in want.value.items()]


@needs_step
def test_bind_torch_refuses_a_frozen_dict_with_its_own_new():
    class Odd(dict):
        __slots__ = ()

        def __new__(cls, *a):
            return dict.__new__(cls)

    from tensorscope.model import TensorInfo
    with pytest.raises(TypeError):
        pickle_vm._STEP.bind_torch(torch_pickle.StorageRef, torch_pickle.TensorRef,
                                   torch_pickle._rebuild_tensor_v2, torch_pickle._NO_EXTRAS,
                                   TensorInfo, Odd)


# -- _zipscan ------------------------------------------------------------------------------------
class _LoudStr(str):
    """A name whose hash and equality run Python code (that empties the list being read)."""
    victims: list = []

    def __hash__(self):
        for v in self.victims:
            v.clear()
        return str.__hash__(self)

    def __eq__(self, other):
        return str.__eq__(self, other)


@needs_scan
def test_exact_refuses_names_that_are_not_exact_strs():
    members = [zipfmt.ZipMember(f"m{i}", f"m{i}".encode(), i, 0, 30, 0, 0, 0, 0, 0)
               for i in range(50)]
    members[10].name = _LoudStr("m10")
    _LoudStr.victims = [members]
    try:
        assert zipfmt._SCAN.exact(members, len(members)) is None   # left to the Python code
    finally:
        _LoudStr.victims = []
    assert len(members) == 50


@needs_scan
def test_scan_with_an_overflowing_prepended_reads_nothing():
    buf = io.BytesIO()
    torch.save({"w": torch.ones(3)}, buf)
    data = buf.getvalue()
    cd = data.find(b"PK\x01\x02")
    eocd = data.rfind(b"PK\x05\x06")
    for prepended in (2 ** 63 - 1, 2 ** 63 - 31, 2 ** 62):
        members: list = []
        pos, first, _ = zipfmt._SCAN.scan(data, len(data), data[cd:eocd], cd, 0, members,
                                          prepended, 1000, -1, [])
        assert members == [] and first == -1 and pos == 0


@needs_kernel
@pytest.mark.parametrize("code", sorted(set(_CODES) - {"t"}))
def test_spectrum_reads_every_code_at_any_address(code):
    """The rank test's C step (`spectrum`) on samples at odd addresses gives what it gives on
    aligned copies (under the sanitizer job: no misaligned load, no out-of-bounds read)."""
    dtype, _ = _CODES[code]
    k = diffing._KERNEL
    for s, c in ((1, 1), (3, 7), (17, 5), (40, 60)):
        a, b = _values(dtype, s * c), _values(dtype, s * c)
        for certify in (False, True):
            want = k.spectrum(a.tobytes(), code, b.tobytes(), code, s, c, 2.0 ** -11, certify)
            for off in (1, 3, 5):
                got = k.spectrum(_at_offset(a, off), code, _at_offset(b, off + 2), code, s, c,
                                 2.0 ** -11, certify)
                assert got == want, (code, s, c, off)
