"""How is B related to A? A verdict per aligned tensor and one for the pair, each with its evidence.

`judge_all(entries, ma, mb, ...)` runs after the value comparison of `tensorscope.diffing` and
gives every `TensorDiff` a `Verdict` (``kind``, words, evidence, the tolerance ``rule`` it met);
`pair_verdict(entries)` sums them up in one sentence ("B is A cast to bfloat16", "B is A plus a
rank-8 update on self_attn.q_proj and self_attn.v_proj of all 2 layers (18.5% of parameters
changed)").

Per tensor, in this order (the first that holds wins; the statistics are those of the value pass,
`ValueDiff`):

- ``identical``: equal stored bytes, or equal values in one dtype (-0.0 against 0.0).
- ``same_values``: other dtype, every value equal (a float16 model saved as float32).
- ``quantized``: one side is block-quantized (GGUF ``q8_0``, ``q4_k`` ...) or torch-quantized
  (``qint8`` per tensor or per channel) and, at every element, |A − dequant(B)| is at most one
  quantization step of its block or channel (``d`` of a ``q8_0`` block, ``d·scale`` of a K-quant
  sub-block, the channel's ``scale``), plus `STEP_SLACK` for the rounding of float16 scales,
  plus, for K-quants, what rounding the sub-block scales and mins to their 6-bit (4-bit, int8)
  grid moves the range's edge by (levels·d/2 + dmin/2); at most `QUANT_OUTLIERS` of the values
  may exceed that bound (a quantizer's search may clip), none by twice it. The largest error, in
  steps, is the evidence. Rounding to the nearest level costs half a step; a whole step is
  reached only at the clamped edge of an asymmetric grid (``q4_0`` maps the block's largest
  magnitude to -8·d, so the other side stops at +7·d).
- ``cast``: other float dtype and B equals A rounded to B's dtype exactly: round-to-nearest-even
  (numpy's and ml_dtypes' casts, torch's ``.to()``), or, for float32 -> bfloat16, truncation
  (the upper 16 bits). One extra pass over A and B, only for pairs whose relative change is
  within B's rounding unit.
- ``within_tolerance`` ("same within tolerance"): values differ but every one is within
  atol + rtol·|b| (torch.isclose) and B is neither a quantization nor a cast of A (checked
  first); the relations below are not looked for.
- ``pruned``: B equals A wherever B is non-zero (``max_rel`` = 0 exactly) and B has new zeros
  (``zero_ref`` > 0); one extra pass over B counts its zeros: the new sparsity.
- ``scaled``: B = c·A up to B's rounding (‖B − cA‖² = ‖B‖²(1 − cos²), from the pass's sums).
- ``reinitialised``: cosine ≈ 0 (|cos| below 0.1, or 4/√n for small tensors) and B's RMS is that
  of a fresh initialisation (torch's default ``kaiming_uniform(a=√5)`` of a Linear or conv,
  normal(0, 0.02), normal(0, 1) of an embedding, Xavier), within 15%.
- ``unrelated``: cosine ≈ 0, B's RMS not that of a fresh init.
- ``low_rank``: ΔW = B − A (a matrix, or a conv kernel as out × in·kh·kw) has numerical rank r
  at most a quarter of min(shape) (`tensorscope.lowrank`: a random submatrix first, then one
  single-pass sketch of ΔW for r and the share of ‖ΔW‖²_F it explains, kept when >= 90%).
- ``changed``: anything else that differs (a fine-tune): relative change and cosine as evidence;
  a tensor where at most 1% of the values changed is "changed at N of M values" (an edit) and is
  not tested for rank.
- ``added``, ``removed``, ``renamed`` (same values under a new name), ``reshaped``,
  ``not_compared`` (values not read, or not comparable).

The pair's ``kind``: ``identical``, ``same_values``, ``renamed`` (nothing changed but names),
one tensor kind when all changed tensors share it (``cast``, ``quantized``, ``pruned``,
``low_rank``, ``scaled``, ``reinitialised``...), ``fine_tune`` (all ``changed``), ``unrelated``
(half the parameters or more re-initialised or unrelated, and under a fifth of the matrices
keeping a relation to A's), ``different`` (half the parameters or
more only on one side or reshaped), ``structural`` (only added/removed/reshaped tensors), else
``mixed``; the text names the modules and layers of each kind.

The ``rule`` says which test the tensor's values met: ``"identical"`` (bytes), ``"equal"``
(values), ``"tolerance"`` (|a-b| <= atol + rtol*|b| everywhere), ``"differs"``, or
``"structural"`` (added, removed, renamed, shapes differ). With a tolerance given by the caller
(``tolerance_given``), a pair whose values are within tolerance does not count as a difference
for the exit code, whatever its dtypes (``Verdict.differs``).

Cost: the statistics of the value pass decide most verdicts; an extra pass is made only over a
changed pair that needs one (a cast or quantization candidate, a pruned B, a low-rank
candidate), and a fine-tune's full-rank pairs are rejected by the submatrix sample, which reads a
few pages of each.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from . import dtypes, lowrank
from .lazyimport import lazy_module
from .reader import PageReleaser, iter_flat_chunks

np = lazy_module("numpy")   # imported by the first value that goes through numpy

__all__ = ["Verdict", "PairVerdict", "judge", "judge_all", "rank_candidate", "pair_verdict",
           "aligned_pieces", "KINDS", "UNCHANGED_KINDS", "quant_steps", "STEP_TYPES"]

KINDS = ("identical", "same_values", "quantized", "cast", "pruned", "scaled", "reinitialised",
         "unrelated", "low_rank", "changed", "within_tolerance", "added", "removed", "renamed",
         "reshaped", "not_compared")
# no value changed (within tolerance: by less than the tolerance, which says "the same")
UNCHANGED_KINDS = frozenset({"identical", "same_values", "renamed", "within_tolerance"})

COS_ZERO = 0.1          # |cosine| below this (or 4/sqrt(n) for small tensors) is "about 0"
INIT_MATCH = 0.15       # B's RMS within 15% of a fresh init's
LOW_RANK_SHARE = 0.9    # the share of ‖ΔW‖² that rank r must explain
MIN_RANK_DIM = 16       # smaller matrices are not tested for rank
PIECE = 1 << 16         # elements per step of the extra passes
SPARSE_EDIT = 0.01      # at most this share of values outside tolerance: an edit, not an update
QUANT_OUTLIERS = 1e-3    # values beyond the bound (within twice it) a quantizer's search may leave
STEP_SLACK = 1 / 16     # beyond one step: the rounding of float16 block scales (q·d rounds with d)


@dataclass(slots=True)
class Verdict:
    """How one tensor of B relates to A's (module docstring)."""

    kind: str
    text: str
    rule: str
    differs: bool
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "rule": self.rule, "differs": self.differs,
                "evidence": {k: _jsonable(v) for k, v in self.evidence.items()}}


