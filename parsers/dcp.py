"""Distributed checkpoints (``torch.distributed.checkpoint.save``, FileSystemWriter): a folder.

Spec (torch 2.13, metadata version "1.0.0"; FORMATS.md "DCP" has the verified facts):
- The folder MUST hold ``.metadata``: a pickle (protocol 4) of ``Metadata(state_dict_metadata,
  planner_data, storage_data, storage_meta, version)``. Its objects are dataclasses pickled as
  ``NEWOBJ`` + ``BUILD {field: value}`` (``TensorProperties`` builds from a tuple ``(dtype, layout,
  requires_grad, memory_format, pin_memory)``); sizes and offsets are ``torch.Size`` tuples, dtypes
  ``torch.<name>`` globals, the checkpoint id a ``pathlib.PosixPath``. It is read with the
  symbolic VM: nothing is imported or called.
- ``state_dict_metadata`` maps each flattened FQN (``opt.exp_avg``; ``planner_data`` keeps the
  original key path) to ``TensorStorageMetadata(properties, size, chunks=[ChunkStorageMetadata(
  offsets, sizes)])`` or ``BytesStorageMetadata()`` (any other value, torch.save'd).
- ``storage_data`` maps ``MetadataIndex(fqn, offset, index)`` (offset = the chunk's global
  offsets, None for bytes) to ``_StorageInfo(relative_path, offset, length[,
  transform_descriptors])``: the blob's place in ``__<rank>_<i>.distcp``. Lookups match on (fqn,
  offset), as MetadataIndex's hash does (``index`` is a hint).
- Each blob is a complete torch.save zip (prefix ``archive/``) whose offsets are relative to the
  blob; a tensor blob holds exactly the chunk (shape = chunk ``sizes``, strides kept: a transposed
  tensor is stored transposed). With ``transform_descriptors`` (compression extensions) the blob is
  an encoded stream and cannot be read in place.
- ``relative_path`` MUST name a file directly in the folder (no separators, no ``..``): anything
  else is refused. Chunks MUST lie inside the tensor and SHOULD tile it exactly.

What this parser produces: one TensorInfo per tensor FQN with the global shape. A tensor stored as
one chunk covering all of it is a zero-copy view into its ``.distcp`` file; a tensor stored in
several chunks has ``byte_offset`` None and ``chunks`` (each a located view), and `read` assembles
them into one array (a copy). Non-tensor values are listed in ``metadata["dcp_items"]`` (file,
offset, length, a JSON summary of the inert value); their pickles, each chunk's pickle and
``.metadata`` itself are recorded as evidence (roles ``dcp.bytes``, ``dcp.chunk``,
``dcp.metadata``). Tensors found inside non-tensor values are listed too (role ``dcp.bytes``).

Public: ``FORMAT``, ``sniff_dir(path)``, ``open_dir(path)``.
"""
from __future__ import annotations

import math
import os
from typing import Any

from tensorscope.errors import FormatError, brief
from tensorscope.model import Chunk, ModelFile, PickleRecord, TensorInfo
from tensorscope.source import ByteSource

from . import pickle_vm, torch_pickle
from .pickle_vm import Call, Global
from .torch_nested import open_nested_save

__all__ = ["FORMAT", "sniff_dir", "open_dir", "METADATA_NAME"]

FORMAT = "dcp"
METADATA_NAME = ".metadata"
_DCP = "torch.distributed.checkpoint"
OVERLAP_CHECK_MAX = 256   # chunks per tensor checked pairwise for overlaps
VALUE_SUMMARY_MAX = 200   # characters of a non-tensor value shown in metadata


def sniff_dir(path: str) -> bool:
    meta = os.path.join(path, METADATA_NAME)
    try:
        with open(meta, "rb") as f:
            return f.read(1) == b"\x80"   # a binary pickle (PROTO)
    except OSError:
        return False


def _fail(reason: str, file: str, member: str | None = None, offset: int | None = None):
    return FormatError(reason, format=FORMAT, file=file, member=member, offset=offset)


