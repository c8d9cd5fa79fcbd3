"""The loader's-eye view of one file: what torch.load / np.load / joblib.load would read, beside
the parsed `ModelFile` (whose evidence is judged, never re-derived).

A file is read as its loader reads it: a zip (``PK\\x03\\x04``, torch.load's ``_is_zipfile``)
member by member, judged by content; a ``.npy`` (object arrays hold a pickle); a tar (torch's
legacy tar form); compressed wrappers (bounded); anything else as a pickle stream, with every
stream after STOP found wherever it starts. A zip other readers see behind a non-zip head (a
polyglot) is read too. The parser's own pickle runs are reused, its anomalies and code files judged
(`judge_model_evidence`), and whenever the parser rejects the file the scan is not clean.
"""
from __future__ import annotations

import gc
import os
import re
import struct
from .. import policy
from ..errors import FormatError, LimitExceeded, TensorscopeError, UnknownFormat
from ..remote import is_url, open_source
from ..source import ByteSource
from . import chat_template, configs, hf_repo, keras, metadata_text, pickles, torchscript
from .context import DEFAULT_SCAN_LIMITS, ScanContext, ScanLimits, join
from .report import FileReport, Severity
from .rules import anomaly_rule

MAGIC_ZIP = b"PK\x03\x04"
MAGIC_EMPTY_ZIP = b"PK\x05\x06"
MAGIC_NPY = b"\x93NUMPY"
MAGIC_XZ = b"\xfd7zXZ\x00"
MAGIC_7Z = b"7z\xbc\xaf\x27\x1c"
MAGIC_RAR = b"Rar!\x1a\x07"
MAGIC_ZSTD = b"\x28\xb5\x2f\xfd"
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
    ".npy": "npy", ".npz": "zip", ".pt2": "zip", ".skops": "zip", ".ptl": "zip", ".mar": "zip", ".zip": "zip",
    ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch", ".tar": "torch",
    ".pkl": "pickle", ".pickle": "pickle", ".joblib": "pickle", ".dat": "pickle",
    ".data": "pickle", ".p": "pickle", ".distcp": "zip", ".metadata": "pickle",
    # TorchScript archives as real projects name them (torch.jit.save writes any name)
    ".jit": "torch", ".torchscript": "torch", ".ptc": "torch",
    ".keras": "zip", ".h5": "hdf5", ".hdf5": "hdf5",
    ".nemo": "tar",     # NVIDIA NeMo: a tar (gzipped by older versions) of config and checkpoint
    # scikit-learn models as tutorials save them (pickle.dump to model.sav); PaddlePaddle's
    # paddle.save parameters and optimizer state (pickles of numpy arrays)
    ".sav": "pickle", ".pdparams": "pickle", ".pdopt": "pickle",
}
# Extensions of text formats: such a file is read as a pickle only when it is a whole one.
_TEXT_EXTS = {".yaml", ".yml", ".json", ".txt", ".md", ".py", ".jinja", ".toml", ".cfg", ".ini",
              ".csv", ".tsv", ".xml", ".html", ".rst", ".sh"}
_IMPORT_LINE = re.compile(rb"[ci][A-Za-z_][\w.]*\r?\n")
# Extensions that only say "compressed" (joblib dumps are named model.pkl.gzip, model.joblib.z).
_COMPRESSION_EXTS = ("", ".gz", ".gzip", ".bz2", ".xz", ".lzma", ".z", ".zlib")
# Formats that promise no code: a pickle or zip behind these names misleads the user most.
_SAFE_KINDS = {"safetensors", "gguf", "onnx", "npy"}
# Member names that promise a pickle: a broken one there is an error, not raw data.
_PICKLE_MEMBER_SUFFIXES = (".pkl", ".pickle", ".debug_pkl", ".joblib", ".metadata", ".pt", ".pth",
                           ".bin", ".ckpt")
# Extensions of files that are never models: skipped in folder walks unless the content is a model.
_PICKLE_BEARING = {"zip", "pickle", "tar", "npy-object", "compressed"}


# =================================================================================================
# One file

def scan_file(path, *, limits: ScanLimits | None = None, explicit: bool = True,
              known_data: bool = False) -> FileReport:
    """Scan one file; pure (depends on the file alone) and picklable, for process pools.

    Args:
        path: the file.
        limits: `ScanLimits`.
        explicit: the user named this file (an unrecognised file is then an error finding rather
            than a non-model file skipped in a folder walk).
        known_data: another model file keeps raw tensor data here (ONNX external data).

    Returns:
        A `FileReport`: ``scanned`` is False for a non-model file skipped in a folder walk;
        ``error`` is True when the file could not be read or parsed completely.
    """
    path = os.fspath(path)
    ctx = ScanContext(path, limits or DEFAULT_SCAN_LIMITS, scan_blob)
    ctx.known_data = known_data
    try:
        src = open_source(path)   # a URL is read by ranges (tensorscope.remote)
    except (OSError, TensorscopeError) as e:
        ctx.add("file.unreadable", f"cannot open the file: {getattr(e, 'strerror', None) or e}")
        ctx.fail("unreadable")
        return _finish(ctx, True)
    try:
        # The parse inside builds the model's records (10^5-10^6 objects for a big checkpoint),
        # all dropped when this returns: the cyclic collector need not walk them meanwhile.
        # (Not `formats.gc_paused`: its freeze outlives the call, and an unfreeze here would
        # thaw a model the caller holds open.)
        enabled = gc.isenabled()
        gc.disable()
        try:
            scanned = _guarded(ctx, src, explicit, None)
        finally:
            if enabled:
                gc.enable()
        return _finish(ctx, scanned)
    finally:
        src.close()


