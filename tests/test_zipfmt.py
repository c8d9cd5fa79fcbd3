"""The tolerant zip reader against the real readers: torch's (miniz, via torch._C.PyTorchFileReader)
and Python's zipfile, on real torch archives and on hostile archives built byte by byte."""
from __future__ import annotations

import io
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.utils.serialization  # noqa: F401  (not imported by `import torch`)

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.parsers.zip_reader import read_zip
from tensorscope.parsers.zipfmt import sniff
from tensorscope.source import ByteSource

ser_config = torch.utils.serialization.config.save  # torch 2.13: storage_alignment, compute_crc32


# --- real torch archives -------------------------------------------------------------------------
def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(300, 7, generator=g)
    return {"w": torch.randn(5, 3, generator=g), "b": torch.arange(11, dtype=torch.int16),
            "big": big, "view": big[10:20, 2], "h": torch.ones(4, dtype=torch.float16),
            "empty": torch.empty(0), "nested": {"x": torch.tensor([1.5, 2.5])}}


def _save_default(d: Path) -> Path:
    p = d / "model.pt"
    torch.save(_state(), p)
    return p


def _save_aligned(d: Path) -> Path:
    p = d / "aligned.pt"
    old = ser_config.storage_alignment
    ser_config.storage_alignment = 4096
    try:
        torch.save(_state(), p)
    finally:
        ser_config.storage_alignment = old
    return p


def _save_buffer(d: Path) -> Path:
    buf = io.BytesIO()
    torch.save(_state(), buf)
    p = d / "buffer.bin"
    p.write_bytes(buf.getvalue())
    return p


def _save_dotted(d: Path) -> Path:
    p = d / "my.model.v2.pth"
    torch.save(_state(), p)
    return p


def _save_jit(d: Path) -> Path:
    p = d / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), str(p))
    return p


def _save_lite(d: Path) -> Path:
    p = d / "lite.ptl"
    torch.jit.script(torch.nn.Linear(3, 2))._save_for_lite_interpreter(str(p))
    return p


def _save_export(d: Path) -> Path:
    p = d / "exported.pt2"
    ep = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    torch.export.save(ep, p)
    return p


TORCH_FILES = [
    pytest.param(_save_default, "model", 64, id="default"),
    pytest.param(_save_aligned, "aligned", 4096, id="align4096"),
    pytest.param(_save_buffer, "archive", 64, id="buffer"),
    pytest.param(_save_dotted, "my.model.v2", 64, id="dotted-name"),
    pytest.param(_save_jit, "scripted", 64, id="torchscript"),
    pytest.param(_save_lite, "lite", 64, id="lite-interpreter"),
    pytest.param(_save_export, "exported", None, id="export-pt2"),
]


@pytest.mark.parametrize("make, prefix, alignment", TORCH_FILES)
def test_torch_archive_matches_torch_and_zipfile(tmp_path, make, prefix, alignment):
    path = make(tmp_path)
    with ByteSource(path) as src:
        arc = read_zip(src)
        assert arc.anomalies == []
        assert arc.miniz_error is None
        assert arc.torch_prefix() == prefix
        assert arc.prepended == 0 and arc.zip64  # torch always writes the zip64 trailer

        reader = torch._C.PyTorchFileReader(str(path))
        records = [m.name[len(prefix) + 1:] for m in arc.members]
        assert records == reader.get_all_records()

        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            assert [i.filename for i in infos] == arc.names()
            for info, m in zip(infos, arc.members):
                assert m.header_offset == info.header_offset
                assert (m.compressed_size, m.size, m.crc32) == (
                    info.compress_size, info.file_size, info.CRC)
                with zf.open(info) as f:
                    assert m.data_offset == f._orig_compress_start  # zipfile's data start
                    content = f.read()
                assert arc.read_bytes(m) == content
                if m.is_stored:  # TorchScript DEFLATEs its code/ files
                    assert bytes(arc.data(m)) == content
                rec = m.name[len(prefix) + 1:]
                assert m.data_offset == reader.get_record_offset(rec)
                assert arc.get(m.name) is m
                assert arc.verify_crc(m)
                if alignment and rec.startswith(("data/", "constants/")) and m.size:
                    assert m.data_offset % alignment == 0
        assert arc.anomalies == []


