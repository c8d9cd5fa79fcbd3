"""What a conversion did: the `ConvertReport` and its JSON form (schema ``tensorscope.convert/1``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..model import TensorInfo

SCHEMA = "tensorscope.convert/1"

# ------------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------------

@dataclass
class ConvertReport:
    """What a conversion did (or why it did not).

    JSON schema (`to_dict`, stable; new keys may be added, none removed)::

        {"schema": "tensorscope.convert/1",
         "status": "converted" | "refused-unsafe" | "refused",
         "input": str, "source_format": str,
         "source_sha256": str | null,          # as written into __metadata__
         "source_files": {path: sha256},       # every input file
         "outputs": [{"path": str, "tensors": int, "bytes": int}],   # bytes: file size
         "index": str | null,                  # model.safetensors.index.json when sharded
         "tensors_written": int, "bytes_written": int,   # tensor bytes
         "tensors": [{"name", "dtype", "shape", "file"}],  # safetensors dtype/shape, output file
         "shared": [{"storage": str, "tensors": [str]}],   # de-aliased: each written as a copy
         "expanded": [str], "contiguous": [str],
         "skipped": [{"name", "dtype", "reason"}], "refused": [{"name", "dtype", "reason"}],
         "verified": bool | null,              # null: --verify not asked
         "allowed_unsafe": bool,
         "scan": <tensorscope.scan/1 report> | null}
    """

    input: str
    source_format: str = ""
    status: str = "converted"
    source_sha256: str | None = None
    source_files: dict[str, str] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    index: str | None = None
    tensors: list[dict[str, Any]] = field(default_factory=list)
    shared: dict[str, list[str]] = field(default_factory=dict)
    expanded: list[str] = field(default_factory=list)
    contiguous: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    verified: bool | None = None
    allowed_unsafe: bool = False
    scan: Any = None

    @property
    def bytes_written(self) -> int:
        return sum(t["nbytes"] for t in self.tensors)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "status": self.status, "input": self.input,
            "source_format": self.source_format, "source_sha256": self.source_sha256,
            "source_files": dict(self.source_files), "outputs": list(self.outputs),
            "index": self.index, "tensors_written": len(self.tensors),
            "bytes_written": self.bytes_written,
            "tensors": [{k: t[k] for k in ("name", "dtype", "shape", "file")} for t in self.tensors],
            "shared": [{"storage": k, "tensors": v} for k, v in self.shared.items()],
            "expanded": list(self.expanded), "contiguous": list(self.contiguous),
            "skipped": list(self.skipped), "refused": list(self.refused),
            "verified": self.verified, "allowed_unsafe": self.allowed_unsafe,
            "scan": self.scan.to_dict() if hasattr(self.scan, "to_dict") else self.scan,
        }


def _listing(items: Sequence[tuple[TensorInfo, str]]) -> list[dict[str, Any]]:
    return [{"name": t.name, "dtype": t.dtype, "reason": why} for t, why in items]
