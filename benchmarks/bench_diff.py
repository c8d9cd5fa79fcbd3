"""Benchmark `tensorscope diff` against the torch way of comparing two checkpoints.

    python benchmarks/bench_diff.py              # generate once into benchmarks/.cache/, then measure
    python benchmarks/bench_diff.py --runs 5 --formats safetensors
    python benchmarks/bench_diff.py --cases finetune many --baseline ../main   # issue 17 / 13 cases
    python benchmarks/bench_diff.py --cases finetune kernel    # the all-changed pair, CPU per pair
    python benchmarks/bench_diff.py --cases verdicts           # what the verdicts add (issue 26)

Cases (``--cases``, default all):

- ``pair``: the ~2 GB, 500-tensor pair below (4 tensors differ, identical copy, all differ);
- ``finetune``: a ~2 GB float16 Llama-shaped pair (48 layers x {q,k,v,o,gate,up,down} projections,
  two layer norms and the rotary ``inv_freq`` buffer, embeddings, final norm, lm_head: 483 tensors)
  where EVERY tensor differs by ~1e-3 noise (a fine-tune): tensorscope, the torch loop, and the
  read-once floor ``cat A B > /dev/null`` (warm cache), measured in the same run;
- ``kernel``: in-process, the fused pass's CPU time per element pair per dtype (one thread, pieces
  in memory, the caller's and the pool's piece sizes; the compiled pass's AVX-512 route, where
  the CPU has it, and its portable loop), each numpy call of the float16 pass timed
  on its own (the per-element cost breakdown), the rank test's stage 1 on one fine-tune sample,
  and ``diff_models`` on the fine-tune pair (wall, CPU of every thread, CPU per element pair);
- ``verdicts``: what the verdicts (issue 26) add: ``diff --json`` against ``diff --json
  --no-verdicts`` and the read-once floor, on the all-changed fine-tune pair (every pair a
  low-rank candidate, rejected by the submatrix sample) and on a LoRA pair (A against A plus a
  rank-16 update on q_proj and v_proj of all 48 layers, merged in float16: the sketch pass reads
  those 96 deltas once more);
- ``many``: a 100,000-tensor torch zip (``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``,
  bfloat16 [4, 4]) against itself and against a copy where every 100th tensor changed; the peer
  loads both with ``torch.load(mmap=True)`` and runs ``torch.equal`` and max |a - b| per key.

``--baseline DIR`` also runs ``python -m tensorscope`` from another checkout (DIR) on the
finetune, verdicts and many cases: the before/after figures of a change.

Inputs: two ~2 GB float16 state dicts of 500 tensors (480 of 1024x2048 and 20 of 2048) that differ
in 4 tensors (a slice moved by 1e-3), as ``.pt`` (torch.save) and ``.safetensors``, plus a byte copy
of A for the identical case, and (``.pt`` only) a C where every tensor differs. Generated once (needs torch and safetensors) and kept in
``benchmarks/.cache/`` (gitignored).

Each measurement is a whole process: wall time, CPU time (user + system of every thread) and peak
RSS (``ru_maxrss``) of that child alone, through ``os.wait4``, the median of ``--runs`` runs after
one warm-up run that fills the page cache (and writes the bytecode, as an installed package has:
`CHILD_ENV`). On a shared machine the CPU times are the steadier
figures. Peers:

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


TORCH_MANY = """
import sys, torch
a = torch.load(sys.argv[1], mmap=True, weights_only=True)
b = torch.load(sys.argv[2], mmap=True, weights_only=True)
n = sum(1 for k in a if not torch.equal(a[k], b[k]))
m = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
print(n, m)
"""

# CPU time per element pair of the fused pass (`diffing._Accumulator.add`) on pieces already in
# memory, one thread, per dtype; then each numpy call of the float16 pass timed on its own, in
# the pass's order (the per-element cost breakdown); then `diff_models` in-process on the
# fine-tune pair (argv[1], argv[2]): wall, CPU of every thread, CPU per element pair.
KERNEL = """
import json, math, resource, sys, time
import ml_dtypes, numpy as np
import tensorscope
from tensorscope import diffing
diffing._blas_single_thread()
tick = time.thread_time_ns
rng = np.random.default_rng(0)
n = 1 << 22
out = {"per_dtype": {}, "float16_breakdown": {}}
K = diffing._KERNEL
routes = (["avx512"] if K is not None and K.AVX512 else []) + (["portable"] if K else ["numpy"])
for dt in (np.float16, ml_dtypes.bfloat16, np.float32, ml_dtypes.float8_e4m3fn, np.int8):
    base = rng.standard_normal(n) * (20 if dt is np.int8 else 0.02)
    a = base.astype(dt)
    b = (base + rng.standard_normal(n) * (2 if dt is np.int8 else 1e-3)).astype(dt)
    for route in routes:
        if K is not None:
            K.avx512(route == "avx512")
        for elems in sorted({diffing.FLOAT_ELEMS, diffing._pool_elems()}):
            acc = diffing._Accumulator(1e-8, 1e-5, elems, False)
            best = math.inf
            for _ in range(3):
                t0 = tick()
                for i in range(0, n, elems):
                    acc.add(a[i:i + elems], b[i:i + elems])
                best = min(best, (tick() - t0) / n)
            out["per_dtype"][f"{np.dtype(dt).name} x {elems} ({route})"] = round(best, 3)
