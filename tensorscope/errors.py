"""The error hierarchy: every failure on bad input is a `TensorscopeError`.

Messages say what, where and why: ``truncated pickle in archive/data.pkl at byte 1834:
BINUNICODE wants 91 bytes, 7 remain``. The CLI prints ``str(err)`` on one line and exits 2.
"""
from __future__ import annotations

import errno as _errno
import reprlib

__all__ = ["TensorscopeError", "FormatError", "LimitExceeded", "UnknownFormat", "TensorNotFound",
           "FileAccessError", "FileMissing", "AccessDenied", "file_error", "brief"]


class TensorscopeError(Exception):
    """Root of every error tensorscope raises on purpose."""


class FormatError(TensorscopeError, ValueError):
    """The bytes do not follow the format they claim.

    Attributes:
        format: the format being parsed (``"pickle"``, ``"zip"``, ``"safetensors"`` ...).
        file: path of the file, when known.
        member: archive member or sub-object (``archive/data.pkl``), when relevant.
        offset: absolute byte offset of the problem in ``file``, when known.
        reason: the bare reason, without the location prefix.
    """

    def __init__(self, reason: str, *, format: str = "", file: str | None = None,
                 member: str | None = None, offset: int | None = None):
        self.reason = reason
        self.format = format
        self.file = file
        self.member = member
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.member:
            where.append(self.member)
        place = ":".join(where)
        if self.offset is not None:
            place = f"{place} at byte {self.offset}" if place else f"at byte {self.offset}"
        head = f"{self.format}: " if self.format else ""
        return f"{head}{place}: {self.reason}" if place else f"{head}{self.reason}"

    def located(self, *, file: str | None = None, member: str | None = None,
                offset_base: int = 0) -> "FormatError":
        """Fill in the location known by an outer layer (a container knows the file and member
        that a pickle came from, and where that member starts)."""
        if file and not self.file:
            self.file = file
        if member and not self.member:
            self.member = member
        if self.offset is not None and offset_base:
            self.offset += offset_base
        self.args = (self._render(),)
        return self

    def __str__(self) -> str:  # args may have been updated by located()
        return self.args[0] if self.args else self._render()


class LimitExceeded(FormatError):
    """A resource limit (opcodes, memo, stack, header size ...) was crossed: hostile or absurd input."""

    def __init__(self, resource: str, limit: int, actual: int | None = None, **where):
        self.resource = resource
        self.limit = limit
        self.actual = actual
        got = f" (got {actual})" if actual is not None else ""
        super().__init__(f"{resource} exceeds the limit of {limit}{got}", **where)


class FileAccessError(TensorscopeError, OSError):
    """The file or folder cannot be read (missing, permission denied, ...). Also an `OSError`
    (and, below, a `FileNotFoundError` / `PermissionError`), so callers that catch the OS class
    keep working. ``str(err)`` is ``<path>: <reason>``.
    """

    _ERRNO: int | None = None

    def __init__(self, path: str, reason: str, errno: int | None = None):
        super().__init__(self._ERRNO if errno is None else errno, reason, path)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}" if self.filename else str(self.strerror)


class FileMissing(FileAccessError, FileNotFoundError):
    """The path does not exist."""

    _ERRNO = _errno.ENOENT


class AccessDenied(FileAccessError, PermissionError):
    """The path exists but may not be read (or listed, for a folder)."""

    _ERRNO = _errno.EACCES


def file_error(err: OSError, path: str) -> FileAccessError:
    """The `FileAccessError` for an OS error met while opening ``path`` (the file it names, if any)."""
    if isinstance(err, FileAccessError):
        return err
    where = err.filename if isinstance(err.filename, str) else path
    if isinstance(err, FileNotFoundError):
        return FileMissing(where, "no such file or directory")
    if isinstance(err, PermissionError):
        return AccessDenied(where, "permission denied")
    reason = (err.strerror or str(err) or type(err).__name__).lower()
    return FileAccessError(where, reason, err.errno)


class UnknownFormat(TensorscopeError):
    """No parser recognises the file."""


class TensorNotFound(TensorscopeError, KeyError):
    """A tensor name that the model does not hold."""

    def __str__(self) -> str:
        return self.args[0] if self.args else "tensor not found"


class _BriefRepr(reprlib.Repr):
    """`brief`'s repr: sets in an order that does not depend on hashing. The pickle VM's globals
    hash by identity, so a set holding one would print its items in an order that changes with
    memory addresses (and the compiled and Python steps would word one error two ways)."""

    def _ordered(self, x):
        if len(x) > 1000:   # ordered only where cheap: six items are shown anyway
            return list(x)
        return sorted(x, key=lambda v: (type(v).__name__, self.repr1(v, 1)))

    def repr_set(self, x, level):
        return self._repr_iterable(self._ordered(x), level, "{", "}", self.maxset) if x else "set()"

    def repr_frozenset(self, x, level):
        if not x:
            return "frozenset()"
        return self._repr_iterable(self._ordered(x), level, "frozenset({", "})", self.maxfrozenset)


def brief(value, width: int = 60) -> str:
    """A short repr of an untrusted value for a message: bounded in depth, items and length.

    Values from a pickle may nest a million levels deep or hold a million items; plain ``repr``
    would then raise RecursionError or build megabytes of text just to be cut to ``width``.
    """
    r = _BriefRepr()
    r.maxlevel = 3
    r.maxtuple = r.maxlist = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    r.maxstring = r.maxother = r.maxlong = max(width, 12)
    try:
        text = r.repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ chain still gives a message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: max(width - 3, 1)] + "..."
