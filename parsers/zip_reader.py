"""The tolerant zip reader: finds the EOCD, reads the central directory and every local header,
compares them, and records each place where PyTorch's miniz and Python's zipfile read the archive
differently (see `tensorscope.parsers.zipfmt` for the format and the anomaly kinds). `read_zip`
returns a `ZipArchive`; `truncation` says why an archive without an EOCD is a cut download.

The compiled plain-member step and the shortcuts are switched in `zipfmt` (``zipfmt._SCAN``,
``zipfmt._SHORTCUTS``, which tests turn off): this module reads them there at each use.
"""
from __future__ import annotations

import operator
import re
import struct
import zlib

from tensorscope.errors import FormatError, LimitExceeded
from tensorscope.model import Anomaly
from tensorscope.parsers import zipfmt
from tensorscope.parsers.zip_structs import (
    _CD_COMMENT_LEN, _CD_CRC, _CD_CSIZE, _CD_DISK, _CD_EXTRA_LEN, _CD_FLAGS, _CD_METHOD,
    _CD_NAME_LEN, _CD_OFFSET, _CD_USIZE, _DESCRIPTORS, _LH_CRC, _LH_CSIZE, _LH_EXTRA_LEN,
    _LH_FLAGS, _LH_METHOD, _LH_NAME_LEN, _LH_SIG, _LH_USIZE, _LOCAL_SIZE, _LOCAL_UNPACK, CENTRAL,
    EOCD, EOCD64, EOCD64_LOCATOR, EXTRA_HEADER, EXTRA_ZIP64, FLAG_DESCRIPTOR, FLAG_ENCRYPTED,
    FLAG_MASKED_LOCAL, FLAG_STRONG_ENCRYPTION, FLAG_UTF8, MAGIC_CENTRAL, MAGIC_DESCRIPTOR,
    LOCAL, MAGIC_EOCD, MAGIC_EOCD64, MAGIC_EOCD64_LOCATOR, MAGIC_LOCAL, MAX_COMMENT,
    METHOD_DEFLATED, METHOD_STORED, SMALL_CRC_LIMIT, U16_MAX, U32_MAX,
)
from tensorscope.parsers.zipfmt import FORMAT, ZipArchive, ZipMember, release_pages
from tensorscope.source import ByteSource


SPARSE_SPAN = 256 << 10                  # bytes per member above which headers are pread
_IRREGULAR_FLAGS = FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION | FLAG_MASKED_LOCAL
# Names make_member reports something about (NUL, absolute, drive letter, parent): a superset.
_IRREGULAR_NAME = re.compile(rb"[\x00:\\]|\.\.|\A/")

_span_key = operator.itemgetter(0, 1)


def _what(span: tuple) -> str:
    """A layout span's description in messages (members' are made only when needed)."""
    return span[2] if span[2] is not None else f"member {span[4].name!r}"


def _torch_compresses(raw_name: bytes, method: int) -> bool:
    """torch.jit.save DEFLATEs the TorchScript sources and debug pickles under ``<prefix>/code/``
    (``writeRecord(..., compress=true)``): that is normal and not reported."""
    _, _, rest = raw_name.partition(b"/")
    return (method == METHOD_DEFLATED and rest.startswith(b"code/")
            and rest.endswith((b".py", b".debug_pkl")))


# --- reading -------------------------------------------------------------------------------------
def truncation(src: ByteSource, max_members: int = 1_000_000) -> str | None:
    """Why an archive without an EOCD is a cut download, or None: it starts with local file
    headers, walked one after the other (as ``zip -FF`` would) until one, or its data, runs past
    the end of the file; when all fit, the central directory is what is missing."""
    buf, size = src.view(0, src.size, "archive", fmt=FORMAT), src.size
    raw = src.raw  # valid: the view above fetched every byte of a remote source
    find = raw.find if hasattr(raw, "find") else bytes(raw).find
    pos = count = 0
    while count < max_members and bytes(buf[pos:pos + 4]) == MAGIC_LOCAL:
        if LOCAL.size > size - pos:
            return (f"truncated: the local header at byte {pos} needs {pos + LOCAL.size} bytes, "
                    f"the file ends at {size}")
        f = LOCAL.unpack(bytes(buf[pos:pos + LOCAL.size]))
        flags, csize, usize, name_len, extra_len = f[3], f[8], f[9], f[10], f[11]
        data = pos + LOCAL.size + name_len + extra_len
        name = bytes(buf[pos + LOCAL.size:min(pos + LOCAL.size + name_len, size)]).decode(
            "utf-8", "replace")
        if data > size:
            return f"truncated: the header of member {name!r} needs {data} bytes, the file ends at {size}"
        if csize == 0xFFFFFFFF:   # zip64: the sizes are in the extra field (id 1)
            extra = bytes(buf[data - extra_len:data])
            at = 0
            while at + 4 <= len(extra):
                xid, xlen = EXTRA_HEADER.unpack_from(extra, at)
                skip = 8 if usize == 0xFFFFFFFF else 0   # the sizes present: uncompressed first
                if xid == 1 and xlen >= skip + 8 and at + 4 + skip + 8 <= len(extra):
                    csize = struct.unpack_from("<Q", extra, at + 4 + skip)[0]
                    break
                at += 4 + xlen
        if flags & 8 and csize in (0, 0xFFFFFFFF):
            # Streamed (torch's writer): the size is in a data descriptor after the data, found
            # by its signature and a compressed size that matches the distance.
            pos = _descriptor_end(src, data, find)
            if pos is None:
                return (f"truncated: member {name!r} (data from byte {data}) has no end: its data "
                        f"descriptor and the central directory are missing, the file ends at {size}")
        else:
            end = data + csize
            if end > size:
                return f"truncated: member {name!r} needs {end} bytes, the file ends at {size}"
            pos = end
            if flags & 8:   # data descriptor: optional signature, CRC and the two sizes
                pos += (4 if bytes(buf[pos:pos + 4]) == b"PK\x07\x08" else 0) + 12
        count += 1
    if count and (pos >= size or bytes(buf[pos:pos + 4]) == b"PK\x01\x02"):
        return (f"truncated: the central directory after {count} complete members is missing or "
                f"cut, the file ends at {size}")
    return None