if K is not None:
    K.avx512(True)
k = diffing._pool_elems()
base = rng.standard_normal(k) * 0.02
pa, pb = base.astype(np.float16), (base + rng.standard_normal(k) * 1e-3).astype(np.float16)
x, y, d, t, flag, u = diffing._buffers(k, False)
steps = [("float16 -> float64, A", lambda: diffing._half_fast(pa, x, u)),
         ("float16 -> float64, B", lambda: diffing._half_fast(pb, y, u)),
         ("d = a - b", lambda: np.subtract(x, y, d)), ("d.d", lambda: np.dot(d, d)),
         ("a.a", lambda: np.dot(x, x)), ("b.b", lambda: np.dot(y, y)),
         ("a.b", lambda: np.dot(x, y)),
         ("|d|", lambda: np.absolute(d, d)), ("max |d|", lambda: np.maximum.reduce(d)),
         ("sum |d|", lambda: np.add.reduce(d)), ("|b|", lambda: np.absolute(y, t)),
         ("|d| / |b|", lambda: np.divide(d, t, x)), ("max ratio", lambda: np.fmax.reduce(x)),
         ("rtol*|b|", lambda: np.multiply(t, 1e-5, t)), ("+ atol", lambda: np.add(t, 1e-8, t)),
         ("|d| > tol", lambda: np.greater(d, t, flag)), ("count", lambda: np.count_nonzero(flag))]
cost = dict.fromkeys([name for name, _ in steps], math.inf)
with np.errstate(all="ignore"):
    for _ in range(30):
        for name, f in steps:
            t0 = tick()
            f()
            cost[name] = min(cost[name], (tick() - t0) / k)
out["float16_breakdown"] = {name: round(c, 3) for name, c in cost.items()}
out["float16_breakdown_total"] = round(sum(cost.values()), 3)
# the rank test's stage 1 on a fine-tune's sample (full rank: rejected), one core, in cache
from tensorscope import lowrank
shape = (LLAMA_INTER, LLAMA_HIDDEN)
rows, cols = lowrank.sample_index(shape)
sa = (rng.standard_normal((rows.size, cols.size)) * 0.02).astype(np.float16)
sb = (sa + rng.standard_normal(sa.shape) * 1e-3).astype(np.float16)
unit = lowrank.rounding_unit("float16")
best = math.inf
for _ in range(5):
    t0 = tick()
    for _ in range(100):
        lowrank.rank_of_sample(shape, unit, (sa, sb))
    best = min(best, (tick() - t0) / 100 / 1e6)