def test_torch_crc_disabled_is_reported_with_its_cause(tmp_path):
    p = tmp_path / "nocrc.pt"
    old = ser_config.compute_crc32
    ser_config.compute_crc32 = False
    try:
        torch.save({"w": torch.ones(3)}, p)
    finally:
        ser_config.compute_crc32 = old
    arc = read_zip(ByteSource(p))
    kinds = {a.kind for a in arc.anomalies}
    assert kinds == {"zip.bad_crc"}
    assert all("compute_crc32" in a.message for a in arc.anomalies)
    assert read_zip(ByteSource(p), check_small_crc=False).anomalies == []


# --- a byte-level zip builder --------------------------------------------------------------------
@dataclass
class E:
    """One entry to build. Unset fields take the honest value."""

    name: bytes
    data: bytes = b""
    method: int = 0
    flags: int = 0x0800
    payload: bytes | None = None          # bytes stored (default: data, deflated for method 8)
    crc: int | None = None
    csize: int | None = None
    usize: int | None = None
    local_name: bytes | None = None
    local_extra: bytes = b""
    central_extra: bytes = b""
    offset: int | None = None             # override the central header offset
    write_local: bool = True              # False: central entry only (reuses `offset`)
    in_cd: bool = True                    # False: a local file the CD does not list
    zip64: bool = False                   # sentinels + zip64 extra in the central entry
    extra_meta: dict = field(default_factory=dict)


def build(entries: list[E], *, comment: bytes = b"", count: int | None = None,
          zip64_trailer: bool = False, base: int = 0) -> bytes:
    """A zip archive; offsets are computed as if the archive started at byte ``base``."""
    out = bytearray()
    cd = bytearray()
    n = 0
    for e in entries:
        payload = e.payload if e.payload is not None else (
            zlib.compress(e.data)[2:-4] if e.method == 8 else e.data)
        crc = zlib.crc32(e.data) if e.crc is None else e.crc
        usize = len(e.data) if e.usize is None else e.usize
        csize = len(payload) if e.csize is None else e.csize
        offset = base + len(out) if e.offset is None else e.offset
        if e.write_local:
            lname = e.name if e.local_name is None else e.local_name
            lcrc, lcs, lus = (0, 0, 0) if e.flags & 8 else (crc, csize, usize)
            out += struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, e.flags, e.method, 0, 0x21,
                               lcrc, lcs, lus, len(lname), len(e.local_extra))
            out += lname + e.local_extra + payload
            if e.flags & 8:
                out += b"PK\x07\x08" + struct.pack("<3L", crc, csize, usize)
        if not e.in_cd:
            continue
        extra = e.central_extra
        f_us, f_cs, f_off = usize, csize, offset
        if e.zip64:
            extra = struct.pack("<HHQQQ", 1, 24, usize, csize, offset) + extra
            f_us = f_cs = f_off = 0xFFFFFFFF
        cd += struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, 0, e.flags, e.method, 0,
                          0x21, crc, f_cs, f_us, len(e.name), len(extra), 0, 0, 0, 0, f_off)
        cd += e.name + extra
        n += 1
    cd_off = base + len(out)
    out += cd
    count = n if count is None else count
    if zip64_trailer:
        z64 = base + len(out)
        out += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, count, count, len(cd),
                           cd_off)
        out += struct.pack("<4sLQL", b"PK\x06\x07", 0, z64, 1)
        out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                           0xFFFFFFFF, len(comment)) + comment
    else:
        out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(cd), cd_off,
                           len(comment)) + comment
    return bytes(out)


