"""Benchmark: model files behind URLs, and scanning fleets of files.

1. Remote listing. The ~2 GB torch zip and safetensors state dict and the ~1.9 GB ONNX model
   (`common.gen_state_dicts`, `common.gen_onnx`) are served by the tests' HTTP server
   (``tests/http_server.py``, Range support) on 127.0.0.1 with an added delay per request
   (``--delay``, default 20 ms, a real network's round trip). For each, ``tensorscope inspect
   --json`` and ``tensorscope scan --json`` run on the URL and on the local file: the listing and
   the verdict must be identical; bytes fetched (the ``fetched`` key, cross-checked with the
   server's own count), requests and wall time are reported.
2. Fleet throughput. A folder of ``--files`` small model files (torch zip, safetensors, ONNX,
   a few with a pickle payload) is scanned with ``--jobs 1``, ``--jobs 2`` and ``--dask local``
   (whole processes, median of ``--repeat``); files/s and identical verdicts are reported.

Every command is a whole child process (`common.measure`). The driver imports neither torch nor
numpy; inputs are generated once into ``benchmarks/.cache`` by a child.

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


def remote_listing(cases, delay: float, repeat: int) -> list[dict]:
    rows = []
    with Server(common.CACHE) as server:
        server.knobs.delay = delay
        for label, rel, with_folder in cases:
            local = str(common.CACHE / rel)
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
                            "bytes": fetched["bytes"], "requests": fetched["requests"],
                            "server_bytes": int(sent), "fraction": fetched["bytes"] / size}
            rows.append(row)
    return rows


CPU_SCRIPT = """
import json, os, sys, time
from tensorscope.scan import fleet
out = {}
for jobs in (1, 2):
    t, c0 = time.perf_counter(), os.times()
    recs = []
    fleet.scan_fleet([sys.argv[1]], jobs=jobs, on_record=recs.append)
    c1 = os.times()
    out[jobs] = {"wall_s": time.perf_counter() - t,
                 "cpu_s": (c1.user - c0.user + c1.system - c0.system + c1.children_user
                           - c0.children_user + c1.children_system - c0.children_system),
                 "cpu_per_file_ms": 1000 * sum(r["cpu_seconds"] for r in recs) / len(recs)}
print(json.dumps(out))
"""


REMOTE_FLEET_SCRIPT = """
import json, os, sys, time
from tensorscope import remote
from tensorscope.scan import fleet
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
    return json.loads(out)


def fleet_cpu(folder: Path) -> dict:
    """CPU seconds of --jobs 1 and --jobs 2 (main process + workers): on a machine shared with
    other users the wall-time ratio says how much CPU the scheduler gave us, this says how much
    work the fleet needed."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", CPU_SCRIPT, str(folder)], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def fleet(folder: Path, repeat: int) -> dict:
    out = {"files": sum(1 for p in folder.iterdir() if not p.name.startswith("."))}
    docs = {}
    for label, extra in (("jobs1", []), ("jobs2", ["--jobs", "2"]), ("dask_local", ["--dask", "local"])):
        r = common.measure(TS + ["scan", str(folder), "--json", *extra], repeat, capture=True,
                           ok_codes=(0, 1), warmup=label == "jobs1")
        if not r.ok:
            out[label] = {"error": r.error}
            continue
        docs[label] = _json(r.runs[-1])
        out[label] = {"wall_s": r.wall, "files_per_s": out["files"] / r.wall}
    base = docs.get("jobs1")
    for label, doc in docs.items():
        out[label]["identical"] = doc == base
    if "jobs2" in docs and "jobs1" in docs:
        out["speedup_jobs2"] = out["jobs1"]["wall_s"] / out["jobs2"]["wall_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny inputs (a smoke test of the script)")
    ap.add_argument("--delay", type=float, default=0.02, help="seconds added to every request")
    ap.add_argument("--files", type=int, default=1000, help="files in the fleet folder")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-remote", action="store_true")
    ap.add_argument("--skip-fleet", action="store_true")
    args = ap.parse_args(argv)
    cache = str(common.CACHE / "quick") if args.quick else str(common.CACHE)
    if args.quick:
        common.CACHE = Path(cache)
    files = 40 if args.quick else args.files
    fleet_dir = Path(cache) / f"fleet{files}x24"
    t0 = time.perf_counter()
    common.generate_in_child([("gen_state_dicts", (cache, args.quick)), ("gen_onnx", (cache, args.quick))])
    import subprocess
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "import bench_remote; bench_remote.gen_fleet(sys.argv[2], int(sys.argv[3]))",
                    str(HERE), str(fleet_dir), str(files)], check=True)
    print(f"inputs ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    result = {"machine": common.machine_info(), "delay_s": args.delay, "repeat": args.repeat}
    if not args.skip_remote:
        cases = [("torch zip", "diff/a.pt", False), ("safetensors", "diff/a.safetensors", False),
                 ("ONNX", "onnx/embedded.onnx", False),
                 ("ONNX external data", "onnx/external/model.onnx", True)]
        result["remote"] = remote_listing(cases, args.delay, args.repeat)
        print(f"{'case':20} {'size':>12} {'cmd':8} {'local s':>8} {'remote s':>9} {'fetched':>10} "
              f"{'%':>7} {'reqs':>5}  identical")
        for row in result["remote"]:
            for cmd in ("inspect", "scan"):
                r = row.get(cmd, {})
                if "error" in r:
                    print(f"{row['case']:20} {cmd}: {r['error']}")
                    continue
                print(f"{row['case']:20} {row['size']:>12} {cmd:8} {r['local_s']:>8.2f} "
                      f"{r['remote_s']:>9.2f} {r['bytes']:>10} {100 * r['fraction']:>6.3f}% "
                      f"{r['requests']:>5}  {r['identical']}")
    if not args.skip_fleet:
        result["fleet"] = f = fleet(fleet_dir, args.repeat)
        print(f"fleet of {f['files']} files:")
        for label in ("jobs1", "jobs2", "dask_local"):
            r = f.get(label, {})
            if "error" in r:
                print(f"  {label:11} {r['error']}")
            else:
                print(f"  {label:11} {r['wall_s']:7.2f} s  {r['files_per_s']:7.1f} files/s  "
                      f"identical verdicts: {r['identical']}")
        if "speedup_jobs2" in f:
            print(f"  --jobs 2 / --jobs 1 throughput: {f['speedup_jobs2']:.2f}x")
        f["remote"] = rf = remote_fleet(fleet_dir, args.delay, min(files, 300), 8)
        print(f"  {rf['files']} files as URLs (delay {args.delay * 1000:.0f} ms), --jobs 8: "
              f"{rf['files'] / rf['wall_s']:.1f} files/s, {1000 * rf['cpu_s'] / rf['files']:.1f} "
              f"CPU ms, {rf['bytes_per_file'] / 1024:.1f} KiB in {rf['requests_per_file']:.1f} "
              f"requests per file of {rf['file_bytes'] / 1024:.0f} KiB")
        f["cpu"] = cpu = fleet_cpu(fleet_dir)
        for jobs, c in cpu.items():
            print(f"  jobs {jobs}: {c['wall_s']:.2f} s wall, {c['cpu_s']:.2f} CPU s in all, "
                  f"{c['cpu_per_file_ms']:.2f} CPU ms per file")
    out = Path(cache) / "bench_remote.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
