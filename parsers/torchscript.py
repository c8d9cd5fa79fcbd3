"""TorchScript archives (``torch.jit.save``, ``_save_for_lite_interpreter``): read without torch.

Spec (torch 2.13; FORMATS.md "TorchScript" has the verified entry order):
- A zip whose entries share one top-level folder ``P/`` (the file stem at save time). Records are
  STORED and 64-byte aligned like ``torch.save`` archives, without ``.format_version``.
- ``P/data.pkl`` is the module object graph: each scripted object is ``GLOBAL '__torch__.<mod>
  <Class>'``, ``EMPTY_TUPLE NEWOBJ``, then ``BUILD {attribute: value}`` holding EVERY attribute
  (parameters, buffers, submodules, plain attributes, ``training`` ...). Storages are
  ``('storage', cls, key, location, numel)`` persistent ids whose bytes are ``P/data/<key>``.
  Storage classes MAY name dtypes Python's torch has no class for (``UInt16Storage``,
  ``Float8_e4m3fnStorage`` ...); ``_rebuild_tensor_v2`` is used for every dtype.
- Typed containers are wrapped: ``torch.jit._pickle.build_tensorlist(list)`` (and
  ``build_intlist``/``build_doublelist``/``build_boollist``), ``restore_type_tag(value, "Dict[str,
  Tensor]")``: both stand for their first argument.
- ``P/code/__torch__/<mod path>.py`` holds each class's source; a Module class lists its
  parameters and buffers (``__parameters__ = ["weight", "bias", ]``, ``__buffers__ = [...]``).
  Those lists decide which attributes ``state_dict()`` returns: parameters then buffers of each
  module in attribute order, then its submodules, recursively. Other tensor attributes are listed
  with role ``attribute`` (not in ``state_dict``). The sources are parsed as text, never run.
- ``P/constants.pkl`` is a tuple of constants whose storages live in ``P/constants/<key>`` (keys
  MAY be non-numeric: ``0.storage``); they are listed as ``constants.<i>``, role ``constant``.
- ``P/traced_inputs.pkl`` (traced modules) maps method names to example inputs whose storages
  ``P/traced_inputs/<key>`` are stored EMPTY (0 bytes) while the pickle claims their size: such
  tensors are listed (role ``input``, `TensorInfo.has_data` False) as data-less, out of the byte
  totals, without an anomaly.
- ``P/bytecode.pkl`` (lite interpreter) is the mobile bytecode; its tensors share the
  ``constants/`` key space. ``P/extra/<name>`` are user files (``_extra_files``).
- ``P/version``, ``P/byteorder`` ("little"/"big") and ``P/.data/serialization_id`` MAY be present.

Public: ``FORMAT``, ``open_zip(src, archive) -> ModelFile`` (called by `zip_dispatch`),
``parse_class_table(code: dict) -> dict``.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from tensorscope.errors import FormatError
from tensorscope.model import ModelFile
from tensorscope.source import ByteSource

from . import pickle_vm, torch_pickle
from .pickle_vm import Call, Global
from .torch_pickle import TensorRef
from .torch_zip import archive_metadata, load_pickle_member, make_storage_resolver
from .zipfmt import ZipArchive

__all__ = ["FORMAT", "open_zip", "parse_class_table", "ScriptClass"]

FORMAT = "torchscript"
CODE_FILE_MAX = 16 << 20     # one code file's text (real ones are KBs)
CODE_TOTAL_MAX = 256 << 20   # all code text kept in memory
EXTRA_PREVIEW_INFLATE_MAX = 4 << 20  # a compressed extra file bigger than this gets no preview
EXTRA_PREVIEW = 4096         # bytes of each extra file shown as text
MAX_MODULES = 1_000_000      # modules walked (a DAG of shared modules could otherwise explode)
MAX_TENSORS = 10_000_000     # tensor entries listed (shared modules repeat theirs, as state_dict does)

_CLASS = re.compile(r"^class\s+([A-Za-z_]\w*)\s*(?:\(([^)]*)\))?\s*:", re.M)
_NAME_LIST = re.compile(r"^[ \t]+(__parameters__|__buffers__)[ \t]*=[ \t]*\[([^\]\n]*)\]", re.M)
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


@dataclass(slots=True)
class ScriptClass:
    """What a class's code says about its attributes."""

    qualname: str              # __torch__.torch.nn.modules.linear.Linear
    member: str                # the code file that defines it
    bases: str = ""
    parameters: list[str] = field(default_factory=list)
    buffers: list[str] = field(default_factory=list)

    @property
    def is_module(self) -> bool:
        return self.bases.strip() == "Module" or "__parameters__" in self.bases


