"""The tolerant zip reader under every zip-based format (torch.save, TorchScript, .pt2, .npz, DCP).

Format (PKWARE APPNOTE 6.3.x), as the readers that matter apply it:

- An archive MUST end with an end-of-central-directory record (EOCD, ``PK\\x05\\x06``, 22 bytes + a
  comment of up to 65535 bytes). Readers find it by scanning BACKWARDS from the end of the file
  over at most 65535 + 22 bytes and take the LAST signature that has 22 bytes after it (miniz
  ``mz_zip_reader_locate_header_sig``; CPython ``zipfile._EndRecData`` does the same with
  ``rfind``). A fake EOCD inside the comment therefore wins; we record any other plausible EOCD.
- A ZIP64 archive MAY put a locator (``PK\\x06\\x07``, 20 bytes) right before the EOCD, pointing at
  a zip64 EOCD record (``PK\\x06\\x06``, 56 bytes + extensible data). When present, its counts,
  size and offset replace the 32-bit ones (both miniz and zipfile always prefer them). torch
  writes this record in every archive (miniz ``MZ_ZIP_FLAG_WRITE_ZIP64``).
- The central directory (CD) holds one 46-byte entry (``PK\\x01\\x02``) per member + name + extra
  + comment. When csize/usize/local-header-offset are 0xFFFFFFFF (or the disk 0xFFFF), the real
  values are in the zip64 extra field 0x0001, holding ONLY the sentinel fields, in the order
  usize, csize, header offset, disk.
- Each member's data starts at ``header_offset + 30 + LOCAL name_len + LOCAL extra_len``: the
  local header's lengths, not the central ones (torch pads the LOCAL extra with a ``FB`` record to
  align data; its central extra is empty). PyTorch's ``getRecordOffset`` computes exactly this.
- With general-purpose flag bit 3 the local CRC and sizes MAY be 0 and a data descriptor
  (optional ``PK\\x07\\x08`` + crc + csize + usize, sizes 4 or 8 bytes) follows the data. torch
  writes flag 0x0808 that way for every non-empty record: this is normal, not an anomaly.
- Names are UTF-8 when flag bit 11 is set, else cp437 (zipfile decodes so; miniz and PyTorch
  compare the raw bytes).

How PyTorch's reader differs from Python's zipfile (where attacks live, recorded as anomalies):

- Bytes prepended to the archive: zipfile computes ``concat = eocd_pos - cd_size - cd_offset``
  and shifts every offset by it; miniz takes the offsets as absolute (and so fails to open a
  ``cat header.jpg model.pt`` file). We read such a file the zipfile way, set `prepended`, and
  record ``zip.prepended_bytes`` saying that PyTorch would not open it.
- Entry count: miniz reads exactly the EOCD count of entries; zipfile reads entries until the CD
  size is used up. We list every entry in the CD; `ZipArchive.get` looks only among the first
  ``EOCD count`` ones, as miniz does.
- Duplicate names: zipfile's ``NameToInfo`` keeps the LAST entry of a name. miniz (opened by
  PyTorch without ``MZ_ZIP_FLAG_DO_NOT_SORT_CENTRAL_DIRECTORY``) heap-sorts the CD by ASCII-
  lowercased name and binary-searches it, case-INSENSITIVELY: which duplicate it returns depends
  on the heap sort. `ZipArchive.get` replays that sort and search, so it returns PyTorch's pick.
- zipfile truncates a name at its first NUL and refuses a member whose local name differs from
  the central one; miniz ignores the local name.

Anomaly kinds (``tensorscope.model.Anomaly.kind``): ``zip.duplicate_name``,
``zip.local_name_mismatch``, ``zip.local_header_mismatch``, ``zip.compressed_member``,
``zip.encrypted_member``, ``zip.data_out_of_range``, ``zip.overlapping_members``,
``zip.unaccounted_bytes``, ``zip.prepended_bytes``, ``zip.trailing_bytes``, ``zip.multiple_eocd``,
``zip.bad_crc``, ``zip.cd_count_mismatch``, ``zip.non_utf8_name``, ``zip.absolute_or_parent_path``,
``zip.comment``, and beyond the shared list: ``zip.bad_local_header`` (no local header signature
where the CD points: member unreadable), ``zip.bad_zip64`` (zip64 locator/record/extra field
missing or inconsistent), ``zip.bad_extra_field`` (extra field lengths overrun),
``zip.nul_in_name`` (zipfile truncates the name there), ``zip.stored_size_mismatch`` (a STORED
member whose compressed and uncompressed sizes differ: miniz rejects the whole archive).

Layout: this module is the archive API: `sniff`, `ZipArchive` (`get`, `names`, `data`,
`read_bytes`, `verify_crc`, `torch_prefix`, `release`), `ZipMember`, `release_pages`, and the
switches of the compiled step. The reader that builds an archive is `zip_reader` (`read_zip`,
`truncation`); the binary layouts are in `zip_structs`; decompression and miniz's sorted
directory in `zip_inflate`.

Cost: O(central directory). Listing reads the EOCD region, the CD, each local header and each
data descriptor; member data only for the optional CRC check of STORED members <= 1 MiB.
"""
from __future__ import annotations

