"""Static safety scan of untrusted model files: every pickle anywhere, judged by an allowlist.

Nothing from a scanned file is executed or imported. Each file is read twice over:

1. **As its loader reads it** (byte level, independent of the format parsers): a file starting
   with ``PK\\x03\\x04`` is a zip (torch.load's ``_is_zipfile``; NumPy's npz test), every member
   judged by content: pickles (``data.pkl``, ``constants.pkl``, stray ``.pkl``, ``.data/``
   entries, unreferenced ``data/`` records), nested archives, ``.npy`` members, compressed
   wrappers, TorchScript ``code/``; ``\\x93NUMPY`` is a ``.npy`` (object arrays hold a pickle); a
   tar is torch's legacy tar form; gzip/bz2/xz/lzma/zlib wrappers are decompressed (output capped);
   anything else is a pickle stream read as ``pickle.load`` reads it, and what follows ``STOP`` is
   scanned too (torch's legacy format is five pickles in a row; a plain file MAY hide more).
   A zip visible to other readers behind a non-zip head (a polyglot) is scanned as well.
2. **Through the format parser** (`tensorscope.open`), when one exists: its anomalies (zip reader
   disagreements, ONNX external-data escapes, custom-op domains), TorchScript code and the pickles
   it already ran (reused, not re-run). A parser failure never stops the scan, and a file that
   neither layer understands is never clean (``file.unparseable``, HIGH).

Policy (`tensorscope.policy`): allowlisted globals (what ``torch.load(weights_only=True)`` and
NumPy need) give no finding; denylisted ones are CRITICAL; anything else is judged by use: imported
only LOW, instantiated (``torch.save(model)``: user code) or called MEDIUM, called with a string
from the file HIGH. Bytes handed to a deserializer (``pickle.loads``, ``torch.load``...) are a
second stage: CRITICAL, and scanned recursively.

JSON schema (`ScanReport.to_dict`, stable; new keys may be added, none removed)::

    {"schema": "tensorscope.scan/1",
     "files": [str, ...],                 # files scanned
     "errors": int,                       # files that could not be read or parsed completely
     "severity": "critical"|...|null,     # worst finding
     "unsafe": bool,                      # any finding at HIGH or above
     "counts": {"critical": n, "high": n, "medium": n, "low": n, "info": n},
     "findings": [{"severity": str, "rule": str, "message": str, "file": str,
                   "member": str|null,   # archive member, "a.zip!inner.pt:archive/data.pkl" when nested
                   "offset": int|null,   # byte offset of the opcode/record
                   "offset_base": "file"|"member",  # absolute in file, or within the (decompressed) member
                   "trigger": str|null}]}  # the global or call, e.g. "os.system"

Rule ids are stable (`RULES` lists each with its default severity and a description; SARIF output
carries them as ``tool.driver.rules``).

Public API: `scan_paths`, `scan_file`, `Severity`, `Finding`, `ScanReport`, `RULES`.
"""
from __future__ import annotations

import base64
import binascii
import bz2
import io
import lzma
import os
import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Iterable, Iterator

from . import policy
from .errors import FileMissing, FormatError, TensorscopeError, UnknownFormat
from .source import ByteSource

__all__ = ["Severity", "Finding", "ScanReport", "scan_paths", "scan_file", "RULES",
           "ScanLimits", "DEFAULT_SCAN_LIMITS"]