def _descriptor_end(src: ByteSource, data: int, find) -> int | None:
    """End of the data descriptor that closes a streamed member whose data starts at ``data``
    (``find``: the file's bytes.find)."""
    at = data
    while (sig := find(b"PK\x07\x08", at)) >= 0:
        d = src.read(sig + 4, max(0, min(20, src.size - sig - 4)))
        if len(d) >= 12 and struct.unpack_from("<L", d, 4)[0] == sig - data:
            return sig + 16
        if len(d) >= 20 and struct.unpack_from("<Q", d, 4)[0] == sig - data:
            return sig + 24
        at = sig + 1
    return None


class _Reader:
    """One pass over an archive; `read_zip` wraps it."""

    def __init__(self, src: ByteSource, max_members: int, check_small_crc: bool):
        self.src = src
        self.size = src.size
        self.max_members = max_members
        self.check_small_crc = check_small_crc
        self.anomalies: list[Anomaly] = []
        self.miniz_error: str | None = None
        self.sparse = False     # set once the member count is known (see `peek`)
        # What the compiled step (`zipfmt._SCAN`) did, when `read_cd` used it: the indices of
        # members it found with a wrong small CRC, of those the Python loop made, and the span of
        # the members when it made them all and they lie end to end.
        self.scanned = False
        self.crc_bad: list[int] = []
        self.made: list[int] = []
        self.span: tuple[int, int] | None = None
        # The whole file as one view when it is a local map or a buffer (not a remote source,
        # which fetches ranges): the regular-member path reads headers through it directly.
        self.buf = src.buffer if type(src) is ByteSource else None
        # bytes of a slice of it: an mmap slices straight to bytes (one step, not two)
        mm = src._mmap if self.buf is not None else None
        self.copy = ((lambda a, b: mm[a:b]) if mm is not None else
                     (lambda a, b: bytes(self.buf[a:b])))

    def add(self, kind: str, message: str, member: str | None = None,
            offset: int | None = None) -> None:
        self.anomalies.append(Anomaly(kind, message, file=self.src.path, member=member,
                                      offset=offset))

    def miniz_fails(self, reason: str) -> None:
        if self.miniz_error is None:
            self.miniz_error = reason

    def error(self, reason: str, offset: int | None = None) -> FormatError:
        return FormatError(reason, format=FORMAT, file=self.src.path, offset=offset)

    def fits(self, offset: int, length: int) -> bool:
        return 0 <= offset and 0 <= length and length <= self.size - offset

    def bytes_at(self, offset: int, length: int) -> bytes:
        return bytes(self.peek(offset, length))

    def peek(self, offset: int, length: int) -> bytes | memoryview:
        """Up to ``length`` bytes at ``offset``: a view when records are dense, with
        `ByteSource.pread` when they are sparse in a local file (members of 256 KiB and more on
        average), so that listing a 2 GB archive does not make the pages around every header
        resident (the kernel maps 64 KiB around each touch of a map)."""
        if self.sparse:
            return self.src.pread(offset, length)
        return self.src.view(offset, max(0, min(length, self.size - offset)), fmt=FORMAT)

    # -- EOCD ------------------------------------------------------------------------------------
    def find_eocd(self) -> tuple[int, list[int]]:
        """The EOCD miniz and zipfile pick (last signature with 22 bytes after it, within the
        last 64 KiB + 22), plus every other EOCD signature in that window."""
        if self.size < EOCD.size:
            raise self.error(f"not a zip archive: {self.size} bytes, fewer than the "
                             f"{EOCD.size} of an end-of-central-directory record")
        start = max(0, self.size - (MAX_COMMENT + EOCD.size))
        window = self.bytes_at(start, self.size - start)
        found: list[int] = []  # every signature in the window, last first
        end = len(window)
        while (pos := window.rfind(MAGIC_EOCD, 0, end)) >= 0:
            found.append(start + pos)
            end = pos + len(MAGIC_EOCD) - 1
        usable = [p for p in found if self.size - p >= EOCD.size]
        if not usable:
            raise self.error(truncation(self.src) or "not a zip archive: no end-of-central-"
                             f"directory record (PK\\x05\\x06) in the last {self.size - start} bytes")
        return usable[0], usable[1:]

    def read(self) -> ZipArchive:
        eocd_pos, others = self.find_eocd()
        (_, disk, cd_disk, n_this, n_total, cd_size, cd_offset,
         comment_len) = EOCD.unpack(self.bytes_at(eocd_pos, EOCD.size))
        tail = self.size - eocd_pos - EOCD.size
        comment = self.bytes_at(eocd_pos + EOCD.size, min(comment_len, tail))
        eocd_end = eocd_pos + EOCD.size + len(comment)
        if comment_len > tail:
            self.add("zip.comment", f"archive comment claims {comment_len} bytes, only {tail} "
                     "remain in the file", offset=eocd_pos)
        elif comment:
            self.add("zip.comment", f"archive comment of {len(comment)} bytes: "
                     f"{comment[:80]!r}{'...' if len(comment) > 80 else ''}",
                     offset=eocd_pos + EOCD.size)

        # zip64: locator right before the EOCD, record where the locator says (miniz) or right
        # before the locator (zipfile's assumption, which survives prepended bytes).
        zip64 = False
        z64_pos: int | None = None      # zip64 record used
        z64_end = loc_pos = -1           # end of that record; locator position
        if eocd_pos >= EOCD64_LOCATOR.size and self.bytes_at(
                eocd_pos - EOCD64_LOCATOR.size, 4) == MAGIC_EOCD64_LOCATOR:
            loc_pos = eocd_pos - EOCD64_LOCATOR.size
            _, loc_disk, rel, total_disks = EOCD64_LOCATOR.unpack(
                self.bytes_at(loc_pos, EOCD64_LOCATOR.size))
            if loc_disk != 0 or total_disks > 1:
                self.miniz_fails("zip64 locator describes a multi-disk archive")
            for cand in (rel, loc_pos - EOCD64.size):
                if self.fits(cand, EOCD64.size) and cand + EOCD64.size <= loc_pos and \
                        self.bytes_at(cand, 4) == MAGIC_EOCD64:
                    z64_pos = cand
                    break
            if z64_pos is None:
                self.add("zip.bad_zip64", f"zip64 locator points to byte {rel}, where there is "
                         "no zip64 end-of-central-directory record", offset=loc_pos)
                self.miniz_fails("zip64 locator points to no zip64 record")
            else:
                if z64_pos != rel:
                    self.miniz_fails(f"zip64 locator points to byte {rel}, the record is at "
                                     f"{z64_pos}")
                (_, rec_size, _, _, disk, cd_disk, n_this, n_total, cd_size,
                 cd_offset) = EOCD64.unpack(self.bytes_at(z64_pos, EOCD64.size))
                zip64 = True
                z64_end = z64_pos + 12 + rec_size
                if rec_size < EOCD64.size - 12 or z64_end > loc_pos:
                    self.add("zip.bad_zip64", f"zip64 record size field {rec_size} does not fit "
                             f"between the record and the locator", offset=z64_pos)
                    z64_end = loc_pos
                    if rec_size < EOCD64.size - 12:
                        self.miniz_fails("zip64 record too small")
        if n_this != n_total or disk or cd_disk:
            self.add("zip.cd_count_mismatch", f"EOCD says {n_this} entries on this disk, "
                     f"{n_total} in total (disk {disk}, CD disk {cd_disk}); multi-disk archives "
                     "are not supported by PyTorch's reader", offset=eocd_pos)
            self.miniz_fails("multi-disk archive")

        # Where the CD should end: at the zip64 record, or at the EOCD.
        cd_end_expected = z64_pos if zip64 else eocd_pos
        concat = cd_end_expected - cd_size - cd_offset
        start_dir, prepended = self.locate_cd(cd_offset, cd_size, concat, n_total, eocd_pos)
        if not self.fits(start_dir, cd_size):
            raise self.error(f"truncated central directory: {cd_size} bytes at offset "
                             f"{start_dir}, the file has {self.size} bytes", offset=start_dir)
        if cd_size < n_total * CENTRAL.size:
            self.miniz_fails("central directory smaller than its entry count allows")

        self.sparse = (hasattr(self.src, "pread")   # a local map (remote sources fetch ranges)
                       and self.size // max(n_total, 1) >= SPARSE_SPAN)
        members = self.read_cd(start_dir, cd_size, n_total, prepended)
        if len(members) != n_total:
            self.add("zip.cd_count_mismatch", f"EOCD declares {n_total} entries, the central "
                     f"directory holds {len(members)}: PyTorch's reader (miniz) reads "
                     f"{n_total}, Python's zipfile reads {len(members)}", offset=eocd_pos)
            if n_total > len(members):
                self.miniz_fails(f"EOCD declares {n_total} entries, the directory holds "
                                 f"{len(members)}")

        archive = ZipArchive(self.src, members, self.anomalies, eocd_pos, start_dir, cd_size,
                             comment, zip64, prepended, n_total)
        self.check_duplicates(archive)
        self.check_layout(members, start_dir, cd_size, z64_pos, z64_end, loc_pos, eocd_pos,
                          eocd_end, prepended)
        self.check_other_eocds(others, eocd_pos)
        if self.check_small_crc:
            crc32, buf, size = zlib.crc32, self.buf, self.size
            view = self.src.view if buf is None else (lambda at, n, fmt: buf[at:at + n])
            encrypted = FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION
            # The compiled step checked its members' CRCs: only its mismatches are read again.
            todo = [members[i] for i in sorted(self.made + self.crc_bad)] if self.scanned \
                else members
            for m in todo:
                if (m.error is None and m.method == METHOD_STORED and not m.flags & encrypted
                        and m.compressed_size <= SMALL_CRC_LIMIT):
                    start, n = m.data_offset, m.compressed_size
                    # verify_crc again only to record a mismatch (it bounds-checks the data)
                    if start + n > size or crc32(view(start, n, fmt=FORMAT)) != m.crc32:
                        archive.verify_crc(m)
        archive.miniz_error = self.miniz_error
        self.release_pages()
        return archive

    def release_pages(self) -> None:
        """Unmap the pages of the file this read touched through the map (every local header and
        small member of a dense archive: all of a 10^5-member checkpoint's pages)."""
        if self.buf is not None and not self.sparse:
            release_pages(self.src)

    def locate_cd(self, cd_offset: int, cd_size: int, concat: int, n_total: int,
                  eocd_pos: int) -> tuple[int, int]:
        """Pick the CD start: miniz reads it at ``cd_offset``; zipfile at ``cd_offset + concat``."""
        if concat == 0 or (cd_size == 0 and n_total == 0):
            return cd_offset, 0  # (an empty directory reads the same wherever it is)

        def has_cd(at: int) -> bool:
            if cd_size == 0 and n_total == 0:
                return self.fits(at, 0)
            return self.fits(at, 4) and self.bytes_at(at, 4) == MAGIC_CENTRAL

        miniz_ok = has_cd(cd_offset)  # a CD cut short is reported by the caller
        zipfile_ok = concat > 0 and has_cd(cd_offset + concat)
        if miniz_ok:
            if zipfile_ok:
                self.add("zip.prepended_bytes", f"two central directories: PyTorch's reader reads "
                         f"one at byte {cd_offset}, Python's zipfile one at byte "
                         f"{cd_offset + concat}; this reader follows PyTorch", offset=cd_offset)
            return cd_offset, 0
        if zipfile_ok:
            self.add("zip.prepended_bytes", f"{concat} bytes precede the archive and its offsets "
                     f"are not adjusted: Python's zipfile shifts them by {concat}, PyTorch's "
                     "reader (miniz) takes them as absolute and cannot open the archive",
                     offset=0)
            self.miniz_fails(f"central directory offsets are off by {concat} prepended bytes")
            return cd_offset + concat, concat
        raise self.error(f"no central directory at byte {cd_offset} (EOCD at {eocd_pos} declares "
                         f"{cd_size} bytes at offset {cd_offset})", offset=cd_offset)

    # -- central directory -----------------------------------------------------------------------
    def read_cd(self, start: int, cd_size: int, n_total: int,
                prepended: int) -> list[ZipMember]:
        cd = self.src.view(start, cd_size, "central directory", fmt=FORMAT)
        _prefetch_local_headers(self.src, cd, prepended)
        fast = self.buf is not None and not self.sparse and zipfmt._SHORTCUTS
        scan = zipfmt._SCAN.scan if fast and zipfmt._SCAN is not None else None
        if self.buf is not None and scan is None:
            cd = bytes(cd)  # a transient copy (~70 bytes a member): bytes slice and compare faster
        members: list[ZipMember] = []
        pos = 0
        cd_end = start + cd_size
        regular = self.regular_member if fast else None
        crc_limit = SMALL_CRC_LIMIT if self.check_small_crc else -1
        span = None
        while pos < cd_size:
            if scan is not None:
                # The compiled step reads entries until one it does not accept; this loop reads
                # that one (and reports what is odd about it), then hands back.
                first_call = not members and not self.made
                pos, first, end = scan(self.buf, self.size, cd, start, pos, members, prepended,
                                       self.max_members, crc_limit, self.crc_bad)
                if first_call and end >= 0:
                    span = (first, end)
                if pos >= cd_size:
                    break
            i = len(members)
            at = start + pos
            if cd_size - pos < CENTRAL.size or cd[pos:pos + 4] != MAGIC_CENTRAL:
                what = ("truncated" if cd_size - pos < CENTRAL.size else
                        f"bad signature {bytes(cd[pos:pos + 4])!r} in")
                if i >= n_total:  # miniz never looks past its count; zipfile fails here
                    self.add("zip.unaccounted_bytes", f"{cd_size - pos} bytes at the end of the "
                             f"central directory are not an entry ({what} entry #{i}); Python's "
                             "zipfile refuses the archive", offset=at)
                    break
                raise self.error(f"{what} central directory entry #{i}", offset=at)
            if i >= self.max_members:
                raise LimitExceeded("zip members", self.max_members, None, format=FORMAT,
                                    file=self.src.path, offset=at)
            fields = CENTRAL.unpack_from(cd, pos)
            var_len = fields[_CD_NAME_LEN] + fields[_CD_EXTRA_LEN] + fields[_CD_COMMENT_LEN]
            if CENTRAL.size + var_len > cd_size - pos:
                raise self.error(f"central directory entry #{i} ({CENTRAL.size + var_len} bytes) "
                                 f"runs past the end of the central directory", offset=at)
            p = pos + CENTRAL.size
            raw_name = bytes(cd[p:p + fields[_CD_NAME_LEN]])
            p += fields[_CD_NAME_LEN]
            if fields[_CD_EXTRA_LEN]:
                extra = bytes(cd[p:p + fields[_CD_EXTRA_LEN]])
                member = None
            else:
                extra = b""
                member = regular(i, fields, raw_name, prepended, start, cd_end) if regular \
                    else None
            if member is None:
                member = self.make_member(i, at, fields, raw_name, extra, prepended,
                                          (start, cd_end))
            members.append(member)
            if scan is not None:
                self.made.append(i)
            pos += CENTRAL.size + var_len
        self.scanned = scan is not None
        # Every member made by one call of the compiled step, laid end to end: their span.
        self.span = span if scan is not None and not self.made else None
        return members

    def regular_member(self, i: int, f: tuple, raw_name: bytes, prepended: int, cd_start: int,
                       cd_end: int) -> ZipMember | None:
        """`make_member`'s result for a plain entry (the kind torch writes: STORED, not
        encrypted, no central extra, an ASCII or valid UTF-8 name with nothing odd in it, a
        local header agreeing with the central one), in far fewer steps; None for anything
        else, which `make_member` then reads and reports in full. Every check whose failure
        `make_member` would report is made here too, so no entry that passes has an anomaly.
        `tensorscope/_zipscan.c` makes the same checks over runs of entries where it is built;
        this step reads entries when it is not."""
        (_, _, _, _, _, flags, method, _, _, crc, csize, usize, _, _, _, disk, _, _,
         offset) = f
        if (method != METHOD_STORED or flags & _IRREGULAR_FLAGS or disk or csize != usize
                or csize == U32_MAX or offset == U32_MAX
                or _IRREGULAR_NAME.search(raw_name) is not None):
            return None
        if raw_name.isascii():
            name = raw_name.decode("ascii")
        elif flags & FLAG_UTF8:
            try:
                name = raw_name.decode("utf-8")
            except UnicodeDecodeError:
                return None
        else:
            return None     # cp437: reported by make_member
        header = offset + prepended
        n = len(raw_name)
        start = header + _LOCAL_SIZE
        if start + n > self.size:
            return None
        (sig, _, _, l_flags, l_method, _, _, l_crc, l_csize, l_usize, l_name_len,
         l_extra_len) = _LOCAL_UNPACK(self.buf, header)
        if (sig != MAGIC_LOCAL or l_name_len != n or l_flags != flags
                or l_method != METHOD_STORED or self.copy(start, start + n) != raw_name):
            return None
        if not ((l_crc == crc and l_csize == csize and l_usize == csize)
                or (flags & FLAG_DESCRIPTOR and not (l_crc or l_csize or l_usize))):
            return None
        data_offset = start + n + l_extra_len
        end = data_offset + csize
        if end > self.size or (header < cd_end and end > cd_start):
            return None
        return ZipMember(name, raw_name, i, header, data_offset, csize, csize, crc,
                         METHOD_STORED, flags, raw_name, None)

    def decode_name(self, raw: bytes, flags: int, at: int) -> str:
        if flags & FLAG_UTF8:
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError:
                name = raw.decode("utf-8", "surrogateescape")
                self.add("zip.non_utf8_name", f"name {raw!r} is flagged UTF-8 but is not valid "
                         "UTF-8 (Python's zipfile raises UnicodeDecodeError)", member=name,
                         offset=at)
            return name
        name = raw.decode("cp437")
        if not raw.isascii():
            self.add("zip.non_utf8_name", f"name {raw!r} has no UTF-8 flag: Python's zipfile "
                     f"decodes it as cp437 ({name!r}), PyTorch compares the raw bytes",
                     member=name, offset=at)
        return name

    def make_member(self, i: int, at: int, f: tuple, raw_name: bytes, extra: bytes,
                    prepended: int, cd_span: tuple[int, int]) -> ZipMember:
        flags, method = f[_CD_FLAGS], f[_CD_METHOD]
        name = self.decode_name(raw_name, flags, at)
        if b"\0" in raw_name:
            self.add("zip.nul_in_name", f"name {raw_name!r} contains a NUL byte: Python's zipfile "
                     f"truncates it to {name.split(chr(0))[0]!r}", member=name, offset=at)
        if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":") or (
                ".." in name and ".." in name.replace("\\", "/").split("/")):
            self.add("zip.absolute_or_parent_path", f"name {name!r} is absolute or climbs out of "
                     "the extraction folder (path traversal when extracted, CWE-22)",
                     member=name, offset=at)

        usize, csize, offset, disk = f[_CD_USIZE], f[_CD_CSIZE], f[_CD_OFFSET], f[_CD_DISK]
        fields64 = self.parse_extra(extra, name, at, "central") if extra else {}
        needs = [usize == U32_MAX, csize == U32_MAX, offset == U32_MAX, disk == U16_MAX]
        if any(needs):
            z = fields64.get(EXTRA_ZIP64)
            values = []
            if z is not None:
                pos = 0
                for need, width in zip(needs, (8, 8, 8, 4)):
                    if need and pos + width <= len(z):
                        values.append(int.from_bytes(z[pos:pos + width], "little"))
                        pos += width
                    elif need:
                        values.append(None)
                    else:
                        values.append(-1)
            if z is None or None in values:
                self.add("zip.bad_zip64", "sizes or offset hold the zip64 sentinel 0xFFFFFFFF "
                         "but the zip64 extra field (0x0001) lacks them", member=name, offset=at)
                self.miniz_fails(f"entry #{i} lacks its zip64 extra field")
            else:
                if needs[0]:
                    usize = values[0]
                if needs[1]:
                    csize = values[1]
                if needs[2]:
                    offset = values[2]
                if needs[3]:
                    disk = values[3]
        if disk not in (0, U16_MAX):
            self.miniz_fails(f"entry #{i} is on disk {disk}")

        header_offset = offset + prepended
        error: str | None = None
        local_name: bytes | None = None
        data_offset = header_offset + LOCAL.size
        crc = f[_CD_CRC]

        if method == METHOD_STORED and csize != usize:
            self.add("zip.stored_size_mismatch", f"STORED member with compressed size {csize} and "
                     f"size {usize}: PyTorch's reader (miniz) rejects the whole archive",
                     member=name, offset=at)
            self.miniz_fails(f"entry #{i} is STORED with differing sizes")
        elif usize and not csize:
            self.miniz_fails(f"entry #{i} has size {usize} but no compressed bytes")
        if method != METHOD_STORED and not _torch_compresses(raw_name, method):
            self.add("zip.compressed_member", f"member is compressed (method {method}): torch "
                     "stores tensor data and pickles uncompressed, and a compressed member "
                     "cannot be memory-mapped", member=name, offset=at)
        if flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION | FLAG_MASKED_LOCAL):
            self.add("zip.encrypted_member", f"member is flagged encrypted (flags {flags:#06x})",
                     member=name, offset=at)
            error = "member is encrypted"
            if flags & FLAG_MASKED_LOCAL:
                self.miniz_fails(f"entry #{i} has masked local headers")

        if not self.fits(header_offset, LOCAL.size):
            error = (f"local header at byte {header_offset} lies outside the file "
                     f"({self.size} bytes)")
            self.add("zip.data_out_of_range", error, member=name, offset=at)
            self.miniz_fails(f"entry #{i} points outside the file")
        else:
            head = self.peek(header_offset, LOCAL.size + len(raw_name))  # header + name
            lf = LOCAL.unpack_from(head, 0)
            if lf[_LH_SIG] != MAGIC_LOCAL:
                error = (f"no local file header at byte {header_offset} "
                         f"(found {lf[_LH_SIG]!r})")
                self.add("zip.bad_local_header", error, member=name, offset=header_offset)
            else:
                lname_len, lextra_len = lf[_LH_NAME_LEN], lf[_LH_EXTRA_LEN]
                data_offset = header_offset + LOCAL.size + lname_len + lextra_len
                if not self.fits(header_offset + LOCAL.size, lname_len + lextra_len):
                    error = (f"local header name/extra ({lname_len}+{lextra_len} bytes) run past "
                             f"the end of the file")
                    self.add("zip.data_out_of_range", error, member=name, offset=header_offset)
                else:
                    start = header_offset + LOCAL.size
                    if lname_len == len(raw_name) and head[LOCAL.size:] == raw_name:
                        local_name = raw_name   # the same bytes: share the object
                    else:
                        local_name = self.bytes_at(start, lname_len)
                        self.add("zip.local_name_mismatch", f"local header names {local_name!r}, "
                                 f"the central directory {raw_name!r}: PyTorch uses the central "
                                 "name, Python's zipfile refuses the member", member=name,
                                 offset=header_offset)
                    l_crc, l_csize, l_usize = lf[_LH_CRC], lf[_LH_CSIZE], lf[_LH_USIZE]
                    if lf[_LH_METHOD] != method or lf[_LH_FLAGS] != flags or not (
                            (l_crc == crc and l_csize == csize and l_usize == usize)
                            or (flags & FLAG_DESCRIPTOR and not (l_crc or l_csize or l_usize))):
                        # Only a header that is not plainly equal (or deferred to a data
                        # descriptor, as torch writes it) needs the full comparison.
                        lextra = self.bytes_at(start + lname_len, lextra_len)
                        self.compare_local(lf, lextra, flags, method, crc, csize, usize, name,
                                           header_offset)
                if error is None and not self.fits(data_offset, csize):
                    error = (f"data ({csize} bytes at byte {data_offset}) runs past the end of "
                             f"the file ({self.size} bytes)")
                    self.add("zip.data_out_of_range", error, member=name, offset=data_offset)
                    self.miniz_fails(f"entry #{i} data runs past the end of the file")
                elif (error is None and header_offset < cd_span[1]
                      and data_offset + csize > cd_span[0]):
                    error = (f"data ({data_offset}..{data_offset + csize}) runs into the central "
                             f"directory ({cd_span[0]}..{cd_span[1]})")
                    self.add("zip.data_out_of_range", error, member=name, offset=data_offset)
        return ZipMember(name, raw_name, i, header_offset, data_offset, csize, usize, crc,
                         method, flags, local_name, error)

    def parse_extra(self, extra: bytes, name: str, at: int, where: str) -> dict[int, bytes]:
        """Extra-field records by id (first of each id). Overruns are recorded, not fatal."""
        out: dict[int, bytes] = {}
        pos = 0
        while pos + EXTRA_HEADER.size <= len(extra):
            tag, length = EXTRA_HEADER.unpack_from(extra, pos)
            body = extra[pos + 4:pos + 4 + length]
            if len(body) != length:
                self.add("zip.bad_extra_field", f"{where} extra field {tag:#06x} claims {length} "
                         f"bytes, {len(body)} remain (Python's zipfile raises BadZipFile)",
                         member=name, offset=at)
                break
            out.setdefault(tag, body)
            pos += 4 + length
        else:
            if pos != len(extra):
                self.add("zip.bad_extra_field", f"{len(extra) - pos} stray bytes at the end of the "
                         f"{where} extra field", member=name, offset=at)
        return out

    def compare_local(self, lf: tuple, lextra: bytes, flags: int, method: int, crc: int,
                      csize: int, usize: int, name: str, header_offset: int) -> None:
        diffs = []
        if lf[_LH_METHOD] != method:
            diffs.append(f"method {lf[_LH_METHOD]} vs {method}")
        if lf[_LH_FLAGS] != flags:
            diffs.append(f"flags {lf[_LH_FLAGS]:#06x} vs {flags:#06x}")
        l_crc, l_csize, l_usize = lf[_LH_CRC], lf[_LH_CSIZE], lf[_LH_USIZE]
        if U32_MAX in (l_csize, l_usize):
            z = self.parse_extra(lextra, name, header_offset, "local").get(EXTRA_ZIP64, b"")
            # Local zip64 extra: usize then csize, both always present (APPNOTE 4.5.3).
            if len(z) >= 16:
                l_usize = int.from_bytes(z[0:8], "little")
                l_csize = int.from_bytes(z[8:16], "little")
        # With a data descriptor (bit 3) the local CRC and sizes are 0 (torch: flag 0x0808):
        # compare them only when the writer filled them in.
        deferred = lf[_LH_FLAGS] & FLAG_DESCRIPTOR
        if not (deferred and l_crc == 0) and l_crc != crc:
            diffs.append(f"crc {l_crc:#010x} vs {crc:#010x}")
        if not (deferred and l_csize == 0 and l_usize == 0):
            if l_csize != csize:
                diffs.append(f"compressed size {l_csize} vs {csize}")
            if l_usize != usize:
                diffs.append(f"size {l_usize} vs {usize}")
        if diffs:
            self.add("zip.local_header_mismatch", "local header disagrees with the central "
                     f"directory (local vs central): {', '.join(diffs)}", member=name,
                     offset=header_offset)

    # -- cross-member checks --------------------------------------------------------------------
    def check_duplicates(self, archive: ZipArchive) -> None:
        visible = archive.members[:archive._visible()]
        plain = None
        if zipfmt._SCAN is not None and zipfmt._SHORTCUTS:
            # Names made by the compiled step differ when their raw names do (strict decoding)
            known = self.scanned and not self.made and len(visible) == len(archive.members)
            plain = zipfmt._SCAN.distinct(archive.members, len(visible), not known)
        if plain is None:
            names = [m.name for m in archive.members]
            plain = (len(set(names)) == len(names) and "\0" not in "".join(names)
                     and len({m.raw_name.lower() for m in visible}) == len(visible))
        if plain:
            # No two names alike for either reader (the usual case): `get` may then answer
            # from a plain dict without comparing lowercased names again.
            archive._distinct = True
            return
        groups: dict[bytes, list[int]] = {}
        for m in visible:
            groups.setdefault(m.raw_name.lower(), []).append(m.index)
        seen: set[tuple[int, ...]] = set()
        py_last: dict[str, int] = {}
        py_groups: dict[str, list[int]] = {}
        for m in archive.members:
            key = m.name.split("\0", 1)[0]  # zipfile's ZipInfo truncates at NUL
            py_last[key] = m.index
            py_groups.setdefault(key, []).append(m.index)
        for key, idxs in groups.items():
            if len(idxs) < 2:
                continue
            seen.add(tuple(idxs))
            first = archive.members[idxs[0]]
            pick = archive.get(first.raw_name)
            names = sorted({archive.members[j].name for j in idxs})
            case = " (differing only in letter case)" if len(names) > 1 else ""
            py = py_last.get(first.name.split("\0", 1)[0])
            self.add("zip.duplicate_name", f"{len(idxs)} central-directory entries named "
                     f"{names[0]!r}{case} at indices {idxs}: PyTorch's reader (miniz, sorted "
                     f"case-insensitive lookup) picks #{pick.index if pick else None}, Python's "
                     f"zipfile picks #{py} (the last of that exact name)", member=first.name,
                     offset=archive.members[idxs[-1]].header_offset)
        for key, idxs in py_groups.items():
            if len(idxs) > 1 and tuple(idxs) not in seen:
                self.add("zip.duplicate_name", f"{len(idxs)} entries are named {key!r} for "
                         f"Python's zipfile (indices {idxs}); it picks #{idxs[-1]}", member=key,
                         offset=archive.members[idxs[-1]].header_offset)

    def descriptor_length(self, m: ZipMember) -> int:
        """Bytes of the data descriptor after ``m``'s data, 0 when absent or not recognised."""
        if not m.flags & FLAG_DESCRIPTOR:
            return 0
        end = m.data_end
        if self.buf is not None and not self.sparse:
            for form in _DESCRIPTORS:   # the signed forms, straight from the map
                if end + form.size <= self.size:
                    sig, crc, cs, us = form.unpack_from(self.buf, end)
                    if sig == MAGIC_DESCRIPTOR and crc == m.crc32 and cs == m.compressed_size \
                            and us == m.size:
                        return form.size
        raw = self.peek(end, _DESCRIPTORS[0].size)
        for form in _DESCRIPTORS:   # the signed forms in one unpack each (what writers use)
            if len(raw) >= form.size:
                sig, crc, cs, us = form.unpack_from(raw, 0)
                if sig == MAGIC_DESCRIPTOR and crc == m.crc32 and cs == m.compressed_size \
                        and us == m.size:
                    return form.size
        for sig, width in ((True, 8), (True, 4), (False, 8), (False, 4)):
            length = (4 if sig else 0) + 4 + 2 * width
            if not self.fits(end, length):
                continue
            raw = self.bytes_at(end, length)
            if sig:
                if raw[:4] != MAGIC_DESCRIPTOR:
                    continue
                raw = raw[4:]
            crc = int.from_bytes(raw[0:4], "little")
            cs = int.from_bytes(raw[4:4 + width], "little")
            us = int.from_bytes(raw[4 + width:4 + 2 * width], "little")
            if crc == m.crc32 and cs == m.compressed_size and us == m.size:
                return length
        if m.size or m.compressed_size:
            self.add("zip.local_header_mismatch", "flag bit 3 is set but no data descriptor "
                     "matching the central directory follows the data", member=m.name,
                     offset=end)
        return 0

    def check_layout(self, members: list[ZipMember], cd_start: int, cd_size: int,
                     z64_pos: int | None, z64_end: int, loc_pos: int, eocd_pos: int,
                     eocd_end: int, prepended: int) -> None:
        """Every byte should belong to a local header + data (+ descriptor), the CD or the
        trailer: report what overlaps and what is left over."""
        # (start, end, what, role, member); role: "member", "bad" (an unreadable member, already
        # reported: its bytes count as accounted for, its overlaps would repeat the report) or
        # "struct" (directory and trailer records). A member's description (``what``) is None
        # here and made by `_what` only for a message: 10^5 members, a handful of messages.
        structs = [(cd_start, cd_start + cd_size, "central directory", "struct", None)]
        if z64_pos is not None:
            structs.append((z64_pos, z64_end, "zip64 end-of-central-directory record", "struct",
                            None))
        if loc_pos >= 0:
            structs.append((loc_pos, eocd_pos, "zip64 locator", "struct", None))
        structs.append((eocd_pos, eocd_end, "end-of-central-directory record", "struct", None))
        if self.span is not None and (len(members) == 1
                                      or min(s[0] for s in structs) >= self.span[1]):
            # The compiled step found every member end to end, each with its descriptor: the
            # one span the loop below would come to.
            spans = [(self.span[0], self.span[1], None, "member", members[0])]
        else:
            spans = self.member_spans(members, structs)
        spans += structs
        spans.sort(key=_span_key)

        # Overlaps, against the span reaching furthest so far.
        reach = spans[0]
        for span in spans[1:]:
            start, end, _, role, m = span
            r_end, r_role, r_m = reach[1], reach[3], reach[4]
            if start < r_end and "bad" not in (role, r_role):
                what, r_what = _what(span), _what(reach)
                if role == r_role == "member":
                    same = " (both entries point at the same local header)" if (
                        start == r_m.header_offset) else ""
                    self.add("zip.overlapping_members", f"{what} ({start}..{end}) overlaps "
                             f"{r_what} ({r_m.header_offset}..{r_end}){same}", member=m.name,
                             offset=start)
                elif "member" in (role, r_role):
                    mm = m if role == "member" else r_m
                    self.add("zip.data_out_of_range", f"{what} ({start}..{end}) overlaps "
                             f"{r_what} (..{r_end})", member=mm.name, offset=start)
            if end > r_end:
                reach = span

        # Gaps: before the first structure, between structures, after the EOCD.
        first = spans[0][0]
        if first > 0:
            if not prepended:  # a shifted archive was already reported by locate_cd
                self.add("zip.prepended_bytes", f"{first} bytes before the first local header "
                         f"(starting {self.bytes_at(0, min(first, 16))!r})", offset=0)
        cursor = first
        for span in spans:
            start, end = span[0], span[1]
            if start > cursor:
                self.report_gap(cursor, start, _what(span))
            cursor = max(cursor, end)
        if eocd_end < self.size:
            self.add("zip.trailing_bytes", f"{self.size - eocd_end} bytes after the end-of-central-"
                     f"directory record and its comment", offset=eocd_end)

    def member_spans(self, members: list[ZipMember], structs: list[tuple]) -> list[tuple]:
        """`check_layout`'s spans of the members: (start, end, None, role, member)."""
        spans: list[tuple[int, int, str | None, str, ZipMember | None]] = []
        buf, size, descriptor_length = self.buf, self.size, self.descriptor_length
        short = _DESCRIPTORS[1].unpack_from \
            if zipfmt._SHORTCUTS and buf is not None and not self.sparse else None
        for m in members:
            if m.error is None:
                end = m.data_offset + m.compressed_size
                if not m.flags & FLAG_DESCRIPTOR:
                    d = 0
                elif (short is not None and m.size and end + 16 <= size
                      and short(buf, end) == (MAGIC_DESCRIPTOR, m.crc32, m.compressed_size,
                                              m.size)):
                    # The 16-byte form torch writes, tried first: where it matches a member
                    # that is not empty, the 24-byte form `descriptor_length` tries first
                    # cannot (its size field would be compressed_size + size << 32).
                    d = 16
                else:
                    d = descriptor_length(m)
                spans.append((m.header_offset, end + d, None, "member", m))
            elif m.local_name is not None:
                spans.append((m.header_offset, min(m.data_end, self.size), None, "bad", m))
        if (zipfmt._SHORTCUTS and len(spans) == len(members) > 1
                and not any(m.error for m in members)
                and min(s[0] for s in structs) >= spans[-1][1]
                and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))):
            # Readable members laid end to end, in order, before every structure (as torch and
            # most writers lay them out): they neither overlap nor leave gaps among themselves,
            # so one span for the run finds exactly what the member spans would.
            spans = [(spans[0][0], spans[-1][1], None, "member", spans[0][4])]
        return spans

    def report_gap(self, start: int, end: int, before: str) -> None:
        head = self.bytes_at(start, min(end - start, 4))
        hidden = (" starting with a local file header signature: an entry the central directory "
                  "does not list" if head == MAGIC_LOCAL else "")
        self.add("zip.unaccounted_bytes", f"{end - start} bytes at {start}..{end} (before the "
                 f"{before}) belong to no member or directory structure{hidden}", offset=start)

    def check_other_eocds(self, others: list[int], eocd_pos: int) -> None:
        for pos in others:
            _, _, _, _, n_total, cd_size, cd_offset, _ = EOCD.unpack(self.bytes_at(pos, EOCD.size))
            plausible = (n_total == 0 and cd_size == 0) or (
                self.fits(cd_offset, 4) and cd_offset + cd_size <= pos
                and self.bytes_at(cd_offset, 4) == MAGIC_CENTRAL)
            if plausible:
                self.add("zip.multiple_eocd", f"another end-of-central-directory record at byte "
                         f"{pos} ({n_total} entries, CD at {cd_offset}); the one used is at "
                         f"{eocd_pos}, a reader scanning differently may pick this one",
                         offset=pos)


