"""Benchmark: model files behind URLs, and scanning fleets of files.

1. Remote listing. The ~2 GB torch zip and safetensors state dict and the ~1.9 GB ONNX model
   (`common.gen_state_dicts`, `common.gen_onnx`) are served by the tests' HTTP server
   (``tests/http_server.py``, Range support) on 127.0.0.1 with an added delay per request
   (``--delay``, default 20 ms, a real network's round trip). For each, ``tensorscope inspect
   --json`` and ``tensorscope scan --json`` run on the URL and on the local file: the listing and
   the verdict must be identical; bytes fetched (the ``fetched`` key, cross-checked with the
   server's own count), requests and wall time are reported.
2. Fleet throughput. A folder of ``--files`` small model files (torch zip, safetensors, ONNX,
   a few with a pickle payload) is scanned by whole ``tensorscope scan --json`` processes with
   ``--jobs 1``, ``--jobs 2`` and ``--dask local`` in turn (one warm-up round, then the median of
   ``--repeat``; wall, CPU of the process and its workers, identical verdicts); then inside one
   process with the imports paid (`throughput`: files/s while scanning, CPU of the parent and
   of the workers); then 300 of the files as URLs from the delayed server (files/s, CPU, bytes
   and requests per file: the figures of the README's hub estimate).

Every command is a child process (`common.run_once`). The driver imports neither torch nor
numpy; inputs are generated once into ``benchmarks/.cache`` by a child. `run.py` runs the two
parts as its ``remote`` and ``fleet`` cases (`run_remote`, `run_fleet`, `render`).

Run: ``python benchmarks/bench_remote.py [--quick] [--delay 0.02] [--files 1000] [--repeat 3]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import common  # noqa: E402
from http_server import Server  # noqa: E402

TS = [sys.executable, "-m", "tensorscope"]


def gen_fleet(folder: str, n: int) -> None:
    """``n`` small model files: 45% torch zip, 45% safetensors, 9% ONNX, 1% with a payload."""
    import onnx
    import torch
    from onnx import helper, numpy_helper
    from safetensors.torch import save_file

    root = Path(folder)
    if (root / ".done").exists() and len(list(root.iterdir())) == n + 1:
        return
    root.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(HERE.parent / "tests"))
    import make_attack_corpus
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        # a tiny transformer: 4 layers of 6 tensors, as small fine-tunes and adapters are
        sd = {f"model.layers.{j}.{part}": torch.randn(64, 64, generator=g)
              for j in range(4) for part in ("q.weight", "k.weight", "v.weight", "o.weight",
                                              "up.weight", "down.weight")}
        kind = i % 100
        if kind == 99:
            data = make_attack_corpus.torch_zip_with_payload(
                make_attack_corpus.payload("os", "system", 2, "global-reduce"))
            (root / f"m{i:05d}.pt").write_bytes(data)
        elif kind < 45:
            torch.save(sd, root / f"m{i:05d}.pt")
        elif kind < 90:
            save_file(sd, str(root / f"m{i:05d}.safetensors"))
        else:
            inits = [numpy_helper.from_array(v.numpy(), k) for k, v in sd.items()]
            graph = helper.make_graph([], "g", [], [], initializer=inits)
            onnx.save(helper.make_model(graph), str(root / f"m{i:05d}.onnx"))
    (root / ".done").write_text("")


def _json(sample) -> dict:
    return json.loads(sample.out)


def _listing(doc: dict) -> list:
    return [(t["name"], t["dtype"], t["shape"], t.get("byte_offset"), t.get("nbytes"))
            for t in doc["tensors"]]


def _verdict(doc: dict, path: str) -> list:
    return [(f["severity"], f["rule"], f["member"], f["offset"], f["trigger"],
             f["message"].replace(path, "<file>")) for f in doc["findings"]]


def remote_listing(cache: str, cases, delay: float, repeat: int) -> list[dict]:
    rows = []
    with Server(cache) as server:
        server.knobs.delay = delay
        for label, rel, with_folder in cases:
            local = str(Path(cache) / rel)
            url = server.url(rel)
            folder = os.path.dirname(local)   # external data: the model is its whole folder
            size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)) \
                if with_folder else os.path.getsize(local)
            row = {"case": label, "size": size}
            for cmd in ("inspect", "scan"):
                ok = (0, 1)
                loc = common.measure(TS + [cmd, local, "--json"], repeat, capture=True, ok_codes=ok)
                before = server.knobs.bytes_sent, server.knobs.requests
                far = common.measure(TS + [cmd, url, "--json"], repeat, capture=True, ok_codes=ok,
                                     warmup=False)
                if not (loc.ok and far.ok):
                    row[cmd] = {"error": loc.error or far.error}
                    continue
                dl, dr = _json(loc.runs[-1]), _json(far.runs[-1])
                same = (_listing(dl) == _listing(dr)) if cmd == "inspect" else \
                    (_verdict(dl, local) == _verdict(dr, url))
                fetched = dr["fetched"]
                sent = (server.knobs.bytes_sent - before[0]) / repeat
                row[cmd] = {"local_s": loc.wall, "remote_s": far.wall, "identical": same,
                            "remote_cpu_s": far.cpu,
                            "bytes": fetched["bytes"], "requests": fetched["requests"],
                            "server_bytes": int(sent), "fraction": fetched["bytes"] / size}
            rows.append(row)
    return rows


THROUGHPUT_SCRIPT = """
import json, resource, sys, time
from tensorscope.scanning import fleet, scan_paths
folder, rounds = sys.argv[1], int(sys.argv[2])
fleet._preload()      # the imports are paid before the clocks start, on both sides
scan_paths(folder)    # page cache and first calls warm
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime
out = {"1": [], "2": []}
for _ in range(rounds):
    for jobs in (1, 2):   # alternately: both see the same load
        t, (p0, c0) = time.perf_counter(), cpu()
        r = scan_paths(folder) if jobs == 1 else fleet.scan_fleet([folder], jobs=2)
        wall = time.perf_counter() - t
        p1, c1 = cpu()
        out[str(jobs)].append({"wall_s": wall, "parent_cpu_s": p1 - p0,
                               "workers_cpu_s": c1 - c0, "files": len(r.files)})
