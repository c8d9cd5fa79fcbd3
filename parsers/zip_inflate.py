"""Decompression of zip members (deflate, bzip2, LZMA) bounded by a cap, the CRC anomaly, and
the emulation of miniz's sorted central directory that PyTorch's reader searches."""
from __future__ import annotations

import bz2
import lzma
import struct
import zlib
from typing import TYPE_CHECKING

from tensorscope.model import Anomaly
from tensorscope.parsers.zip_structs import METHOD_BZIP2, METHOD_DEFLATED, METHOD_LZMA

if TYPE_CHECKING:
    from tensorscope.parsers.zipfmt import ZipArchive, ZipMember


_CHUNK = 1 << 20                         # decompression input chunk


def _bad_crc(path: str, member: ZipMember, actual: int) -> Anomaly:
    hint = (" (torch writes 0 when torch.utils.serialization.config.save.compute_crc32 is False)"
            if member.crc32 == 0 else "")
    return Anomaly("zip.bad_crc", f"CRC-32 of the data is {actual:#010x}, the central directory "
                   f"says {member.crc32:#010x}{hint}; Python's zipfile refuses to read it",
                   file=path, member=member.name, offset=member.data_offset)


def _decompress(method: int, raw: memoryview, cap: int, member: ZipMember, archive: ZipArchive):
    """Yield decompressed pieces, never more than ``cap`` bytes in total."""
    if method == METHOD_DEFLATED:
        d = zlib.decompressobj(-15)
        produced = 0
        for start in range(0, len(raw), _CHUNK):
            data = raw[start:start + _CHUNK]
            while data and produced < cap:
                # Pieces of at most _CHUNK: one call could otherwise build the whole output (and
                # zlib copies it once more when it finishes), tripling a bomb's peak memory.
                piece = d.decompress(data, min(cap - produced, _CHUNK))
                produced += len(piece)
                yield piece
                if not piece and len(d.unconsumed_tail) == len(data):
                    # No output and no input consumed: zlib will never progress on this stream
                    # (a fuzzed block made the loop spin forever before this check).
                    raise ValueError("deflate stream makes no progress")
                data = d.unconsumed_tail
            if produced >= cap or d.eof:
                return
        if produced < cap:
            yield d.flush()
        return
    if method == METHOD_BZIP2:
        d = bz2.BZ2Decompressor()
    elif method == METHOD_LZMA:
        # APPNOTE 5.8.8: 2-byte version, 2-byte properties size, properties, raw LZMA1 stream.
        if len(raw) < 4:
            raise ValueError("LZMA header truncated")
        psize, = struct.unpack_from("<H", raw, 2)
        if 4 + psize > len(raw):
            raise ValueError("LZMA properties truncated")
        props = bytes(raw[4:4 + psize])
        filt = lzma._decode_filter_properties(lzma.FILTER_LZMA1, props)  # as zipfile does
        d = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[filt])
        raw = raw[4 + psize:]
    else:
        raise archive._fail(member, f"unsupported compression method {method}")
    produced = 0
    for start in range(0, len(raw), _CHUNK):
        data = bytes(raw[start:start + _CHUNK])
        while produced < cap and not d.eof:
            piece = d.decompress(data, min(cap - produced, _CHUNK))
            fed = bool(data)
            data = b""
            produced += len(piece)
            yield piece
            if d.needs_input or (not piece and not fed):
                break  # wants more input, or holds buffered input it cannot turn into output
        if produced >= cap or d.eof:
            return


# --- miniz's sorted central directory ------------------------------------------------------------
def _miniz_heap_sort(keys: list[bytes]) -> list[int]:
    """miniz ``mz_zip_reader_sort_central_dir_offsets_by_filename``: a heap sort (unstable) of
    entry indices by ASCII-lowercased name; ties in the lowercased bytes break by length, which
    Python's bytes ordering reproduces."""
    size = len(keys)
    idx = list(range(size))
    if size <= 1:
        return idx

    def less(a: int, b: int) -> bool:
        return keys[a] < keys[b]

    def sift(root: int, end: int) -> None:
        while True:
            child = (root << 1) + 1
            if child >= end:
                break
            if child + 1 < end and less(idx[child], idx[child + 1]):
                child += 1
            if not less(idx[root], idx[child]):
                break
            idx[root], idx[child] = idx[child], idx[root]
            root = child

    for start in range((size - 2) >> 1, -1, -1):
        sift(start, size)
    for end in range(size - 1, 0, -1):
        idx[end], idx[0] = idx[0], idx[end]
        sift(0, end)
    return idx
