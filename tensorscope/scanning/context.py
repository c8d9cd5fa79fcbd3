"""The state of one file's scan, handed to every checker (as ruff hands its `Checker` to rules).

The dispatcher (`loader`) imports the checkers (`pickles`, `configs`, `hf_repo`, ...) and gives
each a `ScanContext`; a checker reports through it (``ctx.add``, ``ctx.fail``), reads the limits
from it, and asks the dispatcher to read nested bytes (a second stage, an embedded pickle) through
``ctx.rescan`` — so no checker imports the dispatcher, and the imports run one way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .report import Finding
from .rules import severity_of

# Python text one scanned file may have tokenized, over all its sources (~1.3 s per MB).
CODE_CHARS_PER_FILE = 32 << 20


@dataclass(frozen=True)
class ScanLimits:
    """Bounds of one scan.

    Attributes:
        max_decompressed: bytes one compressed stream or member may inflate to.
        max_depth: nesting of archives and second stages.
        max_streams: pickles read back to back from one stream.
        max_findings_per_pickle: findings kept per pickle (the rest are counted in one line).
        vm: the pickle VM's `Limits` (None: its defaults).
    """

    max_decompressed: int = 128 << 20
    max_depth: int = 6
    max_streams: int = 32
    max_findings_per_pickle: int = 200
    vm: Any = None


DEFAULT_SCAN_LIMITS = ScanLimits()

# The dispatcher's entry for nested bytes: (ctx, data, member, base, absolute, depth, strict) ->
# the storage keys its pickles reference (a set), True when read, False when it could not be read.
Rescan = Callable[["ScanContext", memoryview, "str | None", int, bool, int, bool], Any]


class ScanContext:
    """State of one file's scan: findings, what was understood, pickles already judged, and the
    dispatcher's `rescan` for bytes found inside the bytes being judged."""

    def __init__(self, path: str, limits: ScanLimits, rescan: Rescan):
        self.path = path
        self.limits = limits
        self._rescan = rescan                  # a plain function: no ctx <-> callback cycle
        self.findings: list[Finding] = []
        self.failures: list[str] = []          # reasons the file was not fully understood
        self.judged: set[tuple[str | None, int]] = set()
        self.reused: dict[tuple[str | None, int], Any] = {}  # (member, abs offset) -> PickleResult
        self.kinds: list[str] = []             # content kinds seen at top level
        self.vm_limits = limits.vm
        self.blob_mode = False                 # a DCP .distcp: several zips back to back
        self.known_data = False                # raw data a model file points at (ONNX external data)
        self.data_files: set[str] = set()      # files this model's tensors live in
        self.keras = False                     # a Keras archive: its loader is Keras, not ours
        self.layout: str | None = None         # a known non-model layout (TorchServe, skops, text zip)
        self.code_chars = CODE_CHARS_PER_FILE  # Python text still to tokenize

    def add(self, rule: str, message: str, member: str | None = None, offset: int | None = None,
            trigger: str | None = None, base: str = "file", variant: str | None = None) -> None:
        """A finding of ``rule``; its severity is the registry's (for ``variant``)."""
        self.findings.append(Finding(severity_of(rule, variant), rule, one_line(message),
                                     self.path, member, offset, trigger, base))

    def fail(self, reason: str) -> None:
        self.failures.append(reason)

    def rescan(self, data, member: str | None, depth: int, *, base: int = 0,
               absolute: bool = False, strict: bool = False):
        """Judge nested bytes by their content, as the dispatcher judges a member (a zip, a
        compressed stream, a pickle ...). Returns the dispatcher's result: the storage keys the
        pickles reference (a set), True when read, False when it could not be read."""
        return self._rescan(self, memoryview(data), member, base, absolute, depth, strict)


def join(prefix: str | None, member: str | None) -> str | None:
    """A nested member's name: ``outer!inner``."""
    if prefix and member:
        return f"{prefix}!{member}"
    return prefix or member


def one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= 400 else text[:397] + "..."
