"""Convert any model tensorscope reads into safetensors, executing nothing, in bounded memory.

`convert(src, out)` scans the input, opens it with the format parsers (nothing in it runs), picks
the tensors of its state dict, and streams each one from its zero-copy view into a safetensors
file. `plan(model)` is the selection step alone (what would be written, refused, skipped).

Output format (what ``safetensors.torch.save_file`` writes, byte for byte; checked by the tests):

- 8 bytes: ``N`` as a little-endian u64; ``N`` bytes of compact JSON (``","`` and ``":"``
  separators, UTF-8 unescaped, control characters escaped as serde_json does), padded with
  spaces to a multiple of 8; then the tensor bytes, little-endian, C order, with no hole.
- The JSON object is ``__metadata__`` first (str -> str), then one entry per tensor
  ``{"dtype", "shape", "data_offsets": [begin, end]}`` in data order. Data order is safetensors'
  own: dtype descending in the order of the reference crate's ``Dtype`` enum (which
  `tensorscope.parsers.safetensors.DTYPES` lists), then name ascending.
- ``F4`` shapes count fp4 values: a torch ``float4_e2m1fn_x2 [3, 4]`` is written ``F4 [3, 8]``.

What is written (state-dict semantics):

- Tensors whose role is ``tensor`` (plain containers), ``parameter``, ``buffer`` (persistent) or
  ``initializer`` (ONNX), named as tensorscope names them (the state-dict keys; sparse tensors as
  their components ``name.indices`` / ``name.values`` ..., recorded in ``__metadata__``).
  Non-persistent buffers, TorchScript constants, attributes and traced inputs, ONNX node
  constants and sparse initializers are skipped and reported (``include_all=True`` keeps them).
- Tensors that share a storage are each written as their own copy (safetensors forbids
  aliasing): reported in ``shared``. Tensors whose strides overlap (``expand``) are written
  materialised: ``expanded``. Other non-contiguous tensors are written contiguous: ``contiguous``.
- Refused, naming the tensors (`Unconvertible`), unless ``skip_unsupported=True`` leaves them
  out: dtypes safetensors cannot hold (complex128, complex32, quantized qint8/quint8/qint32/
  quint4x2/quint2x4, int4/uint4/int2/uint2, strings, objects, block-quantized types, NumPy
  structured/void/string arrays), ONNX fp4/fp6 (its nibble packing is not safetensors'), tensors
  without stored values (meta tensors, records stored empty), and packed tensors stored with
  strides. Two tensors with one name, or a tensor named ``__metadata__``, are an error.

``__metadata__`` holds ``format: "pt"`` (what Hugging Face loaders expect), ``source_format``
(tensorscope's format name), ``source_sha256`` (of the input file; for inputs of several files,
the sha256 of their ``sha256sum``-style manifest: ``"<hex>  <path relative to the input>\\n"``
lines sorted by path), ``converted_by``, and ``tensorscope.sparse`` when sparse tensors were
split. The hash is computed in a thread while the tensors are copied, and written into the header
(its length is fixed) once known.

Sharding: a sharded input (several weight files with an index) gives a sharded output, tensor
``t`` going to the shard matching its input shard; ``max_shard_size`` re-shards any input
greedily in state-dict order (a tensor larger than the limit gets a shard of its own), as
``huggingface_hub.split_torch_state_dict_into_shards`` does. Shards of ``dir/model.safetensors``
are ``dir/model-00001-of-00003.safetensors`` ..., with ``dir/model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {name: shard}}``, sorted keys).

Durability: each output is written to ``<OUT>.tmp-<random>`` in the output folder, flushed and
fsynced, verified when asked (reopened and compared with the input by `tensorscope.diff`, bit for
bit), then renamed into place (shards first, the index last) and the folder fsynced. On any
error every temporary file is removed, so a failure never leaves a half-written output. An
existing output is only replaced with ``force=True``.

Memory and speed: a contiguous tensor stored plainly in a file is copied by the kernel
(``os.copy_file_range``: no page of the input is mapped into this process), or, below 256 KiB,
read with ``os.pread`` into a buffer written every 4 MiB (a checkpoint of 100,000 small tensors
costs a few hundred writes, not 100,000 kernel copies; tensors a few bytes apart in the input
share one ``pread``); the header is built once, as text, from columns; any
other tensor is
read through the memory maps piece by piece (`reader.iter_flat_chunks`), a non-contiguous piece
copied one at a time, and the pages already written are handed back to the kernel. Either way
the resident set stays flat whatever the size. Copies of a whole tensor happen only where the
format forces them (compressed npz members, typed ONNX fields, byte-swapped NumPy arrays), and
in ``verify`` for chunked tensors. Chunked tensors (DCP) are written block by block along their
first dimension. Writeback of the output starts as it is written, so the final fsync is short.

Public API: `convert`, `plan`, `ConversionPlan`, `PlannedTensor`, `ConvertReport`,
`ConversionRefused`, `UnsafeSource`, `Unconvertible`, `parse_size`, `SAFETENSORS_DTYPES`, `SCHEMA`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
from typing import Any, Callable

from .. import __version__
from ..errors import TensorscopeError
from ..model import ModelFile
from ..reader import CHUNK_BYTES
from .plan import (SAFETENSORS_DTYPES, STATE_DICT_ROLES, ConversionPlan, ConversionRefused,
                   PlannedTensor, Unconvertible, UnsafeSource, plan)
from .report import SCHEMA, ConvertReport, _listing
from .sharding import _input_files, _layout, _write_index, parse_size
from .arguments import _check_targets, check_arguments, make_folders, remove_folders
from .writer import (_SHA_PLACEHOLDER, _data_order, _fsync_dir, _fsync_file, _Hasher, _patch_hash,
                     _releaser, _write_file)

__all__ = ["convert", "check_arguments", "plan", "ConversionPlan", "PlannedTensor", "ConvertReport",
           "ConversionRefused", "UnsafeSource", "Unconvertible", "parse_size",
           "SAFETENSORS_DTYPES", "SCHEMA", "STATE_DICT_ROLES"]


# ------------------------------------------------------------------------------------------------
# Verification (the diff engine)
# ------------------------------------------------------------------------------------------------

def _expected_model(model: ModelFile, tensors: list[PlannedTensor]) -> ModelFile:
    """The input restricted to ``tensors``, sharing its maps (for a diff against an output)."""
    exp = ModelFile(model.format, model.path, [t.info for t in tensors], sources=model.sources,
                    files=model.files)
    for t in tensors:
        info = t.info
        if info.dtype == "float4_e2m1fn" and t.st_dtype == "F4" and info.shape and info.shape[-1] % 2 == 0:
            # The safetensors reader lists an even F4 as torch's float4_e2m1fn_x2 (same bytes).
            info = dataclasses.replace(info, dtype="float4_e2m1fn_x2", stride=None, nbytes=info.nbytes,
                                       shape=info.shape[:-1] + (info.shape[-1] // 2,))
            exp.tensors[exp.tensors.index(t.info)] = info
        if info.name in model.custom_readers:
            exp.custom_readers[info.name] = model.custom_readers[info.name]
    return exp


def _verify(model: ModelFile, tensors: list[PlannedTensor], path: str) -> None:
    from ..diffing import diff_models
    from ..formats import open_model
    with open_model(path, format="safetensors") as written:
        result = diff_models(_expected_model(model, tensors), written, atol=0.0, rtol=0.0,
                             detect_prefix=False, detect_renames=False)
    # Bit for bit: every tensor "same" with identical bytes (layout changes are expected).
    bad = [e for e in result.entries
           if e.status != "same" or e.values is None or not e.values.identical_bytes]
    if bad or len(result.entries) != len(tensors):
        names = ", ".join(f"{e.name} ({e.status}{': ' + '; '.join(e.changes) if e.changes else ''})"
                          for e in bad[:5])
        raise TensorscopeError(f"verification failed for {path}: {len(bad)} tensor(s) differ from "
                               f"the input: {names}")


# ------------------------------------------------------------------------------------------------
# The conversion
# ------------------------------------------------------------------------------------------------

def _severity(value):
    from ..scanning import Severity
    if value is None or isinstance(value, Severity):
        return value
    return Severity.parse(str(value))


def _announce_scan(report, on_scan, refuse_at, allow_unsafe_source) -> None:
    if on_scan is not None:
        on_scan(report.scan)
    _refuse_if_unsafe(report, _severity(refuse_at), allow_unsafe_source)


def convert(src: str | os.PathLike, out: str | os.PathLike, *, max_shard_size: int | str | None = None,
            allow_unsafe_source: bool = False, refuse_at: Any = "critical", verify: bool = False,
            force: bool = False, include_all: bool = False, skip_unsupported: bool = False,
            metadata: dict[str, str] | None = None, record_source: bool = True,
            scan_report: Any = None, progress: Callable[[int], None] | None = None,
            chunk_bytes: int = CHUNK_BYTES, on_scan: Callable[[Any], None] | None = None,
            planned: Callable[[int], None] | None = None) -> ConvertReport:
    """Convert a model file or folder to safetensors without executing anything from it.

    Args:
        src: any input `tensorscope.open` reads (torch zip/legacy/TorchScript, DCP and sharded
            folders, ONNX, NumPy, safetensors).
        out: the output file (``model.safetensors``) or an existing folder (``out/model.safetensors``).
            Sharded outputs are named after it (see the module docstring).
        max_shard_size: bytes (or ``"5GB"``) per output shard; None keeps one file, or the input's
            sharding for a sharded input.
        allow_unsafe_source: convert even when the scan reaches ``refuse_at``.
        refuse_at: the scan severity that refuses the conversion (default ``critical``).
        verify: reopen every output and compare it with the input, bit for bit, before renaming.
        force: replace existing outputs.
        include_all, skip_unsupported: see `plan`.
        metadata: extra ``__metadata__`` entries (str -> str); they override the defaults.
        record_source: write ``format``, ``source_format``, ``source_sha256`` and ``converted_by``.
        scan_report: a `ScanReport` already computed for ``src``; None scans the model opened
            here (`tensorscope.scanning.scan_opened`: one parse for scanning and converting).
        on_scan: called with the scan report before anything is written (the CLI prints it).
        progress: called with the number of tensor bytes written after each piece.
        planned: called once with the number of tensor bytes to write, before the first is
            written (a progress bar's total).
        chunk_bytes: bytes copied per step (peak memory is a small multiple of it).

    Returns:
        The `ConvertReport` (status ``converted``).

    Raises:
        UnsafeSource: the scan reached ``refuse_at`` and ``allow_unsafe_source`` is False.
        Unconvertible: tensors safetensors cannot hold (named in the message).
        TensorscopeError: the input cannot be read, an output exists without ``force``,
            verification failed. No output file is left behind by any failure.

    Example:
        >>> report = convert("pytorch_model.bin", "model.safetensors", verify=True)  # doctest: +SKIP
        >>> report.tensors_written, report.outputs                                  # doctest: +SKIP
    """
    from ..formats import gc_paused, open_model
    from ..parsers.zip_dispatch import keeping_archive
    from ..scanning import scan_opened, scan_paths

    src, out = os.fspath(src), os.fspath(out)
    limit = check_arguments(src, out, force=force, max_shard_size=max_shard_size)
    report = ConvertReport(input=src, allowed_unsafe=bool(allow_unsafe_source))
    try:
        with keeping_archive():  # the scan below reuses the zip's central directory
            model = open_model(src)
    except TensorscopeError:
        # what cannot be opened is still judged first: a hostile file is refused as unsafe
        report.scan = scan_report if scan_report is not None else scan_paths(src)
        _announce_scan(report, on_scan, refuse_at, allow_unsafe_source)
        raise
    with model, contextlib.ExitStack() as after_scan:
        # the scan reads the model just opened: one parse for both
        report.scan = scan_report if scan_report is not None else scan_opened(src, model)
        model.evidence.archive = None  # read by the scan; the writing has no use for it
        # From here the collector stays paused while the 10^5-10^6 plan entries, header parts and
        # report rows are made (`formats.gc_paused`): the records it would walk are frozen, but
        # these new objects would set off full collections over each other again and again
        # (measured: the report rows took 3-7x longer). Not during the scan, whose garbage is
        # collected as it goes. The pause ends, and the records are unfrozen, with the model.
        after_scan.enter_context(gc_paused())
        _announce_scan(report, on_scan, refuse_at, allow_unsafe_source)
        report.source_format = model.format
        p = _checked_plan(model, report, include_all, skip_unsupported)
        if planned is not None:
            planned(p.total_bytes)
        groups, paths, index = _layout(model, p, out, limit)
        _check_targets(src, model, paths + ([index] if index else []), force)
        meta: dict[str, str] = {}
        if record_source:
            meta = {"format": "pt", "source_format": model.format, "source_sha256": _SHA_PLACEHOLDER,
                    "converted_by": f"tensorscope {__version__}"}
        if p.sparse:
            meta["tensorscope.sparse"] = json.dumps(p.sparse, sort_keys=True, separators=(",", ":"))
        meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
        hash_it = meta.get("source_sha256") == _SHA_PLACEHOLDER
        hasher = _Hasher(_input_files(model, src)) if hash_it else None
        temps: list[str] = []
        made = make_folders(paths + ([index] if index else []))
        try:
            if hasher is not None:
                hasher.start()
            sizes = []
            for group, final in zip(groups, paths):
                temps.append(f"{final}.tmp-{secrets.token_hex(4)}")
                sizes.append(_write_file(temps[-1], model, _data_order(group), meta, chunk_bytes,
                                         _releaser(model).release_piece, progress or (lambda n: None)))
            if hasher is not None:
                report.source_sha256, report.source_files = hasher.result(src)
                for tmp, hlen in zip(temps, sizes):  # fsyncs each file
                    _patch_hash(tmp, hlen, f'"source_sha256":"{_SHA_PLACEHOLDER}"'.encode(),
                                f'"source_sha256":"{report.source_sha256}"'.encode())
            else:
                report.source_sha256 = meta.get("source_sha256")
                for tmp in temps:
                    _fsync_file(tmp)
            if verify:
                for tmp, group in zip(temps, groups):
                    _verify(model, group, tmp)
                report.verified = True
            finals = list(paths)
            if index is not None:
                temps.append(f"{index}.tmp-{secrets.token_hex(4)}")
                _write_index(temps[-1], groups, paths)
                finals.append(index)
            for tmp, final in zip(temps, finals):  # shards first, the index last
                os.replace(tmp, final)
            _fsync_dir(os.path.dirname(os.path.abspath(paths[0])))
        except BaseException:
            for tmp in temps:  # first of all: no half-written output survives
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
            if hasher is not None:
                hasher.cancel()
            remove_folders(made)
            raise

        # Still inside ``with model`` and the collector's pause (see above).
        report.index = index
        for group, final in zip(groups, paths):
            report.outputs.append({"path": final, "tensors": len(group),
                                   "bytes": os.path.getsize(final)})
            report.tensors.extend([{"name": t.info.name, "dtype": t.st_dtype,
                                    "shape": list(t.st_shape), "nbytes": t.info.nbytes,
                                    "file": final} for t in group])
    return report


def _refuse_if_unsafe(report: ConvertReport, threshold, allow: bool) -> None:
    worst = report.scan.severity
    if worst is None or threshold is None or worst < threshold or allow:
        return
    report.status = "refused-unsafe"
    first = next(f for f in report.scan.findings if f.severity >= threshold)
    raise UnsafeSource(f"{report.input}: refused: the scan found {worst} issues ({first.rule}: "
                       f"{first.message}); nothing was converted. Pass --allow-unsafe-source "
                       "to convert the tensors anyway (conversion executes nothing)", report)


def _checked_plan(model: ModelFile, report: ConvertReport, include_all: bool,
                  skip_unsupported: bool) -> ConversionPlan:
    """`plan`, its outcome recorded in ``report``; raises Unconvertible when nothing may go on."""
    try:
        p = plan(model, include_all=include_all, skip_unsupported=skip_unsupported)
    except Unconvertible as e:
        e.report.scan, e.report.allowed_unsafe = report.scan, report.allowed_unsafe
        raise
    report.skipped = _listing(p.skipped)
    report.refused = _listing(p.refused)
    report.shared, report.expanded, report.contiguous = p.shared, p.expanded, p.contiguous
    if p.refused:
        report.status = "refused"
        shown = "; ".join(f"{t.name} ({why})" for t, why in p.refused[:8])
        more = f" (+{len(p.refused) - 8} more)" if len(p.refused) > 8 else ""
        raise Unconvertible(f"{report.input}: cannot convert {len(p.refused)} tensor(s) to "
                            f"safetensors: {shown}{more}. Pass --skip-unsupported to leave them out",
                            report)
    if not p.tensors:
        report.status = "refused"
        shown = ", ".join(f"{t.name} ({why})" for t, why in p.skipped[:5])
        raise Unconvertible(f"{report.input}: nothing to convert: no tensor is left to write "
                            f"({len(p.skipped)} skipped: {shown})", report)
    return p