def _jsonable(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


# ------------------------------------------------------------------------------------------------
# Pieces
# ------------------------------------------------------------------------------------------------

def aligned_pieces(it_a: Iterator[np.ndarray], it_b: Iterator[np.ndarray]):
    """Pair up two streams of 1-D pieces holding the same number of elements, piece sizes aside."""
    pa = pb = None
    ia = ib = 0
    while True:
        while pa is None or ia >= len(pa):
            pa = next(it_a, None)
            ia = 0
            if pa is None:
                return
        while pb is None or ib >= len(pb):
            pb = next(it_b, None)
            ib = 0
            if pb is None:
                return
        n = min(len(pa) - ia, len(pb) - ib)
        yield pa[ia:ia + n], pb[ib:ib + n]
        ia += n
        ib += n


def _released(pieces, rel: PageReleaser, file: str):
    for p in pieces:
        yield p
        rel.release_piece(file, p)


def _plain_float(t) -> bool:
    s = dtypes.spec(t.dtype)
    return s.kind == "float" and not s.packed and s.numpy_name is not None


def _quantized(t) -> bool:
    """Stored as codes that `dequant` turns into values of ``t``'s own shape."""
    s = dtypes.spec(t.dtype)
    if not (s.kind in ("block", "quantized") or s.packed):
        return False
    from . import dequant
    if not dequant.is_decoded(t.dtype) or dequant.decoded_shape(t) != t.shape:
        return False
    if s.kind == "block":
        return t.dtype in STEP_TYPES and t.dtype in dequant.DECODABLE_BLOCK_TYPES
    return s.kind == "quantized" and not s.packed


# ------------------------------------------------------------------------------------------------
# Quantization steps
# ------------------------------------------------------------------------------------------------

def _f16(b: np.ndarray, off: int) -> np.ndarray:
    return np.ascontiguousarray(b[:, off:off + 2]).view(np.float16).astype(np.float64).reshape(-1)


def _k4_scales(packed: np.ndarray) -> np.ndarray:
    """ggml's get_scale_min_k4: the 8 six-bit scales of a q4_k/q5_k super-block."""
    d, md = packed[:, 0:4], packed[:, 8:12]
    return np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1).astype(np.float64)


