"""The walk over files and folders: which files a scan reads (symlinks inside the tree,
Hugging Face cache links, one real file once) and the merge of per-file reports."""
from __future__ import annotations

import os
from typing import Iterator

from ..errors import FileMissing
from ..remote import is_url, list_files
from .context import ScanLimits
from .loader import scan_file, scan_model
from .report import FileReport, Finding, ScanReport, merge
from .rules import severity_of


def scan_paths(*paths: str | os.PathLike, recursive: bool = True,
               follow_symlinks_inside: bool = True, limits: ScanLimits | None = None) -> ScanReport:
    """Scan files and folders; nothing found in them is executed or imported.

    Args:
        paths: files and folders (Hugging Face cache folders included: their snapshot symlinks
            into ``blobs/`` are followed because they stay inside the repository folder).
        recursive: descend into sub-folders.
        follow_symlinks_inside: follow symlinks that resolve inside the scanned tree; links
            that leave it are never followed (``file.symlink-outside``).
        limits: `ScanLimits` (decompression cap, nesting depth, VM limits).

    Returns:
        A `ScanReport`, findings worst first.

    Raises:
        FileMissing: a path does not exist (a TensorscopeError and a FileNotFoundError).

    Example:
        >>> report = scan_paths("model.pt")            # doctest: +SKIP
        >>> report.unsafe, [str(f) for f in report.findings][:1]   # doctest: +SKIP
    """
    return _scan_planned(paths, recursive, follow_symlinks_inside, limits, {})


def _scan_planned(paths, recursive: bool, follow_symlinks_inside: bool,
                  limits: ScanLimits | None, opened: dict) -> ScanReport:
    """`scan_paths`; a file whose real path is in ``opened`` is scanned from that `ModelFile`
    (already parsed) instead of being parsed again."""
    todo, walk_findings = plan(*paths, recursive=recursive,
                               follow_symlinks_inside=follow_symlinks_inside)
    reports: list[FileReport] = [FileReport(f.file, [f], False, f.rule == "file.unreadable")
                                 for f in walk_findings]
    data_files: set[str] = set()
    for path, explicit in todo:
        known = os.path.realpath(path) in data_files
        part = opened.get(os.path.realpath(path)) if opened and not is_url(path) else None
        if part is not None:
            r = scan_model(part, limits=limits, path=path, explicit=explicit, known_data=known)
        else:
            r = scan_file(path, limits=limits, explicit=explicit, known_data=known)
        data_files.update(r.data_files)
        reports.append(r)
    return merge(reports)


def scan_opened(path, model, *, limits: ScanLimits | None = None) -> ScanReport:
    """`scan_paths(path)` for a model already opened from ``path`` (convert, the TUI): a single
    file is scanned from the parsed model, without parsing it again; folders and multi-file
    models are walked as usual."""
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.realpath(model.path) == os.path.realpath(path) and \
            len(model.files) <= 1:
        return merge([scan_model(model, limits=limits)])
    # a folder: its shards that were opened with the model, and the index file that opens as
    # the model itself, are not parsed again
    opened = {} if is_url(path) else {os.path.realpath(p): m for p, m in model.parts.items()}
    index = model.metadata.get("index") if opened and model.format == "sharded" else None
    for f in model.files if index else ():
        if os.path.basename(f) == index:
            opened[os.path.realpath(f)] = model
    return _scan_planned((path,), True, True, limits, opened)


def plan(*paths, recursive: bool = True,
         follow_symlinks_inside: bool = True) -> tuple[list[tuple[str, bool]], list[Finding]]:
    """The files a scan of ``paths`` reads, as (path, named explicitly), and the findings of the
    walk itself (symlinks leaving the tree, folders that cannot be listed). Each file is then
    scanned on its own (`scan_file`), so the list can be fanned out over processes."""
    todo: list[tuple[str, str, bool]] = []  # (path, its real path, named explicitly)
    walk_findings: list[Finding] = []
    for p in paths:
        p = os.fspath(p)
        if is_url(p):  # read by ranges; a remote folder (hf://org/name) is its files
            names = list_files(p)
            todo.extend((u, u, not names) for u in ([f"{p.rstrip('/')}/{n}" for n in names] or [p]))
            continue
        if not os.path.lexists(p):
            raise FileMissing(p, "no such file or directory")
        if os.path.isdir(p):
            todo.extend((f, real, False) for f, real in
                        _walk(p, recursive, follow_symlinks_inside, walk_findings))
        else:
            todo.append((p, os.path.realpath(p), True))
    # One real file is scanned once, under its most telling name (a snapshot link, not a blob).
    by_real: dict[str, tuple[str, bool]] = {}
    for path, real, explicit in todo:
        prev = by_real.get(real)
        if prev is None or (explicit and not prev[1]) or (not prev[1] and _nicer(path, prev[0])):
            by_real[real] = (path, explicit or (prev[1] if prev else False))
    # Models that point at raw data files (ONNX external data) go first, so that those files are
    # then read as the raw data they are.
    order = sorted(by_real.values(), key=lambda pe: not pe[0].lower().endswith(".onnx"))
    return order, walk_findings


def _nicer(a: str, b: str) -> bool:
    """Prefer names with an extension over content-addressed blob names."""
    return bool(os.path.splitext(a)[1]) and not os.path.splitext(b)[1]


def _hf_repo_root(path: str) -> str | None:
    """The Hugging Face cache repository folder (``models--org--name``) holding ``path``."""
    cur = os.path.abspath(path)
    while True:
        base = os.path.basename(cur)
        if base.startswith(("models--", "datasets--", "spaces--")) and \
                os.path.isdir(os.path.join(cur, "blobs")):
            return cur
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        cur = parent


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([root, path]) == root
    except ValueError:
        return False


def _walk(top: str, recursive: bool, follow: bool,
          findings: list[Finding]) -> Iterator[tuple[str, str]]:
    """(path, real path) of the files under ``top``; symlinks followed only when they resolve
    inside the tree. A plain entry's real path is its folder's real path joined with its name,
    so ``realpath`` (an lstat per path component) runs once per folder and symlink, not per file."""
    root = os.path.realpath(top)
    hf = _hf_repo_root(top)
    bounds = [root] + ([os.path.realpath(hf)] if hf else [])
    seen_dirs = {root}
    stack = [(top, root)]
    while stack:
        d, d_real = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            findings.append(Finding(severity_of("file.unreadable"), "file.unreadable", f"cannot list folder: {e.strerror}", d))
            continue
        subdirs = []
        for e in entries:
            path = e.path
            if e.is_symlink():
                real = os.path.realpath(path)
                if not follow or not any(_inside(real, b) for b in bounds):
                    findings.append(Finding(severity_of("file.symlink-outside"), "file.symlink-outside",
                                            f"symlink to {real} leaves the scanned tree: not followed",
                                            path))
                    continue
                if os.path.isdir(real):
                    if recursive and real not in seen_dirs:
                        seen_dirs.add(real)
                        subdirs.append((path, real))
                elif os.path.isfile(real):
                    yield path, real
                continue
            if e.is_dir(follow_symlinks=False):
                real = os.path.join(d_real, e.name)
                if recursive and real not in seen_dirs:
                    seen_dirs.add(real)
                    subdirs.append((path, real))
            elif e.is_file(follow_symlinks=False):
                yield path, os.path.join(d_real, e.name)
        stack.extend(reversed(subdirs))
