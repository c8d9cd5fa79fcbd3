"""NumPy arrays pickled under Python 2 (protocol 2, data in a py2 ``str``: SHORT_BINSTRING or
BINSTRING). No Python 2 here: the pickles are built opcode by opcode as Python 2.7's cPickle writes
them, and ``pickle.loads(data, encoding='latin1')`` (what np.load / joblib pass for py2 files) is
the oracle, in the test itself."""
from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest

import tensorscope


def _str(s: bytes) -> bytes:
    """A Python 2 ``str``: SHORT_BINSTRING below 256 bytes, BINSTRING above (as cPickle)."""
    if len(s) < 256:
        return b"U" + bytes([len(s)]) + s
    return b"T" + struct.pack("<i", len(s)) + s


def _int(n: int) -> bytes:
    return b"K" + bytes([n]) if 0 <= n < 256 else b"J" + struct.pack("<i", n)


def _dtype(a: np.ndarray) -> bytes:
    typestr = f"{a.dtype.kind}{a.dtype.itemsize}".encode()
    order = b"|" if a.dtype.itemsize == 1 else b"<"
    return (b"cnumpy\ndtype\n" + _str(typestr) + _int(0) + _int(1) + b"\x87R"
            + b"(" + _int(3) + _str(order) + b"NNN" + _int(-1) + _int(-1) + _int(0) + b"tb")


def _array(a: np.ndarray) -> bytes:
    """``numpy.core.multiarray._reconstruct(ndarray, (0,), 'b')`` + BUILD (1, shape, dtype,
    False, rawdata), as numpy 1.x under Python 2 pickles an array."""
    shape = b"(" + b"".join(_int(d) for d in a.shape) + b"t"
    return (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + _int(0) + b"\x85"
            + _str(b"b") + b"\x87R" + b"(" + _int(1) + shape + _dtype(a) + b"\x89"
            + _str(np.ascontiguousarray(a).tobytes()) + b"tb")


def py2_pickle(state: dict[str, np.ndarray]) -> bytes:
    body = b"}(" + b"".join(_str(k.encode()) + _array(v) for k, v in state.items()) + b"u"
    return b"\x80\x02" + body + b"."


ARRAYS = {
    # every byte ASCII: valid UTF-8, which a UTF-8-decoding VM would turn into text
    "ascii_int8": np.arange(32, 96, dtype=np.int8).reshape(8, 8),
    "ascii_float": np.frombuffer(b"ABCDEFGH" * 6, dtype=np.float64).reshape(2, 3),
    # multi-byte UTF-8 sequences, still valid UTF-8
    "utf8_uint16": np.frombuffer("é€😀ab".encode("utf-8") + b"c", dtype=np.uint16),
    # invalid UTF-8 (stays bytes either way)
    "binary": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    # over 255 bytes: BINSTRING, ASCII again
    "long": np.full((40, 10), 0x41, dtype=np.uint8),
}


def test_py2_arrays_match_pickle_latin1(tmp_path):
    data = py2_pickle(ARRAYS)
    expected = pickle.loads(data, encoding="latin1")   # the oracle: Python 3 reading Python 2
    assert list(expected) == list(ARRAYS)
    for k, v in expected.items():
        assert v.dtype == ARRAYS[k].dtype and np.array_equal(v, ARRAYS[k]), k
    path = tmp_path / "py2.pkl"
    path.write_bytes(data)
    with tensorscope.open(path) as model:
        assert model.format == "pickle"
        assert model.names == list(expected)   # none dropped
        for name, want in expected.items():
            info = model.tensor(name)
            got = model.read(name)
            assert info.shape == want.shape and got.dtype == want.dtype, name
            assert np.array_equal(got, want), name
            # the py2 str payload is verbatim in the file: a zero-copy view at its place
            assert info.byte_offset is not None, name
            assert data[info.byte_offset:info.byte_offset + info.nbytes] == want.tobytes(), name
        assert not model.evidence.anomalies


def test_array_whose_data_is_not_bytes_is_reported_not_dropped(tmp_path):
    """An array whose rawdata is neither bytes nor a py2 str (an int here) cannot be located:
    an anomaly names it instead of a silent drop (pickle.loads itself refuses it)."""
    a = np.zeros(2, dtype=np.float64)
    good = _array(a)
    bad = good.replace(_str(a.tobytes()), _int(7))
    data = b"\x80\x02}(" + _str(b"w") + bad + b"u."
    with pytest.raises(Exception):
        pickle.loads(data, encoding="latin1")
    path = tmp_path / "bad.pkl"
    path.write_bytes(data)
    with tensorscope.open(path) as model:
        assert model.names == []
        kinds = [a.kind for a in model.evidence.anomalies]
        assert kinds == ["pickle.numpy_unreadable"]
        assert "float64, shape [2]" in model.evidence.anomalies[0].message


