"""What `tensorscope.diffing.diff_models` returns: one record per aligned pair, the result, the
JSON document, and the views over it (per group, ranked, the reason a pair is listed).

JSON schema (``DiffResult.to_dict()``; keys sorted by the CLI; non-finite floats as the strings
``"inf"``, ``"-inf"``, ``"nan"``). ``tensorscope.diff/3`` (from /2: ``verdict`` per entry and for the pair,
``tolerance_given``, ``params``/``params_changed`` per group; from /1: ``max_rel`` leaves out zeros
of B, counted in ``zero_ref``; norms and ``rel_change``; ``per_save``; ``by``/``groups``)::

    {
      "schema": "tensorscope.diff/3",
      "a_path": str, "b_path": str, "a_format": str, "b_format": str,
      "prefix_a": str, "prefix_b": str,          # detected wrapper prefixes ("" when none)
      "strip_prefix": [str], "maps": [[OLD, NEW]],
      "atol": float, "rtol": float, "values_compared": bool,
      "identical": bool, "exit_code": 0 | 1,
      "counts": {"same": int, "changed": int, "added": int, "removed": int, "renamed": int},
      "metadata": [{"key": str, "a": any | null, "b": any | null,   # null: key absent on that side
                    "per_save": bool}],          # differs between any two saves (-v shows it)
      "by": "layer" | "module",                  # CLI --by only
      "groups": [{"key": str, "tensors": int, "changed": int, "compared": int, "unknown": int,
                  "norm_a": float, "norm_diff": float, "rel_change": float | null,
                  "params": int, "params_changed": int, "share_changed": float}],  # ranked
      "tolerance_given": bool,                   # atol/rtol chosen: within them is not a difference
      "verdict": null | {"kind": str, "text": str, "params": int, "params_changed": int,
                         "share_changed": float, "kinds": {kind: int}, "evidence": {...}},
      "entries": [{                                # the CLI's --only-changed/--limit/--top filter
                                                   # these (ranked); "counts" covers every tensor
        "status": "same" | "changed" | "added" | "removed" | "renamed",
        "name": str,                               # name_a, or name_b for added tensors
        "name_a": str | null, "name_b": str | null,
        "a": {"dtype": str, "shape": [int], "stride": [int], "nbytes": int} | null,
        "b": {...same...} | null,
        "changes": [str],                          # "dtype float32 -> bfloat16", "shape [2, 3] -> [3, 2]",
                                                   # "stride [3, 1] -> [1, 2]", "values", "name x -> y"
        "values": null | {
          "numel": int, "identical_bytes": bool, "compared_as": "bytes" | "float64" | "complex128",
          "max_abs": float | null, "max_rel": float | null, "zero_ref": int,
          "mean_abs": float | null, "rms": float | null, "cosine": float | null,
          "norm_a": float | null, "norm_b": float | null, "norm_diff": float | null,
          "rel_change": float | null,
          "mismatched": int | null, "nan_mismatch": int, "inf_mismatch": int
        },
        "verdict": null | {"kind": str, "text": str, "differs": bool,   # counts for the exit code
                           "rule": "identical" | "equal" | "tolerance" | "differs" | "structural"
                                   | "not_compared",
                           "evidence": {...}}     # tensorscope.diff_verdict says what each holds
      }]
    }
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from .diff_align import PER_SAVE_KEYS
from .diff_verdict import numel_of, value_changed
from .model import TensorInfo

__all__ = ["ValueDiff", "TensorDiff", "DiffResult", "GroupChange", "group_changes", "ranked",
           "reason", "STATUSES", "SCHEMA", "GROUP_BY"]

STATUSES = ("same", "changed", "added", "removed", "renamed")
SCHEMA = "tensorscope.diff/3"

# ------------------------------------------------------------------------------------------------
# Result records
# ------------------------------------------------------------------------------------------------

def _num(x: float | None):
    """A float for JSON: non-finite values become strings (JSON has no inf/nan)."""
    if x is None:
        return None
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


@dataclass(slots=True)
class ValueDiff:
    """How the values of one aligned pair differ (see the module docstring for each definition).

    Attributes:
        numel: elements compared.
        identical_bytes: the stored bytes of both sides are equal (same dtype and shape only).
        max_abs, mean_abs, rms: over positions where both sides are finite; 0.0 when the bytes are
            identical; None for bytes-only dtypes or when no position is finite.
        max_rel: max |a-b|/|b| over finite positions where b != 0 (None when there is none).
        zero_ref: positions where b is exactly 0 and a is not (left out of ``max_rel``).
        cosine: None when undefined (a zero side, nothing finite) or not computed (identical bytes
            whose norms were not asked for).
        norm_a, norm_b, norm_diff: the 2-norms of A, B and B - A over the finite positions (None
            when not computed).
        mismatched: positions outside ``atol + rtol*|b|`` as ``torch.isclose`` counts them (NaN and
            Inf mismatches included); None for bytes-only dtypes whose bytes differ.
        nan_mismatch: positions where either side is NaN.
        inf_mismatch: positions with an Inf on either side (no NaN) whose values differ.
        compared_as: ``"bytes"``, ``"float64"`` or ``"complex128"``.
    """

    numel: int
    identical_bytes: bool
    max_abs: float | None = None
    max_rel: float | None = None
    mean_abs: float | None = None
    rms: float | None = None
    cosine: float | None = None
    mismatched: int | None = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    compared_as: str = "bytes"
    norm_a: float | None = None
    norm_b: float | None = None
    norm_diff: float | None = None
    zero_ref: int = 0

    @property
    def differs(self) -> bool:
        """True when the values are not the same within tolerance."""
        if self.identical_bytes:
            return False
        return self.mismatched is None or self.mismatched > 0

    @property
    def rel_change(self) -> float | None:
        """‖B − A‖₂ / ‖A‖₂: 0.0 when nothing changed, None when unknown or when A is all zero."""
        if self.norm_diff == 0.0:
            return 0.0
        if self.norm_diff is None or not self.norm_a:
            return None
        return self.norm_diff / self.norm_a

    def to_dict(self) -> dict[str, Any]:
        return {"numel": self.numel, "identical_bytes": self.identical_bytes,
                "max_abs": _num(self.max_abs), "max_rel": _num(self.max_rel),
                "zero_ref": self.zero_ref,
                "mean_abs": _num(self.mean_abs), "rms": _num(self.rms), "cosine": _num(self.cosine),
                "norm_a": _num(self.norm_a), "norm_b": _num(self.norm_b),
                "norm_diff": _num(self.norm_diff), "rel_change": _num(self.rel_change),
                "mismatched": self.mismatched, "nan_mismatch": self.nan_mismatch,
                "inf_mismatch": self.inf_mismatch, "compared_as": self.compared_as}


def _brief(t: TensorInfo | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {"dtype": t.dtype, "shape": list(t.shape), "stride": list(t.stride), "nbytes": t.nbytes}


@dataclass(slots=True)
class TensorDiff:
    """One tensor of A, of B, or of both, and how they differ.

    ``status`` is one of `STATUSES`. ``changes`` lists every difference found, in words
    (``"dtype float32 -> bfloat16"``, ``"shape (2, 3) -> (3, 2)"``, ``"stride ..."``, ``"values"``,
    ``"name x -> y"``); a layout-only change ("stride") leaves the status "same".
    """

    status: str
    name_a: str | None
    name_b: str | None
    a: TensorInfo | None
    b: TensorInfo | None
    changes: list[str] = field(default_factory=list)
    values: ValueDiff | None = None
    verdict: Any = None    # `diff_verdict.Verdict`: how B's tensor relates to A's
    sample: Any = None     # the rank test's submatrices, gathered during the value pass (dropped
                           # once judged)

    @property
    def name(self) -> str:
        """The name in A, or in B for an added tensor."""
        return self.name_a if self.name_a is not None else self.name_b  # type: ignore[return-value]

    @property
    def structural(self) -> bool:
        """Added, removed, renamed, or a dtype/shape change: what a loader would trip on."""
        if self.status in ("added", "removed", "renamed"):
            return True
        return any(c.startswith(("dtype ", "shape ")) for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "name": self.name, "name_a": self.name_a,
                "name_b": self.name_b, "a": _brief(self.a), "b": _brief(self.b),
                "changes": list(self.changes),
                "values": None if self.values is None else self.values.to_dict(),
                "verdict": None if self.verdict is None else self.verdict.to_dict()}


@dataclass
class DiffResult:
    """Everything `diff_models` found. ``entries`` follow A's order; added tensors come last."""

    a_path: str
    b_path: str
    a_format: str
    b_format: str
    entries: list[TensorDiff]
    prefix_a: str = ""
    prefix_b: str = ""
    metadata: list[tuple[str, Any, Any]] = field(default_factory=list)
    atol: float = 1e-8
    rtol: float = 1e-5
    values_compared: bool = True
    strip_prefix: tuple[str, ...] = ()
    maps: tuple[tuple[str, str], ...] = ()
    tolerance_given: bool = False   # the caller chose atol/rtol: within them is not a difference
    verdict: Any = None             # `diff_verdict.PairVerdict`: how B relates to A, in words

    @property
    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for e in self.entries:
            out[e.status] += 1
        return out

    @property
    def identical(self) -> bool:
        """Every tensor is "same" (within tolerance, after the reported prefix stripping)."""
        return all(e.status == "same" for e in self.entries)

    @property
    def exit_code(self) -> int:
        """1 when any tensor differs: not "same", unless its verdict says it is within the
        tolerance the caller gave (`diff_verdict.Verdict.differs`)."""
        for e in self.entries:
            if (e.verdict.differs if e.verdict is not None else e.status != "same"):
                return 1
        return 0

    def to_dict(self, entries: bool = True) -> dict[str, Any]:
        """The JSON document (module docstring); ``entries=False`` leaves the entries out, for a
        writer that streams them."""
        return {"schema": SCHEMA, "a_path": self.a_path, "b_path": self.b_path,
                "a_format": self.a_format,
                "b_format": self.b_format, "prefix_a": self.prefix_a, "prefix_b": self.prefix_b,
                "strip_prefix": list(self.strip_prefix), "maps": [list(m) for m in self.maps],
                "atol": self.atol, "rtol": self.rtol, "values_compared": self.values_compared,
                "identical": self.identical, "exit_code": self.exit_code, "counts": self.counts,
                "tolerance_given": self.tolerance_given,
                "verdict": None if self.verdict is None else self.verdict.to_dict(),
                "metadata": [{"key": k, "a": _jsonable(va), "b": _jsonable(vb),
                              "per_save": k in PER_SAVE_KEYS}
                             for k, va, vb in self.metadata],
                "entries": [e.to_dict() for e in self.entries] if entries else None}


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float):
        return _num(v)
    if isinstance(v, (str, int, bool)) or v is None:
        return v
    return str(v)


