"""What ``scan --sbom`` costs on a 2 GB model: the hash must add no more than reading the file once.

    python benchmarks/bench_sbom.py [--gb 2] [--runs 5]

Input: a safetensors file of ``--gb`` GB (500 float16 tensors; the data are holes of a sparse
file, so the page cache serves them at memory speed and the figure is the hashing itself, the
part tensorscope controls). The scan alone reads only the header, so the whole SBOM hash is extra.
Whole processes, in turn (A B C D E F A B ...), one warm-up round, then the median of ``--runs``
rounds:

- A ``tensorscope scan FILE --no-config --sbom OUT``, B the same without ``--sbom``;
- E and F: A and B on a 1 KB safetensors file: what an SBOM costs whatever the size (importing
  and running the writer and its schema validator);
- C the read-once floor: a Python process reading the file once with ``hashlib.sha256``
  (1 MiB ``readinto`` blocks), minus D, the same interpreter doing nothing (its start-up).

Target: the SBOM's cost that grows with the file, (A - B) - (E - F), is at most the read-once
floor C - D: one read of the file and nothing on top. Judged by the ratio of the two taken round
by round (the machine's speed drifts between rounds; a difference of medians does not cancel it),
median <= 1.05. Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import run_once  # noqa: E402

FLOOR = """
import hashlib, sys
h = hashlib.sha256(); buf = bytearray(1 << 20); view = memoryview(buf)
with open(sys.argv[1], "rb", buffering=0) as f:
    while n := f.readinto(buf):
        h.update(view[:n])
print(h.hexdigest())
"""


def sparse_safetensors(path: str, gb: float, n: int = 500) -> None:
    per = int(gb * 1e9) // n // 2 * 2
    header, off = {}, 0
    for i in range(n):
        header[f"layers.{i}.weight"] = {"dtype": "F16", "shape": [per // 2], "data_offsets": [off, off + per]}
        off += per
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + off)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tsbench-sbom-") as tmp:
        model = os.path.join(tmp, "model.safetensors")
        sparse_safetensors(model, args.gb)
        tiny = os.path.join(tmp, "tiny.safetensors")
        sparse_safetensors(tiny, 1e-6, n=4)
        out = os.path.join(tmp, "bom.json")
        ts = [sys.executable, "-m", "tensorscope", "scan", "--no-config"]
        cases = {"A": ts + [model, "--sbom", out], "B": ts + [model],
                 "C": [sys.executable, "-c", FLOOR, model], "D": [sys.executable, "-c", "pass"],
                 "E": ts + [tiny, "--sbom", out + ".tiny"], "F": ts + [tiny]}
        walls: dict[str, list[float]] = {k: [] for k in cases}
        for i in range(args.runs + 1):
            for k, argv in cases.items():
                s = run_once(argv)
                if s.code != 0:
                    raise SystemExit(f"{k} failed (exit {s.code}): {s.err.strip()[-300:]}")
                if i:
                    walls[k].append(s.wall)
        with open(out) as f:
            bom = json.load(f)
        import hashlib
        h = hashlib.sha256()
        with open(model, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        assert bom["components"][0]["hashes"][0]["content"] == h.hexdigest()
    med = {k: statistics.median(v) for k, v in walls.items()}
    w = walls
    rounds = range(args.runs)
    grows = [(w["A"][i] - w["B"][i]) - (w["E"][i] - w["F"][i]) for i in rounds]
    floors = [w["C"][i] - w["D"][i] for i in rounds]
    fixed = [w["E"][i] - w["F"][i] for i in rounds]
    ratios = [g / f for g, f in zip(grows, floors)]
    print("| run | median wall | runs |")
    print("|---|---:|---|")
    names = {"A": f"`scan --sbom`, {args.gb:g} GB", "B": f"`scan`, {args.gb:g} GB",
             "E": "`scan --sbom`, 1 KB", "F": "`scan`, 1 KB",
             "C": f"read once + sha256, {args.gb:g} GB (Python process)", "D": "Python start-up"}
    for k in "ABEFCD":
        print(f"| {names[k]} | {med[k]:.3f} s | {', '.join(f'{x:.2f}' for x in w[k])} |")
    g, f, r = statistics.median(grows), statistics.median(floors), statistics.median(ratios)
    ok = r <= 1.05
    print(f"\nSBOM cost growing with the file, (A-B)-(E-F): {g:.3f} s; read-once floor (C-D): "
          f"{f:.3f} s; per-round ratio, median {r:.2f} (min {min(ratios):.2f}, max "
          f"{max(ratios):.2f}): {'within' if ok else 'ABOVE'} the target (median ratio <= 1.05). "
          f"Fixed SBOM cost (E-F): {statistics.median(fixed):.3f} s.")

if __name__ == "__main__":
    main()
