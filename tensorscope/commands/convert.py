"""`tensorscope convert IN OUT.safetensors`: untrusted checkpoints to safetensors, run nothing."""
from __future__ import annotations

from ..remote import with_cost
from ..render import (deferred_progress, emit_json, error_line, human_bytes, stderr_console,
                      stdout_console)
from ..safetext import shown

HELP = "convert a checkpoint (torch, ONNX, NumPy ...) to safetensors without executing it"
DESCRIPTION = """\
Convert any model tensorscope reads (torch zip, legacy and TorchScript files, DCP and sharded
checkpoints, ONNX, NumPy .npy/.npz, safetensors) to safetensors. Nothing from the input is
executed: the tensors are copied from the file's bytes, one bounded piece at a time, so memory
stays flat whatever the size.

The input is scanned first and the scan's summary printed; a finding at or above --refuse-on
(default: critical) refuses the conversion unless --allow-unsafe-source is given.

What is written: the state dict (parameters, persistent buffers, the tensors of plain dicts,
ONNX initializers), named as in the state dict. Tensors sharing a storage are each written as
their own copy (safetensors forbids aliasing), expanded and non-contiguous tensors are written
contiguous; all are reported. Dtypes safetensors cannot hold (complex128, complex32, quantized,
int4, strings ...) and meta tensors refuse the conversion, naming them, unless
--skip-unsupported. __metadata__ records format "pt", the source format and the input's sha256.

The output is written to OUT.tmp-<random> beside OUT, fsynced, verified if asked (--verify
reopens it and compares every tensor with the input, bit for bit), and only then renamed to OUT:
a failure never leaves a half-written file. An existing OUT is replaced only with --force.
A sharded input gives a sharded output (model-00001-of-0000N.safetensors and
model.safetensors.index.json next to OUT); --max-shard-size re-shards any input.

Exit status: 0 converted, 1 refused by the scan, 2 error (unsupported tensors included).

Example:
  tensorscope convert pytorch_model.bin model.safetensors
  tensorscope convert checkpoint.pt model.safetensors --verify --json
  tensorscope convert sharded_checkpoint/ out/model.safetensors
  tensorscope convert big.bin out/model.safetensors --max-shard-size 5GB
  tensorscope convert suspicious.pt weights.safetensors --allow-unsafe-source
"""

SEVERITIES = ["info", "low", "medium", "high", "critical"]
_SHOWN = 10  # names listed per section in the human summary


def add_arguments(p):
    p.add_argument("input", metavar="IN", help="model file or folder to convert")
    p.add_argument("output", metavar="OUT", help="output .safetensors file, or a folder (made if missing: end it with /)")
    p.add_argument("--max-shard-size", metavar="SIZE", default=None,
                   help="split the output into shards of at most SIZE (5GB, 500MiB, bytes); "
                        "default: one file, or the input's sharding")
    p.add_argument("--allow-unsafe-source", action="store_true",
                   help="convert even when the scan finds something at --refuse-on or above")
    p.add_argument("--refuse-on", default="critical", choices=SEVERITIES, metavar="SEVERITY",
                   help="scan severity that refuses the conversion (default: critical)")
    p.add_argument("--verify", action="store_true",
                   help="reopen the output and compare every tensor with the input before "
                        "putting it in place")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p.add_argument("--skip-unsupported", action="store_true",
                   help="leave out tensors safetensors cannot hold instead of refusing")
    p.add_argument("--all", action="store_true", dest="include_all",
                   help="write every tensor the file lists, not only the state dict "
                        "(non-persistent buffers, TorchScript constants, ONNX node constants)")
    p.add_argument("--json", action="store_true",
                   help="machine-readable report on stdout (schema: tensorscope.convert/1)")


def run(args) -> int:
    from ..convert import UnsafeSource, Unconvertible, check_arguments, convert
    from ..errors import TensorscopeError

    try:  # what is wrong with the arguments is said before the input is read
        limit = check_arguments(args.input, args.output, force=args.force,
                                max_shard_size=args.max_shard_size)
    except TensorscopeError as e:
        return error_line("convert", str(e))
    try:
        with deferred_progress("convert") as bar:
            report = convert(args.input, args.output, max_shard_size=limit,
                             allow_unsafe_source=args.allow_unsafe_source, refuse_at=args.refuse_on,
                             verify=args.verify, force=args.force, include_all=args.include_all,
                             skip_unsupported=args.skip_unsupported,
                             on_scan=None if args.json else _print_scan,
                             progress=lambda n: bar.advance(n), planned=bar.begin)
    except (UnsafeSource, Unconvertible) as e:
        if args.json:
            emit_json(with_cost(e.report.to_dict()))
        elif isinstance(e, Unconvertible):
            error_line("convert", str(e))
        else:
            _say(stderr_console(), f"tensorscope convert: {e}")
        return 1 if isinstance(e, UnsafeSource) else 2
    if args.json:
        emit_json(with_cost(report.to_dict()))
    else:
        _print_report(report)
    return 0


def _print_scan(scan) -> None:
    out = stdout_console()
    counts = {k: v for k, v in scan.counts().items() if v}
    if not scan.findings:
        _say(out, "scan: no findings")
        return
    parts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(),
                                                      key=lambda kv: -SEVERITIES.index(kv[0])))
    _say(out, f"scan: {len(scan.findings)} finding(s) ({parts}); worst: {scan.severity}")
    from ..scanning import Severity
    serious = [f for f in scan.findings if f.severity >= Severity.MEDIUM]
    for f in serious[:_SHOWN]:
        _say(out, f"  {f}")
    if len(serious) > _SHOWN:
        _say(out, f"  ... {len(serious) - _SHOWN} more (tensorscope scan shows all)")


def _say(console, text: str) -> None:
    """One line: escaped (names, globals and paths may hold anything), no markup, no
    highlighting, no wrapping."""
    console.print(shown(text), markup=False, highlight=False, soft_wrap=True)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" (+{len(names) - _SHOWN} more)" if len(names) > _SHOWN else "")


def _print_report(r) -> None:
    out = stdout_console()
    if r.allowed_unsafe and r.scan is not None and r.scan.unsafe:
        _say(out, "warning: the source is unsafe to load with torch.load; converted anyway "
                  "(--allow-unsafe-source). Conversion executed nothing from it.")
    for o in r.outputs:
        _say(out, f"wrote {o['path']}: {o['tensors']} tensors, {human_bytes(o['bytes'])}")
    if r.index:
        _say(out, f"wrote {r.index}")
    _say(out, f"{len(r.tensors)} tensors, {human_bytes(r.bytes_written)} from {r.source_format} "
              f"(sha256 {r.source_sha256})")
    for storage, names in r.shared.items():
        _say(out, f"shared storage {storage}: each written as its own copy: {_names(names)}")
    if r.expanded:
        _say(out, f"expanded (overlapping strides, written materialised): {_names(r.expanded)}")
    if r.contiguous:
        _say(out, f"non-contiguous, written contiguous: {_names(r.contiguous)}")
    if r.skipped:
        _say(out, f"skipped {len(r.skipped)}: "
                  + _names([f"{s['name']} ({s['reason']})" for s in r.skipped]))
    if r.verified:
        _say(out, "verified: every tensor equals the input, bit for bit")
