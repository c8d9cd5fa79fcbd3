"""torch.save archives nested inside a bigger file (DCP blobs, ``.pt2`` pickled payloads).

Spec: a nested blob is a complete ``torch.save`` zip (prefix ``archive/`` when saved to a buffer)
stored at ``[offset, offset+length)`` of an outer file. Its own offsets (central directory, local
headers, 64-byte data alignment) are relative to the BLOB start, not to the outer file; the blob
MAY sit at an unaligned offset. Everything this module returns is made absolute again: storage
data offsets, pickle record offsets, anomaly offsets and error offsets all point into the outer
file, so readers stay zero-copy over the outer file's memory map.

Public: `NestedSave`, `open_nested_save`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tensorscope.errors import FormatError
from tensorscope.model import Anomaly, PickleRecord
from tensorscope.source import ByteSource

from . import pickle_vm, torch_pickle, zip_reader, zipfmt
from .torch_pickle import StorageRef, TensorRef
from .torch_zip import archive_metadata, make_storage_resolver

__all__ = ["NestedSave", "open_nested_save"]


@dataclass(slots=True)
class NestedSave:
    """One nested torch.save blob, located in the outer file.

    Attributes:
        offset, length: where the blob is in ``file``.
        value: the inert root object of its ``data.pkl``.
        tensors: ``(path, raw_path, TensorRef)`` in saved order; storages point into ``file``.
        record: the pickle run (absolute offset, ``role`` as asked).
        anomalies: the inner zip's anomalies, offsets made absolute.
        metadata: the inner archive's records (prefix, version, byteorder ...).
    """

    file: str
    offset: int
    length: int
    value: object
    tensors: list[tuple[tuple[str, ...], tuple[str, ...], TensorRef]]
    record: PickleRecord
    anomalies: list[Anomaly] = field(default_factory=list)
    metadata: dict = field(default_factory=dict)


def _relocate(err: FormatError, file: str, label: str, base: int) -> FormatError:
    """Make an error raised inside the blob point at the outer file."""
    err.file = file
    err.member = f"{label}:{err.member}" if err.member else label
    if err.offset is not None:
        err.offset += base
    err.args = (err._render(),)
    return err


def open_nested_save(src: ByteSource, offset: int, length: int, *, label: str, fmt: str,
                     role: str) -> NestedSave:
    """Parse the torch.save zip at ``[offset, offset+length)`` of ``src`` without copying it.

    Args:
        src: the outer file.
        offset, length: the blob's place (checked against the file size first).
        label: names the blob in messages (``__0_0.distcp[w#1]``, ``data/weights/weight_0``).
        fmt: the outer format, for errors.
        role: the `PickleRecord` role of the blob's data.pkl.

    Raises:
        FormatError: the blob is outside the file, is not a torch.save zip, or its pickle is
            malformed; offsets in the message are absolute in ``src``.
    """
    view = src.view(offset, length, f"nested torch.save blob {label}", fmt=fmt)
    inner = ByteSource(src.path, data=view)
    try:
        if bytes(view[:4]) not in (zipfmt.MAGIC_LOCAL, zipfmt.MAGIC_EOCD):
            raise FormatError(f"blob does not start with a zip signature (starts with "
                              f"{bytes(view[:8])!r}): not a torch.save archive", format=fmt,
                              file=src.path, offset=0)
        archive = zip_reader.read_zip(inner)
        prefix = archive.torch_prefix()
        pkl = f"{prefix}/data.pkl" if prefix is not None else None
        member = archive.get(pkl) if pkl else None
        if member is None:
            raise FormatError(f"blob holds no <prefix>/data.pkl (first members: "
                              f"{', '.join(archive.names()[:5]) or 'none'})", format=fmt,
                              file=src.path, offset=0)
        if not member.is_stored or member.error:
            raise FormatError(member.error or "data.pkl is compressed: torch.load refuses it",
                              format=fmt, file=src.path, member=pkl, offset=member.header_offset)
        persistent_load, storages = make_storage_resolver(archive, prefix)
        data = archive.data(member)
        result = pickle_vm.run(data, persistent_load=persistent_load,
                               hooks=torch_pickle.rebuild_hooks(), file=src.path,
                               member=f"{label}:{pkl}", base_offset=offset + member.data_offset)
        record = PickleRecord(src.path, f"{label}:{pkl}", offset + member.data_offset, len(data),
                              result, role=role)
        result.raise_for_error()
    except FormatError as e:
        if e.member and e.member.startswith(f"{label}:"):
            raise  # already absolute (the pickle VM was given the outer offsets)
        raise _relocate(e, src.path, label, offset) from None
    for s in storages.values():
        _shift(s, offset, label)
    anomalies = [Anomaly(a.kind, a.message, file=src.path,
                         member=f"{label}:{a.member}" if a.member else label,
                         offset=None if a.offset is None else a.offset + offset)
                 for a in archive.anomalies]
    meta = archive_metadata(archive, prefix)
    meta["pickle_protocol"] = result.protocol
    tensors = list(torch_pickle.named_tensors(result.value))
    return NestedSave(src.path, offset, length, result.value, tensors, record, anomalies, meta)


def _shift(s: StorageRef, base: int, label: str) -> None:
    # ``s.file`` is already the outer path: the inner ByteSource carries it.
    if s.data_offset is not None:
        s.data_offset += base
    if s.member:
        s.member = f"{label}:{s.member}"
