"""Scanning fleets of files: one pure, picklable function per file, fanned out by engines we do
not write (a process pool, a Dask cluster), with results streamed as JSON lines.

`scan_record` is the unit of work: it takes a path (or URL) and plain arguments, reads the file,
and returns a JSON-ready dict; it touches no shared state, so it maps onto any engine as is
(``client.map(scan_record, paths)`` on Dask, ``ray.remote(scan_record)``, a Spark ``map``).
`scan_fleet` plans the files exactly as `scan_paths` does (`walk.plan`: same walk, same
de-duplication, ONNX models first), runs the records on ``jobs`` processes or a Dask cluster,
writes each record as it finishes, and folds them into the same `ScanReport` (`report.merge`):
the verdicts are those of a sequential scan. Work goes out in batches of files (a task per file
would cost as much in round trips to the workers as a small file costs to scan), and the
processes start with the parsers already imported (`_run_processes`), so that N workers do the
CPU work of one sequential scan.

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

from .. import remote
from ..errors import TensorscopeError
from .context import DEFAULT_SCAN_LIMITS, ScanLimits
from .identity import identity
from .loader import scan_file
from .report import FileReport, Finding, ScanReport, merge, sort_findings
from .walk import plan

__all__ = ["identity", "scan_record", "scan_fleet", "load_resume", "file_report"]


def scan_record(path: str, explicit: bool = True, limits: ScanLimits | None = None,
                ident: dict | None = None, inventory: bool = False) -> dict[str, Any]:
    """Scan one file; the JSON-ready record (see the module doc). Pure and picklable.
    ``inventory``: also describe the file for an SBOM (``"inventory"``: `sbom.inventory_of`),
    from the same parse, on the same worker."""
    start, cpu = time.perf_counter(), time.process_time()
    before = remote.totals()
    url = remote.is_url(path)
    if ident is None and not url:
        ident = identity(path)
    inv = None
    if inventory:
        from .sbom import scan_with_inventory
        r, inv = scan_with_inventory(path, limits=limits or DEFAULT_SCAN_LIMITS, explicit=explicit)
    else:
        r = scan_file(path, limits=limits or DEFAULT_SCAN_LIMITS, explicit=explicit)
    if ident is None:  # a URL: the version the scan itself read, no extra request
        got = remote.seen(path) or {"size": None, "version": None}
        ident = {"size": got["size"], "version": got["version"], "mtime_ns": None}
    after = remote.totals()
    worst = r.severity
    return {"path": path, **ident, "scanned": r.scanned, "error": r.error,
            "severity": str(worst) if worst is not None else None,
            "findings": [f.to_dict() for f in sort_findings(r.findings)],
            "fetched": {k: after[k] - before[k] for k in ("bytes", "requests", "objects")},
            "seconds": round(time.perf_counter() - start, 6),
            "cpu_seconds": round(time.process_time() - cpu, 6),
            **({"inventory": inv} if inventory else {})}


def file_report(rec: dict[str, Any]) -> FileReport:
    """The `FileReport` a record was made from."""
    return FileReport(rec["path"], [Finding.from_dict(f) for f in rec.get("findings", ())],
                      bool(rec.get("scanned")), bool(rec.get("error")))


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


# What scanning imports on first use (numpy, the parsers): imported before the workers start,
# so that each inherits them (fork) or gets them from the server's copy (forkserver) instead of
# paying ~0.2 s of CPU each for imports a sequential scan pays once. Every format parser, and
# the modules the scanner reaches into directly; `scan.fleet` itself for a forkserver's workers,
# which unpickle `_scan_batch` from it.
_SCANNER_MODULES = ("zipfmt", "torch_zip", "torch_pickle", "pickle_vm", "joblib_arrays",
                    "compression")


def _preload_names() -> list[str]:
    from ..formats import DIR_PARSERS, FILE_PARSERS
    names = dict.fromkeys([*FILE_PARSERS, *DIR_PARSERS, *_SCANNER_MODULES])
    return ["numpy", *(f"tensorscope.parsers.{n}" for n in names), "tensorscope.scanning.fleet"]


def _preload() -> None:
    import importlib
    for name in _preload_names():
        try:
            importlib.import_module(name)
        except ImportError:  # an optional part missing here is missing in a sequential scan too
            pass


def _run_processes(items, jobs: int, limits,
                   inventory: bool = False) -> Iterator[list[dict[str, Any]]]:
    import gc
    import multiprocessing
    import threading
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    methods = multiprocessing.get_all_start_methods()
    # fork starts workers with everything imported, and is safe while this process has no other
    # thread; otherwise forkserver/spawn: a clean interpreter, not a copy of one whose threads
    # (fetch pools, progress bars) may hold locks.
    froze = False
    if "fork" in methods and threading.active_count() == 1:
        method = "fork"
        _preload()
        # the objects alive now are shared with the workers: kept out of their collections so
        # that a collection does not touch (and so copy) every shared page. Only when the host
        # has frozen nothing itself: unfreezing afterwards would thaw the host's objects too.
        if gc.get_freeze_count() == 0:
            gc.freeze()
            froze = True
    else:
        method = "forkserver" if "forkserver" in methods else "spawn"
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_preload_names())
    batches = _batches(items, jobs)
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        # at most two batches per worker in flight: results stream back as batches finish, and
        # the queue never holds the whole plan
        todo = iter(batches)
        try:
            running = {pool.submit(_scan_batch, batch, limits, inventory) for batch in
                       (b for _, b in zip(range(2 * jobs), todo))}
        finally:
            if froze:
                gc.unfreeze()  # the workers exist (forked at the first submit): as we found it
        while running:
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                nxt = next(todo, None)
                if nxt is not None:
                    running.add(pool.submit(_scan_batch, nxt, limits, inventory))
                yield fut.result()


def _batches(items: list, workers: int) -> list[list]:
    """Chunks of the plan, one task each: a task costs a round trip to a worker and a small
    file ~1 ms of scanning, so a task holds many files; small enough (~1/32 of a worker's
    share, at most 64 files) that the workers' last tasks end within a few ms of each other."""
    size = max(1, min(64, len(items) // (workers * 32)))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _scan_batch(batch, limits, inventory: bool = False) -> list[dict[str, Any]]:
    return [scan_record(path, explicit, limits, ident, inventory)
            for path, explicit, ident in batch]


def _run_dask(items, address: str, limits,
              inventory: bool = False) -> Iterator[list[dict[str, Any]]]:
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
        futures = client.map(_scan_batch, _batches(items, workers), limits=limits,
                             inventory=inventory, pure=False)
        for fut in as_completed(futures):
            yield fut.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def scan_fleet(paths: Iterable[str | os.PathLike], *, recursive: bool = True, jobs: int = 1,
               dask: str | None = None, jsonl: str | None = None, resume: str | None = None,
               limits: ScanLimits | None = None,
               on_record: Callable[[dict[str, Any]], None] | None = None,
               inventory: bool = False) -> ScanReport:
    """Scan files and folders on ``jobs`` processes (or the Dask cluster at ``dask``, ``"local"``
    for a LocalCluster), writing a JSON line per file to ``jsonl`` (``"-"``: stdout) as each
    finishes; the `ScanReport` equals `scan_paths`' on the same input. ``inventory``: each
    record also describes its file for an SBOM (`scan_record`)."""
    order, walk_findings = plan(*paths, recursive=recursive)
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
            batches = _run_dask(items, dask, limits, inventory)
        elif jobs > 1 and len(items) > 1:
            batches = _run_processes(items, jobs, limits, inventory)
        else:
            batches = ([scan_record(p, e, limits, i, inventory)] for p, e, i in items)
        for rec in (rec for batch in batches for rec in batch):
            done[rec["path"]] = rec
            if out is not None:
                out.write(json.dumps(rec) + "\n")  # ASCII: no raw bidi controls
                out.flush()
            if on_record is not None:
                on_record(rec)
    finally:
        if out is not None and out is not sys.stdout:
            out.close()
    # as scan_paths merges: the walk's findings first, then each file in plan order
    report = merge([FileReport(f.file, [f], False, f.rule == "file.unreadable")
                    for f in walk_findings] + [file_report(done[path]) for path, _ in order])
    ran = {p for p, _, _ in items}
    report.resumed = len(order) - len(ran)   # vouched for by the --resume report
    if dask or (jobs > 1 and len(items) > 1):
        # the workers' counters are not this process's: fold them in for --json and -v
        remote.add_totals(*(sum((done[p].get("fetched") or {}).get(k, 0) for p in ran)
                            for k in ("bytes", "requests", "objects")))
    return report
