"""Runtime dependencies are imported where they are needed, not on every path."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

_PROBE = """
import sys
from tensorscope import cli
code = cli.main(sys.argv[1:])
print("ml_dtypes" in sys.modules, code)
"""


def _probe(*argv):
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                         check=False)
    return out.stdout.split()[-2:]


def test_diff_and_stats_of_float32_files_leave_ml_dtypes_unimported(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors_numpy.save_file({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, str(a))
    safetensors_numpy.save_file({"w": np.ones((8, 8), dtype=np.float32)}, str(b))
    assert _probe("diff", str(a), str(b)) == ["False", "1"]
    assert _probe("inspect", "--stats", str(a)) == ["False", "0"]


def test_a_bfloat16_diff_still_compares_values(tmp_path):
    import ml_dtypes
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    x = np.arange(64, dtype=np.float32).astype(ml_dtypes.bfloat16)
    safetensors_numpy.save_file({"w": x}, str(a))
    safetensors_numpy.save_file({"w": (x.astype(np.float32) * 2).astype(ml_dtypes.bfloat16)}, str(b))
    assert _probe("diff", str(a), str(b)) == ["True", "1"]  # values differ: read as bfloat16
