"""FLOPs per op, counted as ``torch.utils.flop_counter`` counts them, from shapes alone.

torch's counter (torch 2.13) registers formulas for matrix products (``mm``, ``addmm``, ``bmm``,
``baddbmm``: ``2 * m * k * n`` per matrix, a multiply-add being 2 FLOPs, the bias of ``addmm``
not counted), convolutions (``2 * batch * c_out * c_in/groups * prod(kernel) * prod(out
spatial)``, the transposed one over the *input* spatial size; bias not counted) and attention
(``sdpa_flop_count``: two batched products, ``q @ k^T`` and ``scores @ v``, key/value heads
broadcast for GQA). Composite ops reach it decomposed: ``linear`` as ``addmm``/``mm``,
``matmul`` as ``mm``/``bmm``, ``conv2d`` as ``convolution``; the same formulas apply here to the
op as the file names it. Those kinds (``matmul``, ``conv``, ``attention``) are what
``FlopCounterMode`` totals.

Beyond it, element-wise arithmetic counts one FLOP per output element (kind ``elementwise``),
data movement (reshape, transpose, gather, concat, cast ...) counts zero (kind ``none``), and
every other op is *uncounted*: listed, never guessed. A count needs every shape it reads to be
known and static; otherwise the node is uncounted too (``reason`` says why).

Each function takes the input and output shapes (tuples of ints; None for unknown) and the
attributes, and returns ``(flops, kind)`` or raises `Uncounted`.
"""
from __future__ import annotations

from math import prod
from typing import Any, Callable, Sequence

__all__ = ["Uncounted", "onnx_flops", "aten_flops", "COUNTER_KINDS", "MATMUL", "CONV", "ATTENTION",
           "ELEMENTWISE", "NONE"]

MATMUL, CONV, ATTENTION, ELEMENTWISE, NONE = "matmul", "conv", "attention", "elementwise", "none"
COUNTER_KINDS = (MATMUL, CONV, ATTENTION)   # what torch.utils.flop_counter.FlopCounterMode counts

Shape = "tuple[int, ...] | None"


class Uncounted(Exception):
    """The op's FLOPs are not counted; the message says why."""


def _static(shape, what: str) -> tuple[int, ...]:
    if shape is None:
        raise Uncounted(f"{what} shape unknown")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise Uncounted(f"{what} shape {list(shape)} is not static")
    return tuple(shape)


def _arg(shapes: Sequence, i: int, what: str) -> tuple[int, ...]:
    return _static(shapes[i] if i < len(shapes) else None, what)