def _k(levels: int, d_off: int, sub: int, scales, min_off: int | None = None):
    """A K-quant's (steps, allowance) per sub-block: the step is d·scale; the allowance is what
    rounding the sub-block scales and mins to their integer grid can move the top level by
    (levels·d/2 + dmin/2): a value clamped at the range's edge is off by at most that."""
    def fn(b):
        d = _f16(b, d_off)
        sc = scales(b)
        steps = (d[:, None] * sc).reshape(-1)
        dmin = _f16(b, min_off) if min_off is not None else 0.0
        allow = np.abs(levels * d / 2 + np.abs(dmin) / 2)
        return steps, np.repeat(allow, sc.shape[1])
    return sub, fn


def _plain(sub: int, fn):
    return sub, lambda b: (fn(b), None)


# block type -> (values per sub-block, block bytes [nblocks, bytes] -> (step per sub-block,
# allowance per sub-block or None))
STEP_TYPES = {
    "q8_0": _plain(32, lambda b: _f16(b, 0)),
    "q4_0": _plain(32, lambda b: _f16(b, 0)),
    "q4_1": _plain(32, lambda b: _f16(b, 0)),
    "q5_0": _plain(32, lambda b: _f16(b, 0)),
    "q5_1": _plain(32, lambda b: _f16(b, 0)),
    "q8_k": _plain(256, lambda b: np.ascontiguousarray(b[:, 0:4]).view(np.float32)
                   .astype(np.float64).reshape(-1)),
    "q4_k": _k(15, 0, 32, lambda b: _k4_scales(b[:, 4:16]), 2),
    "q5_k": _k(31, 0, 32, lambda b: _k4_scales(b[:, 4:16]), 2),
    "q6_k": _k(32, 208, 16, lambda b: b[:, 192:208].view(np.int8).astype(np.float64)),
    "q2_k": _k(3, 80, 16, lambda b: (b[:, 0:16] & 0x0F).astype(np.float64), 82),
}


def quant_steps(model, info) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(steps, allowance, run): the quantization step of every run of ``run`` consecutive values
    of ``info`` (C order) and what else may move a value (None: nothing): a block type's
    sub-block steps, a torch tensor's per-tensor scale (run = numel) or per-channel scales (run =
    the elements of one channel's slice, repeated over the outer dimensions)."""
    s = dtypes.spec(info.dtype)
    if s.kind == "block":
        sub, fn = STEP_TYPES[info.dtype]
        raw = model.read(info)
        steps, allow = fn(raw.reshape(-1, s.block_bytes))
        return np.abs(steps), allow, sub
    scheme = str(info.extras.get("qscheme", ""))
    if scheme.startswith("per_tensor"):
        return np.array([abs(float(info.extras["scale"]))]), None, max(1, info.numel)
    from .dequant import _qparam   # the bounds-checked reader of per-channel parameter storages
    scales = np.abs(_qparam(model, info, "scales").astype(np.float64))
    axis = int(info.extras.get("axis"))
    inner = math.prod(info.shape[axis + 1:])
    outer = math.prod(info.shape[:axis])
    return np.tile(scales, outer), None, max(1, inner)


