"""Scanning fleets of files: one pure, picklable function per file, fanned out by engines we do
not write (a process pool, a Dask cluster), with results streamed as JSON lines.

`scan_record` is the unit of work: it takes a path (or URL) and plain arguments, reads the file,
and returns a JSON-ready dict; it touches no shared state, so it maps onto any engine as is
(``client.map(scan_record, paths)`` on Dask, ``ray.remote(scan_record)``, a Spark ``map``).
`scan_fleet` plans the files exactly as `tensorscope.scanner.scan_paths` does (same walk, same
de-duplication, ONNX models first), runs the records on ``jobs`` processes or a Dask cluster,
writes each record as it finishes, and folds them into the same `ScanReport`: the verdicts are
those of a sequential scan.

A JSON line: ``{"path", "size", "version" (ETag or content hash for a URL, else null),
"mtime_ns" (local files), "scanned", "error", "severity" (worst, null when none), "findings"
[...], "fetched" {"bytes", "requests", "objects"}, "seconds", "cpu_seconds"}``. ``--resume REPORT.jsonl`` skips a file whose
size and version/mtime equal its last line there (later lines win), and keeps that line's
findings in the report.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator

from . import remote
from .errors import FileMissing, TensorscopeError
from .scanner import (DEFAULT_SCAN_LIMITS, Finding, ScanLimits, ScanReport, Severity, _dedupe,
                      _nicer, _sorted, _walk, scan_file)

__all__ = ["plan", "identity", "scan_record", "scan_fleet", "load_resume", "record_findings"]


def plan(paths: Iterable[str | os.PathLike], recursive: bool = True,
         follow_symlinks_inside: bool = True) -> tuple[list[tuple[str, bool]], list[Finding]]:
    """The files a scan of ``paths`` reads, in `scan_paths`' order: ``[(path, named explicitly)]``,
    plus the findings of the walk itself (symlinks leaving the tree, unreadable folders)."""
    todo: list[tuple[str, str, bool]] = []
    walk_findings: list[Finding] = []
    for p in paths:
        p = os.fspath(p)
        if remote.is_url(p):
            names = remote.list_files(p)
            todo.extend((u, u, not names) for u in ([f"{p.rstrip('/')}/{n}" for n in names] or [p]))
            continue
        if not os.path.lexists(p):
            raise FileMissing(p, "no such file or directory")
        if os.path.isdir(p):
            todo.extend((f, real, False) for f, real in
                        _walk(p, recursive, follow_symlinks_inside, walk_findings))
        else:
            todo.append((p, os.path.realpath(p), True))
    by_real: dict[str, tuple[str, bool]] = {}
    for path, real, explicit in todo:
        prev = by_real.get(real)
        if prev is None or (explicit and not prev[1]) or (not prev[1] and _nicer(path, prev[0])):
            by_real[real] = (path, explicit or (prev[1] if prev else False))
    order = sorted(by_real.values(), key=lambda pe: not pe[0].lower().endswith(".onnx"))
    return order, walk_findings


def identity(path: str) -> dict[str, Any]:
    """``{"size", "version", "mtime_ns"}``: what says the file is still the one scanned.
    A URL costs one small request (its ETag); a local file one stat."""
    if remote.is_url(path):
        try:
            with remote.RemoteSource(path) as src:
                return {"size": src.size, "version": src.version, "mtime_ns": None}
        except (OSError, TensorscopeError):
            return {"size": None, "version": None, "mtime_ns": None}
    try:
        st = os.stat(path)
    except OSError:
        return {"size": None, "version": None, "mtime_ns": None}
    return {"size": st.st_size, "version": None, "mtime_ns": st.st_mtime_ns}


def scan_record(path: str, explicit: bool = True, limits: ScanLimits | None = None,
                ident: dict | None = None) -> dict[str, Any]:
    """Scan one file; the JSON-ready record (see the module doc). Pure and picklable."""
    start, cpu = time.perf_counter(), time.process_time()
    before = remote.totals()
    url = remote.is_url(path)
    if ident is None and not url:
        ident = identity(path)
    findings, scanned, error = scan_file(path, limits=limits or DEFAULT_SCAN_LIMITS,
                                         explicit=explicit)
    if ident is None:  # a URL: the version the scan itself read, no extra request
        got = remote.seen(path) or {"size": None, "version": None}
        ident = {"size": got["size"], "version": got["version"], "mtime_ns": None}
    findings = _sorted(_dedupe(findings))
    after = remote.totals()
    worst = max((f.severity for f in findings), default=None)
    return {"path": path, **ident, "scanned": scanned, "error": error,
            "severity": str(worst) if worst is not None else None,
            "findings": [f.to_dict() for f in findings],
            "fetched": {k: after[k] - before[k] for k in ("bytes", "requests", "objects")},
            "seconds": round(time.perf_counter() - start, 6),
            "cpu_seconds": round(time.process_time() - cpu, 6)}


def record_findings(rec: dict[str, Any]) -> list[Finding]:
    return [Finding(Severity.parse(f["severity"]), f["rule"], f["message"], f["file"],
                    f.get("member"), f.get("offset"), f.get("trigger"),
                    f.get("offset_base", "file")) for f in rec.get("findings", ())]


def load_resume(path: str) -> dict[str, dict[str, Any]]:
    """``{path: last record}`` of a JSON-lines report (a missing file is an empty report; a
    line cut short by an interrupted run is ignored)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("path"), str):
                    out[rec["path"]] = rec
    except FileNotFoundError:
        pass
    return out


