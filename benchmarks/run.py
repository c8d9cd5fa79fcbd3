"""Measure tensorscope against the tools people use instead, at LLM scale, and write BENCHMARKS.md.

    python benchmarks/run.py                     # everything, 3 runs each, writes BENCHMARKS.md
    python benchmarks/run.py --only inspect scale --runs 5
    python benchmarks/run.py --quick             # CI smoke test: tiny inputs, 1 run, < 1 minute

Inputs are generated once into ``benchmarks/.cache/`` (gitignored; ``--quick`` uses
``benchmarks/.cache/quick/``) by child processes (see ``benchmarks/common.py``):

- a ~2 GB float16 state dict of 500 tensors as torch zip, legacy torch (non-zip) and safetensors,
  and as ONNX (~1.9 GB: protobuf's 2 GiB limit) with external data and embedded;
- a second state dict differing in 4 tensors, and a byte copy of the first (diff);
- a 10,000-tensor checkpoint (torch zip and safetensors);
- the same 500-tensor model at 2, 20 and 100 GB as sparse files (tensor data are holes): a
  torch zip written by ``torch.save`` with ``skip_data``, and Hugging Face sharded safetensors
  (5 GB shards + index). They show that listing costs do not grow with the data.

Every case is a whole process (``os.wait4``: wall time and that child's peak RSS), one warm-up
run (page cache warm), then the median of ``--runs`` runs. tensorscope runs as its CLI
(``python -m tensorscope inspect --json PATH > /dev/null``) or, where the CLI has no equivalent
(reading one tensor), as a ``python -c`` script on the library; peers as small ``python -c``
scripts doing the equivalent work, and picklescan / modelscan as their own commands when they
are installed (on PATH, next to this Python, or in a venv at ``benchmarks/.cache/peers``).
A tensorscope command that does not exist yet, or a peer that is not installed, gives a
"not available" row instead of failing the run.

Cases (``--only``): inspect, scale, read, scan, diff, convert, tui, pertensor (every command on
1k / 10k / 100k / 1M tiny tensors, `bench_scale.py`; ``--skip-1m`` leaves out the 1M listing),
remote (inspect and scan of the 2 GB models over HTTP from a local server with 20 ms per request,
`bench_remote.py`) and fleet (``scan`` of a folder of 1,000 small model files at ``--jobs 1``,
``--jobs 2`` and ``--dask local``, and 300 of them as URLs, `bench_remote.py`) and stats
(``inspect --stats`` of the 2 GB models against the read-once floor, ``cat``, and a numpy / torch
float64 loop; the sparse 2 and 20 GB torch zips for flatness, `bench_stats.py`).
Output: the results table with the machine it ran on, in BENCHMARKS.md (``--out``), and the raw
samples in ``<cache>/results.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402  (the benchmarks folder is not a package)
from common import CACHE, SHARD_BYTES, Result, measure, run_once  # noqa: E402

ROOT = HERE.parent
PY = sys.executable
TS = [PY, "-m", "tensorscope"]
CASES = ("inspect", "scale", "read", "scan", "diff", "convert", "tui", "pertensor", "remote",
         "fleet", "stats")
REMOTE_DELAY = 0.02                     # seconds added to every request of the local HTTP server
READ_NAME = "layer.250.weight"          # a tensor in the middle of the 2 GB state dict
ONNX_READ_NAME = "model.layers.25.mlp.w0.weight"

# -- peers: what people run instead ---------------------------------------------------------------
TORCH_LIST = """
import sys, torch
sd = torch.load(sys.argv[1], mmap=sys.argv[2] == "mmap", weights_only=True)
rows = [(k, str(v.dtype), tuple(v.shape)) for k, v in sd.items()]
print(len(rows))
"""

ST_LIST = """
import glob, os, sys
from safetensors import safe_open
path = sys.argv[1]
files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
rows = []
for file in files:
    with safe_open(file, framework="np") as f:
        for k in f.keys():
            s = f.get_slice(k)
            rows.append((k, s.get_dtype(), tuple(s.get_shape())))
print(len(rows))
"""

ONNX_LIST = """
import sys, onnx
m = onnx.load(sys.argv[1], load_external_data=sys.argv[2] == "all")
rows = [(t.name, t.data_type, tuple(t.dims)) for t in m.graph.initializer]
print(len(rows))
"""

TS_READ = """
import sys, numpy as np, tensorscope
with tensorscope.open(sys.argv[1]) as m:
    print(float(np.asarray(m.read(sys.argv[2]), dtype=np.float32).sum()))
"""

TORCH_READ = """
import sys, torch
sd = torch.load(sys.argv[1], mmap=sys.argv[3] == "mmap", weights_only=True)
print(float(sd[sys.argv[2]].float().sum()))
"""

ST_READ = """
import sys, numpy as np
from safetensors import safe_open
with safe_open(sys.argv[1], framework="np") as f:
    print(float(f.get_tensor(sys.argv[2]).astype(np.float32).sum()))