def scan_model(model, *, limits: ScanLimits | None = None, path=None, explicit: bool = True,
               known_data: bool = False) -> FileReport:
    """Scan a `ModelFile` already opened (convert, the TUI): its evidence is judged and its bytes
    read as the loader reads them, without parsing the file a second time. ``path``,
    ``explicit`` and ``known_data`` are `scan_file`'s (``path``: the file as the walk named it;
    default ``model.path``)."""
    ctx = ScanContext(os.fspath(path) if path is not None else model.path, limits or DEFAULT_SCAN_LIMITS,
                      scan_blob)
    ctx.known_data = known_data
    src = model.sources.get(ctx.path)
    if src is None:
        try:
            src = open_source(ctx.path)
        except (OSError, TensorscopeError) as e:
            ctx.add("file.unreadable", f"cannot open the file: {getattr(e, 'strerror', None) or e}")
            ctx.fail("unreadable")
            return _finish(ctx, True)
        try:
            return _finish(ctx, _guarded(ctx, src, explicit, model))
        finally:
            src.close()
    return _finish(ctx, _guarded(ctx, src, explicit, model))


def _guarded(ctx: ScanContext, src: ByteSource, explicit: bool, model) -> bool:
    try:
        return _scan_file(ctx, src, explicit, model)
    except RecursionError:
        ctx.fail("nesting too deep")
        return True


def _finish(ctx: ScanContext, scanned: bool) -> FileReport:
    if not scanned:
        return FileReport(ctx.path, [], False, False)
    if ctx.failures:
        ctx.add("file.unparseable",
                "could not be parsed completely, so it is not reported clean: "
                + "; ".join(dict.fromkeys(ctx.failures)))
    from .report import dedupe, sort_findings
    return FileReport(ctx.path, sort_findings(dedupe(ctx.findings)), True, bool(ctx.failures),
                      sorted(os.path.realpath(f) for f in ctx.data_files))


def _scan_file(ctx: ScanContext, src: ByteSource, explicit: bool, model=None) -> bool:
    head = src.head(4096)
    ext = os.path.splitext(ctx.path)[1].lower()
    expected_model = explicit or ext in _EXT_KIND
    if src.size == 0:
        if expected_model:
            ctx.add("file.empty", "empty file: nothing to load (torch.load and pickle.load raise "
                    "on it)")
            return True
        return False

    kind = _content_kind(head)
    # A zip's central directory is read once: the parser and the byte-level pass share it.
    archive = None
    if kind in ("zip", "empty-zip"):
        kept = model.evidence.archive if model is not None else None
        archive = kept if kept is not None and kept.source is src else _read_archive(src)

    # -- the format parser's view (its pickle runs are reused below) --------------------------
    if model is None:
        model, parser_error, parser_format = _open_with_parser(ctx, src, archive)
    else:
        parser_error, parser_format = None, model.format
    if model is not None:
        for rec in model.evidence.pickles:
            ctx.reused.setdefault((rec.member, rec.offset), rec.result)

    # -- the loader's view, byte level -----------------------------------------------------------
    def whole():  # the kinds read whole by their loaders (a remote file is fetched in full)
        return src.view(0, src.size, "file")

    blobs = _dcp_blobs(ctx.path) if kind in ("zip", "empty-zip") else None
    if blobs:
        ctx.blob_mode = True
        understood = _scan_dcp_blobs(ctx, src, blobs)
    elif kind in ("zip", "empty-zip"):
        understood = _scan_zip(ctx, src, prefix=None, absolute=True, depth=0, archive=archive)
    elif kind == "npy":
        understood = _scan_npy(ctx, whole(), None, 0, True, 0)
    elif kind in ("gzip", "bz2", "xz", "zlib", "lzma", "zf"):
        understood = _scan_compressed(ctx, whole(), kind, None, 0)
    elif kind in ("7z", "rar", "zstd"):
        ctx.add("file.unsupported-archive",
                f"{kind} archive: the standard library cannot open it, so its content (possibly a "
                "pickle, as in the nullifAI models) is not scanned")
        understood = True  # reported under its own rule
    elif kind == "tar":
        understood = _scan_tar(ctx, whole(), None, 0, 0, True)
    elif kind == "hdf5":
        understood = _scan_hdf5(ctx, src)
    elif parser_format in ("safetensors", "gguf", "onnx") or _sniffs_as_safe_format(head, src.size):
        kind = model.format if model is not None else (parser_format or "safe-format")
        understood = model is not None
    else:
        # Text named as text (a conda.yaml starts "channels:", read as GLOBAL 'c') is a pickle
        # only when it is one whole, as in a folder walk, even when named explicitly.
        # So is text whose first line cannot be GLOBAL/INST's module (`channels:` in a
        # Dockerfile): the import would fail there, before anything runs.
        text_named = _is_text(head) and (
            ext in _TEXT_EXTS or os.path.basename(ctx.path) == hf_repo.MLMODEL or
            (head[:1] in (b"c", b"i") and not _IMPORT_LINE.match(head)))
        is_pickle, understood = pickles.scan_stream(ctx, whole(), None, 0, True, 0,
                                                  lenient=expected_model and not text_named,
                                                  require_stop=not expected_model or text_named)
        kind = "pickle" if is_pickle else "unknown"
    ctx.kinds.append(kind)

    # A zip that other readers (zipfile, unzip, other scanners) see behind a non-zip head.
    if kind not in ("zip", "empty-zip"):
        _scan_polyglot_zip(ctx, src, kind)

    if model is not None:
        judge_model_evidence(ctx, model)
        ctx.data_files = {t.file for t in model.tensors if t.file and t.file != ctx.path}
        ctx.data_files |= {f for f in model.files if f != ctx.path}
    elif parser_error is not None:
        _parser_error_finding(ctx, parser_error, understood, kind)

    if kind == "unknown" and model is None and _is_text(head) and \
            (ext in configs.CONFIG_SUFFIXES + hf_repo.SUFFIXES or
             os.path.basename(ctx.path) == hf_repo.MLMODEL):
        text = bytes(src.view(0, min(src.size, configs.MAX_TEXT), "file")).decode("utf-8",
                                                                                 "replace")
        before = len(ctx.findings)
        read = hf_repo.check_file(ctx, ctx.path, text, explicit)
        if ext in configs.CONFIG_SUFFIXES:
            configs.check_text(ctx, text, None)
        if read or len(ctx.findings) > before:
            # repository code, templates and configs that loaders turn into calls: their
            # findings say which (medium ones included: the file is not a model to drop them)
            ctx.failures.clear()     # the text is read as what it is, not as a broken pickle
            return True
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
        if _is_text(head) and ext not in _EXT_KIND:
            # text that is not a pickle (index JSON, configs, refs): no loader unpickles it. Text
            # named as a model (a protocol 0 pickle cut short is text) is a model that fails.
            ctx.add("file.not-a-model",
                    "text file that is not a pickle: nothing here is loaded as code")
            return True
        ctx.fail(f"no reader recognises this content (starts with {head[:8]!r}, {src.size} bytes)")
    elif not understood and not ctx.failures:
        ctx.fail("the content could not be read completely")

    _check_extension(ctx, ext, kind, model)
    return True