class Severity(IntEnum):
    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[str(text).upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (one of: "
                             f"{', '.join(str(s) for s in cls)})") from None


# rule id -> (default severity, description). Severity in a Finding may differ from the default
# when the context says so (e.g. a zip anomaly in a DCP blob).
RULES: dict[str, tuple[Severity, str]] = {
    "pickle.dangerous-global": (Severity.CRITICAL, "The pickle imports a callable or module that can run code, spawn processes, touch files or the network, or load more pickles."),
    "pickle.torch-storage-bytes": (Severity.LOW, "torch's own pickling of a tensor (pickle.dumps(tensor)): a nested torch.load of bytes that were scanned and found clean."),
    "pickle.dynamic-global": (Severity.CRITICAL, "A STACK_GLOBAL imports a name computed while loading (a call's result, a global such as os.name): what it imports cannot be known without running it."),
    "pickle.reader-disagreement": (Severity.CRITICAL, "CPython's own readers read these bytes differently (an opcode across a FRAME end: pickle.loads reads on, torch.load's io.BytesIO reads from after the frame): opcodes can hide from any one reading. No writer produces this."),
    "pickle.second-stage": (Severity.CRITICAL, "The pickle hands bytes to a deserializer (pickle.loads, torch.load, numpy.load, marshal.loads...): a second stage, scanned recursively."),
    "pickle.unknown-call-string": (Severity.HIGH, "The pickle calls a global outside the allowlist with a string taken from the file."),
    "pickle.indirect-call": (Severity.HIGH, "The pickle calls the result of another call or a non-global object (getattr chains, methodcaller)."),
    "pickle.parse-error": (Severity.HIGH, "The pickle is broken: loaders run every opcode before the break, so what precedes it counts."),
    "pickle.user-class": (Severity.MEDIUM, "Loading instantiates a class outside torch and the allowlist: it imports user code (whole-module pickles)."),
    "pickle.unknown-call": (Severity.MEDIUM, "The pickle calls a global outside the allowlist."),
    "pickle.multiple-streams": (Severity.MEDIUM, "Another pickle follows STOP: pickle.load reads only the first, other readers read on."),
    "pickle.unknown-import": (Severity.LOW, "The pickle imports a global outside the allowlist without calling it."),
    "pickle.trailing-data": (Severity.LOW, "Bytes follow the pickle's STOP that are not another pickle."),
    "pickle.framework-class": (Severity.INFO, "The pickle names a torch framework class (nn modules, TorchScript, DCP metadata): torch's own code."),
    "pickle.object-array": (Severity.INFO, "A NumPy object array: np.load needs allow_pickle=True and unpickles it."),
    "file.unparseable": (Severity.HIGH, "The file could not be parsed completely: what could not be read cannot be called safe."),
    "file.unsupported-archive": (Severity.HIGH, "An archive the standard library cannot open (7z, rar): its content is not scanned."),
    "file.decompression-limit": (Severity.HIGH, "A compressed stream exceeds the decompression cap: the rest is not scanned."),
    "file.extension-mismatch": (Severity.MEDIUM, "The file's content does not match its extension (a pickle named .safetensors, a zip named .jpg)."),
    "file.polyglot": (Severity.HIGH, "Different readers see different content in this file (a zip hidden behind another head)."),
    "file.not-a-model": (Severity.INFO, "A text file that is not a pickle: no loader runs code from it."),
    "file.symlink-outside": (Severity.LOW, "A symlink points outside the scanned tree; it was not followed."),
    "file.unreadable": (Severity.HIGH, "The file could not be opened."),
    "zip.member-unreadable": (Severity.HIGH, "An archive member cannot be read: its content is not scanned."),
    "zip.torch-refuses": (Severity.MEDIUM, "PyTorch's zip reader (miniz) would refuse this archive while others open it."),
    "torchscript.foreign-call": (Severity.HIGH, "TorchScript code calls something outside torch, ops and the TorchScript builtins."),
    "torchscript.custom-op": (Severity.MEDIUM, "TorchScript code calls a custom operator namespace: loading needs a native library."),
    "torchscript.code-unparseable": (Severity.HIGH, "A TorchScript code/ file does not parse."),
    "onnx.external-data-escape": (Severity.HIGH, "ONNX external data points outside the model's folder (absolute path, '..', symlink)."),
    "onnx.custom-domain": (Severity.MEDIUM, "ONNX operators from a non-standard domain: runtimes load native custom-op libraries for them."),
}

# Severity of each zip reader anomaly (parsers/zipfmt.py kinds). Sources: picklescan advisories
# GHSA-w8jq-xcqf-f792 (flag bits), GHSA-7q5r-7gvp-wc82 (local/central name), CVE-2025-10156 (bad
# CRC makes picklescan skip the member), zipfile/miniz differences documented in zipfmt.
ANOMALY_SEVERITY: dict[str, Severity] = {
    "zip.duplicate_name": Severity.HIGH, "zip.local_name_mismatch": Severity.HIGH,
    "zip.local_header_mismatch": Severity.MEDIUM, "zip.compressed_member": Severity.INFO,
    "zip.encrypted_member": Severity.HIGH, "zip.data_out_of_range": Severity.HIGH,
    "zip.overlapping_members": Severity.HIGH, "zip.unaccounted_bytes": Severity.MEDIUM,
    "zip.prepended_bytes": Severity.HIGH, "zip.trailing_bytes": Severity.MEDIUM,
    "zip.multiple_eocd": Severity.HIGH, "zip.bad_crc": Severity.MEDIUM,
    "zip.cd_count_mismatch": Severity.HIGH, "zip.non_utf8_name": Severity.LOW,
    "zip.absolute_or_parent_path": Severity.HIGH, "zip.comment": Severity.LOW,
    "zip.bad_local_header": Severity.HIGH, "zip.bad_zip64": Severity.MEDIUM,
    "zip.bad_extra_field": Severity.MEDIUM, "zip.nul_in_name": Severity.HIGH,
    "zip.stored_size_mismatch": Severity.HIGH,
    "onnx.external_path_escape": Severity.HIGH,
    "npy.trailing_bytes": Severity.LOW, "npy.pickle_not_analysed": Severity.HIGH,
    "npz.bad_member": Severity.HIGH,
}
# Anomalies that describe the layout of a normal file of that format (no finding).
_BENIGN_ANOMALIES = {"torch.storage_unreadable"}
_UNKNOWN_ANOMALY = Severity.LOW  # unknown is never silently safe
# Anomalies of formats that carry no code: compatibility notes, reported at INFO.
_CODE_FREE_PREFIXES = ("gguf.", "safetensors.", "npy.", "onnx.")

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
MAGIC_ZIP = b"PK\x03\x04"
MAGIC_EMPTY_ZIP = b"PK\x05\x06"
MAGIC_NPY = b"\x93NUMPY"
MAGIC_GZIP = b"\x1f\x8b"
MAGIC_BZ2 = b"BZh"
MAGIC_XZ = b"\xfd7zXZ\x00"
MAGIC_7Z = b"7z\xbc\xaf\x27\x1c"
MAGIC_RAR = b"Rar!\x1a\x07"
MAGIC_ZSTD = b"\x28\xb5\x2f\xfd"
_ZLIB_HEADS = {b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda"}
_I64 = struct.Struct("<q")
def _cannot_import(data: bytes) -> bool:
    """True when no byte of ``data`` can start an opcode that imports: no STACK_GLOBAL or
    EXT1/2/4 byte, and no GLOBAL/INST byte ('c', 'i') with a newline after it. GLOBAL and INST
    read the module and the name as lines (``readline``); with no newline left the first read
    takes everything and the second comes back empty, so the load fails before any import
    (``b"little"``, torch's byteorder record, holds an 'i' and no newline)."""
    if b"\x93" in data or b"\x82" in data or b"\x83" in data or b"\x84" in data:
        return False
    nl = data.rfind(b"\n")
    return nl < 0 or (data.find(b"c", 0, nl) < 0 and data.find(b"i", 0, nl) < 0)

# Extensions, by the content a loader expects behind them.
_EXT_KIND = {
    ".safetensors": "safetensors", ".gguf": "gguf", ".onnx": "onnx", ".ort": "onnx",
    ".npy": "npy", ".npz": "zip", ".pt2": "zip", ".ptl": "zip", ".mar": "zip", ".zip": "zip",
    ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch", ".tar": "torch",
    ".pkl": "pickle", ".pickle": "pickle", ".joblib": "pickle", ".dat": "pickle",
    ".data": "pickle", ".p": "pickle", ".distcp": "zip", ".metadata": "pickle",
}
# Formats that promise no code: a pickle or zip behind these names misleads the user most.
_SAFE_KINDS = {"safetensors", "gguf", "onnx", "npy"}
# Member names that promise a pickle: a broken one there is an error, not raw data.
_PICKLE_MEMBER_SUFFIXES = (".pkl", ".pickle", ".debug_pkl", ".joblib", ".metadata", ".pt", ".pth",
                           ".bin", ".ckpt")
# Extensions of files that are never models: skipped in folder walks unless the content is a model.
_PICKLE_BEARING = {"zip", "pickle", "tar", "npy-object", "compressed"}


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


@dataclass(frozen=True)
class Finding:
    """One finding. Instances are immutable and hashable.

    Attributes:
        severity: a `Severity`.
        rule: stable rule id (see `RULES`).
        message: one line saying what and why.
        file: path of the scanned file.
        member: archive member (``!`` separates nesting levels), None for the file itself.
        offset: byte offset of the opcode/record, None when not known.
        trigger: the global or call that triggered the rule (``os.system``), None otherwise.
        offset_base: ``file`` when ``offset`` is absolute in the file, ``member`` when it counts
            within the (decompressed or nested) member.
    """

    severity: Severity
    rule: str
    message: str
    file: str
    member: str | None = None
    offset: int | None = None
    trigger: str | None = None
    offset_base: str = "file"

    def __str__(self) -> str:
        where = self.file + (f":{self.member}" if self.member else "")
        if self.offset is not None:
            where += f" at byte {self.offset}" + (" of the member" if self.offset_base == "member" else "")
        return f"{self.severity}: {where}: {self.message} [{self.rule}]"

    def to_dict(self) -> dict[str, Any]:
        return {"severity": str(self.severity), "rule": self.rule, "message": self.message,
                "file": self.file, "member": self.member, "offset": self.offset,
                "offset_base": self.offset_base, "trigger": self.trigger}


@dataclass
class ScanReport:
    """The result of a scan.

    Attributes:
        findings: every finding, worst first.
        files: the files scanned.
        errors: how many files could not be read or parsed completely.
    """

    findings: list[Finding] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    errors: int = 0

    @property
    def severity(self) -> Severity | None:
        return max((f.severity for f in self.findings), default=None)

    @property
    def unsafe(self) -> bool:
        return any(f.severity >= Severity.HIGH for f in self.findings)

    def exit_code(self, fail_on: Severity = Severity.MEDIUM) -> int:
        """0 when no finding reaches ``fail_on``, else 1."""
        return 1 if any(f.severity >= fail_on for f in self.findings) else 0

    def counts(self) -> dict[str, int]:
        out = {str(s): 0 for s in Severity}
        for f in self.findings:
            out[str(f.severity)] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        sev = self.severity
        return {"schema": "tensorscope.scan/1", "files": list(self.files), "errors": self.errors,
                "severity": str(sev) if sev is not None else None, "unsafe": self.unsafe,
                "counts": self.counts(), "findings": [f.to_dict() for f in self.findings]}

    def to_sarif(self) -> dict[str, Any]:
        """SARIF 2.1.0: one run, the rules used, one result per finding."""
        from . import __version__
        level = {Severity.CRITICAL: "error", Severity.HIGH: "error", Severity.MEDIUM: "warning",
                 Severity.LOW: "note", Severity.INFO: "note"}
        used = sorted({f.rule for f in self.findings} | set(RULES))
        index = {r: i for i, r in enumerate(used)}
        rules = []
        for r in used:
            sev, desc = RULES.get(r, (Severity.LOW, "Structural anomaly reported by a format reader."))
            rules.append({"id": r, "name": r.replace(".", "/"),
                          "shortDescription": {"text": desc.split(":")[0].rstrip(".")[:120]},
                          "fullDescription": {"text": desc},
                          "defaultConfiguration": {"level": level[sev]},
                          "properties": {"severity": str(sev)}})
        results = []
        for f in self.findings:
            loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": _uri(f.file)}}}
            if f.offset is not None and f.offset_base == "file":
                loc["physicalLocation"]["region"] = {"byteOffset": f.offset}
            if f.member:
                loc["logicalLocations"] = [{"name": f.member, "kind": "member"}]
            result = {"ruleId": f.rule, "ruleIndex": index[f.rule], "level": level[f.severity],
                      "message": {"text": f.message}, "locations": [loc],
                      "properties": {"severity": str(f.severity), "member": f.member,
                                     "offset": f.offset, "offsetBase": f.offset_base,
                                     "trigger": f.trigger}}
            results.append(result)
        return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
                "runs": [{"tool": {"driver": {"name": "tensorscope", "version": __version__,
                                              "informationUri": "https://github.com/tensorscope/tensorscope",
                                              "rules": rules}},
                          "results": results,
                          "artifacts": [{"location": {"uri": _uri(p)}} for p in self.files]}]}


def _uri(path: str) -> str:
    from urllib.parse import quote
    p = path.replace(os.sep, "/")
    return quote(p, safe="/:._-~")


# =================================================================================================
# Walking paths

def scan_paths(*paths: str | os.PathLike, recursive: bool = True,
               follow_symlinks_inside: bool = True, limits: ScanLimits | None = None) -> ScanReport:
    """Scan files and folders; nothing found in them is executed or imported.

    Args:
        paths: files and folders (Hugging Face cache folders included: their snapshot symlinks
            into ``blobs/`` are followed because they stay inside the repository folder).
        recursive: descend into sub-folders.
        follow_symlinks_inside: follow symlinks that resolve inside the scanned tree; links
            that leave it are never followed (``file.symlink-outside``).
        limits: `ScanLimits` (decompression cap, nesting depth, VM limits).

    Returns:
        A `ScanReport`, findings worst first.

    Raises:
        FileMissing: a path does not exist (a TensorscopeError and a FileNotFoundError).

    Example:
        >>> report = scan_paths("model.pt")            # doctest: +SKIP
        >>> report.unsafe, [str(f) for f in report.findings][:1]   # doctest: +SKIP
    """
    limits = limits or DEFAULT_SCAN_LIMITS
    report = ScanReport()
    todo: list[tuple[str, str, bool]] = []  # (path, its real path, named explicitly)
    walk_findings: list[Finding] = []
    for p in paths:
        p = os.fspath(p)
        if not os.path.lexists(p):
            raise FileMissing(p, "no such file or directory")
        if os.path.isdir(p):
            todo.extend((f, real, False) for f, real in
                        _walk(p, recursive, follow_symlinks_inside, walk_findings))
        else:
            todo.append((p, os.path.realpath(p), True))
    # One real file is scanned once, under its most telling name (a snapshot link, not a blob).
    by_real: dict[str, tuple[str, bool]] = {}
    for path, real, explicit in todo:
        prev = by_real.get(real)
        if prev is None or (explicit and not prev[1]) or (not prev[1] and _nicer(path, prev[0])):
            by_real[real] = (path, explicit or (prev[1] if prev else False))
    findings: list[Finding] = list(walk_findings)
    # Models that point at raw data files (ONNX external data) go first, so that those files are
    # then read as the raw data they are.
    order = sorted(by_real.items(), key=lambda rpe: (not rpe[1][0].lower().endswith(".onnx"),))
    data_files: set[str] = set()
    for real, (path, explicit) in order:
        known = real in data_files
        ctx, scanned = _scan_one(path, limits, explicit, known)
        data_files |= {os.path.realpath(f) for f in ctx.data_files}
        if scanned:
            report.files.append(path)
        report.errors += int(bool(ctx.failures))
        findings.extend(ctx.findings)
    report.findings = _sorted(_dedupe(findings))
    return report


def _nicer(a: str, b: str) -> bool:
    """Prefer names with an extension over content-addressed blob names."""
    return bool(os.path.splitext(a)[1]) and not os.path.splitext(b)[1]


def _hf_repo_root(path: str) -> str | None:
    """The Hugging Face cache repository folder (``models--org--name``) holding ``path``."""
    cur = os.path.abspath(path)
    while True:
        base = os.path.basename(cur)
        if base.startswith(("models--", "datasets--", "spaces--")) and \
                os.path.isdir(os.path.join(cur, "blobs")):
            return cur
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        cur = parent


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([root, path]) == root
    except ValueError:
        return False


def _walk(top: str, recursive: bool, follow: bool,
          findings: list[Finding]) -> Iterator[tuple[str, str]]:
    """(path, real path) of the files under ``top``; symlinks followed only when they resolve
    inside the tree. A plain entry's real path is its folder's real path joined with its name,
    so ``realpath`` (an lstat per path component) runs once per folder and symlink, not per file."""
    root = os.path.realpath(top)
    hf = _hf_repo_root(top)
    bounds = [root] + ([os.path.realpath(hf)] if hf else [])
    seen_dirs = {root}
    stack = [(top, root)]
    while stack:
        d, d_real = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            findings.append(Finding(Severity.HIGH, "file.unreadable", f"cannot list folder: {e.strerror}", d))
            continue
        subdirs = []
        for e in entries:
            path = e.path
            if e.is_symlink():
                real = os.path.realpath(path)
                if not follow or not any(_inside(real, b) for b in bounds):
                    findings.append(Finding(Severity.LOW, "file.symlink-outside",
                                            f"symlink to {real} leaves the scanned tree: not followed",
                                            path))
                    continue
                if os.path.isdir(real):
                    if recursive and real not in seen_dirs:
                        seen_dirs.add(real)
                        subdirs.append((path, real))
                elif os.path.isfile(real):
                    yield path, real
                continue
            if e.is_dir(follow_symlinks=False):
                real = os.path.join(d_real, e.name)
                if recursive and real not in seen_dirs:
                    seen_dirs.add(real)
                    subdirs.append((path, real))
            elif e.is_file(follow_symlinks=False):
                yield path, os.path.join(d_real, e.name)
        stack.extend(reversed(subdirs))


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    seen = set()
    out = []
    for f in findings:
        key = (f.rule, f.file, f.member, f.offset, f.trigger, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (-int(f.severity), f.file, f.member or "",
                                           f.offset if f.offset is not None else -1, f.rule))


# =================================================================================================
# One file

class _Ctx:
    """State of one file's scan: findings, what was understood, pickles already judged."""

    def __init__(self, path: str, limits: ScanLimits):
        self.path = path
        self.limits = limits
        self.findings: list[Finding] = []
        self.failures: list[str] = []          # reasons the file was not fully understood
        self.judged: set[tuple[str | None, int]] = set()
        self.reused: dict[tuple[str | None, int], Any] = {}  # (member, abs offset) -> PickleResult
        self.kinds: list[str] = []             # content kinds seen at top level
        self.vm_limits = limits.vm
        self.blob_mode = False                 # a DCP .distcp: several zips back to back
        self.known_data = False                # raw data a model file points at (ONNX external data)
        self.data_files: set[str] = set()      # files this model's tensors live in

    def add(self, severity: Severity, rule: str, message: str, member: str | None = None,
            offset: int | None = None, trigger: str | None = None, base: str = "file") -> None:
        self.findings.append(Finding(Severity(severity), rule, _one_line(message), self.path,
                                     member, offset, trigger, base))

    def fail(self, reason: str) -> None:
        self.failures.append(reason)


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= 400 else text[:397] + "..."


def scan_file(path: str, *, limits: ScanLimits | None = None,
              explicit: bool = True) -> tuple[list[Finding], bool, bool]:
    """Scan one file.

    Args:
        path: the file.
        limits: `ScanLimits`.
        explicit: the user named this file (an unrecognised file is then an error finding rather
            than a non-model file skipped in a folder walk).

    Returns:
        (findings, scanned, error): ``scanned`` is False for a non-model file skipped in a folder
        walk; ``error`` is True when the file could not be read or parsed completely.
    """
    ctx, scanned = _scan_one(path, limits or DEFAULT_SCAN_LIMITS, explicit, False)
    return ctx.findings, scanned, bool(ctx.failures)


def _scan_one(path: str, limits: ScanLimits, explicit: bool, known_data: bool) -> tuple[_Ctx, bool]:
    ctx = _Ctx(path, limits)
    ctx.known_data = known_data
    try:
        src = ByteSource(path)
    except OSError as e:
        ctx.add(Severity.HIGH, "file.unreadable", f"cannot open the file: {e.strerror or e}")
        ctx.fail("unreadable")
        return ctx, True
    try:
        scanned = _scan_file(ctx, src, explicit)
    except RecursionError:
        ctx.fail("nesting too deep")
        scanned = True
    finally:
        src.close()
    if not scanned:
        ctx.findings.clear()
        ctx.failures.clear()
        return ctx, False
    if ctx.failures:
        ctx.add(Severity.HIGH, "file.unparseable",
                "could not be parsed completely, so it is not reported clean: "
                + "; ".join(dict.fromkeys(ctx.failures)))
    return ctx, True


def _scan_file(ctx: _Ctx, src: ByteSource, explicit: bool) -> bool:
    head = src.head(4096)
    ext = os.path.splitext(ctx.path)[1].lower()
    expected_model = explicit or ext in _EXT_KIND
    if src.size == 0:
        if expected_model:
            ctx.fail("the file is empty")
            return True
        return False

    kind = _content_kind(head)
    # A zip's central directory is read once: the parser and the byte-level pass share it.
    archive = _read_archive(src) if kind in ("zip", "empty-zip") else None

    # -- the format parser's view (its pickle runs are reused below) --------------------------
    model, parser_error, parser_format = _open_with_parser(ctx, src, archive)
    if model is not None:
        for rec in model.evidence.pickles:
            ctx.reused.setdefault((rec.member, rec.offset), rec.result)

    # -- the loader's view, byte level -----------------------------------------------------------
    buf = src.buffer
    blobs = _dcp_blobs(ctx.path) if kind in ("zip", "empty-zip") else None
    if blobs:
        ctx.blob_mode = True
        understood = _scan_dcp_blobs(ctx, src, blobs)
    elif kind in ("zip", "empty-zip"):
        understood = _scan_zip(ctx, src, prefix=None, absolute=True, depth=0, archive=archive)
    elif kind == "npy":
        understood = _scan_npy(ctx, buf, None, 0, True, 0)
    elif kind in ("gzip", "bz2", "xz", "zlib", "lzma"):
        understood = _scan_compressed(ctx, buf, kind, None, 0)
    elif kind == "zf":
        from .parsers.joblib_fmt import zf_data_offset
        try:
            start = zf_data_offset(buf, ctx.path)
        except FormatError as e:
            ctx.fail(str(e))
            understood = False
        else:
            understood = _scan_compressed(ctx, buf[start:], "zlib", None, 0)
        kind = "zlib"
    elif kind in ("7z", "rar", "zstd"):
        ctx.add(Severity.HIGH, "file.unsupported-archive",
                f"{kind} archive: the standard library cannot open it, so its content (possibly a "
                "pickle, as in the nullifAI models) is not scanned")
        understood = True  # reported under its own rule
    elif kind == "tar":
        understood = _scan_tar(ctx, buf, None, 0, 0, True)
    elif parser_format in ("safetensors", "gguf", "onnx") or _sniffs_as_safe_format(head, src.size):
        kind = model.format if model is not None else (parser_format or "safe-format")
        understood = model is not None
    else:
        is_pickle, understood = _scan_pickle_file(ctx, buf, None, 0, True, 0,
                                                  lenient=expected_model,
                                                  require_stop=not expected_model)
        kind = "pickle" if is_pickle else "unknown"
    ctx.kinds.append(kind)

    # A zip that other readers (zipfile, unzip, other scanners) see behind a non-zip head.
    if kind not in ("zip", "empty-zip"):
        _scan_polyglot_zip(ctx, src, kind)

    if model is not None:
        _judge_model_evidence(ctx, model)
        ctx.data_files = {t.file for t in model.tensors if t.file and t.file != ctx.path}
        ctx.data_files |= {f for f in model.files if f != ctx.path}
    elif parser_error is not None:
        _parser_error_finding(ctx, parser_error, understood, kind)

    if kind == "unknown" and model is None:
        if ctx.known_data or _referenced_by_onnx(ctx.path):
            return True  # raw tensor bytes another model file points at
        if not expected_model:
            # a non-model file met in a folder walk (README, config.json ...): not ours to judge
            ctx.findings = [f for f in ctx.findings if f.rule == "file.polyglot" or
                            f.severity >= Severity.HIGH]
            ctx.failures.clear()
            if not ctx.findings:
                return False
            return True
        if _is_text(head):
            # text that is not a pickle (index JSON, configs, refs): no loader unpickles it
            ctx.add(Severity.INFO, "file.not-a-model",
                    "text file that is not a pickle: nothing here is loaded as code")
            return True
        ctx.fail(f"no reader recognises this content (starts with {head[:8]!r}, {src.size} bytes)")
    elif not understood and not ctx.failures:
        ctx.fail("the content could not be read completely")

    _check_extension(ctx, ext, kind, model)
    return True


def _referenced_by_onnx(path: str) -> bool:
    """True when an ONNX model in this folder or the one above keeps external data in ``path``
    (such files are raw tensor bytes, not unknown content)."""
    real = os.path.realpath(path)
    here = os.path.dirname(os.path.abspath(path))
    for folder in dict.fromkeys([here, os.path.dirname(here)]):
        try:
            names = sorted(n for n in os.listdir(folder) if n.lower().endswith(".onnx"))
        except OSError:
            continue
        for n in names[:32]:
            if real in _onnx_data_files(os.path.join(folder, n)):
                return True
    return False


def _onnx_data_files(onnx_path: str) -> frozenset[str]:
    try:
        st = os.stat(onnx_path)
    except OSError:
        return frozenset()
    key = (os.path.realpath(onnx_path), st.st_mtime_ns, st.st_size)
    hit = _ONNX_CACHE.get(key)
    if hit is None:
        from .formats import open_model
        try:
            with open_model(onnx_path) as m:
                hit = frozenset(os.path.realpath(t.file) for t in m.tensors
                                if t.file and os.path.realpath(t.file) != key[0])
        except Exception:  # noqa: BLE001 — a broken model references nothing
            hit = frozenset()
        if len(_ONNX_CACHE) > 256:
            _ONNX_CACHE.clear()
        _ONNX_CACHE[key] = hit
    return hit


_ONNX_CACHE: dict[tuple, frozenset[str]] = {}


def _read_archive(src: ByteSource):
    """The zip's `ZipArchive`, or the FormatError that reading it raised."""
    from .parsers import zipfmt
    try:
        return zipfmt.read_zip(src)
    except FormatError as e:
        return e


def _open_zip_archive(src: ByteSource, archive):
    """What ``tensorscope.open`` does with a zip, over the archive already read (or the error
    reading it raised)."""
    from .parsers import zip_dispatch
    if isinstance(archive, FormatError):
        raise archive
    return zip_dispatch.open_archive(src, archive)


def _open_with_parser(ctx: _Ctx, src: ByteSource | None = None, archive=None):
    """``tensorscope.open`` on the file: (model, error, format). Never raises. A zip is opened
    from ``archive`` (its `ZipArchive`, or the error reading it raised) over ``src``."""
    from .formats import open_model
    try:
        model = open_model(ctx.path) if archive is None else _open_zip_archive(src, archive)
    except UnknownFormat as e:
        return None, e, None
    except (TensorscopeError, OSError, ValueError) as e:
        return None, e, getattr(e, "format", None) or None
    except RecursionError as e:
        return None, e, None
    except Exception as e:  # noqa: BLE001 — a parser bug must not hide the byte-level findings
        return None, e, None
    return model, None, model.format


def _is_text(head: bytes) -> bool:
    if b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 4  # a character cut at the end of the sample
    return True


def _sniffs_as_safe_format(head: bytes, size: int) -> bool:
    if head[:4] == b"GGUF":
        return True
    if len(head) >= 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        return 0 < n <= size - 8
    return False


def _parser_error_finding(ctx: _Ctx, err: BaseException, understood: bool, kind: str) -> None:
    anomaly = getattr(err, "anomaly", None)
    if anomaly is not None and getattr(anomaly, "kind", "") == "onnx.external_path_escape":
        ctx.add(Severity.HIGH, "onnx.external-data-escape", anomaly.message,
                offset=anomaly.offset)
        return
    if isinstance(err, UnknownFormat):
        return  # the byte-level view decides
    if understood and kind in ("zip", "empty-zip", "pickle", "tar", "npy"):
        return  # every pickle was read at byte level; the parser only rejects the layout
    ctx.fail(f"{type(err).__name__ if not isinstance(err, TensorscopeError) else 'parser'}: {err}")


def _content_kind(head: bytes) -> str:
    if head[:4] == MAGIC_ZIP:
        return "zip"
    if head[:4] == MAGIC_EMPTY_ZIP:
        return "empty-zip"
    if head[:6] == MAGIC_NPY:
        return "npy"
    if head[:2] == MAGIC_GZIP:
        return "gzip"
    if head[:3] == MAGIC_BZ2 and head[3:4] in b"123456789":
        return "bz2"
    if head[:6] == MAGIC_XZ:
        return "xz"
    if head[:6] == MAGIC_7Z:
        return "7z"
    if head[:6] == MAGIC_RAR:
        return "rar"
    if head[:4] == MAGIC_ZSTD:
        return "zstd"
    if head[:2] in _ZLIB_HEADS:
        return "zlib"
    if head[:4] == b"ZF0x":
        return "zf"     # joblib < 0.10: "ZF" + hex length + a zlib stream
    if head[:3] == b"\x5d\x00\x00" and len(head) >= 13:
        return "lzma"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return "other"


def _check_extension(ctx: _Ctx, ext: str, kind: str, model) -> None:
    expected = _EXT_KIND.get(ext)
    actual = {"zip": "zip", "empty-zip": "zip", "npy": "npy", "pickle": "pickle", "tar": "tar",
              "gzip": "compressed", "bz2": "compressed", "xz": "compressed", "zlib": "compressed",
              "lzma": "compressed"}.get(kind, kind)
    if model is not None and actual in ("safe-format",):
        actual = model.format
    if actual in ("unknown", "7z", "rar", "zstd"):
        return
    if expected is None:
        if actual in _PICKLE_BEARING and ext not in ("", ".gz", ".bz2", ".xz", ".lzma", ".z", ".zlib"):
            name = "a zip archive" if actual == "zip" else f"{actual} content"
            ctx.add(Severity.MEDIUM, "file.extension-mismatch",
                    f"{name} that loaders will unpickle hides behind the extension {ext or '(none)'!r}")
        return
    if expected == actual or (expected == "torch" and actual in ("zip", "pickle", "tar")) or \
            (expected == "pickle" and actual in ("compressed", "zip")) or \
            (expected == "zip" and actual == "zip"):
        return
    if expected in _SAFE_KINDS and actual in _PICKLE_BEARING:
        ctx.add(Severity.HIGH, "file.extension-mismatch",
                f"named {ext} (a format without code) but holds {actual} content that loaders "
                "unpickle: the name misleads")
    else:
        ctx.add(Severity.LOW, "file.extension-mismatch",
                f"named {ext} but holds {actual} content (readers dispatch on content)")


# =================================================================================================
# Parser evidence

def _judge_model_evidence(ctx: _Ctx, model) -> None:
    ev = model.evidence
    for a in ev.anomalies:
        if ctx.blob_mode and a.kind.startswith("zip."):
            continue  # the whole-file zip view of a DCP shard; each blob was read on its own
        _anomaly_finding(ctx, a)
    for rec in ev.pickles:
        key = (rec.member, rec.offset)
        if key in ctx.judged:
            continue
        ctx.judged.add(key)
        base_abs = rec.member is None or rec.offset != 0 or _is_stored_abs(rec)
        _judge_result(ctx, rec.result, rec.member, rec.offset, "file" if base_abs else "member",
                      depth=0, role=rec.role)
    for member, text in ev.code.items():
        if "/code/" in f"/{member}" and member.endswith(".py"):
            _check_torchscript_code(ctx, member, text)
    domains = model.metadata.get("domains") if isinstance(model.metadata, dict) else None
    if domains and model.format == "onnx":
        for d in domains:
            if d not in policy.STANDARD_ONNX_DOMAINS:
                ctx.add(Severity.MEDIUM, "onnx.custom-domain",
                        f"operators from custom domain {d!r}: runtimes load a native custom-op "
                        "library to run them", trigger=str(d))


def _is_stored_abs(rec) -> bool:
    return rec.offset != 0


def _anomaly_finding(ctx: _Ctx, a, prefix: str | None = None, absolute: bool = True) -> None:
    kind = a.kind
    if kind in _BENIGN_ANOMALIES:
        return
    sev = ANOMALY_SEVERITY.get(kind)
    if sev is None:
        sev = Severity.INFO if kind.startswith(_CODE_FREE_PREFIXES) else _UNKNOWN_ANOMALY
    if kind == "onnx.external_path_escape":
        rule = "onnx.external-data-escape"
    else:
        rule = kind.replace("_", "-")
    member = _join(prefix, a.member)
    ctx.add(sev, rule, a.message, member, a.offset, None, "file" if absolute else "member")


def _join(prefix: str | None, member: str | None) -> str | None:
    if prefix and member:
        return f"{prefix}!{member}"
    return prefix or member


# =================================================================================================
# Zip archives

def _scan_zip(ctx: _Ctx, src: ByteSource, prefix: str | None, absolute: bool, depth: int,
              archive=None) -> bool:
    """Every member, judged by content. Returns True when everything could be read.
    ``archive``: the `ZipArchive` of ``src`` (or the error reading it raised) when already read."""
    if archive is None:
        archive = _read_archive(src)
    if isinstance(archive, FormatError):
        ctx.fail(f"zip{' ' + prefix if prefix else ''}: {archive.reason}")
        return False
    for a in archive.anomalies:
        _anomaly_finding(ctx, a, prefix, absolute)
    if archive.miniz_error:
        ctx.add(Severity.MEDIUM, "zip.torch-refuses",
                f"PyTorch's zip reader would refuse this archive ({archive.miniz_error}) while "
                "Python's zipfile opens it: readers disagree", prefix)
    ok = True
    referenced: set[str] = set()
    tp = archive.torch_prefix()
    members = [m for m in archive.members if not m.is_dir]

    def is_record(m) -> bool:
        # torch storage records: P/data/<key>, P/constants/<key>, P/traced_inputs/<key>
        if tp is None:
            return False
        parts = m.name.split("/")
        return len(parts) == 3 and parts[0] == tp and parts[1] in ("data", "constants", "traced_inputs")

    flagged = [(m, is_record(m)) for m in members]
    for m, record in [f for f in flagged if not f[1]] + [f for f in flagged if f[1]]:
        name = _join(prefix, m.name)
        if record:
            if m.name.split("/", 1)[1] in referenced:
                continue  # a storage: torch reads its bytes raw, never unpickles them
        if m.error and m.is_encrypted and m.is_stored and \
                0 <= m.data_offset <= m.data_offset + m.compressed_size <= src.size:
            # flagged encrypted but STORED: the bytes are plain; a reader ignoring the flag
            # unpickles them (picklescan GHSA-w8jq-xcqf-f792), so they are scanned.
            data = src.buffer[m.data_offset:m.data_offset + m.compressed_size]
            _scan_blob(ctx, data, name, m.data_offset, absolute, depth,
                       strict=not m.name.lower().endswith(_PICKLE_MEMBER_SUFFIXES))
            continue
        if m.error:
            ctx.add(Severity.HIGH, "zip.member-unreadable",
                    f"member cannot be read ({m.error}): its content is not scanned", name,
                    m.header_offset if absolute else None, base="file" if absolute else "member")
            ok = False
            continue
        if m.is_encrypted and not m.is_stored:
            ok = False
            continue  # zip.encrypted_member already says it; the bytes are not readable
        # A STORED member flagged encrypted is still read: PyTorch's reader ignores the flag
        # (picklescan GHSA-w8jq-xcqf-f792).
        try:
            if m.is_stored:
                data = archive.data(m)
                base, abs_member = m.data_offset, absolute
            else:
                data = memoryview(archive.read_bytes(m, ctx.limits.max_decompressed))
                base, abs_member = 0, False
        except FormatError as e:
            if "exceeds the limit" in str(e):
                ctx.add(Severity.HIGH, "file.decompression-limit",
                        f"member inflates past {ctx.limits.max_decompressed} bytes: not scanned", name)
            else:
                ctx.add(Severity.HIGH, "zip.member-unreadable",
                        f"member cannot be read ({e.reason}): its content is not scanned", name)
            ok = False
            continue
        if not len(data):
            continue
        if m.name.endswith(".py") and "/code/" in f"/{m.name}":
            try:
                text = bytes(data).decode("utf-8")
            except UnicodeDecodeError:
                text = bytes(data).decode("latin-1")
            _check_torchscript_code(ctx, name, text)
            continue
        lenient = not record and m.name.lower().endswith(_PICKLE_MEMBER_SUFFIXES)
        pids = _scan_blob(ctx, data, name, base, abs_member, depth, strict=not lenient)
        if pids is False:
            ok = False
        elif isinstance(pids, set):
            referenced |= pids
    return ok


def _dcp_blobs(path: str) -> list[tuple[int, int]] | None:
    """(offset, length) of each torch.save blob in a DCP shard, from the ``.metadata`` next to it
    (``storage_data`` maps each item to ``_StorageInfo(relative_path, offset, length)``)."""
    meta = os.path.join(os.path.dirname(os.path.abspath(path)), ".metadata")
    if not os.path.isfile(meta) or os.path.abspath(meta) == os.path.abspath(path):
        return None
    from .parsers.pickle_vm import Call
    try:
        with ByteSource(meta) as src:
            from .parsers import pickle_vm
            r = pickle_vm.run(src.buffer, hooks=pickle_vm.CONTAINER_HOOKS)
            value = r.value
    except (OSError, FormatError):
        return None
    state = getattr(value, "state", None)
    storage = state.get("storage_data") if isinstance(state, dict) else None
    if not isinstance(storage, dict):
        return None
    name = os.path.basename(path)
    blobs = set()
    for info in storage.values():
        st = info.state if isinstance(info, Call) else None
        if isinstance(st, dict) and st.get("relative_path") == name:
            off, length = st.get("offset"), st.get("length")
            if isinstance(off, int) and isinstance(length, int) and off >= 0 and length > 0:
                blobs.add((off, length))
    return sorted(blobs) or None


def _scan_dcp_blobs(ctx: _Ctx, src: ByteSource, blobs: list[tuple[int, int]]) -> bool:
    ok = True
    covered = 0
    for off, length in blobs:
        name = f"<blob at byte {off}>"
        if off + length > src.size:
            ctx.fail(f"DCP item at byte {off} ({length} bytes) runs past the end of the file")
            ok = False
            continue
        if off > covered:
            ctx.add(Severity.MEDIUM, "zip.unaccounted-bytes",
                    f"{off - covered} bytes at {covered}..{off} belong to no checkpoint item",
                    None, covered)
        covered = max(covered, off + length)
        view = src.buffer[off:off + length]
        if bytes(view[:4]) == MAGIC_ZIP:
            ok &= _scan_zip(ctx, ByteSource.from_bytes(view, name=ctx.path), name, False, 1)
        else:
            ok &= _scan_blob(ctx, view, name, off, True, 1, strict=False) is not False
    if covered < src.size:
        ctx.add(Severity.MEDIUM, "zip.unaccounted-bytes",
                f"{src.size - covered} bytes after the last checkpoint item", None, covered)
    return ok


def _scan_blob(ctx: _Ctx, data: memoryview, member: str | None, base: int, absolute: bool,
               depth: int, strict: bool):
    """A member or nested payload judged by its content. Returns the storage keys its pickles
    reference (a set), True when read, False when it could not be read."""
    if depth > ctx.limits.max_depth:
        ctx.add(Severity.HIGH, "file.unparseable", "archives nest deeper than the scan limit: "
                "the innermost content is not scanned", member)
        return False
    head = bytes(data[:300])
    kind = _content_kind(head)
    if kind in ("zip", "empty-zip"):
        inner = ByteSource.from_bytes(data, name=ctx.path)
        return _scan_zip(ctx, inner, member, False, depth + 1)
    if kind == "npy":
        return _scan_npy(ctx, data, member, base, absolute, depth)
    if kind in ("gzip", "bz2", "xz", "zlib", "lzma"):
        return _scan_compressed(ctx, data, kind, member, depth)
    if kind in ("7z", "rar", "zstd"):
        ctx.add(Severity.HIGH, "file.unsupported-archive",
                f"{kind} archive inside: its content is not scanned", member)
        return True
    if kind == "tar":
        return _scan_tar(ctx, data, member, depth, base, absolute)
    if strict and len(data) <= 4096 and _cannot_import(bytes(data)):
        # a record that may or may not be a pickle but holds no opcode that imports anything
        # (GLOBAL 'c', INST 'i', STACK_GLOBAL, EXT1/2/4): it cannot make a loader run code
        return True
    keys: set[str] = set()
    is_pickle, ok = _scan_pickle_file(ctx, data, member, base, absolute, depth, lenient=not strict,
                                      keys=keys)
    return keys if ok else False


# =================================================================================================
# Pickle streams

def _looks_like_pickle(r) -> bool:
    return bool(r.stopped or r.globals or r.protocol is not None and r.opcodes > 2)


def _vm_run(ctx: _Ctx, data, start: int, member: str | None, base: int, joblib: bool = True):
    """One pickle as its loader reads it: joblib's array placeholders are followed by raw array
    bytes that joblib.load reads (parsers/joblib_fmt.py); ``joblib=False`` reads as pickle.load."""
    from .parsers import joblib_fmt, pickle_vm
    kwargs = {} if ctx.vm_limits is None else {"limits": ctx.vm_limits}
    if joblib:
        kwargs["build_hooks"] = joblib_fmt.build_hooks(data)
    return pickle_vm.run(data, start=start, hooks=pickle_vm.CONTAINER_HOOKS, file=ctx.path,
                         member=member, base_offset=base, **kwargs)


def _check_joblib_bytes(ctx: _Ctx, data, r, member: str | None, base: int,
                        offset_base: str) -> None:
    """A joblib file read by pickle.load instead: the inline array bytes become opcodes. Bytes
    crafted to import something dangerous that way hide from a joblib-only reading, so that
    reading is judged too (denied names only: real array bytes decode as junk, never as them)."""
    from .parsers import joblib_fmt
    if not any((g.module, g.name) in joblib_fmt.ARRAY_WRAPPERS for g in r.globals):
        return
    seen = {g.pos for g in r.globals}
    plain = _vm_run(ctx, data, 0, member, base, joblib=False)
    for g in plain.globals:
        v = policy.classify(g.module, g.name)
        if g.pos not in seen and v.category == policy.DENIED:
            ctx.add(Severity.CRITICAL, "pickle.dangerous-global",
                    f"read by pickle.load instead of joblib.load, the bytes after a joblib array "
                    f"placeholder are opcodes that import {v.dotted}: {v.reason}", member,
                    base + g.pos, v.dotted, offset_base)


def _scan_pickle_file(ctx: _Ctx, data, member: str | None, base: int, absolute: bool,
                      depth: int, lenient: bool, keys: set | None = None,
                      require_stop: bool = False) -> tuple[bool, bool]:
    """Read pickles from ``data[0]`` as loaders do. Returns (is a pickle, fully understood).

    ``lenient``: the content is expected to be a pickle (its name says so, or the user named it),
    so a broken first pickle still counts as one.
    """
    offset_base = "file" if absolute else "member"
    cached = ctx.reused.get((member, base))
    r = cached if cached is not None else _vm_run(ctx, data, 0, member, base)
    if not _looks_like_pickle(r) or (require_stop and not r.stopped) or \
            (not lenient and not (r.stopped or r.globals)):
        if r.opcodes >= 1 and lenient and len(data) < (1 << 20) and r.error is not None and \
                _plausible_pickle_start(data):
            # a pickle the VM cannot read at all: never clean
            ctx.fail(f"pickle{(' ' + member) if member else ''}: {r.error.reason if hasattr(r.error, 'reason') else r.error}")
            return True, False
        return False, True
    understood = True
    _check_joblib_bytes(ctx, data, r, member, base, offset_base)
    results = [(0, r)]
    legacy = r.stopped and r.value == LEGACY_MAGIC
    pos = r.end
    n = 1
    if legacy:
        # torch's legacy stream: magic, protocol, sys_info, main, storage keys, then raw data.
        while n < 5 and r.stopped and pos < len(data):
            r = _vm_run(ctx, data, pos, member, base)
            results.append((pos, r))
            pos = r.end
            n += 1
    else:
        while r.stopped and pos < len(data) and n < ctx.limits.max_streams:
            nxt = _vm_run(ctx, data, pos, member, base)
            if not _looks_like_pickle(nxt):
                tail = len(data) - pos
                if bytes(data[pos:pos + 64]).strip(b"\x00 \n\r\t"):
                    ctx.add(Severity.LOW, "pickle.trailing-data",
                            f"{tail} bytes follow the pickle's STOP (pickle.load ignores them; "
                            "they do not parse as another pickle)", member, base + pos, None,
                            offset_base)
                break
            ctx.add(Severity.MEDIUM, "pickle.multiple-streams",
                    f"another pickle starts after STOP at byte {base + pos}: pickle.load reads only "
                    "the first, torch.load's legacy path and other readers read on (scanned)",
                    member, base + pos, None, offset_base)
            results.append((pos, nxt))
            r = nxt
            pos = r.end
            n += 1
    for start, res in results:
        ctx.judged.add((member, base + start))
        if not _judge_result(ctx, res, member, base, offset_base, depth, keys=keys,
                             role="legacy" if legacy else "pickle"):
            understood = False
    return True, understood


def _plausible_pickle_start(data) -> bool:
    b = bytes(data[:2])
    return b[:1] == b"\x80" or b[:1] in (b"(", b"c", b"}", b"]", b")", b"\x95")


def _judge_result(ctx: _Ctx, r, member: str | None, base: int, offset_base: str, depth: int,
                  keys: set | None = None, role: str = "pickle") -> bool:
    """Findings for one VM result. Returns False when the pickle broke (partial results kept)."""
    from .parsers.pickle_vm import DYNAMIC, Call, Global, PersistentRef
    out: list[tuple] = []

    # how each global is used: calls keyed by the Global object's position
    uses: dict[int, list] = {}
    module_calls: set[int] = set()
    for c in r.calls:
        if c.opcode in _CONTAINER_OPS:
            continue
        f = c.func
        cls = _module_pid_class(f) if isinstance(f, PersistentRef) else None
        if cls is not None:
            # torch's legacy format saves a module class as the persistent id ('module', cls,
            # source_file, source); persistent_load returns cls and the pickle instantiates it.
            uses.setdefault(cls.pos, []).append(_Instantiate(c.pos))
            module_calls.add(id(c))
            continue
        if isinstance(f, Global):
            uses.setdefault(f.pos, []).append(c)
            if _call_facts(f.module, f.name)[0]:
                if c.args and isinstance(c.args[0], Global):
                    uses.setdefault(c.args[0].pos, []).append(_Instantiate(c.pos))

    # 1. globals
    per_name: dict[str, list] = {}
    for g in r.globals:
        if DYNAMIC in (g.module, g.name):
            out.append((Severity.CRITICAL, "pickle.dynamic-global",
                        f"imports {g.module}.{g.name}: a name computed while loading (only running "
                        "the pickle would tell what it imports)", base + g.pos, None))
            continue
        v = policy.classify(g.module, g.name)
        if v.category == policy.ALLOWED:
            continue
        calls = uses.get(g.pos, [])
        at = base + g.pos
        if v.category == policy.DENIED:
            if calls and _is_loader(g.module, g.name):
                continue  # reported once, as the second stage it starts
            what = _usage_text(calls)
            out.append((Severity.CRITICAL, "pickle.dangerous-global",
                        f"{'calls' if calls else 'imports'} {v.dotted}{what}: {v.reason}"
                        + (f" (written as {g.module} {g.name})" if v.dotted != f"{g.module}.{g.name}" else ""),
                        at, v.dotted))
            continue
        per_name.setdefault((v.category, v.dotted, v.reason), []).append((g, calls))
    for (category, dotted, reason), occurrences in per_name.items():
        g0 = occurrences[0][0]
        at = base + g0.pos
        times = f" ({len(occurrences)} times)" if len(occurrences) > 1 else ""
        calls = [c for _, cs in occurrences for c in cs]
        if category == policy.FRAMEWORK:
            out.append((Severity.INFO, "pickle.framework-class",
                        f"names {dotted}{times}: {reason}", at, dotted))
            continue
        string_call = next((c for c in calls if not isinstance(c, _Instantiate) and _has_string(c)), None)
        if string_call is not None:
            out.append((Severity.HIGH, "pickle.unknown-call-string",
                        f"calls {dotted} (outside the allowlist) with a string from the file"
                        f"{_usage_text([string_call])}{times}", base + string_call.pos, dotted))
        elif calls and all(isinstance(c, _Instantiate) or not c.args and not c.kwargs for c in calls):
            out.append((Severity.MEDIUM, "pickle.user-class",
                        f"loading imports user code: {dotted} is instantiated{times} (a class "
                        "outside torch and the allowlist)", at, dotted))
        elif calls:
            out.append((Severity.MEDIUM, "pickle.unknown-call",
                        f"calls {dotted} (outside the allowlist){_usage_text(calls[:1])}{times}",
                        base + calls[0].pos, dotted))
        elif _is_user_module(dotted):
            out.append((Severity.MEDIUM, "pickle.user-class",
                        f"loading imports user code: module {dotted.rsplit('.', 1)[0]} is imported "
                        f"for {dotted}{times} (its top-level code runs on import)", at, dotted))
        else:
            out.append((Severity.LOW, "pickle.unknown-import",
                        f"imports {dotted} (outside the allowlist) without calling it{times}",
                        at, dotted))

    for at, what in r.reader_disagreements:
        out.append((Severity.CRITICAL, "pickle.reader-disagreement",
                    f"CPython's readers disagree on these bytes ({what}): opcodes can hide from "
                    "this scan's reading", base + at, None))

    # 2. calls of things that are not globals; second stages
    for c in r.calls:
        f = c.func
        if c.opcode in _CONTAINER_OPS or id(c) in module_calls:
            continue
        if isinstance(f, Call):
            inner = f.func.dotted if isinstance(f.func, Global) else type(f.func).__name__
            out.append((Severity.HIGH, "pickle.indirect-call",
                        f"calls the result of another call ({inner}(...)(...)): a gadget chain",
                        base + c.pos, inner))
        elif not isinstance(f, Global):
            out.append((Severity.HIGH, "pickle.indirect-call",
                        f"calls a {type(f).__name__} object pushed by the pickle itself", base + c.pos,
                        None))
        if isinstance(f, Global):
            _, loader, dotted = _call_facts(f.module, f.name)
            if loader:
                payloads = [p for p in (_unwrap_bytes(a) for a in c.args) if p]
                findings_before, failures_before = len(ctx.findings), len(ctx.failures)
                for p in payloads:
                    _scan_second_stage(ctx, p, member, c.pos, depth)
                inner_clean = bool(payloads) and len(ctx.failures) == failures_before and all(
                    x.severity <= Severity.INFO for x in ctx.findings[findings_before:])
                if dotted == "torch.storage._load_from_bytes" and inner_clean:
                    # What torch itself writes for pickle.dumps(tensor) (Storage.__reduce__): the
                    # nested torch.load runs a checkpoint we scanned completely and found clean.
                    out.append((Severity.LOW, "pickle.torch-storage-bytes",
                                f"torch's own tensor pickling: hands a {len(payloads[0])}-byte legacy "
                                f"checkpoint to {dotted} (torch.load without weights_only); that "
                                "checkpoint was scanned and is clean", base + c.pos, dotted))
                    continue
                out.append((Severity.CRITICAL, "pickle.second-stage",
                            f"hands {'a ' + str(len(payloads[0])) + '-byte payload' if payloads else 'data'} "
                            f"to {dotted}: a second stage"
                            + (" (scanned too)" if payloads else ""), base + c.pos, dotted))
                continue
        for a in c.args if isinstance(c.args, tuple) else ():
            if isinstance(a, (bytes, bytearray)) and len(a) >= 8 and a[:1] == b"\x80" and a[1:2] and a[1] <= 5:
                _scan_second_stage(ctx, bytes(a), member, c.pos, depth)

    # 3. persistent ids (torch storages) -> keys of records that are raw data
    for pid, _pos in r.persistent_ids:
        if keys is not None and isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
            keys.add(f"data/{pid[2]}")
            keys.add(f"constants/{pid[2]}")
            keys.add(f"traced_inputs/{pid[2]}")

    # 4. a broken pickle: what ran before the break counts
    ok = True
    if r.error is not None:
        ok = False
        err = r.error
        reason = getattr(err, "reason", str(err))
        at = getattr(err, "offset", None)
        out.append((Severity.HIGH, "pickle.parse-error",
                    f"the pickle breaks ({reason}); a loader runs every opcode before the break, "
                    f"so the {len(r.globals)} globals and {len(r.calls)} calls before it are reported",
                    at if at is not None else base + r.end, None))
    elif not r.stopped:
        ok = False
        out.append((Severity.HIGH, "pickle.parse-error", "the pickle ends without STOP",
                    base + r.end, None))

    cap = ctx.limits.max_findings_per_pickle
    for sev, rule, msg, at, trig in out[:cap]:
        ctx.add(sev, rule, msg, member, at, trig, offset_base)
    if len(out) > cap:
        worst = max(o[0] for o in out[cap:])
        ctx.add(worst, "pickle.unknown-call", f"{len(out) - cap} more findings in this pickle "
                "(not listed)", member, None, None, offset_base)
    return ok


def _is_loader(module: str, name: str) -> bool:
    return _call_facts(module, name)[1]


# Opcodes recorded as calls that only fill containers (no callable runs).
_CONTAINER_OPS = frozenset({"BUILD", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS"})
_COPYREG_CONSTRUCTORS = (("copyreg", "_reconstructor"), ("copyreg", "__newobj__"),
                         ("copyreg", "__newobj_ex__"))
_FACTS: dict[tuple, tuple[bool, bool, str]] = {}


def _call_facts(module, name) -> tuple[bool, bool, str]:
    """(transparent constructor, loader, normalised dotted name) of a called global; memoised,
    since a checkpoint calls the same few rebuild functions thousands of times."""
    key = (module, name)
    try:
        hit = _FACTS.get(key)
    except TypeError:  # an unhashable name (never from our VM; be safe)
        hit, key = None, None
    if hit is not None:
        return hit
    norm = policy.normalize(module, name)
    dotted = ".".join(norm)
    transparent = f"{module}.{name}" in policy.TRANSPARENT_CONSTRUCTORS or \
        norm in _COPYREG_CONSTRUCTORS
    loader = dotted in policy.LOADER_CALLS or f"{module}.{name}" in policy.LOADER_CALLS or \
        dotted.replace("_pickle.", "pickle.", 1) in policy.LOADER_CALLS
    hit = (transparent, loader, dotted)
    if key is not None:
        if len(_FACTS) >= 4096:  # hostile pickles name many globals: keep the memo bounded
            _FACTS.clear()
        _FACTS[key] = hit
    return hit


def _module_pid_class(f):
    from .parsers.pickle_vm import Global, PersistentRef
    if isinstance(f, PersistentRef) and isinstance(f.pid, tuple) and len(f.pid) >= 2 and \
            f.pid[0] in ("module", b"module") and isinstance(f.pid[1], Global):
        return f.pid[1]
    return None


class _Instantiate:
    """A use of a class through copyreg._reconstructor / __newobj__ (an instantiation)."""

    __slots__ = ("pos",)
    args = ()
    kwargs = None

    def __init__(self, pos: int):
        self.pos = pos


# Top-level packages whose import runs only library code (a LOW finding when merely imported).
_KNOWN_PACKAGES = frozenset({"torch", "numpy", "scipy", "pandas", "sklearn", "transformers",
                             "safetensors", "onnx", "ml_dtypes", "collections", "typing"})


def _is_user_module(dotted: str) -> bool:
    import sys
    root = dotted.split(".", 1)[0]
    return root not in sys.stdlib_module_names and root not in _KNOWN_PACKAGES and \
        root not in ("builtins", "__builtin__", "copy_reg")


def _has_string(c) -> bool:
    def walk(v, depth=0):
        if depth > 4:
            return False
        if isinstance(v, str):
            return True
        if isinstance(v, (tuple, list)):
            return any(walk(x, depth + 1) for x in v[:64])
        return False
    return walk(c.args) or bool(c.kwargs and walk(tuple(c.kwargs.values())))


def _usage_text(calls) -> str:
    for c in calls:
        if isinstance(c, _Instantiate):
            return " (instantiated)"
        parts = []
        for a in (c.args if isinstance(c.args, tuple) else ())[:3]:
            parts.append(_short_repr(a))
        return f"({', '.join(parts)}{', ...' if len(c.args) > 3 else ''})"
    return ""


def _short_repr(v) -> str:
    if isinstance(v, (str, bytes, int, float, bool)) or v is None:
        s = repr(v)
    else:
        s = type(v).__name__ if not hasattr(v, "dotted") else v.dotted
        if type(v).__name__ == "Call":
            f = v.func
            s = f"{getattr(f, 'dotted', type(f).__name__)}(...)"
    return s if len(s) <= 60 else s[:57] + "..."


def _unwrap_bytes(v, depth: int = 0) -> bytes | None:
    """The bytes a loader would read from an argument: plain bytes, or bytes behind wrappers
    (``io.BytesIO(...)``, ``_codecs.encode(s, 'latin1')``, ``base64.b64decode(...)``)."""
    from .parsers.pickle_vm import Call, Global
    if depth > 6:
        return None
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("latin-1", "replace")
    if isinstance(v, Call) and isinstance(v.func, Global) and v.args:
        dotted = ".".join(policy.normalize(v.func.module, v.func.name))
        inner = _unwrap_bytes(v.args[0], depth + 1)
        if inner is None:
            return None
        try:
            if "b64decode" in dotted or "decodebytes" in dotted or "a2b_base64" in dotted:
                return base64.b64decode(inner, validate=False)
            if "b85decode" in dotted:
                return base64.b85decode(inner)
            if "a85decode" in dotted:
                return base64.a85decode(inner)
            if "b32decode" in dotted:
                return base64.b32decode(inner)
            if "unhexlify" in dotted or "a2b_hex" in dotted:
                return binascii.unhexlify(inner)
            if dotted in ("zlib.decompress", "gzip.decompress", "bz2.decompress", "lzma.decompress"):
                return _bounded_decompress(dotted.split(".")[0], inner, 64 << 20)
            if dotted in ("codecs.decode",) and len(v.args) > 1 and "base64" in str(v.args[1]):
                return base64.b64decode(inner, validate=False)
        except (ValueError, binascii.Error, zlib.error, OSError, EOFError, lzma.LZMAError):
            return None
        return inner
    return None


def _scan_second_stage(ctx: _Ctx, payload: bytes, member: str | None, pos: int, depth: int) -> None:
    if depth + 1 > ctx.limits.max_depth:
        ctx.add(Severity.HIGH, "file.unparseable", "second stages nest deeper than the scan limit",
                member, pos, base="member")
        return
    name = _join(member, f"<second stage at byte {pos}>")
    _scan_blob(ctx, memoryview(payload), name, 0, False, depth + 1, strict=False)


# =================================================================================================
# NumPy, tar, compression

def _scan_npy(ctx: _Ctx, data, member: str | None, base: int, absolute: bool, depth: int) -> bool:
    from .parsers import numpy_fmt
    try:
        h = numpy_fmt.parse_header(data, file=ctx.path, member=member, base=base)
    except FormatError as e:
        ctx.fail(f"npy{(' ' + member) if member else ''}: {e.reason}")
        return False
    if h.layout != "object":
        return True
    ctx.add(Severity.INFO, "pickle.object-array",
            "object array: its data is a pickle (np.load needs allow_pickle=True); scanned",
            member, base + h.data_start, None, "file" if absolute else "member")
    payload = data[h.data_start:]
    is_pickle, ok = _scan_pickle_file(ctx, payload, member, base + h.data_start, absolute, depth,
                                      lenient=True)
    return ok


def _bounded_decompress(kind: str, data, cap: int) -> bytes:
    if kind in ("gzip", "zlib"):
        d = zlib.decompressobj(47 if kind == "gzip" else 15)
    elif kind == "bz2":
        d = bz2.BZ2Decompressor()
    elif kind in ("xz", "lzma"):
        d = lzma.LZMADecompressor()
    else:
        raise ValueError(kind)
    out = bytearray()
    chunk = 1 << 20
    mv = memoryview(data)
    for i in range(0, len(mv), chunk):
        piece = bytes(mv[i:i + chunk])
        while piece:
            if kind in ("gzip", "zlib"):
                got = d.decompress(piece, cap + 1 - len(out))
                if not got and len(d.unconsumed_tail) == len(piece):
                    raise ValueError(f"{kind} stream makes no progress")  # would spin forever
                piece = d.unconsumed_tail
            else:
                got = d.decompress(piece, cap + 1 - len(out))
                piece = b""
            out += got
            if len(out) > cap:
                raise OverflowError(cap)
            if getattr(d, "eof", False):
                return bytes(out)
            if kind not in ("gzip", "zlib") and not got:
                break
        if kind not in ("gzip", "zlib") and not d.needs_input and not d.eof:
            while len(out) <= cap and not d.eof:
                got = d.decompress(b"", cap + 1 - len(out))
                if not got:
                    break
                out += got
            if len(out) > cap:
                raise OverflowError(cap)
    return bytes(out)


def _scan_compressed(ctx: _Ctx, data, kind: str, member: str | None, depth: int) -> bool:
    try:
        inner = _bounded_decompress(kind, data, ctx.limits.max_decompressed)
    except OverflowError:
        ctx.add(Severity.HIGH, "file.decompression-limit",
                f"{kind} stream inflates past {ctx.limits.max_decompressed} bytes: not scanned "
                "further (a decompression bomb or a huge payload)", member)
        return True
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError) as e:
        ctx.fail(f"{kind} stream is corrupt: {e}")
        return False
    name = _join(member, f"<{kind}>")
    res = _scan_blob(ctx, memoryview(inner), name, 0, False, depth + 1, strict=False)
    return res is not False


# Bytes per element of the legacy tar form's storage types.
_STORAGE_ITEMSIZE: dict[str, int] = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
                     "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8,
                     "ComplexDouble": 16}


def _scan_tar(ctx: _Ctx, data, member: str | None, depth: int, base: int = 0,
              absolute: bool = True) -> bool:
    """torch's legacy tar form (members ``sys_info``, ``pickle``, ``tensors``, ``storages``) or any
    tar: every member judged by content; ``storages`` and ``tensors`` walked record by record as
    torch's ``legacy_load`` reads them. Only headers are parsed (tarfile over the bytes); member
    data are zero-copy slices."""
    import tarfile  # only tars need it (2 ms of start-up otherwise)
    ok = True
    try:
        fileobj = _MemReader(data)
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            infos = tar.getmembers()
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        ctx.fail(f"tar archive: {e}")
        return False
    for info in infos:
        name = _join(member, info.name)
        if info.issym() or info.islnk():
            ctx.add(Severity.MEDIUM, "file.symlink-outside",
                    f"tar member is a link to {info.linkname!r}", name)
            continue
        if not info.isfile():
            continue
        start, size = info.offset_data, info.size
        if start + size > len(data):
            ctx.fail(f"tar member {info.name!r} runs past the end of the archive")
            ok = False
            continue
        raw = data[start:start + size]
        mbase = base + start if absolute else start
        if info.name == "storages":
            ok &= _scan_legacy_records(ctx, raw, name, mbase, absolute, depth, "storages")
        elif info.name == "tensors":
            ok &= _scan_legacy_records(ctx, raw, name, mbase, absolute, depth, "tensors")
        else:
            res = _scan_blob(ctx, raw, name, mbase, absolute, depth + 1,
                             strict=info.name not in ("pickle", "sys_info"))
            ok &= res is not False
    return ok


class _MemReader(io.RawIOBase):
    """A read-only file over a memoryview, so tarfile can parse headers without a copy."""

    def __init__(self, data):
        self._data = memoryview(data)
        self._pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, pos, whence=0):
        base = {0: 0, 1: self._pos, 2: len(self._data)}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, b):
        n = max(0, min(len(b), len(self._data) - self._pos))
        b[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n


def _scan_legacy_records(ctx: _Ctx, data, member: str, base: int, absolute: bool, depth: int,
                         which: str) -> bool:
    """The legacy tar's ``storages`` (count; per storage a pickle + int64 numel + raw bytes;
    then a pickle of storage views) and ``tensors`` (count; per tensor a pickle + int32 ndim,
    4 bytes, ndim int64 sizes, ndim int64 strides, int64 offset) streams."""
    ob = "file" if absolute else "member"

    def one(pos):
        key = (member, base + pos)
        r = _vm_run(ctx, data, pos, member, base)
        if key not in ctx.judged:
            ctx.judged.add(key)
            _judge_result(ctx, r, member, base, ob, depth)
        return r

    r = one(0)
    if not r.stopped or not isinstance(r.value, int) or isinstance(r.value, bool):
        return False
    pos = r.end
    for _ in range(min(r.value, 10_000_000)):
        rec = one(pos)
        if not rec.stopped:
            return False
        pos = rec.end
        if which == "tensors":
            if pos + 8 > len(data):
                break
            ndim = struct.unpack_from("<i", data, pos)[0]
            if ndim < 0 or pos + 8 + 16 * ndim + 8 > len(data):
                ctx.fail(f"{member}: tensor record at byte {base + pos} claims {ndim} dimensions")
                return False
            pos += 8 + 16 * ndim + 8
            continue
        value = rec.value
        cls = value[2] if isinstance(value, tuple) and len(value) == 3 else None
        name = getattr(cls, "name", "")
        itemsize = _STORAGE_ITEMSIZE.get(name[:-len("Storage")] if name.endswith("Storage") else "")
        if itemsize is None or pos + 8 > len(data):
            ctx.fail(f"{member}: cannot follow storage records past byte {base + pos}")
            return False
        count = _I64.unpack_from(data, pos)[0]
        if count < 0 or count * itemsize > len(data) - pos - 8:
            ctx.fail(f"{member}: storage record at byte {base + pos} claims {count} elements")
            return False
        pos += 8 + count * itemsize
    if which == "storages" and pos < len(data):
        views = one(pos)   # the storage views list
        if not views.stopped:
            return False
        pos = views.end
    if pos < len(data) and bytes(data[pos:pos + 64]).strip(b"\x00"):
        ctx.add(Severity.LOW, "pickle.trailing-data",
                f"{len(data) - pos} bytes after the last record (torch.load ignores them)",
                member, base + pos, None, ob)
    return True


# =================================================================================================
# Polyglots

def _scan_polyglot_zip(ctx: _Ctx, src: ByteSource, kind: str) -> None:
    """A zip that Python's zipfile (and scanners built on it) would find behind another head."""
    tail = bytes(src.buffer[max(0, src.size - 65557):])
    if MAGIC_EMPTY_ZIP not in tail:
        return
    from .parsers import zipfmt
    try:
        archive = zipfmt.read_zip(src)
    except FormatError:
        return
    if not archive.members:
        return
    ctx.add(Severity.HIGH, "file.polyglot",
            f"the file reads as {kind} from its head (what torch.load/np.load see) but Python's "
            f"zipfile also finds a zip archive of {len(archive.members)} members in it: scanned too")
    _scan_zip(ctx, src, "<zip view>", True, 1)


# =================================================================================================
# TorchScript code

_TS_OK_ROOTS = {"torch", "ops", "__torch__", "CONSTANTS", "annotate", "uninitialized",
                "unchecked_cast", "isinstance", "getattr", "hasattr", "len", "int", "float", "bool",
                "str", "range", "enumerate", "zip", "min", "max", "abs", "round", "print", "list",
                "dict", "tuple", "sorted", "sum", "divmod", "chr", "ord", "hash", "id", "math",
                "warnings", "RuntimeError", "AssertionError", "ValueError", "Exception",
                "NotImplementedError", "IndexError", "KeyError", "TypeError", "StopIteration",
                "ZeroDivisionError", "fork", "wait", "_unwrap_optional", "complex", "all", "any",
                "reversed", "divmod", "bin", "hex", "oct", "super", "Tensor", "Optional", "List",
                "Dict", "Tuple", "Union", "Future", "Any", "NoneType", "Device", "__is__",
                "__isnot__", "__not__", "__contains__", "__getitem__", "__range_length",
                "__derive_index", "__interpolate", "_list_with_default", "uninitialized", "self"}
_TS_DANGER_ROOTS = {"os", "sys", "subprocess", "builtins", "eval", "exec", "open", "__import__",
                    "compile", "socket", "importlib", "pickle", "marshal", "ctypes", "shutil"}
_STANDARD_OP_NAMESPACES = {"aten", "prim", "quantized", "_quantized", "quantized_decomposed",
                           "profiler", "_caffe2", "sparse", "prepacked", "_test", "cuda", "mkldnn",
                           "mkldnn_prepacked", "xnnpack", "_nnapi", "vulkan", "metal", "onednn"}


_TS_SAFE_IMPORT_ROOTS = ("torch", "__torch__", "typing", "__future__", "math", "warnings")


def _code_tokens(text: str):
    """Python tokens of a code file, via the pure-Python tokenizer: nothing is compiled (the
    `compile` audit event never fires) and deep nesting cannot exhaust the C parser's stack."""
    import io
    import tokenize
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING)
    return [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in skip]


