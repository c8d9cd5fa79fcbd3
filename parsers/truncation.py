"""A pickle run that failed because the FILE ends before the pickle does: a cut download.

Shared by the readers whose pickle runs to the end of the file (plain pickles, legacy torch files),
so that each says "truncated" the same way and neither imports the other for it.
"""
from __future__ import annotations

from tensorscope.errors import FormatError
from tensorscope.source import ByteSource

__all__ = ["is_truncation", "cut_short"]


def is_truncation(err) -> bool:
    """The VM's error says the bytes ran out (rather than that they are wrong)."""
    reason = getattr(err, "reason", "")
    return "remain" in reason or "data ends" in reason or "ran out of data" in reason


def cut_short(result, src: ByteSource) -> FormatError | None:
    """The error for a pickle run that failed because the FILE ends before the pickle does (a cut
    download): ``truncated: <the VM's reason>; the file ends at <size>``. None otherwise (and for
    in-memory blobs, whose end is not the file's)."""
    err = result.error
    if err is None or result.stopped or not is_truncation(err) or src.path == "<memory>":
        return None
    return FormatError(f"truncated: {err.reason}; the file ends at {src.size}", format=err.format,
                       file=err.file or src.path, member=err.member, offset=err.offset)