def _onnx_local_function_domains(meta: dict) -> dict[str, set[str]]:
    """Domains whose ops are all model-local functions: {domain: function names}. An op counted
    in the model that is neither a local function nor a standard ONNX operator could be a custom
    op of that domain, so then no domain is exempt (``op_counts`` does not say each op's domain)."""
    funcs = meta.get("functions") or []
    by_domain: dict[str, set[str]] = {}
    for f in funcs if isinstance(funcs, list) else ():
        if isinstance(f, dict) and f.get("domain") and f.get("name"):
            by_domain.setdefault(str(f["domain"]), set()).add(str(f["name"]))
    if not by_domain:
        return {}
    names = set().union(*by_domain.values())
    try:
        from onnx import defs
    except ImportError:
        return {}
    for op in (meta.get("op_counts") or {}):
        if op not in names and not defs.has(str(op)):
            return {}
    return by_domain


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
        from ..formats import open_model
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
    from ..parsers import zip_reader
    try:
        return zip_reader.read_zip(src)
    except FormatError as e:
        return e


def _open_zip_archive(src: ByteSource, archive):
    """What ``tensorscope.open`` does with a zip, over the archive already read (or the error
    reading it raised)."""
    from ..parsers import zip_dispatch
    if isinstance(archive, FormatError):
        raise archive
    return zip_dispatch.open_archive(src, archive)


def _open_with_parser(ctx: ScanContext, src: ByteSource | None = None, archive=None):
    """``tensorscope.open`` on the file: (model, error, format). Never raises. A zip is opened
    from ``archive`` (its `ZipArchive`, or the error reading it raised) over ``src``."""
    from ..formats import open_model, open_model_source
    try:
        if archive is not None:
            model = _open_zip_archive(src, archive)
        elif src is not None and is_url(ctx.path) and not ctx.path.endswith(".index.json"):
            model = open_model_source(src, ctx.path)   # the object already open: no new request
        else:
            model = open_model(ctx.path)
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


def _parser_error_finding(ctx: ScanContext, err: BaseException, understood: bool, kind: str) -> None:
    """``tensorscope.open`` failed: whatever the format's loader rejects is never clean."""
    anomaly = getattr(err, "anomaly", None)
    if anomaly is not None and getattr(anomaly, "kind", "") == "onnx.external_path_escape":
        ctx.add("onnx.external-data-escape", anomaly.message, offset=anomaly.offset)
        return
    if isinstance(err, UnknownFormat):
        return  # no parser claims it: the byte-level view decides (unknown content fails there)
    if ctx.keras:
        return  # a Keras archive: Keras loads it, not a loader tensorscope models
    if ctx.layout is not None:
        return  # a known layout judged as its own loader reads it (TorchServe, skops, text zip)
    what = "parser" if isinstance(err, TensorscopeError) else type(err).__name__
    if understood and kind in ("zip", "empty-zip", "pickle", "tar", "npy"):
        # every pickle was read at byte level; the loader still refuses the file
        ctx.add("file.loader-rejects", f"the {kind} loader rejects this file ({what}: {err})")
        return
    ctx.fail(f"{what}: {err}")


