"""CI smoke test of the benchmark driver: ``benchmarks/run.py --quick`` still runs end to end.

It proves that every case (inspect, scale, read, scan, diff, convert, tui, pertensor, remote,
fleet) can generate its tiny inputs, run tensorscope and its peers as whole processes and render
the table. Nothing about time or memory is asserted: CI machines are too noisy for that, and the
real figures come from a full run (BENCHMARKS.md).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks" / "run.py"
SECTIONS = ("## Machine", "## Inspect", "## Scale", "## Read one tensor", "## Scan",
            "## Diff", "## Convert", "## TUI", "## Cost per tensor",
            "## Remote models over HTTP and scan fleets")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "BENCHMARKS.md"
    proc = subprocess.run([sys.executable, str(RUN), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    return proc, out


def test_quick_run_exits_zero(quick_run):
    proc, _ = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("section", SECTIONS)
def test_quick_run_writes_each_section(quick_run, section):
    _, out = quick_run
    assert section in out.read_text()


def test_quick_run_measures_tensorscope_on_every_inspect_input(quick_run):
    _, out = quick_run
    text = out.read_text()
    table = text.split("## Inspect", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`inspect --json`" in line]
    assert len(rows) >= 4, table
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2].endswith(" s") and cells[3].endswith(" MiB"), row   # measured, not failed


def test_quick_run_writes_where_asked(quick_run):
    proc, out = quick_run
    assert f"wrote {out}" in proc.stdout
