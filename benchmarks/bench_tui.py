"""Benchmark the TUI: time from start to the first full screen, and peak memory.

    python benchmarks/bench_tui.py                  # 10,000 and 100,000 tensors, 100,000 MoE shards
    python benchmarks/bench_tui.py --tensors --moe 100000 1000000 --runs 1

Inputs: transformer-shaped safetensors checkpoints (``layers.<i>.<module>.<param>`` names, small
float16 tensors so the files stay a few MB) generated once with numpy + safetensors into
``benchmarks/.cache/tui/`` (gitignored); with ``--format pt`` a torch zip checkpoint instead
(needs torch).

Each measurement is a fresh child process: it imports the app, starts it headless
(``App.run_test`` at 120x40), and stops the clock when the browse screen is up with its tensor
table populated and the statistics of the first tensor shown: what a user sees as "ready". A
sharded checkpoint is shown from its first shard on, the other shards streaming in behind it: the
child then also reports when the model is whole (``whole_s``: every shard read and merged) and
when its tree is built (``tree_s``), and measures the filter on the whole model.
Reported: median wall time of ``--runs`` runs (after one warm-up run that fills the page cache),
the import time of the app alone (numpy + Textual), the child's peak RSS (``ru_maxrss``), and the
filter: measured directly (select over every tensor, hand the rows to the table, draw the lines
on screen), and for the MoE checkpoints also as typed keys through Pilot (key event to repainted
screen) next to a key that changes nothing (Pilot's own cost per key). Targets: first screen
< 1 s at 10,000 tensors; a filter keystroke < 100 ms at 100,000.

``--moe N``: ``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`` (64 experts a layer,
float16 [4, 4]) as safetensors shards of 100,000 tensors with ``model.safetensors.index.json``
(`generate_moe`), in ``benchmarks/.cache/tui/moe_N/``.
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
import asyncio, inspect, json, resource, statistics, sys, time
t0 = time.perf_counter()
from tensorscope.tui.app import make_app
from tensorscope.tui.screens.browse import BrowseScreen
from tensorscope.tui.screens.misc import ErrorScreen
from textual.css.query import NoMatches
t_import = time.perf_counter() - t0
KEYS = sys.argv[2] if len(sys.argv) > 2 else ""

async def main():
    app = make_app(sys.argv[1])
    async with app.run_test(size=(120, 40)) as pilot:
        while True:
            screen = app.screen
            if isinstance(screen, ErrorScreen):
                raise SystemExit(f"cannot open: {screen.message}")
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
        out = {"ready_s": ready, "rows": rows}
        # a sharded checkpoint streams in behind the first screen: the filter is measured on the
        # whole model, once every shard is read (whole_s) and the tree built (tree_s)
        if getattr(screen, "stream", None) is not None:
            while screen.stream is not None:
                await asyncio.sleep(0.01)
            out["whole_s"] = time.perf_counter() - t0
        while getattr(screen, "_pending", False):
            await asyncio.sleep(0.01)
        out["tree_s"] = time.perf_counter() - t0
        out["tensors"] = n = len(screen.model.tensors)
        # one filter refresh over every tensor, measured directly: select the rows, hand them to
        # the table and draw the lines on screen (what the compositor asks the table for)
        new = "details_after" in inspect.signature(screen.refresh_table).parameters
        def direct(pattern):
            t1 = time.perf_counter()
            screen.pattern = pattern
            screen.refresh_table(details_after=1.0) if new else screen.refresh_table()
            for y in range(table.size.height):
                table.render_line(y)
            return time.perf_counter() - t1
        out["filter_s"] = direct("7")
        direct("")
        if KEYS:
            # the startup scan runs in a thread after the first screen: wait for it, so the keys
            # measure the filter, not the scan's share of the GIL
            while not app.scan_done:
                await asyncio.sleep(0.05)
            out["scan_done_s"] = time.perf_counter() - t0
            # each version's keystroke path (the details pane deferred where the code does so,
            # not the debounce timer) and one repaint, per growing prefix of KEYS
            refresh = []
            for k in range(1, len(KEYS) + 1):
                t1 = time.perf_counter()
                screen.pattern = KEYS[:k]
                screen.refresh_table(details_after=0.15) if new else screen.refresh_table()
                await pilot.pause()
                refresh.append(time.perf_counter() - t1)
            out["refresh_s"] = statistics.median(refresh)
            screen.pattern = ""
            screen.refresh_table()
            # typed keystrokes through Pilot (key event -> table refreshed -> screen repainted),
            # against a key that changes nothing (Pilot's own cost per key)
            await pilot.press("slash")
            await pilot.pause()
            noop, typed = [], []
            for _ in range(5):
                t1 = time.perf_counter(); await pilot.press("left"); noop.append(time.perf_counter() - t1)
            for ch in KEYS:
                t1 = time.perf_counter(); await pilot.press(ch); typed.append(time.perf_counter() - t1)
            out["key_s"] = statistics.median(typed)
            out["noop_key_s"] = statistics.median(noop)
            out["direct_keys_s"] = statistics.median(direct(KEYS[:k]) for k in range(1, len(KEYS) + 1))
    return out

out = asyncio.run(main())
out.update(import_s=t_import, maxrss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
print(json.dumps(out))
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

    folder = CACHE / (f"moe_{n}" if shards is None else f"moe_{n}_{shards}shards")
    index = folder / "model.safetensors.index.json"
    if (folder / "done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    experts, projs = 64, ("gate_proj", "up_proj", "down_proj")
    per_layer = experts * len(projs)
    names = [f"model.layers.{k // per_layer}.mlp.experts.{k % per_layer // 3}.{projs[k % 3]}.weight"
             for k in range(n)]
    shards = shards or max(1, -(-n // 100_000))
    # The sharded reader caps index.json at 64 MiB; a 1,000,000-tensor index is ~88 MB, so above
    # 500,000 tensors the folder holds the shards alone (the reader then lists every shard).
    write_index = n <= 500_000
    per = -(-n // shards)
    value = np.arange(16, dtype=np.float16).reshape(4, 4)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        chunk = names[s * per:(s + 1) * per]
        save_file({name: value for name in chunk}, str(folder / fname))
        weight_map.update(dict.fromkeys(chunk, fname))
        total += value.nbytes * len(chunk)
    if write_index:
        index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "done").write_text("")
    return folder


def measure(path: Path, keys: str = "", python: str = sys.executable) -> dict:
    out = subprocess.run([python, "-c", CHILD, str(path), keys], capture_output=True, text=True,
                         env={**os.environ, "TEXTUAL_ANIMATIONS": "none"})
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _size(path: Path) -> float:
    files = [path] if path.is_file() else list(path.iterdir())
    return sum(f.stat().st_size for f in files) / 2**20


KEYS = "experts.1"  # typed into the filter, one key at a time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, nargs="*", default=[10_000, 100_000],
                    help="transformer-shaped single-file checkpoints of these sizes")
    ap.add_argument("--moe", type=int, nargs="*", default=[100_000],
                    help="mixture-of-experts safetensors shards of these sizes (filter keystrokes typed)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--format", choices=("safetensors", "pt"), default="safetensors")
    ap.add_argument("--python", nargs="*", default=[sys.executable],
                    help="interpreters to compare, run alternately (e.g. a venv with another "
                         "checkout of tensorscope installed)")
    args = ap.parse_args(argv)
    print(f"{'input':>24} {'size':>8} {'first screen':>12} {'import':>7} {'peak RSS':>9} "
          f"{'filter (direct)':>15} {'refresh+paint':>13} {'key (Pilot)':>11} {'no-op key':>9}")
    cases = [(f"{n:,} {args.format}", generate(n, args.format), "") for n in args.tensors or ()]
    cases += [(f"{n:,} MoE shards", generate_moe(n), KEYS) for n in args.moe or ()]
    for label, path, keys in cases:
        for py in args.python:
            measure(path, python=py)  # warm-up: page cache, .pyc
        runs: dict[str, list] = {py: [] for py in args.python}
        for _ in range(args.runs):
            for py in args.python:  # alternately, so a change in the machine's load hits both
                runs[py].append(measure(path, keys, py))
        for py, rs in runs.items():
            med = lambda k: statistics.median(r[k] for r in rs) if k in rs[0] else float("nan")
            rss = max(r["maxrss_mib"] for r in rs)
            flt = med("direct_keys_s") if keys else med("filter_s")
            name = label if len(args.python) == 1 else f"{label} [{py}]"
            print(f"{name:>24} {_size(path):>6.1f}MB {med('ready_s'):>10.2f} s {med('import_s'):>5.2f} s "
                  f"{rss:>5.0f} MiB {flt * 1000:>12.1f} ms {med('refresh_s') * 1000:>10.0f} ms "
                  f"{med('key_s') * 1000:>8.0f} ms {med('noop_key_s') * 1000:>6.0f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
