"""Benchmark: listing multi-file checkpoints, tensorscope against the libraries' own metadata paths.

Writes into ``benchmarks/.cache/containers/`` (gitignored), once:

- ``dcp/``: ``torch.distributed.checkpoint.save`` (one process) of N float16 tensors (default
  400 x 1024x2560, ~2.1 GB);
- ``st_sharded/``: the same tensors as 4 safetensors shards + ``model.safetensors.index.json``;
- ``bin_sharded/``: the same as 4 ``torch.save`` shards + ``pytorch_model.bin.index.json``.

Each command runs as a whole process (cold interpreter, warm page cache), R times; the median wall
time and the median peak RSS (``os.wait4``'s ``ru_maxrss``) are reported:

- tensorscope: ``tensorscope inspect --json <folder>`` (stdout to /dev/null). For DCP this parses
  ``.metadata`` AND every chunk blob's zip directory and pickle (to locate the bytes);
- torch DCP: ``FileSystemReader(dir).read_metadata()`` (the metadata pickle only);
- safetensors: ``safe_open`` per shard, keys + ``get_slice(k).get_shape()``;
- torch .bin: ``torch.load(shard, mmap=True, weights_only=True)`` per shard.

Run: ``python benchmarks/bench_containers.py [--tensors 400] [--rows 1024] [--cols 2560] [--repeat 3]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache" / "containers"
PY = sys.executable
SHARDS = 4


def _state(i0: int, i1: int, rows: int, cols: int):
    import torch
    return {f"layers.{i}.weight": torch.full((rows, cols), float(i % 7), dtype=torch.float16)
            for i in range(i0, i1)}


def _generate(n: int, rows: int, cols: int) -> None:
    import torch
    stamp = CACHE / f"done-{n}-{rows}-{cols}"
    if stamp.exists():
        return
    import shutil
    shutil.rmtree(CACHE, ignore_errors=True)
    CACHE.mkdir(parents=True)
    need = 3 * n * rows * cols * 2
    free = shutil.disk_usage(CACHE).free
    if free < need + (10 << 30):   # the disk is shared: keep 10 GiB for everyone else
        raise SystemExit(f"not enough free disk: {need / 2**30:.1f} GiB needed + 10 GiB margin, "
                         f"{free / 2**30:.1f} GiB free")
    import warnings
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_state(0, n, rows, cols), checkpoint_id=str(CACHE / "dcp"))
    per = -(-n // SHARDS)
    for kind, ext, stem in (("st_sharded", "safetensors", "model"),
                            ("bin_sharded", "bin", "pytorch_model")):
        folder = CACHE / kind
        folder.mkdir()
        wm, total = {}, 0
        for s in range(SHARDS):
            sd = _state(s * per, min(n, (s + 1) * per), rows, cols)
            name = f"{stem}-{s + 1:05d}-of-{SHARDS:05d}.{ext}"
            if ext == "safetensors":
                save_file(sd, folder / name)
            else:
                torch.save(sd, folder / name)
            wm.update({k: name for k in sd})
            total += sum(t.numel() * 2 for t in sd.values())
        (folder / f"{stem}.{ext}.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))
    stamp.write_text("ok")


OURS = "import sys; from tensorscope.cli import main; sys.exit(main(sys.argv[1:]))"
TORCH_DCP = ("import sys, torch.distributed.checkpoint as d; "
             "m = d.FileSystemReader(sys.argv[1]).read_metadata(); print(len(m.state_dict_metadata))")
ST = ("import sys, glob; from safetensors import safe_open\n"
      "n = 0\n"
      "for p in sorted(glob.glob(sys.argv[1] + '/*.safetensors')):\n"
      "    with safe_open(p, 'pt') as f:\n"
      "        n += sum(1 for k in f.keys() if f.get_slice(k).get_shape())\n"
      "print(n)")
TORCH_BIN = ("import sys, glob, torch\n"
             "n = 0\n"
             "for p in sorted(glob.glob(sys.argv[1] + '/*.bin')):\n"
             "    n += len(torch.load(p, mmap=True, weights_only=True))\n"
             "print(n)")


def _measure(argv: list[str], repeat: int) -> tuple[float, float]:
    times, rss = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        with open(os.devnull, "wb") as null:
            proc = subprocess.Popen(argv, stdout=null)
            _, status, usage = os.wait4(proc.pid, 0)
        times.append(time.perf_counter() - start)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"command failed: {argv}")
        rss.append(usage.ru_maxrss / 1024)  # KiB -> MiB
    return statistics.median(times), statistics.median(rss)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=400)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=2560)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--generate-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.generate_only:
        _generate(args.tensors, args.rows, args.cols)
        return 0
    # Generate in a child: a parent holding 2 GB of tensors would inflate every measured child's
    # ru_maxrss (a forked child starts with the parent's resident pages).
    subprocess.run([PY, __file__, "--generate-only", "--tensors", str(args.tensors), "--rows",
                    str(args.rows), "--cols", str(args.cols)], check=True)
    size = args.tensors * args.rows * args.cols * 2
    print(f"{args.tensors} float16 tensors, {size / 2**30:.2f} GiB per checkpoint, "
          f"median of {args.repeat} runs (wall s, peak RSS MiB)")
    rows = [
        ("dcp", "tensorscope inspect --json", [PY, "-c", OURS, "inspect", "--json", str(CACHE / "dcp")]),
        ("dcp", "torch FileSystemReader.read_metadata", [PY, "-c", TORCH_DCP, str(CACHE / "dcp")]),
        ("st_sharded", "tensorscope inspect --json",
         [PY, "-c", OURS, "inspect", "--json", str(CACHE / "st_sharded")]),
        ("st_sharded", "safetensors safe_open per shard", [PY, "-c", ST, str(CACHE / "st_sharded")]),
        ("bin_sharded", "tensorscope inspect --json",
         [PY, "-c", OURS, "inspect", "--json", str(CACHE / "bin_sharded")]),
        ("bin_sharded", "torch.load(mmap=True) per shard", [PY, "-c", TORCH_BIN, str(CACHE / "bin_sharded")]),
    ]
    print(f"{'checkpoint':<12} {'command':<40} {'wall s':>8} {'RSS MiB':>9}")
    for ckpt, label, cmd in rows:
        wall, rss = _measure(cmd, args.repeat)
        print(f"{ckpt:<12} {label:<40} {wall:8.2f} {rss:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
