"""Zip-based formats: read the archive once, then hand it to the parser its members call for.

torch.load treats any file starting with ``PK\\x03\\x04`` as a zip (``_is_zipfile``), whatever
its name, so this is the first entry of the registry. Within a zip:
- ``<P>/archive_format`` = "pt2" or ``<P>/models/*.json`` -> torch.export ``.pt2``;
- ``<P>/constants.pkl`` or ``<P>/code/`` -> TorchScript;
- ``<P>/data.pkl`` -> torch.save archive;
- every member ``*.npy`` -> NumPy ``.npz``.
"""
from __future__ import annotations

import contextvars
import importlib
from contextlib import contextmanager
from itertools import repeat

from tensorscope.errors import FormatError
from tensorscope.model import ModelFile
from tensorscope.source import ByteSource

from . import zip_reader, zipfmt

FORMAT = "zip"
FORMATS = ("zip", "torch-zip", "torchscript", "pt2", "npz")


def sniff(head: bytes, size: int) -> bool:
    return zipfmt.sniff(head, size)


def classify(archive: zipfmt.ZipArchive) -> str:
    """The zip-based format an archive holds (by member names, as the loaders look them up)."""
    names = archive.names()
    prefix = archive.torch_prefix()
    if prefix is not None:
        fmt = archive.get(f"{prefix}/archive_format")
        models, code = f"{prefix}/models/", f"{prefix}/code/"   # not rebuilt per name (10^5)
        # map() of the str methods: one C loop per test over 10^5 names (a generator: 5x more)
        if fmt is not None or (any(map(str.endswith, names, repeat(".json"))) and any(
                n.startswith(models) and n.endswith(".json") for n in names)):
            return "pt2"
        if archive.get(f"{prefix}/constants.pkl") is not None or any(
                map(str.startswith, names, repeat(code))):
            return "torchscript"
        if archive.get(f"{prefix}/data.pkl") is not None:
            return "torch-zip"
    if names and all(n.endswith(".npy") for n in names):
        return "npz"
    return "zip"


_MODULES = {"torch-zip": "torch_zip", "torchscript": "torchscript", "pt2": "torch_export",
            "npz": "numpy_fmt"}


def open_source(src: ByteSource) -> ModelFile:
    return open_archive(src, zip_reader.read_zip(src))


def open_archive(src: ByteSource, archive: zipfmt.ZipArchive) -> ModelFile:
    """Open an archive already read (the scanner shares one central-directory read with us)."""
    kind = classify(archive)
    module_name = _MODULES.get(kind)
    if module_name is None:
        if archive.get("config.json") is not None and archive.get("model.weights.h5") is not None:
            raise FormatError("a Keras archive (config.json, model.weights.h5): its weights are "
                              "HDF5, which this tool does not list; `tensorscope scan` judges "
                              "its config", format="keras", file=src.path)
        raise FormatError(f"zip archive holds no model this tool recognises "
                          f"(no data.pkl, TorchScript code, .pt2 layout or .npy members; first "
                          f"members: {', '.join(archive.names()[:5]) or 'none'})",
                          format="zip", file=src.path)
    module = importlib.import_module(f"tensorscope.parsers.{module_name}")
    model = module.open_zip(src, archive)
    if _KEEP_ARCHIVE.get():
        model.evidence.archive = archive
    return model


_KEEP_ARCHIVE = contextvars.ContextVar("tensorscope_keep_archive", default=False)


def keeping_archive_active() -> bool:
    return _KEEP_ARCHIVE.get()


@contextmanager
def keeping_archive():
    """Within it, a zip model keeps its `ZipArchive` as ``model.evidence.archive``, so that a
    scan of the opened model (`tensorscope.scanning.scan_model`: convert opens, then scans) reads the
    central directory once. Off by default: a listing has no use for 100,000 members (~45 MB)."""
    token = _KEEP_ARCHIVE.set(True)
    try:
        yield
    finally:
        _KEEP_ARCHIVE.reset(token)
