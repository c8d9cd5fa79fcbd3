"""What can be known wrong with a conversion's arguments before the input is read, and the output
paths checked again once the layout is known."""
from __future__ import annotations

import os

from ..errors import FileMissing, TensorscopeError
from ..model import ModelFile
from ..remote import is_url
from .sharding import _input_files, _output_base, parse_size

def check_arguments(src: str | os.PathLike, out: str | os.PathLike, *, force: bool = False,
                    max_shard_size: int | str | None = None) -> int | None:
    """What can be known wrong before the input is read: a missing input, an output that is
    neither ``*.safetensors`` nor an existing folder, a missing output folder, an existing
    output without ``force``, an output that is the input, a bad ``max_shard_size``. Returns
    the shard size in bytes (or None). Raises TensorscopeError (`FileMissing` for a missing
    input). `convert` calls it first; the CLI calls it before it scans."""
    src, out = os.fspath(src), os.fspath(out)
    if not is_url(src) and not os.path.exists(src):
        raise FileMissing(src, "no such file or directory")
    limit = None
    if max_shard_size is not None:
        try:
            limit = parse_size(max_shard_size)
        except ValueError as e:
            raise TensorscopeError(f"--max-shard-size: {e}") from None
    base = _output_base(out)
    if not base.endswith(".safetensors"):
        raise TensorscopeError(f"{out}: the output must be a .safetensors file or an existing "
                               "folder")
    folder = os.path.dirname(os.path.abspath(base))
    if not os.path.isdir(folder):
        raise TensorscopeError(f"{base}: the output folder {folder} does not exist")
    if not is_url(src) and os.path.realpath(base) == os.path.realpath(src):
        raise TensorscopeError(f"{base}: the output would overwrite the input")
    if os.path.exists(base) and not force:
        raise TensorscopeError(f"{base}: exists; pass --force to replace it")
    return limit


def _check_targets(src: str, model: ModelFile, targets: list[str], force: bool) -> None:
    inputs = {os.path.realpath(f) for f in _input_files(model, src)}
    for t in targets:
        folder = os.path.dirname(os.path.abspath(t))
        if not os.path.isdir(folder):
            raise TensorscopeError(f"{t}: the output folder {folder} does not exist")
        if os.path.realpath(t) in inputs:
            raise TensorscopeError(f"{t}: the output would overwrite the input")
        if os.path.exists(t) and not force:
            raise TensorscopeError(f"{t}: exists; pass --force to replace it")
