"""Plain pickle files: numpy arrays and torch tensors listed without loading, against pickle.load."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import tensorscope
from tensorscope import cli
from tensorscope.parsers import plain_pickle
from helpers import audited_open
from torch_oracle import FIXTURES, dtype_name, our_bytes, stored_bytes

DIR = FIXTURES / "containers"
PLAIN = sorted(p.name for p in DIR.glob("plain_*.pkl"))

# Parsed under an audit hook: exec/compile/import of a new module fail (helpers.py).
_open = audited_open


def _flatten(obj, prefix=()):
    out = {}
    if isinstance(obj, (np.ndarray, torch.Tensor)):
        out[".".join(prefix)] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flatten(v, prefix + (str(k),)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_flatten(v, prefix + (str(i),)))
    return out


def _oracle(name):
    with open(DIR / name, "rb") as f:
        return _flatten(pickle.load(f))  # our own trusted fixture: the oracle may load it


@pytest.mark.parametrize("name", PLAIN)
def test_matches_pickle_load(name):
    expected = _oracle(name)
    raw = (DIR / name).read_bytes()
    with _open(DIR / name) as model:
        assert model.format == "pickle"
        ours = {t.name: t for t in model.tensors}
        assert set(ours) == set(expected)
        for tname, value in expected.items():
            info = ours[tname]
            arr = model.read(info)
            if isinstance(value, torch.Tensor):
                assert (info.dtype, info.shape, info.stride, info.storage_offset) == \
                    (dtype_name(value), tuple(value.shape), value.stride(), value.storage_offset())
                assert our_bytes(arr) == stored_bytes(value), tname
                continue
            assert info.dtype == value.dtype.name, tname
            assert info.shape == value.shape
            assert info.stride == tuple(s // value.itemsize for s in value.strides) or value.size <= 1
            assert arr.dtype == value.dtype.newbyteorder("=")
            assert np.array_equal(arr, value), tname
            if info.byte_offset is not None and value.size:
                # The bytes at our offset are the array's bytes in its stored order.
                order = info.extras["numpy_dtype"][0]  # '<' or '>': as stored in the file
                stored = value.astype(value.dtype.newbyteorder(order)).tobytes(
                    order="F" if info.extras["order"] == "F" else "C")
                assert raw[info.byte_offset:info.byte_offset + info.nbytes] == stored


@pytest.mark.parametrize("name, located", [
    ("plain_numpy_p2.pkl", False), ("plain_numpy_p3.pkl", True), ("plain_numpy_p4.pkl", True),
    ("plain_numpy_p5.pkl", True), ("plain_torch.pkl", False), ("plain_torch_p4.pkl", True),
])
def test_where_the_bytes_are(name, located):
    """Protocols 3+ store bytes verbatim (located, zero-copy); 0-2 as latin-1 text (copied)."""
    with tensorscope.open(DIR / name) as model:
        for info in model.tensors:
            if info.numel == 0:
                continue
            assert (info.byte_offset is not None) is located, info.name
            arr = model.read(info)
            assert not arr.flags.writeable
            big = info.extras.get("numpy_dtype", "").startswith(">")
            zero_copy = located and not big
            if zero_copy:
                assert not arr.flags.owndata  # a view over the file's map
            assert (info.name in model.custom_readers) is (not zero_copy), info.name


def test_big_endian_array_reads_native():
    with tensorscope.open(DIR / "plain_numpy_p4.pkl") as model:
        info = model.tensor("arrays.be_i32")
        assert info.extras["numpy_dtype"] == ">int32"
        arr = model.read(info)
        assert arr.dtype == np.dtype("<i4") and arr.tolist() == [0, 1, 2, 3]


def test_torch_tensors_are_nested_legacy_streams():
    with tensorscope.open(DIR / "plain_torch_p4.pkl") as model:
        roles = [p.role for p in model.evidence.pickles]
        assert roles[0] == "pickle"
        assert roles.count("nested.legacy.main") == 3
        w = model.tensor("w")
        assert w.stride == (1, 3) and w.dtype == "float32"
        assert model.tensor("slice").storage_offset == 2
        raw = (DIR / "plain_torch_p4.pkl").read_bytes()
        nested = [p for p in model.evidence.pickles if p.role == "nested.legacy.magic"]
        for p in nested:  # located: each nested stream's magic pickle is at its offset
            assert raw[p.offset:p.offset + 4] == b"\x80\x02\x8a\x0a"
        assert model.evidence.anomalies == []


def test_evidence_and_objects():
    with tensorscope.open(DIR / "plain_numpy_p4.pkl") as model:
        record, = model.evidence.pickles
        assert record.role == "pickle" and record.offset == 0 and record.result.stopped
        assert {g.dotted for g in record.result.globals} >= {"numpy.dtype"}
        assert model.objects["step"] == 10 and model.objects["names"] == ["a", "b"]
        assert model.metadata["pickle_protocol"] == 4
    with tensorscope.open(DIR / "plain_protocol0.pkl") as model:
        assert model.objects == {"lr": 0.1, "layers": [1, 2, 3], "name": "cfg"}
        assert model.tensors == []


@pytest.mark.parametrize("head, expected", [
    *[(pickle.dumps({"a": [1, 2]}, protocol=p), True) for p in range(6)],
    (pickle.dumps(list(range(2000)), protocol=4)[:4096], True),   # a FRAME longer than the head
    (b"(dp0\nS'a'\np1\nI1\ns.", True),
    (b"(hello world", False),
    (b'{"json": true}', False),
    (b"# a comment\n", False),
    (b"\x80\x06}.", False),
    (b"", False),
    (b"(lp0\nI1\naI2\na.", True),
])
def test_sniff(head, expected):
    assert plain_pickle.sniff(head[:4096], len(head)) is expected


# -- broken and hostile ---------------------------------------------------------------------------
def test_hostile_pickle_is_listed_never_run(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    with _open(path) as model:
        record, = model.evidence.pickles
        assert [g.dotted for g in record.result.globals] == ["os.system"]
        assert model.objects.args == ("echo pwned",)


def test_truncated_pickle(tmp_path, capsys):
    data = (DIR / "plain_numpy_p4.pkl").read_bytes()
    path = tmp_path / "cut.pkl"
    path.write_bytes(data[:300])
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cut.pkl" in err and "at byte" in err


def test_trailing_bytes(tmp_path):
    path = tmp_path / "two.pkl"
    path.write_bytes(pickle.dumps([1], protocol=2) + pickle.dumps([2], protocol=2))
    with tensorscope.open(path) as model:
        assert [a.kind for a in model.evidence.anomalies] == ["pickle.trailing_bytes"]
        assert model.evidence.anomalies[0].offset == len(pickle.dumps([1], protocol=2))


class _Mismatch:
    """A numpy array whose raw bytes do not fit its shape (numpy.load would fail)."""

    def __reduce__(self):
        from numpy._core.multiarray import _reconstruct
        return (_reconstruct, (np.ndarray, (0,), b"b"),
                (1, (3,), np.dtype("f4"), False, b"\0" * 8))


def test_numpy_size_mismatch_stays_an_object(tmp_path):
    path = tmp_path / "mismatch.pkl"
    path.write_bytes(pickle.dumps({"x": _Mismatch()}, protocol=4))
    with tensorscope.open(path) as model:
        assert model.tensors == []
        assert [a.kind for a in model.evidence.anomalies] == ["pickle.numpy_size_mismatch"]


def test_object_arrays_stay_objects(tmp_path):
    path = tmp_path / "objects.pkl"
    path.write_bytes(pickle.dumps({"o": np.array(["a", None], dtype=object),
                                   "s": np.array(["ab", "cd"]), "f": np.ones(2)}, protocol=4))
    with tensorscope.open(path) as model:
        assert model.names == ["f"]


def test_corrupt_nested_torch_storage_is_an_anomaly(tmp_path):
    """A torch tensor whose _load_from_bytes payload is not a torch stream stays inert."""
    class Bad:
        def __reduce__(self):
            from torch.storage import _load_from_bytes
            return (_load_from_bytes, (b"not a torch stream",))
    path = tmp_path / "bad_nested.pkl"
    path.write_bytes(pickle.dumps({"s": Bad()}, protocol=4))
    with tensorscope.open(path) as model:
        assert [a.kind for a in model.evidence.anomalies] == ["pickle.nested_unreadable"]
        assert model.tensors == []