# -- the inert dataclasses of .metadata -----------------------------------------------------------
def _cls(obj: Any) -> str | None:
    if isinstance(obj, Call) and isinstance(obj.func, Global):
        return obj.func.dotted
    return None


def _fields(obj: Any) -> dict | tuple:
    """A dataclass's fields from its BUILD state: a dict, a (dict, slots) pair, or a tuple."""
    state = obj.state if isinstance(obj, Call) else None
    if isinstance(state, dict):
        return state
    if isinstance(state, pickle_vm.BuildStates):
        merged: dict = {}
        for s in state:
            if isinstance(s, dict):
                merged.update(s)
        return merged
    if isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
        return {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, tuple):
        return state
    if isinstance(obj, Call) and obj.args:
        return tuple(obj.args)
    return {}


class _Meta:
    """Typed access to .metadata's inert objects, with errors that name the file."""

    def __init__(self, file: str):
        self.file = file

    def bad(self, reason: str) -> FormatError:
        return _fail(reason, self.file)

    def obj(self, value: Any, cls: str, what: str) -> dict:
        name = _cls(value)
        if name is None or not name.endswith(f".{cls}"):
            raise self.bad(f"{what}: expected {cls}, got {_describe(value)}")
        fields = _fields(value)
        if not isinstance(fields, dict):
            raise self.bad(f"{what}: {cls} has no field dict")
        return fields

    def ints(self, value: Any, what: str) -> tuple[int, ...]:
        if not isinstance(value, (tuple, list)) or len(value) > 64 or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            raise self.bad(f"{what} must be a tuple of at most 64 integers >= 0, got {_describe(value)}")
        return tuple(value)

    def dtype(self, props: Any, what: str) -> tuple[str, bool]:
        name = _cls(props)
        if name is None or not name.endswith(".TensorProperties"):
            raise self.bad(f"{what}: expected TensorProperties, got {_describe(props)}")
        fields = _fields(props)
        if isinstance(fields, dict):
            dtype, requires_grad = fields.get("dtype"), fields.get("requires_grad")
        elif fields:
            dtype = fields[0]
            requires_grad = fields[2] if len(fields) > 2 else False
        else:
            dtype = requires_grad = None
        if not (isinstance(dtype, Global) and dtype.module == "torch"
                and dtype.name in torch_pickle.TORCH_DTYPES):
            raise self.bad(f"{what}: expected a torch dtype, got {_describe(dtype)}")
        return torch_pickle.TORCH_DTYPES[dtype.name], requires_grad is True


def _describe(value: Any) -> str:
    if isinstance(value, Global):
        return value.dotted
    if isinstance(value, Call):
        return f"a {_cls(value) or 'call'} object"
    return f"{type(value).__name__} {brief(value, 40)}"


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-able summary of an inert value (scalars, strings, small containers)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value if not isinstance(value, str) or len(value) <= VALUE_SUMMARY_MAX \
            else value[:VALUE_SUMMARY_MAX] + "..."
    if depth < 3 and isinstance(value, (list, tuple)) and len(value) <= 32:
        return [_plain(v, depth + 1) for v in value]
    if depth < 3 and isinstance(value, dict) and len(value) <= 32:
        return {str(k): _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, torch_pickle.TensorRef):
        return f"<tensor {value.dtype} {list(value.shape)}>"
    return brief(value, VALUE_SUMMARY_MAX)


# -- folder -------------------------------------------------------------------------------------------
class _Folder:
    def __init__(self, path: str, model: ModelFile):
        self.path = path
        self.model = model

    def source(self, rel: Any, meta_file: str, fqn: str) -> ByteSource:
        if not isinstance(rel, str) or not rel or rel in (".", "..") or "/" in rel or "\\" in rel \
                or "\0" in rel or os.path.isabs(rel):
            raise _fail(f"storage entry of {fqn!r} names {_describe(rel)}: only a file directly "
                        "in the checkpoint folder is accepted (path traversal refused)", meta_file)
        full = os.path.join(self.path, rel)
        if full not in self.model.sources:
            if not os.path.isfile(full):
                raise _fail(f"storage file {rel} (holding {fqn!r}) does not exist", full)
            self.model.sources[full] = ByteSource(full)
            self.model.files.append(full)
        return self.model.sources[full]


