"""The zip reader's shortcuts against its general path, on every zip fixture and on damaged
copies of a torch archive: the plain-member step (`_Reader.regular_member`) and the one-span
layout check of members laid end to end must give the same members and the same anomalies."""
from __future__ import annotations

import io

import pytest
import torch

from tensorscope.parsers import zip_reader, zipfmt
from tensorscope.source import ByteSource
from torch_oracle import FIXTURES, torch_archive

ZIPS = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.read_bytes()[:4] == b"PK\x03\x04")


def _picture(data: bytes, fast: bool, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(zipfmt, "_SHORTCUTS", fast)
        try:
            arc = zip_reader.read_zip(ByteSource.from_bytes(data))
        except Exception as e:     # the same failure either way
            return ("error", type(e).__name__, str(e))
        members = [(x.name, x.raw_name, x.index, x.header_offset, x.data_offset,
                    x.compressed_size, x.size, x.crc32, x.method, x.flags, x.local_name, x.error)
                   for x in arc.members]
        return members, [(a.kind, a.message, a.member, a.offset) for a in arc.anomalies], \
            arc.miniz_error


_torch_archive = torch_archive


def _damaged():
    data = _torch_archive()
    out = [("intact", data), ("prepended", b"JUNK" * 8 + data), ("trailing", data + b"\0" * 9)]
    for at in range(0, 400, 7):     # local headers, names, data and descriptors of the first ones
        out.append((f"flip{at}", data[:at] + bytes([data[at] ^ 0x41]) + data[at + 1:]))
    cd = data.rfind(b"PK\x01\x02")
    for at in range(cd, min(len(data), cd + 46)):   # the last central-directory entry
        out.append((f"cdflip{at - cd}", data[:at] + bytes([data[at] ^ 0x05]) + data[at + 1:]))
    return out


@pytest.mark.parametrize("path", ZIPS, ids=[str(p.relative_to(FIXTURES)) for p in ZIPS])
def test_fixtures_read_the_same(path, monkeypatch):
    data = path.read_bytes()
    assert _picture(data, True, monkeypatch) == _picture(data, False, monkeypatch)


def test_damaged_archives_read_the_same(monkeypatch):
    for label, data in _damaged():
        assert _picture(data, True, monkeypatch) == _picture(data, False, monkeypatch), label


def test_the_shortcuts_are_taken(monkeypatch):
    """Not a test that cannot fail: a torch archive goes through the plain-member step."""
    taken = []
    original = zip_reader._Reader.regular_member

    def spy(self, *a):
        out = original(self, *a)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(zip_reader._Reader, "regular_member", spy)
    monkeypatch.setattr(zipfmt, "_SCAN", None)   # the Python step (tests/test_zipscan.py: C's)
    zip_reader.read_zip(ByteSource.from_bytes(_torch_archive()))
    assert taken and all(taken)


def test_an_empty_member_reads_the_same(monkeypatch):
    """An empty record: its 16-byte data descriptor would also read as the 24-byte form."""
    buf = io.BytesIO()
    torch.save({"e": torch.empty(0), "w": torch.ones(2)}, buf)
    data = buf.getvalue()
    assert _picture(data, True, monkeypatch) == _picture(data, False, monkeypatch)


def test_the_descriptor_shortcut_is_taken(monkeypatch):
    """Not a test that cannot fail: torch's non-empty records' descriptors are read inline."""
    calls = []
    original = zip_reader._Reader.descriptor_length
    monkeypatch.setattr(zip_reader._Reader, "descriptor_length",
                        lambda self, m: calls.append(m.name) or original(self, m))
    monkeypatch.setattr(zipfmt, "_SCAN", None)
    zip_reader.read_zip(ByteSource.from_bytes(_torch_archive()))
    assert calls == []
    monkeypatch.setattr(zipfmt, "_SHORTCUTS", False)
    zip_reader.read_zip(ByteSource.from_bytes(_torch_archive()))
    assert calls