def _module_of(member: str, prefix: str) -> str | None:
    """``P/code/__torch__/a/b.py`` -> ``__torch__.a.b``."""
    head = f"{prefix}/code/"
    if not member.startswith(head) or not member.endswith(".py"):
        return None
    return member[len(head):-3].replace("/", ".")


def parse_class_table(code: dict[str, str], prefix: str) -> dict[str, ScriptClass]:
    """Classes defined by the archive's code files, by qualified name. Static text parsing only."""
    table: dict[str, ScriptClass] = {}
    for member, text in code.items():
        module = _module_of(member, prefix)
        if module is None:
            continue
        starts = list(_CLASS.finditer(text))
        for i, m in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
            body = text[m.end():end]
            cls = ScriptClass(f"{module}.{m.group(1)}", member, m.group(2) or "")
            for lm in _NAME_LIST.finditer(body):
                names = [s.group(1) for s in _STRING.finditer(lm.group(2))]
                if lm.group(1) == "__parameters__":
                    cls.parameters = names
                else:
                    cls.buffers = names
            table.setdefault(cls.qualname, cls)
    return table


# -- hooks ----------------------------------------------------------------------------------------
def _first_arg(name: str, n_max: int):
    def hook(args, pos):
        if not isinstance(args, tuple) or not 1 <= len(args) <= n_max:
            raise pickle_vm.PickleError(f"torch.jit._pickle.{name} takes 1..{n_max} arguments",
                                        offset=pos)
        return args[0]
    return hook


_JIT_HOOKS = {
    ("torch.jit._pickle", "build_tensorlist"): _first_arg("build_tensorlist", 1),
    ("torch.jit._pickle", "build_intlist"): _first_arg("build_intlist", 1),
    ("torch.jit._pickle", "build_doublelist"): _first_arg("build_doublelist", 1),
    ("torch.jit._pickle", "build_boollist"): _first_arg("build_boollist", 1),
    ("torch.jit._pickle", "restore_type_tag"): _first_arg("restore_type_tag", 2),
}


def script_hooks() -> dict:
    hooks = torch_pickle.rebuild_hooks()
    hooks.update(_JIT_HOOKS)
    return hooks


# -- naming -------------------------------------------------------------------------------------------
def _qualname(obj) -> str | None:
    if isinstance(obj, Call) and isinstance(obj.func, Global) and obj.func.module.startswith("__torch__"):
        return obj.func.dotted
    return None


def _is_script_module(obj, classes: dict[str, ScriptClass]) -> bool:
    name = _qualname(obj)
    if name is None:
        return False
    cls = classes.get(name)
    if cls is not None:
        return cls.is_module
    return isinstance(obj.state, dict) and "training" in obj.state  # no code: the Module marker


def module_tensors(root, classes: dict[str, ScriptClass], model: ModelFile, file: str):
    """Yield ``(path, TensorRef)`` in ``state_dict()`` order, then the other tensor attributes.

    Each module gives its parameters, then its buffers (attribute order within each), then
    tensors in plain attributes (role ``attribute``), then its submodules, depth first. A module
    reachable twice is listed under both paths, as ``state_dict()`` does; a module inside itself
    is reported and cut.
    """
    if not _is_script_module(root, classes):
        for path, _raw, ref in torch_pickle.named_tensors(root):
            yield path, ref
        return
    missing: set[str] = set()
    # Tensors inside one attribute value, walked once however many modules share the value:
    # a value referenced from many places (one BINGET each) must not be walked again each time.
    inside: dict[int, list] = {}
    stack: list[tuple[Call, tuple[str, ...], frozenset[int]]] = [(root, (), frozenset())]
    walked = listed = 0
    while stack:
        obj, path, ancestors = stack.pop()
        walked += 1
        if walked > MAX_MODULES or listed > MAX_TENSORS:
            model.evidence.add("torchscript.too_many_modules",
                               f"more than {MAX_MODULES} modules or {MAX_TENSORS} tensor entries: "
                               "the listing stops", file=file)
            return
        name = _qualname(obj)
        cls = classes.get(name)
        if cls is None and name not in missing:
            missing.add(name)
            model.evidence.add("torchscript.class_without_code",
                               f"class {name} has no code in the archive: parameters and buffers "
                               "cannot be told apart", file=file)
        state = obj.state if isinstance(obj.state, dict) else {}
        params = set(cls.parameters) if cls else set()
        buffers = set(cls.buffers) if cls else set()
        own, attrs, subs = [], [], []
        for attr, value in state.items():
            key = attr if isinstance(attr, str) else str(attr)
            if isinstance(value, TensorRef) and (key in params or key in buffers):
                own.append((0 if key in params else 1, path + (key,),
                            value.with_role("parameter" if key in params else "buffer")))
            elif _is_script_module(value, classes):
                if id(value) in ancestors:
                    model.evidence.add("torchscript.module_cycle",
                                       f"module {'.'.join(path + (key,))} contains itself",
                                       file=file)
                else:
                    subs.append((value, path + (key,), ancestors | {id(obj)}))
            elif isinstance(value, (TensorRef, list, tuple, dict, Call)):
                found = inside.get(id(value))
                if found is None:
                    found = inside[id(value)] = [(p, r) for p, _raw, r in
                                                 torch_pickle.named_tensors(value)]
                role = "attribute" if cls is not None else "tensor"
                attrs.extend((path + (key,) + sub_path, ref.with_role(role)) for sub_path, ref in found)
        listed += len(own) + len(attrs)
        own.sort(key=lambda item: item[0])  # stable: parameters first, each in attribute order
        for _, p, ref in own:
            yield p, ref
        yield from attrs
        stack.extend(reversed(subs))


