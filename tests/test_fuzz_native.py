"""The fuzzing tools reach the C paths `inspect` and `diff` take, and keep what kills a worker
(issue 24): `fuzzlib.exercise` opens in listing mode and diffs against the seed (the compiled
torch step's ``infos``, the zip scan's ``records``, the diff kernel run, counted by spies);
`run_long.py` saves the input of a worker that dies by a signal or hangs; `minimise.py` shrinks
it into a regression case; `native_fuzz.py` runs every C entry point against its twin."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))
import fuzzlib  # noqa: E402

from tensorscope import diffing  # noqa: E402
from tensorscope.parsers import pickle_vm, zipfmt  # noqa: E402

needs_c = pytest.mark.skipif(pickle_vm._STEP is None or zipfmt._SCAN is None or
                             diffing._KERNEL is None, reason="the C extensions are not built")


class _Spy:
    """A stand-in module that counts calls of each function of the real one."""

    def __init__(self, real):
        self._real, self.calls = real, {}

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def counted(*a, **kw):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*a, **kw)
        return counted


@needs_c
def test_exercise_reaches_listing_mode_and_the_diff_kernel(tmp_path, monkeypatch):
    import torch
    step, scan, kernel = (_Spy(pickle_vm._STEP), _Spy(zipfmt._SCAN), _Spy(diffing._KERNEL))
    monkeypatch.setattr(pickle_vm, "_STEP", step)
    monkeypatch.setattr(zipfmt, "_SCAN", scan)
    monkeypatch.setattr(diffing, "_KERNEL", kernel)
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({f"w{i}": torch.randn(20_000) for i in range(3)}, a)
    torch.save({f"w{i}": torch.randn(20_000) for i in range(3)}, b)
    assert fuzzlib.exercise(a, against=b) == "ok"
    assert step.calls.get("infos") and step.calls.get("tensor")
    assert scan.calls.get("scan") and scan.calls.get("records")
    assert kernel.calls.get("stats")


@needs_c
@pytest.mark.parametrize("target", ["listing", "diffkernel"])
def test_the_in_memory_native_targets_run_on_their_seeds(target):
    outcomes = {fuzzlib.exercise_bytes(target, data) for _, data in fuzzlib.seed_bytes(target)}
    assert outcomes <= {"ok", "ok+", "error"} and "ok" in outcomes


def _run_long(tmp_path, target):
    out = tmp_path / "findings"
    proc = subprocess.run([sys.executable, str(ROOT / "fuzz" / "run_long.py"), "--targets", target,
                           "--workers", "1", "--seconds", "90", "--max-inputs", "1",
                           "--timeout", "3", "--report", "1000", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    return proc, out


@pytest.mark.parametrize("target,kind", [("selftest_signal", "signal"),
                                         ("selftest_hang", "hang")])
def test_run_long_keeps_the_input_of_a_worker_that_dies_or_hangs(tmp_path, target, kind):
    proc, out = _run_long(tmp_path, target)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    saved = sorted(out.glob(f"{kind}-{target}-*.bin"))
    assert len(saved) == 1, (proc.stdout, sorted(out.iterdir()))
    meta = json.loads(saved[0].with_suffix(".json").read_text())
    assert meta["target"] == target and meta["kind"] == kind
    # the very bytes the worker was given: one of the seeds, mutated
    assert saved[0].stat().st_size > 0 and Path(meta["seed"]).exists()


def test_minimise_shrinks_a_finding_into_a_regression_case(tmp_path):
    finding = tmp_path / "signal-selftest_signal-x.bin"
    finding.write_bytes(bytes(range(256)) * 8)
    finding.with_suffix(".json").write_text(json.dumps({"target": "selftest_signal",
                                                        "kind": "signal", "seed": None}))
    out = tmp_path / "regressions"
    proc = subprocess.run([sys.executable, str(ROOT / "fuzz" / "minimise.py"), str(finding),
                           "--out", str(out), "--seconds", "60", "--name", "case"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads((out / "case.json").read_text())
    assert meta["signature"] == ["signal", "SIGSEGV"] and meta["target"] == "selftest_signal"
    assert len((out / "case.bin").read_bytes()) <= 1   # any input kills it: shrunk to nothing


@needs_c
def test_native_fuzz_runs_every_entry_against_its_twin(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "fuzz" / "native_fuzz.py"), "--seconds",
                           "8", "--seed", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = proc.stdout.strip().splitlines()[-1]
    for entry in ("listing", "torch_step", "zipscan", "diffkernel", "stheader"):
        assert f"{entry} 0 " not in counts and entry in counts, counts
