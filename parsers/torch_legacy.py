"""Legacy PyTorch checkpoints: the pre-1.6 pickle stream and the pre-0.4 tar archive. No torch.

Spec of the stream (``torch.save(..., _use_new_zipfile_serialization=False)``; torch 2.13
still writes and reads it; FORMATS.md "Legacy"):
- Five pickles MUST follow each other from byte 0: the magic number ``0x1950A86A20F9469CFC6C``
  (an int), the protocol version ``1001``, a sys_info dict ``{protocol_version, little_endian,
  type_sizes}``, the main pickle, and the list of storage keys (strings).
- Storages in the main pickle are persistent ids ``('storage', cls, key, location, numel,
  view_metadata)``; ``numel`` counts elements of ``cls``. ``view_metadata`` is None or
  ``(view_key, offset, size)`` in elements of the root storage (views of the 0.x era).
  Whole-module saves add ``('module', cls, source_file, source_text)`` ids.
- After the fifth pickle, for each key in that list's order (sorted as STRINGS), an int64 LE
  element count and ``count * itemsize`` raw bytes follow, with no alignment. torch requires the
  count to match the pid's ``numel`` and fails on a key the main pickle never named.
- torch writes counts and data little-endian whatever ``sys_info['little_endian']`` says
  (writers since 0.4 convert); only the oldest big-endian writers stored native order. A file whose
  little-endian counts do not fit but whose big-endian counts do is read as such a file: its values
  come back through a byte-swapping reader (a copy), and the anomaly says torch 2.13 cannot read it.
- Pickles MAY use any protocol torch's pickler supports (2 by default; 4 adds FRAMEs).

Spec of the tar archive (torch < 0.4; ``_legacy_load`` still reads it: a POSIX/PAX tar whose
members are ``sys_info``, ``pickle``, ``tensors`` and ``storages``):
- ``storages``: pickle(count); per storage pickle((key, location, storage class)), int64 LE element
  count and raw bytes; then pickle(list of views ``(view_key, root_key, offset, numel)``).
- ``tensors``: pickle(count); per tensor pickle((key, storage_key, tensor class)), int32 LE ndim,
  4 padding bytes, ndim int64 sizes, ndim int64 strides, int64 storage offset.
- ``pickle``: the object; tensors and storages are persistent ids holding their decimal key,
  module classes are ``(cls, source_file, source_text)`` ids.

Every count, size and offset is checked against the real size before use. Listing never reads
tensor bytes. Public: ``FORMAT``, ``sniff(head, size)``, ``open_source(src)``,
``MAGIC_NUMBER``, ``PROTOCOL_VERSION``.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from tensorscope.errors import FormatError, brief
from tensorscope.model import ModelFile, PickleRecord
from tensorscope.source import ByteSource

from . import pickle_vm, torch_pickle
from .pickle_vm import Global
from .torch_pickle import StorageRef, TensorRef, build_tensor_list, install_byteswap_readers
from .truncation import cut_short

__all__ = ["FORMAT", "sniff", "open_source", "MAGIC_NUMBER", "PROTOCOL_VERSION", "open_stream"]

FORMAT = "torch-legacy"
MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001

_MAGIC_LE = MAGIC_NUMBER.to_bytes(10, "little")
# pickle.dumps(MAGIC_NUMBER, protocol=2|3): PROTO n, LONG1 of 10 bytes.
_LONG1_MAGIC = b"\x8a\x0a" + _MAGIC_LE
# Protocols 0/1 write the magic as text: LONG "L119547037146038801333356L\n" (Python 2 adds the L).
_TEXT_MAGIC = str(MAGIC_NUMBER).encode()

COUNT = struct.Struct("<q")        # element count before each storage's bytes
COUNT_BE = struct.Struct(">q")     # the same, from a big-endian writer of the 0.x era
TAR_NDIM = struct.Struct("<i4x")   # tensors member: ndim, then 4 bytes legacy padding

# tar (POSIX.1-1988 ustar + PAX extended headers): 512-byte blocks.
TAR_BLOCK = 512
_TAR_NAME = slice(0, 100)
_TAR_SIZE = slice(124, 136)
_TAR_CHKSUM = slice(148, 156)
_TAR_TYPE = 156
_TAR_LINK = slice(157, 257)
_TAR_MAGIC = slice(257, 263)
_TAR_PREFIX = slice(345, 500)
TAR_MEMBERS = ("sys_info", "pickle", "tensors", "storages")

# Small pickles (magic, version, sys_info, keys, tar records) never need many opcodes.
_SMALL_LIMITS = pickle_vm.Limits(max_opcodes=1_000_000)


# -- sniffing -------------------------------------------------------------------------------------
def _is_stream_head(head: bytes) -> bool:
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        body = head[2:]
        if head[1] >= 4 and body[:1] == b"\x95":  # FRAME + u64 length, then the LONG1
            body = body[9:]
        return body.startswith(_LONG1_MAGIC)
    # Protocol 0/1 text form.
    return head.startswith(b"L" + _TEXT_MAGIC)


def _tar_header_ok(block: bytes) -> bool:
    if len(block) < TAR_BLOCK or block[_TAR_MAGIC][:5] != b"ustar":
        return False
    return _tar_checksum(block) == _octal(block[_TAR_CHKSUM])


def sniff(head: bytes, size: int) -> bool:
    """The legacy magic as the first pickle, or a tar whose first member is a torch member."""
    if _is_stream_head(head):
        return True
    if _tar_header_ok(head[:TAR_BLOCK]):
        name = head[_TAR_NAME].split(b"\0", 1)[0]
        # PAX extended headers ('x') precede long or non-ASCII names; check the member behind it.
        return name in {m.encode() for m in TAR_MEMBERS} or chr(head[_TAR_TYPE]) in "xg"
    return False


# -- helpers --------------------------------------------------------------------------------------
def _run(src: ByteSource, start: int, *, end: int | None = None, persistent_load=None,
         hooks=None, member: str | None = None, base: int = 0, limits=None):
    """Run one pickle of the file from ``start``; positions are absolute in the file."""
    data = src.view(0, src.size if end is None else min(end, src.size), "pickle", fmt=FORMAT)
    result = pickle_vm.run(data, start=start, persistent_load=persistent_load, hooks=hooks,
                           limits=limits or pickle_vm.DEFAULT_LIMITS, file=src.path,
                           member=member, base_offset=base)
    if end is None and member is None:   # the pickle runs to the end of the file: a cut one says so
        cut = cut_short(result, src)
        if cut is not None:
            raise cut from None
    result.raise_for_error()
    return result


def _record(src: ByteSource, start: int, result, role: str, member: str | None = None) -> PickleRecord:
    return PickleRecord(src.path, member, start, result.end - start, result, role=role)


def _itemsize(dtype: str | None) -> int:
    from tensorscope.dtypes import spec
    return 1 if dtype is None else spec(dtype).itemsize


def _fail(src: ByteSource, reason: str, offset: int | None = None, member: str | None = None):
    return FormatError(reason, format=FORMAT, file=src.path, member=member, offset=offset)


# -- the pickle stream ------------------------------------------------------------------------------
@dataclass(slots=True)
class _PendingStorage:
    ref: StorageRef
    class_name: str
    views: list  # (StorageRef view, offset elements, size elements)


def open_source(src: ByteSource) -> ModelFile:
    if _tar_header_ok(src.head(TAR_BLOCK)):
        return _open_tar(src)
    return open_stream(src)


def open_stream(src: ByteSource, *, fmt: str = FORMAT, role_prefix: str = "legacy",
                member: str | None = None, base: int = 0) -> ModelFile:
    """Parse a legacy stream held by ``src`` (a file, or a nested blob: then ``member`` names it
    and ``base`` is its offset in the outer file, so errors and records point into that file)."""
    model = ModelFile(fmt, src.path, sources={src.path: src})
    where = dict(member=member, base=base)
    rec = []

    magic = _run(src, 0, limits=_SMALL_LIMITS, **where)
    rec.append(_record(src, 0, magic, f"{role_prefix}.magic", member))
    if magic.value != MAGIC_NUMBER:
        raise _fail(src, f"not a legacy torch file: the first pickle holds {brief(magic.value, 40)}, "
                         f"expected the magic number {MAGIC_NUMBER:#x}", base, member)
    version = _run(src, magic.end, limits=_SMALL_LIMITS, **where)
    rec.append(_record(src, magic.end, version, f"{role_prefix}.protocol", member))
    if version.value != PROTOCOL_VERSION:
        raise _fail(src, f"unsupported legacy protocol version {brief(version.value, 40)} "
                         f"(torch reads only {PROTOCOL_VERSION})", base + magic.end, member)
    sys_info = _run(src, version.end, limits=_SMALL_LIMITS, **where)
    rec.append(_record(src, version.end, sys_info, f"{role_prefix}.sys_info", member))
    info = sys_info.value if isinstance(sys_info.value, dict) else {}
    if not isinstance(sys_info.value, dict):
        model.evidence.add("legacy.sys_info", f"sys_info is a {type(sys_info.value).__name__}, "
                           "not a dict", file=src.path, member=member, offset=base + version.end)

    pending: dict[str, _PendingStorage] = {}
    persistent_load = _stream_persistent_load(src, model, pending, member)
    main_start = sys_info.end
    main = _run(src, main_start, persistent_load=persistent_load,
                hooks=torch_pickle.rebuild_hooks(), **where)
    rec.append(_record(src, main_start, main, f"{role_prefix}.main", member))
    keys_pickle = _run(src, main.end, limits=_SMALL_LIMITS, **where)
    rec.append(_record(src, main.end, keys_pickle, f"{role_prefix}.storage_keys", member))
    model.evidence.pickles.extend(rec)

    keys = keys_pickle.value
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise _fail(src, f"the storage key list is a {type(keys).__name__}, expected a list of "
                         "strings", base + main.end, member)
    little = info.get("little_endian", True) is not False
    data_start = keys_pickle.end
    swapped = _place_storages(src, model, pending, keys, data_start, little, member, base)

    model.objects = main.value
    model.metadata = {
        "container": "stream", "legacy_protocol": version.value,
        "sys_info": _jsonable(info), "pickle_protocol": main.protocol,
        "storages": len(keys), "data_offset": base + data_start,
    }
    model.tensors = build_tensor_list(main.value, fmt, src.path, model)
    if swapped:
        install_byteswap_readers(model)
    return model


def _stream_persistent_load(src: ByteSource, model: ModelFile, pending: dict, member):
    def persistent_load(pid, pos):
        if isinstance(pid, tuple) and pid and pid[0] == "module":
            return _module_pid(model, pid, pos)
        if not isinstance(pid, tuple) or len(pid) != 6:
            raise pickle_vm.PickleError(f"unsupported persistent id {brief(pid, 80)} (the legacy "
                                        "stream uses 6-field storage ids)", offset=pos)
        dtype, key, location, numel, cls = torch_pickle.parse_storage_pid(pid, pos)
        entry = pending.get(key)
        if entry is None:
            ref = StorageRef(key, dtype, numel, location, file=src.path, member=member)
            entry = pending[key] = _PendingStorage(ref, cls, [])
        view = pid[5]
        if view is None:
            return entry.ref
        if (not isinstance(view, tuple) or len(view) != 3 or not isinstance(view[0], str)
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in view[1:])):
            raise pickle_vm.PickleError(f"malformed storage view metadata {brief(view, 80)}", offset=pos)
        for existing, _, _ in entry.views:
            if existing.key == view[0]:
                return existing
        ref = StorageRef(view[0], dtype, view[2], location, file=src.path, member=member)
        entry.views.append((ref, view[1], view[2]))
        return ref
    return persistent_load


def _module_pid(model: ModelFile, pid: tuple, pos: int):
    """``('module', cls, source_file, source_text)``: keep the source as evidence, return the class."""
    if len(pid) != 4 or not isinstance(pid[1], Global):
        raise pickle_vm.PickleError(f"malformed module persistent id {brief(pid, 80)}", offset=pos)
    cls, source_file, source = pid[1], pid[2], pid[3]
    if isinstance(source, str):
        model.evidence.code[f"module:{cls.dotted}"] = source
    model.extras.setdefault("module_sources", {})[cls.dotted] = (
        source_file if isinstance(source_file, str) else None)
    return cls


def _place_storages(src, model, pending, keys, data_start, little, member, base) -> bool:
    """Walk the raw storages after the key list; set each StorageRef's offset and size.

    Returns True when the storages were written big-endian (values need a byte-swapping reader).
    """
    seen: set[str] = set()
    offsets: list[tuple[str, int, int]] = []   # key, data offset, nbytes
    swapped = False
    pos = data_start
    for i, key in enumerate(keys):
        where = f"storage {key!r} ({i + 1} of {len(keys)})"
        if key in seen:
            model.evidence.add("legacy.duplicate_storage_key", f"{where} is listed twice",
                               file=src.path, member=member, offset=base + pos)
        seen.add(key)
        entry = pending.get(key)
        if entry is None:
            # torch fails here ("storage key not found"): without the storage class the size
            # of the element, hence where the next storage starts, is unknown.
            raise _fail(src, f"{where} is listed after the pickles but the main pickle never "
                             "names it: its element size is unknown", base + pos, member)
        if pos + COUNT.size > src.size:
            ends = "its record ends" if member else "the file ends"
            raise _fail(src, f"truncated: {where}: its element count needs "
                             f"{base + pos + COUNT.size} bytes, {ends} at {base + src.size}",
                        base + pos, member)
        itemsize = _itemsize(entry.ref.dtype) if entry.class_name not in ("UntypedStorage",) else 1
        count = COUNT.unpack_from(src.view(pos, COUNT.size))[0]
        if not 0 <= count <= (src.size - pos - COUNT.size) // itemsize:
            be = COUNT_BE.unpack_from(src.view(pos, COUNT.size))[0]
            if not little and 0 <= be <= (src.size - pos - COUNT.size) // itemsize:
                count, swapped = be, True
            elif count < 0:
                raise _fail(src, f"{where}: negative element count {count}", base + pos, member)
            else:
                ends = "its record ends" if member else "the file ends"
                raise _fail(src, f"truncated: {where} ({count} elements of {itemsize} bytes) "
                                 f"needs {base + pos + COUNT.size + count * itemsize} bytes, "
                                 f"{ends} at {base + src.size}", base + pos + COUNT.size, member)
        if count != entry.ref.numel:
            model.evidence.add(
                "legacy.storage_size_mismatch",
                f"{where} holds {count} elements but the pickle says {entry.ref.numel} "
                "(torch refuses this file)", file=src.path, member=member, offset=base + pos)
        data = pos + COUNT.size
        offsets.append((key, base + data, count * itemsize))
        entry.ref.data_offset = base + data
        entry.ref.nbytes = count * itemsize
        pos = data + count * itemsize
    if swapped:
        model.evidence.add(
            "legacy.big_endian", "storages are stored big-endian (a 0.x big-endian writer): "
            "values are byte-swapped on read; torch 2.13 reads this file as little-endian and fails",
            file=src.path, member=member, offset=base + data_start)
    if pos != src.size and member is None:
        model.evidence.add("legacy.trailing_bytes",
                           f"{src.size - pos} bytes follow the last storage", file=src.path,
                           offset=pos)
    for key, entry in pending.items():
        if entry.ref.data_offset is None:
            entry.ref.error = f"storage {key!r} is not in the file's storage list: no bytes stored"
            model.evidence.add("legacy.storage_missing",
                               f"the main pickle names storage {key!r} but the file stores no "
                               "bytes for it", file=src.path, member=member)
        for view, offset, size in entry.views:
            _place_view(entry.ref, view, offset, size)
    model.extras["storages"] = [{"key": k, "byte_offset": o, "nbytes": n} for k, o, n in offsets]
    return swapped


def _place_view(root: StorageRef, view: StorageRef, offset: int, size: int) -> None:
    item = _itemsize(root.dtype)
    if root.error or root.data_offset is None:
        view.error = root.error or f"root storage {root.key!r} has no bytes"
    elif (offset + size) * item > (root.nbytes or 0):
        view.error = (f"storage view {view.key!r} wants elements [{offset}, {offset + size}) of "
                      f"storage {root.key!r}, which holds {(root.nbytes or 0) // item}")
    else:
        view.data_offset = root.data_offset + offset * item
        view.nbytes = size * item
    view.file = root.file


def _jsonable(value, depth: int = 0):
    """sys_info for the metadata: plain data, at most 8 levels and 64 items a level (it is a
    small dict in every real file; a hostile one may nest without end)."""
    if depth >= 8:
        return brief(value, 60)
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in list(value.items())[:64]}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value[:64]]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value if not isinstance(value, str) else value[:200]
    return brief(value, 200)


def _install_byteswap_readers(model: ModelFile) -> None:
    install = install_byteswap_readers
    install(model)


# -- the tar archive ----------------------------------------------------------------------------------
def _octal(field: bytes) -> int:
    """A tar numeric field: NUL/space-terminated octal, or base-256 when the high bit is set."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        return -1


