"""The protobuf wire format, read in place: varints, tagged fields, groups skipped, packed varints.

Generic (protobuf encoding guide, "Message Structure"): a message is a run of ``tag, payload``
fields, ``tag = number << 3 | wire type``. `_fields` walks one message given its field table
(number -> `WireField`: name, wire type, packable), checking known fields' wire types; it yields
absolute offsets and copies nothing. Which messages exist is the caller's schema (`onnx_pb.MESSAGES`
for ONNX); so is the error raised: every reader takes ``error(reason, offset)`` and raises what it
returns (`WireError` by default; the ONNX walker passes its own, so its messages say ``onnx:``).
"""
from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

import numpy as np

from tensorscope.errors import FormatError, LimitExceeded

__all__ = ["VARINT", "I64", "LEN", "SGROUP", "EGROUP", "I32", "WireField", "WireError",
           "decode_varints"]


class WireError(FormatError):
    """Bytes that are not a protobuf message (a varint, tag or length that cannot be)."""


def _wire_error(reason: str, offset: int | None = None) -> WireError:
    return WireError(reason, format="protobuf", offset=offset)


VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
_WIRE_NAMES = {VARINT: "varint", I64: "fixed64", LEN: "length-delimited", SGROUP: "start-group",
               EGROUP: "end-group", I32: "fixed32"}
_MAX_VARINT_BYTES = 10
_U64 = (1 << 64) - 1


class WireField(NamedTuple):
    """One known field: its name and wire type; ``packable`` repeated scalars also accept LEN."""

    name: str
    wire: int
    packable: bool = False


def _table(**fields: tuple) -> dict[int, WireField]:
    out: dict[int, WireField] = {}
    for name, spec in fields.items():
        number, wire, *rest = spec
        if number in out:  # checked at import time, as pickletools checks its opcode table
            raise RuntimeError(f"duplicate field number {number} ({out[number].name}, {name})")
        out[number] = WireField(name, wire, bool(rest and rest[0]))
    return out


def _varint(buf, pos: int, end: int, what: str, error: Callable = _wire_error) -> tuple[int, int]:
    """Decode one varint at ``pos`` (before ``end``); returns (value, next position).

    >>> _varint(b"\\xac\\x02", 0, 2, "x")
    (300, 2)
    """
    value = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise error(f"truncated varint ({what}): {pos - start} bytes before the end at "
                       f"byte {end}", start)
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value & _U64, pos
        shift += 7
        if pos - start >= _MAX_VARINT_BYTES:
            raise error(f"varint ({what}) longer than {_MAX_VARINT_BYTES} bytes", start)


def _fields(buf, start: int, end: int, message: str, table: dict[int, WireField],
            error: Callable = _wire_error) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield ``(number, wire, a, b, tag_offset)`` for each field of one message in ``[start, end)``.

    varint: ``a`` = value; fixed32/fixed64/length-delimited: ``[a, b)`` = payload. Known fields
    must have their declared wire type (packable repeated scalars: also LEN). Unknown fields are
    yielded too (callers skip them), groups inside them skipped.
    """
    pos = start
    while pos < end:
        tag_at = pos
        tag, pos = _varint(buf, pos, end, f"{message} field tag", error)
        number, wire = tag >> 3, tag & 7
        if number == 0 or wire > 5 or wire == EGROUP:
            raise error(f"invalid field tag 0x{tag:x} in {message} (field {number}, wire type "
                       f"{wire})", tag_at)
        known = table.get(number)
        if known is not None and wire != known.wire and not (known.packable and wire == LEN):
            raise error(f"{message}.{known.name} (field {number}) has wire type "
                       f"{_WIRE_NAMES[wire]}, expected {_WIRE_NAMES[known.wire]}", tag_at)
        if wire == VARINT:
            value, pos = _varint(buf, pos, end, f"{message} field {number}", error)
            yield number, wire, value, pos, tag_at
            continue
        if wire == LEN:
            length, pos = _varint(buf, pos, end, f"{message} field {number} length", error)
        elif wire == SGROUP:
            pos = _skip_group(buf, pos, end, number, message, error)
            yield number, wire, pos, pos, tag_at
            continue
        else:
            length = 8 if wire == I64 else 4
        if length > end - pos:
            name = f"{message}.{known.name}" if known else f"{message} field {number}"
            raise error(f"{name} wants {length} bytes at byte {pos}, {end - pos} remain before "
                       f"the end of its message at byte {end}", tag_at)
        yield number, wire, pos, pos + length, tag_at
        pos += length


def _skip_group(buf, pos: int, end: int, number: int, message: str,
                error: Callable = _wire_error) -> int:
    """Skip an (obsolete) group of an unknown field, nested groups included, iteratively."""
    open_groups = [number]
    while open_groups:
        tag_at = pos
        tag, pos = _varint(buf, pos, end, f"{message} group tag", error)
        num, wire = tag >> 3, tag & 7
        if wire == EGROUP:
            if num != open_groups.pop():
                raise error(f"unbalanced end-group tag for field {num} in {message}", tag_at)
        elif wire == SGROUP:
            if len(open_groups) >= 64:
                raise LimitExceeded("group nesting", 64, format=error("").format, offset=tag_at)
            open_groups.append(num)
        elif wire == VARINT:
            _, pos = _varint(buf, pos, end, f"{message} group field", error)
        elif wire in (I64, I32, LEN):
            n = 8 if wire == I64 else 4
            if wire == LEN:
                n, pos = _varint(buf, pos, end, f"{message} group field length", error)
            if n > end - pos:
                raise error(f"group field in {message} wants {n} bytes, {end - pos} remain", tag_at)
            pos += n
        else:
            raise error(f"invalid wire type {wire} in a group of {message}", tag_at)
    return pos


def _text(buf, a: int, b: int, limit: int | None = None) -> str:
    """A protobuf string field (UTF-8; proto2 does not enforce it, so undecodable bytes are
    replaced rather than rejected, as onnx's C++ side would carry them)."""
    if limit is not None and b - a > limit:
        return bytes(buf[a:a + limit]).decode("utf-8", "replace") + "..."
    return bytes(buf[a:b]).decode("utf-8", "replace")


def decode_varints(payload, error: Callable = _wire_error) -> np.ndarray:
    """Decode a packed run of varints into uint64 (vectorised; a copy).

    >>> decode_varints(b"\\x01\\xac\\x02\\xff\\xff\\xff\\xff\\x0f").tolist()
    [1, 300, 4294967295]
    """
    b = np.frombuffer(payload, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size == 0 or ends[-1] != b.size - 1:
        raise error("packed varints end inside a varint")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if int(lengths.max()) > _MAX_VARINT_BYTES:
        raise error(f"packed varint longer than {_MAX_VARINT_BYTES} bytes")
    index = np.arange(b.size, dtype=np.int64) - np.repeat(starts, lengths)
    parts = (b & 0x7F).astype(np.uint64) << (index * 7).astype(np.uint64)
    return np.bitwise_or.reduceat(parts, starts)


def _peek_varint(buf, pos: int, end: int) -> tuple[int, int] | None:
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= end:
            return None
        b = buf[pos + i]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos + i + 1
        shift += 7
    return -1, pos  # too long: never valid