# ------------------------------------------------------------------------------------------------
# Where the model changed: relative change per layer / module kind
# ------------------------------------------------------------------------------------------------

@dataclass
class GroupChange:
    """The tensors of one layer (``model.layers.3``) or one module kind (``self_attn.q_proj``).

    Norms add as sums of squares over the group's compared pairs (never a mean of per-tensor
    ratios): ``rel_change`` = sqrt(Σ‖B−A‖²) / sqrt(Σ‖A‖²). ``unknown`` counts pairs whose norms
    were not computed (identical bytes without ``norms=True``, bytes-only dtypes, shape changes);
    ``added``/``removed`` tensors count in ``tensors`` and ``changed`` only.
    """

    key: str
    tensors: int = 0
    changed: int = 0
    unknown: int = 0
    compared: int = 0
    sq_a: float = 0.0
    sq_diff: float = 0.0
    params: int = 0           # elements of the group's tensors (B's, or A's when only A has it)
    params_changed: int = 0   # ... of those whose values changed (`diff_verdict.value_changed`)

    @property
    def share_changed(self) -> float:
        return self.params_changed / self.params if self.params else 0.0

    @property
    def norm_a(self) -> float:
        return math.sqrt(self.sq_a)

    @property
    def norm_diff(self) -> float:
        return math.sqrt(self.sq_diff)

    @property
    def rel_change(self) -> float | None:
        """None when no pair of the group has known norms, or when ‖A‖ is 0 and B differs."""
        if not self.compared:
            return None
        if self.sq_diff == 0.0:
            return 0.0
        return self.norm_diff / self.norm_a if self.sq_a > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "tensors": self.tensors, "changed": self.changed,
                "unknown": self.unknown, "compared": self.compared, "norm_a": _num(self.norm_a),
                "norm_diff": _num(self.norm_diff), "rel_change": _num(self.rel_change),
                "params": self.params, "params_changed": self.params_changed,
                "share_changed": self.share_changed}


