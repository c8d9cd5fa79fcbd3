"""Benchmark `tensorscope convert` against the torch way of converting a checkpoint to safetensors.

    python benchmarks/bench_convert.py              # generate once into benchmarks/.cache/, then measure
    python benchmarks/bench_convert.py --runs 5 --verify

Input: a ~2 GB float16 state dict of 500 tensors (480 of 1024x2048 and 20 of 2048) saved with
``torch.save`` as ``pytorch_model.bin``, generated once (needs torch) and kept in
``benchmarks/.cache/convert/`` (gitignored).

Each measurement is a whole process: wall time and peak RSS (``ru_maxrss`` of that child alone,
through ``os.wait4``), the median of ``--runs`` rounds after one warm-up round that fills the page
cache; each round runs every peer once, interleaved, so that load from elsewhere on the machine
hits all of them alike. Outputs go to the same folder and are removed. Peers:

- ``tensorscope convert IN OUT --force`` (scan, sha256 of the input, streamed copy, fsync, rename;
  ``--verify`` adds a full comparison of the output with the input);
- torch: ``torch.load(IN, weights_only=True)`` then ``safetensors.torch.save_file(sd, OUT)`` (no
  scan, no hash, no fsync);
- torch with ``mmap=True`` (the cheaper variant, for reference).

Both outputs are checked to hold the same tensors bytes (our header also carries ``__metadata__``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache" / "convert"
N_BIG, BIG_SHAPE, N_SMALL, SMALL_SHAPE = 480, (1024, 2048), 20, (2048,)

TORCH_WAY = """
import sys, torch
from safetensors.torch import save_file
sd = torch.load(sys.argv[1], weights_only=True, mmap=sys.argv[3] == "mmap")
save_file(sd, sys.argv[2], metadata={"format": "pt"})
"""

SAME_TENSORS = """
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], "np") as a, safe_open(sys.argv[2], "np") as b:
    assert sorted(a.keys()) == sorted(b.keys())
    for k in a.keys():
        assert a.get_tensor(k).tobytes() == b.get_tensor(k).tobytes(), k
print("same tensors")
"""


def generate(cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / "pytorch_model.bin"
    if src.exists():
        return src
    # Imported only here: a child's ru_maxrss can include the parent's RSS at fork time, so the
    # measuring process stays small.
    import torch

    print(f"generating a ~2 GB state dict in {src} (once) ...", file=sys.stderr)
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(N_BIG):
        sd[f"layer.{i}.weight"] = torch.randn(BIG_SHAPE, generator=g, dtype=torch.float16)
    for i in range(N_SMALL):
        sd[f"bias.{i}"] = torch.randn(SMALL_SHAPE, generator=g, dtype=torch.float16)
    tmp = cache / "pytorch_model.bin.partial"
    torch.save(sd, tmp)
    os.replace(tmp, src)
    return src


def measure(argv: list[str], out: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS in MB of one child process (which must succeed)."""
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, stdout=null, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{argv} failed ({code}): {err}")
    return wall, usage.ru_maxrss / 1024


def bench_all(peers: list[tuple[str, list[str], Path]], runs: int) -> list[dict]:
    """Run each peer once to warm up, then ``runs`` rounds in which every peer runs once
    (interleaved, so that load from elsewhere on the machine hits all peers alike)."""
    results: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in peers}
    for round_ in range(runs + 1):
        for label, argv, out in peers:
            out.unlink(missing_ok=True)
            r = measure(argv, out)
            if round_:
                results[label].append(r)
    return [{"label": label, "wall_s": statistics.median(w for w, _ in rs),
             "rss_mb": statistics.median(m for _, m in rs),
             "runs": [(round(w, 2), round(m)) for w, m in rs]} for label, rs in results.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--verify", action="store_true", help="also measure tensorscope convert --verify")
    ap.add_argument("--no-mmap-peer", action="store_true", help="skip the torch mmap=True peer")
    ap.add_argument("--cache", type=Path, default=CACHE)
    args = ap.parse_args(argv)
    src = generate(args.cache)
    py = sys.executable
    ours_out, theirs_out = args.cache / "ours.safetensors", args.cache / "theirs.safetensors"
    size = os.path.getsize(src) / 2**30
    peers = [("tensorscope convert", [py, "-m", "tensorscope", "convert", str(src), str(ours_out),
                                      "--force"], ours_out)]
    if args.verify:
        peers.append(("tensorscope convert --verify", [py, "-m", "tensorscope", "convert", str(src),
                                                       str(ours_out), "--force", "--verify"], ours_out))
    peers.append(("torch.load + save_file", [py, "-c", TORCH_WAY, str(src), str(theirs_out), "-"],
                  theirs_out))
    if not args.no_mmap_peer:
        peers.append(("torch.load(mmap=True) + save_file",
                      [py, "-c", TORCH_WAY, str(src), str(theirs_out), "mmap"], theirs_out))
    rows = bench_all(peers, args.runs)
    check = subprocess.run([py, "-c", SAME_TENSORS, str(ours_out), str(theirs_out)],
                           capture_output=True, text=True)
    ours_out.unlink(missing_ok=True)
    theirs_out.unlink(missing_ok=True)
    if check.returncode != 0:
        raise SystemExit(f"outputs differ: {check.stderr}")
    base = rows[0]
    print(f"input: {src.name}, {size:.2f} GiB, {N_BIG + N_SMALL} float16 tensors; "
          f"median of {args.runs} interleaved runs after a warm-up; outputs hold the same tensors")
    print()
    print("| tool | wall (median) | peak RSS (median) | runs (s, MB) |")
    print("|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['label']} | {r['wall_s']:.2f} s | {r['rss_mb']:.0f} MB | {r['runs']} |")
    for r in rows[1:]:
        if r["label"].startswith("torch"):
            print(f"\n{r['label']}: tensorscope is x{r['wall_s'] / base['wall_s']:.2f} as fast, "
                  f"uses {base['rss_mb'] / r['rss_mb']:.2f} of its peak memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