def _code_calls_and_bindings(tokens):
    """(calls, bound, imports): dotted call targets with their line, locally bound names, and
    imported module names. A call is ``NAME(.NAME)* (`` not preceded by ``.`` or ``def``/``class``."""
    import keyword
    import tokenize
    calls, bound, imports = [], set(), []
    n = len(tokens)
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.NAME:
            continue
        prev = tokens[i - 1].string if i else ""
        nxt = tokens[i + 1].string if i + 1 < n else ""
        if prev in ("def", "class"):
            bound.add(tok.string)
            continue
        if prev == "." or (keyword.iskeyword(tok.string) and tok.string not in ("import", "from")):
            continue  # the middle of a dotted chain (handled from its root), or `return (`
        if tok.string in ("import", "from"):
            j, parts = i + 1, []
            while j < n and (tokens[j].type == tokenize.NAME or tokens[j].string == "."):
                if tokens[j].string in ("import", "as"):
                    break
                parts.append(tokens[j].string)
                j += 1
            imports.append(("".join(parts), tok.start[0]))
            continue
        if nxt in ("=", ":", ",", ")") and prev in ("(", ",", "for", "as", "") or nxt in ("=", ":"):
            bound.add(tok.string)  # assignment targets, parameters, loop and `as` names
        if prev in ("for", "as"):
            bound.add(tok.string)
        j, parts = i, [tok.string]
        while j + 2 < n and tokens[j + 1].string == "." and tokens[j + 2].type == tokenize.NAME:
            parts.append(tokens[j + 2].string)
            j += 2
        if j + 1 < n and tokens[j + 1].string == "(":
            calls.append((".".join(parts), tok.start[0]))
    return calls, bound, imports


