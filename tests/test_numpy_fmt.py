"""NumPy .npy / .npz parser: differential against `numpy.load`, and hostile headers.

`np.load(allow_pickle=True)` is used only as the oracle on our own trusted object-array fixture.
"""
from __future__ import annotations

import io
import mmap
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import assert_mutants_fail_cleanly
import tensorscope
from tensorscope import dtypes
from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.parsers import numpy_fmt as N
from tensorscope.source import ByteSource

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "formats"
NPY_FILES = sorted(p.name for p in FIXTURES.glob("*.npy"))


def _open(path, **kw) -> tensorscope.ModelFile:
    return N.open_source(ByteSource(path), **kw)


def test_fixture_set_is_complete():
    assert {"f32.npy", "fortran.npy", "scalar.npy", "empty.npy", "bigendian.npy", "object.npy",
            "bf16.npy", "structured.npy", "v2.npy", "v3.npy"} <= set(NPY_FILES)


@pytest.mark.parametrize("name", NPY_FILES)
def test_npy_matches_numpy_load(name):
    path = FIXTURES / name
    model = _open(path)
    [t] = model.tensors
    assert t.name == N.ROOT_NAME and t.source_format == "npy"
    ref = np.load(path, allow_pickle=(name == "object.npy"))
    arr = model.read(t)
    assert arr.flags.writeable is False
    if t.dtype == "object":
        raw = path.read_bytes()
        assert t.shape == ref.shape
        assert arr.tobytes() == raw[t.byte_offset:]  # the raw pickle, never unpickled
    elif "numpy_descr" in t.extras:  # listed as raw bytes: one trailing dimension of itemsize
        assert t.dtype == "uint8" and t.shape == ref.shape + (ref.dtype.itemsize,)
        descr = t.extras["numpy_descr"]
        assert np.dtype(descr) == ref.dtype if ref.dtype.names is None else "(" in descr
        assert arr.tobytes() == np.ascontiguousarray(ref).tobytes()
    else:
        native = ref.dtype.newbyteorder("=")
        assert dtypes.numpy_dtype(t.dtype) == native
        assert arr.dtype == native and arr.shape == ref.shape
        assert arr.tobytes() == np.ascontiguousarray(ref.astype(native)).tobytes()
        if ref.ndim and ref.size:
            assert tuple(s // ref.itemsize for s in ref.strides) == t.stride  # Fortran honoured


def test_fortran_strides():
    t = _open(FIXTURES / "fortran3d.npy").tensors[0]
    assert (t.shape, t.stride, t.extras["fortran_order"]) == ((2, 3, 4), (1, 2, 6), True)


def test_big_endian_reads_native_copy():
    model = _open(FIXTURES / "bigendian.npy")
    t = model.tensors[0]
    assert t.extras["byteorder"] == "big" and t.name in model.custom_readers
    arr = model.read(t)
    np.testing.assert_array_equal(arr, np.load(FIXTURES / "bigendian.npy"))
    assert arr.dtype == np.dtype("<f8")


def test_zero_copy_and_read_only():
    path = FIXTURES / "f32.npy"
    model = _open(path)
    src = ByteSource(path)
    model.sources[src.path] = src
    arr = model.read(N.ROOT_NAME)
    assert isinstance(arr.base, mmap.mmap) and arr.flags.writeable is False


def test_object_array_pickle_goes_to_evidence():
    model = _open(FIXTURES / "object.npy")
    t = model.tensors[0]
    [rec] = model.evidence.pickles
    assert (rec.role, rec.offset, rec.length) == ("npy.object", t.byte_offset, t.nbytes)
    assert rec.member is None and rec.file == str(FIXTURES / "object.npy")


@pytest.mark.parametrize("name", ["plain.npz", "compressed.npz"])
def test_npz_matches_numpy_load(name):
    path = FIXTURES / name
    with tensorscope.open(path) as model:
        assert model.format == "npz"
        ref = np.load(path)
        assert model.names == list(ref.files)
        for t in model.tensors:
            arr = model.read(t)
            assert arr.flags.writeable is False
            assert arr.dtype == ref[t.name].dtype and arr.shape == ref[t.name].shape
            assert arr.tobytes() == ref[t.name].tobytes(), t.name
            assert t.storage_key == t.name + ".npy"
            if name == "plain.npz":  # stored: zero-copy at the member's absolute offset
                assert t.byte_offset is not None and t.name not in model.custom_readers
            else:  # compressed: a decompressing reader, no offset in the file
                assert t.byte_offset is None and t.name in model.custom_readers


def test_npz_stored_offsets_point_into_the_archive():
    path = FIXTURES / "plain.npz"
    raw = path.read_bytes()
    with tensorscope.open(path) as model:
        a = model.tensor("a")
        assert raw[a.byte_offset:a.byte_offset + a.nbytes] == np.load(path)["a"].tobytes()


def test_registry_identifies_npy():
    assert "npy" in tensorscope.identify(FIXTURES / "f64.npy")
    with tensorscope.open(FIXTURES / "f64.npy") as model:
        assert model.format == "npy" and model.read(N.ROOT_NAME).shape == (3, 4)


# -- hostile / malformed input --------------------------------------------------------------------------
def _npy(header: str | bytes, data: bytes = b"", *, version=(1, 0)) -> bytes:
    raw = header.encode("latin1") if isinstance(header, str) else header
    fmt = "<H" if version == (1, 0) else "<I"
    return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(raw)) + raw + data


