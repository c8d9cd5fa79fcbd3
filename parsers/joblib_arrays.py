"""joblib's inline NumPy arrays: the ``NumpyArrayWrapper`` placeholder and the raw bytes that
follow its BUILD (layout: `parsers/joblib_fmt.py`). `build_hooks` lets the pickle VM skip and place
them exactly as joblib's unpickler reads them; plain pickles (`plain_pickle`), compressed dumps
(`joblib_fmt`) and the scanner share it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from .pickle_vm import Call, Global, PickleError

__all__ = ["ARRAY_WRAPPERS", "InlineArray", "build_hooks"]

# The class joblib pickles in place of an array (and sklearn's old vendored copy of joblib).
ARRAY_WRAPPERS = frozenset({("joblib.numpy_pickle", "NumpyArrayWrapper"),
                            ("sklearn.externals.joblib.numpy_pickle", "NumpyArrayWrapper")})
_TYPESTR = re.compile(r"[<>|=]?([A-Za-z])(\d+)")


@dataclass(frozen=True, slots=True)
class InlineArray:
    """One array joblib wrote after a ``NumpyArrayWrapper``.

    Attributes:
        wrapper: the wrapper's inert `Call` (its BUILD state is in ``wrapper.state``).
        shape, order ('C' or 'F'), typestr (``f8``, ``U5``, ``V12``), byteorder ('<', '>', '|'),
        itemsize: the array's layout.
        data_offset: offset of the first data byte in the VM's data (None for object arrays).
        nbytes: data bytes (``prod(shape) * itemsize``; 0 for object arrays).
        end: offset of the next opcode.
        value: for object arrays, the nested pickle's value; else None.
    """

    wrapper: Call
    shape: tuple[int, ...]
    order: str
    typestr: str
    byteorder: str
    itemsize: int
    data_offset: int | None
    nbytes: int
    end: int
    value: Any = None

    @property
    def has_objects(self) -> bool:
        return self.data_offset is None


def _dtype_layout(dtype: Any, pos: int) -> tuple[str, str, int, bool]:
    """(typestr, byteorder, itemsize, has_objects) of a ``numpy.dtype(typestr, align, copy)``
    Call with its BUILD state."""
    if not (type(dtype) is Call and type(dtype.func) is Global and dtype.func.dotted ==
            "numpy.dtype" and dtype.args and type(dtype.args[0]) is str):
        raise PickleError(f"NumpyArrayWrapper dtype is a {type(dtype).__name__}, not "
                          "numpy.dtype(...): the array's size is unknown", offset=pos)
    typestr = dtype.args[0]
    m = _TYPESTR.fullmatch(typestr)
    if m is None:
        raise PickleError(f"NumpyArrayWrapper dtype {typestr!r} is not a numpy type string",
                          offset=pos)
    state = dtype.state if type(dtype.state) is tuple else ()
    byteorder = state[1] if len(state) > 1 and state[1] in ("<", ">", "|", "=") else "|"
    elsize = state[5] if len(state) > 5 and type(state[5]) is int else -1
    flags = state[7] if len(state) > 7 and type(state[7]) is int else 0
    itemsize = elsize if elsize > 0 else int(m.group(2))
    return typestr, byteorder, itemsize, m.group(1) == "O" or bool(flags & 1)


def _shape(value: Any, pos: int) -> tuple[int, ...]:
    if type(value) is not tuple or len(value) > 64 or \
            any(type(d) is not int or d < 0 for d in value):
        raise PickleError(f"NumpyArrayWrapper shape {str(value)[:60]} is not a tuple of "
                          "non-negative ints", offset=pos)
    return value


def build_hooks(data, on_array: Callable[[InlineArray], Any] | None = None) -> dict:
    """Build hooks for `pickle_vm.run` over ``data`` that read each wrapper's inline bytes as
    ``joblib.load`` does. ``on_array(array)`` MAY return the value that replaces the wrapper on
    the stack (a tensor record); None keeps the wrapper (object arrays: the nested value)."""
    n = len(data)

    def hook(obj: Call, end: int, nested) -> tuple[Any, int]:
        state = obj.state
        pos = end - 1           # the BUILD opcode, where errors are reported
        if type(state) is not dict:
            raise PickleError(f"NumpyArrayWrapper state is a {type(state).__name__}, not a dict",
                              offset=pos)
        shape = _shape(state.get("shape"), pos)
        order = state.get("order", "C")
        if order not in ("C", "F"):
            raise PickleError(f"NumpyArrayWrapper order {order!r} is not 'C' or 'F'", offset=pos)
        typestr, byteorder, itemsize, has_objects = _dtype_layout(state.get("dtype"), pos)
        if has_objects:
            inner = nested(end)
            array = InlineArray(obj, shape, order, typestr, byteorder, itemsize, None, 0,
                                inner.end, inner.value)
            value = on_array(array) if on_array is not None else None
            return (inner.value if value is None else value), inner.end
        at = end
        if state.get("numpy_array_alignment_bytes") is not None:
            if at >= n:
                raise PickleError("NumpyArrayWrapper padding byte is missing: the data ends",
                                  offset=pos)
            at += 1 + data[at]
        nbytes = math.prod(shape) * itemsize
        if at > n or nbytes > n - at:
            raise PickleError(f"NumpyArrayWrapper array wants {nbytes} bytes at {at}, "
                              f"{max(0, n - at)} remain", offset=pos)
        array = InlineArray(obj, shape, order, typestr, byteorder, itemsize, at, nbytes,
                            at + nbytes)
        value = on_array(array) if on_array is not None else None
        return (obj if value is None else value), at + nbytes

    return {key: hook for key in ARRAY_WRAPPERS}