def open_dir(path: str) -> ModelFile:
    """Open a DCP checkpoint folder (see the module docstring).

    Raises:
        FormatError: malformed ``.metadata``, a missing or escaping storage file, a blob outside
            its file, a chunk whose blob disagrees with the metadata (messages name the place).
    """
    path = os.fspath(path)
    meta_file = os.path.join(path, METADATA_NAME)
    model = ModelFile(FORMAT, path, files=[meta_file])
    try:
        _open(path, meta_file, model)
    except BaseException:
        model.close()
        raise
    return model


def _open(path: str, meta_file: str, model: ModelFile) -> None:
    src = model.sources[meta_file] = ByteSource(meta_file)
    if src.size == 0:
        raise _fail("empty metadata file", meta_file)
    result = pickle_vm.run(src.view(0, src.size), hooks=torch_pickle.rebuild_hooks(), file=meta_file)
    model.evidence.pickles.append(PickleRecord(meta_file, None, 0, src.size, result, role="dcp.metadata"))
    result.raise_for_error()
    if result.end != src.size:
        model.evidence.add("dcp.trailing_bytes", f"{src.size - result.end} bytes after the "
                           "metadata pickle's STOP", file=meta_file, offset=result.end)
    m = _Meta(meta_file)
    root = m.obj(result.value, "Metadata", "the metadata pickle")
    sdm = root.get("state_dict_metadata")
    storage = root.get("storage_data")
    if not isinstance(sdm, dict) or not isinstance(storage, dict):
        raise m.bad("Metadata lacks the state_dict_metadata/storage_data dicts")
    planner = root.get("planner_data") if isinstance(root.get("planner_data"), dict) else {}
    places: dict[tuple[str, tuple | None], dict] = {}
    for key, info in storage.items():
        k = m.obj(key, "MetadataIndex", "a storage_data key")
        fqn, offset = k.get("fqn"), k.get("offset")
        if not isinstance(fqn, str):
            raise m.bad(f"storage_data key has fqn {_describe(fqn)}")
        where = f"storage entry of {fqn!r}"
        offset = None if offset is None else m.ints(offset, f"{where}: offset")
        v = m.obj(info, "_StorageInfo", where)
        for field in ("offset", "length"):
            if not isinstance(v.get(field), int) or isinstance(v.get(field), bool) or v[field] < 0:
                raise m.bad(f"{where}: {field} must be an integer >= 0, got {_describe(v.get(field))}")
        places[(fqn, offset)] = v
    folder = _Folder(path, model)
    items: dict[str, Any] = {}
    for fqn, entry in sdm.items():
        if not isinstance(fqn, str):
            raise m.bad(f"state_dict_metadata key {_describe(fqn)} is not a string")
        keys = planner.get(fqn)
        tpath = tuple(str(p) for p in keys) if isinstance(keys, tuple) and keys else (fqn,)
        kind = _cls(entry) or ""
        if kind.endswith(".BytesStorageMetadata"):
            items[fqn] = _bytes_item(folder, meta_file, fqn, tpath, places, model)
        elif kind.endswith(".TensorStorageMetadata"):
            model.tensors.append(_tensor(folder, m, fqn, tpath, _fields(entry), places))
        else:
            raise m.bad(f"state_dict_metadata[{fqn!r}] is {_describe(entry)}")
    meta: dict[str, Any] = {"version": root.get("version") if isinstance(root.get("version"), str) else None,
                            "files": {os.path.basename(f): model.sources[f].size for f in model.files[1:]},
                            "chunks": len(places) - len(items)}
    smeta = root.get("storage_meta")
    if _cls(smeta):
        fields = _fields(smeta)
        if isinstance(fields, dict):
            for k in ("save_id", "load_id"):
                if isinstance(fields.get(k), str):
                    meta[k] = fields[k]
            cid = fields.get("checkpoint_id")
            if isinstance(cid, Call) and cid.args and all(isinstance(a, str) for a in cid.args):
                meta["checkpoint_id"] = os.path.join(*cid.args)   # PosixPath('/', 'a', 'b')
            elif isinstance(cid, str):
                meta["checkpoint_id"] = cid
    if items:
        meta["dcp_items"] = items
    model.metadata = meta


