"""Legacy torch checkpoints (pickle stream and tar): our listing and values against torch.load."""
from __future__ import annotations

import io
import pickle
import pickletools
import struct
import tarfile

import numpy as np
import pytest
import torch

import tensorscope
from tensorscope import cli
from tensorscope.parsers import torch_legacy
from helpers import audited_open
from torch_oracle import FIXTURES, dtype_name, flatten, our_bytes, stored_bytes

DIR = FIXTURES / "containers"
LEGACY = sorted(p.name for p in DIR.glob("legacy_*.pt"))

# Parsed under an audit hook: exec/compile/import of a new module fail (helpers.py).
_open = audited_open


def _oracle(path):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flatten(torch.load(path, weights_only=False, map_location="cpu"))


@pytest.mark.parametrize("name", LEGACY)
def test_matches_torch_load(name):
    path = DIR / name
    expected = _oracle(path)
    raw = path.read_bytes()
    with _open(path) as model:
        assert model.format == "torch-legacy"
        ours = {t.name: t for t in model.tensors}
        assert set(ours) == set(expected)
        for tname, t in expected.items():
            info = ours[tname]
            assert (info.dtype, info.shape, info.stride, info.storage_offset) == \
                (dtype_name(t), tuple(t.shape), t.stride(), t.storage_offset()), tname
            assert our_bytes(model.read(tname)) == stored_bytes(t), tname
            if t.is_contiguous() and t.numel():
                # The bytes at our absolute offset are the tensor's bytes, no reader involved.
                assert raw[info.byte_offset:info.byte_offset + info.nbytes] == stored_bytes(t), tname


@pytest.mark.parametrize("name, container, protocol", [
    ("legacy_dtypes.pt", "stream", 2), ("legacy_views.pt", "stream", 2),
    ("legacy_p4.pt", "stream", 4), ("legacy_module.pt", "stream", 2), ("legacy_tar.pt", "tar", 2),
])
def test_metadata(name, container, protocol):
    with tensorscope.open(DIR / name) as model:
        assert model.metadata["container"] == container
        assert model.metadata["pickle_protocol"] == protocol
        assert model.evidence.anomalies == []
        roles = [p.role for p in model.evidence.pickles]
        assert "legacy.main" in roles
        if container == "stream":
            assert roles == ["legacy.magic", "legacy.protocol", "legacy.sys_info", "legacy.main",
                             "legacy.storage_keys"]
            assert model.metadata["sys_info"]["little_endian"] is True


def test_storage_offsets_follow_the_sorted_key_list():
    """Keys sort as strings; each storage is an int64 count then raw bytes, no alignment."""
    path = DIR / "legacy_views.pt"
    raw = path.read_bytes()
    with tensorscope.open(path) as model:
        table = model.extras["storages"]
        keys = [row["key"] for row in table]
        assert keys == sorted(keys)
        pos = model.metadata["data_offset"]
        for row in table:
            count = struct.unpack_from("<q", raw, pos)[0]
            assert row["byte_offset"] == pos + 8
            pos += 8 + row["nbytes"]
            assert row["nbytes"] % count == 0 if count else row["nbytes"] == 0
        assert pos == len(raw)
        # Views share one storage: same storage key, offsets differ by storage_offset * 4.
        base, sl = model.tensor("base"), model.tensor("slice")
        assert base.storage_key == sl.storage_key and sl.byte_offset == base.byte_offset + 5 * 4


def test_views_are_zero_copy():
    with tensorscope.open(DIR / "legacy_views.pt") as model:
        a, b = model.read("matrix"), model.read("transposed")
        assert not a.flags.owndata and not a.flags.writeable and np.shares_memory(a, b)


def test_whole_module_keeps_source_as_evidence():
    with tensorscope.open(DIR / "legacy_module.pt") as model:
        code = model.evidence.code
        assert "class LegacyNet(nn.Module)" in code["module:gen_containers.LegacyNet"]
        assert "module:torch.nn.modules.linear.Linear" in code
        assert model.tensor("body.0.weight").role == "parameter"
        assert model.tensor("running").role == "buffer"
        assert model.tensor("body.0.weight").extras["raw_path"] == \
            "_modules.body._modules.0._parameters.weight"


def test_tar_layout():
    with tensorscope.open(DIR / "legacy_tar.pt") as model:
        assert set(model.metadata["members"]) == {"sys_info", "pickle", "tensors", "storages"}
        assert model.tensor("weight_t").stride == (1, 4)
        assert "module:gen_containers.LegacyNet" in model.evidence.code
        with tarfile.open(DIR / "legacy_tar.pt") as tar:
            member = tar.getmember("storages")
            assert model.tensor("weight").byte_offset > member.offset_data