def kinds(arc) -> list[str]:
    return sorted(a.kind for a in arc.anomalies)


def open_bytes(data: bytes, name: str = "hostile.zip", **kw):
    return read_zip(ByteSource.from_bytes(data, name), **kw)


def torch_like(*extra: E) -> list[E]:
    return [E(b"a/version", b"3\n"), *extra]


# --- honest hand-built archives ------------------------------------------------------------------
def test_honest_build_has_no_anomalies_and_matches_zipfile():
    data = build(torch_like(E(b"a/data/0", bytes(range(200)), flags=0x0808), E(b"a/empty")))
    arc = open_bytes(data)
    assert kinds(arc) == []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for m in arc.members:
            assert arc.read_bytes(m) == zf.read(m.name)


def test_zip64_forced_by_zipfile(tmp_path):
    p = tmp_path / "z64.zip"
    payloads = {"a/x": b"hello" * 100, "a/y": bytes(range(256)) * 3}
    with zipfile.ZipFile(p, "w", allowZip64=True) as zf:
        for name, blob in payloads.items():
            with zf.open(name, "w", force_zip64=True) as f:
                f.write(blob)
    raw = p.read_bytes()
    assert b"\x01\x00\x10\x00" in raw  # a local zip64 extra field (sizes are sentinels there)
    arc = read_zip(ByteSource(p))
    assert kinds(arc) == []
    with zipfile.ZipFile(p) as zf:
        for info, m in zip(zf.infolist(), arc.members):
            assert m.header_offset == info.header_offset
            assert arc.read_bytes(m) == zf.read(info) == payloads[m.name]


def test_zip64_central_sentinels_and_trailer():
    entries = torch_like(E(b"a/x", b"x" * 70, zip64=True), E(b"a/y", b"y" * 9, zip64=True))
    data = build(entries, zip64_trailer=True)
    arc = open_bytes(data)
    assert kinds(arc) == [] and arc.zip64 and arc.eocd_count == 3
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info, m in zip(zf.infolist(), arc.members):
            assert (m.header_offset, m.size) == (info.header_offset, info.file_size)
            assert arc.read_bytes(m) == zf.read(info)


def test_zip64_offsets_beyond_4gib_in_a_sparse_file(tmp_path):
    """A 5 GiB STORED member (a hole in a sparse file) pushes the next header past 4 GiB."""
    big = 5 << 30
    p = tmp_path / "sparse.zip"
    head = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 45, 0, 0, 0, 0, 0x21, 0, 0xFFFFFFFF,
                       0xFFFFFFFF, 5, 20) + b"a/big" + struct.pack("<HHQQ", 1, 16, big, big)
    second = b"after 4 GiB"
    with open(p, "wb") as f:
        f.write(head)
        f.seek(len(head) + big)            # the data: zeros, never written
        off2 = f.tell()
        f.write(struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0x21,
                            zlib.crc32(second), len(second), len(second), 5, 0) + b"a/sec" + second)
        cd_off = f.tell()
        cd = struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 45, 3, 45, 0, 0, 0, 0, 0x21, 0,
                         0xFFFFFFFF, 0xFFFFFFFF, 5, 20, 0, 0, 0, 0, 0) + b"a/big" + \
            struct.pack("<HHQQ", 1, 16, big, big)
        cd += struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 45, 3, 45, 0, 0, 0, 0, 0x21,
                          zlib.crc32(second), len(second), len(second), 5, 12, 0, 0, 0, 0,
                          0xFFFFFFFF) + b"a/sec" + struct.pack("<HHQ", 1, 8, off2)
        f.write(cd)
        z64 = f.tell()
        f.write(struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 2, 2, len(cd), cd_off))
        f.write(struct.pack("<4sLQL", b"PK\x06\x07", 0, z64, 1))
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                            0xFFFFFFFF, 0))
    assert off2 > 0xFFFFFFFF
    with ByteSource(p) as src:
        arc = read_zip(src)
        assert kinds(arc) == []
        big_m, sec = arc.members
        assert (big_m.size, big_m.data_offset) == (big, len(head))
        assert sec.header_offset == off2 and sec.data_offset == off2 + 35
        assert arc.read_bytes(sec) == second
        with zipfile.ZipFile(p) as zf:
            info = zf.getinfo("a/sec")
            assert info.header_offset == off2 and zf.read(info) == second
        with pytest.raises(LimitExceeded):
            arc.read_bytes(big_m)  # 5 GiB > the default 256 MiB cap, refused before copying