GROUP_BY = ("layer", "module")


def group_changes(entries: Sequence["TensorDiff"], by: str) -> list[GroupChange]:
    """Aggregate entries per layer (``by="layer"``, `grouping.layer_key`) or per module kind
    (``"module"``, `grouping.module_key`), ranked by relative change (largest first; groups whose
    change is unknown last), ties in first-seen order."""
    from . import grouping
    keyf = {"layer": grouping.layer_key, "module": grouping.module_key}.get(by)
    if keyf is None:
        raise ValueError(f"group by one of {GROUP_BY}, not {by!r}")
    groups: dict[str, GroupChange] = {}
    for e in entries:
        info = e.a if e.a is not None else e.b
        key = keyf(e.name, info.path if info is not None and len(info.path) > 1 else ())
        g = groups.get(key)
        if g is None:
            g = groups[key] = GroupChange(key)
        g.tensors += 1
        if e.status != "same":
            g.changed += 1
        n = numel_of(e)
        g.params += n
        if value_changed(e):
            g.params_changed += n
        v = e.values
        if e.status in ("added", "removed"):
            continue
        if v is None or v.norm_a is None or v.norm_diff is None:
            g.unknown += 1
            continue
        g.compared += 1
        g.sq_a += v.norm_a * v.norm_a
        g.sq_diff += v.norm_diff * v.norm_diff
    order = sorted(enumerate(groups.values()),
                   key=lambda ig: (ig[1].rel_change is None, -(ig[1].rel_change or 0.0), ig[0]))
    return [g for _, g in order]


