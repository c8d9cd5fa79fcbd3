"""The compiled steps (tensorscope/_zipscan.c) against the Python reader: on every zip fixture,
every zip of the attack corpus and hypothesis-damaged torch archives, the members (every field),
the anomalies and what `get` answers must be those of the Python loop, with its shortcuts (the
plain-member step in Python, the one-span layout check) and without them. `distinct`, `exact`
and `records` are held to the Python expressions they replace, and `get`'s folded lookup of a
missing name to miniz's table."""
from __future__ import annotations

import io
import shutil
import struct
import warnings
import zipfile
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorscope.parsers import zip_reader, zipfmt
from tensorscope.source import ByteSource
from torch_oracle import FIXTURES, torch_archive


needs_scan = pytest.mark.skipif(zipfmt._SCAN is None, reason="the compiled step is not built")
ZIPS = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and b"PK\x05\x06" in p.read_bytes())
MODES = ("compiled", "python", "slow")   # the compiled step; Python's shortcuts; neither


def _picture(data: bytes, mode: str, monkeypatch, **kw):
    with monkeypatch.context() as m:
        if mode != "compiled":
            m.setattr(zipfmt, "_SCAN", None)
        m.setattr(zipfmt, "_SHORTCUTS", mode != "slow")
        try:
            arc = zip_reader.read_zip(ByteSource.from_bytes(data), **kw)
        except Exception as e:     # the same failure every way
            return ("error", type(e).__name__, str(e))
        members = [(type(x), x.name, x.raw_name, x.index, x.header_offset, x.data_offset,
                    x.compressed_size, x.size, x.crc32, x.method, x.flags, x.local_name, x.error)
                   for x in arc.members]
        # what `get` answers (its plain dict, and miniz's search) for every name, as bytes and str
        lookups = [(k, v.index) for k, v in arc._exact_table().items()]
        picks = [getattr(arc.get(key), "index", None) for x in arc.members
                 for key in (x.raw_name, x.name, x.name.upper(), x.name.swapcase(),
                             x.name + "x", x.name[:-1])]
        return (members, [(a.kind, a.message, a.member, a.offset) for a in arc.anomalies],
                arc.miniz_error, arc.eocd_count, arc.cd_offset, arc.prepended, lookups, picks)


def _same_every_way(data: bytes, monkeypatch, label="", **kw):
    compiled, python, slow = (_picture(data, mode, monkeypatch, **kw) for mode in MODES)
    assert compiled == python, label
    assert compiled == slow, label
    return compiled


_torch_archive = torch_archive


TORCH = _torch_archive()


@needs_scan
@pytest.mark.parametrize("path", ZIPS, ids=[str(p.relative_to(FIXTURES)) for p in ZIPS])
def test_fixtures_read_the_same(path, monkeypatch):
    _same_every_way(path.read_bytes(), monkeypatch)


@pytest.fixture(scope="module")
def corpus_zips(attack_corpus):
    out = attack_corpus.root
    files = [p for p in sorted(out.rglob("*")) if p.is_file()]
    return [(str(p.relative_to(out)), p.read_bytes()) for p in files
            if b"PK\x05\x06" in p.read_bytes()]


@needs_scan
def test_attack_corpus_reads_the_same(corpus_zips, monkeypatch):
    assert len(corpus_zips) > 20   # the corpus has its zips (not a test that cannot fail)
    for label, data in corpus_zips:
        _same_every_way(data, monkeypatch, label)


@needs_scan
def test_torch_archives_read_the_same(monkeypatch):
    for data in (TORCH, _torch_archive(40, empty=True), b"JUNK" * 8 + TORCH, TORCH + b"\0" * 9):
        _same_every_way(data, monkeypatch)
    for kw in ({"check_small_crc": False}, {"max_members": 3}, {"max_members": 9}):
        _same_every_way(TORCH, monkeypatch, str(kw), **kw)


def _regions(data: bytes) -> list[tuple[int, int]]:
    """Where the structure is: every local header (with its name) and every central entry."""
    out = []
    for sig, length in ((b"PK\x03\x04", 30 + 20), (b"PK\x01\x02", 46 + 20), (b"PK\x07\x08", 16)):
        at = data.find(sig)
        while at >= 0:
            out.append((at, min(len(data), at + length)))
            at = data.find(sig, at + 1)
    return out


@needs_scan
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_damaged_torch_archives_read_the_same(monkeypatch, data):
    """Bytes of the local headers, central entries and descriptors flipped or set."""
    base = data.draw(st.sampled_from([TORCH, _EMPTY]), label="archive")
    raw = bytearray(base)
    regions = _regions(base)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        lo, hi = data.draw(st.sampled_from(regions), label="region")
        at = data.draw(st.integers(lo, hi - 1), label="at")
        raw[at] = data.draw(st.sampled_from([raw[at] ^ 1, raw[at] ^ 0x80, 0, 0xFF, ord("."),
                                             ord("/"), ord(":"), 0xC3]), label="byte")
    _same_every_way(bytes(raw), monkeypatch)


