"""What ``scan --sbom`` costs on a 2 GB model: the hash must add no more than reading the file once.

    python benchmarks/bench_sbom.py [--gb 2] [--runs 5]

Input: a safetensors file of ``--gb`` GB (500 float16 tensors; the data are holes of a sparse
file, so the page cache serves them at memory speed and the figure is the hashing itself, the
part tensorscope controls). The scan alone reads only the header, so the whole SBOM hash is extra.
Three whole processes, in turn (A B C A B C ...), one warm-up round, then the median of ``--runs``:

- A ``tensorscope scan FILE --no-config --sbom OUT``
- B ``tensorscope scan FILE --no-config``
- C the read-once floor: a Python process reading the file once with ``hashlib.sha256``
  (1 MiB ``readinto`` blocks), minus D, the same interpreter doing nothing (its start-up).

Target: A - B <= C - D (+ 5% and 20 ms of noise): the SBOM costs one read of the file and
nothing on top of it. Prints a Markdown table.
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
        out = os.path.join(tmp, "bom.json")
        ts = [sys.executable, "-m", "tensorscope", "scan", model, "--no-config"]
        cases = {"A": ts + ["--sbom", out], "B": ts, "C": [sys.executable, "-c", FLOOR, model],
                 "D": [sys.executable, "-c", "pass"]}
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
    extra, floor = med["A"] - med["B"], med["C"] - med["D"]
    print(f"| run ({args.gb:g} GB safetensors, sparse) | median wall | runs |")
    print("|---|---:|---|")
    names = {"A": "`scan --sbom`", "B": "`scan`", "C": "read once + sha256 (Python process)",
             "D": "Python start-up"}
    for k in "ABCD":
        print(f"| {names[k]} | {med[k]:.3f} s | {', '.join(f'{w:.2f}' for w in walls[k])} |")
    ok = extra <= floor * 1.05 + 0.02
    print(f"\nSBOM cost (A - B): {extra:.3f} s; read-once floor (C - D): {floor:.3f} s; "
          f"ratio {extra / floor:.2f}; {'within' if ok else 'ABOVE'} the target "
          f"(floor + 5% + 20 ms).")


if __name__ == "__main__":
    main()