def _content_kind(head: bytes) -> str:
    """What a loader sees at the head of the bytes. Compressed wrappers use joblib's own sniffer
    (`parsers/compression.py`, what the joblib parser dispatches on), so the two never disagree."""
    from ..parsers.compression import compression
    if head[:4] == MAGIC_ZIP:
        return "zip"
    if head[:4] == MAGIC_EMPTY_ZIP:
        return "empty-zip"
    if head[:6] == MAGIC_NPY:
        return "npy"
    if head[:6] == MAGIC_7Z:
        return "7z"
    if head[:6] == MAGIC_RAR:
        return "rar"
    if head[:4] == MAGIC_ZSTD:
        return "zstd"
    if keras.is_hdf5(head):
        return "hdf5"
    packed = compression(head)
    if packed is not None and packed != "lz4":
        return packed   # gzip, bz2, xz, lzma, zlib, zf
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return "other"


def _check_extension(ctx: ScanContext, ext: str, kind: str, model) -> None:
    expected = _EXT_KIND.get(ext)
    actual = {"zip": "zip", "empty-zip": "zip", "npy": "npy", "pickle": "pickle", "tar": "tar",
              "gzip": "compressed", "bz2": "compressed", "xz": "compressed", "zlib": "compressed",
              "lzma": "compressed", "zf": "compressed"}.get(kind, kind)
    if model is not None and actual in ("safe-format",):
        actual = model.format
    if actual in ("unknown", "7z", "rar", "zstd"):
        return
    if expected is None:
        if actual in _PICKLE_BEARING and ext not in _COMPRESSION_EXTS:
            name = "a zip archive" if actual == "zip" else f"{actual} content"
            ctx.add("file.extension-mismatch",
                    f"{name} that loaders will unpickle hides behind the extension {ext or '(none)'!r}")
        return
    if expected == actual or (expected == "torch" and actual in ("zip", "pickle", "tar")) or \
            (expected == "pickle" and actual in ("compressed", "zip")) or \
            (expected == "tar" and actual == "compressed") or \
            (expected == "zip" and actual == "zip"):
        return
    if expected in _SAFE_KINDS and actual in _PICKLE_BEARING:
        ctx.add("file.extension-mismatch",
                f"named {ext} (a format without code) but holds {actual} content that loaders "
                "unpickle: the name misleads", variant="misleads")
    else:
        ctx.add("file.extension-mismatch",
                f"named {ext} but holds {actual} content (readers dispatch on content)",
                variant="differs")


# =================================================================================================
# Parser evidence

def judge_model_evidence(ctx: ScanContext, model) -> None:
    """What the parser already knows: its anomalies, its pickle runs, TorchScript code, ONNX
    domains, safetensors user metadata. Judged here; never re-derived from the bytes."""
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
        pickles.judge_result(ctx, rec.result, rec.member, rec.offset, "file" if base_abs else "member",
                      depth=0, role=rec.role)
    for member, text in ev.code.items():
        if "/code/" in f"/{member}" and member.endswith(".py"):
            torchscript.check_code(ctx, member, text)
    meta = model.metadata if isinstance(model.metadata, dict) else {}
    if model.format == "onnx":
        # Only domains a node uses: an opset import nobody uses loads no custom-op library; and
        # a domain whose every op is a FunctionProto the model defines (torch.onnx.export's
        # export_modules_as_functions) is expanded by the runtime, not loaded from a library.
        local = _onnx_local_function_domains(meta)
        for d in meta.get("node_domains", meta.get("domains")) or ():
            if d in local:
                ctx.add("onnx.local-functions",
                        f"domain {d!r} holds only functions defined in the model "
                        f"({', '.join(sorted(local[d])[:5])}): runtimes inline them, no "
                        "custom-op library is loaded", trigger=str(d))
                continue
            if d not in policy.STANDARD_ONNX_DOMAINS:
                ctx.add("onnx.custom-domain",
                        f"operators from custom domain {d!r}: runtimes load a native custom-op "
                        "library to run them", trigger=str(d))
    if model.format == "gguf":
        chat_template.check_gguf(ctx, model)
    user_meta = meta.get("__metadata__")
    if model.format == "safetensors" and isinstance(user_meta, dict):
        for k, v in list(user_meta.items())[:4096]:
            if isinstance(v, str) and len(v) >= 16:
                for rule, msg, at, trig in pickles.embedded_payload(
                        ctx, v, None, f"__metadata__ key {pickles.short_repr(k)}", 0):
                    ctx.add(rule, msg, None, at, trig)
        metadata_text.check_safetensors(ctx, user_meta)


def _is_stored_abs(rec) -> bool:
    return rec.offset != 0


def _anomaly_finding(ctx: ScanContext, a, prefix: str | None = None, absolute: bool = True) -> None:
    member = join(prefix, a.member)
    ctx.add(anomaly_rule(a.kind), a.message, member, a.offset, None, "file" if absolute else "member")


# =================================================================================================
# Zip archives