# --- hostile archives: one anomaly kind each -----------------------------------------------------
def test_local_central_name_mismatch(tmp_path):
    data = build(torch_like(E(b"a/data.pkl", b"PICKLE", local_name=b"a/evil.pk")))
    arc = open_bytes(data)
    assert kinds(arc) == ["zip.local_name_mismatch"]
    m = arc.get("a/data.pkl")
    assert m.local_name == b"a/evil.pk" and m.error is None
    p = tmp_path / "m.zip"
    p.write_bytes(data)
    assert torch._C.PyTorchFileReader(str(p)).get_record_offset("data.pkl") == m.data_offset
    with zipfile.ZipFile(p) as zf, pytest.raises(zipfile.BadZipFile):
        zf.read("a/data.pkl")  # the reader the anomaly warns about


JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(100)


def test_prepended_bytes_unadjusted_offsets(tmp_path):
    """`cat photo.jpg model.zip`: zipfile shifts the offsets, torch (miniz) cannot open it."""
    data = JPEG + build(torch_like(E(b"a/data.pkl", b"PICKLE")))
    arc = open_bytes(data)
    assert kinds(arc) == ["zip.prepended_bytes"]
    assert arc.prepended == len(JPEG) and arc.miniz_error
    p = tmp_path / "jpeg.zip"
    p.write_bytes(data)
    with zipfile.ZipFile(p) as zf:
        for info, m in zip(zf.infolist(), arc.members):
            assert m.header_offset == info.header_offset
            assert arc.read_bytes(m) == zf.read(info)
    with pytest.raises(RuntimeError):
        torch._C.PyTorchFileReader(str(p))


def test_prepended_bytes_adjusted_offsets(tmp_path):
    """`zip -A` style: offsets include the prefix; both readers agree, the prefix is still there."""
    data = JPEG + build(torch_like(E(b"a/data.pkl", b"PICKLE")), base=len(JPEG))
    arc = open_bytes(data)
    assert kinds(arc) == ["zip.prepended_bytes"]
    assert arc.prepended == 0 and arc.miniz_error is None
    p = tmp_path / "sfx.zip"
    p.write_bytes(data)
    rd = torch._C.PyTorchFileReader(str(p))
    assert rd.get_record_offset("data.pkl") == arc.get("a/data.pkl").data_offset


@pytest.mark.parametrize("names, query", [
    ([b"a/x", b"a/x"], b"a/x"),
    ([b"a/x", b"a/x", b"a/x"], b"a/x"),
    ([b"a/x", b"a/b", b"a/x", b"a/c", b"a/x", b"a/d"], b"a/x"),
    ([b"a/x", b"a/X"], b"a/x"),
    ([b"a/X", b"a/x"], b"a/X"),
    ([b"a/q", b"a/x", b"a/r", b"a/x", b"a/s", b"a/t", b"a/x", b"a/u"], b"a/x"),
    ([b"a/x"] * 7 + [b"a/y"] * 2, b"a/x"),
], ids=lambda v: repr(v)[:40])
def test_duplicate_names_pick_what_torch_picks(tmp_path, names, query):
    entries = torch_like(*[E(n, b"copy %d" % i) for i, n in enumerate(names)])
    data = build(entries)
    arc = open_bytes(data)
    assert "zip.duplicate_name" in kinds(arc)
    assert set(kinds(arc)) == {"zip.duplicate_name"}
    p = tmp_path / "dup.zip"
    p.write_bytes(data)
    torch_sees = torch._C.PyTorchFileReader(str(p)).get_record(query[2:].decode())
    ours = arc.get(query)
    assert arc.read_bytes(ours) == torch_sees
    dup = next(a for a in arc.anomalies if a.kind == "zip.duplicate_name" and
               a.member.lower() == query.decode().lower())
    assert f"picks #{ours.index}" in dup.message