out["rank_test_ms"] = round(best, 3)
if len(sys.argv) > 2:
    with tensorscope.open(sys.argv[1]) as ma, tensorscope.open(sys.argv[2]) as mb:
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        res = diffing.diff_models(ma, mb)
        w1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    pairs = sum(e.values.numel for e in res.entries if e.values is not None)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    out["diff_models"] = {"wall_s": round(w1 - w0, 2), "cpu_s": round(cpu, 2),
                          "sys_s": round(r1.ru_stime - r0.ru_stime, 2),
                          "ns_per_pair": round(cpu / pairs * 1e9, 2), "pairs": pairs}
print(json.dumps(out))
"""

LLAMA = {"hidden": 1280, "inter": 3456, "layers": 48, "vocab": 32000}
KERNEL = f"LLAMA_HIDDEN, LLAMA_INTER = {LLAMA['hidden']}, {LLAMA['inter']}\n" + KERNEL
MANY = 100_000


def generate_finetune(cache: Path) -> tuple[Path, Path]:
    """The Llama-shaped base and its "fine-tune" (every tensor + N(0, 1e-3))."""
    a, b = cache / "llama_a.pt", cache / "llama_b.pt"
    if a.exists() and b.exists():
        return a, b
    import torch
    print(f"generating the ~2 GB Llama-shaped pair in {cache} (once) ...", file=sys.stderr)
    cache.mkdir(parents=True, exist_ok=True)
    h, i_, n_layers, v = (LLAMA[k] for k in ("hidden", "inter", "layers", "vocab"))
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(shape, generator=g, dtype=torch.float16) * 0.02

    sd = {"model.embed_tokens.weight": w(v, h)}
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        for n in ("q", "k", "v", "o"):
            sd[p + f"self_attn.{n}_proj.weight"] = w(h, h)
        sd[p + "self_attn.rotary_emb.inv_freq"] = (1.0 / 10000 ** (torch.arange(0, 128, 2) / 128)).half()
        sd[p + "mlp.gate_proj.weight"] = w(i_, h)
        sd[p + "mlp.up_proj.weight"] = w(i_, h)
        sd[p + "mlp.down_proj.weight"] = w(h, i_)
        sd[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.float16)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.float16)
    sd["model.norm.weight"] = torch.ones(h, dtype=torch.float16)
    sd["lm_head.weight"] = w(v, h)
    torch.save(sd, a)
    for k in sd:
        sd[k] = sd[k] + torch.randn(sd[k].shape, generator=g, dtype=torch.float16) * 1e-3
    torch.save(sd, b)
    return a, b


def generate_lora(cache: Path) -> tuple[Path, Path]:
    """The fine-tune base and a LoRA merge of it: rank 16 on q_proj and v_proj of every layer."""
    a, _ = generate_finetune(cache)
    b = cache / "llama_lora16.pt"
    if b.exists():
        return a, b
    import torch
    print(f"generating the LoRA pair in {cache} (once) ...", file=sys.stderr)
    sd = torch.load(a, mmap=True, weights_only=True)
    g = torch.Generator().manual_seed(1)
    out = {}
    for k, v in sd.items():
        if k.endswith(("q_proj.weight", "v_proj.weight")):
            u = torch.randn(v.shape[0], 16, generator=g) * 0.01
            w = torch.randn(16, v.shape[1], generator=g) * 0.01
            v = (v.float() + u @ w).half()   # merged as peft's merge_and_unload does, then cast
        out[k] = v
    torch.save(out, b)
    return a, b


def generate_many(cache: Path) -> tuple[Path, Path]:
    """100,000 bf16 [4, 4] experts; B changes every 100th tensor."""
    a, b = cache / f"moe{MANY}_a.pt", cache / f"moe{MANY}_b.pt"
    if a.exists() and b.exists():
        return a, b
    import torch
    cache.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    sd: dict = {}
    layer = 0
    while len(sd) < MANY:
        for e in range(256):
            for p in ("gate", "up", "down"):
                if len(sd) < MANY:
                    sd[f"model.layers.{layer}.mlp.experts.{e}.{p}_proj.weight"] = \
                        torch.randn((4, 4), generator=g).to(torch.bfloat16)
        layer += 1
    torch.save(sd, a)
    for j, k in enumerate(sd):
        if j % 100 == 7:
            sd[k] = sd[k] + 0.5
    torch.save(sd, b)
    return a, b


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


# The children may write bytecode even where the session sets PYTHONDONTWRITEBYTECODE, into a
# tree of their own under the cache (PYTHONPYCACHEPREFIX: no file lands in a checkout, the
# --baseline one included): the warm-up run compiles tensorscope once, as `pip install` does for
# an installed package (and did for torch and numpy), instead of every measured run compiling
# every module from source again (~0.07 s of start-up, measured).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(HERE / ".cache" / "pycache")


def measure(argv: list[str], cwd: str | None = None) -> tuple[float, float, int, float]:
    """Wall seconds, peak RSS in MB, exit status, CPU seconds (user + system, every thread) of one
    child process."""
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(argv, stdout=null, stderr=subprocess.PIPE, cwd=cwd,
                                env=CHILD_ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{argv} failed ({code}): {err}")
    return wall, usage.ru_maxrss / 1024, code, usage.ru_utime + usage.ru_stime


def bench(label: str, argv: list[str], runs: int) -> dict:
    measure(argv)  # warm-up: page cache, bytecode
    results = [measure(argv) for _ in range(runs)]
    wall = statistics.median(r[0] for r in results)
    rss = statistics.median(r[1] for r in results)
    return {"label": label, "wall_s": wall, "rss_mb": rss, "exit": results[0][2],
            "cpu_s": statistics.median(r[3] for r in results)}


def bench_round(commands: dict[str, tuple[list[str], str | None]], runs: int) -> dict:
    """The commands measured in turn, round after round (each round measures every command once,
    so a load change on the shared machine hits all of them alike); medians per command."""
    for argv, cwd in commands.values():
        measure(argv, cwd)  # warm-up: page cache, bytecode
    got: dict[str, list] = {k: [] for k in commands}
    for _ in range(runs):
        for k, (argv, cwd) in commands.items():
            got[k].append(measure(argv, cwd))
    return {k: {"label": k, "wall_s": statistics.median(r[0] for r in v),
                "rss_mb": statistics.median(r[1] for r in v), "exit": v[0][2],
                "cpu_s": statistics.median(r[3] for r in v),
                "walls": [round(r[0], 2) for r in v]} for k, v in got.items()}


def issue_cases(args, py: str) -> list[tuple[str, dict]]:
    """The fine-tune pair (every tensor differs) and the 100,000-tensor checkpoint."""
    out = []
    base = os.path.abspath(args.baseline) if args.baseline else None
    me = [py, "-m", "tensorscope"]
    if "finetune" in args.cases:
        a, b = map(str, generate_finetune(args.cache))
        cmds = {"tensorscope diff --json": (me + ["diff", a, b, "--json"], None),
                "torch mmap + max|a-b|": ([py, "-c", TORCH_PT, a, b], None),
                "read-once floor (cat A B)": (["sh", "-c", f"cat '{a}' '{b}' > /dev/null"], None)}
        if base:
            cmds["before (baseline checkout)"] = (me + ["diff", a, b, "--json"], base)
        size = os.path.getsize(a) / 1e9
        out.append((f"fine-tune pair, 2 x {size:.2f} GB fp16, all 483 tensors differ",
                    bench_round(cmds, args.runs)))
    if "verdicts" in args.cases:
        floor_label = "read-once floor (cat A B)"
        for label, (a, b) in (("fine-tune pair, all 483 tensors differ",
                               generate_finetune(args.cache)),
                              ("LoRA pair, rank 16 on q/v of 48 layers", generate_lora(args.cache))):
            a, b = str(a), str(b)
            cmds = {"tensorscope diff --json": (me + ["diff", a, b, "--json"], None),
                    "tensorscope diff --json --no-verdicts":
                        (me + ["diff", a, b, "--json", "--no-verdicts"], None),
                    floor_label: (["sh", "-c", f"cat '{a}' '{b}' > /dev/null"], None)}
            if base:
                cmds["before (baseline checkout) diff --json"] = (me + ["diff", a, b, "--json"],
                                                                  base)
            out.append((f"verdicts: {label}", bench_round(cmds, args.runs)))
    if "many" in args.cases:
        a, b = map(str, generate_many(args.cache))
        for case, other in (("identical (A A)", a), ("1,000 of 100,000 changed", b)):
            cmds = {"tensorscope diff --json": (me + ["diff", a, other, "--json"], None),
                    "torch mmap + equal/max per key": ([py, "-c", TORCH_MANY, a, other], None)}
            if base:
                cmds["before (baseline checkout)"] = (me + ["diff", a, other, "--json"], base)
            out.append((f"100,000-tensor torch zip, {case}", bench_round(cmds, args.runs)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--formats", nargs="+", default=["pt", "safetensors"],
                    choices=["pt", "safetensors"])
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--cases", nargs="+", default=["pair", "finetune", "many"],
                    choices=["pair", "finetune", "many", "kernel", "verdicts"])
    ap.add_argument("--baseline", metavar="DIR",
                    help="also run `python -m tensorscope` from this checkout (before/after)")
    args = ap.parse_args(argv)
    py = sys.executable
    rows = []
    if set(args.cases) & {"finetune", "many", "verdicts"}:
        for label, res in issue_cases(args, py):
            print(f"\n{label}")
            ours = res["tensorscope diff --json"]
            for k, r in res.items():
                ratio = r["wall_s"] / ours["wall_s"]
                cpu = r["cpu_s"] / ours["cpu_s"]
                print(f"  {k:32} {r['wall_s']:7.2f} s wall {r['cpu_s']:7.2f} s CPU "
                      f"{r['rss_mb']:7.0f} MB  (x{ratio:.2f} of tensorscope's wall, x{cpu:.2f} of "
                      f"its CPU; runs {r['walls']})", flush=True)
                rows.append((label, r))
    if "kernel" in args.cases:
        a, b = map(str, generate_finetune(args.cache))
        import json
        got = json.loads(subprocess.run([py, "-c", KERNEL, a, b], check=True,
                                        stdout=subprocess.PIPE, text=True).stdout)
        print(f"\nfused pass, CPU ns per element pair, one thread, pieces in memory "
              f"(load average {os.getloadavg()[0]:.1f}):")
        for k, v in got["per_dtype"].items():
            print(f"  {k:40} {v:6.2f} ns")
        print("float16 pass, each numpy call on its own (ns per element pair):")
        for k, v in got["float16_breakdown"].items():
            print(f"  {k:28} {v:6.3f} ns")
        print(f"  {'sum':28} {got['float16_breakdown_total']:6.3f} ns")
        print(f"rank test, stage 1 on one fine-tune sample (160 x 192 float16), one core: "
              f"{got['rank_test_ms']:.3f} ms")
        dm = got.get("diff_models")
        if dm:
            print(f"diff_models in-process on the fine-tune pair: {dm['wall_s']} s wall, "
                  f"{dm['cpu_s']} s CPU ({dm['sys_s']} s system), {dm['ns_per_pair']} ns CPU "
                  f"per element pair over {dm['pairs']:,} pairs")
    if "pair" in args.cases:
        generate(args.cache)
    for fmt in (args.formats if "pair" in args.cases else []):
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
    print("| input | tool | wall (median) | CPU (median) | peak RSS |")
    print("|---|---|---:|---:|---:|")
    for case, r in rows:
        print(f"| {case} | {r['label']} | {r['wall_s']:.2f} s | {r['cpu_s']:.2f} s "
              f"| {r['rss_mb']:.0f} MB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
