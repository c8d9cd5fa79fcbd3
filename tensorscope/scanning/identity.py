"""What says a file is still the one scanned (its size, ETag or mtime): read by a fleet scan's
``--resume``, the baseline and the SBOM, below all three."""
from __future__ import annotations

import os
from typing import Any

from .. import remote
from ..errors import TensorscopeError


def identity(path: str) -> dict[str, Any]:
    """``{"size", "version", "mtime_ns"}``: what says the file is still the one scanned.
    A URL costs one request for one byte (its size and ETag come with it); a local file one
    stat."""
    if remote.is_url(path):
        try:
            with remote.RemoteSource(path, first_fetch=1) as src:
                return {"size": src.size, "version": src.version, "mtime_ns": None}
        except (OSError, TensorscopeError):
            return {"size": None, "version": None, "mtime_ns": None}
    try:
        st = os.stat(path)
    except OSError:
        return {"size": None, "version": None, "mtime_ns": None}
    return {"size": st.st_size, "version": None, "mtime_ns": st.st_mtime_ns}