def _scan_zip(ctx: ScanContext, src: ByteSource, prefix: str | None, absolute: bool, depth: int,
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
        ctx.add("zip.torch-refuses",
                f"PyTorch's zip reader would refuse this archive ({archive.miniz_error}) while "
                "Python's zipfile opens it: readers disagree", prefix)
    ok = True
    referenced: set[str] = set()
    sources: list[tuple[str, str]] = []     # Python modules the archive's loader imports
    tp = archive.torch_prefix()
    members = [m for m in archive.members if not m.is_dir]
    first = min((m.header_offset for m in archive.members), default=0)
    if 30 <= first <= src.size:
        _scan_hidden_local_entries(ctx, src, first, prefix, depth)

    # torch storage records: P/data/<key>, P/constants/<key>, P/traced_inputs/<key>
    record_dirs = tuple(f"{tp}/{d}/" for d in ("data", "constants", "traced_inputs")) if tp else ()
    records, others = [], []
    for m in members:
        n = m.name
        (records if n.startswith(record_dirs) and n.count("/") == 2 else others).append(m)
    for m, record in [(m, False) for m in others] + [(m, True) for m in records]:
        if record and m.name[m.name.rindex("/") + 1:] in referenced:
            continue  # a storage: torch reads its bytes raw, never unpickles them
        name = join(prefix, m.name)
        if m.error and m.is_encrypted and m.is_stored and \
                0 <= m.data_offset <= m.data_offset + m.compressed_size <= src.size:
            # flagged encrypted but STORED: the bytes are plain; a reader ignoring the flag
            # unpickles them (picklescan GHSA-w8jq-xcqf-f792), so they are scanned.
            data = src.view(m.data_offset, m.compressed_size, member=m.name)
            scan_blob(ctx, data, name, m.data_offset, absolute, depth,
                       strict=not m.name.lower().endswith(_PICKLE_MEMBER_SUFFIXES))
            continue
        if m.error:
            ctx.add("zip.member-unreadable",
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
        except LimitExceeded:
            ctx.add("file.decompression-limit",
                    f"member inflates past {ctx.limits.max_decompressed} bytes: not scanned", name)
            ok = False
            continue
        except FormatError as e:
            ctx.add("zip.member-unreadable",
                    f"member cannot be read ({e.reason}): its content is not scanned", name)
            ok = False
            continue
        if not len(data):
            continue
        if m.name == "config.json" and _scan_keras_config(ctx, data, name):
            continue
        if m.name.endswith(".py"):
            try:
                text = bytes(data).decode("utf-8")
            except UnicodeDecodeError:
                text = bytes(data).decode("latin-1")
            if "/code/" in f"/{m.name}":
                torchscript.check_code(ctx, name, text)
            else:   # a TorchServe handler, a torch.package module: judged together below
                sources.append((name, text))
            continue
        lenient = not record and m.name.lower().endswith(_PICKLE_MEMBER_SUFFIXES)
        pids = scan_blob(ctx, data, name, base, abs_member, depth, strict=not lenient)
        if pids is False:
            ok = False
        elif isinstance(pids, set):
            referenced |= pids
    torchscript.check_sources(ctx, sources)
    if prefix is None and ok:
        _known_zip_layout(ctx, archive, members)
    return ok


_LOCAL = struct.Struct("<4sHHHHHIIIHH")   # a zip local file header (30 bytes)

# TorchServe's built-in handlers (ts/torch_handler/*.py, model-archiver README): a .mar naming one
# of these carries no handler code of its own; TorchServe imports ts.torch_handler.<name>.
TORCHSERVE_BUILTIN_HANDLERS = frozenset({"image_classifier", "object_detector", "text_classifier",
                                         "image_segmenter", "base_handler", "dali_image_classifier",
                                         "vision_handler", "text_handler"})


def _member_head(archive, m) -> bytes:
    """The first 4 KiB of a member (b"\\0" when it cannot be read: not text)."""
    try:
        if m.is_stored:
            return bytes(archive.data(m)[:4096])
        return archive.read_bytes(m, 1 << 20)[:4096]
    except (FormatError, LimitExceeded):
        return b"\0"


def _known_zip_layout(ctx: ScanContext, archive, members) -> None:
    """A zip that is not a torch/NumPy archive but a layout with a loader of its own: a TorchServe
    .mar (MAR-INF/MANIFEST.json), a skops file (schema.json), or a zip of text files only."""
    import json
    names = {m.name: m for m in members}
    manifest = names.get("MAR-INF/MANIFEST.json")
    if manifest is not None:
        ctx.layout = "torchserve"
        try:
            doc = json.loads(bytes(archive.read_bytes(manifest, 1 << 20)).decode("utf-8"))
            handler = str(((doc.get("model") or {}).get("handler")) or "")
        except (ValueError, FormatError, LimitExceeded, AttributeError):
            ctx.add("archive.torchserve-handler", "TorchServe archive whose MAR-INF/MANIFEST.json "
                    "does not parse: the handler TorchServe would import is unknown",
                    "MAR-INF/MANIFEST.json")
            return
        module = handler.split(":", 1)[0]
        if module in TORCHSERVE_BUILTIN_HANDLERS:
            ctx.add("archive.torchserve-handler",
                    f"TorchServe archive with the built-in handler {handler!r} "
                    f"(ts.torch_handler.{module}): TorchServe loads the serialized model with "
                    "it, no handler code ships in the archive", "MAR-INF/MANIFEST.json",
                    trigger=handler, variant="builtin")
        else:
            ctx.add("archive.torchserve-handler",
                    f"TorchServe archive whose handler {handler!r} is code of the archive or of "
                    "the server's environment: TorchServe imports it to serve the model",
                    "MAR-INF/MANIFEST.json", trigger=handler)
        return
    if "schema.json" in names and any(n.endswith(".npy") for n in names) or \
            set(names) == {"schema.json"}:
        from . import skops_layout
        if skops_layout.judge(ctx, archive, names["schema.json"]):
            ctx.layout = "skops"
            return
    if members and len(members) <= 256 and all(_text_member(m.name, _member_head(archive, m))
                                               for m in members):
        ctx.layout = "text"
        ctx.add("file.not-a-model", f"a zip of {len(members)} text files: no loader unpickles "
                "or runs anything in it")


# =================================================================================================
# Keras: .keras archives (config.json) and legacy .h5 models (a JSON attribute)

def _scan_keras_config(ctx: ScanContext, data, member: str | None) -> bool:
    """Judge a zip's top-level config.json when it is a Keras model config; False otherwise."""
    doc = keras.parse(bytes(data)) if len(data) <= keras.MAX_CONFIG_BYTES else None
    if not keras.looks_like_config(doc):
        return False
    ctx.keras = True
    for rule, variant, message, trigger in keras.findings(doc):
        ctx.add(rule, message, member, None, trigger, variant=variant or None)
    return True


def _scan_hdf5(ctx: ScanContext, src: ByteSource) -> bool:
    """An HDF5 file: the Keras configs its attributes hold, judged; the rest is not parsed."""
    raw = src.raw
    if not hasattr(raw, "find"):        # an in-memory or remote source: its bytes
        raw = bytes(src.view(0, src.size, "file"))
    configs, complete = keras.hdf5_configs(raw, src.size)
    for offset, doc in configs:
        ctx.keras = True
        for rule, variant, message, trigger in keras.findings(doc):
            ctx.add(rule, message, None, offset, trigger, variant=variant or None)
    if not configs:
        ctx.add("hdf5.not-parsed", "HDF5 file without a Keras model config: its datasets and "
                "attributes are not parsed (PyTables and pandas unpickle object data on read)")
    elif not complete:
        ctx.fail("too many JSON candidates in the HDF5 file: not every attribute was read")
    return complete


def _scan_hidden_local_entries(ctx: ScanContext, src: ByteSource, end: int, prefix: str | None,
                               depth: int) -> None:
    """Local entries before the first member the central directory lists: zipfile and miniz never
    read them, streaming unzippers (``unzip -`` from a pipe, ZipInputStream, stream-unzip) read
    them first. Their stored or deflated content is scanned like a member's."""
    import zlib
    region = src.read(0, min(end, ctx.limits.max_decompressed))
    pos = region.find(b"PK\x03\x04")
    seen = 0
    while 0 <= pos <= len(region) - 30 and seen < 64:
        sig, _v, flags, method, _t, _d, _crc, csize, _usize, nlen, xlen = _LOCAL.unpack_from(region, pos)
        start = pos + 30 + nlen + xlen
        name = region[pos + 30:pos + 30 + nlen].decode("utf-8", "replace")
        if flags & 0x08 or start + csize > len(region) or method not in (0, 8):
            pos = region.find(b"PK\x03\x04", pos + 4)
            continue
        seen += 1
        raw = region[start:start + csize]
        try:
            data = raw if method == 0 else zlib.decompressobj(-15).decompress(
                raw, ctx.limits.max_decompressed)
        except zlib.error:
            data = b""
        where = join(prefix, f"<local entry {name!r} at byte {pos}, before the central directory>")
        if data:
            before = len(ctx.findings)
            scan_blob(ctx, memoryview(data), where, start, prefix is None and method == 0,
                      depth + 1, strict=True)
            if any(f.severity >= Severity.HIGH for f in ctx.findings[before:]):
                ctx.add("zip.hidden-local-entry",
                        f"a local entry {name!r} at byte {pos} that the central directory does not "
                        "list holds the findings above: streaming unzippers read it, zipfile and "
                        "torch.load do not", prefix, pos if prefix is None else None)
        pos = region.find(b"PK\x03\x04", start + csize)


def _dcp_blobs(path: str) -> list[tuple[int, int]] | None:
    """(offset, length) of each torch.save blob in a DCP shard, from the ``.metadata`` next to it
    (``storage_data`` maps each item to ``_StorageInfo(relative_path, offset, length)``)."""
    meta = os.path.join(os.path.dirname(os.path.abspath(path)), ".metadata")
    if not os.path.isfile(meta) or os.path.abspath(meta) == os.path.abspath(path):
        return None
    from ..parsers.pickle_vm import Call
    try:
        with ByteSource(meta) as src:
            from ..parsers import pickle_vm
            r = pickle_vm.run(src.view(0, src.size), hooks=pickle_vm.CONTAINER_HOOKS)
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


def _scan_dcp_blobs(ctx: ScanContext, src: ByteSource, blobs: list[tuple[int, int]]) -> bool:
    ok = True
    covered = 0
    for off, length in blobs:
        name = f"<blob at byte {off}>"
        if off + length > src.size:
            ctx.fail(f"DCP item at byte {off} ({length} bytes) runs past the end of the file")
            ok = False
            continue
        if off > covered:
            ctx.add("zip.unaccounted-bytes",
                    f"{off - covered} bytes at {covered}..{off} belong to no checkpoint item",
                    None, covered)
        covered = max(covered, off + length)
        view = src.view(off, length)
        if bytes(view[:4]) == MAGIC_ZIP:
            ok &= _scan_zip(ctx, ByteSource.from_bytes(view, name=ctx.path), name, False, 1)
        else:
            ok &= scan_blob(ctx, view, name, off, True, 1, strict=False) is not False
    if covered < src.size:
        ctx.add("zip.unaccounted-bytes",
                f"{src.size - covered} bytes after the last checkpoint item", None, covered)
    return ok


def scan_blob(ctx: ScanContext, data: memoryview, member: str | None, base: int, absolute: bool,
               depth: int, strict: bool):
    """A member or nested payload judged by its content. Returns the storage keys its pickles
    reference (a set), True when read, False when it could not be read."""
    if depth > ctx.limits.max_depth:
        ctx.add("file.unparseable", "archives nest deeper than the scan limit: "
                "the innermost content is not scanned", member)
        return False
    head = bytes(data[:300])
    kind = _content_kind(head)
    if kind in ("zip", "empty-zip"):
        inner = ByteSource.from_bytes(data, name=ctx.path)
        return _scan_zip(ctx, inner, member, False, depth + 1)
    if kind == "npy":
        return _scan_npy(ctx, data, member, base, absolute, depth)
    if kind in ("gzip", "bz2", "xz", "zlib", "lzma", "zf"):
        return _scan_compressed(ctx, data, kind, member, depth)
    if kind in ("7z", "rar", "zstd"):
        ctx.add("file.unsupported-archive",
                f"{kind} archive inside: its content is not scanned", member)
        return True
    if kind == "tar":
        return _scan_tar(ctx, data, member, depth, base, absolute)
    if member and member.lower().endswith(configs.CONFIG_SUFFIXES) and _is_text(head):
        configs.check_text(ctx, bytes(data[:configs.MAX_TEXT]).decode("utf-8", "replace"), member)
    if strict and len(data) <= 4096 and _cannot_import(bytes(data)):
        # a record that may or may not be a pickle but holds no opcode that imports anything
        # (GLOBAL 'c', INST 'i', STACK_GLOBAL, EXT1/2/4): it cannot make a loader run code
        return True
    # A text member that no loader unpickles (requirements.txt starting with 'c', a handler's
    # 'import torch' read as INST) is text: a pickle only when it is one whole, as top-level text.
    text = strict and member is not None and _text_member(member, head)
    keys: set[str] = set()
    is_pickle, ok = pickles.scan_stream(ctx, data, member, base, absolute, depth, lenient=not strict,
                                      keys=keys, require_stop=text)
    return keys if ok else False


def _text_member(member: str, head: bytes) -> bool:
    """A member whose loader reads it as text: text content under a name that no unpickling
    loader reads (torch.load's data.pkl, joblib, pickle suffixes are never text here)."""
    name = member.rsplit("!", 1)[-1].rsplit("/", 1)[-1].lower()
    if name.endswith(_PICKLE_MEMBER_SUFFIXES) or name in ("data.pkl", "pickle", "sys_info"):
        return False
    return _is_text(head) and (os.path.splitext(name)[1] in _TEXT_EXTS or "." not in name or
                               name in _TEXT_NAMES)


_TEXT_NAMES = frozenset({"requirements.txt", "manifest.json", "dockerfile", "license", "readme",
                         "version", "byteorder", ".data/version", ".format_version"})



# =================================================================================================
# NumPy, tar, compression

def _scan_npy(ctx: ScanContext, data, member: str | None, base: int, absolute: bool, depth: int) -> bool:
    from ..parsers import numpy_fmt
    try:
        h = numpy_fmt.parse_header(data, file=ctx.path, member=member, base=base)
    except FormatError as e:
        ctx.fail(f"npy{(' ' + member) if member else ''}: {e.reason}")
        return False
    if h.layout != "object":
        return True
    ctx.add("pickle.object-array",
            "object array: its data is a pickle (np.load needs allow_pickle=True); scanned",
            member, base + h.data_start, None, "file" if absolute else "member")
    payload = data[h.data_start:]
    is_pickle, ok = pickles.scan_stream(ctx, payload, member, base + h.data_start, absolute, depth,
                                      lenient=True)
    return ok


def decompress(data, kind: str, cap: int) -> bytes:
    """One bounded decompressor, shared with the joblib parser: at most ``cap`` bytes out
    (LimitExceeded past it, FormatError for a broken stream)."""
    from ..parsers import compression
    if kind == "lzma" and bytes(data[:6]) == MAGIC_XZ:
        kind = "xz"
    return compression.decompress(data, kind, cap=cap)


def _scan_compressed(ctx: ScanContext, data, kind: str, member: str | None, depth: int) -> bool:
    try:
        inner = decompress(data, kind, ctx.limits.max_decompressed)
    except LimitExceeded:
        ctx.add("file.decompression-limit",
                f"{kind} stream inflates past {ctx.limits.max_decompressed} bytes: not scanned "
                "further (a decompression bomb or a huge payload)", member)
        return True
    except FormatError as e:
        ctx.fail(f"{kind} stream is corrupt: {e.reason}")
        return False
    name = join(member, f"<{kind}>")
    res = scan_blob(ctx, memoryview(inner), name, 0, False, depth + 1, strict=False)
    return res is not False


# Bytes per element of the legacy tar form's storage types.
_STORAGE_ITEMSIZE: dict[str, int] = {"Double": 8, "Float": 4, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4,
                     "Short": 2, "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8,
                     "ComplexDouble": 16}


def _scan_tar(ctx: ScanContext, data, member: str | None, depth: int, base: int = 0,
              absolute: bool = True) -> bool:
    """torch's legacy tar form (members ``sys_info``, ``pickle``, ``tensors``, ``storages``) or any
    tar: every entry (duplicates included) judged by content; ``storages`` and ``tensors`` walked
    record by record as torch's ``legacy_load`` reads them. Headers come from the legacy parser's
    tar reader; member data are zero-copy slices."""
    from ..parsers.torch_legacy import tar_entries
    ok = True
    sources: list[tuple[str, str]] = []
    try:
        entries = list(tar_entries(ByteSource.from_bytes(data, name=ctx.path)))
    except FormatError as e:
        ctx.fail(f"tar archive: {e.reason}")
        return False
    for entry, kind, start, size, link in entries:
        name = join(member, entry)
        parts = entry.replace("\\", "/").split("/")
        if entry.startswith(("/", "\\")) or (len(entry) > 1 and entry[1] == ":") or ".." in parts:
            ctx.add("tar.absolute-or-parent-path", f"member name {entry!r} is absolute or climbs "
                    "out of the extraction folder (path traversal when extracted)", name)
        if kind in "12":
            ctx.add("file.symlink-outside", f"tar member is a link to {link!r}", name,
                    variant="link_in_tar")
            continue
        if kind not in "07":
            continue
        raw = data[start:start + size]
        mbase = base + start if absolute else start
        if entry == "storages":
            ok &= _scan_legacy_records(ctx, raw, name, mbase, absolute, depth, "storages")
        elif entry == "tensors":
            ok &= _scan_legacy_records(ctx, raw, name, mbase, absolute, depth, "tensors")
        elif entry.endswith(".py") and _is_text(bytes(raw[:4096])):
            # SageMaker's code/inference.py, a NeMo archive's sources: imported by the loader
            sources.append((name, bytes(raw[:torchscript.MAX_CODE_CHARS]).decode("utf-8", "replace")))
        else:
            res = scan_blob(ctx, raw, name, mbase, absolute, depth + 1,
                            strict=entry not in ("pickle", "sys_info"))
            ok &= res is not False
    torchscript.check_sources(ctx, sources)
    return ok


def _scan_legacy_records(ctx: ScanContext, data, member: str, base: int, absolute: bool, depth: int,
                         which: str) -> bool:
    """The legacy tar's ``storages`` (count; per storage a pickle + int64 numel + raw bytes;
    then a pickle of storage views) and ``tensors`` (count; per tensor a pickle + int32 ndim,
    4 bytes, ndim int64 sizes, ndim int64 strides, int64 offset) streams."""
    ob = "file" if absolute else "member"

    def one(pos):
        key = (member, base + pos)
        r = pickles.vm_run(ctx, data, pos, member, base)
        if key not in ctx.judged:
            ctx.judged.add(key)
            pickles.judge_result(ctx, r, member, base, ob, depth)
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
        ctx.add("pickle.trailing-data",
                f"{len(data) - pos} bytes after the last record (torch.load ignores them)",
                member, base + pos, None, ob)
    return True


# =================================================================================================
# Polyglots

def _zip_is_a_tar_member(src: ByteSource, archive) -> bool:
    """True when the zip zipfile finds at the end of a tar lies inside one member's data: a tar
    of a torch checkpoint (a NeMo .nemo), whose EOCD is within zipfile's 64 KiB search of the
    end; not a second view of the file."""
    from ..parsers.torch_legacy import tar_entries
    start = archive.prepended
    end = archive.eocd_offset + 22 + len(archive.comment)
    try:
        entries = tar_entries(src)
        return any(kind in "07" and at <= start and end <= at + size
                   for _, kind, at, size, _ in entries)
    except FormatError:
        return False


def _scan_polyglot_zip(ctx: ScanContext, src: ByteSource, kind: str) -> None:
    """A zip that Python's zipfile (and scanners built on it) would find behind another head."""
    tail = src.read(max(0, src.size - 65557), min(src.size, 65557))
    if MAGIC_EMPTY_ZIP not in tail:
        return
    from ..parsers import zip_reader
    try:
        archive = zip_reader.read_zip(src)
    except FormatError:
        return
    if not archive.members:
        return
    if kind == "tar" and _zip_is_a_tar_member(src, archive):
        return  # a nested archive (a .nemo's checkpoint), scanned as its tar member already
    ctx.add("file.polyglot",
            f"the file reads as {kind} from its head (what torch.load/np.load see) but Python's "
            f"zipfile also finds a zip archive of {len(archive.members)} members in it: scanned too")
    _scan_zip(ctx, src, "<zip view>", True, 1)