print(json.dumps(out))
"""


REMOTE_FLEET_SCRIPT = """
import json, os, sys, time
from tensorscope import remote
from tensorscope.scanning import fleet
urls = sys.argv[2:]
t, c0 = time.perf_counter(), os.times()
recs = []
fleet.scan_fleet(urls, jobs=int(sys.argv[1]), on_record=recs.append)
c1 = os.times()
print(json.dumps({"files": len(recs), "wall_s": time.perf_counter() - t,
                  "cpu_s": (c1.user - c0.user + c1.system - c0.system + c1.children_user
                            - c0.children_user + c1.children_system - c0.children_system),
                  "bytes_per_file": sum(r["fetched"]["bytes"] for r in recs) / len(recs),
                  "requests_per_file": sum(r["fetched"]["requests"] for r in recs) / len(recs),
                  "file_bytes": sum(r["size"] for r in recs) / len(recs)}))
"""


def remote_fleet(folder: Path, delay: float, n: int, jobs: int) -> dict:
    """``n`` files of the fleet scanned as URLs from the delayed server on ``jobs`` processes:
    files/s, CPU, bytes and requests per file (the figures of the hub estimate)."""
    import subprocess
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))[:n]
    with Server(folder) as server:
        server.knobs.delay = delay
        out = subprocess.run([sys.executable, "-c", REMOTE_FLEET_SCRIPT, str(jobs),
                              *[server.url(name) for name in names]],
                             capture_output=True, text=True, check=True).stdout
    return {**json.loads(out), "jobs": jobs, "delay_s": delay}


def throughput(folder: Path, rounds: int) -> dict:
    """Scanning throughput inside one process, imports paid and page cache warm, `scan_paths`
    (what ``--jobs 1`` runs) and ``--jobs 2`` alternately: files/s while scanning, and the CPU
    of the parent and of the workers (how much work the fleet adds, whatever the load)."""
    import statistics
    import subprocess
    out = json.loads(subprocess.run([sys.executable, "-c", THROUGHPUT_SCRIPT, str(folder),
                                     str(rounds)], capture_output=True, text=True,
                                    check=True).stdout)
    res = {}
    for jobs, runs in out.items():
        res[jobs] = {k: statistics.median(r[k] for r in runs)
                     for k in ("wall_s", "parent_cpu_s", "workers_cpu_s")}
        res[jobs]["files"] = runs[0]["files"]
        res[jobs]["files_per_s"] = runs[0]["files"] / res[jobs]["wall_s"]
        res[jobs]["walls"] = [r["wall_s"] for r in runs]
    res["speedup"] = res["1"]["wall_s"] / res["2"]["wall_s"]
    # the least disturbed run of each: on a shared machine the other users only ever add time
    res["speedup_best"] = min(res["1"]["walls"]) / min(res["2"]["walls"])
    return res


FLEET_RUNS = (("jobs1", []), ("jobs2", ["--jobs", "2"]), ("dask_local", ["--dask", "local"]))


def fleet(folder: Path, repeat: int) -> dict:
    """``tensorscope scan FOLDER --json`` as whole processes at ``--jobs 1``, ``--jobs 2`` and
    ``--dask local``, run in turn (one warm-up round, then ``repeat`` rounds: each side sees the
    same load); median wall and CPU (the process and its workers), and identical verdicts."""
    import statistics
    out = {"files": sum(1 for p in folder.iterdir() if not p.name.startswith("."))}
    samples: dict[str, list] = {label: [] for label, _ in FLEET_RUNS}
    docs = {}
    for i in range(repeat + 1):
        for label, extra in FLEET_RUNS:
            if label in out:
                continue   # failed before
            s = common.run_once(TS + ["scan", str(folder), "--json", *extra], capture=True)
            if s.code not in (0, 1):
                out[label] = {"error": (s.err.strip().splitlines() or [""])[-1][:200]}
                continue
            docs[label] = _json(s)
            if i:
                samples[label].append(s)
    base = docs.get("jobs1")
    for label, runs in samples.items():
        if not runs:
            continue
        wall = statistics.median(s.wall for s in runs)
        out[label] = {"wall_s": wall, "cpu_s": statistics.median(s.cpu for s in runs),
                      "walls": [s.wall for s in runs], "files_per_s": out["files"] / wall,
                      "identical": docs[label] == base}
    if "wall_s" in out.get("jobs2", {}) and "wall_s" in out.get("jobs1", {}):
        out["speedup_jobs2"] = out["jobs1"]["wall_s"] / out["jobs2"]["wall_s"]
        out["speedup_jobs2_best"] = min(out["jobs1"]["walls"]) / min(out["jobs2"]["walls"])
    return out


CASES = [("torch zip", "diff/a.pt", False), ("safetensors", "diff/a.safetensors", False),
         ("ONNX, embedded", "onnx/embedded.onnx", False),
         ("ONNX, external data", "onnx/external/model.onnx", True)]


def prepare(cache: str, quick: bool, files: int, remote: bool = True) -> Path:
    """Generate the inputs once (children: the driver imports neither torch nor numpy); the
    fleet folder's path."""
    import subprocess
    if remote:
        common.generate_in_child([("gen_state_dicts", (cache, quick)), ("gen_onnx", (cache, quick))])
    folder = Path(cache) / f"fleet{files}x24"
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "import bench_remote; bench_remote.gen_fleet(sys.argv[2], int(sys.argv[3]))",
                    str(HERE), str(folder), str(files)], check=True)
    return folder