_EMPTY = _torch_archive(3, empty=True)


@needs_scan
def test_member_data_with_a_bad_crc_is_reported_the_same(monkeypatch):
    """The compiled CRC-32 against zlib's: data of every length 0..40 (not multiples of the
    8-byte step only), some of it changed after the CRC was taken."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n in range(41):
            z.writestr(f"m/{n}", bytes(range(n)))
    data = bytearray(buf.getvalue())
    arc = zip_reader.read_zip(ByteSource.from_bytes(bytes(data)))
    assert not [a for a in arc.anomalies if a.kind == "zip.bad_crc"]
    for m in arc.members[5::6]:
        if m.size:
            data[m.data_offset + m.size // 2] ^= 0x10
    pic = _same_every_way(bytes(data), monkeypatch)
    bad = [a for a in pic[1] if a[0] == "zip.bad_crc"]
    assert len(bad) == len([m for m in arc.members[5::6] if m.size])
    assert zlib.crc32(bytes(range(40))) == arc.members[40].crc32


@needs_scan
def test_the_compiled_step_is_taken(monkeypatch):
    """Not a test that cannot fail: a torch archive's members all come from the compiled step,
    the layout is one span and the Python step is not called."""
    calls = []
    monkeypatch.setattr(zip_reader._Reader, "regular_member", lambda *a: calls.append(a))
    monkeypatch.setattr(zip_reader._Reader, "descriptor_length", lambda *a: calls.append(a))
    seen = {}
    original = zip_reader._Reader.check_layout

    def spy(self, *a):
        seen.update(span=self.span, made=list(self.made))
        return original(self, *a)

    monkeypatch.setattr(zip_reader._Reader, "check_layout", spy)
    arc = zip_reader.read_zip(ByteSource.from_bytes(TORCH))
    assert calls == [] and seen["made"] == [] and seen["span"] == (0, arc.cd_offset)
    assert arc.names() == zipfile.ZipFile(io.BytesIO(TORCH)).namelist()


@needs_scan
def test_members_are_tracked_by_the_collector_like_any_other():
    # ZipMember is mutable: one the collector did not track would leak once given a cycle
    import gc
    arc = zip_reader.read_zip(ByteSource.from_bytes(TORCH))
    assert arc.members and all(gc.is_tracked(m) for m in arc.members)
    made = zipfmt.ZipMember("a", b"a", 0, 0, 30, 0, 0, 0, 0, 0)
    assert gc.is_tracked(made)


@needs_scan
def test_hostile_arguments_stay_inside_the_buffers():
    """Arguments no caller passes: positions and offsets outside the buffers read nothing."""
    scan = zipfmt._SCAN.scan
    cd_at = TORCH.rfind(b"PK\x01\x02")
    first_cd = TORCH.find(b"PK\x01\x02")
    cd = TORCH[first_cd:cd_at + 46 + 40]
    for args in [(TORCH, len(TORCH) + 1, cd, first_cd, 0, 0),      # size beyond the file
                 (TORCH, len(TORCH), cd, len(TORCH), 0, 0),        # the CD beyond the file
                 (TORCH, len(TORCH), cd, first_cd, len(cd) + 5, 0),
                 (TORCH, len(TORCH), cd, first_cd, -3, 0),
                 (TORCH, len(TORCH), cd, -1, 0, 0),
                 (TORCH, len(TORCH), cd, first_cd, 0, -5),
                 (TORCH, len(TORCH), cd, first_cd, 0, 1 << 40),    # every header past the end
                 (TORCH[:100], 100, cd, 0, 0, 0)]:
        members, bad = [], []
        pos, first, end = scan(args[0], args[1], args[2], args[3], args[4], members, args[5],
                               10, 1 << 20, bad)
        assert members == [] and bad == [] and first == end == -1
    # an entry whose name runs past the directory: not read
    cut = cd[:46 + 3]
    members = []
    assert scan(TORCH, len(TORCH), cut, first_cd, 0, members, 0, 10, -1, [])[0] == 0
    assert members == []


def test_the_compiled_step_is_built_where_a_compiler_is():
    # `pip install` builds tensorscope/_zipscan.c (optional: without a compiler the Python loop
    # reads every entry). Where a C compiler exists, a missing step is a broken build.
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python loop is the one in use")
    assert zipfmt._SCAN is not None, ("tensorscope/_zipscan.c is not built, or its build is "
                                      "stale (ABI): run pip install -e . again")


@needs_scan
def test_bind_refuses_a_class_without_the_slots(monkeypatch):

    class NotAMember:
        __slots__ = ("name",)

    with pytest.raises(TypeError):
        zipfmt._SCAN.bind(NotAMember)
    with pytest.raises(TypeError):
        zipfmt._SCAN.bind(struct)

    import dataclasses
    fields = [f.name for f in dataclasses.fields(zipfmt.ZipMember)]
    with pytest.raises(TypeError):      # one field more than the file sets
        zipfmt._SCAN.bind(dataclasses.make_dataclass("Wider", fields + ["extra"], slots=True))
    _same_every_way(TORCH, monkeypatch)   # ZipMember stays bound, its slots as they were


_ALPHABET = [b"A", b"a", b"Z", b"z", b"@", b"[", b"`", b"{", b"\xc1", b"\xe1", b"\xda", b"\xfa",
             b"\x00", b"/", b"0", b"\xc3\xa9", b"\x82"]


def _python_distinct(members, visible, names=True):
    vis = members[:visible]
    plain = len({m.raw_name.lower() for m in vis}) == len(vis)
    if names:
        all_names = [m.name for m in members]
        plain = plain and len(set(all_names)) == len(all_names) and "\0" not in "".join(all_names)
    return plain


@needs_scan
@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_ALPHABET), max_size=19).map(b"".join), max_size=12),
       st.integers(0, 12), st.lists(st.booleans(), min_size=12, max_size=12))
def test_distinct_is_the_python_test(raws, visible, utf8):
    """`distinct` (lowercasing eight bytes at a time, hashing) against bytes.lower() and sets,
    on names that differ by case, by bytes above 0x7F that lowercasing must not touch, by NUL,
    and on raw names that decode to the same name (UTF-8 'é' and cp437 'é')."""
    members = [zipfmt.ZipMember(raw.decode("utf-8", "surrogateescape") if utf8[i]
                                else raw.decode("cp437"), raw, i, 0, 30, 0, 0, 0, 0, 0)
               for i, raw in enumerate(raws)]
    for names in (True, False):
        assert zipfmt._SCAN.distinct(members, visible, names) == \
            _python_distinct(members, visible, names)
    # long names: the same comparisons past the first eight-byte words
    long = [zipfmt.ZipMember(m.name * 5, m.raw_name * 5, m.index, 0, 30, 0, 0, 0, 0, 0)
            for m in members]
    assert zipfmt._SCAN.distinct(long, visible, True) == _python_distinct(long, visible)


@needs_scan
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_ALPHABET), max_size=12).map(b"".join), max_size=10),
       st.integers(-1, 11))
def test_exact_is_the_python_table(raws, visible):
    members = [zipfmt.ZipMember(raw.decode("cp437"), raw, i, 0, 30, 0, 0, 0, 0, 0)
               for i, raw in enumerate(raws)]
    got = zipfmt._SCAN.exact(members, visible)
    want = {m.name: m for m in members[:max(0, visible)]
            if m.raw_name.isascii() and b"\0" not in m.raw_name}
    assert list(got.items()) == list(want.items())
    assert all(got[k] is want[k] for k in want)


@needs_scan
def test_distinct_leaves_other_objects_to_python():
    m = zipfmt.ZipMember("a", b"a", 0, 0, 30, 0, 0, 0, 0, 0)
    assert zipfmt._SCAN.distinct([m, object()], 2, True) is None
    assert zipfmt._SCAN.exact([m, object()], 2) is None
    assert zipfmt._SCAN.distinct([zipfmt.ZipMember("a", "a", 0, 0, 30, 0, 0, 0, 0, 0)], 1,
                                 True) is None


@needs_scan
def test_names_alike_read_the_same(monkeypatch):
    """Duplicates for miniz (letter case) and for zipfile (exact), seen and beyond the EOCD's
    count, through the whole reader."""
    for names in (["m/A", "m/a"], ["m/x", "m/x"], ["m/x\0y", "m/x"], ["m/\u00e9", "m/\u00c9"],
                  ["m/" + "Q" * 20, "m/" + "q" * 20], ["m/1", "m/2", "M/1"]):
        buf = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # zipfile's "Duplicate name"
            with zipfile.ZipFile(buf, "w") as z:
                for k, name in enumerate(names):
                    z.writestr(name, bytes([k]) * 3)
        data = buf.getvalue()
        pic = _same_every_way(data, monkeypatch, repr(names))
        # the same archive with an EOCD count that hides the last entry from miniz
        eocd = data.rfind(b"PK\x05\x06")
        fewer = bytearray(data)
        struct.pack_into("<HH", fewer, eocd + 8, len(names) - 1, len(names) - 1)
        _same_every_way(bytes(fewer), monkeypatch, repr(names))
        assert any(a[0] == "zip.duplicate_name" for a in pic[1]) == (
            len({n.encode().lower() for n in names}) < len(names) or
            len({n.split("\0")[0] for n in names}) < len(names))



_NAME_PARTS = ["a/", "A/", "data/", "DATA/", "Data/", "0", "1", "x", "\u212a", "k", "K", "\u0130",
               "\0", "\u00e9", "/"]


def _python_records(members, visible, start, record):
    low_start, cut = start.lower(), len(start)
    out = {}
    for m in members[:visible]:
        name = m.name
        if name.startswith(start) or name[:cut].lower() == low_start:
            if not name.isascii() or "\0" in name:
                return None
            low = name.lower()
            out[name if low == name else low] = record(name, m.error, m.method, m.data_offset,
                                                       m.size)
    return out


@needs_scan
@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_NAME_PARTS), max_size=5).map("".join), max_size=10),
       st.integers(-1, 11), st.sampled_from(["a/data/", "A/Data/", "k/", "a/", ""]))
def test_records_is_the_python_loop(names, visible, start):
    """`records` against the loop it replaces, on names that match by case only, through
    Unicode lowercasing (KELVIN SIGN lowers to 'k'), or hold a NUL or non-ASCII letters."""
    from tensorscope.parsers.torch_zip import _Record
    members = [zipfmt.ZipMember(name, name.encode("utf-8", "surrogatepass"), i, 0, 30 + i,
                                i, i, 0, 0, 0, error=None if i % 3 else f"bad {i}")
               for i, name in enumerate(names)]
    got = zipfmt._SCAN.records(members, visible, start, _Record)
    want = _python_records(members, max(0, visible), start, _Record)
    assert got == want
    if want is not None:
        assert list(got.items()) == list(want.items())
        assert all(type(r) is _Record for r in got.values())
        assert all(got[k][0] is want[k][0] for k in want)   # the member's name, not a copy


@needs_scan
def test_records_leaves_other_arguments_to_python():
    from tensorscope.parsers.torch_zip import _Record
    m = zipfmt.ZipMember("a/data/0", b"a/data/0", 0, 0, 30, 1, 1, 0, 0, 0)
    assert zipfmt._SCAN.records([m, object()], 2, "a/", _Record) is NotImplemented
    assert zipfmt._SCAN.records([m], 1, "\u00e9/", _Record) is NotImplemented
    assert zipfmt._SCAN.records([m], 1, "a/", dict) is NotImplemented


@needs_scan
@pytest.mark.parametrize("path", ZIPS, ids=[str(p.relative_to(FIXTURES)) for p in ZIPS])
def test_records_under_is_data_records_loop(path, monkeypatch):
    """On every zip fixture: the compiled records and the Python loop, for the archive's own
    data folder."""
    from tensorscope.parsers.torch_zip import _Record
    try:
        arc = zip_reader.read_zip(ByteSource.from_bytes(path.read_bytes()))
    except Exception:
        return
    prefix = arc.torch_prefix() or "archive"
    for start in (f"{prefix}/data/", f"{prefix.upper()}/DATA/", "data/"):
        got = arc.records_under(start, _Record)
        with monkeypatch.context() as m:
            m.setattr(zipfmt, "_SCAN", None)
            want = arc.records_under(start, _Record)
        assert got == want and (want is None or list(got) == list(want))


def _via_miniz(arc, name):
    """`get`'s general path: miniz's table of lowercased raw names (and its binary search)."""
    raw = name.encode("utf-8", "surrogateescape").split(b"\0", 1)[0].lower()
    found = arc._miniz_lookup_table().get(raw)
    if not found:
        return None
    return arc.members[found[0] if len(found) == 1 else arc._miniz_binary_search(raw)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["a", "B", "c/", "D/", "1", "_", ".", "\u00e9"]),
                         min_size=1, max_size=6).map("".join), min_size=1, max_size=8,
                unique_by=lambda n: n.lower()),
       st.lists(st.text(alphabet="aAbBcCdD/1_.\u00e9\0", max_size=7), max_size=8))
def test_a_missing_name_is_found_as_miniz_finds_it(names, queries):
    """Names asked for in another letter case (or absent): `get`'s folded lookup against
    miniz's table, on archives whose names differ ignoring case."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for k, name in enumerate(names):
            z.writestr(name, bytes([k]))
    arc = zip_reader.read_zip(ByteSource.from_bytes(buf.getvalue()))
    for q in queries + [n.upper() for n in names] + [n.swapcase() for n in names]:
        assert arc.get(q) is _via_miniz(arc, q), q