# -- the archive ---------------------------------------------------------------------------------------
def _read_text(archive: ZipArchive, name: str, cap: int) -> tuple[str | None, str | None]:
    member = archive.get(name)
    if member is None:
        return None, "missing"
    if member.error:
        return None, member.error
    if member.size > cap:
        return None, f"{member.size} bytes, more than the {cap} bytes kept"
    try:
        return archive.read_bytes(member, cap).decode("utf-8", "replace"), None
    except FormatError as e:
        return None, str(e)


def _code_sources(archive: ZipArchive, prefix: str, model: ModelFile) -> dict[str, str]:
    code: dict[str, str] = {}
    total = 0
    for name in archive.names():
        if not name.startswith(f"{prefix}/code/") or not name.endswith(".py"):
            continue
        text, why = _read_text(archive, name, min(CODE_FILE_MAX, CODE_TOTAL_MAX - total))
        if text is None:
            model.evidence.add("torchscript.code_unreadable", f"code file not read: {why}",
                               file=archive.source.path, member=name)
            continue
        total += len(text)
        code[name] = text
    return code


def _extra_files(archive: ZipArchive, prefix: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    head = f"{prefix}/extra/"
    for name in archive.names():
        if not name.startswith(head) or name == head:
            continue
        member = archive.get(name)
        entry: dict = {"size": member.size, "member": name, "text": None}
        if member.error:
            entry["error"] = member.error
        else:
            try:
                if member.is_stored:
                    raw = bytes(archive.data(member)[:EXTRA_PREVIEW])
                else:
                    raw = archive.read_bytes(member, EXTRA_PREVIEW_INFLATE_MAX)[:EXTRA_PREVIEW]
            except FormatError as e:
                entry["error"] = str(e)
                raw = b""
            try:
                entry["text"] = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                # A preview cut inside a multi-byte character is still text.
                if e.start >= len(raw) - 3 and e.reason == "unexpected end of data":
                    entry["text"] = raw[:e.start].decode("utf-8")
                else:
                    entry["head"] = raw[:32].hex()
        out[name[len(head):]] = entry
    return out


def _infos(entries, model: ModelFile, file: str, *, quiet_empty: bool = False) -> list:
    """TensorInfos from (path, TensorRef) pairs, each checked against its storage record."""
    out = []
    for path, ref in entries:
        s = ref.storage
        if quiet_empty and s is not None and s.error is None and s.nbytes == 0 and ref.shape and \
                not torch_pickle.tensor_fits(ref):
            s.error = f"record {s.member} is stored empty (torch saves traced inputs without data)"
            info = dataclasses.replace(   # listed, out of the byte totals
                torch_pickle.to_tensor_info(path, path, ref, fmt=FORMAT, file=file), has_data=False)
            out.append(info)
            continue
        info = torch_pickle.to_tensor_info(path, path, ref, fmt=FORMAT, file=file)
        if s is not None and s.error:
            model.evidence.add("torch.storage_unreadable", f"tensor {info.name!r}: {s.error}",
                               file=s.file, member=s.member)
        elif not torch_pickle.tensor_fits(ref):
            model.evidence.add("torch.tensor_out_of_storage",
                               f"tensor {info.name!r} addresses bytes past the end of its storage "
                               f"record ({s.nbytes} bytes)", file=s.file, member=s.member)
        if info.dtype.startswith("unknown:"):
            torch_pickle.note_unknown_dtype(model, info)
        out.append(info)
    return out


def _prefixed(prefix: str, root, role: str):
    for path, _raw, ref in torch_pickle.named_tensors(root):
        yield (prefix,) + path, ref.with_role(role)


def open_zip(src: ByteSource, archive: ZipArchive) -> ModelFile:
    prefix = archive.torch_prefix()
    if prefix is None:
        raise FormatError("zip archive has no top-level folder: not a TorchScript archive",
                          format=FORMAT, file=src.path)
    model = ModelFile(FORMAT, src.path, sources={src.path: src})
    model.evidence.anomalies.extend(archive.anomalies)
    hooks = script_hooks()

    code = _code_sources(archive, prefix, model)
    model.evidence.code.update(code)
    model.extras["code"] = code
    classes = parse_class_table(code, prefix)
    model.extras["classes"] = {
        name: {"member": c.member, "module": c.is_module, "parameters": list(c.parameters),
               "buffers": list(c.buffers)} for name, c in classes.items()}
    model.extras["extra_files"] = _extra_files(archive, prefix)

    tensors = []
    pkl = f"{prefix}/data.pkl"
    if archive.get(pkl) is None:
        raise FormatError(f"TorchScript archive has no {pkl} (first members: "
                          f"{', '.join(archive.names()[:5])})", format=FORMAT, file=src.path)
    load, _ = make_storage_resolver(archive, prefix, "data")
    result, record = load_pickle_member(archive, pkl, persistent_load=load, hooks=hooks)
    model.evidence.pickles.append(record)
    result.raise_for_error()
    model.objects = result.value
    tensors += _infos(module_tensors(result.value, classes, model, src.path), model, src.path)

    const_load, const_storages = make_storage_resolver(archive, prefix, "constants")
    name = f"{prefix}/constants.pkl"
    constants = ()
    if archive.get(name) is not None:
        result_c, record = load_pickle_member(archive, name, persistent_load=const_load,
                                              hooks=hooks, role="constants")
        model.evidence.pickles.append(record)
        result_c.raise_for_error()
        constants = result_c.value
        tensors += _infos(_prefixed("constants", constants, "constant"), model, src.path)

    name = f"{prefix}/traced_inputs.pkl"
    traced = 0
    if archive.get(name) is not None:
        load_t, _ = make_storage_resolver(archive, prefix, "traced_inputs")
        result_t, record = load_pickle_member(archive, name, persistent_load=load_t, hooks=hooks,
                                              role="traced_inputs")
        model.evidence.pickles.append(record)
        result_t.raise_for_error()
        inputs = _infos(_prefixed("traced_inputs", result_t.value, "input"), model, src.path,
                        quiet_empty=True)
        traced = len(inputs)
        tensors += inputs

    name = f"{prefix}/bytecode.pkl"
    bytecode_version = None
    if archive.get(name) is not None:
        # Mobile bytecode shares the constants/ key space (and storages) with constants.pkl.
        load_b, _ = make_storage_resolver(archive, prefix, "constants", const_storages)
        result_b, record = load_pickle_member(archive, name, persistent_load=load_b, hooks=hooks,
                                              role="bytecode")
        model.evidence.pickles.append(record)
        result_b.raise_for_error()
        value = result_b.value
        if isinstance(value, tuple) and value and isinstance(value[0], int) \
                and not isinstance(value[0], bool):
            bytecode_version = value[0]

    model.tensors = tensors
    meta = archive_metadata(archive, prefix)
    meta.update({
        "pickle_protocol": result.protocol,
        "root_class": _qualname(result.value),
        "code_files": len(code), "classes": len(classes),
        "extra_files": sorted(model.extras["extra_files"]),
        "constants": len(constants) if isinstance(constants, (tuple, list)) else None,
        "traced_inputs": traced,
        "lite_interpreter": bytecode_version is not None,
    })
    if bytecode_version is not None:
        meta["bytecode_version"] = bytecode_version
    model.metadata = meta
    if meta.get("byteorder", "little") != "little":
        torch_pickle.install_byteswap_readers(model)
    return model