GOOD = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
BAD = [
    ("bad_magic", b"\x93NUMPZ\x01\x00", 0, "bad magic b'\\x93NUMPZ', expected b'\\x93NUMPY'"),
    ("version4", _npy(GOOD, version=(4, 0)), 6,
     "unsupported .npy format version 4.0 (numpy reads 1.0, 2.0 and 3.0)"),
    ("length_truncated", b"\x93NUMPY\x02\x00\x10", 8, "truncated: the header length needs 4 bytes, 1 remain"),
    ("length_past_end", b"\x93NUMPY\x01\x00\xff\x00{}", 8,
     "truncated: the header (length 255) needs 265 bytes, the data ends at 12"),
    ("call_in_header", _npy("{'descr': __import__('os').system('x'), 'fortran_order': False, 'shape': ()}"),
     20, "cannot parse header: a name ('__import__') is not a literal"),
    ("syntax", _npy("{'descr': "), 20, "cannot parse header: unexpected 'end of header'"),
    ("float_dim", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}"), 62,
     "cannot parse header: unexpected character '.'"),
    ("deep", _npy("{'descr': " + "[" * 40 + "]" * 40 + "}"), 52,
     "cannot parse header: nested deeper than 32 levels"),
    ("not_dict", _npy("[1, 2]"), 10, "header is not a dictionary: list"),
    ("wrong_keys", _npy("{'descr': '<f4', 'shape': ()}"), 10,
     "header does not contain the correct keys: ['descr', 'shape']"),
    ("bad_shape", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}"), 10,
     "shape is not valid: [2]"),
    ("negative_dim", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}"), 10,
     "shape (-1,) has a negative dimension"),
    ("bad_fortran", _npy("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}"), 10,
     "fortran_order is not a valid bool: 0"),
    ("bad_descr", _npy("{'descr': '<q9', 'fortran_order': False, 'shape': ()}"), 10,
     "descr is not a valid dtype descriptor: '<q9' (data type '<q9' not understood)"),
    ("data_short", _npy(GOOD, b"\0" * 4), 67,
     "truncated: the array data (shape (2,) x 4-byte <f4) needs 75 bytes, the file ends at 71"),
    ("lying_shape", _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}"), 85,
     "truncated: the array data (shape (4294967296, 4294967296) x 8-byte <f8) needs 147573952589676413013 bytes, the file ends at 85"),
    ("bad_utf8_v3", _npy(b"{'descr': '\xff'}", version=(3, 0)), 23, "header is not valid UTF-8 (invalid start byte)"),
]


