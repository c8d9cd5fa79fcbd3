"""`ByteSource`: one read-only memory map per file, with bounds-checked slices.

Parsers take bytes only through a ByteSource, so every read is checked against the real file size
before it happens and nothing ever reads a whole file into memory.
"""
from __future__ import annotations

import mmap
import os

from .errors import FormatError

__all__ = ["ByteSource", "check_range"]


def check_range(source, offset: int, length: int, what: str = "data", *, fmt: str = "",
                member: str | None = None) -> None:
    """Raise FormatError unless ``[offset, offset+length)`` lies inside ``source`` (any object
    with ``path`` and ``size``: the local map and the remote source share this one check)."""
    size = source.size
    if offset < 0 or length < 0 or offset > size or length > size - offset:
        remain = max(0, size - offset) if offset >= 0 else 0
        raise FormatError(f"{what} wants {length} bytes at offset {offset}, the file has "
                          f"{size} bytes ({remain} remain)", format=fmt,
                          file=source.path, member=member, offset=offset)


class ByteSource:
    """A read-only view of one file (or of an in-memory buffer, for nested blobs and tests).

    Attributes:
        path: the file's path (``"<memory>"`` for buffers).
        size: its size in bytes.
        buffer: a memoryview of the whole content, backed by a read-only mmap for files.
    """

    def __init__(self, path: str | os.PathLike, *, data: bytes | memoryview | None = None):
        self.path = os.fspath(path)
        self._mmap: mmap.mmap | None = None
        self._fd: int | None = None
        if data is not None:
            self.buffer = memoryview(data).cast("B")
        else:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    self.buffer = memoryview(b"")
                else:
                    self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    self.buffer = memoryview(self._mmap)
                    self._fd = os.dup(f.fileno())  # for `pread`
        self.size = len(self.buffer)

    def pread(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer at the end of the file), read with a
        system call rather than through the map. For small records scattered over a big file
        (a zip's local headers): a touch of the map faults in the pages around it too (the
        kernel's fault-around, 64 KiB, which MADV_RANDOM does not turn off), and they count
        in the resident set."""
        if offset < 0 or length < 0:
            return b""
        if self._fd is None:
            return bytes(self.buffer[offset:offset + length])
        return os.pread(self._fd, length, offset)

    def advise(self, *, random: bool) -> None:
        """Tell the kernel how the map is about to be read. ``random=True`` while parsing:
        headers scattered over a big file (500 local headers of a 2 GB zip) then fault in only
        their own page, not the read-ahead window around each (tens of MB of RSS for nothing).
        ``random=False`` (the default behaviour) before values are read, where read-ahead helps."""
        if self._mmap is None or not hasattr(mmap, "MADV_RANDOM"):
            return
        try:
            self._mmap.madvise(mmap.MADV_RANDOM if random else mmap.MADV_NORMAL)
        except (OSError, ValueError):  # a hint only: a kernel that refuses it changes nothing
            pass

    @classmethod
    def from_bytes(cls, data: bytes | memoryview, name: str = "<memory>") -> "ByteSource":
        return cls(name, data=data)

    @property
    def raw(self):
        """The object numpy views are made over (the mmap itself, or the bytes)."""
        return self._mmap if self._mmap is not None else self.buffer

    def check(self, offset: int, length: int, what: str = "data", *, fmt: str = "",
              member: str | None = None) -> None:
        """Raise FormatError unless ``[offset, offset+length)`` lies inside the file."""
        check_range(self, offset, length, what, fmt=fmt, member=member)

    def view(self, offset: int, length: int, what: str = "data", *, fmt: str = "",
             member: str | None = None) -> memoryview:
        """Zero-copy slice, bounds-checked."""
        self.check(offset, length, what, fmt=fmt, member=member)
        return self.buffer[offset:offset + length]

    def read(self, offset: int, length: int, what: str = "data", **kw) -> bytes:
        """A copy of a small slice (headers, names); never use it for tensor data."""
        return bytes(self.view(offset, length, what, **kw))

    def head(self, n: int = 64) -> bytes:
        return bytes(self.buffer[:n])

    def close(self) -> None:
        try:
            self.buffer.release()
        except (BufferError, ValueError):
            # numpy views still hold the map; it is freed with them
            pass
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass
            self._mmap = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"ByteSource({self.path!r}, size={self.size})"


def whole(src, what: str = "file", *, fmt: str = ""):
    """All of ``src`` for a parser that hops through it (a protobuf walk): the zero-copy view of
    a local file; for a remote source (`tensorscope.remote`), a buffer that fetches the blocks
    it is indexed at, so the parts never touched are never downloaded."""
    lazy = getattr(src, "random_access", None)
    return lazy() if lazy is not None else src.view(0, src.size, what, fmt=fmt)
