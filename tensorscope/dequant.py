"""Decoded values of quantized and packed tensors, as float32, in bounded memory.

`ModelFile.read` returns what is stored: the raw bytes (uint8) of a GGUF block-quantized tensor or
of a packed sub-byte tensor, the integer representation of a torch quantized tensor. This module
turns those bytes into the numbers they stand for:

- `decode(model, info)` returns a NEW float32 array (a copy, writable, owned by the caller) with
  the tensor's logical shape (`decoded_shape`).
- `iter_decoded(model, info, chunk_elems)` yields the same values as NEW 1-D float32 pieces in C
  order, each of at most ~``chunk_elems`` elements (block types: whole blocks), so that statistics
  and diffs of a large GGUF tensor never hold more than one piece of it.
- `is_decoded(dtype)` tells which dtypes go through here; `decoded_shape(info)` the output shape.
- `value_stats(model, info)`: `tensorscope.reader.tensor_stats` of the values a tensor stands for
  (decoded piece by piece for the dtypes above, the zero-copy view otherwise).

Layouts (normative; little-endian; every block is self-contained and blocks follow each other in
C order of the values, so GGUF rows are along the last numpy dimension, ``ne[0]``):

- GGUF legacy quants (32 values per block; ``d``/``m`` are float16):
  ``q4_0`` = d, qs[16]: value j is (qs[j] & 15) - 8, value j+16 is (qs[j] >> 4) - 8, times d.
  ``q4_1`` = d, m, qs[16]: d*q + m with the same nibble order, unsigned.
  ``q5_0`` = d, qh (u32), qs[16]: the fifth bit of value i is bit i of qh; (q - 16) * d.
  ``q5_1`` = d, m, qh, qs[16]: d*q + m.  ``q8_0`` = d, int8 qs[32]: q*d.
- GGUF K-quants (256 values per super-block):
  ``q2_k`` = scales[16] (low nibble scale, high nibble min, per 16 values), qs[64] (2 bits:
  value 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]), d, dmin: (d*sc)*q - dmin*m.
  ``q3_k`` = hmask[32], qs[64], scales[12] (16 six-bit scales: low nibbles from bytes 0-7, low
  then high nibble; high two bits from bytes 8-11), d: value 128h + 32s + l has low bits as in
  q2_k and subtracts 4 unless bit 4h+s of hmask[l] is set; (d*(scale-32))*q.
  ``q4_k`` = d, dmin, scales[12] (8 six-bit scales and mins: ``get_scale_min_k4``), qs[128]
  (value 64c + 32n + l is nibble n of qs[32c + l]): (d*sc)*q - dmin*m.
  ``q5_k`` = q4_k's fields with qh[32] before qs: bit b of qh[l] is the fifth bit of value 32b + l.
  ``q6_k`` = ql[128], qh[64], int8 scales[16], d: 6-bit q - 32, times d*scale (per 16 values).
  ``q8_k`` = float32 d, int8 qs[256], int16 bsums[16] (sums, unused here): d*q.
- Ternary and fp4 blocks: ``tq1_0`` (base-3 digits in qs[48] and qh[4], d), ``tq2_0`` (2-bit
  q - 1, d), ``mxfp4`` (an e8m0 exponent byte, then 32 e2m1 nibbles, low nibbles first),
  ``nvfp4`` (64 values: 4 unsigned e4m3 scales, then 4 x 8 bytes of e2m1 nibbles), ``iq4_nl``
  (d, 32 nibbles into a fixed 16-entry table) and ``iq4_xs`` (d, 6-bit sub-block scales, nibbles
  into that table).
- Not decoded (a `TensorscopeError` names the type): ``q8_1`` (an intermediate type of ggml's
  matrix products; gguf-py 0.19 gives it 40-byte blocks, ggml 36, so its stored layout is
  ambiguous), ``q1_0`` and the grid-codebook i-quants (``iq1_s``, ``iq1_m``, ``iq2_xxs``,
  ``iq2_xs``, ``iq2_s``, ``iq3_xxs``, ``iq3_s``), whose lookup grids are not carried here.
- Packed sub-byte types (ONNX, safetensors, ml_dtypes): value i occupies bits
  [i*b, (i+1)*b) of the little-endian bit stream (b = 4 for ``int4``/``uint4``/``float4_e2m1fn``,
  2 for ``int2``/``uint2``, 6 for the ``float6`` types): the low nibble first, as
  ``onnx.numpy_helper`` unpacks. A final partial byte is padding.
- torch ``float4_e2m1fn_x2``: each stored element is a byte holding two fp4 values, the low
  nibble first (c10's ``Float4_e2m1fn_x2``: bits 3-0 are val0, bits 7-4 val1); the decoded shape
  doubles the last dimension (a 0-d tensor decodes to shape (2,)). Strides apply to the bytes.
- torch quantized types: ``(q - zero_point) * scale``. Per tensor: in float32 with the scale
  rounded to float32 (as ``torch.dequantize`` computes it). Per channel
  (``per_channel_affine``: float64 scales, int64 zero points): in float64, then rounded.
  ``per_channel_affine_float_qparams`` (float zero points): in float32. The per-channel
  parameters are extra storages in the same file (``info.extras["scales"]`` and
  ``["zero_points"]``: dtype, shape, byte_offset), read bounds-checked. ``quint4x2`` and
  ``quint2x4`` pack 2 and 4 values per byte, low bits first.

Exactness: the float32 operations are those of gguf-py's ``gguf.quants.dequantize`` (and ggml's
``dequantize_row_*``), in the same order, so results match it bit for bit; torch quantized types
match ``torch.dequantize`` bit for bit (``tests/test_dequant.py``).

Memory: `decode` allocates the float32 output (4 bytes per value; values are backed by stored
bytes, except for a torch view with zero strides, which is refused above `MAX_BROADCAST_BYTES`);
`iter_decoded` allocates one piece at a time.

Public API: `is_decoded`, `decoded_shape`, `decode`, `iter_decoded`, `value_stats`,
`DECODABLE_BLOCK_TYPES`,
`DEFAULT_CHUNK_ELEMS`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from . import dtypes
from .errors import FormatError, LimitExceeded, TensorscopeError

if TYPE_CHECKING:
    from .model import ModelFile, TensorInfo

__all__ = ["is_decoded", "decoded_shape", "decode", "iter_decoded", "value_stats", "many_value_stats", "DECODABLE_BLOCK_TYPES",
           "DEFAULT_CHUNK_ELEMS", "MAX_BROADCAST_BYTES"]

DEFAULT_CHUNK_ELEMS = 1 << 20      # 4 MiB of float32 per piece
MAX_BROADCAST_BYTES = 1 << 30      # decode() of a zero-stride view may not claim more than this

_F32 = np.float32
QK_K = 256


# ------------------------------------------------------------------------------------------------
# Field helpers: ``blocks`` is (n, block_bytes) uint8; fields are named by their byte offsets.
# ------------------------------------------------------------------------------------------------

def _f16(blocks: np.ndarray, off: int) -> np.ndarray:
    """A float16 field at byte ``off`` of every block, as float32 of shape (n, 1)."""
    return blocks[:, off:off + 2].copy().view(np.float16).astype(_F32)


def _nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """(n, k) bytes -> (n, 2k) nibbles: per run of ``group`` bytes, their low nibbles then their
    high nibbles (the order every ggml 4-bit layout uses)."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group)
    return (np.concatenate([q & 0x0F, q >> 4], axis=2)).reshape(n, -1)