"""

ONNX_READ = """
import os, sys, numpy as np, onnx
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor
m = onnx.load(sys.argv[1], load_external_data=False)
t = next(t for t in m.graph.initializer if t.name == sys.argv[2])
load_external_data_for_tensor(t, os.path.dirname(sys.argv[1]))
print(float(numpy_helper.to_array(t).astype(np.float32).sum()))
"""

TORCH_CONVERT = """
import sys, torch
from safetensors.torch import save_file
sd = torch.load(sys.argv[1], weights_only=True, mmap=sys.argv[3] == "mmap")
save_file(sd, sys.argv[2], metadata={"format": "pt"})
"""


# What each side of a case does, printed under its table (so that a ratio is read fairly).
CASE_NOTES = {
    "inspect": "Both sides list every tensor (name, dtype, shape) and must agree on the count. "
               "tensorscope also writes the full JSON listing (offsets, strides, summary) to /dev/null; "
               "safetensors' own header is JSON, so `safe_open` has nothing left to do and wins on "
               "the interpreter start alone (tensorscope imports numpy).",
    "scale": "The same 500 tensors with more bytes each: only the tensor data grow. \"vs smallest\" "
             "divides tensorscope's time and peak RSS by those on the ~2 GB file: about 1x means the "
             "cost does not depend on the data size (differences in time are noise). "
             "`torch.load(mmap=True)` maps the whole file copy-on-write (MAP_PRIVATE): under Linux's "
             "default overcommit heuristic a file much larger than RAM can fail with \"unable to mmap "
             "... Cannot allocate memory\", depending on the memory free at that moment.",
    "read": "Open the file, read one tensor into memory as float32 and sum it. The CLI has no "
            "read-one-tensor command, so tensorscope runs as a `python -c` script on the library.",
    "scan": "picklescan and modelscan look at the pickle's imports only; `tensorscope scan` also "
            "runs the pickle through its symbolic VM, checks the zip structure (duplicate names, "
            "overlaps, local/central header disagreements) and the file's other records.",
    "diff": "The peer loads both files (mmap) and computes max |a - b| per tensor; tensorscope "
            "compares every tensor (bytes first, then the full statistics for those that differ: "
            "max/mean abs difference, relative difference, RMS, cosine, count outside tolerance). "
            "Its exit code is checked: 1 when 4 tensors differ, 0 for identical copies.",
    "stats": "`inspect --stats` reads every value once (min, max, mean, std, NaN/Inf/zero counts "
             "in float64) and must list as many tensors as the peer read. The read-once floor is "
             "`cat` of the file to /dev/null (warm page cache); the numpy/torch peers cast each "
             "tensor to float64 and reduce it. The sparse rows read holes (zeros): their note "
             "divides time and peak RSS by the ~2 GB sparse file's.",
    "convert": "tensorscope also scans the input first, hashes it (sha256 in `__metadata__`), "
               "streams the tensors, fsyncs and renames the output; the peers do none of that.",
}

# -- results --------------------------------------------------------------------------------------
@dataclass
class Row:
    """One line of a table: tensorscope on an input, against one peer (or none)."""
    case: str
    input: str
    ours_label: str
    ours: Result | None
    peer_label: str = "-"
    peer: Result | None = None
    note: str = ""
    headline: str = ""          # non-empty: quoted in the headline list with this wording
    extra: dict = field(default_factory=dict)


def _check_counts(ours: Result, peer: Result | None) -> None:
    """Both sides must have listed the same number of tensors; a mismatch fails the row."""
    if not (ours.ok and peer and peer.ok):
        return
    try:
        n_ours = json.loads(ours.runs[-1].out)["summary"]["tensors"]
        n_peer = int(peer.runs[-1].out.split()[-1])
    except (ValueError, KeyError, IndexError) as e:
        ours.error = f"could not read the tensor counts: {e!r}"
        return
    if n_ours != n_peer:
        ours.error = f"listed {n_ours} tensors, the peer {n_peer}"


def _na(reason: str) -> Result:
    return Result(error=reason)


def _fmt_wall(r: Result | None) -> str:
    if r is None:
        return "-"
    return f"{r.wall:.2f} s" if r.ok else r.error


def _fmt_rss(r: Result | None) -> str:
    if r is None or not r.ok:
        return "-"
    return f"{r.rss / 2**20:,.0f} MiB"


def _ratio(peer: Result | None, ours: Result | None, attr: str) -> str:
    if not (peer and ours and peer.ok and ours.ok) or not getattr(ours, attr):
        return "-"
    return f"{getattr(peer, attr) / getattr(ours, attr):.1f}x"


def _compare(peer: Result, ours: Result, attr: str, better: str, worse: str) -> str:
    """"3.2x faster" / "1.5x slower" (peer / tensorscope, or its inverse)."""
    a, b = getattr(peer, attr), getattr(ours, attr)
    if not a or not b:
        return "-"
    return f"{a / b:.1f}x {better}" if a >= b else f"{b / a:.1f}x {worse}"


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


# -- the run --------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.cache = CACHE / "quick" if args.quick else CACHE
        self.runs = args.runs
        self.rows: list[Row] = []
        self.notes: list[str] = []
        self._available: dict[str, bool] = {}
        self.load = [os.getloadavg()[0], 0.0]

    # availability
    def has_command(self, name: str) -> bool:
        if name not in self._available:
            self._available[name] = run_once(TS + [name, "--help"]).code == 0
        return self._available[name]

    def tool(self, name: str) -> str | None:
        for folder in (Path(PY).parent, CACHE / "peers" / "bin"):
            if (folder / name).exists():
                return str(folder / name)
        return shutil.which(name)

    def tool_version(self, name: str) -> str:
        """The installed version of a peer tool, read from its venv's metadata (no import)."""
        exe = self.tool(name)
        if not exe:
            return "not installed"
        venv = Path(exe).parent.parent
        for info in sorted(venv.glob(f"lib/python*/site-packages/{name}-*.dist-info")):
            where = os.path.relpath(exe, ROOT) if exe.startswith(str(ROOT)) else exe
            return f"{info.name[len(name) + 1:-len('.dist-info')]} (`{where}`)"
        return exe

    def m(self, argv, **kw) -> Result:
        r = measure(argv, self.runs, warmup=not self.quick, **kw)
        tag = f"{r.wall:.2f} s {r.rss / 2**20:.0f} MiB" if r.ok else r.error
        shown = ["python -c ..." if "\n" in a else Path(a).name if os.sep in a else a for a in argv]
        print(f"  {' '.join(shown[:7])}: {tag}", flush=True)
        return r

    def ours(self, command: str, argv: list[str], **kw) -> Result:
        if not self.has_command(command):
            return _na(f"not available: `tensorscope {command}` is missing")
        return self.m(TS + argv, **kw)

    # inputs
    def paths(self) -> dict[str, Path]:
        c = self.cache
        return {"pt": c / "diff" / "a.pt", "pt_b": c / "diff" / "b.pt", "pt_same": c / "diff" / "a_copy.pt",
                "st": c / "diff" / "a.safetensors", "st_b": c / "diff" / "b.safetensors",
                "legacy": c / "legacy" / "a_legacy.pt",
                "onnx_ext": c / "onnx" / "external" / "model.onnx",
                "onnx_emb": c / "onnx" / "embedded.onnx",
                "many_pt": c / "tui" / f"model_{self.many}.pt",
                "many_st": c / "tui" / f"model_{self.many}.safetensors"}

    @property
    def many(self) -> int:
        return 200 if self.quick else 10_000

    @property
    def sparse_sizes(self) -> list[tuple[str, int, int]]:
        # (label, rows, cols) of 500 float16 tensors: ~2.1, ~21 and ~105 GB
        if self.quick:
            return [("tiny", 16, 16), ("small", 64, 64)]
        return [("2GB", 1024, 2048), ("20GB", 4096, 5120), ("100GB", 10240, 10240)]

    def generate(self, cases: list[str]) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        print(f"inputs in {self.cache} (generated once)", flush=True)
        calls = []
        if set(cases) & {"inspect", "read", "scan", "diff", "convert", "tui", "remote", "stats"}:
            calls.append(("gen_state_dicts", (str(self.cache), self.quick)))
        if set(cases) & {"inspect", "read", "remote"}:
            calls.append(("gen_onnx", (str(self.cache), self.quick)))
        if set(cases) & {"inspect", "tui"}:
            calls.append(("gen_many", (str(self.cache), self.many)))
        if "stats" in cases and "scale" not in cases:
            n = 20 if self.quick else 500
            for label, rows, cols in self.sparse_sizes[:2]:
                calls.append(("gen_sparse", (str(self.cache / "sparse" / label), n, rows, cols,
                                             20_000 if self.quick else SHARD_BYTES)))
        if "scale" in cases:
            n = 20 if self.quick else 500
            shard = 20_000 if self.quick else SHARD_BYTES
            for label, rows, cols in self.sparse_sizes:
                calls.append(("gen_sparse", (str(self.cache / "sparse" / label), n, rows, cols, shard)))
        common.generate_in_child(calls)

    # cases
    def case_inspect(self) -> None:
        p = self.paths()
        items = [
            ("torch zip", p["pt"], [("torch.load(mmap=True) + names/shapes", [PY, "-c", TORCH_LIST, "{}", "mmap"])], True),
            ("legacy torch (non-zip)", p["legacy"], [("torch.load (mmap needs a zip) + names/shapes", [PY, "-c", TORCH_LIST, "{}", "-"])], True),
            ("safetensors", p["st"], [("safe_open + keys/get_slice shapes", [PY, "-c", ST_LIST, "{}"])], True),
            ("ONNX, external data", p["onnx_ext"], [("onnx.load(load_external_data=False)", [PY, "-c", ONNX_LIST, "{}", "none"]),
                                                     ("onnx.load", [PY, "-c", ONNX_LIST, "{}", "all"])], True),
            ("ONNX, embedded", p["onnx_emb"], [("onnx.load", [PY, "-c", ONNX_LIST, "{}", "all"])], False),
            (f"{self.many:,}-tensor torch zip", p["many_pt"], [("torch.load(mmap=True) + names/shapes", [PY, "-c", TORCH_LIST, "{}", "mmap"])], False),
            (f"{self.many:,}-tensor safetensors", p["many_st"], [("safe_open + keys/get_slice shapes", [PY, "-c", ST_LIST, "{}"])], False),
        ]
        for label, path, peers, in_quick in items:
            if self.quick and not in_quick:
                continue
            print(f"inspect {label}", flush=True)
            ours = self.ours("inspect", ["inspect", "--json", str(path)], capture=True)
            size = _size(path.parent if "external" in label else path)
            for peer_label, argv in peers:
                peer = self.m([a.replace("{}", str(path)) for a in argv], capture=True)
                _check_counts(ours, peer)
                headline = label in ("torch zip", "legacy torch (non-zip)", "safetensors") or (
                    "ONNX" in label and peer_label == "onnx.load")
                self.rows.append(Row("inspect", f"{label}, {_gb(size)}", "inspect --json",
                                     ours, peer_label, peer,
                                     headline=f"inspect {_gb(size)} {label} vs {peer_label}"
                                     if headline else ""))

    def case_scale(self) -> None:
        first: dict[str, Result] = {}
        for size_label, _, _ in self.sparse_sizes:
            folder = self.cache / "sparse" / size_label
            for kind, path, peer_label, argv in (
                    ("torch zip", folder / "model.pt", "torch.load(mmap=True) + names/shapes",
                     [PY, "-c", TORCH_LIST, str(folder / "model.pt"), "mmap"]),
                    ("sharded safetensors", folder / "sharded", "safe_open per shard + shapes",
                     [PY, "-c", ST_LIST, str(folder / "sharded")])):
                n_files = len(list(path.glob("*.safetensors"))) if path.is_dir() else 1
                label = f"sparse {kind}, {_gb(_size(path))}" + (f" ({n_files} shards)" if n_files > 1 else "")
                print(f"scale {label}", flush=True)
                ours = self.ours("inspect", ["inspect", "--json", str(path)], capture=True)
                peer = self.m(argv, capture=True) if not (self.quick and kind in first) else None
                _check_counts(ours, peer)
                row = Row("scale", label, "inspect --json", ours, peer_label if peer else "-", peer)
                if kind in first and ours.ok and first[kind].ok:
                    row.note = (f"vs smallest: time {ours.wall / first[kind].wall:.2f}x, "
                                f"RSS {ours.rss / first[kind].rss:.2f}x")
                    if size_label == self.sparse_sizes[-1][0]:
                        row.headline = (f"inspect a {_gb(_size(path))} {kind} vs the same model at "
                                        f"{_gb(_size(self.cache / 'sparse' / self.sparse_sizes[0][0] / path.name))}")
                        row.extra["flat"] = {"wall": ours.wall / first[kind].wall, "rss": ours.rss / first[kind].rss}
                first.setdefault(kind, ours)
                self.rows.append(row)

    def case_stats(self) -> None:
        import bench_stats   # only strings at import time
        p = self.paths()
        cat = lambda path: self.m(bench_stats.CAT + [str(path)], capture=True)   # noqa: E731
        items = [("safetensors", p["st"], "safe_open + float64 min/max/mean/std/isnan (numpy)",
                  bench_stats.ST_STATS),
                 ("torch zip", p["pt"], "torch.load(mmap=True) + float64 min/max/mean/std/isnan",
                  bench_stats.TORCH_STATS)]
        for label, path, peer_label, code in items:
            print(f"stats {label}", flush=True)
            ours = self.ours("inspect", ["inspect", "--stats", "--json", str(path)], capture=True)
            floor = cat(path)
            self.rows.append(Row("stats", f"{label}, {_gb(_size(path))}", "inspect --stats --json", ours,
                                 "cat FILE > /dev/null (read-once floor)", floor,
                                 headline=f"inspect --stats {_gb(_size(path))} {label} vs the read-once floor"))
            peer = self.m([PY, "-c", code, str(path)], capture=True)
            _check_counts(ours, peer)
            self.rows.append(Row("stats", f"{label}, {_gb(_size(path))}", "inspect --stats --json", ours,
                                 peer_label, peer))
        first = None
        for size_label, _, _ in self.sparse_sizes[:2]:
            path = self.cache / "sparse" / size_label / "model.pt"
            print(f"stats sparse {size_label}", flush=True)
            ours = self.ours("inspect", ["inspect", "--stats", "--json", str(path)], capture=True)
            row = Row("stats", f"sparse torch zip, {_gb(_size(path))}", "inspect --stats --json", ours,
                      "cat FILE > /dev/null (read-once floor)", cat(path))
            if first is not None and ours.ok and first.ok:
                row.note = f"vs smallest: time {ours.wall / first.wall:.2f}x, RSS {ours.rss / first.rss:.2f}x"
                row.headline = (f"inspect --stats of a {_gb(_size(path))} sparse torch zip vs the "
                                f"read-once floor")
            first = first or ours
            self.rows.append(row)

    def case_read(self) -> None:
        p = self.paths()
        items = [
            ("torch zip", p["pt"], READ_NAME, "torch.load(mmap=True)[name]", [PY, "-c", TORCH_READ, str(p["pt"]), READ_NAME, "mmap"], True),
            ("torch legacy", p["legacy"], READ_NAME, "torch.load()[name] (no mmap for legacy)", [PY, "-c", TORCH_READ, str(p["legacy"]), READ_NAME, "-"], False),
            ("safetensors", p["st"], READ_NAME, "safe_open().get_tensor(name)", [PY, "-c", ST_READ, str(p["st"]), READ_NAME], True),
            ("ONNX, external data", p["onnx_ext"], ONNX_READ_NAME, "onnx.load(no data) + load_external_data_for_tensor",
             [PY, "-c", ONNX_READ, str(p["onnx_ext"]), ONNX_READ_NAME], False),
        ]
        for label, path, name, peer_label, argv, in_quick in items:
            if self.quick and not in_quick:
                continue
            print(f"read {label}", flush=True)
            ours = self.m([PY, "-c", TS_READ, str(path), name])
            peer = self.m(argv)
            size = _size(path.parent if "external" in label else path)
            shape = "[4, 8]" if self.quick else ("[1024, 1856]" if "ONNX" in label else "[1024, 2048]")
            self.rows.append(Row("read", f"{label}, {_gb(size)}: one {shape} tensor, sum",
                                 "tensorscope.open().read(name)", ours, peer_label, peer,
                                 headline=f"read one tensor of a {_gb(size)} {label} vs {peer_label}"
                                 if label in ("torch zip", "safetensors") else ""))

    def case_scan(self) -> None:
        p = self.paths()
        for label, path in (("torch zip", p["pt"]), ("torch legacy", p["legacy"])):
            if self.quick and label != "torch zip":
                continue
            print(f"scan {label}", flush=True)
            ours = self.ours("scan", ["scan", "--json", str(path)], ok_codes=(0, 1))
            for tool in ("picklescan", "modelscan"):
                exe = self.tool(tool)
                peer = self.m([exe, "-p", str(path)], ok_codes=(0, 1)) if exe else _na(
                    f"not installed (`pip install {tool}` failed or was not run)")
                self.rows.append(Row("scan", f"{label}, {_gb(_size(path))}", "scan --json", ours,
                                     f"{tool} -p", peer,
                                     headline=f"scan {_gb(_size(path))} {label} vs {tool}"
                                     if label == "torch zip" else ""))

    def case_diff(self) -> None:
        import bench_diff   # only strings and constants at import time
        p = self.paths()
        items = [("torch zip, 4 tensors differ", p["pt"], p["pt_b"], bench_diff.TORCH_PT, True),
                 ("safetensors, 4 tensors differ", p["st"], p["st_b"], bench_diff.TORCH_ST, False),
                 ("torch zip, identical copies", p["pt"], p["pt_same"], bench_diff.TORCH_PT, False)]
        for label, a, b, peer_code, in_quick in items:
            if self.quick and not in_quick:
                continue
            print(f"diff {label}", flush=True)
            ours = self.ours("diff", ["diff", "--json", str(a), str(b)], ok_codes=(0, 1))
            want = 0 if "identical" in label else 1
            if ours.ok and ours.code != want:
                ours.error = f"exit {ours.code}, expected {want}"
            peer = self.m([PY, "-c", peer_code, str(a), str(b)])
            peer_label = ("torch mmap: max abs(a - b) per tensor" if "torch" in label
                          else "safe_open get_tensor: max abs(a - b) per tensor")
            self.rows.append(Row("diff", f"{label}, 2 x {_gb(_size(a))}", "diff --json", ours,
                                 peer_label, peer,
                                 headline=f"diff 2 x {_gb(_size(a))} {label} vs {peer_label}"
                                 if not self.quick or "torch" in label else ""))

    def case_convert(self) -> None:
        p = self.paths()
        out_dir = self.cache / "convert_out"
        out_dir.mkdir(exist_ok=True)
        ours_out, peer_out = out_dir / "ours.safetensors", out_dir / "theirs.safetensors"

        def clean():
            for f in out_dir.iterdir():
                f.unlink()
        print("convert torch zip -> safetensors", flush=True)
        ours = self.ours("convert", ["convert", str(p["pt"]), str(ours_out), "--force"], before=clean,
                         ok_codes=(0,))
        for peer_label, mode in (("torch.load + save_file", "-"),
                                 ("torch.load(mmap=True) + save_file", "mmap")):
            if self.quick and mode == "mmap":
                continue
            peer = self.m([PY, "-c", TORCH_CONVERT, str(p["pt"]), str(peer_out), mode], before=clean,
                          ok_codes=(0,))
            self.rows.append(Row("convert", f"torch zip -> safetensors, {_gb(_size(p['pt']))}",
                                 "convert IN OUT --force", ours, peer_label, peer,
                                 headline=f"convert {_gb(_size(p['pt']))} torch zip to safetensors vs {peer_label}"
                                 if mode == "-" else ""))
        clean()

    def case_pertensor(self) -> None:
        import bench_scale
        sizes = [100, 300] if self.quick else [1_000, 10_000, 100_000] + (
            [] if self.args.skip_1m else [1_000_000])
        print("pertensor (cost per tensor)", flush=True)
        self.pertensor = bench_scale.run(sizes, self.runs, root=self.cache / "scale",
                                         commands={"inspect --json"} if self.quick else None)

    def case_remote(self) -> None:
        import bench_remote   # the driver stays free of torch/numpy: children do the work
        print("remote (inspect / scan over HTTP)", flush=True)
        self.remote = bench_remote.run_remote(str(self.cache), REMOTE_DELAY, self.runs)

    def case_fleet(self) -> None:
        import bench_remote
        print("fleet (scan --jobs / --dask)", flush=True)
        folder = bench_remote.prepare(str(self.cache), self.quick, 40 if self.quick else 1000,
                                      remote=False)
        self.fleet = bench_remote.run_fleet(folder, self.runs, REMOTE_DELAY,
                                            remote_files=40 if self.quick else 300)

    def case_tui(self) -> None:
        import bench_tui   # only strings and constants at import time
        p = self.paths()
        ok = run_once([PY, "-c", "import tensorscope.tui.app"]).code == 0
        env = {**os.environ, "TEXTUAL_ANIMATIONS": "none"}
        items = [(f"{self.many:,}-tensor safetensors", p["many_st"], True),
                 (f"{self.many:,}-tensor torch zip", p["many_pt"], False),
                 ("torch zip, 500 tensors", p["pt"], False)]
        if not self.quick:  # issue 29: first screen within 1 s at 100,000 tensors, 3 s at 1,000,000
            items.append(("100,000-tensor MoE, 10 safetensors shards",
                          bench_tui.generate_moe(100_000, shards=10), False))
            items.append(("1,000,000-tensor MoE, 20 safetensors shards",
                          bench_tui.generate_moe(1_000_000, shards=20), False))
        for label, path, in_quick in items:
            if self.quick and not in_quick:
                continue
            print(f"tui {label}", flush=True)
            if not ok:
                ours = _na("not available: `tensorscope.tui.app` does not import")
            else:
                ours = self.m([PY, "-c", bench_tui.CHILD, str(path)], env=env, capture=True, ok_codes=(0,))
            row = Row("tui", f"{label}, {_gb(_size(path))}", "first full screen (headless, 120x40)", ours)
            if ours.ok:
                reports = [json.loads(s.out.strip().splitlines()[-1]) for s in ours.runs]
                row.extra["ready"] = statistics.median(r["ready_s"] for r in reports)
                row.extra["import"] = statistics.median(r["import_s"] for r in reports)
                row.extra["filter"] = statistics.median(r["filter_s"] for r in reports)
                if all("whole_s" in r for r in reports):  # sharded: the rest streams in behind
                    row.extra["whole"] = statistics.median(r["whole_s"] for r in reports)
                if "10,000" in label and "safetensors" in label:
                    row.headline = f"TUI first screen on a {label}"
            self.rows.append(row)

    # output
    def render(self, info: dict, cases: list[str]) -> str:
        a = self.args
        v = info["versions"]
        lines = ["# Benchmarks", "",
                 "Produced by `python benchmarks/run.py` (" + ("`--quick`: tiny inputs, a smoke test, "
                 "not a measurement" if a.quick else f"median of {a.runs} runs after one warm-up run")
                 + "). Do not edit by hand: rerun the script.", "",
                 "## Machine", "",
                 f"- CPU: {info['cpu']}, {info['cores']} cores; RAM {info['ram'] / 2**30:.1f} GiB; {info['os']}",
                 f"- Python {info['python']}; tensorscope {v['tensorscope']}, torch {v['torch']}, "
                 f"onnx {v['onnx']}, safetensors {v['safetensors']}, numpy {v['numpy']}, textual {v['textual']}",
                 f"- Peers: picklescan {self.tool_version('picklescan')}, modelscan "
                 f"{self.tool_version('modelscan')} (not project dependencies: installed in their own "
                 "venv, `python -m venv benchmarks/.cache/peers && benchmarks/.cache/peers/bin/pip "
                 "install picklescan modelscan`)",
                 f"- Date: {info['date']}",
                 f"- Load average (1 min) at start / end: {self.load[0]:.1f} / {self.load[1]:.1f} "
                 f"on {info['cores']} cores",
                 f"- Cases run: {', '.join(cases)}"]
        lines += [f"- {n}" for n in self.notes]
        lines += ["", "## Method", "",
                  "Each command is a whole process, started by `subprocess` and reaped with `os.wait4`: "
                  "wall time around the process, peak RSS is that child's `ru_maxrss` (a tiny launcher "
                  "spawns each command, so the driver's own memory never leaks into the figure). Interpreter start "
                  "and imports are included on both sides (that is what a user waits for). The page cache "
                  "is warm (one unmeasured run first). tensorscope runs as its CLI with output to "
                  "/dev/null, except *read* (a `python -c` script on the library: the CLI has no "
                  "read-one-tensor command) and *tui* (the app started headless, clock stopped when the "
                  "tensor table and the first tensor's statistics are shown). Peers are `python -c` "
                  "scripts doing the equivalent work (listed in `benchmarks/run.py`), picklescan and "
                  "modelscan their own commands. Ratios are peer / tensorscope: above 1x tensorscope is "
                  "faster or smaller.", "",
                  "Inputs (generated into `benchmarks/.cache/`, never committed): a float16 state dict "
                  "of 500 tensors (480 x [1024, 2048] + 20 x [2048]) as torch zip, legacy torch and "
                  "safetensors; as ONNX 500 x [1024, 1856] (below protobuf's 2 GiB so `onnx.load` can "
                  "read the embedded file); a 10,000-tensor checkpoint of [8, 8] / [8] tensors; and "
                  "500 float16 tensors at ~2, ~21 and ~105 GB as sparse files (a real `torch.save` zip "
                  "whose storage bytes are holes, and 5 GB safetensors shards whose data are holes).", ""]
        heads = [r for r in self.rows if r.headline]
        if heads:
            lines += ["## Headline", ""]
            for r in heads:
                if "flat" in r.extra:
                    f = r.extra["flat"]
                    lines.append(f"- {r.headline}: tensorscope's time x{f['wall']:.2f}, peak RSS "
                                 f"x{f['rss']:.2f} (flat: metadata only)")
                elif r.case == "tui" and "ready" in r.extra:
                    lines.append(f"- {r.headline}: {r.extra['ready']:.2f} s, {_fmt_rss(r.ours)} peak RSS")
                elif r.ours and r.ours.ok and r.peer and r.peer.ok:
                    lines.append(f"- {r.headline}: {_compare(r.peer, r.ours, 'wall', 'faster', 'slower')}, "
                                 f"{_compare(r.peer, r.ours, 'rss', 'less', 'more')} peak memory "
                                 f"({r.ours.wall:.2f} s / {_fmt_rss(r.ours)} vs "
                                 f"{r.peer.wall:.2f} s / {_fmt_rss(r.peer)})")
                else:
                    lines.append(f"- {r.headline}: {(r.ours.error if r.ours and not r.ours.ok else '') or (r.peer.error if r.peer else '')}")
            lines.append("")
        titles = {"inspect": "Inspect (list every tensor: name, dtype, shape)",
                  "scale": "Scale: metadata cost as the data grow (sparse files)",
                  "read": "Read one tensor",
                  "scan": "Scan (static safety scan)",
                  "diff": "Diff two checkpoints down to the values",
                  "convert": "Convert to safetensors",
                  "tui": "TUI: time to first screen",
                  "stats": "Statistics of every value (`inspect --stats`)"}
        for case in cases:
            if case == "pertensor" and getattr(self, "pertensor", None):
                import bench_scale
                lines += [bench_scale.render(self.pertensor)]
                continue
            if case in ("remote", "fleet"):
                if case == "fleet" and "remote" in cases:
                    continue   # one section for both, written at "remote"
                import bench_remote
                lines += [bench_remote.render({"remote": getattr(self, "remote", None),
                                               "fleet": getattr(self, "fleet", None),
                                               "delay_s": REMOTE_DELAY, "repeat": self.runs})]
                continue
            rows = [r for r in self.rows if r.case == case]
            if not rows:
                continue
            lines += [f"## {titles[case]}", ""]
            if case == "tui":
                lines += ["| input | tensorscope | first screen | of which imports | model whole | "
                          "filter refresh | process wall | peak RSS |",
                          "|---|---|---:|---:|---:|---:|---:|---:|"]
                for r in rows:
                    if r.ours and r.ours.ok:
                        whole = f"{r.extra['whole']:.2f} s" if "whole" in r.extra else "-"
                        lines.append(f"| {r.input} | {r.ours_label} | {r.extra['ready']:.2f} s | "
                                     f"{r.extra['import']:.2f} s | {whole} | "
                                     f"{r.extra['filter'] * 1000:.0f} ms | "
                                     f"{_fmt_wall(r.ours)} | {_fmt_rss(r.ours)} |")
                    else:
                        lines.append(f"| {r.input} | {r.ours_label} | {_fmt_wall(r.ours)} | - | - | - | - | - |")
                lines += ["", "No peer: no other tool opens these files in a terminal UI. *Model whole*: a "
                          "sharded checkpoint is shown from its first shard on; the other shards stream "
                          "in behind the first screen, and the filter is measured once the model is whole "
                          "(its tree is built after that).", ""]
                continue
            lines += ["| input | tensorscope | wall | peak RSS | peer | wall | peak RSS | "
                      "time ratio | RSS ratio |" + (" note |" if case in ("scale", "stats") else ""),
                      "|---|---|---:|---:|---|---:|---:|---:|---:|" + ("---|" if case in ("scale", "stats") else "")]
            for r in rows:
                lines.append(f"| {r.input} | `{r.ours_label}` | {_fmt_wall(r.ours)} | {_fmt_rss(r.ours)} | "
                             f"{r.peer_label} | {_fmt_wall(r.peer)} | {_fmt_rss(r.peer)} | "
                             f"{_ratio(r.peer, r.ours, 'wall')} | {_ratio(r.peer, r.ours, 'rss')} |"
                             + (f" {r.note} |" if case in ("scale", "stats") else ""))
            if case in CASE_NOTES:
                lines += ["", CASE_NOTES[case]]
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"


