"""torch.export archives (``.pt2``, ``torch.export.save``): read without torch.

Spec (torch 2.13, PT2 archive version 0; FORMATS.md "torch.export" has the verified facts):
- The file MUST be a zip with one top-level folder ``P/`` (the file stem at save time, ``archive``
  for a buffer). ``P/archive_format`` SHOULD hold ``pt2``, ``P/archive_version`` ``0``. Records are
  STORED and 64-byte aligned like torch.save archives.
- ``P/models/<m>.json`` is the serialized ExportedProgram of model ``<m>`` (``model`` for
  ``torch.export.save``): ``graph_module.signature`` lists ``input_specs`` (``parameter``,
  ``buffer`` (+``persistent``), ``tensor_constant``, ``custom_obj``, ``user_input``, ``token``,
  ``constant_input``) and ``output_specs``; ``graph_module.graph.nodes`` the ops.
- ``P/data/weights/<m>_weights_config.json`` = ``{"config": {fqn: PayloadMeta}}`` with PayloadMeta
  ``{path_name, is_param, use_pickle, tensor_meta{dtype: ScalarType code, sizes: [{"as_int": n}],
  strides, storage_offset: {"as_int"}, requires_grad, device, layout}}``. The FQNs are the
  program's ``state_dict`` (parameters and persistent buffers), in order.
- ``use_pickle: false``: ``P/data/weights/<path_name>`` holds the raw bytes of ONE whole storage,
  shared by every FQN of a storage group (tied weights share it). The loader makes a flat tensor
  of the FIRST entry's dtype over the record (its size MUST be a multiple of that itemsize; an
  EMPTY record becomes zeros of the entry's size) and ``as_strided``s every entry over it, so a
  view MUST lie inside the record.
- ``use_pickle: true``: the record is a complete torch.save zip of the tensor (tensor subclasses).
- ``P/data/constants/<m>_constants_config.json`` is the same for ``constants`` (non-persistent
  buffers, lifted tensor constants: ``tensor_<i>``), plus ``custom_obj_<i>`` (TorchScript-pickled
  torchbind objects) and ``opaque_obj_<i>`` (a PLAIN pickle that torch.export.load unpickles:
  recorded as evidence, never run).
- ``P/data/sample_inputs/<m>.pt`` is a torch.save zip of ``(args, kwargs)``.
- Legacy archives MAY hold ``P/data/weights/<m>.pt`` / ``P/data/constants/<m>.pt`` (torch.save of
  the whole dict) instead of the configs.
- ``P/extra/*`` are user files; ``P/data/aotinductor/`` compiled artifacts (listed, not read).

What this parser produces: one TensorInfo per state_dict entry (role ``parameter``/``buffer``)
then per tensor constant (role ``constant``), named by FQN (``<m>.<fqn>`` when the archive holds
several models). Raw weights are zero-copy views over the record; a pickled (subclass) weight that
holds one plain tensor is a view over the nested blob, otherwise it is listed with its
``tensor_meta`` and no readable bytes (``extras["inner_tensors"]`` lists what the blob holds).
Sample inputs are NOT tensors of the model: they are listed in ``extras["sample_inputs"]`` (name,
dtype, shape, byte_offset), so a diff of two programs compares weights only. ``extras`` also has
``graph_signature`` and ``op_counts`` per model; ``metadata`` a summary. Empty records are read
as zeros (a copy, as the loader does).

Public: ``FORMAT``, ``open_zip(src, archive) -> ModelFile`` (called by `zip_dispatch`).
"""
from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

import numpy as np

from tensorscope import dtypes
from tensorscope.errors import FormatError, brief
from tensorscope.model import ModelFile, PickleRecord, TensorInfo
from tensorscope.source import ByteSource

from . import pickle_vm, torch_pickle
from .torch_nested import open_nested_save
from .torch_zip import archive_metadata
from .zipfmt import ZipArchive, ZipMember

__all__ = ["FORMAT", "open_zip", "SCALAR_TYPES", "read_programs"]

FORMAT = "pt2"
JSON_MAX = 256 << 20        # models/<m>.json and the payload configs (real ones are KBs..MBs)
OBJECT_PICKLE_MAX = 64 << 20
SIGNATURE_NAMES_MAX = 1000  # names kept per signature kind in extras