def _crumbs(qs: np.ndarray, group: int) -> np.ndarray:
    """(n, k) bytes -> (n, 4k) 2-bit fields: per run of ``group`` bytes, bits 0-1 of each, then
    bits 2-3, 4-5, 6-7."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, group)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((q >> shifts) & 3).reshape(n, -1)


def _bits(mask: np.ndarray, nbits: int) -> np.ndarray:
    """(n, k) bytes -> (n, nbits, k): plane b holds bit b of every byte."""
    n = mask.shape[0]
    shifts = np.arange(nbits, dtype=np.uint8).reshape(1, nbits, 1)
    return (mask.reshape(n, 1, -1) >> shifts) & 1


# ------------------------------------------------------------------------------------------------
# GGUF block decoders: (n, block_bytes) uint8 -> (n, block_elems) float32
# ------------------------------------------------------------------------------------------------

def _q4_0(b):
    d = _f16(b, 0)
    q = _nibbles(b[:, 2:18], 16).astype(np.int8) - np.int8(8)
    return d * q.astype(_F32)


def _q4_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    q = _nibbles(b[:, 4:20], 16).astype(_F32)
    return (d * q) + m


def _q5_high(qh: np.ndarray) -> np.ndarray:
    """The 32 fifth bits of a q5 block: bit i of the little-endian u32 ``qh``."""
    return _bits(qh, 8).transpose(0, 2, 1).reshape(qh.shape[0], 32)


def _q5_0(b):
    d = _f16(b, 0)
    q = _nibbles(b[:, 6:22], 16) | (_q5_high(b[:, 2:6]) << 4)
    return d * (q.astype(np.int8) - np.int8(16)).astype(_F32)


def _q5_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    q = _nibbles(b[:, 8:24], 16) | (_q5_high(b[:, 4:8]) << 4)
    return (d * q.astype(_F32)) + m


def _q8_0(b):
    d = _f16(b, 0)
    return b[:, 2:34].view(np.int8).astype(_F32) * d


def _q8_k(b):
    d = b[:, 0:4].copy().view(_F32)
    return d * b[:, 4:260].view(np.int8).astype(_F32)


def _q2_k(b):
    n = b.shape[0]
    scales = b[:, 0:16]
    d, dmin = _f16(b, 80), _f16(b, 82)
    dl = (d * (scales & 0x0F).astype(_F32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).astype(_F32)).reshape(n, 16, 1)
    q = _crumbs(b[:, 16:80], 32).reshape(n, 16, 16).astype(_F32)
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b):
    n = b.shape[0]
    hmask, qs, packed = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    d = _f16(b, 108)
    low = np.concatenate([packed[:, 0:8] & 0x0F, packed[:, 0:8] >> 4], axis=1)   # scales 0-15
    high = _crumbs(packed[:, 8:12], 4)                                              # bits 4-5
    scales = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(_F32)
    dl = (d * scales).reshape(n, 16, 1)
    ql = _crumbs(qs, 32).reshape(n, 16, 16)
    hbit = _bits(hmask, 8).reshape(n, 16, 16)          # value 32b + l uses bit b of hmask[l]
    q = (ql.astype(np.int8) - ((hbit ^ 1) << 2).astype(np.int8)).astype(_F32)
    return (dl * q).reshape(n, QK_K)


def _scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks: 6-bit scales and mins from 12 bytes."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _q4_k(b):
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _scale_min_k4(b[:, 4:16])
    dl = (d * sc.astype(_F32)).reshape(n, 8, 1)
    ml = (dmin * mn.astype(_F32)).reshape(n, 8, 1)
    q = _nibbles(b[:, 16:144], 32).reshape(n, 8, 32).astype(_F32)
    return (dl * q - ml).reshape(n, QK_K)


def _q5_k(b):
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _scale_min_k4(b[:, 4:16])
    dl = (d * sc.astype(_F32)).reshape(n, 8, 1)
    ml = (dmin * mn.astype(_F32)).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:176], 32).reshape(n, 8, 32)
    qh = _bits(b[:, 16:48], 8)                          # (n, 8, 32): sub-block b, position l
    q = (ql | (qh << 4)).astype(_F32)
    return (dl * q - ml).reshape(n, QK_K)


def _q6_k(b):
    n = b.shape[0]
    ql = _nibbles(b[:, 0:128], 64).reshape(n, 8, 32)    # value 128h + 64k + m: nibble k of ql[64h+m]
    qh = _crumbs(b[:, 128:192], 32).reshape(n, 8, 32)   # value 128h + 32s + l: bits 2s of qh[32h+l]
    scales = b[:, 192:208].view(np.int8).astype(_F32)
    d = _f16(b, 208)
    dl = (d * scales).reshape(n, 16, 1)
    q = ((ql | (qh << 4)).astype(np.int8) - np.int8(32)).reshape(n, 16, 16).astype(_F32)
    return (dl * q).reshape(n, QK_K)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _tq1_0(b):
    n = b.shape[0]
    qs, qh = b[:, 0:48], b[:, 48:52]
    d = _f16(b, 52)
    # Each byte holds base-3 digits as a fixed-point fraction: multiplying by 3^k (mod 256)
    # brings digit k to the top, and (x * 3) >> 8 reads it.
    p0 = (qs[:, 0:32].reshape(n, 1, 32) * _POW3.reshape(1, 5, 1)).reshape(n, -1)
    p1 = (qs[:, 32:48].reshape(n, 1, 16) * _POW3.reshape(1, 5, 1)).reshape(n, -1)
    p2 = (qh.reshape(n, 1, 4) * _POW3[:4].reshape(1, 4, 1)).reshape(n, -1)
    x = np.concatenate([p0, p1, p2], axis=1)
    q = ((x.astype(np.uint16) * 3) >> 8).astype(np.int8) - np.int8(1)
    return d * q.astype(_F32)


def _tq2_0(b):
    d = _f16(b, 64)
    q = _crumbs(b[:, 0:64], 32).astype(np.int8) - np.int8(1)
    return d * q.astype(_F32)


# e2m1 values doubled (the scales below are halved to match), as ggml's kvalues_mxfp4.
_E2M1_X2 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                  dtype=np.int8)


def _e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2**(e-128) as float32 bits (subnormal for e < 2)."""
    e32 = e.astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(_F32)