def run_fleet(folder: Path, repeat: int, delay: float, remote_files: int | None = 300,
              remote_jobs: int = 8, log=print) -> dict:
    """Every fleet measurement: whole commands, in-process throughput, URLs from the server."""
    f = fleet(folder, repeat)
    log(f"fleet of {f['files']} files, whole `tensorscope scan --json` processes:")
    for label, _ in FLEET_RUNS:
        r = f.get(label, {})
        log(f"  {label:11} {r['error']}" if "error" in r else
            f"  {label:11} {r['wall_s']:6.2f} s {r['files_per_s']:7.1f} files/s "
            f"{r['cpu_s']:5.2f} CPU s  identical verdicts: {r['identical']}")
    if "speedup_jobs2" in f:
        log(f"  --jobs 2 / --jobs 1: {f['speedup_jobs2']:.2f}x (medians), "
            f"{f['speedup_jobs2_best']:.2f}x (fastest runs)")
    f["throughput"] = t = throughput(folder, max(repeat, 3))
    log(f"  scanning throughput (in one process, imports paid): --jobs 1 "
        f"{t['1']['files_per_s']:.0f} files/s, --jobs 2 {t['2']['files_per_s']:.0f} files/s: "
        f"{t['speedup']:.2f}x (fastest runs {t['speedup_best']:.2f}x); CPU s jobs 1 {t['1']['parent_cpu_s']:.2f}, jobs 2 parent "
        f"{t['2']['parent_cpu_s']:.2f} + workers {t['2']['workers_cpu_s']:.2f}")
    if not remote_files:
        return f
    n = min(f["files"], remote_files)
    f["remote"] = rf = remote_fleet(folder, delay, n, remote_jobs)
    log(f"  {rf['files']} files as URLs (delay {delay * 1000:.0f} ms), --jobs {remote_jobs}: "
        f"{rf['files'] / rf['wall_s']:.1f} files/s, {1000 * rf['cpu_s'] / rf['files']:.1f} CPU ms, "
        f"{rf['bytes_per_file'] / 1024:.1f} KiB in {rf['requests_per_file']:.1f} requests per "
        f"file of {rf['file_bytes'] / 1024:.0f} KiB")
    return f