def _blob_place(folder: _Folder, meta_file: str, places: dict, fqn: str, offsets, what: str):
    place = places.get((fqn, offsets))
    if place is None:
        raise _fail(f"{what} has no storage_data entry", meta_file)
    src = folder.source(place.get("relative_path"), meta_file, fqn)
    src.check(place["offset"], place["length"], f"{what} blob", fmt=FORMAT)
    return src, place


def _tensor(folder: _Folder, m: _Meta, fqn: str, tpath: tuple, fields: Any, places: dict) -> TensorInfo:
    what = f"tensor {fqn!r}"
    if not isinstance(fields, dict):
        raise m.bad(f"{what}: TensorStorageMetadata has no fields")
    dtype, requires_grad = m.dtype(fields.get("properties"), what)
    size = m.ints(fields.get("size"), f"{what}: size")
    chunks_meta = fields.get("chunks")
    if not isinstance(chunks_meta, list):
        raise m.bad(f"{what}: chunks is {_describe(chunks_meta)}")
    chunks: list[Chunk] = []
    for i, c in enumerate(chunks_meta):
        cf = m.obj(c, "ChunkStorageMetadata", f"{what} chunk {i}")
        offsets = m.ints(cf.get("offsets"), f"{what} chunk {i}: offsets")
        sizes = m.ints(cf.get("sizes"), f"{what} chunk {i}: sizes")
        if len(offsets) != len(size) or len(sizes) != len(size) or any(
                o + s > d for o, s, d in zip(offsets, sizes, size)):
            raise m.bad(f"{what} chunk {i} (offsets {list(offsets)}, sizes {list(sizes)}) does not "
                        f"fit the tensor's size {list(size)}")
        chunks.append(Chunk(offsets, sizes, _chunk(folder, m.file, fqn, tpath, i, offsets, sizes,
                                                    dtype, places)))
    extras: dict[str, Any] = {"dcp_chunks": len(chunks)}
    if requires_grad:
        extras["requires_grad"] = True
    _check_tiling(folder.model, m.file, fqn, size, chunks)
    if len(chunks) == 1 and chunks[0].sizes == size and chunks[0].tensor.byte_offset is not None:
        t = chunks[0].tensor   # one chunk holds it all: a zero-copy view
        return TensorInfo(name=fqn, dtype=dtype, shape=size, stride=t.stride,
                          storage_offset=t.storage_offset, byte_offset=t.byte_offset, file=t.file,
                          storage_key=t.storage_key, storage_nbytes=t.storage_nbytes, path=tpath,
                          source_format=FORMAT, extras={**t.extras, **extras})
    first = chunks[0].tensor.file if chunks else ""
    return TensorInfo(name=fqn, dtype=dtype, shape=size, file=first, path=tpath,
                      source_format=FORMAT, chunks=tuple(chunks), extras=extras)