def _mxfp4(b):
    d = _e8m0_half(b[:, 0:1])
    q = _E2M1_X2[_nibbles(b[:, 1:17], 16)]
    return d * q.astype(_F32)


def _ue4m3_half_table() -> np.ndarray:
    """Unsigned e4m3 (bias 7, bit 7 ignored, 0x7F read as 0) halved, for every byte value."""
    x = np.arange(256, dtype=np.uint16)
    exp = ((x >> 3) & 0x0F).astype(_F32)
    man = (x & 7).astype(_F32)
    raw = np.where(exp == 0, man * _F32(2.0 ** -9), (_F32(1) + man / _F32(8)) * np.exp2(exp - _F32(7)))
    return np.where((x == 0) | (x == 0x7F), _F32(0), raw * _F32(0.5)).astype(_F32)


_UE4M3_HALF = _ue4m3_half_table()


def _nvfp4(b):
    n = b.shape[0]
    d = _UE4M3_HALF[b[:, 0:4]].reshape(n, 4, 1)
    q = _E2M1_X2[_nibbles(b[:, 4:36], 8)].reshape(n, 4, 16)
    return (d * q.astype(_F32)).reshape(n, 64)


def _iq4_nl(b):
    d = _f16(b, 0)
    return d * _IQ4NL[_nibbles(b[:, 2:18], 16)].astype(_F32)