def test_trailing_bytes():
    arc = open_bytes(build(torch_like()) + b"GARBAGE AFTER THE END")
    assert kinds(arc) == ["zip.trailing_bytes"]
    assert arc.anomalies[0].offset == arc.eocd_offset + 22


def test_compressed_member_and_read_bytes():
    blob = b"compress me " * 500
    arc = open_bytes(build(torch_like(E(b"a/data.pkl", blob, method=8))))
    assert kinds(arc) == ["zip.compressed_member"]
    m = arc.get("a/data.pkl")
    assert arc.read_bytes(m) == blob and len(arc.data(m)) < len(blob)


@pytest.mark.parametrize("method, compress", [
    (8, lambda b: zlib.compress(b)[2:-4]),
    (12, lambda b: __import__("bz2").compress(b)),
])
def test_zip_bomb_is_capped(method, compress):
    bomb = bytes(20 << 20)
    payload = compress(bomb)
    # An honest directory: inflating stops at the caller's cap.
    arc = open_bytes(build(torch_like(E(b"a/bomb", bomb, method=method, payload=payload,
                                        usize=20 << 20))))
    with pytest.raises(LimitExceeded, match="exceeds the limit of 1048576"):
        arc.read_bytes(arc.get("a/bomb"), max_size=1 << 20)
    # A directory that lies about the size: inflating stops one byte past what it declares
    # (miniz and zipfile stop there too), whatever the caller's cap.
    arc = open_bytes(build(torch_like(E(b"a/bomb", bomb, method=method, payload=payload,
                                        usize=100))))
    with pytest.raises(FormatError, match="inflates past the 100 bytes the central directory"):
        arc.read_bytes(arc.get("a/bomb"), max_size=1 << 20)


def test_lzma_member_reads_like_zipfile(tmp_path):
    p = tmp_path / "lz.zip"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_LZMA) as zf:
        zf.writestr("a/x", b"lzma " * 1000)
    arc = read_zip(ByteSource(p))
    assert kinds(arc) == ["zip.compressed_member"]
    assert arc.read_bytes(arc.members[0]) == b"lzma " * 1000


def test_encrypted_flag():
    arc = open_bytes(build(torch_like(E(b"a/secret", b"xxxx", flags=0x0801))))
    assert kinds(arc) == ["zip.encrypted_member"]
    m = arc.get("a/secret")
    assert m.is_encrypted and m.error == "member is encrypted"
    with pytest.raises(FormatError) as ei:
        arc.data(m)
    assert str(ei.value) == (f"zip: hostile.zip:a/secret at byte {m.header_offset}: "
                             "member is encrypted")


def test_data_runs_into_central_directory():
    arc = open_bytes(build(torch_like(E(b"a/x", b"abcd", flags=0x0808, csize=40, usize=40,
                                        crc=0))))
    assert kinds(arc) == ["zip.data_out_of_range"]
    m = arc.get("a/x")
    assert "runs into the central directory" in m.error
    assert arc.get("a/version").error is None  # a bad member does not hide the rest
    with pytest.raises(FormatError, match="runs into the central directory"):
        arc.data(m)


