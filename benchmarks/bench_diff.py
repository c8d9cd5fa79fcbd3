"""Benchmark `tensorscope diff` against the torch way of comparing two checkpoints.

    python benchmarks/bench_diff.py              # generate once into benchmarks/.cache/, then measure
    python benchmarks/bench_diff.py --runs 5 --formats safetensors

Inputs: two ~2 GB float16 state dicts of 500 tensors (480 of 1024x2048 and 20 of 2048) that differ
in 4 tensors (a slice moved by 1e-3), as ``.pt`` (torch.save) and ``.safetensors``, plus a byte copy
of A for the identical case, and (``.pt`` only) a C where every tensor differs. Generated once (needs torch and safetensors) and kept in
``benchmarks/.cache/`` (gitignored).

Each measurement is a whole process: wall time and peak RSS (``ru_maxrss`` of that child alone,
through ``os.wait4``), the median of ``--runs`` runs after one warm-up run that fills the page
cache. Peers:

- ``tensorscope diff A B --json`` (output to /dev/null);
- torch: ``torch.load(mmap=True, weights_only=True)`` of both files, then ``(a[k] - b[k]).abs().max()``
  for every key (safetensors: ``safe_open(framework="pt")`` and ``get_tensor`` per key).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache" / "diff"
N_BIG, BIG_SHAPE, N_SMALL, SMALL_SHAPE = 480, (1024, 2048), 20, (2048,)
PERTURBED = ("layer.7.weight", "layer.123.weight", "layer.300.weight", "bias.5")

TORCH_PT = """
import sys, torch
a = torch.load(sys.argv[1], mmap=True, weights_only=True)
b = torch.load(sys.argv[2], mmap=True, weights_only=True)
worst = max(float((a[k] - b[k]).abs().max()) for k in a)
print(worst)
"""

TORCH_ST = """
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], framework="pt") as fa, safe_open(sys.argv[2], framework="pt") as fb:
    worst = max(float((fa.get_tensor(k) - fb.get_tensor(k)).abs().max()) for k in fa.keys())
print(worst)
"""


def generate(cache: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    base = ("a.pt", "b.pt", "a_copy.pt", "a.safetensors", "b.safetensors", "a_copy.safetensors")
    missing_base = not all((cache / n).exists() for n in base)
    if not missing_base and (cache / "c.pt").exists():
        return
    # Imported only here: a child's ru_maxrss can include the parent's RSS at fork time, so the
    # measuring process stays small.
    import torch
    from safetensors.torch import save_file

    if missing_base:
        print(f"generating ~2 GB state dicts in {cache} (once) ...", file=sys.stderr)
        g = torch.Generator().manual_seed(0)
        a: dict = {}
        for i in range(N_BIG):
            a[f"layer.{i}.weight"] = torch.randn(BIG_SHAPE, generator=g, dtype=torch.float16)
        for i in range(N_SMALL):
            a[f"bias.{i}"] = torch.randn(SMALL_SHAPE, generator=g, dtype=torch.float16)
        torch.save(a, cache / "a.pt")
        save_file(a, str(cache / "a.safetensors"))
        for k in PERTURBED:
            t = a[k].clone()
            t.view(-1)[:1000] += 1e-3
            a[k] = t
        torch.save(a, cache / "b.pt")
        save_file(a, str(cache / "b.safetensors"))
        shutil.copyfile(cache / "a.pt", cache / "a_copy.pt")
        shutil.copyfile(cache / "a.safetensors", cache / "a_copy.safetensors")
    # Every tensor differs (one training step later, say): the float64 path on all ~1G elements.
    a = torch.load(cache / "a.pt", mmap=True, weights_only=True)
    torch.save({k: v + 1e-3 for k, v in a.items()}, cache / "c.pt")


def measure(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS in MB, exit status of one child process."""
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, stdout=null, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{argv} failed ({code}): {err}")
    return wall, usage.ru_maxrss / 1024, code


def bench(label: str, argv: list[str], runs: int) -> dict:
    measure(argv)  # warm-up: page cache, bytecode
    results = [measure(argv) for _ in range(runs)]
    wall = statistics.median(r[0] for r in results)
    rss = statistics.median(r[1] for r in results)
    return {"label": label, "wall_s": wall, "rss_mb": rss, "exit": results[0][2]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--formats", nargs="+", default=["pt", "safetensors"],
                    choices=["pt", "safetensors"])
    ap.add_argument("--cache", type=Path, default=CACHE)
    args = ap.parse_args(argv)
    generate(args.cache)
    py = sys.executable
    rows = []
    for fmt in args.formats:
        a, b, same = (str(args.cache / f"{n}.{fmt}") for n in ("a", "b", "a_copy"))
        peer = TORCH_PT if fmt == "pt" else TORCH_ST
        size = os.path.getsize(a) / 2**30
        cases = [("4 tensors differ", b), ("identical", same)]
        if fmt == "pt":
            cases.append(("all tensors differ", str(args.cache / "c.pt")))
        for case, other in cases:
            ours = bench("tensorscope diff --json", [py, "-m", "tensorscope", "diff", a, other,
                                                     "--json"], args.runs)
            theirs = bench("torch max|a-b|", [py, "-c", peer, a, other], args.runs)
            for r in (ours, theirs):
                rows.append((f"{fmt} {size:.2f} GiB x2, {case}", r))
            print(f"{fmt:12} {case:18} tensorscope {ours['wall_s']:6.2f} s {ours['rss_mb']:7.0f} MB"
                  f" (exit {ours['exit']})  |  torch {theirs['wall_s']:6.2f} s "
                  f"{theirs['rss_mb']:7.0f} MB  |  speed-up x{theirs['wall_s'] / ours['wall_s']:.1f}",
                  flush=True)
    print()
    print("| input | tool | wall (median) | peak RSS |")
    print("|---|---|---:|---:|")
    for case, r in rows:
        print(f"| {case} | {r['label']} | {r['wall_s']:.2f} s | {r['rss_mb']:.0f} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