# torch._export.serde.schema.ScalarType -> canonical dtype (FORMATS.md "Dtype vocabulary").
SCALAR_TYPES: dict[int, str] = {
    1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
    8: "float64", 9: "complex32", 10: "complex64", 11: "complex128", 12: "bool", 13: "bfloat16",
    28: "uint16", 29: "float8_e4m3fn", 30: "float8_e5m2", 31: "float8_e4m3fnuz",
    32: "float8_e5m2fnuz", 33: "float8_e8m0fnu", 34: "uint32", 35: "uint64",
}
LAYOUT_STRIDED = 7

# input_spec kind -> the field naming the state_dict/constant entry.
_INPUT_NAME_FIELDS = {"parameter": "parameter_name", "buffer": "buffer_name",
                      "tensor_constant": "tensor_constant_name", "custom_obj": "custom_obj_name"}


def _fail(reason: str, src: ByteSource, member: str | None = None, offset: int | None = None):
    return FormatError(reason, format=FORMAT, file=src.path, member=member, offset=offset)


# -- JSON records ---------------------------------------------------------------------------------
def _read_json(archive: ZipArchive, name: str) -> Any:
    src = archive.source
    member = archive.get(name)
    if member is None:
        raise _fail(f"no {name} record in the archive", src)
    raw = archive.read_bytes(member, JSON_MAX)
    try:
        return json.loads(raw)
    except RecursionError:
        raise _fail("JSON nests too deeply", src, name, member.data_offset) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        pos = getattr(e, "pos", None)
        raise _fail(f"invalid JSON: {e}", src, name,
                    member.data_offset + pos if isinstance(pos, int) else member.data_offset) from None


