"""PyTorch zip checkpoints (``torch.save``, the default since 1.6): read without torch.

Spec (torch 2.13; FORMATS.md has the verified byte facts):
- The file MUST be a zip whose first central-directory entry names the archive prefix ``P/``
  (the file stem at save time, or ``archive``). Records are STORED; each record's data is aligned
  (64 bytes by default) by padding the LOCAL header's extra field, so the data offset is
  ``local_header + 30 + name_len + local_extra_len`` — never the central directory's extra length.
- ``P/data.pkl`` is the object pickle (protocol 2 by default). Storages are persistent ids
  ``('storage', cls, key, location, numel)`` whose bytes are the record ``P/data/<key>``.
- ``P/version`` (text, "3"), ``P/byteorder`` ("little"/"big"; absent before 1.x: little),
  ``P/.format_version``, ``P/.storage_alignment``, ``P/.data/serialization_id`` MAY be present.
- Tensors are views over whole storages; reads go through the record's size as the bound.

Public: ``FORMAT``, ``open_zip(src, archive) -> ModelFile`` (called by `zip_dispatch`).
"""
from __future__ import annotations

from typing import NamedTuple

from tensorscope.dtypes import is_unknown, register_unknown
from tensorscope.errors import FormatError
from tensorscope.model import ModelFile, PickleRecord
from tensorscope.open_mode import listing_only_active
from tensorscope.source import ByteSource

from . import pickle_vm, torch_pickle, zip_dispatch, zipfmt
from .torch_pickle import StorageRef, build_tensor_list, install_byteswap_readers
from .zipfmt import METHOD_STORED, ZipArchive

__all__ = ["FORMAT", "open_zip", "archive_metadata", "load_pickle_member", "SMALL_RECORD_MAX"]

FORMAT = "torch-zip"
SMALL_RECORD_MAX = 64 << 10  # text records (version, byteorder ...) are a few bytes
PICKLE_INFLATE_MAX = 128 << 20


def _small_text(archive: ZipArchive, name: str) -> str | None:
    member = archive.get(name)
    if member is None or member.error:
        return None
    if member.size > SMALL_RECORD_MAX:
        return None
    try:
        return archive.read_bytes(member, SMALL_RECORD_MAX).decode("utf-8", "replace").strip()
    except FormatError:
        return None


def archive_metadata(archive: ZipArchive, prefix: str) -> dict:
    """The archive's own records: version, byteorder, format version, alignment, serialization id."""
    meta = {"archive_prefix": prefix}
    for key, record in (("version", "version"), ("version", ".data/version"),
                        ("byteorder", "byteorder"), ("format_version", ".format_version"),
                        ("storage_alignment", ".storage_alignment"),
                        ("serialization_id", ".data/serialization_id")):
        if key in meta:
            continue
        text = _small_text(archive, f"{prefix}/{record}")
        if text is not None:
            meta[key] = text
    return meta


