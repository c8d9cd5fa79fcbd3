"""Benchmark the TUI: time from start to the first full screen, and peak memory.

    python benchmarks/bench_tui.py                  # 10,000 and 100,000 tensors, 3 runs each
    python benchmarks/bench_tui.py --tensors 10000 --runs 5

Inputs: transformer-shaped safetensors checkpoints (``layers.<i>.<module>.<param>`` names, small
float16 tensors so the files stay a few MB) generated once with numpy + safetensors into
``benchmarks/.cache/tui/`` (gitignored); with ``--format pt`` a torch zip checkpoint instead
(needs torch).

Each measurement is a fresh child process: it imports the app, starts it headless
(``App.run_test`` at 120x40), and stops the clock when the browse screen is up with its tensor
table populated and the statistics of the first tensor shown: what a user sees as "ready".
Reported: median wall time of ``--runs`` runs (after one warm-up run that fills the page cache),
the import time of the app alone (numpy + Textual), the child's peak RSS (``ru_maxrss``), and the
time of one filter refresh over every tensor (select, rebuild the first page, repaint). Target:
< 1 s at 10,000 tensors.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache" / "tui"
MODULES = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.up", "mlp.down",
           "norm1", "norm2")

CHILD = r"""
import asyncio, json, resource, sys, time
t0 = time.perf_counter()
from tensorscope.tui.app import make_app
from tensorscope.tui.screens.browse import BrowseScreen
from textual.css.query import NoMatches
t_import = time.perf_counter() - t0

async def main():
    app = make_app(sys.argv[1])
    async with app.run_test(size=(120, 40)) as pilot:
        while True:
            screen = app.screen
            if isinstance(screen, BrowseScreen) and screen.is_mounted:
                try:
                    table = screen.query_one("#tensors")
                    stats = screen.query_one("#d-stats").content
                except NoMatches:  # composed but children not mounted yet
                    stats = None
                if stats is not None and table.row_count and "computing" not in str(stats):
                    break
            await asyncio.sleep(0.002)
        ready = time.perf_counter() - t0
        rows = table.row_count
        n = len(screen.model.tensors)
        # responsiveness: one filter refresh over every tensor (select, rebuild the table's first
        # page, repaint), as after a keystroke once the large-model debounce has fired
        t1 = time.perf_counter()
        screen.pattern = "7"
        screen.refresh_table()
        await pilot.pause()
        filter_s = time.perf_counter() - t1
    return ready, rows, n, filter_s

ready, rows, n, filter_s = asyncio.run(main())
print(json.dumps({"ready_s": ready, "import_s": t_import, "rows": rows, "tensors": n, "filter_s": filter_s,
                  "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def generate(n: int, fmt: str) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"model_{n}.{'pt' if fmt == 'pt' else 'safetensors'}"
    if path.exists():
        return path
    import numpy as np

    per_layer = len(MODULES) * 2
    layers = -(-n // per_layer)
    names = [f"layers.{i}.{m}.{p}" for i in range(layers) for m in MODULES for p in ("weight", "bias")][:n]
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal((8, 8) if name.endswith("weight") else (8,)).astype(np.float16)
               for name in names}
    if fmt == "pt":
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, path)
    else:
        from safetensors.numpy import save_file

        save_file(tensors, str(path))
    return path


def generate_moe(n: int, shards: int | None = None) -> Path:
    """A mixture-of-experts checkpoint of ``n`` tensors as safetensors shards + index.json.

    Names ``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`` (64 experts per layer,
    float16 [4, 4]), in shards of at most 100,000 tensors, written by ``safetensors.numpy``; the
    folder ``moe_<n>/`` is what the TUI opens."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = CACHE / f"moe_{n}"
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    experts, projs = 64, ("gate_proj", "up_proj", "down_proj")
    per_layer = experts * len(projs)
    names = [f"model.layers.{k // per_layer}.mlp.experts.{k % per_layer // 3}.{projs[k % 3]}.weight"
             for k in range(n)]
    shards = shards or max(1, -(-n // 100_000))
    per = -(-n // shards)
    value = np.arange(16, dtype=np.float16).reshape(4, 4)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        chunk = names[s * per:(s + 1) * per]
        save_file({name: value for name in chunk}, str(folder / fname))
        weight_map.update(dict.fromkeys(chunk, fname))
        total += value.nbytes * len(chunk)
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return folder


def measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                         env={**os.environ, "TEXTUAL_ANIMATIONS": "none"})
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--format", choices=("safetensors", "pt"), default="safetensors")
    args = ap.parse_args(argv)
    print(f"{'tensors':>8} {'file':>9} {'ready (median)':>15} {'of which import':>16} {'rows shown':>10} "
          f"{'peak RSS':>10} {'filter key':>10}")
    for n in args.tensors:
        path = generate(n, args.format)
        measure(path)  # warm-up: page cache, .pyc
        runs = [measure(path) for _ in range(args.runs)]
        ready = statistics.median(r["ready_s"] for r in runs)
        imp = statistics.median(r["import_s"] for r in runs)
        rss = max(r["maxrss_mib"] for r in runs)
        flt = statistics.median(r["filter_s"] for r in runs)
        size = path.stat().st_size / 2**20
        print(f"{runs[0]['tensors']:>8,} {size:>7.1f}MB {ready:>13.3f} s {imp:>6.3f} s "
              f"{runs[0]['rows']:>10} {rss:>6.0f} MiB {flt * 1000:>7.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