@pytest.mark.parametrize("head, expected", [
    (pickle.dumps(torch_legacy.MAGIC_NUMBER, protocol=2), True),
    (pickle.dumps(torch_legacy.MAGIC_NUMBER, protocol=4), True),
    (pickle.dumps(torch_legacy.MAGIC_NUMBER, protocol=0), True),
    (pickle.dumps(torch_legacy.MAGIC_NUMBER + 1, protocol=2), False),
    (pickle.dumps({"a": 1}, protocol=2), False),
    (b"PK\x03\x04" + bytes(100), False),
])
def test_sniff(head, expected):
    assert torch_legacy.sniff(head, len(head)) is expected


def test_sniff_tar():
    assert torch_legacy.sniff((DIR / "legacy_tar.pt").read_bytes()[:4096], 10240)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:") as tar:
        info = tarfile.TarInfo("readme.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    assert not torch_legacy.sniff(buf.getvalue()[:4096], len(buf.getvalue()))


# -- hostile and broken inputs ----------------------------------------------------------------------
def _pickle_ends(data: bytes, count: int = 5) -> list[int]:
    """Where each of the first ``count`` pickles of a stream ends (static walk: pickletools)."""
    ends, f = [], io.BytesIO(data)
    for _ in range(count):
        for op, _arg, pos in pickletools.genops(f):
            if op.name == "STOP":
                ends.append(pos + 1)
                break
        f.seek(ends[-1])
    return ends


def _stream(obj, protocol=2) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    return buf.getvalue()


def _storages(data: bytes, itemsizes: list[int]) -> list[tuple[int, bytes]]:
    ends = _pickle_ends(data)
    pos, out = ends[-1], []
    for item in itemsizes:
        count = struct.unpack_from("<q", data, pos)[0]
        out.append((count, data[pos + 8:pos + 8 + count * item]))
        pos += 8 + count * item
    assert pos == len(data)
    return out


def _run_cli(tmp_path, capsys, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    assert cli.main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert name in err
    return err


def test_truncated_in_storage_names_key_and_offset(tmp_path, capsys):
    data = (DIR / "legacy_dtypes.pt").read_bytes()
    with tensorscope.open(DIR / "legacy_dtypes.pt") as model:
        second = model.extras["storages"][1]
    cut = second["byte_offset"] + second["nbytes"] // 2
    err = _run_cli(tmp_path, capsys, "cut_storage.pt", data[:cut])
    assert f"storage '{second['key']}' (2 of 13)" in err
    assert f"at byte {second['byte_offset']}" in err
    assert f"truncated: storage '{second['key']}' (2 of 13)" in err
    assert f"needs {second['byte_offset'] + second['nbytes']} bytes, the file ends at {cut}" in err


def test_truncated_before_a_count(tmp_path, capsys):
    data = (DIR / "legacy_views.pt").read_bytes()
    with tensorscope.open(DIR / "legacy_views.pt") as model:
        last = model.extras["storages"][-1]
    err = _run_cli(tmp_path, capsys, "cut_count.pt", data[:last["byte_offset"] - 4])
    assert f"storage '{last['key']}'" in err and "its element count needs" in err


def test_truncated_main_pickle(tmp_path, capsys):
    data = (DIR / "legacy_views.pt").read_bytes()
    ends = _pickle_ends(data)
    err = _run_cli(tmp_path, capsys, "cut_pickle.pt", data[:ends[2] + 40])
    assert "at byte" in err and "pickle" in err


def test_wrong_protocol_version(tmp_path, capsys):
    data = _stream({"x": torch.ones(2)})
    ends = _pickle_ends(data)
    bad = data[:ends[0]] + pickle.dumps(1000, protocol=2) + data[ends[1]:]
    err = _run_cli(tmp_path, capsys, "version.pt", bad)
    assert "unsupported legacy protocol version 1000" in err and f"at byte {ends[0]}" in err


def test_key_listed_but_never_pickled(tmp_path, capsys):
    data = _stream({"x": torch.ones(2)})
    ends = _pickle_ends(data)
    (count, payload), = _storages(data, [4])
    bad = data[:ends[3]] + pickle.dumps(["999"], protocol=2) + struct.pack("<q", count) + payload
    err = _run_cli(tmp_path, capsys, "unknown_key.pt", bad)
    assert "storage '999' (1 of 1)" in err and "never names it" in err


def test_storage_referenced_but_not_stored(tmp_path):
    data = _stream({"x": torch.ones(2), "y": torch.zeros(3)})  # two float32 storages
    ends = _pickle_ends(data)
    keys = pickle.loads(data[ends[3]:ends[4]])
    (count, payload), _ = _storages(data, [4, 4])
    bad = data[:ends[3]] + pickle.dumps(keys[:1], protocol=2) + struct.pack("<q", count) + payload
    path = tmp_path / "missing.pt"
    path.write_bytes(bad)
    with tensorscope.open(path) as model:
        assert model.names == ["x", "y"]
        kinds = [a.kind for a in model.evidence.anomalies]
        assert "legacy.storage_missing" in kinds and "torch.storage_unreadable" in kinds
        missing = [t for t in model.tensors if t.byte_offset is None]
        assert len(missing) == 1 and missing[0].storage_key == keys[1]
        with pytest.raises(tensorscope.TensorscopeError, match="no stored bytes"):
            model.read(missing[0].name)


def test_count_mismatch_is_an_anomaly(tmp_path):
    data = _stream({"x": torch.arange(4, dtype=torch.int32)})
    ends = _pickle_ends(data)
    bad = data[:ends[4]] + struct.pack("<q", 3) + data[ends[4] + 8:ends[4] + 8 + 12]
    path = tmp_path / "mismatch.pt"
    path.write_bytes(bad)
    with tensorscope.open(path) as model:
        assert [a.kind for a in model.evidence.anomalies][:1] == ["legacy.storage_size_mismatch"]
        assert model.tensor("x").storage_nbytes == 12
        with pytest.raises(tensorscope.TensorscopeError, match="wants 16 bytes"):
            model.read("x")


def test_trailing_bytes_are_an_anomaly(tmp_path):
    path = tmp_path / "trailing.pt"
    path.write_bytes((DIR / "legacy_views.pt").read_bytes() + b"extra")
    with tensorscope.open(path) as model:
        assert [a.kind for a in model.evidence.anomalies] == ["legacy.trailing_bytes"]


def test_big_endian_writer(tmp_path):
    """sys_info little_endian False and big-endian counts: values come back byte-swapped (a copy)."""
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 0.5
    data = _stream({"x": x})
    ends = _pickle_ends(data)
    info = {"protocol_version": 1001, "little_endian": False,
            "type_sizes": {"short": 2, "int": 4, "long": 4}}
    payload = x.numpy().astype(">f4").tobytes()
    bad = (data[:ends[1]] + pickle.dumps(info, protocol=2) + data[ends[2]:ends[4]]
           + struct.pack(">q", 6) + payload)
    path = tmp_path / "big.pt"
    path.write_bytes(bad)
    with tensorscope.open(path) as model:
        assert [a.kind for a in model.evidence.anomalies] == ["legacy.big_endian"]
        arr = model.read("x")
        assert arr.tolist() == x.tolist()


def test_little_endian_counts_win_over_sys_info(tmp_path):
    """torch writes little-endian data whatever sys_info says: follow the loader."""
    x = torch.arange(3, dtype=torch.int64)
    data = _stream({"x": x})
    ends = _pickle_ends(data)
    info = {"protocol_version": 1001, "little_endian": False, "type_sizes": {}}
    path = tmp_path / "claims_big.pt"
    path.write_bytes(data[:ends[1]] + pickle.dumps(info, protocol=2) + data[ends[2]:])
    with tensorscope.open(path) as model:
        assert model.evidence.anomalies == []
        assert model.read("x").tolist() == [0, 1, 2]


def test_tar_missing_member(tmp_path, capsys):
    buf = io.BytesIO()
    with tarfile.open(DIR / "legacy_tar.pt") as src, tarfile.open(fileobj=buf, mode="w:") as dst:
        for member in src.getmembers():
            if member.name != "tensors":
                dst.addfile(member, src.extractfile(member))
    err = _run_cli(tmp_path, capsys, "no_tensors.pt", buf.getvalue())
    assert "no 'tensors' member" in err


def test_tar_truncated(tmp_path, capsys):
    data = (DIR / "legacy_tar.pt").read_bytes()
    with tarfile.open(DIR / "legacy_tar.pt") as tar:
        storages = tar.getmember("storages")
    err = _run_cli(tmp_path, capsys, "cut.tar.pt", data[:storages.offset_data + 100])
    assert "'storages' wants" in err


def test_hostile_main_pickle_stays_inert(tmp_path):
    """A legacy stream whose main pickle calls os.system: listed as evidence, never run."""
    data = _stream({"x": torch.ones(1)})
    ends = _pickle_ends(data)
    evil = b"\x80\x02cos\nsystem\nX\x07\x00\x00\x00echo hi\x85R."
    path = tmp_path / "evil.pt"
    path.write_bytes(data[:ends[2]] + evil + pickle.dumps([], protocol=2))
    model = _open(path)
    with model:
        main = next(p for p in model.evidence.pickles if p.role == "legacy.main")
        assert [g.dotted for g in main.result.globals] == ["os.system"]
        assert model.tensors == []