def _unchanged(prev: dict[str, Any] | None, ident: dict[str, Any]) -> bool:
    if prev is None or ident["size"] is None or prev.get("size") != ident["size"]:
        return False
    if ident["version"] is not None:
        return prev.get("version") == ident["version"]
    return ident["mtime_ns"] is not None and prev.get("mtime_ns") == ident["mtime_ns"]


def _run_processes(items, jobs: int, limits) -> Iterator[dict[str, Any]]:
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor, as_completed
    methods = multiprocessing.get_all_start_methods()
    # fork starts workers with everything imported, and is safe while this process has no other
    # thread; otherwise forkserver/spawn: a clean interpreter, not a copy of one whose threads
    # (fetch pools, progress bars) may hold locks.
    if "fork" in methods and threading.active_count() == 1:
        method = "fork"
    else:
        method = "forkserver" if "forkserver" in methods else "spawn"
    ctx = multiprocessing.get_context(method)
    # Small batches: one task per file would spend as much on inter-process traffic as on
    # scanning a small file; a few batches per worker still stream results as they finish.
    batches = _batches(items, jobs)
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        futures = [pool.submit(_scan_batch, batch, limits) for batch in batches]
        for fut in as_completed(futures):
            yield from fut.result()


def _batches(items: list, workers: int) -> list[list]:
    size = max(1, min(16, len(items) // (workers * 8)))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _scan_batch(batch, limits) -> list[dict[str, Any]]:
    return [scan_record(path, explicit, limits, ident) for path, explicit, ident in batch]


def _run_dask(items, address: str, limits) -> Iterator[dict[str, Any]]:
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise TensorscopeError("--dask needs dask.distributed: pip install "
                                      "'tensorscope[distributed]'") from None
    cluster = None
    if address == "local":
        # one thread per worker: the scan is CPU-bound Python (the GIL), so processes scale
        cluster = LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        client = Client(address)
    try:
        workers = max(1, len(client.scheduler_info().get("workers", {})))
        futures = client.map(_scan_batch, _batches(items, workers), limits=limits, pure=False)
        for fut in as_completed(futures):
            yield from fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def scan_fleet(paths: Iterable[str | os.PathLike], *, recursive: bool = True, jobs: int = 1,
               dask: str | None = None, jsonl: str | None = None, resume: str | None = None,
               limits: ScanLimits | None = None,
               on_record: Callable[[dict[str, Any]], None] | None = None) -> ScanReport:
    """Scan files and folders on ``jobs`` processes (or the Dask cluster at ``dask``, ``"local"``
    for a LocalCluster), writing a JSON line per file to ``jsonl`` (``"-"``: stdout) as each
    finishes; the `ScanReport` equals `scan_paths`' on the same input."""
    order, walk_findings = plan(paths, recursive)
    previous = load_resume(resume) if resume else {}
    done: dict[str, dict[str, Any]] = {}
    items = []
    for path, explicit in order:
        ident = identity(path) if resume else None
        if ident is not None and _unchanged(previous.get(path), ident):
            done[path] = previous[path]
        else:
            items.append((path, explicit, ident))
    out = None
    if jsonl == "-":
        out = sys.stdout
    elif jsonl:
        out = open(jsonl, "a" if jsonl == resume else "w", encoding="utf-8")
    try:
        if dask:
            results = _run_dask(items, dask, limits)
        elif jobs > 1 and len(items) > 1:
            results = _run_processes(items, jobs, limits)
        else:
            results = (scan_record(p, e, limits, i) for p, e, i in items)
        for rec in results:
            done[rec["path"]] = rec
            if out is not None:
                out.write(json.dumps(rec) + "\n")  # ASCII: no raw bidi controls
                out.flush()
            if on_record is not None:
                on_record(rec)
    finally:
        if out is not None and out is not sys.stdout:
            out.close()
    report = ScanReport()
    findings = list(walk_findings)
    ran = {p for p, _, _ in items}
    for path, _ in order:
        rec = done[path]
        if rec.get("scanned"):
            report.files.append(path)
        report.errors += int(bool(rec.get("error")))
        findings.extend(record_findings(rec))
    report.findings = _sorted(_dedupe(findings))
    if dask or (jobs > 1 and len(items) > 1):
        # the workers' counters are not this process's: fold them in for --json and -v
        remote.add_totals(*(sum((done[p].get("fetched") or {}).get(k, 0) for p in ran)
                            for k in ("bytes", "requests", "objects")))
    return report
