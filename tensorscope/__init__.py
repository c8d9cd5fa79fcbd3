"""tensorscope: open, diff and scan model files without executing them.

Public API:
    open(path) -> ModelFile        list tensors, read values zero-copy (``model.read(name)``);
                                   a URL (https://, hf://, s3://) is read by ranges (`remote`)
    scan(*paths) -> ScanReport     static safety scan of pickles and archives
    diff(a, b) -> DiffResult       compare two models of any formats down to the values
    TensorInfo, ModelFile          the common model
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (AccessDenied, FileAccessError, FileMissing, FormatError, LimitExceeded,
                     TensorNotFound, TensorscopeError, UnknownFormat)
from .formats import identify
from .formats import open_model as open
from .model import Anomaly, Evidence, ModelFile, TensorInfo

if TYPE_CHECKING:
    from .scanning import ScanReport

__version__ = "0.1.0"

__all__ = ["open", "identify", "scan", "diff", "TensorInfo", "ModelFile", "Evidence", "Anomaly",
           "TensorscopeError", "FormatError", "LimitExceeded", "UnknownFormat", "TensorNotFound",
           "FileAccessError", "FileMissing", "AccessDenied"]


def scan(*paths, **kwargs) -> ScanReport:
    """Static safety scan of files and folders; see `tensorscope.scanning.scan_paths`."""
    from .scanning import scan_paths    # imported on first use: `import tensorscope` stays light
    return scan_paths(*paths, **kwargs)


def diff(a, b, **kwargs):
    """Compare two models; see `tensorscope.diffing.diff_models`."""
    from .diffing import diff_models
    return diff_models(a, b, **kwargs)