import lzma
import mmap
import zlib
from dataclasses import dataclass, field

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.model import Anomaly
from tensorscope.native import optional_extension
from tensorscope.parsers.zip_inflate import _CHUNK, _bad_crc, _decompress, _miniz_heap_sort
# METHOD_* are in this module's public API (`__all__`); the other layouts are the reader's.
from tensorscope.parsers.zip_structs import (
    FLAG_ENCRYPTED, FLAG_STRONG_ENCRYPTION, MAGIC_EOCD, MAGIC_LOCAL, METHOD_BZIP2, METHOD_DEFLATED,
    METHOD_LZMA, METHOD_STORED,
)
from tensorscope.source import ByteSource

__all__ = ["ZipMember", "ZipArchive", "release_pages", "sniff", "FORMAT",
           "METHOD_STORED", "METHOD_DEFLATED", "METHOD_BZIP2", "METHOD_LZMA"]

FORMAT = "zip"

_SHORTCUTS = True   # the plain-member step and the one-span layout check (tests turn them off)

# The compiled plain-member step (tensorscope/_zipscan.c, built by `pip install` when a C compiler
# is there): `regular_member`'s checks, the data descriptor and the small CRC for whole runs of
# entries. Without it every entry is read by the Python loop, with the same results.
ZIPSCAN_ABI = 1   # what `_zipscan.c` must say it is (a stale build is ignored, not called)
_SCAN = optional_extension("_zipscan", ZIPSCAN_ABI)


def sniff(head: bytes, size: int) -> bool:
    """True iff the file starts like a zip: a local header (torch.load's ``_is_zipfile`` test) or
    the EOCD of an empty archive."""
    return head[:4] in (MAGIC_LOCAL, MAGIC_EOCD)


@dataclass(slots=True)
class ZipMember:
    """One central-directory entry, located in the file. Treat it as read-only (not frozen only
    because a frozen dataclass costs ~1 µs more per member: 100,000-member archives). Those made
    by the compiled step (`tensorscope/_zipscan.c`) are tracked by the collector as any other.

    Attributes:
        name: decoded name (UTF-8 if flag bit 11 else cp437, as zipfile does; undecodable UTF-8
            bytes are kept as surrogate escapes). Not truncated at NUL (zipfile would).
        raw_name: the name bytes in the central directory (what miniz/PyTorch compare).
        index: position in the central directory.
        header_offset: absolute offset of the LOCAL header (the CD value + `ZipArchive.prepended`).
        data_offset: absolute offset of the data: header_offset + 30 + LOCAL name_len + LOCAL
            extra_len (PyTorch's ``getRecordOffset``). Equals header_offset + 30 when the local
            header could not be read (see ``error``).
        compressed_size, size, crc32, method, flags: from the central directory (zip64 applied).
        local_name: the name in the local header, None when it could not be read.
        error: why this member's data cannot be trusted or read, None when it can.
    """

    name: str
    raw_name: bytes
    index: int
    header_offset: int
    data_offset: int
    compressed_size: int
    size: int
    crc32: int
    method: int
    flags: int
    local_name: bytes | None = None
    error: str | None = None

    @property
    def is_stored(self) -> bool:
        return self.method == METHOD_STORED

    @property
    def is_encrypted(self) -> bool:
        return bool(self.flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION))

    @property
    def is_dir(self) -> bool:
        return self.name.endswith("/")

    @property
    def data_end(self) -> int:
        return self.data_offset + self.compressed_size