# -- the counter's formulas ------------------------------------------------------------------------
def mm(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    m, k = a
    k2, n = b
    if k != k2:
        raise Uncounted(f"inner dimensions differ ({k} and {k2})")
    return 2 * m * k * n


def matmul(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """numpy/ONNX MatMul semantics: 1-D operands promoted, batch dimensions broadcast."""
    if not a or not b:
        raise Uncounted("matmul of a scalar")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    m, k = a2[-2:]
    k2, n = b2[-2:]
    if k != k2:
        raise Uncounted(f"inner dimensions differ ({k} and {k2})")
    batch_a, batch_b = a2[:-2], b2[:-2]
    width = max(len(batch_a), len(batch_b))
    batch_a = (1,) * (width - len(batch_a)) + batch_a
    batch_b = (1,) * (width - len(batch_b)) + batch_b
    batch = 1
    for x, y in zip(batch_a, batch_b):
        if x != y and 1 not in (x, y):
            raise Uncounted(f"batch dimensions {x} and {y} do not broadcast")
        batch *= max(x, y)
    return 2 * batch * m * k * n


def conv(x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...], transposed: bool) -> int:
    """`torch.utils.flop_counter.conv_flop_count` (w = (c_out, c_in/groups, *kernel) for a
    convolution, (c_in, c_out/groups, *kernel) for a transposed one, in both ONNX and torch)."""
    if len(x) < 3 or len(w) != len(x) or len(out) != len(x):
        raise Uncounted("convolution shapes of unexpected rank")
    spatial = (x if transposed else out)[2:]
    return 2 * x[0] * w[0] * w[1] * prod(w[2:]) * prod(spatial)


def sdpa(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> int:
    """`torch.utils.flop_counter.sdpa_flop_count` (GQA: fewer key/value heads broadcast)."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        raise Uncounted("attention shapes are not (batch, heads, seq, dim)")
    b, hq, sq, dq = q
    _, hk, sk, dk = k
    dv = v[3]
    if dk != dq or v[2] != sk or hk == 0 or hq % hk:
        raise Uncounted("attention shapes do not match")
    return 2 * b * hq * sq * dq * sk + 2 * b * hq * sq * sk * dv


# -- ONNX ops --------------------------------------------------------------------------------------
# Element-wise arithmetic: one FLOP per output element (ai.onnx names).
_ONNX_ELEMENTWISE = frozenset("""
Add Sub Mul Div Pow Sqrt Reciprocal Exp Log Neg Abs Relu LeakyRelu PRelu Sigmoid HardSigmoid
HardSwish Tanh Erf Gelu Elu Selu Celu Softplus Softsign Mish Sin Cos Tan Asin Acos Atan Sinh Cosh
Asinh Acosh Atanh Floor Ceil Round Sign Clip Max Min Mean Sum Mod BitShift Where Equal Greater
Less GreaterOrEqual LessOrEqual And Or Xor Not IsNaN IsInf ThresholdedRelu
""".split())
# Data movement and metadata: no arithmetic.
_ONNX_NONE = frozenset("""
Reshape Transpose Shape Size Constant ConstantOfShape Identity Squeeze Unsqueeze Concat Slice
Flatten Cast CastLike Expand Gather GatherElements GatherND Split Tile Pad Dropout SpaceToDepth
DepthToSpace Range Optional OptionalGetElement OptionalHasElement SequenceAt SequenceConstruct
SequenceEmpty SequenceInsert SequenceLength SplitToSequence ConcatFromSequence ScatterElements
ScatterND Trilu EyeLike NonZero
""".split())
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def onnx_flops(op: str, domain: str, ins: Sequence, outs: Sequence, attrs: dict[str, Any]
               ) -> tuple[int, str]:
    """FLOPs of one ONNX node (``ins``/``outs``: shapes, None where unknown)."""
    if domain not in ("", "ai.onnx"):
        raise Uncounted(f"op of domain {domain!r}")
    if op in _ONNX_NONE:
        return 0, NONE
    if op in _CONTROL_FLOW:
        raise Uncounted("control flow: its subgraphs are counted on their own")
    if op in _ONNX_ELEMENTWISE:
        return prod(_arg(outs, 0, "output")), ELEMENTWISE
    if op == "MatMul":
        return matmul(_arg(ins, 0, "A"), _arg(ins, 1, "B")), MATMUL
    if op == "Gemm":
        a, b = _arg(ins, 0, "A"), _arg(ins, 1, "B")
        if len(a) != 2 or len(b) != 2:
            raise Uncounted("Gemm operands are not matrices")
        if attrs.get("transA"):
            a = a[::-1]
        if attrs.get("transB"):
            b = b[::-1]
        return mm(a, b), MATMUL
    if op in ("Conv", "ConvTranspose"):
        return conv(_arg(ins, 0, "X"), _arg(ins, 1, "W"), _arg(outs, 0, "Y"),
                    op == "ConvTranspose"), CONV
    if op == "Attention":   # opset 23: (batch, heads, seq, dim) inputs
        return sdpa(_arg(ins, 0, "Q"), _arg(ins, 1, "K"), _arg(ins, 2, "V")), ATTENTION
    raise Uncounted(f"no formula for {op}")


# -- aten ops (torch.export) -------------------------------------------------------------------------
_ATEN_ELEMENTWISE = frozenset("""
add sub rsub mul div pow sqrt rsqrt reciprocal exp log neg abs relu relu_ gelu silu silu_ sigmoid
tanh erf hardtanh hardswish hardsigmoid elu selu leaky_relu softplus mish sin cos floor ceil round
sign clamp clamp_min clamp_max maximum minimum where eq ne gt lt ge le logical_and logical_or
logical_not bitwise_and bitwise_or remainder fmod threshold add_ mul_ div_ sub_
""".split())
_ATEN_NONE = frozenset("""
view reshape _unsafe_view transpose permute t expand expand_as unsqueeze squeeze cat stack slice
select index_select getitem clone contiguous alias detach _to_copy to type_as split split_with_sizes
chunk flatten unflatten embedding dropout native_dropout zeros zeros_like ones ones_like full
full_like empty empty_like arange lift_fresh_copy _assert_tensor_metadata sym_size sym_numel
narrow unbind movedim repeat pad constant_pad_nd index gather scatter masked_fill copy_
_assert_async scalar_tensor new_zeros new_ones new_empty tril triu
""".split())


def aten_op(target: str) -> str:
    """``torch.ops.aten.linear.default`` -> ``linear`` (other namespaces keep theirs)."""
    parts = target.split(".")
    if len(parts) >= 4 and parts[0] == "torch" and parts[1] == "ops":
        return parts[3] if parts[2] == "aten" else ".".join(parts[2:4])
    return target.rsplit(".", 1)[-1] if target.startswith("_operator.") else target


def aten_flops(target: str, args: dict[str, Any], shape_of: Callable[[Any], Any],
               outs: Sequence) -> tuple[int, str]:
    """FLOPs of one torch.export node: ``args`` by schema name (values as serialized),
    ``shape_of(arg)`` the shape of a tensor argument (None where unknown)."""
    op = aten_op(target)
    if op.startswith("_operator.") or target.startswith("_operator."):
        raise Uncounted("Python scalar arithmetic")

    def t(name: str, what: str | None = None):
        return _static(shape_of(args.get(name)), what or name)

    if op in _ATEN_NONE:
        return 0, NONE
    if op in _ATEN_ELEMENTWISE:
        return prod(_arg(outs, 0, "output")), ELEMENTWISE
    if op == "linear":
        x, w = t("input"), t("weight")
        if not x or len(w) != 2 or x[-1] != w[1]:
            raise Uncounted("linear shapes do not match")
        return 2 * prod(x[:-1]) * w[1] * w[0], MATMUL
    if op in ("mm", "_scaled_mm"):
        return mm(t("self"), t("mat2")), MATMUL
    if op == "addmm":
        return mm(t("mat1"), t("mat2")), MATMUL
    if op in ("bmm", "baddbmm"):
        a, b = (t("self"), t("mat2")) if op == "bmm" else (t("batch1"), t("batch2"))
        if len(a) != 3 or len(b) != 3 or a[0] != b[0]:
            raise Uncounted("bmm shapes do not match")
        return a[0] * mm(a[1:], b[1:]), MATMUL
    if op == "matmul":
        return matmul(t("self"), t("other")), MATMUL
    if op in ("conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
              "conv_transpose2d", "conv_transpose3d"):
        transposed = op.startswith("conv_transpose") or bool(_scalar(args.get("transposed")))
        return conv(t("input"), t("weight"), _arg(outs, 0, "output"), transposed), CONV
    if op in ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu"):
        q, k, v = t("query"), t("key"), t("value")
        if args.get("enable_gqa") is not None and not _scalar(args.get("enable_gqa")) \
                and q[1:2] != k[1:2]:
            raise Uncounted("query and key heads differ without enable_gqa")
        return sdpa(q, k, v), ATTENTION
    raise Uncounted(f"no formula for {op}")


def _scalar(arg):
    """The Python value of a serialized scalar argument (``{"as_bool": true}``)."""
    if isinstance(arg, dict) and len(arg) == 1:
        return next(iter(arg.values()))
    return arg