def _chunk(folder: _Folder, meta_file: str, fqn: str, tpath: tuple, i: int, offsets: tuple,
           sizes: tuple, dtype: str, places: dict) -> TensorInfo:
    what = f"tensor {fqn!r} chunk {i} at {list(offsets)}"
    src, place = _blob_place(folder, meta_file, places, fqn, offsets, what)
    rel = os.path.basename(src.path)
    label = f"{rel}[{fqn}@{','.join(map(str, offsets))}]"
    common = dict(name=f"{fqn}[{i}]", dtype=dtype, shape=sizes, file=src.path, path=tpath,
                  source_format=FORMAT)
    if place.get("transform_descriptors"):
        folder.model.evidence.add(
            "dcp.transformed_blob", f"{what} is stored through transforms "
            f"{_plain(place['transform_descriptors'])}: not readable in place",
            file=src.path, offset=place["offset"])
        return TensorInfo(**common, extras={"transform_descriptors": _plain(place["transform_descriptors"])})
    nested = open_nested_save(src, place["offset"], place["length"], label=label, fmt=FORMAT,
                              role="dcp.chunk")
    folder.model.evidence.pickles.append(nested.record)
    folder.model.evidence.anomalies.extend(nested.anomalies)
    if len(nested.tensors) != 1 or nested.tensors[0][0] != ():
        raise _fail(f"{what}: the blob holds {_plain(nested.value)}, not one tensor", src.path,
                    label, place["offset"])
    ref = nested.tensors[0][2]
    if ref.dtype != dtype or ref.shape != sizes:
        raise _fail(f"{what}: the blob holds a {ref.dtype} tensor of shape {list(ref.shape)}, the "
                    f"metadata says {dtype} {list(sizes)}", src.path, label, place["offset"])
    if not torch_pickle.tensor_fits(ref):
        raise _fail(f"{what}: the blob's tensor addresses bytes past the end of its storage "
                    f"record ({ref.storage.nbytes} bytes)", src.path, label, place["offset"])
    if ref.storage is not None and ref.storage.error:
        raise _fail(f"{what}: {ref.storage.error}", src.path, label, place["offset"])
    info = torch_pickle.to_tensor_info(tpath, tpath, ref, fmt=FORMAT, file=src.path)
    return TensorInfo(**dict(common, shape=info.shape), stride=info.stride,
                      storage_offset=info.storage_offset, byte_offset=info.byte_offset,
                      storage_key=info.storage_key, storage_nbytes=info.storage_nbytes,
                      extras={"member": label, "blob_offset": place["offset"],
                              "blob_length": place["length"]})


def _check_tiling(model: ModelFile, meta_file: str, fqn: str, size: tuple, chunks: list[Chunk]) -> None:
    """Chunks SHOULD tile the tensor: same volume, no overlap (checked pairwise when few)."""
    total = math.prod(size)
    covered = sum(math.prod(c.sizes) for c in chunks)
    overlap = False
    if len(chunks) <= OVERLAP_CHECK_MAX:
        for a in range(len(chunks)):
            for b in range(a + 1, len(chunks)):
                ca, cb = chunks[a], chunks[b]
                if all(max(oa, ob) < min(oa + sa, ob + sb) for oa, sa, ob, sb in
                       zip(ca.offsets, ca.sizes, cb.offsets, cb.sizes)) and math.prod(ca.sizes):
                    overlap = True
    if covered != total or overlap:
        model.evidence.add("dcp.chunk_coverage", f"tensor {fqn!r}: its {len(chunks)} chunks cover "
                           f"{covered} of {total} elements{' and overlap' if overlap else ''}",
                           file=meta_file)


def _bytes_item(folder: _Folder, meta_file: str, fqn: str, tpath: tuple, places: dict,
                model: ModelFile) -> dict:
    what = f"value {fqn!r}"
    src, place = _blob_place(folder, meta_file, places, fqn, None, what)
    rel = os.path.basename(src.path)
    item = {"file": rel, "offset": place["offset"], "length": place["length"]}
    if place.get("transform_descriptors"):
        item["transform_descriptors"] = _plain(place["transform_descriptors"])
        model.evidence.add("dcp.transformed_blob", f"{what} is stored through transforms: not "
                           "readable in place", file=src.path, offset=place["offset"])
        return item
    label = f"{rel}[{fqn}]"
    nested = open_nested_save(src, place["offset"], place["length"], label=label, fmt=FORMAT,
                              role="dcp.bytes")
    model.evidence.pickles.append(nested.record)
    model.evidence.anomalies.extend(nested.anomalies)
    item["value"] = _plain(nested.value)
    for p, raw, ref in nested.tensors:
        info = torch_pickle.to_tensor_info(tpath + p, tpath + raw, ref, fmt=FORMAT, file=src.path)
        model.tensors.append(TensorInfo(
            name=".".join((fqn,) + p), dtype=info.dtype, shape=info.shape, stride=info.stride,
            storage_offset=info.storage_offset, byte_offset=info.byte_offset, file=src.path,
            storage_key=info.storage_key, storage_nbytes=info.storage_nbytes, path=tpath + p,
            source_format=FORMAT, role="dcp.bytes", extras=info.extras))
    return item
