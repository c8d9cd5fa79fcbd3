"""Cost per tensor: every command on checkpoints of 1k, 10k, 100k and 1M tiny tensors.

    python benchmarks/bench_scale.py                 # 1k/10k/100k, 1 run each, prints a table
    python benchmarks/bench_scale.py --sizes 1000 10000 100000 1000000 --runs 3
    python benchmarks/run.py --only pertensor [--skip-1m]

Inputs (generated once into ``benchmarks/.cache/scale/``, never committed, by `generate` in a
child process): ``N`` bf16 [4, 4] tensors named like a mixture-of-experts checkpoint,
``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`` (256 experts of 3 projections per
layer), as

- ``torch_N.pt``: one torch zip (``torch.save`` of the state dict), for N up to 100k;
- ``st_N/``: 10 safetensors shards (``safetensors.torch.save_file``) plus
  ``model.safetensors.index.json``, for every N. The 1,000,000-tensor listing is made only as
  shards: ``torch.save`` of a million tensors takes minutes and gigabytes, the shards seconds.

Every case is a whole process measured by `common.measure` (wall time, peak RSS from
``os.wait4``). Per-tensor figures are the slope between the two largest sizes,
(cost(N2) - cost(N1)) / (N2 - N1), so that interpreter start and imports (the intercept) are not
counted as per-tensor work.

Peers: ``torch.load(mmap=True, weights_only=True)`` + printing each tensor's name, dtype and
shape; ``safe_open`` per shard + printing key, dtype, shape; two ``torch.load`` + ``torch.equal``
per key for diff; picklescan for scan when it is installed (its own venv:
``python -m venv benchmarks/.cache/peers && benchmarks/.cache/peers/bin/pip install picklescan``;
not a project dependency).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import CACHE, Result, measure  # noqa: E402

PY = sys.executable
TS = [PY, "-m", "tensorscope"]
SIZES = (1_000, 10_000, 100_000, 1_000_000)
TORCH_MAX = 100_000          # larger sizes are made as safetensors shards only
SHARDS = 10
EXPERTS = 256
PROJ = ("gate", "up", "down")


def names(n: int) -> list[str]:
    """The ``n`` MoE tensor names, in saved order."""
    per_layer = EXPERTS * len(PROJ)
    return [f"model.layers.{i // per_layer}.mlp.experts.{(i // len(PROJ)) % EXPERTS}."
            f"{PROJ[i % len(PROJ)]}_proj.weight" for i in range(n)]


def torch_path(root: Path, n: int) -> Path:
    return root / f"torch_{n}.pt"


def shards_path(root: Path, n: int) -> Path:
    return root / f"st_{n}"


def generate(root: str | Path, sizes=SIZES) -> None:
    """Write the scale inputs for ``sizes`` under ``root`` (skips those already there).

    Imports torch and safetensors: run it in a child process (`common.generate_in_child` style).
    """
    import torch
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for n in sizes:
        keys = names(n)
        pt = torch_path(root, n)
        if n <= TORCH_MAX and not pt.exists():
            g = torch.Generator().manual_seed(n)
            sd = {k: torch.randn(4, 4, generator=g).to(torch.bfloat16) for k in keys}
            tmp = pt.with_suffix(".partial")
            torch.save(sd, tmp)
            os.replace(tmp, pt)
            del sd
        folder = shards_path(root, n)
        index = folder / "model.safetensors.index.json"
        if index.exists():
            continue
        tmpdir = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=root))
        per = -(-n // SHARDS)
        weight_map = {}
        for s in range(SHARDS):
            part = keys[s * per:(s + 1) * per]
            file = f"model-{s + 1:05d}-of-{SHARDS:05d}.safetensors"
            g = torch.Generator().manual_seed(n * 100 + s)
            # one [len, 4, 4] block, split into views: save_file needs no shared storage, so clone
            block = torch.randn(len(part), 4, 4, generator=g).to(torch.bfloat16)
            save_file({k: block[i].clone() for i, k in enumerate(part)}, str(tmpdir / file),
                      metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, file))
        (tmpdir / index.name).write_text(json.dumps(
            {"metadata": {"total_size": n * 32}, "weight_map": weight_map}))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmpdir, folder)


def generate_in_child(root: Path, sizes) -> None:
    import subprocess
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench_scale\n"
            f"bench_scale.generate(sys.argv[1], [int(x) for x in sys.argv[2:]])")
    subprocess.run([PY, "-c", code, str(root), *map(str, sizes)], check=True)
