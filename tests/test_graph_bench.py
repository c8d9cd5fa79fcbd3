"""Smoke test of benchmarks/bench_graph.py on tiny inputs: it generates, runs both readers and
prints its table (nothing about time is asserted; the figures are in BENCHMARKS.md)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_graph_quick():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_graph.py"), "--blocks",
                        "5", "--layers", "3", "--repeat", "1", "--no-warmup"], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| nodes50.onnx" in r.stdout and "| layers3.pt2" in r.stdout
    assert "tensorscope" in r.stdout and "torch.export.load" in r.stdout
