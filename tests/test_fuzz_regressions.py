"""Every input a fuzzer found, shrunk by `fuzz/minimise.py` and kept in tests/fuzz_regressions/:
each must now end as the invariants say (a result or a `TensorscopeError`, scan never raising),
run as the fuzzer ran it, in a fresh process with a timeout (a segfault or a hang is a failure
like an exception)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "tests" / "fuzz_regressions").glob("*.bin"))


def test_there_are_regressions_to_run():
    assert CASES, "tests/fuzz_regressions/ holds no input"


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_finding_stays_fixed(case):
    meta = json.loads(case.with_suffix(".json").read_text())
    seed = str(ROOT / meta["seed"]) if meta.get("seed") else ""
    proc = subprocess.run([sys.executable, str(ROOT / "fuzz" / "minimise.py"), "--run",
                           meta["target"], seed, str(case)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (f"{case.name} fails again as {proc.stdout.strip()} "
                                  f"(was {meta['signature']}): {proc.stderr[-2000:]}")