@pytest.mark.parametrize("label,blob,offset,reason", BAD, ids=[b[0] for b in BAD])
def test_bad_npy_exact_message(tmp_path, label, blob, offset, reason):
    path = tmp_path / f"{label}.npy"
    path.write_bytes(blob)
    with pytest.raises(FormatError) as info:
        _open(path)
    err = info.value
    assert (err.reason, err.offset) == (reason, offset)
    assert str(err) == f"npy: {path} at byte {offset}: {reason}"
    with pytest.raises(Exception):  # numpy refuses the same bytes
        np.load(path)


def test_huge_header_limit_and_escape(tmp_path):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }" + " " * 20000 + "\n"
    path = tmp_path / "big.npy"
    path.write_bytes(_npy(header, np.arange(2, dtype=np.float32).tobytes(), version=(2, 0)))
    with pytest.raises(LimitExceeded) as info:
        _open(path)
    assert info.value.reason == "header length exceeds the limit of 10000 (got 20058)"
    with pytest.raises(ValueError, match="max_header_size"):
        np.load(path)
    model = _open(path, max_header_size=30000)  # numpy's explicit escape, mirrored
    assert model.read(N.ROOT_NAME).tolist() == [0.0, 1.0]


def test_trailing_bytes_recorded(tmp_path):
    path = tmp_path / "trail.npy"
    path.write_bytes(_npy(GOOD, b"\0" * 8 + b"PK\x03\x04hidden"))
    model = _open(path)
    [a] = model.evidence.anomalies
    assert (a.kind, a.offset) == ("npy.trailing_bytes", 75)
    assert a.message == "10 bytes after the array data are not part of the array (numpy ignores them)"
    assert np.load(path).tolist() == [0.0, 0.0]  # numpy reads it happily


def test_python2_header(tmp_path):
    path = tmp_path / "py2.npy"
    path.write_bytes(_npy("{'descr': '<i2', 'fortran_order': False, 'shape': (3L,), }", b"\1\0\2\0\3\0"))
    model = _open(path)
    assert model.read(N.ROOT_NAME).tolist() == [1, 2, 3] and model.tensors[0].extras["py2_header"]
    with pytest.warns(UserWarning):
        assert np.load(path).tolist() == [1, 2, 3]


def test_npz_bad_member_does_not_hide_the_rest(tmp_path):
    path = tmp_path / "mixed.npz"
    good = io.BytesIO()
    np.save(good, np.arange(3, dtype=np.int32))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("ok.npy", good.getvalue())
        z.writestr("bad.npy", b"\x93NUMPY\x09\x00garbage")
    with tensorscope.open(path) as model:
        assert model.names == ["ok"]
        assert model.read("ok").tolist() == [0, 1, 2]
        bad = [a for a in model.evidence.anomalies if a.kind == "npz.bad_member"]
        assert [(a.member, a.message) for a in bad] == [
            ("bad.npy", "member cannot be read: unsupported .npy format version 9.0 (numpy reads 1.0, 2.0 and 3.0)")]


def test_npz_compressed_member_claims_more_than_it_holds(tmp_path):
    path = tmp_path / "short.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", _npy(GOOD, b"\0" * 4))
    with tensorscope.open(path) as model:
        assert model.names == []
        [a] = [a for a in model.evidence.anomalies if a.kind == "npz.bad_member"]
        assert a.message == "member cannot be read: array data needs 8 bytes (shape (2,) x 4-byte <f4), 4 remain"