def _iq4_xs(b):
    n = b.shape[0]
    d = _f16(b, 0)
    scales_h = b[:, 2:4].copy().view(np.uint16)                      # (n, 1)
    shifts = (2 * np.arange(8, dtype=np.uint16)).reshape(1, 8)
    high = ((scales_h >> shifts) & 3).astype(np.uint8)                # (n, 8)
    sl = b[:, 4:8]
    low = np.stack([sl & 0x0F, sl >> 4], axis=2).reshape(n, 8)       # sub-block 2i: low nibble
    ls = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(_F32)
    dl = (d * ls).reshape(n, 8, 1)
    q = _IQ4NL[_nibbles(b[:, 8:136], 16)].astype(_F32).reshape(n, 8, 32)
    return (dl * q).reshape(n, QK_K)


_BLOCK_DECODERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1, "q8_0": _q8_0,
    "q2_k": _q2_k, "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k, "q8_k": _q8_k,
    "tq1_0": _tq1_0, "tq2_0": _tq2_0, "mxfp4": _mxfp4, "nvfp4": _nvfp4,
    "iq4_nl": _iq4_nl, "iq4_xs": _iq4_xs,
}
# The layout each decoder was written for: (values per block, bytes per block).
_BLOCK_LAYOUT = {
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
    "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176),
    "q6_k": (256, 210), "q8_k": (256, 292), "tq1_0": (256, 54), "tq2_0": (256, 66),
    "mxfp4": (32, 17), "nvfp4": (64, 36), "iq4_nl": (32, 18), "iq4_xs": (256, 136),
}
if _BLOCK_LAYOUT.keys() != _BLOCK_DECODERS.keys():  # checked at import time
    raise RuntimeError("dequant: block decoder and layout tables disagree")
DECODABLE_BLOCK_TYPES = tuple(_BLOCK_DECODERS)

_UNSUPPORTED_WHY = {
    "q8_1": "q8_1 is an intermediate type of ggml's matrix products whose stored layout is "
            "ambiguous (gguf-py 0.19 gives it 40-byte blocks, ggml 36)",
}

# ------------------------------------------------------------------------------------------------
# Packed sub-byte types
# ------------------------------------------------------------------------------------------------

# dtype -> (bits per value, ml_dtypes name or None for quantized codes)
_PACKED = {
    "int4": (4, "int4"), "uint4": (4, "uint4"), "float4_e2m1fn": (4, "float4_e2m1fn"),
    "int2": (2, "int2"), "uint2": (2, "uint2"),
    "float6_e2m3fn": (6, "float6_e2m3fn"), "float6_e3m2fn": (6, "float6_e3m2fn"),
    "float4_e2m1fn_x2": (4, "float4_e2m1fn"),
    "quint4x2": (4, None), "quint2x4": (2, None),
}
_TABLES: dict[str, np.ndarray] = {}