if _SCAN is not None:
    try:
        _SCAN.bind(ZipMember)
    except TypeError:   # fields it does not know: a stale build (the tests fail on this)
        _SCAN = None


@dataclass(slots=True)
class ZipArchive:
    """A parsed archive: members in central-directory order, anomalies, and the layout.

    Attributes:
        source: the ByteSource read.
        members: every central-directory entry, in order (including those beyond the EOCD count).
        anomalies: what a forensic reader should know (see the module docstring for the kinds).
        eocd_offset: absolute offset of the EOCD record used.
        cd_offset: absolute offset of the central directory (after the prepended shift).
        cd_size: its size in bytes.
        comment: the archive comment (as much of it as the file holds).
        zip64: True when a zip64 EOCD record was used.
        prepended: the shift applied to every CD offset (zipfile's ``concat``): 0 normally, N when
            N bytes were put in front of an archive whose offsets were not adjusted.
        eocd_count: the entry count the EOCD (or zip64 record) declares; miniz sees only that many.
        miniz_error: why PyTorch's reader (miniz ``mz_zip_reader_init``) would refuse to open this
            archive at all, None when it would open it.
    """

    source: ByteSource
    members: list[ZipMember]
    anomalies: list[Anomaly]
    eocd_offset: int
    cd_offset: int
    cd_size: int
    comment: bytes
    zip64: bool
    prepended: int = 0
    eocd_count: int = 0
    miniz_error: str | None = None
    _exact: dict[str, ZipMember] | None = field(default=None, repr=False)
    _miniz_index: dict[bytes, list[int]] | None = field(default=None, repr=False)
    _miniz_sorted: list[int] | None = field(default=None, repr=False)
    _crc_checked: set[int] = field(default_factory=set, repr=False)
    _distinct: bool = field(default=False, repr=False)   # see `_exact_table`
    _folded: dict[str, ZipMember] | None = field(default=None, repr=False)   # see `get`

    # -- lookup ----------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every member's decoded name, central-directory order (duplicates included)."""
        return [m.name for m in self.members]

    def get(self, name: str | bytes) -> ZipMember | None:
        """The member PyTorch's reader (miniz) returns for ``name`` (full name, prefix included;
        bytes are matched as they are, a str is encoded to UTF-8 as torch does).


        miniz matches ASCII-case-insensitively among the first `eocd_count` entries, through a
        binary search of the heap-sorted directory: for duplicate names this is NOT zipfile's
        choice (the last one). The disagreement is recorded as ``zip.duplicate_name`` by
        `read_zip`. Returns None when miniz would not find the name.
        """
        exact = self._exact
        if exact is None:
            exact = self._exact_table()
        if type(name) is str and name in exact:     # the common case, see _exact_table
            return exact[name]
        if exact and _SHORTCUTS and type(name) is str and name.isascii() and "\0" not in name:
            # A name missing as it is (torch_zip asks for optional records). miniz matches an
            # ASCII key only to an ASCII raw name without NUL: one of `exact`'s, of which no two
            # are alike ignoring case. So the lowered name finds it, among the names that are
            # lowercase already or among those folded, without miniz's table of every member.
            low = name.lower()
            found = exact.get(low)
            if found is None:
                folded = self._folded
                if folded is None:
                    folded = self._folded = {lk: m for k, m in exact.items()
                                             if (lk := k.lower()) != k}
                found = folded.get(low)
            return found
        raw = name.encode("utf-8", "surrogateescape") if isinstance(name, str) else bytes(name)
        if b"\0" in raw:
            raw = raw.split(b"\0", 1)[0]  # miniz takes a C string
        key = raw.lower()
        index = self._miniz_index
        if index is None:
            index = self._miniz_lookup_table()
        candidates = index.get(key)
        if not candidates:
            return None
        if len(candidates) == 1:
            return self.members[candidates[0]]
        return self.members[self._miniz_binary_search(key)]

    def _visible(self) -> int:
        return min(self.eocd_count, len(self.members))

    def exact_lookups(self) -> bool:
        """True when no two visible names are alike ignoring case (`get` then answers ASCII
        names from a plain dict)."""
        return bool(self._exact if self._exact is not None else self._exact_table())

    def records_under(self, start: str, record) -> dict | None:
        """``{key: record(name, error, method, data_offset, size)}`` for each of the first
        `eocd_count` members whose name starts with the ASCII ``start``, as it is or once
        lowercased (str.lower), keyed by its lowercased name; None when such a name is not
        ASCII or holds a NUL. ``record``: a tuple subclass without instance dicts (a NamedTuple).
        What torch_zip's `data_records` needs for its per-tensor lookups, in one compiled loop
        where `_zipscan` is built (10^5 members: ~1.3 µs each in Python)."""
        if _SCAN is not None and _SHORTCUTS:
            got = _SCAN.records(self.members, self.eocd_count, start, record)
            if got is not NotImplemented:
                return got
        low_start, cut = start.lower(), len(start)
        out = {}
        for m in self.members[:self.eocd_count]:
            name = m.name
            if name.startswith(start) or name[:cut].lower() == low_start:
                if not name.isascii() or "\0" in name:
                    return None
                low = name.lower()
                out[name if low == name else low] = record(name, m.error, m.method,
                                                           m.data_offset, m.size)
        return out

    def release(self) -> None:
        """Let go of the members, for a one-pass reader that has taken what it needs from them
        (`torch_zip` under `zip_dispatch.listing_only`: 10^5 members are ~30 MB). Any later use
        of the member list raises `ReleasedArchive`."""
        self.members = _Released()
        self._exact = self._miniz_index = self._miniz_sorted = self._folded = None

    def _exact_table(self) -> dict[str, ZipMember]:
        """ASCII names without NUL -> member, when no two visible names are alike ignoring
        case: for such a name miniz's case-insensitive search can only return that member, so
        `get` answers from a plain dict (a torch archive has one member per tensor: 10^5
        lookups). Empty when names collide: every lookup then takes miniz's path."""
        visible = self.members[:self._visible()]
        # (`read_zip` found no two visible names alike ignoring case when _distinct is set)
        if not self._distinct and len({m.raw_name.lower() for m in visible}) != len(visible):
            self._exact = {}
        else:
            table = _SCAN.exact(self.members, len(visible)) if _SCAN and _SHORTCUTS else None
            self._exact = table if table is not None else {
                m.name: m for m in visible if m.raw_name.isascii() and b"\0" not in m.raw_name}
        return self._exact

    def _miniz_lookup_table(self) -> dict[bytes, list[int]]:
        if self._miniz_index is None:
            table: dict[bytes, list[int]] = {}
            for m in self.members[:self._visible()]:
                table.setdefault(m.raw_name.lower(), []).append(m.index)
            self._miniz_index = table
        return self._miniz_index

    def _miniz_binary_search(self, key: bytes) -> int:
        """Replay miniz's heap sort + binary search (only needed when names collide)."""
        if self._miniz_sorted is None:
            keys = [m.raw_name.lower() for m in self.members[:self._visible()]]
            self._miniz_sorted = _miniz_heap_sort(keys)
        order = self._miniz_sorted
        lo, hi = 0, len(order) - 1
        while lo <= hi:
            mid = lo + ((hi - lo) >> 1)
            other = self.members[order[mid]].raw_name.lower()
            if other == key:
                return order[mid]
            if other < key:
                lo = mid + 1
            else:
                hi = mid - 1
        raise AssertionError("unreachable: key is known to be present")  # pragma: no cover

    def torch_prefix(self) -> str | None:
        """The archive prefix as PyTorch computes it: the text before the first '/' of the FIRST
        central-directory entry's name (None when there is no entry or no '/': torch.load then
        fails with "file in archive is not in a subdirectory")."""
        if not self.members:
            return None
        raw = self.members[0].raw_name
        cut = raw.find(b"/")
        if cut < 0:
            return None
        return raw[:cut].decode("utf-8", "surrogateescape")

    # -- data ------------------------------------------------------------------------------------
    def _fail(self, member: ZipMember, reason: str, offset: int | None = None) -> FormatError:
        return FormatError(reason, format=FORMAT, file=self.source.path, member=member.name,
                           offset=member.header_offset if offset is None else offset)

    def data(self, member: ZipMember) -> memoryview:
        """The member's stored bytes (compressed bytes for a compressed member), zero-copy.

        Raises:
            FormatError: the member has an ``error`` or its data lies outside the file.
        """
        if member.error:
            raise self._fail(member, member.error)
        if member.data_offset + member.compressed_size > self.source.size:
            raise self._fail(member, f"data ({member.compressed_size} bytes) runs past the end of "
                                     f"the file ({self.source.size} bytes)", member.data_offset)
        return self.source.view(member.data_offset, member.compressed_size, "member data",
                                fmt=FORMAT, member=member.name)

    def read_bytes(self, member: ZipMember, max_size: int = 256 << 20) -> bytes:
        """The member's uncompressed content, a copy. STORED, DEFLATE, BZIP2 and LZMA.

        The output is capped at ``max_size`` bytes whatever the headers claim (zip bombs).

        Raises:
            LimitExceeded: the content is (or decompresses to) more than ``max_size`` bytes.
            FormatError: unreadable member, unsupported method, corrupt stream, or a
                decompressed size different from the central directory's.
        """
        raw = self.data(member)
        where = dict(format=FORMAT, file=self.source.path, member=member.name,
                     offset=member.data_offset)
        if member.is_encrypted:
            raise self._fail(member, "member is encrypted")
        if member.method == METHOD_STORED:
            if len(raw) > max_size:
                raise LimitExceeded("member size", max_size, len(raw), **where)
            return bytes(raw)
        # A list of pieces joined once: peak memory is twice the output (a bytearray grown by
        # += and then copied to bytes peaks near three times: decompression bombs, issue #9).
        out: list[bytes] = []
        produced = 0
        # Inflate no further than the central directory's size (+1 to detect a lie): miniz and
        # zipfile stop there too, and a bomb then costs what the archive admits to.
        limit = min(max_size, member.size)
        try:
            for piece in _decompress(member.method, raw, limit + 1, member, self):
                out.append(piece)
                produced += len(piece)
                if produced > max_size:
                    raise LimitExceeded("decompressed member size", max_size, None, **where)
                if produced > member.size:
                    raise FormatError(f"inflates past the {member.size} bytes the central "
                                      "directory declares", **where)
        except FormatError:
            raise
        except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
            raise FormatError(f"corrupt compressed data (method {member.method}): {e}",
                              **where) from None
        if produced != member.size:
            raise FormatError(f"decompressed to {produced} bytes, the central directory says "
                              f"{member.size}", **where)
        return b"".join(out)

    def verify_crc(self, member: ZipMember, max_size: int = 1 << 62) -> bool:
        """Compute the member's CRC-32 (reads all its data) and compare with the central
        directory. A mismatch is recorded once as ``zip.bad_crc``. Returns True when they match.

        Raises:
            FormatError/LimitExceeded: as `read_bytes` for unreadable or oversized members.
        """
        if member.is_stored:
            raw = self.data(member)
            crc = 0
            for start in range(0, len(raw), _CHUNK):
                crc = zlib.crc32(raw[start:start + _CHUNK], crc)
        else:
            crc = zlib.crc32(self.read_bytes(member, max_size))
        ok = crc == member.crc32
        if not ok and member.index not in self._crc_checked:
            self.anomalies.append(_bad_crc(self.source.path, member, crc))
        self._crc_checked.add(member.index)
        return ok


class ReleasedArchive(RuntimeError):
    """A `ZipArchive` used after `ZipArchive.release` (a programming error, not bad input)."""


class _Released(list):
    """`ZipArchive.members` after `release`: reading it raises rather than look empty."""

    __slots__ = ()

    def _refuse(self, *args):
        raise ReleasedArchive("the archive's members were released (listing_only): read the "
                              "file again")

    __iter__ = __len__ = __getitem__ = __bool__ = __contains__ = _refuse


def release_pages(src) -> None:
    """Drop the pages of ``src``'s map from the resident set (MADV_DONTNEED). They stay in the
    page cache and fault back in when read again (the pickle, tensor values): the resident set
    no longer carries bytes a parse has merely passed. A hint: no-op for other sources."""
    mm = getattr(src, "_mmap", None)
    if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mm.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):   # a hint only: a kernel that refuses it changes nothing
            pass