def run_remote(cache: str, delay: float, repeat: int, log=print) -> list[dict]:
    rows = remote_listing(cache, CASES, delay, repeat)
    log(f"{'case':20} {'size':>12} {'cmd':8} {'local s':>8} {'remote s':>9} {'fetched':>10} "
        f"{'%':>7} {'reqs':>5}  identical")
    for row in rows:
        for cmd in ("inspect", "scan"):
            r = row.get(cmd, {})
            if "error" in r:
                log(f"{row['case']:20} {cmd}: {r['error']}")
                continue
            log(f"{row['case']:20} {row['size']:>12} {cmd:8} {r['local_s']:>8.2f} "
                f"{r['remote_s']:>9.2f} {r['bytes']:>10} {100 * r['fraction']:>6.3f}% "
                f"{r['requests']:>5}  {r['identical']}")
    return rows


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{n:.0f} B"


def render(result: dict) -> str:
    """The "Remote models and scan fleets" section of BENCHMARKS.md."""
    lines = ["## Remote models over HTTP and scan fleets", "",
             "Made by `python benchmarks/run.py --only remote fleet` (or `python "
             "benchmarks/bench_remote.py`). Remote: the tests' HTTP server "
             "(`tests/http_server.py`: Range, keep-alive) on 127.0.0.1 with "
             f"**{result.get('delay_s', 0) * 1000:.0f} ms added to every request** (a network round "
             "trip); whole processes, median of "
             f"{result.get('repeat', '?')} runs; the listing (`inspect`) and the verdict (`scan`) "
             "must equal the local file's. Bytes and requests are the `fetched` figures of "
             "`--json` (the server's own count agrees).", ""]
    rows = result.get("remote")
    if rows:
        lines += ["| model | command | local | over HTTP | fetched | of the model | requests | "
                  "listing / verdict |", "|---|---|---:|---:|---:|---:|---:|---|"]
        for row in rows:
            for cmd in ("inspect", "scan"):
                r = row.get(cmd, {})
                if "error" in r:
                    lines.append(f"| {row['case']}, {_size(row['size'])} | {cmd} | {r['error']} "
                                 "| | | | | |")
                    continue
                lines.append(f"| {row['case']}, {_size(row['size'])} | {cmd} | "
                             f"{r['local_s']:.2f} s | {r['remote_s']:.2f} s | {_size(r['bytes'])} | "
                             f"{100 * r['fraction']:.3f}% | {r['requests']} | "
                             f"{'identical' if r['identical'] else 'DIFFERENT'} |")
        lines.append("")
    f = result.get("fleet")
    if f:
        lines += [f"Fleet: {f['files']:,} small model files (4 layers x 6 float32 [64, 64] tensors; "
                  "45% torch zip, 45% safetensors, 9% ONNX, 1% with a pickle payload). Whole "
                  "`tensorscope scan FOLDER --json` processes (interpreter start and imports "
                  "included), the three runs in turn, one warm-up round then the median of "
                  f"{len(f.get('jobs1', {}).get('walls', ())) or '?'}; CPU is the process and "
                  "its workers:", "",
                  "| run | wall | files/s | CPU | runs | verdicts |", "|---|---:|---:|---:|---|---|"]
        for label, text in (("jobs1", "`--jobs 1`"), ("jobs2", "`--jobs 2`"),
                            ("dask_local", "`--dask local` (cluster start included)")):
            r = f.get(label, {})
            if "error" in r or not r:
                lines.append(f"| {text} | {r.get('error', 'not run')} | | | | |")
                continue
            lines.append(f"| {text} | {r['wall_s']:.2f} s | {r['files_per_s']:.0f} | "
                         f"{r['cpu_s']:.2f} s | {', '.join(f'{w:.2f}' for w in r['walls'])} | "
                         + ("(reference)" if label == "jobs1" else
                            "identical" if r["identical"] else "DIFFERENT") + " |")
        if "speedup_jobs2" in f:
            lines += ["", f"Whole command, `--jobs 2` / `--jobs 1`: **{f['speedup_jobs2']:.2f}x** "
                      f"(medians; fastest runs {f['speedup_jobs2_best']:.2f}x)."]
        t = f.get("throughput")
        if t:
            lines += ["", "Scanning throughput (one process, imports already paid, page cache warm; "
                      "`scan_paths` as `--jobs 1` runs it and `scan_fleet(jobs=2)` alternately, "
                      f"median of {len(t['1']['walls'])}):", "",
                      "| run | wall | files/s | CPU: parent | CPU: workers |",
                      "|---|---:|---:|---:|---:|",
                      f"| `--jobs 1` | {t['1']['wall_s']:.3f} s | {t['1']['files_per_s']:.0f} | "
                      f"{t['1']['parent_cpu_s']:.2f} s | - |",
                      f"| `--jobs 2` | {t['2']['wall_s']:.3f} s | {t['2']['files_per_s']:.0f} | "
                      f"{t['2']['parent_cpu_s']:.2f} s | {t['2']['workers_cpu_s']:.2f} s |", "",
                      f"Scanning throughput, `--jobs 2` / `--jobs 1`: **{t['speedup']:.2f}x** "
                      f"(medians; fastest runs {t['speedup_best']:.2f}x). CPU added by the fleet: "
                      f"{(t['2']['parent_cpu_s'] + t['2']['workers_cpu_s']) / t['1']['parent_cpu_s'] - 1:+.0%}."]
        rf = f.get("remote")
        if rf:
            lines += ["", f"{rf['files']} of the fleet's files as URLs from the server "
                      f"({rf['delay_s'] * 1000:.0f} ms per request), `scan_fleet(jobs="
                      f"{rf['jobs']})`: {rf['files'] / rf['wall_s']:.1f} files/s, "
                      f"{1000 * rf['cpu_s'] / rf['files']:.1f} CPU ms, "
                      f"{rf['bytes_per_file'] / 1024:.1f} KiB fetched in "
                      f"{rf['requests_per_file']:.1f} requests per file of "
                      f"{rf['file_bytes'] / 1024:.0f} KiB."]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny inputs (a smoke test of the script)")
    ap.add_argument("--delay", type=float, default=0.02, help="seconds added to every request")
    ap.add_argument("--files", type=int, default=1000, help="files in the fleet folder")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-remote", action="store_true")
    ap.add_argument("--skip-fleet", action="store_true")
    ap.add_argument("--fleet-only-local", action="store_true",
                    help="fleet: leave out the URLs from the delayed server")
    args = ap.parse_args(argv)
    cache = str(common.CACHE / "quick") if args.quick else str(common.CACHE)
    if args.quick:
        common.CACHE = Path(cache)
    files = 40 if args.quick else args.files
    from run import _compile_package
    _compile_package()   # as run.py does: no process recompiles the package (PYTHONDONTWRITEBYTECODE)
    t0 = time.perf_counter()
    folder = prepare(cache, args.quick, files, remote=not args.skip_remote)
    print(f"inputs ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    result = {"machine": common.machine_info(), "delay_s": args.delay, "repeat": args.repeat,
              "load": [os.getloadavg()[0]]}
    if not args.skip_remote:
        result["remote"] = run_remote(cache, args.delay, args.repeat)
    if not args.skip_fleet:
        result["fleet"] = run_fleet(folder, args.repeat, args.delay,
                                    remote_files=0 if args.fleet_only_local else
                                    40 if args.quick else 300)
    result["load"].append(os.getloadavg()[0])
    out = Path(cache) / "bench_remote.json"
    out.write_text(json.dumps(result, indent=1))
    print(render(result))
    print(f"results: {out}; load average {result['load'][0]:.1f} / {result['load'][1]:.1f}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
