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
  shards (``torch.save`` of a million tensors takes minutes and gigabytes, the shards seconds),
  and measured for ``inspect --json`` and its peer only.

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
COMMANDS = ("inspect --json", "inspect (table, piped)", "inspect --group", "diff A A", "convert",
            "scan")


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


# -- measurement ------------------------------------------------------------------------------
PEER_TORCH_LIST = """
import sys, torch
sd = torch.load(sys.argv[1], mmap=True, weights_only=True)
for k, v in sd.items():
    print(k, v.dtype, tuple(v.shape))
"""

PEER_ST_LIST = """
import glob, os, sys
from safetensors import safe_open
for file in sorted(glob.glob(os.path.join(sys.argv[1], "*.safetensors"))):
    with safe_open(file, framework="np") as f:
        for k in f.keys():
            s = f.get_slice(k)
            print(k, s.get_dtype(), s.get_shape())
"""

PEER_TORCH_DIFF = """
import sys, torch
a = torch.load(sys.argv[1], mmap=True, weights_only=True)
b = torch.load(sys.argv[2], mmap=True, weights_only=True)
print(sum(1 for k in a if not torch.equal(a[k], b[k])))
"""


def picklescan_exe() -> str | None:
    """picklescan from its own venv (see the module docstring), next to this Python, or on PATH."""
    for folder in (CACHE / "peers" / "bin", Path(PY).parent):
        if (folder / "picklescan").exists():
            return str(folder / "picklescan")
    return shutil.which("picklescan")


def cases(root: Path, n: int, out_dir: Path) -> list[tuple[str, str, list[str], dict, str | None, list[str] | None]]:
    """(command, input kind, our argv, measure kwargs, peer label, peer argv) for size ``n``."""
    pt, st = str(torch_path(root, n)), str(shards_path(root, n))
    kinds = ([("torch zip", pt)] if n <= TORCH_MAX else []) + [("safetensors x10", st)]
    out = []
    for kind, path in kinds:
        lister = ([PY, "-c", PEER_TORCH_LIST, path] if kind == "torch zip" else
                  [PY, "-c", PEER_ST_LIST, path])
        peer_label = ("torch.load(mmap=True) + print each" if kind == "torch zip" else
                      "safe_open per shard + print each")
        out.append(("inspect --json", kind, TS + ["inspect", "--json", path], {}, peer_label, lister))
        if n > TORCH_MAX:
            continue   # the 1M listing: inspect --json and its peer only
        out.append(("inspect (table, piped)", kind, TS + ["inspect", path], {}, None, None))
        out.append(("inspect --group", kind, TS + ["inspect", "--group", path], {}, None, None))
        out.append(("diff A A", kind, TS + ["diff", path, path], {"ok_codes": (0, 1)},
                    "2x torch.load(mmap=True) + torch.equal" if kind == "torch zip" else None,
                    [PY, "-c", PEER_TORCH_DIFF, path, path] if kind == "torch zip" else None))
        target = out_dir / f"converted_{n}_{kind.split()[0]}.safetensors"
        out.append(("convert", kind, TS + ["convert", path, str(target), "--force"],
                    {"before": lambda t=target: t.unlink(missing_ok=True)}, None, None))
        ps = picklescan_exe()
        out.append(("scan", kind, TS + ["scan", path], {"ok_codes": (0, 1)},
                    "picklescan" if ps and kind == "torch zip" else None,
                    [ps, "-p", path] if ps and kind == "torch zip" else None))
    return out


def run(sizes=SIZES[:3], runs: int = 1, root: Path | None = None, log=print,
        commands: set[str] | None = None) -> list[dict]:
    """Measure every case (or those of ``commands``) at every size; one dict per (command, kind,
    size)."""
    root = root or CACHE / "scale"
    generate_in_child(root, sizes)
    # The bytecode a pip install writes (peers' packages have theirs): with an editable install
    # and PYTHONDONTWRITEBYTECODE set, every run would compile tensorscope again (~0.05 s).
    import compileall
    for package in ("tensorscope", "parsers", "tui"):
        compileall.compile_dir(str(HERE.parent / package), quiet=1)
    out_dir = Path(tempfile.mkdtemp(prefix="tsbench-scale-"))
    rows = []
    try:
        for n in sizes:
            for command, kind, argv, kw, peer_label, peer_argv in cases(root, n, out_dir):
                if commands and command not in commands:
                    continue
                ours = measure(argv, runs, warmup=False, **kw)
                peer = measure(peer_argv, runs, warmup=False, ok_codes=(0, 1)) if peer_argv else None
                row = {"command": command, "kind": kind, "n": n, "ours": _res(ours),
                       "peer_label": peer_label, "peer": _res(peer) if peer else None}
                log(f"  {n:>9,} {kind:<16} {command:<24} {_fmt(row['ours'])}"
                    + (f" | {peer_label}: {_fmt(row['peer'])}" if peer else ""))
                rows.append(row)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return rows