def ranked(entries: Sequence["TensorDiff"]) -> list["TensorDiff"]:
    """Largest change first: structural changes (added, removed, renamed, dtype, shape), then value
    changes, then layout-only changes, then the rest; within each, by relative change
    ‖B−A‖/‖A‖, then max_abs, both descending (NaN first); ties keep the model's order."""
    def key(item):
        i, e = item
        if e.structural:
            rank = 0
        elif e.status == "changed":
            rank = 1
        elif e.changes:
            rank = 2
        else:
            rank = 3
        v = e.values
        rel = v.rel_change if v is not None and v.rel_change is not None else -1.0
        m = v.max_abs if v is not None and v.max_abs is not None else -1.0
        return (rank, -(math.inf if rel != rel else rel), -(math.inf if m != m else m), i)
    return [e for _, e in sorted(enumerate(entries), key=key)]


def reason(e: "TensorDiff") -> str:
    """Why a pair is listed as it is, in words, for every surface (CLI table, TUI):
    ``"values: 12 of 4,096 outside tolerance; NaN 1"``, ``"dtype float32 -> bfloat16"``,
    ``"identical"``, ``"within tolerance"``."""
    if e.status == "added":
        return f"only in B: {e.b.dtype} {list(e.b.shape)}"
    if e.status == "removed":
        return f"only in A: {e.a.dtype} {list(e.a.shape)}"
    if e.status == "renamed":
        return f"renamed to {e.name_b}"
    parts = [c for c in e.changes if c != "values"]
    v = e.values
    if v is not None and "values" in e.changes:
        if v.mismatched is None:
            parts.append("stored bytes differ")
        else:
            parts.append(f"values: {v.mismatched:,} of {v.numel:,} outside tolerance")
        if v.nan_mismatch:
            parts.append(f"NaN on a side at {v.nan_mismatch:,}")
        if v.inf_mismatch:
            parts.append(f"Inf differs at {v.inf_mismatch:,}")
    elif v is not None and v.identical_bytes:
        parts.append("identical")
    elif v is not None:
        parts.append("within tolerance")
    elif e.status == "same" and not parts:
        parts.append("values not compared")
    return "; ".join(parts)