def test_local_header_outside_the_file():
    far = 0xFFFF_0000
    arc = open_bytes(build(torch_like(E(b"a/x", b"abcd", offset=far, write_local=False))))
    assert kinds(arc) == ["zip.data_out_of_range"]
    m = arc.get("a/x")
    assert m.error == f"local header at byte {far} lies outside the file ({arc.source.size} bytes)"
    assert arc.miniz_error
    assert arc.get("a/version").error is None and arc.read_bytes(arc.get("a/version")) == b"3\n"


def test_missing_local_header_signature():
    arc = open_bytes(build(torch_like(E(b"a/x", b"abcd"), E(b"a/y", write_local=False,
                                                          offset=3))))
    assert kinds(arc) == ["zip.bad_local_header"]
    assert arc.get("a/y").error.startswith("no local file header at byte 3")


def test_overlapping_members_share_a_local_header():
    second = 30 + 9 + 2  # a/x's local header follows a/version's
    data = build(torch_like(E(b"a/x", b"abcd"), E(b"a/y", b"abcd", write_local=False,
                                                  offset=second)))
    arc = open_bytes(data)
    assert kinds(arc) == ["zip.local_name_mismatch", "zip.overlapping_members"]
    assert "same local header" in next(a.message for a in arc.anomalies
                                       if a.kind == "zip.overlapping_members")


def test_hidden_local_file_is_unaccounted():
    data = build(torch_like(E(b"a/hidden.pkl", b"EVIL", in_cd=False), E(b"a/x", b"ok")))
    arc = open_bytes(data)
    assert kinds(arc) == ["zip.unaccounted_bytes"]
    a = arc.anomalies[0]
    assert a.offset == 30 + 9 + 2 and "local file header signature" in a.message


def test_count_mismatch_hides_entries_from_torch(tmp_path):
    data = build(torch_like(E(b"a/extra", b"only zipfile sees me")), count=1)
    arc = open_bytes(data)
    assert kinds(arc) == ["zip.cd_count_mismatch"]
    assert arc.names() == ["a/version", "a/extra"]
    assert arc.get("a/extra") is None  # miniz reads only the declared count
    p = tmp_path / "count.zip"
    p.write_bytes(data)
    assert not torch._C.PyTorchFileReader(str(p)).has_record("extra")
    with zipfile.ZipFile(p) as zf:
        assert zf.namelist() == ["a/version", "a/extra"]


def test_bad_crc_small_stored():
    arc = open_bytes(build(torch_like(E(b"a/x", b"abcd", crc=0x12345678))))
    assert kinds(arc) == ["zip.bad_crc"]
    assert open_bytes(build(torch_like(E(b"a/x", b"abcd", crc=0x12345678))),
                      check_small_crc=False).anomalies == []