def _res(r: Result) -> dict:
    return {"wall": r.wall, "cpu": r.cpu, "rss": r.rss, "error": r.error}


def _fmt(r: dict | None) -> str:
    if r is None:
        return "-"
    if r["error"]:
        return r["error"][:60]
    return f"{r['wall']:.2f} s ({r.get('cpu', 0):.2f} s CPU), {r['rss'] / 2**20:.0f} MiB"


def per_tensor(rows: list[dict], command: str, kind: str, side: str = "ours") -> tuple[float, float] | None:
    """(µs per tensor, bytes per tensor): the slope between the two largest sizes measured."""
    pts = sorted((r["n"], r[side]) for r in rows if r["command"] == command and r["kind"] == kind
                 and r[side] and not r[side]["error"])
    if len(pts) < 2:
        return None
    (n1, a), (n2, b) = pts[-2], pts[-1]
    return (b[_CLOCK] - a[_CLOCK]) / (n2 - n1) * 1e6, (b["rss"] - a["rss"]) / (n2 - n1)


# Per-tensor slopes and ratios use CPU time (user + system) of the whole process: on a loaded
# machine wall time measures the other load as much as the command.
_CLOCK = "cpu"


def render(rows: list[dict]) -> str:
    """The "Cost per tensor" section of BENCHMARKS.md."""
    sizes = sorted({r["n"] for r in rows})
    lines = ["## Cost per tensor (1k / 10k / 100k / 1M tensors)", "",
             "MoE names (`model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight`), bf16 [4, 4]; "
             "`torch.save` zip (up to 100k) and 10 `safetensors.torch.save_file` shards + index "
             "(every size; the 1M listing exists only as shards). Each cell: wall time, peak RSS "
             "of the whole process, with its CPU time (user + system). Per tensor: CPU-time and "
             "peak-RSS slope between the two largest sizes (start-up excluded). Made by `python benchmarks/bench_scale.py` (or `benchmarks/run.py "
             "--only pertensor`).", "",
             "| command | input | " + " | ".join(f"{n:,}" for n in sizes)
             + " | µs / tensor | bytes / tensor | peer at largest | peer µs / tensor |",
             "|---|---|" + "---:|" * len(sizes) + "---:|---:|---|---:|"]
    seen = []
    for r in rows:
        key = (r["command"], r["kind"])
        if key not in seen:
            seen.append(key)
    seen.sort(key=lambda k: (COMMANDS.index(k[0]) if k[0] in COMMANDS else len(COMMANDS),
                             k[1] != "torch zip"))
    for command, kind in seen:
        mine = {r["n"]: r for r in rows if (r["command"], r["kind"]) == (command, kind)}
        cells = [_fmt(mine[n]["ours"]) if n in mine else "" for n in sizes]
        slope = per_tensor(rows, command, kind)
        largest = mine[max(mine)]
        peer = largest["peer"]
        pslope = per_tensor(rows, command, kind, "peer") if peer else None
        ratio = ""
        if peer and not peer["error"] and not largest["ours"]["error"] and largest["ours"]["wall"]:
            ratio = f" ({peer[_CLOCK] / largest['ours'][_CLOCK]:.1f}x)"
        lines.append(f"| {command} | {kind} | " + " | ".join(cells) + " | "
                     + (f"{slope[0]:.1f} | {slope[1]:,.0f}" if slope else "- | -") + " | "
                     + (f"{largest['peer_label']}: {_fmt(peer)}{ratio}" if peer else "-") + " | "
                     + (f"{pslope[0]:.1f}" if pslope else "-") + " |")
    lines += ["", "Ratios in brackets are peer CPU time / tensorscope CPU time at the largest "
              "size (above 1x tensorscope is faster)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES[:3]),
                    help="tensor counts (default 1000 10000 100000; add 1000000 for the 1M listing)")
    ap.add_argument("--runs", type=int, default=1, help="measured runs per command (median)")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown section here")
    ap.add_argument("--commands", nargs="+", default=None, metavar="COMMAND",
                    help='only these commands (as named in the table, e.g. "inspect --json" scan)')
    ap.add_argument("--keep", action="store_true",
                    help="add to the rows of the previous run (results.json) instead of replacing them")
    args = ap.parse_args(argv)
    results = CACHE / "scale" / "results.json"
    rows = run(args.sizes, args.runs, commands=set(args.commands) if args.commands else None)
    if args.keep and results.exists():
        new = {(r["command"], r["kind"], r["n"]) for r in rows}
        old = [r for r in json.loads(results.read_text())
               if (r["command"], r["kind"], r["n"]) not in new]
        rows = sorted(old + rows, key=lambda r: r["n"])
    results.write_text(json.dumps(rows, indent=1))
    text = render(rows)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
