"""Which format is this? An ordered registry of parsers, decided by content, never by name.

Each parser module in `tensorscope.parsers` exposes ``FORMAT`` (its name), ``sniff(head, size)``
(a cheap test over the first `HEAD_BYTES` bytes) and ``open_source(src) -> ModelFile``. Zip
archives are read once and handed to the zip-based parser that their members call for. Folders
(DCP checkpoints, sharded checkpoints, Hugging Face snapshots) are recognised by their files.

`identify` returns every candidate in rank order, so a polyglot stays visible; `open` opens the
first, which is the one the format's own loader would pick (torch.load tries zip first).
"""
from __future__ import annotations

import gc
import importlib
import os
import threading
from contextlib import contextmanager

from .errors import FileMissing, FormatError, TensorscopeError, UnknownFormat, file_error
from .open_mode import listing_mode
from .model import ModelFile
from .remote import is_url
from .source import ByteSource

__all__ = ["open_model", "open_model_by_shard", "identify", "FILE_PARSERS", "HEAD_BYTES"]

HEAD_BYTES = 4096

# Order matters: the first match wins, as in torch.load (zip, then legacy pickle stream).
# Modules are imported on first use (a listing of a safetensors file never imports the VM).
FILE_PARSERS: list[str] = [
    "zip_dispatch",   # PK.. : torch zip, TorchScript, .pt2, .npz (decided by members)
    "safetensors",    # u64 header length + '{'
    "gguf",           # b"GGUF"
    "numpy_fmt",      # b"\x93NUMPY"
    "onnx_pb",        # protobuf ModelProto (checked structurally)
    "torch_legacy",   # pickle stream starting with the legacy magic number
    "joblib_fmt",     # compressed joblib.dump (zlib/gzip/bz2/xz/lzma/ZF around a pickle)
    "plain_pickle",   # any other pickle (joblib-style .pkl): objects, no tensors layout
]

DIR_PARSERS: list[str] = ["dcp", "sharded"]


def _parser(name: str):
    return importlib.import_module(f"tensorscope.parsers.{name}")


def _available(names: list[str]):
    for name in names:
        yield name, _parser(name)


# Tests that a parser's own sniff would fail, made before importing it: the zip readers and the
# DCP reader (which brings the pickle VM) are a third of the start-up of a safetensors listing.
# Each is implied by the module's sniff (zipfmt.sniff: b"PK\x03\x04" or b"PK\x05\x06"; dcp:
# a ``.metadata`` file).
def _may_sniff(name: str, head: bytes) -> bool:
    return name != "zip_dispatch" or head[:2] == b"PK"


def _may_sniff_dir(name: str, path: str) -> bool:
    return name != "dcp" or os.path.exists(os.path.join(path, ".metadata"))


def identify(path: str | os.PathLike) -> list[str]:
    """Formats whose signature matches, best first (empty when none does)."""
    path = os.fspath(path)
    if is_url(path):
        from .remote import RemoteSource
        with RemoteSource(path) as src:
            head, size = src.head(HEAD_BYTES), src.size
        return [mod.FORMAT for _, mod in _available(FILE_PARSERS) if mod.sniff(head, size)]
    if os.path.isdir(path):
        _listable(path)
        found = [mod.FORMAT for _, mod in _available(DIR_PARSERS) if mod.sniff_dir(path)]
        single = _parser("sharded").single_file(path) if found[:1] == ["sharded"] else None
        return identify(single) if single else found   # one model file: the folder is that file
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise file_error(e, path) from None
    return [mod.FORMAT for _, mod in _available(FILE_PARSERS) if mod.sniff(head, size)]


@contextmanager
def gc_paused():
    """Opt-in, for a process that owns its collector (the CLI, `tensorscope.cli`): pause the
    cyclic garbage collector within the block, and restore whether it was enabled at its end.

    A checkpoint of 10^5 tensors makes millions of small objects that all stay alive; the
    collector would walk them again and again while they are made (measured on a 100,000-tensor
    torch zip: the listing's time doubled). `open_model` itself never touches the collector (a
    library leaves its host alone: no freeze, no thresholds, no pause); a command that wants the
    speed says so. Pausing adds no memory risk of its own: the only cyclic structures a file can
    make come from the pickle VM, whose object and memo limits bound what a hostile file keeps.
    """
    global _paused_depth
    with _paused_lock:  # blocks nest and may run in threads: the outermost restores
        if _paused_depth == 0:
            _state["enabled"] = gc.isenabled()
            gc.disable()
        _paused_depth += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused_depth -= 1
            if _paused_depth == 0 and _state["enabled"]:
                gc.enable()


_paused_lock = threading.Lock()
_paused_depth = 0
_state = {"enabled": True}


def open_model(path: str | os.PathLike, *, format: str | None = None,
               listing: bool | None = None) -> ModelFile:
    """Open a model file or folder without executing anything.

    Args:
        path: a file (any supported format, any extension) or a folder (DCP checkpoint, sharded
            checkpoint with ``*.index.json``, Hugging Face snapshot), or a URL (``https://``,
            ``hf://org/name[@revision][/file]``, ``s3://bucket/key``) read by byte ranges
            (`tensorscope.remote`).
        format: force a parser by its ``FORMAT`` name instead of detecting.
        listing: True for a model that is listed or compared, never scanned (what ``inspect``
            and ``diff`` open): a torch zip then keeps neither its object tree
            (``model.objects`` is None) nor the per-call evidence, and lets go of its archive's
            members (~1 KB less per tensor). Default False; None (for the parsers' own nested
            opens: a sharded index's shards) keeps the mode of the open it runs in.

    Returns:
        The `ModelFile`.

    Raises:
        FileAccessError: the path does not exist (`FileMissing`, also a FileNotFoundError) or may
            not be read (`AccessDenied`, also a PermissionError).
        UnknownFormat: no parser recognises the content.
        FormatError: the content is recognised but malformed (message names the place).
    """
    path = os.fspath(path)
    try:
        if listing is None:   # a nested open (or the default): the mode in force, False outside
            return _open_model(path, format)
        with listing_mode(listing):
            return _open_model(path, format)
    except OSError as e:  # missing shard, unreadable file or folder: named, one hierarchy
        raise file_error(e, path) from None


