"""The README tells the truth: every command is documented, has help with an example, and the
quick-start command works on the bundled example."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tensorscope import cli

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_command_has_help_and_example(name):
    mod = importlib.import_module(f"tensorscope.commands.{name}")
    assert mod.HELP, f"{name} is missing its help"
    assert "Example:" in mod.DESCRIPTION, f"{name} help has no Example: block"


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_command_is_in_readme(name):
    assert f"tensorscope {name}" in README, f"README does not document `tensorscope {name}`"


def test_quick_start_runs_on_the_bundled_example(capsys):
    m = re.search(r"pip install \. && (tensorscope inspect (\S+))", README)
    assert m, "README quick start lost its inspect command"
    path = Path(__file__).resolve().parent.parent / m.group(2)
    assert cli.main(["inspect", str(path)]) == 0
    assert "torch-zip" in capsys.readouterr().out


def test_readme_test_command_is_what_ci_runs():
    ci = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    m = re.search(r'pip install -e "\.\[test\]" && (pytest[^`\n]*)', README)
    assert m and m.group(1).strip() in ci
