"""Shared fixtures and the test run's own settings.

- ``cli``: run ``tensorscope ARGS...`` as a user types it; returns ``(exit code, stdout, stderr)``.
- ``@pytest.mark.perf``: an assertion that depends on the machine (wall clock, peak RSS, growth
  ratios). The default run leaves them out (``-m "not perf"`` in pyproject.toml); ``.ci/run``
  runs them in a step of their own, ``pytest -q -m perf``, with bounds that hold on a loaded machine.

Plain helpers live in `helpers.py` (no torch) and `torch_oracle.py` (torch); import them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:   # helpers, torch_oracle, make_attack_corpus import as modules
    sys.path.insert(0, str(TESTS))

from helpers import run_cli  # noqa: E402


def pytest_configure(config):
    # pytest-xdist's workers inherit COLUMNS=80 from their launcher, which a plain run (and a
    # user's pipe) does not have: the CLI's piped tables would wrap at 80 columns instead of 200.
    # Tests that want a width set it themselves.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


@pytest.fixture
def cli(capsys):
    """``cli("inspect", path, "--json") -> (code, out, err)``: the CLI in this process."""
    return lambda *argv: run_cli(capsys, *argv)


class AttackCorpus(NamedTuple):
    root: Path     # the folder it was written in
    cases: list    # make_attack_corpus.Case, one per file or folder


@pytest.fixture(scope="session")
def attack_corpus(tmp_path_factory) -> AttackCorpus:
    """The attack corpus (tests/make_attack_corpus.py, ~450 files, ~10 s to write), written once
    for the run and shared read-only: a test that changes files works on a copy of ``root``."""
    import make_attack_corpus
    root = tmp_path_factory.mktemp("attack_corpus")
    return AttackCorpus(root, make_attack_corpus.build(root))


@pytest.fixture(params=["avx512", "portable"])
def kernel_route(request):
    """Each compiled route of the diff kernel in turn: the AVX-512 pass (where the CPU has it)
    and the portable loop."""
    from tensorscope import diffing
    k = diffing._KERNEL
    if k is None:
        pytest.skip("the compiled pass is not built")
    if request.param == "avx512" and not k.AVX512:
        pytest.skip("this CPU has no AVX-512")
    was = k.avx512(request.param == "avx512")
    yield request.param
    k.avx512(was)
