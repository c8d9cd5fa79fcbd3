"""Text forms of protocols 0 and 1, parsed as CPython's C unpickler parses them: C strings up to
the first NUL, ``strtol`` base-0 integers (``I01``/``I00`` are bools), C ``strtod`` floats, memo
indices, and Python 2 ``str`` payloads.
"""
from __future__ import annotations

import re

from tensorscope.parsers.pickle_values import PickleError

# CPython refuses int <-> str conversions above 4300 digits (CVE-2020-10735); so do we, even when
# the interpreter's own limit was lifted, because int() of a long string is quadratic.
_MAX_INT_DIGITS = 4300


# ---------------------------------------------------------------------------------------------
# Text-form helpers (protocols 0 and 1).

# The C unpickler copies each text line into a NUL-terminated buffer and parses it with C
# string functions, which stop at the first NUL: ``I1\x00junk\n`` is the int 1.
def _c_string(text: bytes) -> bytes:
    nul = text.find(b"\0")
    return text if nul < 0 else text[:nul]


# C strtol(s, &end, 0): optional space, sign, then 0x-hex, 0-octal or decimal (a prefix match:
# load_int accepts it only when it reaches the end of the C string).
_STRTOL = re.compile(rb"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_C_SPACE = b" \t\n\v\f\r"


def _py_int(text: bytes, what: str, base: int = 0) -> int:
    """PyLong_FromString(s, NULL, base) over the C string of ``text``: Python's int syntax
    (ASCII only, surrounding whitespace, underscores), with CPython's 4300-digit cap for
    decimal (power-of-two bases have none: their conversion is linear)."""
    body = _c_string(text).strip(_C_SPACE)
    digits = body.lstrip(b"+-")
    binary = base == 0 and digits[:2].lower() in (b"0x", b"0o", b"0b")
    if not binary and len(digits) > _MAX_INT_DIGITS and \
            len(digits.replace(b"_", b"")) > _MAX_INT_DIGITS:
        raise PickleError(f"{what} literal has {len(text)} characters, more than the "
                          f"{_MAX_INT_DIGITS}-digit limit for int conversion")
    try:
        return int(body.decode("ascii"), base)
    except (UnicodeDecodeError, ValueError):
        shown = text[:40] + (b"..." if len(text) > 40 else b"")
        raise PickleError(f"{what} argument {shown!r} is not an integer") from None


def _text_int(text: bytes) -> int | bool:
    """INT's argument as load_int in _pickle.c reads it: strtol(s, &end, 0) must end at the
    newline or a NUL and fit a C long, else PyLong_FromString(s, NULL, 0) decides."""
    c = _c_string(text)
    m = _STRTOL.match(c)
    if m is None:
        value = 0 if not c else None    # no digits: strtol gives 0 with end at the start
    elif m.end() != len(c) or len(m.group(2)) > 40:
        value = None
    else:
        sign, digits = m.groups()
        if digits[:2] in (b"0x", b"0X"):
            value = int(digits[2:], 16)
        elif digits.startswith(b"0"):
            value = int(digits, 8)
        else:
            value = int(digits)
        value = -value if sign == b"-" else value
        if not _INT64_MIN <= value <= _INT64_MAX:
            value = None
    if value is None:
        return _py_int(text, "INT")     # not a C long: Python's own rules
    if len(text) == 2 and value in (0, 1):
        return bool(value)              # I00 / I01: protocol-1 bools (the line's length counts)
    return value


_FLOAT_TEXT = re.compile(rb"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                         rb"|(?i:inf|infinity|nan))\Z")


def _text_float(text: bytes) -> float:
    # PyOS_string_to_double over the C string: the whole of it must be a float literal (no
    # space, no underscore); overflow is an error.
    c = _c_string(text)
    if _FLOAT_TEXT.match(c) is None:
        raise PickleError(f"FLOAT argument {text[:40]!r} is not a float")
    value = float(c.decode("ascii"))
    if value in (float("inf"), float("-inf")) and b"inf" not in c.lower():
        raise PickleError(f"FLOAT argument {text[:40]!r} overflows a double")
    return value


def _text_index(text: bytes, what: str) -> int:
    """PUT/GET arguments: PyLong_FromString(s, NULL, 10)."""
    try:
        return _py_int(text, what, 10)
    except PickleError:
        raise PickleError(f"{what} argument {text[:40]!r} is not a memo index") from None


def _py2_string(raw: bytes) -> str | bytes:
    """STRING/BINSTRING/SHORT_BINSTRING hold Python 2 ``str``: text when it decodes as UTF-8
    (what torch.load's encoding='utf-8' gives), else the raw bytes (encoding='bytes')."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
