"""Benchmark: listing a ~2 GB float16 ONNX model, tensorscope's wire walk against onnx.load.

Writes two models of N float16 initializers (default 500 x 1024x1856, ~1.9 GB: below protobuf's
2 GiB limit so that onnx.load can read the embedded one) into ``benchmarks/.cache/onnx/``:

- ``embedded.onnx``: every initializer's bytes in ``raw_data``;
- ``external/model.onnx`` + ``external/weights.bin``: the same, with external data.

The protobuf framing is written by hand (the walker's own field numbers) and the payload is
streamed, so generating needs no 2 GB in memory; every command must report the same tensor
count (onnx.load parsing the files is the validity check). Each command runs as a whole process (cold interpreter,
warm page cache), R times; the median wall time and the median peak RSS (``os.wait4``'s
``ru_maxrss``) are reported:

- ``tensorscope.open(path)`` + ``len(model.tensors)``;
- ``onnx.load(path, load_external_data=False)``;
- ``onnx.load(path)`` (reads every tensor byte into the ModelProto).

Run: ``python benchmarks/bench_onnx.py [--tensors 500] [--rows 1024] [--cols 1856] [--repeat 3]``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parent / ".cache" / "onnx"
PY = sys.executable


def _v(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _f(num: int, wire: int, payload: bytes = b"", value: int = 0) -> bytes:
    tag = _v(num << 3 | wire)
    if wire == 0:
        return tag + _v(value)
    return tag + _v(len(payload)) + payload


def _tensor_head(name: str, dims: tuple[int, ...], extra: bytes = b"") -> bytes:
    # TensorProto: dims=1, data_type=2 (FLOAT16=10), name=8; raw_data=9 follows when embedded.
    return b"".join(_f(1, 0, value=d) for d in dims) + _f(2, 0, value=10) + \
        _f(8, 2, name.encode()) + extra


def _value_info(name: str) -> bytes:
    shape = _f(1, 2, _f(1, 0, value=1)) + _f(1, 2, _f(1, 0, value=1024))
    tensor_type = _f(1, 0, value=10) + _f(2, 2, shape)
    return _f(1, 2, name.encode()) + _f(2, 2, _f(1, 2, tensor_type))


def write_models(n: int, rows: int, cols: int) -> tuple[Path, Path]:
    embedded = CACHE / "embedded.onnx"
    external = CACHE / "external" / "model.onnx"
    stamp = CACHE / f"made-{n}-{rows}-{cols}"
    if stamp.exists() and embedded.exists() and external.exists():
        return embedded, external
    external.parent.mkdir(parents=True, exist_ok=True)
    nbytes = rows * cols * 2
    rng = np.random.default_rng(0)
    block = rng.standard_normal(nbytes // 2, dtype=np.float32).astype(np.float16).tobytes()
    names = [f"model.layers.{i // 10}.mlp.w{i % 10}.weight" for i in range(n)]
    nodes = b"".join(_f(1, 2, _f(1, 2, b"x") + _f(2, 2, f"y{i}".encode()) + _f(3, 2, f"id{i}".encode())
                            + _f(4, 2, b"Identity")) for i in range(n))
    io = _f(11, 2, _value_info("x")) + b"".join(_f(12, 2, _value_info(f"y{i}")) for i in range(n))
    model_head = _f(1, 0, value=9) + _f(8, 2, _f(2, 0, value=20)) + _f(2, 2, b"bench")

    # embedded: ModelProto{..., graph{nodes, name, initializer{... raw_data}, io}}
    inits = []
    for name in names:
        head = _tensor_head(name, (rows, cols)) + _v(9 << 3 | 2) + _v(nbytes)
        inits.append(head)
    graph_len = len(nodes) + len(_f(2, 2, b"bench_graph")) + len(io) + sum(
        len(_v(5 << 3 | 2)) + len(_v(len(h) + nbytes)) + len(h) + nbytes for h in inits)
    with open(embedded, "wb") as f:
        f.write(model_head + _v(7 << 3 | 2) + _v(graph_len) + nodes + _f(2, 2, b"bench_graph"))
        for i, head in enumerate(inits):
            f.write(_v(5 << 3 | 2) + _v(len(head) + nbytes) + head)
            f.write(block[i % 7:] + block[:i % 7])  # a different rotation per tensor
        f.write(io)

    # external: one weights.bin, back to back, as onnx.save_model writes it
    graph = bytearray(nodes + _f(2, 2, b"bench_graph"))
    with open(external.parent / "weights.bin", "wb") as w:
        for i, name in enumerate(names):
            entries = b"".join(_f(13, 2, _f(1, 2, k.encode()) + _f(2, 2, str(v).encode()))
                               for k, v in (("location", "weights.bin"), ("offset", i * nbytes),
                                            ("length", nbytes)))
            graph += _f(5, 2, _tensor_head(name, (rows, cols), entries + _f(14, 0, value=1)))
            w.write(block[i % 7:] + block[:i % 7])
    graph += io
    external.write_bytes(model_head + _f(7, 2, bytes(graph)))
    stamp.write_text("ok")
    return embedded, external


def run(code: str, path: Path) -> tuple[float, int, str]:
    """Wall seconds, peak RSS bytes and stdout of one whole child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([PY, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().strip()
    proc.stdout.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{code!r} failed with {proc.returncode}")
    return wall, usage.ru_maxrss * 1024, out


COMMANDS = {
    "tensorscope.open": "import sys, tensorscope; m = tensorscope.open(sys.argv[1]); print(len(m.tensors))",
    "onnx.load(load_external_data=False)":
        "import sys, onnx; m = onnx.load(sys.argv[1], load_external_data=False); print(len(m.graph.initializer))",
    "onnx.load": "import sys, onnx; m = onnx.load(sys.argv[1]); print(len(m.graph.initializer))",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=500)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=1856)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    embedded, external = write_models(args.tensors, args.rows, args.cols)
    size = embedded.stat().st_size
    print(f"{args.tensors} float16 initializers [{args.rows}, {args.cols}]: embedded "
          f"{size / 1e9:.2f} GB, external {external.stat().st_size / 1e3:.0f} kB + "
          f"{(external.parent / 'weights.bin').stat().st_size / 1e9:.2f} GB")
    rows = []
    for label, path in (("embedded", embedded), ("external", external)):
        for name, code in COMMANDS.items():
            runs = [run(code, path) for _ in range(args.repeat)]
            assert all(r[2] == str(args.tensors) for r in runs), runs
            rows.append((label, name, statistics.median(r[0] for r in runs),
                         statistics.median(r[1] for r in runs)))
    print(f"{'file':<9} {'command':<38} {'wall s':>8} {'peak RSS MB':>12}")
    for label, name, wall, rss in rows:
        print(f"{label:<9} {name:<38} {wall:>8.2f} {rss / 1e6:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