def read_zip(src: ByteSource, *, max_members: int = 1_000_000,
             check_small_crc: bool = True) -> ZipArchive:
    """Read the central directory of the zip archive in ``src``, tolerantly.

    Args:
        src: the bytes (a file or an in-memory blob such as a DCP chunk).
        max_members: refuse archives with more central-directory entries than this.
        check_small_crc: verify the CRC-32 of STORED members of at most 1 MiB (cheap: pickles,
            version records); larger members are checked only through `ZipArchive.verify_crc`.

    Returns:
        The `ZipArchive`, whose ``anomalies`` list what is odd; a member that cannot be read
        carries an ``error`` and does not stop the listing.

    Raises:
        FormatError (format "zip"): no end-of-central-directory record, or a central directory
            that cannot be found or read (offset given).
        LimitExceeded: more than ``max_members`` entries.

    Example:
        >>> arc = read_zip(ByteSource("model.pt"))            # doctest: +SKIP
        >>> arc.torch_prefix(), arc.get("model/data.pkl").data_offset   # doctest: +SKIP
        ('model', 64)
    """
    return _Reader(src, max_members, check_small_crc).read()


def _prefetch_local_headers(src, cd, prepended: int) -> None:
    """Tell a remote source (`tensorscope.remote`) every local header the listing will read, and
    the small STORED members whose CRC it checks, so they are fetched together rather than one
    round trip each. A hint only: entries it cannot parse are left to the real reader."""
    prefetch = getattr(src, "prefetch", None)
    if prefetch is None:
        return
    ranges, pos, n = [], 0, len(cd)
    while pos + CENTRAL.size <= n and bytes(cd[pos:pos + 4]) == MAGIC_CENTRAL:
        f = CENTRAL.unpack_from(cd, pos)
        at = f[_CD_OFFSET] + prepended
        want = LOCAL.size + f[_CD_NAME_LEN] + f[_CD_EXTRA_LEN] + 128  # local extra may differ
        if f[_CD_METHOD] == 0 and f[_CD_CSIZE] <= SMALL_CRC_LIMIT:
            want += f[_CD_CSIZE]
        if f[_CD_OFFSET] != U32_MAX:
            ranges.append((at, want))
        pos += CENTRAL.size + f[_CD_NAME_LEN] + f[_CD_EXTRA_LEN] + f[_CD_COMMENT_LEN]
    prefetch(ranges)
