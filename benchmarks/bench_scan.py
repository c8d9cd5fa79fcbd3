"""Benchmark: `tensorscope scan` against picklescan and modelscan, speed and detection.

Generates (once, into ``benchmarks/.cache/``, gitignored):
- a ~2 GB torch.save checkpoint (fp16 tensors),
- a folder of a few hundred small torch.save files,
- a torch.save checkpoint of ~100,000 tiny tensors (per-record cost; ``--tensors``),
- the attack corpus of ``tests/make_attack_corpus.py``.

Times each scanner as a subprocess (wall time, best of R: each pays its own interpreter start;
tensorscope is also timed in-process, without the start-up), then runs the peers over the attack
corpus and lists the files each one misses (no finding at its "dangerous" level) while tensorscope
reports them at or above the case's expected severity.

The peers are looked up on PATH or in ``benchmarks/.cache/peers/bin`` (a separate venv made with
``python -m venv benchmarks/.cache/peers && benchmarks/.cache/peers/bin/pip install picklescan
modelscan``: they are not project dependencies).

Run: ``python benchmarks/bench_scan.py [--size-gb 2] [--files 300] [--repeat 3] [--skip-detection]``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
ROOT = HERE.parent


def _tool(name: str) -> str | None:
    local = CACHE / "peers" / "bin" / name
    if local.exists():
        return str(local)
    return shutil.which(name)


def make_big(size_gb: float) -> Path:
    path = CACHE / f"big_{size_gb:g}gb.pt"
    if path.exists():
        return path
    import torch
    n = 480
    per = int(size_gb * (1 << 30) / n / 2)
    sd = {f"model.layers.{i // 8}.mlp.w{i % 8}.weight": torch.empty(per, dtype=torch.float16).fill_(i % 7)
          for i in range(n)}
    torch.save(sd, path)
    return path


def make_folder(n_files: int) -> Path:
    folder = CACHE / f"small_{n_files}"
    if folder.exists() and len(list(folder.iterdir())) == n_files:
        return folder
    import torch
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        torch.save({f"layer{j}.weight": torch.randn(8, 8) for j in range(6)}, folder / f"ckpt_{i:04d}.pt")
    return folder


def make_many(n_tensors: int) -> Path:
    """A torch.save checkpoint of ~n small tensors named like a mixture of experts
    (``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``, bf16 [4, 4]): per-record cost."""
    experts = 834
    layers = max(1, round(n_tensors / (3 * experts)))
    path = CACHE / f"many_{layers * experts * 3}.pt"
    if path.exists():
        return path
    import torch
    sd = {f"model.layers.{L}.mlp.experts.{E}.{p}_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16)
          for L in range(layers) for E in range(experts) for p in ("gate", "up", "down")}
    torch.save(sd, path)
    return path


def make_corpus() -> tuple[Path, list]:
    sys.path.insert(0, str(ROOT / "tests"))
    import make_attack_corpus
    out = CACHE / "corpus"
    if out.exists():
        shutil.rmtree(out)
    return out, make_attack_corpus.build(out)


def timed(cmd: list[str], repeat: int) -> tuple[float, int]:
    best = float("inf")
    rc = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t0)
        rc = p.returncode
    return best, rc


def in_process(path: Path, repeat: int) -> float:
    from tensorscope.scanning import scan_paths
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        scan_paths(path)
        best = min(best, time.perf_counter() - t0)
    return best


def speed(args) -> None:
    big = make_big(args.size_gb)
    folder = make_folder(args.files)
    many = make_many(args.tensors)
    ts = [sys.executable, "-m", "tensorscope", "scan", "--json"]
    rows = []
    for label, target in ((f"{big.stat().st_size / (1 << 30):.2f} GB checkpoint", big),
                          (f"folder of {args.files} small files", folder),
                          (f"torch zip of {args.tensors} tensors", many)):
        row = {"case": label, "tensorscope (in-process)": in_process(target, args.repeat),
               "tensorscope (CLI)": timed(ts + [str(target)], args.repeat)[0]}
        ps, ms = _tool("picklescan"), _tool("modelscan")
        if ps:
            row["picklescan"] = timed([ps, "-p", str(target)], args.repeat)[0]
        if ms:
            row["modelscan"] = timed([ms, "-p", str(target)], args.repeat)[0]
        rows.append(row)
    cols = list(dict.fromkeys(k for r in rows for k in r if k != "case"))
    print("| case | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in rows:
        print(f"| {r['case']} | " + " | ".join(f"{r[c]:.2f} s" if c in r else "-" for c in cols) + " |")


def _picklescan_flagged(out: str, corpus: Path) -> set[str]:
    flagged = set()
    for line in out.splitlines():
        m = re.match(r"^(.*?): dangerous import", line)
        if m:
            path = m.group(1).split(":")[0]
            flagged.add(os.path.relpath(path, corpus))
    return flagged


def _modelscan_flagged(report: dict, corpus: Path) -> set[str]:
    flagged = set()
    for issue in report.get("issues", []):
        src = issue.get("source", "")
        src = src.split(":")[0]
        if issue.get("severity", "").upper() in ("CRITICAL", "HIGH", "MEDIUM"):
            flagged.add(os.path.relpath(os.path.join(corpus, src) if not os.path.isabs(src) else src, corpus))
    return flagged


def detection(args) -> None:
    from tensorscope.scanning import ScanLimits, Severity, scan_paths
    corpus, cases = make_corpus()
    # one case per file (the corpus has duplicate files with different expectations)
    ours = {}
    for c in cases:
        limits = ScanLimits(max_decompressed=1 << 20) if "bomb" in c.name else None
        r = scan_paths(c.path, limits=limits)
        want = Severity.parse(c.severity)
        hit = any(f.rule == c.rule and f.severity >= want and (c.trigger is None or f.trigger == c.trigger)
                  for f in r.findings)
        ours[c.name] = ours.get(c.name, True) and hit and r.exit_code() == 1
    results = {"tensorscope": {n for n, ok in ours.items() if ok}}
    ps, ms = _tool("picklescan"), _tool("modelscan")
    if ps:
        # file by file: on a folder, one file it cannot handle (a 7z without py7zr) aborts the
        # whole picklescan run
        from concurrent.futures import ThreadPoolExecutor

        def one(c):
            p = subprocess.run([ps, "-p", str(c.path)], capture_output=True, text=True)
            return _picklescan_flagged(p.stdout + p.stderr, corpus)
        with ThreadPoolExecutor(2) as pool:
            found = set().union(*pool.map(one, {c.name: c for c in cases}.values()))
        results["picklescan"] = found
    if ms:
        out = CACHE / "modelscan_report.json"
        subprocess.run([ms, "-p", str(corpus), "-r", "json", "-o", str(out)], capture_output=True, text=True)
        try:
            results["modelscan"] = _modelscan_flagged(json.loads(out.read_text()), corpus)
        except (OSError, ValueError):
            results["modelscan"] = set()
    names = sorted(ours)
    tools = list(results)
    print(f"\nDetection over {len(names)} attack files (caught = reported as dangerous):")
    print("| tool | caught | missed |")
    print("|---|---|---|")
    for t in tools:
        caught = sum(1 for n in names if n in results[t])
        print(f"| {t} | {caught} | {len(names) - caught} |")
    groups: dict[str, list[str]] = {}
    for n in names:
        if n.startswith("plain/"):
            continue
        groups[n] = [t for t in tools if n not in results[t]]
    print("\nNon-matrix attack files missed by a peer (the protocol/opcode matrix is summarised above):")
    print("| attack file | " + " | ".join(tools) + " |")
    print("|---|" + "---|" * len(tools))
    for n, missed in groups.items():
        if any(t != "tensorscope" for t in missed):
            print(f"| {n} | " + " | ".join("missed" if t in missed else "caught" for t in tools) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--tensors", type=int, default=100_000, help="tensors in the per-record case")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-detection", action="store_true")
    args = ap.parse_args()
    CACHE.mkdir(parents=True, exist_ok=True)
    if not args.skip_speed:
        speed(args)
    if not args.skip_detection:
        detection(args)


if __name__ == "__main__":
    main()