# -- joblib < 0.10: arrays in sibling .npy files ---------------------------------------------------
def _wrapper(filename: str) -> bytes:
    """``joblib.numpy_pickle.NDArrayWrapper`` as joblib 0.8/0.9 pickled it under Python 2:
    NEWOBJ, then BUILD of {'filename': ..., 'subclass': numpy.ndarray, 'allow_mmap': True}."""
    return (b"cjoblib.numpy_pickle\nNDArrayWrapper\n)\x81}(" + _str(b"filename")
            + _str(filename.encode()) + _str(b"subclass") + b"cnumpy\nndarray\n"
            + _str(b"allow_mmap") + b"\x88ub")


def _zwrapper(filename: str, a: np.ndarray) -> bytes:
    """``ZNDArrayWrapper`` (joblib 0.8/0.9 with compress): BUILD of {'filename': ...,
    'init_args': (ndarray, (0,), 'b'), 'state': (1, shape, dtype, fortran)}; the data are in the
    sibling file."""
    shape = b"(" + b"".join(_int(d) for d in a.shape) + b"t"
    return (b"cjoblib.numpy_pickle\nZNDArrayWrapper\n)\x81}(" + _str(b"filename")
            + _str(filename.encode()) + _str(b"init_args") + b"cnumpy\nndarray\n" + _int(0)
            + b"\x85" + _str(b"b") + b"\x87" + _str(b"state") + b"(" + _int(1) + shape
            + _dtype(a) + b"\x89t" + b"ub")


def _write_zfile(path, raw: bytes) -> None:
    """joblib 0.9's write_zfile: 'ZF', the length in hex left-justified to 19 bytes, zlib."""
    import zlib
    path.write_bytes(b"ZF" + hex(len(raw)).encode().ljust(19) + zlib.compress(raw, 3))


class _Stub:
    """Stand-in for joblib's wrapper class in the oracle's unpickler (NEWOBJ + BUILD)."""


class _OracleUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "joblib.numpy_pickle":
            return _Stub
        return super().find_class(module, name)


def test_joblib_0_9_sibling_arrays(tmp_path):
    """What joblib 0.9's NDArrayWrapper.read does: np.load the sibling file it names."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    z = np.linspace(0, 1, 10, dtype=np.float64).reshape(2, 5)
    np.save(tmp_path / "model.pkl_01.npy", w)
    np.save(tmp_path / "model.pkl_02.npy", b)
    _write_zfile(tmp_path / "model.pkl_04.npy.z", z.tobytes())
    _write_zfile(tmp_path / "model.pkl_05.npy.z", b"short")
    data = (b"\x80\x02}(" + _str(b"w") + _wrapper("model.pkl_01.npy")
            + _str(b"b") + _wrapper("model.pkl_02.npy")
            + _str(b"gone") + _wrapper("model.pkl_03.npy")
            + _str(b"escape") + _wrapper("../model.pkl_01.npy")
            + _str(b"z") + _zwrapper("model.pkl_04.npy.z", z)
            + _str(b"zbad") + _zwrapper("model.pkl_05.npy.z", z) + b"u.")
    path = tmp_path / "model.pkl"
    path.write_bytes(data)
    import io
    import zlib
    tree = _OracleUnpickler(io.BytesIO(data), encoding="latin1").load()
    expected = {k: np.load(tmp_path / v.filename) for k, v in tree.items() if k in ("w", "b")}
    # ZNDArrayWrapper.read, as joblib 0.9 does it: numpy rebuilds the array from the wrapper's
    # init_args and state plus the inflated sibling
    zw = tree["z"]
    raw = (tmp_path / zw.filename).read_bytes()
    core = np._core if hasattr(np, "_core") else np.core   # numpy 2 / 1
    arr = core.multiarray._reconstruct(*zw.init_args)
    arr.__setstate__(zw.state + (zlib.decompress(raw[21:]),))
    expected["z"] = arr
    with tensorscope.open(path) as model:
        assert model.names == ["w", "b", "z"]
        for name, want in expected.items():
            got = model.read(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert np.array_equal(got, want), name
            assert model.tensor(name).file == str(tmp_path / tree[name].filename)
        assert model.tensor("w").byte_offset is not None   # .npy siblings: zero-copy
        messages = [a.message for a in model.evidence.anomalies if a.kind == "joblib.sibling_array"]
        assert len(messages) == 3   # missing, outside the folder, too short: each named
        assert any("model.pkl_03.npy" in m and "does not exist" in m for m in messages)
        assert any("../model.pkl_01.npy" in m and "not a plain file name" in m for m in messages)
        assert any("model.pkl_05.npy.z" in m and "do not hold shape [2, 5]" in m for m in messages)