def _quant_check(mf, tf, mq, tq) -> dict | None:
    """Largest |F − dequant(Q)| in steps of Q's scheme, streaming; None when it cannot be told."""
    from . import dequant
    try:
        steps, allow, run = quant_steps(mq, tq)
    except Exception:   # noqa: BLE001 - parameters we cannot read: no verdict, the diff stands
        return None
    rel_f, rel_q = PageReleaser(mf), PageReleaser(mq)
    worst = 0.0
    over = far = 0
    pos = 0
    try:
        dec = dequant.iter_decoded(mq, tq, PIECE, release=rel_q.release_range)
        vf = _released(iter_flat_chunks(mf.read(tf), PIECE * max(1, tf.nbytes // max(tf.numel, 1))),
                       rel_f, tf.file)
        with np.errstate(all="ignore"):
            for pf, pq in aligned_pieces(vf, dec):
                n = pf.size
                idx = np.arange(pos, pos + n) // run
                st = steps[idx]
                bound = st * (1.0 + STEP_SLACK)
                if allow is not None:
                    bound += allow[idx]
                err = np.abs(pf.astype(np.float64) - pq.astype(np.float64))
                # a step of 0 (an all-zero block): the value must be 0 too; tiny slack for the
                # float32 arithmetic of the decoders
                ratio = err / np.maximum(st, 1e-30)
                m = float(np.max(ratio)) if n else 0.0
                if not math.isfinite(m):
                    return None
                worst = max(worst, m)
                out = err > bound
                over += int(np.count_nonzero(out))
                far += int(np.count_nonzero(err > 2 * bound))
                pos += n
    finally:
        rel_f.release_tensor(tf)
        rel_q.release_tensor(tq)
    scheme = tq.dtype
    q = str(tq.extras.get("qscheme", ""))
    if q:
        scheme = f"{tq.dtype} {q.replace('_', '-')}"
    return {"scheme": scheme, "max_error_steps": worst, "outside_step": over,
            "outside_twice": far, "numel": tq.numel,
            "step_min": float(steps.min()) if steps.size else 0.0,
            "step_max": float(steps.max()) if steps.size else 0.0}


# ------------------------------------------------------------------------------------------------
# Casts, zeros
# ------------------------------------------------------------------------------------------------

def _cast_check(ma, ta, mb, tb) -> dict:
    """Positions where B differs from A rounded to B's dtype by round-to-nearest-even, and (for
    float32 -> bfloat16) by truncation; NaN equals NaN whatever its payload."""
    va, vb = ma.read(ta), mb.read(tb)
    ub = np.dtype(f"u{vb.dtype.itemsize}")   # B's bits as unsigned integers
    trunc = ta.dtype == "float32" and tb.dtype == "bfloat16"
    rne = cut = 0
    rel_a, rel_b = PageReleaser(ma), PageReleaser(mb)
    try:
        with np.errstate(all="ignore"):
            for pa, pb in aligned_pieces(
                    _released(iter_flat_chunks(va, PIECE * va.itemsize), rel_a, ta.file),
                    _released(iter_flat_chunks(vb, PIECE * vb.itemsize), rel_b, tb.file)):
                bits = pb.view(ub)
                nan_b = np.isnan(pb)
                both_nan = nan_b & np.isnan(pa)
                rne += int(np.count_nonzero((pa.astype(vb.dtype).view(ub) != bits) & ~both_nan))
                if trunc:
                    t = (np.ascontiguousarray(pa).view(np.uint32) >> 16).astype(np.uint16)
                    cut += int(np.count_nonzero((t != bits) & ~both_nan))
                if rne and (cut or not trunc):
                    break
    finally:
        rel_a.release_tensor(ta)
        rel_b.release_tensor(tb)
    return {"rne_mismatch": rne, "truncation_mismatch": cut if trunc else None}


def _zeros(model, t) -> int:
    rel = PageReleaser(model)
    n = 0
    try:
        v = model.read(t)
        for p in _released(iter_flat_chunks(v, PIECE * v.itemsize), rel, t.file):
            n += p.size - int(np.count_nonzero(p))
    finally:
        rel.release_tensor(t)
    return n


# ------------------------------------------------------------------------------------------------
# Fresh initialisations
# ------------------------------------------------------------------------------------------------

def _init_scales(shape: tuple[int, ...]) -> dict[str, float]:
    """The RMS of the common fresh initialisations of a tensor of this shape."""
    out = {"normal(0, 0.02)": 0.02, "normal(0, 1)": 1.0}
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        fan_out = shape[0] * math.prod(shape[2:])
        if fan_in:
            out["kaiming_uniform(a=sqrt(5)) (torch's default)"] = 1 / math.sqrt(3 * fan_in)
        if fan_in + fan_out:
            out["xavier"] = math.sqrt(2 / (fan_in + fan_out))
    return out


def _fresh_init(shape, rms: float) -> str | None:
    best = None
    for name, s in _init_scales(shape).items():
        off = abs(rms / s - 1)
        if off <= INIT_MATCH and (best is None or off < best[0]):
            best = (off, name)
    return None if best is None else best[1]


# ------------------------------------------------------------------------------------------------
# Per tensor
# ------------------------------------------------------------------------------------------------

_IDENTICAL = Verdict("identical", "identical", "identical", False)


def _g(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _pct(x: float) -> str:
    p = 100 * x
    if p == 0 or p >= 1:
        return f"{p:.1f}%"
    return f"{p:.2g}%"


def _rule(e, v) -> str:
    if v is None:
        return "structural" if e.status != "same" else "not_compared"
    if v.identical_bytes:
        return "identical"
    if v.mismatched is None:
        return "differs"
    if v.mismatched == 0 and v.max_abs == 0.0 and not (v.nan_mismatch or v.inf_mismatch):
        return "equal"
    return "tolerance" if v.mismatched == 0 else "differs"


def judge(e, ma, mb, *, tolerance_given: bool = False) -> Verdict:
    """The verdict of one `TensorDiff` (module docstring)."""
    st = e.status
    v = e.values
    if st == "same" and v is not None and v.identical_bytes and not e.changes:
        return _IDENTICAL
    if st in ("added", "removed"):
        t = e.b if st == "added" else e.a
        return Verdict(st, f"only in {'B' if st == 'added' else 'A'}", "structural", True,
                       {"numel": t.numel})
    if st == "renamed":
        return Verdict("renamed", f"same values, renamed to {e.name_b}", "structural", True)
    rule = _rule(e, v)
    differs = st != "same"
    if differs and tolerance_given and rule in ("identical", "equal", "tolerance") \
            and e.a is not None and e.b is not None and e.a.shape == e.b.shape:
        differs = False   # within the tolerance asked for, whatever the dtypes
    ta, tb = e.a, e.b
    if v is None:
        if ta is not None and tb is not None and ta.shape != tb.shape:
            return Verdict("reshaped", f"shape {list(ta.shape)} -> {list(tb.shape)}",
                           "structural", True)
        return Verdict("not_compared", "values not compared", rule, differs)
    if rule in ("identical", "equal"):
        if ta.dtype == tb.dtype:
            return Verdict("identical", "identical" if rule == "identical" else "equal values",
                           rule, differs)
        return Verdict("same_values", f"same values as {tb.dtype} (exact)", rule, differs,
                       {"dtype_a": ta.dtype, "dtype_b": tb.dtype})
    ev: dict[str, Any] = {"rel_change": v.rel_change, "cosine": v.cosine, "max_abs": v.max_abs}

    def verdict(kind, text, **more):
        ev.update(more)
        return Verdict(kind, text, rule, differs, ev)

    # quantized: one side stored as codes of a known scheme, the other as plain floats
    for mf, tf, mq, tq, side in ((ma, ta, mb, tb, "B"), (mb, tb, ma, ta, "A")):
        if _quantized(tq) and _plain_float(tf):
            q = _quant_check(mf, tf, mq, tq)
            if q is not None and q["outside_twice"] == 0 \
                    and q["outside_step"] <= QUANT_OUTLIERS * q["numel"]:
                what = (f"A quantized to {q['scheme']}" if side == "B"
                        else f"B is A dequantized from {q['scheme']}")
                return verdict("quantized", f"{what}: every value within "
                               f"{_g(q['max_error_steps'], 2)} of a step", quant=q,
                               quantized_side=side)
            if q is not None:
                ev["quant"] = q
            break
    fa, fb = _plain_float(ta), _plain_float(tb)
    unit = max(lowrank.rounding_unit(ta.dtype), lowrank.rounding_unit(tb.dtype))
    if ta.dtype != tb.dtype and fa and fb and v.rel_change is not None \
            and v.rel_change <= 2 * lowrank.rounding_unit(tb.dtype):
        c = _cast_check(ma, ta, mb, tb)
        if c["rne_mismatch"] == 0:
            return verdict("cast", f"A rounded to {tb.dtype} (round-to-nearest-even)",
                           rounding="round-to-nearest-even", dtype=tb.dtype, **c)
        if c["truncation_mismatch"] == 0:
            return verdict("cast", f"A truncated to {tb.dtype} (round toward zero)",
                           rounding="truncation", dtype=tb.dtype, **c)
        ev.update(c)
    if rule == "tolerance":   # every value within atol + rtol·|b|: no other relation is claimed
        return verdict("within_tolerance", "same within tolerance")
    numeric = v.norm_a is not None and v.norm_b is not None
    sb = dtypes.spec(tb.dtype)
    plain_b = sb.kind in ("float", "int", "uint", "bool") and not sb.packed and sb.numpy_name is not None
    if numeric and plain_b and v.zero_ref > 0 and (
            v.max_rel == 0.0 or (v.max_rel is None and v.norm_b == 0)):
        zeros = _zeros(mb, tb)
        n = max(tb.numel, 1)
        return verdict("pruned", f"pruned: {_pct(v.zero_ref / n)} of A's values set to 0 "
                       f"(sparsity {_pct(zeros / n)})", new_zeros=v.zero_ref,
                       sparsity=zeros / n, sparsity_a=(zeros - v.zero_ref) / n)
    cos = v.cosine
    if numeric and cos is not None and v.norm_a:
        c = cos * v.norm_b / v.norm_a
        resid = math.sqrt(max(0.0, 1 - cos * cos))   # ‖B − cA‖ / ‖B‖
        if resid <= 4 * max(unit, 2.0 ** -52) and abs(c - 1) > 4 * max(unit, 2.0 ** -52):
            return verdict("scaled", f"A scaled by {c:.6g}", scale=c, residual=resid)
        n = max(tb.numel, 1)
        if abs(cos) < min(0.5, max(COS_ZERO, 4 / math.sqrt(n))):
            rms = v.norm_b / math.sqrt(n)
            init = _fresh_init(tb.shape, rms)
            if init is not None:
                return verdict("reinitialised", f"re-initialised (cosine {cos:.2g}; RMS {rms:.3g}"
                               f" as {init})", rms_b=rms, init=init)
            return verdict("unrelated", f"unrelated values (cosine {cos:.2g})", rms_b=rms)
    sparse = v.mismatched is not None and 0 < v.mismatched <= SPARSE_EDIT * tb.numel
    if sparse:   # a few edited values: that they are few is the news, not their low rank
        return verdict("changed", f"changed at {v.mismatched:,} of {tb.numel:,} values",
                       edited=v.mismatched)
    if numeric and rank_candidate(ta, tb):
        est = _low_rank(ma, ta, mb, tb, lowrank.rounding_unit(tb.dtype), v.norm_diff ** 2,
                        e.sample)
        if est is not None:
            ev["rank"] = est.to_dict()
            if est.stage == "sketch" and est.explained >= LOW_RANK_SHARE:
                return verdict("low_rank", f"low-rank update: rank {est.rank} explains "
                               f"{_pct(est.explained)} of ‖B−A‖²")
    if cos is None:
        return verdict("changed", "changed")
    return verdict("changed", f"changed (‖B−A‖/‖A‖ {_g(v.rel_change)}, cosine {cos:.4g})")


def rank_candidate(ta, tb) -> bool:
    """A pair the rank test applies to: plain floats of one shape, a matrix of both dimensions
    at least `MIN_RANK_DIM` (a conv kernel as out x in·kh·kw)."""
    return (ta.shape == tb.shape and len(ta.shape) >= 2 and _plain_float(ta) and _plain_float(tb)
            and min(ta.shape[0], math.prod(ta.shape[1:])) >= MIN_RANK_DIM)


def _low_rank(ma, ta, mb, tb, unit: float, total: float,
              sample=None) -> lowrank.RankEstimate | None:
    if sample is not None:   # gathered by the value pass: no view, no page, until a sketch
        s = lowrank.rank_of_sample(ta.shape, unit, sample)
        if s.rank == 0 or s.rank > lowrank.max_rank(ta.shape) or s.explained < LOW_RANK_SHARE:
            return s
    va, vb = ma.read(ta), mb.read(tb)
    rel_a, rel_b = PageReleaser(ma), PageReleaser(mb)
    try:
        if sample is None:
            s = lowrank.sample_rank(va, vb, unit)
            if s.rank == 0 or s.rank > lowrank.max_rank(ta.shape):
                return s
            if s.explained < LOW_RANK_SHARE:
                return s

        def release(side, piece):
            (rel_a if side == "a" else rel_b).release_piece(ta.file if side == "a" else tb.file,
                                                              piece)
        return lowrank.sketch_rank(va, vb, s.rank, total, release=release)
    finally:
        rel_a.release_tensor(ta)
        rel_b.release_tensor(tb)


def judge_all(entries: Sequence, ma, mb, *, tolerance_given: bool = False) -> None:
    """Set ``e.verdict`` on every entry that has none yet (the diff's lanes judge the large
    pairs as they compare them)."""
    for e in entries:
        if e.verdict is None:
            e.verdict = judge(e, ma, mb, tolerance_given=tolerance_given)


# ------------------------------------------------------------------------------------------------
# The pair
# ------------------------------------------------------------------------------------------------

@dataclass
class PairVerdict:
    """The one-sentence answer for the pair, with its figures."""

    kind: str
    text: str
    params: int = 0
    params_changed: int = 0
    kinds: dict = field(default_factory=dict)      # verdict kind -> tensors
    evidence: dict = field(default_factory=dict)

    @property
    def share_changed(self) -> float:
        return self.params_changed / self.params if self.params else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "params": self.params,
                "params_changed": self.params_changed, "share_changed": self.share_changed,
                "kinds": dict(self.kinds),
                "evidence": {k: _jsonable(x) for k, x in self.evidence.items()}}


def numel_of(e) -> int:
    t = e.b if e.b is not None else e.a
    return t.numel if t is not None else 0


def value_changed(e) -> bool:
    """The values of this entry changed (a verdict other than identical / same values)."""
    vd = getattr(e, "verdict", None)
    if vd is None:
        return e.status != "same"
    return vd.kind not in UNCHANGED_KINDS


def _where(entries) -> str:
    """``self_attn.q_proj and self_attn.v_proj of all 32 layers`` / ``lm_head``."""
    from . import grouping
    mods: dict[str, set] = {}
    for e in entries:
        info = e.a if e.a is not None else e.b
        path = info.path if info is not None and len(info.path) > 1 else ()
        mk = grouping.module_key(e.name, path)
        lk = grouping.layer_key(e.name, path)
        if mk == grouping.components(e.name, path)[-1]:   # a parameter of the indexed module
            mk = lk                                       # itself (``4.weight``): name it
        mods.setdefault(mk, set()).add(lk if lk != mk else None)
    names = list(mods)
    text = _and([n for n in names[:6]]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    layers = set().union(*mods.values()) - {None} if mods else set()
    if layers:
        return text, layers
    return text, set()


def _and(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def pair_verdict(entries: Sequence, *, values_compared: bool = True,
                 formats: tuple[str, str] = ("", "")) -> PairVerdict:
    """One sentence for the pair (module docstring), from the entries' verdicts."""
    from . import grouping
    kinds: dict[str, int] = {}
    params = changed = 0
    by_kind: dict[str, list] = {}
    all_layers: set = set()
    for e in entries:
        vd = getattr(e, "verdict", None)
        k = vd.kind if vd is not None else ("identical" if e.status == "same" else "changed")
        kinds[k] = kinds.get(k, 0) + 1
        n = numel_of(e)
        params += n
        info = e.a if e.a is not None else e.b
        lk = grouping.layer_key(e.name, info.path if info is not None and len(info.path) > 1
                                else ())
        if lk != grouping.module_key(e.name, info.path if info is not None and
                                     len(info.path) > 1 else ()):
            all_layers.add(lk)
        if k not in UNCHANGED_KINDS:
            changed += n
            by_kind.setdefault(k, []).append(e)
    pv = PairVerdict("identical", "", params, changed, kinds)
    share = f"{_pct(changed / params) if params else '0%'} of parameters changed"
    if not values_compared:
        pv.kind, pv.text = "not_compared", "values not compared"
        return pv
    structural = {k: by_kind.pop(k) for k in ("added", "removed", "reshaped") if k in by_kind}
    moved = sum(numel_of(e) for es in structural.values() for e in es)
    if params and moved > 0.5 * params:
        pv.kind = "different"
        pv.text = "B and A are different models: " + ", ".join(
            f"{len(es):,} tensor{'s' if len(es) != 1 else ''} {k}"
            for k, es in structural.items()) \
            + f" ({_pct(moved / params)} of parameters)"
        return pv
    renamed = kinds.get("renamed", 0)
    if not by_kind and not structural:
        same_values = kinds.get("same_values", 0)
        within = kinds.get("within_tolerance", 0)
        if within:
            pv.kind = "within_tolerance"
            pv.text = (f"B is A within tolerance: {within:,} tensor{'s' if within != 1 else ''} "
                       f"differ{'s' if within == 1 else ''} by less than atol + rtol·|b|")
        elif same_values:
            dts = sorted({e.b.dtype for e in entries
                          if getattr(e, "verdict", None) is not None
                          and e.verdict.kind == "same_values"})
            pv.kind, pv.text = "same_values", f"B holds A's values exactly, stored as {_and(dts)}"
        elif renamed:
            pv.kind, pv.text = "renamed", f"B is A with {renamed:,} tensor" \
                f"{'s' if renamed != 1 else ''} renamed (same values)"
        else:
            pv.kind, pv.text = "identical", "B is A: every tensor has the same values"
        if formats[0] and formats[1] and formats[0] != formats[1]:
            pv.text += f", re-saved as {formats[1]}"
        return pv
    # a bias beside a re-initialised weight went with it (a 1-D init has no fan-in to recognise)
    fresh = {e.name.rsplit(".", 1)[0] for e in by_kind.get("reinitialised", [])}
    if fresh and by_kind.get("unrelated"):
        moved_too = [e for e in by_kind["unrelated"] if e.name.rsplit(".", 1)[0] in fresh]
        by_kind["unrelated"] = [e for e in by_kind["unrelated"] if e not in moved_too]
        by_kind["reinitialised"].extend(moved_too)
        if not by_kind["unrelated"]:
            del by_kind["unrelated"]
    unrelated = sum(numel_of(e) for k in ("reinitialised", "unrelated") for e in by_kind.get(k, []))
    # Matrices that keep A's values (or a relation to them) say B comes from A, however much
    # was re-initialised; 1-D tensors do not (two fresh inits share their LayerNorm ones).
    matrices = related = 0
    for e in entries:
        t = e.b if e.b is not None else e.a
        if t is None or len(t.shape) < 2:
            continue
        matrices += 1   # counted as tensors: a big head re-initialised is still one module
        vd = getattr(e, "verdict", None)
        if vd is not None and vd.kind not in ("reinitialised", "unrelated", "added", "removed",
                                              "reshaped", "not_compared") \
                and not (e.values is not None and e.values.norm_a == 0):
            related += 1
    if params and unrelated >= 0.5 * params and related < 0.2 * max(matrices, 1):
        pv.kind = "unrelated"
        same_arch = not structural
        pv.text = ("B and A are unrelated models of the same architecture" if same_arch else
                   "B and A are unrelated models")
        pv.text += f" ({_pct(unrelated / params)} of parameters uncorrelated, cosine ≈ 0)"
        return pv
    parts: list[str] = []
    notes: list[str] = []   # after the share of parameters changed
    order = ("cast", "quantized", "low_rank", "pruned", "scaled", "reinitialised", "unrelated",
             "changed", "within_tolerance", "not_compared")
    for k in order:
        es = by_kind.get(k)
        if not es:
            continue
        where, layers = _where(es)
        of_layers = ""
        if layers:
            of_layers = (f" of all {len(layers)} layers" if len(layers) == len(all_layers)
                         else f" of {len(layers)} of {len(all_layers)} layers")
        if k == "cast":
            dts = sorted({e.verdict.evidence.get("dtype") for e in es})
            rounding = sorted({e.verdict.evidence.get("rounding") for e in es})
            parts.append(f"cast to {_and(dts)} ({_and(rounding)})")
        elif k == "quantized":
            schemes = sorted({e.verdict.evidence["quant"]["scheme"] for e in es})
            side = es[0].verdict.evidence.get("quantized_side", "B")
            parts.append(("quantized to " if side == "B" else "dequantized from ")
                         + _and(schemes))
        elif k == "low_rank":
            ranks = sorted({e.verdict.evidence["rank"]["rank"] for e in es})
            r = f"rank-{ranks[0]}" if len(ranks) == 1 else f"rank-{ranks[0]}..{ranks[-1]}"
            # the factors' size, r·(m + n) per matrix: what an adapter of this rank holds
            factors = sum(e.verdict.evidence["rank"]["rank"] * (e.b.shape[0] + e.b.numel
                                                                 // max(e.b.shape[0], 1))
                          for e in es)
            parts.append(f"plus a {r} update on {where}{of_layers}")
            if params:
                notes.append(f"its factors hold {factors:,} parameters, {_pct(factors / params)}")
            pv.evidence["ranks"] = ranks
            pv.evidence["factor_params"] = factors
        elif k == "pruned":
            sp = [e.verdict.evidence["sparsity"] for e in es]
            parts.append(f"pruned on {where}{of_layers} (sparsity {_pct(min(sp))}"
                         + (f"–{_pct(max(sp))}" if max(sp) - min(sp) > 1e-3 else "") + ")")
        elif k == "scaled":
            parts.append(f"with {where} scaled")
        elif k == "reinitialised":
            parts.append(f"with a re-initialised {where}{of_layers}")
        elif k == "unrelated":
            parts.append(f"with unrelated values in {where}{of_layers}")
        elif k == "changed":
            parts.append(f"changed in {where}{of_layers}"
                         if len(es) < 0.5 * len(entries) else "fine-tuned")
        elif k == "within_tolerance":
            parts.append(f"within tolerance on {where}{of_layers}")
        elif k == "not_compared":
            parts.append(f"{len(es)} tensors not compared")
    extra = ", ".join(f"{len(es):,} tensor{'s' if len(es) != 1 else ''} {k}"
                      for k, es in structural.items())
    main = [k for k in order if k in by_kind]
    if not main:
        pv.kind = "structural"
    elif len(main) == 1:
        pv.kind = "fine_tune" if main == ["changed"] else main[0]
    else:
        pv.kind = "mixed"
    sq_a = sum(e.values.norm_a ** 2 for e in entries if e.values is not None
               and e.values.norm_a is not None and e.values.norm_diff is not None)
    sq_d = sum(e.values.norm_diff ** 2 for e in entries if e.values is not None
               and e.values.norm_a is not None and e.values.norm_diff is not None)
    if sq_a > 0:
        pv.evidence["rel_change"] = math.sqrt(sq_d / sq_a)
    if len(main) == 1 and main[0] == "changed" and not structural:
        pv.kind = "fine_tune"
        rel = f"; ‖B−A‖/‖A‖ {math.sqrt(sq_d / sq_a):.3g}" if sq_a > 0 else ""
        pv.text = (f"B is a fine-tune of A ({share}{rel})" if parts[0] == "fine-tuned"
                   else f"B is A {parts[0]} ({share}{rel})")
        return pv
    share = "; ".join([share] + notes)
    if parts:
        pv.text = "B is A " + _join(parts) + (f"; {extra}" if extra else "") + f" ({share})"
    else:
        pv.text = f"B is A with {extra} ({share})"
    if renamed:
        pv.text += f"; {renamed:,} tensor{'s' if renamed != 1 else ''} renamed"
    return pv


def _join(parts: list[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + ", and " + parts[-1]