def _tar_checksum(block: bytes) -> int:
    return sum(block[:148]) + 8 * 0x20 + sum(block[156:512])


def _pax_records(payload: bytes) -> dict[str, str]:
    """``"<len> key=value\\n"`` records of a PAX extended header."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(payload):
        space = payload.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(payload[pos:space])
        except ValueError:
            break
        if length <= 0 or pos + length > len(payload):
            break
        record = payload[space + 1:pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


def tar_entries(src: ByteSource, *, max_members: int = 10_000):
    """Every entry of a tar, in order, as ``(name, type, data offset, size, link target)``: the one
    tar reader of the project (the scanner walks every entry, duplicates and links included).
    Headers are checked (magic, checksum, sizes within the file); PAX ``path``/``size`` apply."""
    pos = 0
    pax: dict[str, str] = {}
    count = 0
    while pos + TAR_BLOCK <= src.size:
        block = src.read(pos, TAR_BLOCK, "tar header", fmt=FORMAT)
        if block == bytes(TAR_BLOCK):
            break  # end-of-archive marker
        if not _tar_header_ok(block):
            raise _fail(src, "bad tar header (checksum or magic)", pos)
        count += 1
        if count > max_members:
            raise _fail(src, f"more than {max_members} tar members", pos)
        size = _octal(block[_TAR_SIZE])
        kind = chr(block[_TAR_TYPE]) if block[_TAR_TYPE] else "0"
        name = block[_TAR_NAME].split(b"\0", 1)[0]
        prefix = block[_TAR_PREFIX].split(b"\0", 1)[0]
        full = ((prefix + b"/" + name) if prefix else name).decode("utf-8", "replace")
        if "size" in pax:
            try:
                size = int(pax["size"])
            except ValueError:
                size = -1
        full = pax.get("path", full)
        data = pos + TAR_BLOCK
        if size < 0 or size > src.size - data:
            raise _fail(src, f"tar member {full!r} wants {size} bytes at offset {data}, the file "
                             f"has {src.size} bytes", pos)
        if kind == "x":
            pax = _pax_records(src.read(data, size, "PAX header", fmt=FORMAT))
        elif kind != "g":  # a global PAX header holds nothing torch relies on
            link = pax.get("linkpath", block[_TAR_LINK].split(b"\0", 1)[0].decode("utf-8", "replace"))
            yield full, kind, data, size, link
            pax = {}
        pos = data + (size + TAR_BLOCK - 1) // TAR_BLOCK * TAR_BLOCK


def read_tar(src: ByteSource, *, max_members: int = 10_000) -> dict[str, tuple[int, int]]:
    """Regular members of a tar: ``{name: (data offset, size)}``, each bounds-checked."""
    members: dict[str, tuple[int, int]] = {}
    for full, kind, data, size, _ in tar_entries(src, max_members=max_members):
        if kind in "07" and full not in members:
            members[full] = (data, size)
    return members


def _open_tar(src: ByteSource) -> ModelFile:
    members = read_tar(src)
    for name in ("storages", "tensors", "pickle"):
        if name not in members:
            raise _fail(src, f"tar checkpoint has no {name!r} member (members: "
                             f"{', '.join(sorted(members)) or 'none'})")
    model = ModelFile(FORMAT, src.path, sources={src.path: src})
    objects: dict[int, object] = {}

    if "sys_info" in members:
        start, size = members["sys_info"]
        r = _run(src, start, end=start + size, member="sys_info", limits=_SMALL_LIMITS)
        model.evidence.pickles.append(_record(src, start, r, "legacy.sys_info", "sys_info"))
        model.metadata["sys_info"] = _jsonable(r.value)

    _tar_storages(src, model, members["storages"], objects)
    _tar_tensors(src, model, members["tensors"], objects)

    start, size = members["pickle"]

    def persistent_load(pid, pos):
        if isinstance(pid, tuple):
            # (cls, source_file, source): a module class saved with its source.
            if len(pid) == 3 and isinstance(pid[0], Global):
                return _module_pid(model, ("module",) + pid, pos)
            raise pickle_vm.PickleError(f"unsupported persistent id {brief(pid, 80)}", offset=pos)
        try:
            key = int(pid)
        except (TypeError, ValueError):
            raise pickle_vm.PickleError(f"persistent id {brief(pid, 40)} is not a key", offset=pos) from None
        if key not in objects:
            model.evidence.add("legacy.object_missing", f"the pickle names object {key} but the "
                               "archive stores no tensor or storage under that key",
                               file=src.path, member="pickle", offset=pos)
            return None
        return objects[key]

    main = _run(src, start, end=start + size, persistent_load=persistent_load,
                hooks=torch_pickle.rebuild_hooks(), member="pickle")
    model.evidence.pickles.append(_record(src, start, main, "legacy.main", "pickle"))
    model.objects = main.value
    model.metadata.update({"container": "tar", "pickle_protocol": main.protocol,
                           "members": {k: {"offset": o, "size": s} for k, (o, s) in members.items()}})
    model.tensors = build_tensor_list(main.value, FORMAT, src.path, model)
    return model


def _key_of(value, what: str, pos: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise pickle_vm.PickleError(f"{what} key must be an integer, got {brief(value, 40)}", offset=pos)
    try:
        return int(value)
    except ValueError:
        raise pickle_vm.PickleError(f"{what} key must be an integer, got {brief(value, 40)}",
                                    offset=pos) from None


def _tar_count(src, model, start: int, end: int, what: str) -> tuple[int, int]:
    """The pickled record count that opens the tar form's ``storages``/``tensors`` member:
    (count, offset of the first record)."""
    member = f"{what}s"
    r = _run(src, start, end=end, member=member, limits=_SMALL_LIMITS)
    model.evidence.pickles.append(_record(src, start, r, f"legacy.{what}_count", member))
    count = r.value
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise _fail(src, f"{what} count is {brief(count, 40)}", start, member)
    return count, r.end


def _tar_header(src, model, pos: int, end: int, i: int, count: int, what: str,
                fields: str) -> tuple[tuple, int]:
    """Record ``i`` of ``count``: its pickled 3-tuple header and the offset just after it."""
    member = f"{what}s"
    if pos >= end:
        raise _fail(src, f"{what} {i + 1} of {count}: member ends", pos, member)
    r = _run(src, pos, end=end, member=member, limits=_SMALL_LIMITS)
    model.evidence.pickles.append(_record(src, pos, r, f"legacy.{what}_header", member))
    head = r.value
    if not isinstance(head, tuple) or len(head) != 3:
        raise _fail(src, f"{what} record {brief(head, 60)} is not ({fields})", pos, member)
    return head, r.end


def _tar_storages(src, model, span, objects) -> None:
    start, size = span
    end = start + size
    count, pos = _tar_count(src, model, start, end, "storage")
    storages: dict[int, StorageRef] = {}
    for i in range(count):
        head, after = _tar_header(src, model, pos, end, i, count, "storage", "key, location, class")
        key = _key_of(head[0], "storage", pos)
        cls = head[2]
        if not isinstance(cls, Global) or cls.name not in torch_pickle.STORAGE_DTYPES \
                or torch_pickle.STORAGE_DTYPES[cls.name] is None:
            raise _fail(src, f"storage {key}: unknown storage class {brief(cls, 60)}", pos, "storages")
        dtype = torch_pickle.STORAGE_DTYPES[cls.name]
        item = _itemsize(dtype)
        pos = after
        if pos + COUNT.size > end:
            raise _fail(src, f"storage {key}: truncated before its element count", pos, "storages")
        n = COUNT.unpack_from(src.view(pos, COUNT.size))[0]
        if not 0 <= n <= (end - pos - COUNT.size) // item:
            raise _fail(src, f"storage {key}: {n} elements of {item} bytes do not fit in the "
                             f"{end - pos - COUNT.size} bytes left in the member", pos, "storages")
        ref = StorageRef(str(key), dtype, n, str(head[1]), file=src.path, member="storages",
                         data_offset=pos + COUNT.size, nbytes=n * item)
        storages[key] = objects[key] = ref
        pos += COUNT.size + n * item
    r = _run(src, pos, end=end, member="storages", limits=_SMALL_LIMITS)
    model.evidence.pickles.append(_record(src, pos, r, "legacy.storage_views", "storages"))
    views = r.value if isinstance(r.value, list) else []
    for view in views:
        if not isinstance(view, tuple) or len(view) != 4:
            raise _fail(src, f"storage view {brief(view, 60)} is not (key, root, offset, numel)", pos, "storages")
        vkey, root_key = _key_of(view[0], "view", pos), _key_of(view[1], "storage", pos)
        root = storages.get(root_key)
        if root is None:
            raise _fail(src, f"storage view {vkey} refers to unknown storage {root_key}", pos, "storages")
        offset, numel = view[2], view[3]
        ref = StorageRef(str(vkey), root.dtype, numel if isinstance(numel, int) else 0,
                         root.location, file=src.path, member="storages")
        if isinstance(offset, int) and isinstance(numel, int):
            _place_view(root, ref, offset, numel)
        else:
            ref.error = f"malformed view ({brief(offset, 20)}, {brief(numel, 20)})"
        objects[vkey] = ref


def _tar_tensors(src, model, span, objects) -> None:
    start, size = span
    end = start + size
    count, pos = _tar_count(src, model, start, end, "tensor")
    for i in range(count):
        head, after = _tar_header(src, model, pos, end, i, count, "tensor", "key, storage, class")
        key, skey = _key_of(head[0], "tensor", pos), _key_of(head[1], "storage", pos)
        pos = after
        if pos + TAR_NDIM.size > end:
            raise _fail(src, f"tensor {key}: truncated before its dimensions", pos, "tensors")
        ndim = TAR_NDIM.unpack_from(src.view(pos, TAR_NDIM.size))[0]
        need = TAR_NDIM.size + 16 * max(ndim, 0) + 8
        if not 0 <= ndim <= 64 or pos + need > end:
            raise _fail(src, f"tensor {key}: {ndim} dimensions do not fit in the member", pos, "tensors")
        dims = struct.unpack_from(f"<{2 * ndim + 1}q", src.view(pos + TAR_NDIM.size, 8 * (2 * ndim + 1)))
        shape, stride, offset = dims[:ndim], dims[ndim:2 * ndim], dims[-1]
        if any(d < 0 for d in dims):
            raise _fail(src, f"tensor {key}: negative size, stride or offset {dims}", pos, "tensors")
        storage = objects.get(skey)
        if not isinstance(storage, StorageRef):
            raise _fail(src, f"tensor {key} views unknown storage {skey}", pos, "tensors")
        objects[key] = TensorRef(storage, offset, tuple(shape), tuple(stride), storage.dtype or "uint8",
                                 pos=pos)
        pos += need
