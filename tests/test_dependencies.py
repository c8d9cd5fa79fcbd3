"""Runtime dependencies are imported where they are needed, not on every path."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tensorscope import diffing, lowrank

from test_rank_routes import assert_same_estimate

safetensors_numpy = pytest.importorskip("safetensors.numpy")

_PROBE = """
import sys
from tensorscope import cli
code = cli.main(sys.argv[1:])
print("numpy" in sys.modules, "ml_dtypes" in sys.modules, code)
"""


def _probe(*argv):
    """(numpy imported, ml_dtypes imported, exit code) of one command, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                         check=False)
    return out.stdout.split()[-3:]


def test_diff_and_stats_of_float32_files_leave_ml_dtypes_unimported(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors_numpy.save_file({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, str(a))
    safetensors_numpy.save_file({"w": np.ones((8, 8), dtype=np.float32)}, str(b))
    assert _probe("diff", str(a), str(b))[1:] == ["False", "1"]
    assert _probe("inspect", "--stats", str(a))[1:] == ["False", "0"]


@pytest.mark.skipif(diffing._KERNEL is None, reason="the compiled pass is not built")
def test_a_diff_of_plain_pairs_imports_no_numpy(tmp_path):
    """A fine-tune's pairs of plain dtypes, stored plainly: the compiled pass compares their
    stored bytes and certifies their rank test's samples, so numpy (~50 ms of start-up, more
    than the rest of such a diff) is never imported; the figures are those of the numpy route.
    Shapes: within the sample (taken whole, square), larger than it (positions drawn), a vector,
    a conv kernel; dtypes read as stored, ml_dtypes' bfloat16 among them."""
    import ml_dtypes
    rng = np.random.default_rng(3)
    xs = {"embed": rng.standard_normal((300, 500)).astype(np.float32),
          "square": rng.standard_normal((128, 128)).astype(np.float32),
          "norm": rng.standard_normal(64).astype(np.float32),
          "conv": rng.standard_normal((32, 16, 3, 3)).astype(np.float32),
          "half": rng.standard_normal((96, 40)).astype(np.float16),
          "brain": rng.standard_normal((64, 80)).astype(ml_dtypes.bfloat16),
          "same": rng.standard_normal((40, 40)).astype(np.float32)}
    ys = {k: v if k == "same" else
          (v.astype(np.float64) + rng.standard_normal(v.shape) * 1e-2).astype(v.dtype)
          for k, v in xs.items()}
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors_numpy.save_file(xs, str(a))
    safetensors_numpy.save_file(ys, str(b))
    assert _probe("diff", str(a), str(b)) == ["False", "False", "1"]
    assert _probe("diff", "--json", str(a), str(b)) == ["False", "False", "1"]
    # the same pairs through the numpy route (the compiled pass on numpy's pieces)
    direct = diffing.diff_models(a, b, verdicts=True)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(diffing, "_direct", lambda *args: None)
        general = diffing.diff_models(a, b, verdicts=True)
    for e, f in zip(direct.entries, general.entries):
        assert e.name == f.name and e.status == f.status
        assert_same_figures(e.values, f.values)
        assert e.verdict.kind == f.verdict.kind and e.verdict.text == f.verdict.text, e.name
        if "rank" in f.verdict.evidence:
            assert_same_estimate(lowrank.RankEstimate(**_rank_args(e.verdict.evidence["rank"])),
                                 lowrank.RankEstimate(**_rank_args(f.verdict.evidence["rank"])))
    assert direct.verdict.to_dict() == general.verdict.to_dict()


def _rank_args(d: dict) -> dict:
    return {"rank": d["rank"], "explained": d["explained"], "sketch": d["sketch"],
            "singular": d["singular_values"], "stage": d["stage"]}


def assert_same_figures(got, want) -> None:
    """Two routes' statistics of one pair: counts exactly, float64 sums to their rounding."""
    for key in ("identical_bytes", "mismatched", "nan_mismatch", "inf_mismatch", "zero_ref",
                "compared_as", "max_abs"):
        assert getattr(got, key) == getattr(want, key), key
    for key in ("max_rel", "mean_abs", "rms", "cosine", "norm_a", "norm_b", "norm_diff",
                "rel_change"):
        g, w = getattr(got, key), getattr(want, key)
        assert (g is None) == (w is None), key
        if w is not None:
            assert g == pytest.approx(w, rel=1e-12, abs=1e-300), key


def test_a_bfloat16_diff_still_compares_values(tmp_path):
    import ml_dtypes
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    x = np.arange(64, dtype=np.float32).astype(ml_dtypes.bfloat16)
    safetensors_numpy.save_file({"w": x}, str(a))
    safetensors_numpy.save_file({"w": (x.astype(np.float32) * 2).astype(ml_dtypes.bfloat16)}, str(b))
    assert _probe("diff", str(a), str(b))[2] == "1"
    (e,) = diffing.diff_models(a, b).entries   # values read as bfloat16: |a - b| = |a|
    assert e.values.max_abs == 63.0 and e.values.max_rel == 0.5