def _table(bits: int, ml_name: str | None) -> np.ndarray:
    """float32 value of every code of ``bits`` bits (ml_dtypes' own conversion, exact)."""
    key = f"{ml_name}/{bits}"
    t = _TABLES.get(key)
    if t is None:
        codes = np.arange(1 << bits, dtype=np.uint8)
        if ml_name is None:
            t = codes.astype(_F32)  # quantized codes are unsigned; scale/zero point come later
        else:
            import ml_dtypes
            t = codes.view(getattr(ml_dtypes, ml_name)).astype(_F32)
        _TABLES[key] = t
    return t


def _unpack(raw: np.ndarray, bits: int, start: int, count: int) -> np.ndarray:
    """Codes ``start .. start+count`` of an LSB-first bit stream of ``bits``-bit values.

    Works in 3-byte groups (24 bits hold 6, 12 or 4 whole values of 4, 2 or 6 bits); ``start``
    must begin a group. The caller has checked that ``raw`` holds the values.
    """
    per = 24 // bits
    g0 = start // per
    groups = -(-count // per)
    chunk = raw[g0 * 3: (g0 + groups) * 3]
    if chunk.size < groups * 3:  # the final partial group: pad a copy of the tail with zeros
        chunk = np.concatenate([chunk, np.zeros(groups * 3 - chunk.size, np.uint8)])
    g = chunk.reshape(groups, 3).astype(np.uint32)
    word = g[:, 0] | (g[:, 1] << 8) | (g[:, 2] << 16)
    shifts = (np.arange(per, dtype=np.uint32) * bits).reshape(1, per)
    codes = (word.reshape(groups, 1) >> shifts) & np.uint32((1 << bits) - 1)
    return codes.reshape(-1)[:count].astype(np.uint8)


# ------------------------------------------------------------------------------------------------
# Public functions
# ------------------------------------------------------------------------------------------------

def is_decoded(dtype: str) -> bool:
    """True when ``dtype``'s stored form is not its value (block, packed or torch quantized):
    `ModelFile.values` then decodes through this module."""
    s = dtypes.spec(dtype)
    return s.kind in ("block", "quantized") or s.packed


def decoded_shape(info: "TensorInfo") -> tuple[int, ...]:
    """The shape of the decoded values: ``info.shape``, except for torch's
    ``float4_e2m1fn_x2`` whose last dimension doubles (two fp4 values per stored element)."""
    if info.dtype == "float4_e2m1fn_x2":
        return info.shape[:-1] + (info.shape[-1] * 2,) if info.shape else (2,)
    return info.shape


def decode(model: "ModelFile", info: "TensorInfo") -> np.ndarray:
    """The decoded values of ``info`` as a NEW float32 array of `decoded_shape` (a copy: writing
    to it never touches the file, and it costs 4 bytes per value).

    Raises:
        TensorscopeError: the dtype cannot be decoded (the message names it), or a plain dtype.
        FormatError: the stored bytes (or quantization parameters) do not cover the tensor.

    Example:
        >>> m = tensorscope.open("model.Q4_K_M.gguf")                       # doctest: +SKIP
        >>> decode(m, m.tensor("blk.0.attn_q.weight")).dtype                  # doctest: +SKIP
        dtype('float32')
    """
    shape = decoded_shape(info)
    numel = math.prod(shape)
    if dtypes.spec(info.dtype).kind == "quantized" and not dtypes.spec(info.dtype).packed:
        _check_broadcast(model, info, numel)
    out = np.empty(numel, dtype=_F32)
    pos = 0
    for piece in iter_decoded(model, info):
        out[pos:pos + piece.size] = piece
        pos += piece.size
    if pos != numel:  # every decoder yields exactly numel values; a mismatch is our bug
        raise TensorscopeError(f"tensor {info.name!r}: decoded {pos} values for {numel}")
    return out.reshape(shape)


def iter_decoded(model: "ModelFile", info: "TensorInfo", chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                 release: Callable[[str, int, int], None] | None = None) -> Iterator[np.ndarray]:
    """Yield the decoded values of ``info`` as NEW 1-D float32 pieces, in C order of
    `decoded_shape`, each of about ``chunk_elems`` values (whole blocks for block types).

    ``release(file, offset, length)``, when given, is called with the stored bytes of each piece
    once the consumer has taken it (e.g. `PageReleaser.release_range`, to drop map pages).
    Errors are raised when the first piece is requested (generator semantics).
    """
    s = dtypes.spec(info.dtype)
    chunk_elems = max(1, int(chunk_elems))
    if s.kind == "block":
        return _iter_blocks(model, info, chunk_elems, release)
    if info.dtype in _PACKED:
        if s.kind == "quantized":
            return _iter_quantized(model, info, chunk_elems, _iter_packed(model, info, chunk_elems, release))
        return _iter_packed(model, info, chunk_elems, release)
    if s.kind == "quantized":
        return _iter_quantized(model, info, chunk_elems, _iter_ints(model, info, chunk_elems))
    raise TensorscopeError(f"tensor {info.name!r}: dtype {info.dtype} is stored as its values; "
                           f"read it with ModelFile.read")


def _where(info: "TensorInfo") -> dict:
    return dict(format=info.source_format or "dequant", file=info.file, member=info.storage_key)


def _iter_blocks(model, info, chunk_elems, release):
    name = info.dtype
    decoder = _BLOCK_DECODERS.get(name)
    if decoder is None:
        why = _UNSUPPORTED_WHY.get(name, f"{name} blocks are not decoded by tensorscope (supported: "
                                         f"{', '.join(DECODABLE_BLOCK_TYPES)})")
        raise TensorscopeError(f"tensor {info.name!r}: cannot decode {name}: {why}")
    s = dtypes.spec(name)
    if (s.block_elems, s.block_bytes) != _BLOCK_LAYOUT[name]:
        raise TensorscopeError(f"cannot decode {name}: registered as {s.block_elems} values in "
                               f"{s.block_bytes} bytes, the decoder expects {_BLOCK_LAYOUT[name]}")
    if info.numel % s.block_elems:
        raise FormatError(f"tensor {info.name!r} of {name} has {info.numel} values, not a multiple "
                          f"of its block of {s.block_elems}", **_where(info))
    raw = model.read(info)  # the stored bytes, bounds-checked (uint8, nbytes long)
    nblocks = info.numel // s.block_elems
    if raw.dtype != np.uint8 or raw.size != nblocks * s.block_bytes:
        raise FormatError(f"tensor {info.name!r}: {raw.size} stored bytes for {nblocks} {name} "
                          f"blocks of {s.block_bytes} bytes", **_where(info))
    blocks = raw.reshape(nblocks, s.block_bytes)
    per = max(1, chunk_elems // s.block_elems)
    return _block_pieces(blocks, decoder, per, info, release)


def _block_pieces(blocks, decoder, per, info, release):
    nbytes = blocks.shape[1]
    with np.errstate(over="ignore", invalid="ignore"):  # random scales may overflow: as ggml
        for i in range(0, blocks.shape[0], per):
            part = blocks[i:i + per]
            yield decoder(part).astype(_F32, copy=False).reshape(-1)
            if release is not None and info.byte_offset is not None:
                release(info.file, info.byte_offset + i * nbytes, part.size)


def _packed_source(model, info, bits, numel):
    """The stored bytes of a packed tensor: ``ceil(numel * bits / 8)`` of them, bounds-checked
    (quint4x2's registered item size counts a byte per value, so the count is derived here)."""
    need = -(-numel * bits // 8)
    if info.name in model.custom_readers or info.chunks:
        raw = model.read(info)
    else:
        if info.byte_offset is None:
            raise FormatError(f"tensor {info.name!r} has no stored bytes to read", **_where(info))
        if info.storage_nbytes is not None and need > info.storage_nbytes:
            raise FormatError(f"tensor {info.name!r} needs {need} bytes for {numel} {bits}-bit "
                              f"values, its storage holds {info.storage_nbytes}", **_where(info))
        src = model.source(info.file)
        raw = np.frombuffer(src.view(info.byte_offset, need, f"tensor {info.name!r}",
                                     fmt=_where(info)["format"], member=info.storage_key),
                            dtype=np.uint8)
    raw = np.asarray(raw).reshape(-1)
    if raw.dtype != np.uint8 or raw.size < need:
        raise FormatError(f"tensor {info.name!r}: {raw.size} stored bytes for {numel} "
                          f"{bits}-bit values (needs {need})", **_where(info))
    return raw


def _iter_packed(model, info, chunk_elems, release):
    bits, ml_name = _PACKED[info.dtype]
    table = _table(bits, ml_name)
    if info.dtype == "float4_e2m1fn_x2":
        return _iter_fp4_x2(model, info, chunk_elems, table)
    numel = info.numel
    if not info.is_contiguous and numel > 1:
        raise TensorscopeError(f"tensor {info.name!r}: a non-contiguous {info.dtype} view "
                               f"(stride {list(info.stride)}) cannot be decoded")
    raw = _packed_source(model, info, bits, numel)
    per_group = 24 // bits
    step = max(per_group, chunk_elems // per_group * per_group)
    return _packed_pieces(raw, bits, numel, step, table, info, release)


def _packed_pieces(raw, bits, numel, step, table, info, release):
    for start in range(0, numel, step):
        count = min(step, numel - start)
        yield table[_unpack(raw, bits, start, count)]
        if release is not None and info.byte_offset is not None:
            release(info.file, info.byte_offset + start * bits // 8, -(-count * bits // 8))


def _iter_fp4_x2(model, info, chunk_elems, table):
    import dataclasses
    if info.name in model.custom_readers or info.chunks:
        view = np.asarray(model.read(info))
    else:
        # The stored elements are bytes: view them with the tensor's own strides.
        as_bytes = dataclasses.replace(info, dtype="uint8", nbytes=-1)
        from .reader import strided_view
        view = strided_view(model, as_bytes)
    from .reader import iter_flat_chunks
    view = view.reshape(info.shape) if view.size == info.numel else view
    return _fp4_pieces(iter_flat_chunks(view, max(1, chunk_elems // 2)), table)


def _fp4_pieces(chunks, table):
    for piece in chunks:
        pairs = np.stack([piece & 0x0F, piece >> 4], axis=-1).reshape(-1)  # low nibble first
        yield table[pairs]


def _iter_ints(model, info, chunk_elems):
    """The integer representation of a qint8/quint8/qint32 tensor, as flat C-order pieces."""
    from .reader import iter_flat_chunks
    view = model.read(info)
    return iter_flat_chunks(view, chunk_elems * view.dtype.itemsize)


def _check_broadcast(model, info, numel):
    if numel * 4 > MAX_BROADCAST_BYTES and any(st == 0 for st, d in zip(info.stride, info.shape) if d > 1):
        raise LimitExceeded("decoded size of a zero-stride view", MAX_BROADCAST_BYTES, numel * 4,
                            **_where(info))


def _qparam(model, info, key: str) -> np.ndarray:
    """A per-channel scale or zero-point vector, read from its storage in ``info.file``."""
    ref = info.extras.get(key)
    if not isinstance(ref, dict) or ref.get("byte_offset") is None:
        raise FormatError(f"tensor {info.name!r}: per-channel {key} are not stored tensors "
                          f"({ref!r:.80})", **_where(info))
    dt = dtypes.spec(str(ref.get("dtype")))
    shape = ref.get("shape") or []
    if dt.numpy is None or dt.kind not in ("float", "int") or len(shape) != 1:
        raise FormatError(f"tensor {info.name!r}: per-channel {key} of dtype {ref.get('dtype')} "
                          f"and shape {shape} cannot be used", **_where(info))
    count = int(shape[0])
    src = model.source(info.file)
    raw = src.view(int(ref["byte_offset"]), count * dt.itemsize, f"{key} of tensor {info.name!r}",
                   fmt=_where(info)["format"], member=ref.get("storage_key"))
    return np.frombuffer(raw, dtype=dt.numpy.newbyteorder("<"), count=count)


def _iter_quantized(model, info, chunk_elems, codes: Iterator[np.ndarray]):
    """Apply ``(q - zero_point) * scale`` to the codes (see the module docstring for precision)."""
    scheme = str(info.extras.get("qscheme", ""))
    if scheme.startswith("per_tensor"):
        try:
            scale = _F32(float(info.extras["scale"]))
            zp = _F32(float(info.extras["zero_point"]))
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"tensor {info.name!r}: per-tensor quantization without a numeric "
                              f"scale and zero point", **_where(info)) from None
        return _per_tensor(codes, scale, zp)
    if scheme.startswith("per_channel"):
        scales, zps = _qparam(model, info, "scales"), _qparam(model, info, "zero_points")
        axis = info.extras.get("axis")
        if not isinstance(axis, int) or not 0 <= axis < len(info.shape):
            raise FormatError(f"tensor {info.name!r}: channel axis {axis!r} for shape "
                              f"{list(info.shape)}", **_where(info))
        channels = info.shape[axis]
        if scales.size != channels or zps.size != channels:
            raise FormatError(f"tensor {info.name!r}: {scales.size} scales and {zps.size} zero "
                              f"points for {channels} channels", **_where(info))
        inner = math.prod(info.shape[axis + 1:])
        if zps.dtype.kind == "f":   # per_channel_affine_float_qparams: float32 arithmetic
            sc, zp, work = scales.astype(_F32), zps.astype(_F32), _F32
        else:                       # per_channel_affine: float64 arithmetic, then float32
            sc, zp, work = scales.astype(np.float64), zps.astype(np.float64), np.float64
        return _per_channel(codes, sc, zp, work, inner, channels)
    raise TensorscopeError(f"tensor {info.name!r}: cannot decode quantization scheme {scheme!r}")


def _per_tensor(codes, scale, zp):
    for q in codes:
        yield (q.astype(_F32) - zp) * scale


def _per_channel(codes, sc, zp, work, inner, channels):
    pos = 0
    for q in codes:
        ch = (np.arange(pos, pos + q.size, dtype=np.int64) // inner) % channels
        pos += q.size
        yield ((q.astype(work) - zp[ch]) * sc[ch]).astype(_F32, copy=False)


def value_stats(model: "ModelFile", info: "TensorInfo", chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                pages=None, workers: int | None = None):
    """`tensor_stats` of ``info``'s values in one pass (`tensorscope.valuestats.summarize`):
    decoded piece by piece for the dtypes of `is_decoded`, over `ModelFile.read` otherwise.
    ``pages`` (a `tensorscope.reader.PageReleaser` of ``model``) drops the map's pages behind the
    pass: large tensors step by step, small ones in batches with their neighbours.

    Returns a `tensorscope.reader.TensorStats`.
    """
    from .valuestats import STEP_BYTES, summarize
    if is_decoded(info.dtype):
        release = pages.release_range if pages is not None else None
        return summarize(iter_decoded(model, info, chunk_elems, release=release)).stats()
    arr = model.read(info)
    if pages is None:
        return summarize(arr, workers=workers).stats()
    if arr.nbytes < STEP_BYTES or not arr.flags.c_contiguous:
        got = summarize(arr, workers=workers)
        pages.release_later(info)
        return got.stats()
    from .reader import RELEASE_BEHIND
    got = summarize(arr, workers=workers, release=lambda piece: pages.release_piece(
        info.file, piece, RELEASE_BEHIND))
    # and once more the whole span with a margin: what one thread's faults mapped again around
    # a step another thread had released (fault-around maps both ways) goes too
    pages.release_range(info.file, max(0, info.byte_offset - RELEASE_BEHIND),
                        info.span_bytes + 2 * RELEASE_BEHIND)
    return got.stats()


def many_value_stats(model: "ModelFile", tensors, advance: Callable[[int], None] | None = None):
    """`value_stats` of every tensor, in order, as ``(info, TensorStats or the error)`` (a
    `TensorscopeError`, TypeError or ValueError: strings, undecodable blocks); others propagate.

    Tensors are read on the stats pool a few at a time (the kernel releases the GIL, so a file of
    many medium tensors keeps every core busy); a large tensor is split over the pool by itself.
    Pages are released behind the pass (`value_stats`), so the resident set stays flat.
    ``advance(nbytes)`` reports each tensor as it is done.
    """
    from collections import deque

    from .reader import PageReleaser
    from .valuestats import PARALLEL_BYTES, _pool, _workers
    pages = PageReleaser(model)

    def one(t):
        try:
            return value_stats(model, t, pages=pages, workers=1)
        except (TypeError, ValueError, TensorscopeError) as e:
            return e

    tensors = list(tensors)
    if _workers() == 1 or sum(t.nbytes for t in tensors) < PARALLEL_BYTES:
        # a small file: no thread is started for it (nor left behind)
        try:
            for t in tensors:
                got = one(t)
                if advance is not None:
                    advance(t.nbytes)
                yield t, got
        finally:
            pages.flush()
        return
    pool, window = _pool(), deque()
    width = 2 * _workers()
    try:
        for t in tensors:
            if t.nbytes >= PARALLEL_BYTES and not is_decoded(t.dtype):
                while window:  # in order: what is in flight first
                    yield _done(window.popleft(), advance)
                try:
                    got = value_stats(model, t, pages=pages)
                except (TypeError, ValueError, TensorscopeError) as e:
                    got = e
                if advance is not None:
                    advance(t.nbytes)
                yield t, got
                continue
            window.append((t, pool.submit(one, t)))
            if len(window) >= width:
                yield _done(window.popleft(), advance)
        while window:
            yield _done(window.popleft(), advance)
    finally:
        for _, job in window:
            job.cancel()
        pages.flush()


def _done(item, advance):
    t, job = item
    got = job.result()
    if advance is not None:
        advance(t.nbytes)
    return t, got
