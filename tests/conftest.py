"""Shared fixtures and the test run's own settings.

- ``cli``: run ``tensorscope ARGS...`` as a user types it; returns ``(exit code, stdout, stderr)``.
- ``@pytest.mark.perf``: an assertion that depends on the machine (wall clock, peak RSS, growth
  ratios). The default run leaves them out (``-m "not perf"`` in pyproject.toml); ``.ci/run``
  runs them in a step of their own, ``pytest -q -m perf``, with bounds that hold on a loaded machine.

Plain helpers live in `helpers.py` (no torch) and `torch_oracle.py` (torch); import them.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:   # helpers, torch_oracle, make_attack_corpus import as modules
    sys.path.insert(0, str(TESTS))

from helpers import run_cli  # noqa: E402


@pytest.fixture
def cli(capsys):
    """``cli("inspect", path, "--json") -> (code, out, err)``: the CLI in this process."""
    return lambda *argv: run_cli(capsys, *argv)