def test_comment_and_fake_eocd_inside_it():
    honest = build(torch_like(E(b"a/x", b"abc")), comment=b"hello")
    arc = open_bytes(honest)
    assert kinds(arc) == ["zip.comment"] and arc.comment == b"hello"

    fake = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0, 0, 0, 0, 0)
    data = build(torch_like(E(b"a/x", b"abc")), comment=fake)
    arc = open_bytes(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.namelist() == arc.names() == []  # both pick the fake, empty EOCD
    assert kinds(arc) == ["zip.multiple_eocd", "zip.unaccounted_bytes"]


@pytest.mark.parametrize("name, flags, kind", [
    (b"a/\x81\xe9.pkl", 0x0000, "zip.non_utf8_name"),
    (b"a/\xff\xfe", 0x0800, "zip.non_utf8_name"),
    (b"/etc/passwd", 0x0800, "zip.absolute_or_parent_path"),
    (b"a/../../x", 0x0800, "zip.absolute_or_parent_path"),
    (b"a/x\x00.txt", 0x0800, "zip.nul_in_name"),
])
def test_name_anomalies(name, flags, kind):
    arc = open_bytes(build(torch_like(E(name, b"z", flags=flags))))
    assert kinds(arc) == [kind]
    # miniz looks names up as C strings: a name with a NUL can never be found.
    assert arc.get(name) is (None if b"\0" in name else arc.members[1])


def test_local_header_mismatch_but_torch_descriptor_is_normal():
    normal = open_bytes(build(torch_like(E(b"a/x", b"abcd", flags=0x0808))))
    assert kinds(normal) == []
    data = bytearray(build(torch_like(E(b"a/x", b"abcd"))))
    lh = data.index(b"PK\x03\x04", 1)  # a/x's local header: patch its method to 8
    data[lh + 8] = 8
    arc = open_bytes(bytes(data))
    assert kinds(arc) == ["zip.local_header_mismatch"]
    assert "method 8 vs 0" in arc.anomalies[0].message


# --- fatal errors: exact messages ----------------------------------------------------------------
def test_missing_eocd_names_the_file():
    with pytest.raises(FormatError) as ei:
        open_bytes(b"PK\x03\x04" + bytes(100), "nozip.pt")
    assert str(ei.value) == ("zip: nozip.pt: not a zip archive: no end-of-central-directory "
                             "record (PK\\x05\\x06) in the last 104 bytes")
    assert ei.value.format == "zip" and ei.value.file == "nozip.pt"


def test_tiny_file():
    with pytest.raises(FormatError, match=r"nozip.pt: not a zip archive: 3 bytes"):
        open_bytes(b"PK\x03", "nozip.pt")


def test_truncated_central_directory():
    data = build(torch_like(E(b"a/x", b"abc")))
    eocd = data.rindex(b"PK\x05\x06")
    cd_off = struct.unpack_from("<L", data, eocd + 16)[0]
    bad = bytearray(data)
    struct.pack_into("<L", bad, eocd + 12, 10_000)  # CD size far beyond the file
    with pytest.raises(FormatError) as ei:
        open_bytes(bytes(bad))
    assert ei.value.offset == cd_off
    assert "central directory" in str(ei.value)
    # A CD whose last entry is cut short inside the declared size.
    cut = bytearray(data[:cd_off + 46 + 5])
    cut += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 2, 2, 46 * 2 + 9 + 3, cd_off, 0)
    with pytest.raises(FormatError) as ei:
        open_bytes(bytes(cut))
    assert ei.value.offset is not None


def test_member_limit():
    data = build([E(b"a/%d" % i) for i in range(5)])
    with pytest.raises(LimitExceeded, match="zip members exceeds the limit of 3"):
        open_bytes(data, max_members=3)


def test_sniff():
    assert sniff(b"PK\x03\x04rest", 100)
    assert sniff(b"PK\x05\x06" + bytes(18), 22)
    assert not sniff(JPEG, 1000)
    assert not sniff(b"PK\x01\x02", 100)


def test_torch_prefix_first_entry():
    assert open_bytes(build([E(b"p.q/x"), E(b"other/y")])).torch_prefix() == "p.q"
    assert open_bytes(build([E(b"noslash"), E(b"a/y")])).torch_prefix() is None
    assert open_bytes(build([])).torch_prefix() is None


def test_mutations_never_raise_raw_exceptions(tmp_path):
    """Every single-byte corruption of a real torch archive's headers gives a listing or a
    FormatError, never IndexError/struct.error/... (CWE-20)."""
    path = _save_default(tmp_path)
    good = path.read_bytes()
    arc = read_zip(ByteSource.from_bytes(good))
    spots = set(range(arc.cd_offset, len(good)))
    for m in arc.members:
        spots.update(range(m.header_offset, m.header_offset + 30))
    for pos in sorted(spots):
        for value in (0x00, 0xFF):
            data = bytearray(good)
            if data[pos] == value:
                continue
            data[pos] = value
            try:
                a = read_zip(ByteSource.from_bytes(bytes(data)))
                for m in a.members:
                    a.get(m.name)
                    if m.error is None and m.compressed_size < 1 << 20:
                        try:
                            a.read_bytes(m)
                        except FormatError:
                            pass
            except FormatError:
                pass
