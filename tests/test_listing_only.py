"""`tensorscope.open(path, listing=True)`: a torch zip opened for listing (inspect, diff) keeps the same
tensor records and globals as a full open, drops the object tree and the per-call evidence, and
refuses loudly to be judged as if it had no calls."""
from __future__ import annotations

import pytest
import torch

import tensorscope
from tensorscope.parsers import pickle_vm
from torch_oracle import FIXTURES, flatten

TORCH_FILES = sorted(p for p in (FIXTURES / "torch").iterdir() if p.suffix in (".pt", ".bin"))


def _records(model):
    return [(t.name, t.dtype, t.shape, t.stride, t.storage_offset, t.byte_offset, t.nbytes,
             t.storage_key, t.storage_nbytes, t.role, t.path, dict(t.extras)) for t in model]


@pytest.mark.parametrize("path", TORCH_FILES, ids=[p.name for p in TORCH_FILES])
def test_same_records_and_globals_as_a_full_open(path):
    with tensorscope.open(path) as full:
        light = tensorscope.open(path, listing=True)
        with light:
            assert _records(light) == _records(full)
            assert light.format == full.format
            assert [a.kind for a in light.evidence.anomalies] == \
                [a.kind for a in full.evidence.anomalies]
            assert [[(g.module, g.name, g.pos) for g in r.result.globals]
                    for r in light.evidence.pickles] == \
                [[(g.module, g.name, g.pos) for g in r.result.globals]
                 for r in full.evidence.pickles]


def test_the_tree_and_call_evidence_are_not_kept(tmp_path):
    path = tmp_path / "sd.pt"
    sd = {f"w{i}": torch.full((2, 2), float(i)) for i in range(5)}
    torch.save(sd, path)
    model = tensorscope.open(path, listing=True)
    with model:
        assert model.objects is None
        assert [t.name for t in model] == list(flatten(sd))
        result = model.evidence.pickles[0].result
        for evidence in (result.calls, result.persistent_ids):
            with pytest.raises(pickle_vm.EvidenceNotKept):
                list(evidence)
            with pytest.raises(pickle_vm.EvidenceNotKept):
                bool(evidence)
        # the records read the values all the same
        assert model.read("w3").tolist() == sd["w3"].tolist()
    with tensorscope.open(path) as full:    # outside the context: everything is kept
        assert full.objects is not None and len(full.evidence.pickles[0].result.calls) == 10


@pytest.mark.parametrize("new", [b"m/DATA/0", b"m/Data/0"])
def test_records_found_as_the_archive_finds_them(tmp_path, new):
    """The records kept for a listing are looked up as miniz looks members up (ignoring ASCII
    case): a member whose name differs in case from the one the pickle asks for is still found,
    by torch.load and by both kinds of open."""
    path = tmp_path / "m.pt"
    torch.save({"w": torch.arange(6.0).view(2, 3)}, path)
    raw = path.read_bytes()
    assert raw.count(b"m/data/0") == 2          # local header and central directory
    path.write_bytes(raw.replace(b"m/data/0", new))
    expected = torch.load(path, weights_only=True)["w"].tolist()
    with tensorscope.open(path) as full:
        light = tensorscope.open(path, listing=True)
        with light:
            assert _records(light) == _records(full)
            assert light.read("w").tolist() == expected


def test_record_lookup_is_the_archive_lookup_rule():
    """`_record_lookup` (a name found as it is first) answers as the rule it shortcuts: the name
    up to a NUL, lowered, ASCII only."""
    from tensorscope.parsers.torch_zip import _record_lookup
    records = {"m/data/0": 0, "m/data/1": 1}
    lookup = _record_lookup(records)

    def rule(name):
        return records.get(name.split("\0", 1)[0].lower()) if name.isascii() else None

    for name in ("m/data/0", "M/DATA/1", "m/data/0\0x", "m/data/1\0", "m/data/2", "m/data/\u00e9",
                 "\0m/data/0", "m/dAta/0\0z"):
        assert lookup(name) == rule(name), name


def _renamed_archive(tmp_path, old: bytes, new: bytes):
    path = tmp_path / "r.pt"
    torch.save({f"w{i}": torch.full((2,), float(i)) for i in range(12)}, path)
    path.write_bytes(path.read_bytes().replace(old, new))
    return path


@pytest.mark.parametrize("old,new", [(b"r/data/1", b"r/DATA/1"), (b"r/data/11", b"r/data/\xc3\xa9"),
                                     (b"r/data/2", b"r/data/\x00"), (b"r/data/3", b"r/Data/3")])
def test_data_records_answer_as_the_archive(tmp_path, old, new):
    """`data_records` + `_record_lookup` find for every storage name what `ZipArchive.get` finds
    (or decline, None), on archives whose record names differ in case, are not ASCII or hold NUL."""
    from tensorscope.parsers import zip_reader
    from tensorscope.parsers.torch_zip import _record_lookup, data_records
    from tensorscope.source import ByteSource
    for path in [*TORCH_FILES, _renamed_archive(tmp_path, old, new)]:
        archive = zip_reader.read_zip(ByteSource(str(path)))
        prefix = archive.torch_prefix()
        records = data_records(archive, prefix)
        if records is None:
            continue
        lookup = _record_lookup(records)
        names = {m.name for m in archive.members} | {f"{prefix}/data/{k}" for k in range(14)}
        for name in sorted(names) + [n.upper() for n in sorted(names)]:
            got, want = lookup(name), archive.get(name)
            if want is None or not want.name.startswith(f"{prefix}/data/"):
                assert got is None or want is not None, name
                continue
            assert got == (want.name, want.error, want.method, want.data_offset, want.size), name


def test_listing_is_an_argument_not_a_mode_of_the_process(tmp_path):
    """Only the argument decides: an open without it is a full open, whatever ran before."""
    path = tmp_path / "sd.pt"
    torch.save({"w": torch.ones(2)}, path)
    with tensorscope.open(path, listing=True) as light:
        assert light.objects is None
    with tensorscope.open(path) as full:
        assert full.objects is not None
    from tensorscope.parsers import zip_dispatch
    assert not hasattr(zip_dispatch, "listing_only")   # no context variable to set from outside