def test_npz_object_member(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez_compressed(path, o=np.array([1, "x"], dtype=object), f=np.ones(2))
    with tensorscope.open(path) as model:
        o = model.tensor("o")
        assert o.dtype == "object" and o.shape == (2,)
        assert model.read("f").tolist() == [1.0, 1.0]
        [rec] = model.evidence.pickles
        assert (rec.role, rec.member) == ("npy.object", "o.npy")


def test_malicious_object_array_is_recorded_not_run(tmp_path):
    # A hand-made "object array" whose pickle calls os.system, followed by hidden bytes.
    payload = b"cos\nsystem\n(S'echo pwned'\ntR."
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    path = tmp_path / "evil.npy"
    path.write_bytes(_npy(header, payload + b"HIDDEN"))
    model = _open(path)
    t = model.tensors[0]
    assert (t.dtype, t.byte_offset, t.nbytes) == ("object", 10 + len(header), len(payload) + 6)
    [rec] = model.evidence.pickles
    assert rec.role == "npy.object" and rec.offset == t.byte_offset
    assert [g.dotted for g in rec.result.globals] == ["os.system"]
    assert [c.args for c in rec.result.calls] == [("echo pwned",)]
    [a] = model.evidence.anomalies
    assert (a.kind, a.offset) == ("npy.trailing_bytes", t.byte_offset + len(payload))


@pytest.mark.parametrize("seed", range(3))
def test_mutated_fixtures_never_raise_raw_exceptions(seed):
    assert_mutants_fail_cleanly(N.open_source, sorted(FIXTURES.glob("*.npy")), seed)


def _ragged():
    a = np.empty((2, 3), dtype=object)
    a[0, 0] = np.arange(5, dtype=np.float16)
    a[0, 1] = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    a[0, 2] = "text"
    a[1, 0] = {"weight": np.ones((2, 2), dtype=np.int64), "name": "x"}
    a[1, 1] = np.arange(4, dtype=">i4")
    a[1, 2] = None
    return a


def _element(ref, name: str, key: str):
    """The value np.load gives for one listed element name (``key[i, j].weight``)."""
    index, _, rest = name[len(key) + 1:].partition("]")
    value = ref[tuple(int(i) for i in index.split(","))]
    for part in filter(None, rest.split(".")):
        value = value[part]
    return value


@pytest.mark.parametrize("container", ["npy", "npz", "npz-compressed"])
def test_object_array_elements_are_listed_like_np_load_gives_them(tmp_path, container):
    # A ragged list of arrays saved with allow_pickle: each numeric element is a tensor of its own
    # (np.load(allow_pickle=True) is the oracle; we never unpickle).
    arr = _ragged()
    if container == "npy":
        path, key = tmp_path / "ragged.npy", N.ROOT_NAME
        np.save(path, arr, allow_pickle=True)
        ref = np.load(path, allow_pickle=True)
    else:
        path, key = tmp_path / "ragged.npz", "ragged"
        (np.savez_compressed if container == "npz-compressed" else np.savez)(path, ragged=arr)
        ref = np.load(path, allow_pickle=True)["ragged"]
    raw = path.read_bytes()
    with tensorscope.open(path) as model:
        names = [t.name for t in model.tensors]
        assert names == [key, f"{key}[0, 0]", f"{key}[0, 1]", f"{key}[1, 0].weight", f"{key}[1, 1]"]
        for t in model.tensors[1:]:
            want = _element(ref, t.name, key)
            got = model.read(t)
            assert got.shape == want.shape and t.shape == want.shape
            assert np.array_equal(got, want) and got.dtype == want.dtype.newbyteorder("=")
            if container == "npy" and t.extras["numpy_dtype"][0] == "<":  # zero-copy, file bytes
                assert raw[t.byte_offset:t.byte_offset + t.nbytes] == np.ascontiguousarray(want).tobytes(
                    order="F" if want.flags.f_contiguous and not want.flags.c_contiguous else "C")
        [rec] = model.evidence.pickles
        assert rec.role == "npy.object"
