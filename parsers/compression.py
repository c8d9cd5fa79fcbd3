"""One sniffer and one bounded decompressor for compressed streams, shared by the joblib parser
and the scanner (``tensorscope.scanning``): what joblib's ``_detect_compressor`` sees at the head of a
stream, and its output capped, never trusted.

- ``compression(head)``: zlib ``x`` (header checksum checked), gzip, bz2, xz, lzma ``]\\x00``,
  lz4 (named, not readable here), and joblib < 0.10's ``ZF`` + hex length + zlib.
- ``decompress(buf, kind, cap=...)``: at most ``cap`` bytes out (LimitExceeded past it),
  FormatError for a broken or truncated stream, never a spin on input that makes no progress.
"""
from __future__ import annotations

import bz2
import lzma
import zlib

from tensorscope.errors import FormatError, LimitExceeded

__all__ = ["compression", "decompress", "zf_data_offset", "INFLATE_MAX", "MAGIC_ZF"]

FORMAT = "joblib"   # the format named in errors: compressed streams are joblib's dumps

# Decompressed output cap, the same as for compressed pickles in torch zips (torch_zip).
INFLATE_MAX = 128 << 20
_PIECE = 1 << 20

# Compressor prefixes, as joblib's compressor.py declares them; lz4 last (not readable here).
_PREFIXES = (("gzip", b"\x1f\x8b"), ("bz2", b"BZh"), ("xz", b"\xfd7zXZ"), ("lzma", b"]\x00"),
             ("lz4", b"\x04\x22\x4d\x18"))
MAGIC_ZF = b"ZF"
_ZF_HEADER = 2 + 19          # "ZF" + len(hex(2**64)) characters of hex length, space-padded


def compression(head: bytes) -> str | None:
    """The compressor joblib would detect from the first bytes, or None (a plain stream).

    >>> compression(b"x\\x9c..."), compression(b"\\x80\\x04"), compression(b"ZF0x12c ")
    ('zlib', None, 'zf')
    """
    if head[:2] == MAGIC_ZF:
        return "zf"
    # zlib: joblib tests the 'x' byte only; the header checksum (RFC 1950) and a clear FDICT bit
    # keep text out ("x = 1" passes the checksum with FDICT set: a stream that needs a preset
    # dictionary, which no writer of model files uses and zlib cannot inflate without it).
    if len(head) >= 2 and head[0] == 0x78 and int.from_bytes(head[:2], "big") % 31 == 0 \
            and not head[1] & 0x20:
        return "zlib"
    for name, prefix in _PREFIXES:
        if head.startswith(prefix):
            return name
    return None


def _decompressor(kind: str):
    if kind in ("zlib", "zf"):
        return zlib.decompressobj(15)
    if kind == "gzip":
        return zlib.decompressobj(31)
    if kind == "bz2":
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor(lzma.FORMAT_XZ if kind == "xz" else lzma.FORMAT_ALONE)


def zf_data_offset(buf, path: str | None = None) -> int:
    """Where the zlib stream of a ``ZF`` file starts (FormatError without a hex length)."""
    header = bytes(buf[:_ZF_HEADER + 1])
    try:
        int(header[2:_ZF_HEADER].decode("ascii").strip(), 16)
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"ZF header {header[:_ZF_HEADER]!r} has no hex length", format=FORMAT,
                          file=path, offset=2) from None
    return _ZF_HEADER + 1 if header[_ZF_HEADER:_ZF_HEADER + 1] == b" " else _ZF_HEADER


def decompress(buf, kind: str, *, cap: int = INFLATE_MAX, path: str | None = None,
               head_only: bool = False) -> bytes:
    """The stream inside a compressed joblib file, at most ``cap`` bytes.

    ``head_only``: return what the given bytes decompress to (up to ``cap``) without requiring
    the stream to end (for sniffing a prefix). Raises FormatError for a broken stream, an
    unsupported compressor or a stream that does not end; LimitExceeded past ``cap``.
    """
    if kind == "lz4":
        raise FormatError("lz4-compressed joblib file: reading it needs the lz4 package, which "
                          "tensorscope does not use", format=FORMAT, file=path, offset=0)
    start = zf_data_offset(buf, path) if kind == "zf" else 0
    d = _decompressor(kind)
    is_zlib = kind in ("zlib", "zf", "gzip")
    out = bytearray()
    view = memoryview(buf)
    pos = start
    try:
        while pos < len(view) and not d.eof:
            data = view[pos:pos + _PIECE]
            pos += len(data)
            while True:
                # Never more than one byte past the cap per call: output is bounded, not trusted.
                got = d.decompress(data, cap + 1 - len(out))
                if not got and not d.eof and (
                        len(getattr(d, "unconsumed_tail", b"")) == len(data) if is_zlib
                        else not data and not d.needs_input):
                    raise ValueError("stream makes no progress")  # the loop would spin forever
                out += got
                if len(out) > cap:
                    raise LimitExceeded(f"{kind} stream output", cap, len(out), format=FORMAT,
                                        file=path)
                if d.eof:
                    break
                if is_zlib:     # zlib hands back the input it did not consume
                    data = d.unconsumed_tail
                    if not data:
                        break
                elif d.needs_input:
                    break
                else:           # bz2/lzma buffer the input: ask for the rest of the output
                    data = b""
    except LimitExceeded:
        raise
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
        raise FormatError(f"{kind} stream is corrupt after {len(out)} output bytes: {e}",
                          format=FORMAT, file=path) from None
    if not d.eof and not head_only:
        raise FormatError(f"{kind} stream ends early ({len(out)} bytes decompressed): the file "
                          "is truncated", format=FORMAT, file=path, offset=len(buf))
    return bytes(out)