def open_model_by_shard(path: str | os.PathLike, on_shard, *, listing: bool | None = None
                        ) -> ModelFile:
    """`open_model`, telling ``on_shard(name, shard, k, total)`` of each shard of a sharded
    checkpoint (folder or ``*.index.json``) as soon as it is parsed, before the next is read: a
    consumer can show the first shard's tensors while the others are read. The shard is that
    file's own `ModelFile`; the return value is the whole model, exactly what `open_model`
    returns (its order, checks and evidence). A model of one file calls ``on_shard`` never."""
    with _parser("sharded").each_shard(on_shard):
        return open_model(path, listing=listing)


def _listable(folder: str) -> None:
    """Raise `AccessDenied` (not "holds no model") for a folder that may not be listed."""
    try:
        with os.scandir(folder):   # opening the listing is enough: no entry is read
            pass
    except OSError as e:
        raise file_error(e, folder) from None


def _open_model(path: str, format: str | None) -> ModelFile:
    if is_url(path):
        return _open_url(path, format)
    if not os.path.exists(path):
        raise FileMissing(path, "no such file or directory")
    if os.path.isdir(path):
        _listable(path)
        for name in DIR_PARSERS:
            if format is None and not _may_sniff_dir(name, path):
                continue
            mod = _parser(name)
            if (format is None or mod.FORMAT == format) and mod.sniff_dir(path):
                return mod.open_dir(path)
        raise UnknownFormat(f"{path}: folder holds no model this tool recognises "
                            "(no *.index.json, DCP .metadata or model file)")
    if path.endswith(".index.json") and format in (None, "sharded"):
        # A sharded checkpoint's index (model.safetensors.index.json): the model is its shards.
        return _parser("sharded").open_index(path)
    return _open_source(ByteSource(path), path, format)


def _open_url(url: str, format: str | None) -> ModelFile:
    """A model behind a URL: a file read by ranges, an index and its shards, or (``hf://``, any
    fsspec store that lists) a model folder."""
    from .remote import RemoteSource
    if url.endswith(".index.json") and format in (None, "sharded"):
        return _parser("sharded").open_index(url)
    try:
        src = RemoteSource(url)
    except IsADirectoryError:
        if format not in (None, "sharded"):
            raise
        return _parser("sharded").open_dir(url)
    return _open_source(src, url, format)


def open_model_source(src, path: str, *, format: str | None = None,
                      listing: bool | None = None) -> ModelFile:
    """`open_model` on a file source the caller already holds open (the scan's, so that a URL
    is not opened, and its head fetched, a second time). The source stays the caller's: it is
    not closed when parsing fails. ``listing`` as for `open_model`."""
    if listing is None:
        return _open_source(src, path, format, owned=False)
    with listing_mode(listing):
        return _open_source(src, path, format, owned=False)


# HDF5 superblock signature, at 0 or after a user block of 512 * 2^k bytes (HDF5 spec, "Format
# Signature"): Keras .h5 files. Named in the error, since a user holding one wants to know why.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _open_source(src, path: str, format: str | None, *, owned: bool = True) -> ModelFile:
    advise = getattr(src, "advise", None)   # a local map (a remote source fetches by range)
    if advise is not None:
        advise(random=True)  # parsing touches headers only: no read-ahead around them
    try:
        head = src.head(HEAD_BYTES)
        if src.size == 0:
            raise FormatError("empty file", file=path)
        for name in FILE_PARSERS:
            if format is None and not _may_sniff(name, head):
                continue
            mod = _parser(name)
            if format is not None and format not in getattr(mod, "FORMATS", (mod.FORMAT,)):
                continue
            if format is not None or mod.sniff(head, src.size):
                model = mod.open_source(src)
                model.sources.setdefault(path, src)
                if advise is not None:
                    advise(random=False)  # values are read in long runs: read-ahead helps
                return model
        if format is None:   # a recognisable start cut short is a truncated download, not garbage
            for _, mod in _available(FILE_PARSERS):
                cut = getattr(mod, "truncation", None)
                reason = cut(head, src.size) if cut is not None else None
                if reason:
                    raise FormatError(reason, format=mod.FORMAT, file=path, offset=src.size)
        if any(head[at:at + 8] == HDF5_SIGNATURE for at in (0, 512, 1024, 2048)):
            raise UnknownFormat(f"{path}: an HDF5 file (a Keras .h5 model, or other HDF5 data): "
                                "this tool does not list HDF5 datasets; `tensorscope scan` "
                                "judges a Keras model's config without loading it")
        raise UnknownFormat(f"{path}: not a model file this tool recognises "
                            f"(starts with {head[:8]!r}, {src.size} bytes)")
    except BaseException:
        if owned:
            src.close()
        raise


def describe_error(err: BaseException) -> str:
    """One line for any failure: our errors carry their place; others get a generic prefix."""
    if isinstance(err, TensorscopeError):
        return str(err)
    if isinstance(err, OSError):  # raised outside open_model (an output file, a scan walk)
        return str(file_error(err, ""))
    return f"internal error ({type(err).__name__}): {err}"