def _check_torchscript_code(ctx: _Ctx, member: str, text: str) -> None:
    """Calls in a TorchScript ``code/`` file must stay within torch, ops and the builtins."""
    import tokenize
    try:
        tokens = _code_tokens(text)
    except (tokenize.TokenError, SyntaxError, ValueError, MemoryError) as e:
        ctx.add(Severity.HIGH, "torchscript.code-unparseable", f"code file does not tokenize: {e}", member)
        return
    calls, bound, imports = _code_calls_and_bindings(tokens)
    for module, _line in imports:
        root = module.split(".")[0]
        if root and root not in _TS_SAFE_IMPORT_ROOTS:
            sev = Severity.CRITICAL if root in _TS_DANGER_ROOTS else Severity.HIGH
            ctx.add(sev, "torchscript.foreign-call",
                    f"TorchScript code imports {module}: outside torch", member, None, module, "member")
    seen = set()
    for dotted, line in calls:
        root = dotted.split(".")[0]
        if dotted in seen:
            continue
        if root in _TS_DANGER_ROOTS and root not in bound or \
                dotted in ("torch.ops.load_library", "torch.classes.load_library"):
            seen.add(dotted)
            ctx.add(Severity.CRITICAL, "torchscript.foreign-call",
                    f"TorchScript code calls {dotted} (line {line})", member, None, dotted, "member")
        elif root == "ops" and dotted.count(".") >= 2 and dotted.split(".")[1] not in _STANDARD_OP_NAMESPACES:
            seen.add(dotted)
            ctx.add(Severity.MEDIUM, "torchscript.custom-op",
                    f"TorchScript code calls custom operator {dotted} (line {line}): loading needs "
                    "its native library", member, None, dotted, "member")
        elif root not in bound and root not in _TS_OK_ROOTS:
            seen.add(dotted)
            ctx.add(Severity.HIGH, "torchscript.foreign-call",
                    f"TorchScript code calls {dotted} (line {line}): outside torch, ops and the "
                    "TorchScript builtins", member, None, dotted, "member")
