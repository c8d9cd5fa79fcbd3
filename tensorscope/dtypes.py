"""One dtype vocabulary for every format: torch's names without ``torch.``.

Each name maps to a `DTypeSpec`: its size and the numpy dtype a zero-copy view uses. Formats keep
one literal table from their own codes to these names (see each parser). Quantized block types
(GGUF ``q4_k`` ...) keep their own names and have a block size instead of an item size.

numpy and ml_dtypes are imported on the first `DTypeSpec.numpy` access, not at import: listing
and scanning never touch values, and the two imports cost ~100 ms of every command's start-up.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = ["DTypeSpec", "DTYPES", "spec", "numpy_dtype", "nbytes_for", "register_block_type",
           "register_unknown", "is_unknown", "UNKNOWN_PREFIX"]


@dataclass(frozen=True, slots=True)
class DTypeSpec:
    """How one dtype is stored.

    Attributes:
        name: canonical name (``bfloat16``).
        bits: bits per element as stored (4 for int4 and quint4x2, whose byte holds two values).
        numpy_name: the numpy type a view uses (``float32``, ``ml_dtypes.bfloat16``), or None
            when values cannot be viewed as an array (strings, block-quantized types); a view then
            exposes the raw bytes as uint8. `numpy` is that type as an ``np.dtype``.
        block_elems / block_bytes: for block-quantized types, elements per block and bytes per block.
        packed: several values share one byte (int4, uint4, fp4): views show the raw bytes.
        kind: ``float``, ``int``, ``uint``, ``bool``, ``complex``, ``quantized``, ``string``, ``block``,
            ``bits`` (torch's opaque bit containers), ``unknown`` (a dtype the file names that this
            tool does not know: listed, read as raw bytes).
    """

    name: str
    bits: int
    numpy_name: str | None
    kind: str
    block_elems: int = 1
    block_bytes: int = 0
    packed: bool = False

    @property
    def numpy(self) -> "np.dtype | None":
        """The numpy dtype a view uses (None: no array view); numpy is imported here."""
        if self.numpy_name is None:
            return None
        dt = _NUMPY_CACHE.get(self.numpy_name)
        if dt is None:
            dt = _NUMPY_CACHE[self.numpy_name] = _resolve_numpy(self.numpy_name)
        return dt

    @property
    def itemsize(self) -> int:
        """Bytes per stored element (1 for packed sub-byte types, which are viewed byte by byte)."""
        return max(1, self.bits // 8)

    @property
    def is_float(self) -> bool:
        return self.kind in ("float", "complex")


_NUMPY_CACHE: dict[str, "np.dtype"] = {}


def _resolve_numpy(numpy_name: str) -> "np.dtype":
    import numpy as np
    if numpy_name.startswith("ml_dtypes."):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, numpy_name[len("ml_dtypes."):]))
    return np.dtype(getattr(np, numpy_name))


def _s(name, bits, npdt, kind, **kw):
    return DTypeSpec(name, bits, npdt, kind, **kw)


_TABLE = [
    _s("float64", 64, "float64", "float"),
    _s("float32", 32, "float32", "float"),
    _s("float16", 16, "float16", "float"),
    _s("bfloat16", 16, "ml_dtypes.bfloat16", "float"),
    _s("float8_e4m3fn", 8, "ml_dtypes.float8_e4m3fn", "float"),
    _s("float8_e4m3fnuz", 8, "ml_dtypes.float8_e4m3fnuz", "float"),
    _s("float8_e5m2", 8, "ml_dtypes.float8_e5m2", "float"),
    _s("float8_e5m2fnuz", 8, "ml_dtypes.float8_e5m2fnuz", "float"),
    _s("float8_e8m0fnu", 8, "ml_dtypes.float8_e8m0fnu", "float"),
    # torch.float4_e2m1fn_x2: one byte holds two fp4 values; viewed as raw bytes.
    _s("float4_e2m1fn_x2", 8, "uint8", "float", packed=True),
    # complex32 (torch.chalf) has no numpy type: viewed as pairs of float16 by the reader.
    _s("complex32", 32, None, "complex"),
    _s("complex64", 64, "complex64", "complex"),
    _s("complex128", 128, "complex128", "complex"),
    _s("bool", 8, "bool_", "bool"),
    _s("int8", 8, "int8", "int"),
    _s("int16", 16, "int16", "int"),
    _s("int32", 32, "int32", "int"),
    _s("int64", 64, "int64", "int"),
    _s("uint8", 8, "uint8", "uint"),
    _s("uint16", 16, "uint16", "uint"),
    _s("uint32", 32, "uint32", "uint"),
    _s("uint64", 64, "uint64", "uint"),
    # Quantized torch types: views show the integer representation; scale/zero-point are extras.
    _s("qint8", 8, "int8", "quantized"),
    _s("quint8", 8, "uint8", "quantized"),
    _s("qint32", 32, "int32", "quantized"),
    # torch addresses these by value (strides, offsets, numel count nibbles / crumbs).
    _s("quint4x2", 4, "uint8", "quantized", packed=True),
    _s("quint2x4", 2, "uint8", "quantized", packed=True),
    # Sub-byte ONNX / ml_dtypes types, packed two (or four) per byte on disk.
    _s("int4", 4, "uint8", "int", packed=True),
    _s("uint4", 4, "uint8", "uint", packed=True),
    _s("int2", 2, "uint8", "int", packed=True),
    _s("uint2", 2, "uint8", "uint", packed=True),
    _s("float4_e2m1fn", 4, "uint8", "float", packed=True),
    _s("float6_e2m3fn", 6, "uint8", "float", packed=True),
    _s("float6_e3m2fn", 6, "uint8", "float", packed=True),
    # torch's opaque bit containers (torch.bits8 ...): one element is one byte (two for bits16)
    # whatever it packs; torch has no arithmetic on them, a view shows the unsigned integers.
    _s("bits8", 8, "uint8", "bits"),
    _s("bits16", 16, "uint16", "bits"),
    _s("bits1x8", 8, "uint8", "bits"),
    _s("bits2x4", 8, "uint8", "bits"),
    _s("bits4x2", 8, "uint8", "bits"),
    # Variable-size values (ONNX strings, NumPy object arrays): no fixed layout.
    _s("string", 0, None, "string"),
    _s("object", 0, None, "object"),
]

DTYPES: dict[str, DTypeSpec] = {}
for _spec in _TABLE:
    if _spec.name in DTYPES:  # checked at import time, as pickletools checks its opcode table
        raise RuntimeError(f"duplicate dtype {_spec.name!r}")
    DTYPES[_spec.name] = _spec


def register_block_type(name: str, block_elems: int, block_bytes: int) -> DTypeSpec:
    """Add a block-quantized type (GGUF's ``q4_0`` ...): ``block_elems`` values in ``block_bytes``."""
    existing = DTYPES.get(name)
    new = DTypeSpec(name, 0, None, "block", block_elems=block_elems, block_bytes=block_bytes)
    if existing is not None and existing != new:
        raise RuntimeError(f"dtype {name!r} registered twice with different layouts")
    DTYPES[name] = new
    return new


UNKNOWN_PREFIX = "unknown:"
_UNKNOWN_MAX = 1024   # distinct unknown names kept; a hostile file cannot grow the table further
_UNSAFE_LABEL = re.compile(r"[^A-Za-z0-9_.]")


def register_unknown(label: str, itemsize: int = 1) -> str:
    """The dtype name for a type a file names but this tool does not know (a future torch's
    ``torch.float3_e1m2``, ``Float3_e1m2Storage``): ``unknown:<label>``, ``itemsize`` bytes per
    element (derived by the caller from the storage when it can, else 1), read as raw bytes.

    The label is reduced to ``[A-Za-z0-9_.]`` (it comes from the file); the latest itemsize wins,
    which is safe because a TensorInfo fixes its ``nbytes`` when it is built.
    """
    name = UNKNOWN_PREFIX + _UNSAFE_LABEL.sub("_", str(label))[:64]
    if name not in DTYPES and sum(1 for k in DTYPES if k.startswith(UNKNOWN_PREFIX)) >= _UNKNOWN_MAX:
        name = UNKNOWN_PREFIX + "other"
    DTYPES[name] = DTypeSpec(name, 8 * max(1, int(itemsize)), None, "unknown")
    return name


def is_unknown(name: str) -> bool:
    return name.startswith(UNKNOWN_PREFIX)


def spec(name: str) -> DTypeSpec:
    """The `DTypeSpec` of a canonical dtype name. Raises KeyError with the name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise KeyError(f"unknown dtype {name!r}") from None


def numpy_dtype(name: str) -> "np.dtype | None":
    return spec(name).numpy


def nbytes_for(name: str, numel: int) -> int:
    """Bytes that ``numel`` contiguous elements of ``name`` take on disk (packing and blocks included)."""
    s = spec(name)
    if s.kind == "block":
        blocks = -(-numel // s.block_elems)
        return blocks * s.block_bytes
    if s.bits == 0:
        return 0
    return -(-numel * s.bits // 8)
