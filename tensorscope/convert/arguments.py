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
    neither ``*.safetensors`` nor a folder (existing, or named with a trailing ``/``), an output
    folder that cannot be made (a file is in its way), an existing output without ``force``, an
    output that is the input, a bad ``max_shard_size``. A missing output folder is made when
    the output is written (`make_folders`). Returns
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
        raise TensorscopeError(f"{out}: the output must be a .safetensors file or a folder "
                               f"(end it with {os.sep} for a folder that does not exist yet)")
    _check_folder(base)
    if not is_url(src) and os.path.realpath(base) == os.path.realpath(src):
        raise TensorscopeError(f"{base}: the output would overwrite the input")
    if os.path.exists(base) and not force:
        raise TensorscopeError(f"{base}: exists; pass --force to replace it")
    return limit


def _check_targets(src: str, model: ModelFile, targets: list[str], force: bool) -> None:
    inputs = {os.path.realpath(f) for f in _input_files(model, src)}
    for t in targets:
        _check_folder(t)
        if os.path.realpath(t) in inputs:
            raise TensorscopeError(f"{t}: the output would overwrite the input")
        if os.path.exists(t) and not force:
            raise TensorscopeError(f"{t}: exists; pass --force to replace it")


def _check_folder(target: str) -> None:
    """The folder of ``target`` exists or can be made: its nearest existing ancestor is a folder."""
    folder = os.path.dirname(os.path.abspath(target))
    probe = folder
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise TensorscopeError(f"{target}: the output folder {folder} cannot be made: {probe} "
                               "is a file")


def make_folders(targets: list[str]) -> list[str]:
    """Make the missing output folders of ``targets``; returns those made, deepest last (for
    `remove_folders` when the conversion fails)."""
    made: list[str] = []
    for t in targets:
        folder = os.path.dirname(os.path.abspath(t))
        missing = []
        while not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for f in reversed(missing):
            os.mkdir(f)
            made.append(f)
    return made


def remove_folders(made: list[str]) -> None:
    """Undo `make_folders` (folders left empty only): a failed conversion leaves nothing."""
    for f in reversed(made):
        try:
            os.rmdir(f)
        except OSError:
            pass