def _compile_package() -> None:
    """Byte-compile tensorscope as `pip install` does: with PYTHONDONTWRITEBYTECODE set (it is on
    some machines) an editable checkout would otherwise recompile its sources in every measured
    process, while the peers, installed by pip, start from their .pyc files."""
    import compileall
    for folder in ("tensorscope", "parsers", "tui"):
        compileall.compile_dir(str(ROOT / folder), quiet=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Cases: " + ", ".join(CASES))
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: tiny inputs, fewer inputs per case, 1 run, no warm-up")
    ap.add_argument("--only", nargs="+", choices=CASES, metavar="CASE", help="run these cases only")
    ap.add_argument("--runs", type=int, default=None, help="measured runs per command (default 3; 1 with --quick)")
    ap.add_argument("--out", type=Path, default=None,
                    help="where to write the table (default BENCHMARKS.md; with --quick "
                         "benchmarks/.cache/quick/BENCHMARKS.md)")
    ap.add_argument("--skip-1m", action="store_true",
                    help="pertensor: leave out the 1,000,000-tensor listing (slow to generate)")
    ap.add_argument("--note", action="append", default=[],
                    help="a line to add under Machine (e.g. other load on the machine)")
    args = ap.parse_args(argv)
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    cases = [c for c in CASES if not args.only or c in args.only]
    bench = Bench(args)
    bench.notes += args.note
    out = args.out or (bench.cache / "BENCHMARKS.md" if args.quick else ROOT / "BENCHMARKS.md")
    bench.generate(cases)
    _compile_package()
    for case in cases:
        getattr(bench, f"case_{case}")()
    bench.load[1] = os.getloadavg()[0]
    info = common.machine_info()
    text = bench.render(info, cases)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    raw = {"machine": info, "args": {k: str(v) for k, v in vars(args).items()},
           "rows": [{"case": r.case, "input": r.input, "ours_label": r.ours_label,
                     "peer_label": r.peer_label, "note": r.note, "extra": r.extra,
                     **{side: (None if res is None else {"wall": res.wall, "rss": res.rss,
                                                         "error": res.error,
                                                         "runs": [(s.wall, s.rss) for s in res.runs]})
                        for side, res in (("ours", r.ours), ("peer", r.peer))}}
                    for r in bench.rows],
           "remote": getattr(bench, "remote", None), "fleet": getattr(bench, "fleet", None)}
    (bench.cache / "results.json").write_text(json.dumps(raw, indent=2))
    print(f"\nwrote {out}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