def _get(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(k)
    return obj


def _summarize_program(program: Any) -> tuple[dict, dict, dict[str, set[str]]]:
    """(metadata summary, extras graph signature, names per input kind) of one models/<m>.json."""
    signature: dict[str, Any] = {"inputs": {}, "outputs": {}}
    names: dict[str, set[str]] = {}
    sig = _get(program, "graph_module", "signature")
    for direction, key in (("inputs", "input_specs"), ("outputs", "output_specs")):
        specs = _get(sig, key)
        for spec in specs if isinstance(specs, list) else ():
            if not isinstance(spec, dict) or len(spec) != 1:
                continue
            kind, body = next(iter(spec.items()))
            field = _INPUT_NAME_FIELDS.get(kind) if direction == "inputs" else None
            label = body.get(field) if field and isinstance(body, dict) else None
            if label is None:   # user inputs/outputs, mutations: the graph value's name
                arg = _get(body, "arg")
                label = _get(arg, "name") or _get(arg, "as_tensor", "name") or kind
                target = _get(body, "buffer_name") or _get(body, "parameter_name")
                if target:
                    label = f"{label} -> {target}"
            bucket = signature[direction].setdefault(kind, [])
            if len(bucket) < SIGNATURE_NAMES_MAX:
                bucket.append(str(label))
            if direction == "inputs" and field and isinstance(label, str):
                names.setdefault(kind, set()).add(label)
                if kind == "buffer" and _get(body, "persistent") is False:
                    names.setdefault("buffer(non-persistent)", set()).add(label)
    nodes = _get(program, "graph_module", "graph", "nodes")
    ops = Counter(str(n.get("target")) for n in nodes if isinstance(n, dict)) \
        if isinstance(nodes, list) else Counter()
    schema = _get(program, "schema_version")
    summary = {
        "nodes": sum(ops.values()),
        "inputs": {k: len(v) for k, v in signature["inputs"].items()},
        "outputs": {k: len(v) for k, v in signature["outputs"].items()},
    }
    if isinstance(schema, dict):
        summary["schema_version"] = f"{schema.get('major')}.{schema.get('minor')}"
    for key in ("torch_version", "opset_version", "verifiers"):
        value = _get(program, key)
        if isinstance(value, (str, int, list, dict)):
            summary[key] = value
    rc = _get(program, "range_constraints")
    if isinstance(rc, dict) and rc:
        summary["range_constraints"] = len(rc)
    return summary, {"signature": signature, "op_counts": dict(ops.most_common())}, names


# -- payload configs ------------------------------------------------------------------------------
class _Meta:
    """A validated ``tensor_meta``."""

    __slots__ = ("dtype", "shape", "stride", "storage_offset", "requires_grad", "extras")

    def __init__(self, meta: Any, where: str, src: ByteSource, member: str):
        def bad(reason: str) -> FormatError:
            return _fail(f"{where}: {reason}", src, member)
        if not isinstance(meta, dict):
            raise bad("tensor_meta is missing or not an object")
        code = meta.get("dtype")
        if isinstance(code, bool) or code not in SCALAR_TYPES:
            raise bad(f"unknown dtype code {brief(code, 40)}")
        self.dtype = SCALAR_TYPES[code]
        self.shape = self._ints(meta.get("sizes"), "sizes", bad)
        self.stride = self._ints(meta.get("strides"), "strides", bad)
        if len(self.stride) != len(self.shape):
            raise bad(f"strides {self.stride} do not match sizes {self.shape}")
        self.storage_offset = self._int(meta.get("storage_offset"), "storage_offset", bad)
        self.requires_grad = meta.get("requires_grad") is True
        self.extras: dict[str, Any] = {}
        device = meta.get("device")
        if isinstance(device, dict) and device.get("type") not in (None, "cpu"):
            self.extras["device"] = f"{device.get('type')}:{device.get('index')}"
        layout = meta.get("layout")
        if layout not in (None, LAYOUT_STRIDED):
            self.extras["layout"] = layout

    @staticmethod
    def _int(v: Any, what: str, bad) -> int:
        n = v.get("as_int") if isinstance(v, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise bad(f"{what} must be {{\"as_int\": n >= 0}} (symbolic sizes are not weights), "
                      f"got {brief(v, 60)}")
        return n

    @classmethod
    def _ints(cls, v: Any, what: str, bad) -> tuple[int, ...]:
        if not isinstance(v, list) or len(v) > 64:
            raise bad(f"{what} must be a list of at most 64 dimensions")
        return tuple(cls._int(x, what, bad) for x in v)


def _config(archive: ZipArchive, name: str) -> list[tuple[str, dict]]:
    doc = _read_json(archive, name)
    config = _get(doc, "config")
    if not isinstance(config, dict):
        raise _fail('payload config has no "config" object', archive.source, name)
    out = []
    for fqn, entry in config.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path_name"), str):
            raise _fail(f"entry {fqn!r}: missing path_name", archive.source, name)
        out.append((fqn, entry))
    return out


class _Loader:
    """Builds the tensor list of one archive."""

    def __init__(self, src: ByteSource, archive: ZipArchive, prefix: str, model: ModelFile):
        self.src = src
        self.archive = archive
        self.prefix = prefix
        self.model = model

    def member(self, name: str, config: str, fqn: str) -> ZipMember:
        member = self.archive.get(name)
        if member is None:
            raise _fail(f"entry {fqn!r} names record {name}, which the archive does not hold",
                        self.src, config)
        if member.error:
            raise _fail(member.error, self.src, name, member.header_offset)
        if not member.is_stored:
            raise _fail(f"record is compressed (method {member.method}): torch cannot map it",
                        self.src, name, member.header_offset)
        return member

    def payloads(self, model_name: str, config_name: str, folder: str, *, kind: str,
                 names: list[str], qualify) -> list[TensorInfo]:
        """Tensors of one payload config (weights or constants)."""
        config = self.archive.get(config_name)
        if config is None:
            return []
        entries = _config(self.archive, config_name)
        first_dtype: dict[str, str] = {}
        out = []
        for fqn, entry in entries:
            names.append(fqn)
            path_name = entry["path_name"]
            record = f"{self.prefix}/{folder}/{path_name}"
            where = f"entry {fqn!r}"
            if kind == "constant" and not path_name.startswith("tensor_"):
                self.object_payload(fqn, record, config_name)
                continue
            role = "constant" if kind == "constant" else (
                "parameter" if entry.get("is_param") is True else "buffer")
            if entry.get("use_pickle") is True:
                out.append(self.pickled(fqn, entry, record, config_name, role, qualify))
                continue
            meta = _Meta(entry.get("tensor_meta"), where, self.src, config_name)
            member = self.member(record, config_name, fqn)
            dtype = first_dtype.setdefault(path_name, meta.dtype)
            if dtype != meta.dtype:
                self.model.evidence.add(
                    "pt2.storage_dtype_mismatch",
                    f"{where} says {meta.dtype} but record {path_name} is first typed {dtype}; "
                    f"torch.export.load views it as {dtype}", file=self.src.path, member=config_name)
            out.append(self.raw(fqn, meta, dtype, member, role, qualify, config_name))
        return out

    def raw(self, fqn: str, meta: _Meta, dtype: str, member: ZipMember, role: str, qualify,
            config: str) -> TensorInfo:
        name, path = qualify(fqn)
        spec = dtypes.spec(dtype)
        extras = dict(meta.extras, member=member.name)
        if meta.requires_grad:
            extras["requires_grad"] = True
        if member.size and member.size % spec.itemsize:
            raise _fail(f"record size {member.size} is not a multiple of the {spec.itemsize}-byte "
                        f"{dtype} element (entry {fqn!r})", self.src, member.name, member.data_offset)
        common = dict(name=name, dtype=dtype, shape=meta.shape, stride=meta.stride,
                      storage_offset=meta.storage_offset, file=self.src.path,
                      storage_key=member.name.rsplit("/", 1)[-1], path=path, source_format=FORMAT,
                      role=role)
        numel = math.prod(meta.shape)
        if member.size == 0:
            # The loader makes zeros of the entry's size: a copy, documented.
            info = TensorInfo(**common, storage_nbytes=0, extras=dict(extras, empty_record=True))
            shape, np_dtype = meta.shape, spec.numpy if spec.numpy is not None else np.uint8
            self.model.custom_readers[name] = lambda: _zeros(shape, np_dtype)
            return info
        last = meta.storage_offset + sum((d - 1) * s for d, s in zip(meta.shape, meta.stride))
        if numel and (last + 1) * spec.itemsize > member.size:
            raise _fail(f"entry {fqn!r} ({dtype} {list(meta.shape)}, strides {list(meta.stride)}, "
                        f"offset {meta.storage_offset}) addresses bytes past the end of its "
                        f"{member.size}-byte record", self.src, member.name, member.data_offset)
        return TensorInfo(**common, byte_offset=member.data_offset + meta.storage_offset * spec.itemsize,
                          storage_nbytes=member.size, extras=extras)

    def pickled(self, fqn: str, entry: dict, record: str, config: str, role: str,
                qualify) -> TensorInfo:
        name, path = qualify(fqn)
        member = self.member(record, config, fqn)
        nested = open_nested_save(self.src, member.data_offset, member.size, label=member.name,
                                  fmt=FORMAT, role="pt2.pickled_payload")
        self.model.evidence.pickles.append(nested.record)
        self.model.evidence.anomalies.extend(nested.anomalies)
        inner = [(p, t) for p, _, t in nested.tensors]
        extras: dict[str, Any] = {"member": member.name, "pickled": True,
                                  "inner_tensors": [_ref_dict(torch_pickle.dotted(p), t) for p, t in inner]}
        root = nested.value
        if isinstance(root, pickle_vm.Call) and len(root.args) > 1:
            arg = root.args[1] if isinstance(root.args[1], pickle_vm.Global) else None
            if arg is None and isinstance(root.args[1], tuple) and root.args[1] and \
                    isinstance(root.args[1][0], pickle_vm.Global):
                arg = root.args[1][0]
            if arg is not None:
                extras["subclass"] = arg.dotted
        if isinstance(root, torch_pickle.TensorRef) and len(inner) == 1:
            # A plain tensor (or Parameter) saved on its own: a view over the nested blob.
            info = torch_pickle.to_tensor_info(path, path, inner[0][1], fmt=FORMAT, file=self.src.path)
            return TensorInfo(name=name, dtype=info.dtype, shape=info.shape, stride=info.stride,
                              storage_offset=info.storage_offset, byte_offset=info.byte_offset,
                              file=self.src.path, storage_key=info.storage_key,
                              storage_nbytes=info.storage_nbytes, path=path, source_format=FORMAT,
                              role=role, extras={**info.extras, **extras})
        meta = _Meta(entry.get("tensor_meta"), f"entry {fqn!r}", self.src, config)
        return TensorInfo(name=name, dtype=meta.dtype, shape=meta.shape, stride=meta.stride,
                          storage_offset=meta.storage_offset, file=self.src.path, path=path,
                          source_format=FORMAT, role=role, extras=dict(meta.extras, **extras))

    def object_payload(self, fqn: str, record: str, config: str) -> None:
        """custom_obj_* / opaque_obj_*: objects torch.export.load unpickles. Recorded, never run."""
        member = self.member(record, config, fqn)
        if member.size > OBJECT_PICKLE_MAX:
            raise _fail(f"object payload of {member.size} bytes exceeds {OBJECT_PICKLE_MAX}",
                        self.src, member.name, member.data_offset)
        data = self.archive.data(member)
        objects = self.model.extras.setdefault("constant_objects", {})
        if bytes(data[:4]) == b"PK\x03\x04":
            nested = open_nested_save(self.src, member.data_offset, member.size, label=member.name,
                                      fmt=FORMAT, role="pt2.constant_object")
            self.model.evidence.pickles.append(nested.record)
            self.model.evidence.anomalies.extend(nested.anomalies)
            objects[fqn] = {"member": member.name, "kind": "torch.save"}
            return
        result = pickle_vm.run(data, hooks=pickle_vm.CONTAINER_HOOKS, file=self.src.path,
                               member=member.name, base_offset=member.data_offset)
        self.model.evidence.pickles.append(PickleRecord(self.src.path, member.name,
                                                        member.data_offset, len(data), result,
                                                        role="pt2.constant_object"))
        objects[fqn] = {"member": member.name, "kind": "pickle",
                        "globals": sorted({g.dotted for g in result.globals})[:20]}
        if result.error is not None:
            objects[fqn]["error"] = str(result.error)

    def legacy(self, record: str, role: str, qualify) -> list[TensorInfo]:
        """``data/weights/<m>.pt``: a torch.save of the whole dict (old archives)."""
        member = self.archive.get(record)
        if member is None:
            return []
        member = self.member(record, record, "<legacy>")
        nested = open_nested_save(self.src, member.data_offset, member.size, label=member.name,
                                  fmt=FORMAT, role="pt2.legacy_payload")
        self.model.evidence.pickles.append(nested.record)
        self.model.evidence.anomalies.extend(nested.anomalies)
        out = []
        for p, raw_path, t in nested.tensors:
            info = torch_pickle.to_tensor_info(p, raw_path, t, fmt=FORMAT, file=self.src.path)
            name, path = qualify(info.name)
            out.append(TensorInfo(name=name, dtype=info.dtype, shape=info.shape, stride=info.stride,
                                  storage_offset=info.storage_offset, byte_offset=info.byte_offset,
                                  file=self.src.path, storage_key=info.storage_key,
                                  storage_nbytes=info.storage_nbytes, path=path,
                                  source_format=FORMAT, role=role if t.role == "tensor" else t.role,
                                  extras=info.extras))
        return out

    def sample_inputs(self, record: str) -> list[dict]:
        member = self.archive.get(record)
        if member is None:
            return []
        member = self.member(record, record, "sample inputs")
        nested = open_nested_save(self.src, member.data_offset, member.size, label=member.name,
                                  fmt=FORMAT, role="pt2.sample_inputs")
        self.model.evidence.pickles.append(nested.record)
        self.model.evidence.anomalies.extend(nested.anomalies)
        return [_ref_dict(torch_pickle.dotted(p), t) for p, _, t in nested.tensors]


def _zeros(shape, np_dtype) -> np.ndarray:
    arr = np.zeros(shape, dtype=np_dtype)
    arr.flags.writeable = False
    return arr


def _ref_dict(name: str, t: torch_pickle.TensorRef) -> dict:
    s = t.storage
    offset = None
    if s is not None and s.data_offset is not None and s.error is None:
        offset = s.data_offset + t.storage_offset * dtypes.spec(t.dtype).itemsize
    return {"name": name, "dtype": t.dtype, "shape": list(t.shape), "stride": list(t.stride),
            "byte_offset": offset}


# -- entry point ----------------------------------------------------------------------------------
def open_zip(src: ByteSource, archive: ZipArchive) -> ModelFile:
    prefix = archive.torch_prefix()
    if prefix is None:
        raise _fail("zip archive has no top-level folder: not a .pt2 archive", src)
    model = ModelFile(FORMAT, src.path, sources={src.path: src})
    model.evidence.anomalies.extend(archive.anomalies)
    meta = archive_metadata(archive, prefix)
    for key, record in (("archive_format", "archive_format"), ("archive_version", "archive_version")):
        member = archive.get(f"{prefix}/{record}")
        if member is not None and not member.error and member.size <= 64:
            meta[key] = archive.read_bytes(member, 64).decode("utf-8", "replace").strip()
    if meta.get("archive_format", "pt2") != "pt2":
        model.evidence.add("pt2.archive_format", f"archive_format is {meta['archive_format']!r}, "
                           "not 'pt2'", file=src.path, member=f"{prefix}/archive_format")
    head = f"{prefix}/models/"
    model_names = [n[len(head):-5] for n in archive.names()
                   if n.startswith(head) and n.endswith(".json") and "/" not in n[len(head):]]
    if not model_names:
        raise _fail(f"archive has no {head}<name>.json program", src)
    loader = _Loader(src, archive, prefix, model)
    programs: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    for m in model_names:
        def qualify(fqn: str, m=m) -> tuple[str, tuple[str, ...]]:
            if len(model_names) == 1:
                return fqn, tuple(fqn.split(".")) if fqn else (fqn,)
            return f"{m}.{fqn}", (m, *fqn.split("."))
        program = _read_json(archive, f"{head}{m}.json")
        summary, graph, spec_names = _summarize_program(program)
        state_names: list[str] = []
        const_names: list[str] = []
        legacy = f"{prefix}/data/weights/{m}.pt"
        if archive.get(legacy) is not None:
            tensors = loader.legacy(legacy, "parameter", qualify)
            state_names += [t.name for t in tensors]
        else:
            config = f"{prefix}/data/weights/{m}_weights_config.json"
            if archive.get(config) is None:
                raise _fail(f"archive has neither {config} nor {legacy}: the program's weights "
                            "are missing", src)
            tensors = loader.payloads(m, config, "data/weights", kind="weight", names=state_names,
                                      qualify=qualify)
        legacy_c = f"{prefix}/data/constants/{m}.pt"
        if archive.get(legacy_c) is not None:
            constants = loader.legacy(legacy_c, "constant", qualify)
            const_names += [t.name for t in constants]
        else:
            constants = loader.payloads(m, f"{prefix}/data/constants/{m}_constants_config.json",
                                        "data/constants", kind="constant", names=const_names,
                                        qualify=qualify)
        _cross_check(model, src, f"{head}{m}.json", spec_names, state_names, const_names)
        model.tensors.extend(tensors)
        model.tensors.extend(constants)
        programs[m] = summary
        graphs[m] = graph
        samples[m] = loader.sample_inputs(f"{prefix}/data/sample_inputs/{m}.pt")
    extra = [n[len(prefix) + 1:] for n in archive.names() if n.startswith(f"{prefix}/extra/")]
    aoti = [n[len(prefix) + 1:] for n in archive.names() if n.startswith(f"{prefix}/data/aotinductor/")]
    meta["models"] = programs
    if extra:
        meta["extra_files"] = extra
    if aoti:
        meta["aotinductor_files"] = len(aoti)
    model.metadata = meta
    only = len(model_names) == 1
    model.extras["graph_signature"] = graphs[model_names[0]]["signature"] if only else \
        {m: g["signature"] for m, g in graphs.items()}
    model.extras["op_counts"] = graphs[model_names[0]]["op_counts"] if only else \
        {m: g["op_counts"] for m, g in graphs.items()}
    model.extras["sample_inputs"] = samples[model_names[0]] if only else samples
    return model


def _cross_check(model: ModelFile, src: ByteSource, member: str, spec_names: dict[str, set[str]],
                 state: list[str], constants: list[str]) -> None:
    """The signature's parameters/persistent buffers must be the weights; constants the rest."""
    non_persistent = spec_names.get("buffer(non-persistent)", set())
    want_state = spec_names.get("parameter", set()) | (spec_names.get("buffer", set()) - non_persistent)
    want_const = spec_names.get("tensor_constant", set()) | non_persistent | spec_names.get("custom_obj", set())
    for label, want, have in (("state_dict", want_state, set(state)), ("constants", want_const, set(constants))):
        missing = sorted(want - have)
        if missing:
            model.evidence.add("pt2.signature_mismatch",
                               f"the graph signature names {len(missing)} {label} entries the payload "
                               f"config lacks: {', '.join(missing[:5])}", file=src.path, member=member)


# -- the programs themselves (for `tensorscope graph`) ----------------------------------------------
def read_programs(src: ByteSource) -> dict[str, Any]:
    """``{model name: the parsed models/<m>.json}`` of a ``.pt2`` archive: the serialized graphs
    (nodes, tensor_values, signature) that `open_zip` summarizes. JSON only, never unpickled."""
    from .zip_reader import read_zip
    archive = read_zip(src)
    prefix = archive.torch_prefix()
    if prefix is None:
        raise _fail("zip archive has no top-level folder: not a .pt2 archive", src)
    head = f"{prefix}/models/"
    return {n[len(head):-5]: _read_json(archive, n) for n in archive.names()
            if n.startswith(head) and n.endswith(".json") and "/" not in n[len(head):]}