def make_storage_resolver(archive: ZipArchive, prefix: str, data_dir: str = "data",
                          storages: dict | None = None, records: dict | None = None):
    """A ``persistent_load`` mapping storage pids to records ``P/<data_dir>/<key>`` of this zip.

    Storages are memoised by key: several tensors viewing one storage share one StorageRef.
    A missing record does not stop the listing: the storage carries the error, reads fail.
    ``records`` (`data_records`): look the records up there, not in the archive.
    """
    storages = {} if storages is None else storages
    src = archive.source
    path = src.path
    lookup = archive.get if records is None else _record_lookup(records)
    direct = {} if records is None else records    # `_record_lookup`'s first step, inline
    parse_pid = torch_pickle.parse_storage_pid
    start = f"{prefix}/{data_dir}/"
    storage_dtypes, storage_modules = torch_pickle.STORAGE_DTYPES, torch_pickle.STORAGE_MODULES
    Global = pickle_vm.Global

    def persistent_load(pid, pos):
        # The pid torch.save writes, a storage met for the first time, its record found by the
        # exact name: `parse_storage_pid`'s fast path and the general steps below, inline (once
        # per storage: 10^5-10^6 per checkpoint).
        if type(pid) is tuple and len(pid) == 5 and pid[0] == "storage":
            cls, key, location, numel = pid[1], pid[2], pid[3], pid[4]
            if type(cls) is Global and type(key) is str and type(location) is str and \
                    type(numel) is int and numel >= 0 and cls.module in storage_modules and \
                    key not in storages:
                dtype = storage_dtypes.get(cls.name, False)     # None: UntypedStorage
                name = start + key
                record = direct.get(name) if dtype is not False else None
                if record is not None and not record.error and record.method == METHOD_STORED \
                        and record.name == name:
                    storage = storages[key] = StorageRef(key, dtype, numel, location, path,
                                                         record.name, record.data_offset,
                                                         record.size)
                    return storage
        dtype, key, location, numel, cls = parse_pid(pid, pos, allow_unknown=True)
        storage = storages.get(key)
        if storage is not None:
            return storage
        name = start + key
        member = direct.get(name) or lookup(name)
        if member is not None and member.name == name:
            name = member.name      # one string object for both (10^5 members)
        if member is not None and not member.error and member.method == METHOD_STORED:
            storage = StorageRef(key, dtype, numel, location, path, name, member.data_offset,
                                 member.size)
            if dtype and is_unknown(dtype) and numel and member.size % numel == 0:
                storage.dtype = register_unknown(cls, member.size // numel)  # record / elements
        else:
            storage = StorageRef(key, dtype, numel, location, path, name)
            if member is None:
                storage.error = f"record {name} is missing"
            elif member.error:
                storage.error = member.error
            else:
                storage.error = (f"record {name} is compressed (method {member.method}): "
                                 "not readable in place")
        storages[key] = storage
        return storage

    if records is not None and METHOD_STORED == 0:
        # What the compiled torch step (tensorscope/_torchstep.c) needs to take the inline
        # branch above itself: the same dicts and tables, so it decides exactly as it does.
        persistent_load.torch_fast = (storages, records, start, path, storage_dtypes,
                                      storage_modules, _Record)
    return persistent_load, storages


class _Record(NamedTuple):
    """What a storage needs of its member (`data_records`): the archive can then be let go."""

    name: str
    error: str | None
    method: int
    data_offset: int
    size: int


def data_records(archive: ZipArchive, prefix: str, data_dir: str = "data") -> dict | None:
    """The members under ``P/<data_dir>/`` as `_Record` tuples, keyed so that `_record_lookup`
    finds exactly what `ZipArchive.get` (miniz's case-insensitive search) would; None when that
    cannot be promised cheaply (names alike ignoring case, a name that is not plain ASCII)."""
    start = f"{prefix}/{data_dir}/"
    if "\0" in start or not start.isascii() or not archive.exact_lookups():
        return None
    return archive.records_under(start, _Record)


def _record_lookup(records: dict):
    def lookup(name: str) -> _Record | None:
        # get(): the name's bytes up to a NUL, lowered (ASCII only: a name with other characters
        # cannot equal the ASCII names held here byte for byte). The keys are lowercase ASCII
        # without NUL, so a name found as it is would be found the same after those steps.
        record = records.get(name)
        if record is not None:
            return record
        if not name.isascii():
            return None
        return records.get(name.split("\0", 1)[0].lower())
    return lookup


def load_pickle_member(archive: ZipArchive, name: str, *, persistent_load=None, hooks=None,
                       role: str = "data", record_calls: bool = True
                       ) -> tuple[object, PickleRecord]:
    """Run the VM over one pickle record of the zip; errors carry file, member and absolute offset."""
    src = archive.source
    data, base = pickle_bytes(archive, name)
    result = pickle_vm.run(data, persistent_load=persistent_load, hooks=hooks, file=src.path,
                           member=name, base_offset=base, record_calls=record_calls)
    record = PickleRecord(src.path, name, base, len(data), result, role=role)
    return result, record


def pickle_bytes(archive: ZipArchive, name: str) -> tuple[memoryview | bytes, int]:
    """A pickle record's bytes and the absolute offset of the first (0 when inflated)."""
    member = archive.get(name)
    if member is None:
        raise FormatError(f"no {name} record in the archive", format="torch-zip",
                          file=archive.source.path)
    if member.is_stored and not member.error:
        return archive.data(member), member.data_offset
    # A compressed pickle (torch never writes one): inflate with a cap far below the default,
    # since an object pickle of 1e6 tensors is ~100 MB and a bomb must stay cheap.
    return archive.read_bytes(member, PICKLE_INFLATE_MAX), 0


def open_zip(src: ByteSource, archive: ZipArchive) -> ModelFile:
    prefix = archive.torch_prefix()
    if prefix is None:
        raise FormatError("zip archive has no top-level folder: not a torch.save archive",
                          format=FORMAT, file=src.path)
    pkl = f"{prefix}/data.pkl"
    if archive.get(pkl) is None:
        raise FormatError(f"zip archive has no {pkl}: not a torch.save archive "
                          f"(first members: {', '.join(archive.names()[:5])})", format=FORMAT,
                          file=src.path)
    model = ModelFile(FORMAT, src.path, sources={src.path: src})
    model.evidence.anomalies.extend(archive.anomalies)
    model.metadata = archive_metadata(archive, prefix)
    light = listing_only_active()
    data, base = pickle_bytes(archive, pkl)
    records = data_records(archive, prefix) if light and \
        not zip_dispatch.keeping_archive_active() else None
    persistent_load, storages = make_storage_resolver(archive, prefix, records=records)
    if records is not None:
        archive.release()   # the storages are found in `records`: ~300 bytes less per member
    result = pickle_vm.run(data, persistent_load=persistent_load,
                           hooks=torch_pickle.rebuild_hooks(), file=src.path, member=pkl,
                           base_offset=base, record_calls=not light)
    model.evidence.pickles.append(PickleRecord(src.path, pkl, base, len(data), result))
    result.raise_for_error()
    model.metadata["pickle_protocol"] = result.protocol
    if light:   # no object tree: each tensor's inert objects are freed once its record is made
        storages.clear()
        root, result.value = result.value, None
        model.tensors = build_tensor_list(root, FORMAT, src.path, model, consume=True)
        zipfmt.release_pages(src)   # the pickle's pages: the listing has read them
    else:
        model.objects = result.value
        model.tensors = build_tensor_list(result.value, FORMAT, src.path, model)
    if model.metadata.get("byteorder", "little") not in ("little",):
        install_byteswap_readers(model)
    return model
