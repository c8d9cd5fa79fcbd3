"""The docs site's generated pages cover the code, and the README stays a README."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tensorscope import cli
from tensorscope.scanning.rules import RULES

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _gen():
    spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_page_has_every_command_and_option():
    page = _gen().cli_reference()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in cli.COMMANDS:
        assert f"## `tensorscope {name}`" in page
        for action in sub.choices[name]._actions:
            for opt in action.option_strings:
                assert opt in page, f"{name} {opt} missing from the CLI page"


def test_rules_page_has_every_rule():
    page = _gen().rules_reference()
    for rid, rule in RULES.items():
        assert f"## {rid}\n" in page
        assert f"**{rule.severity}**" in page


def test_schemas_page_carries_the_diff_and_scan_schemas():
    page = _gen().schemas()
    assert '"schema": "tensorscope.diff/3"' in page
    assert '"schema": "tensorscope.scan/1"' in page
    assert page.count("```") % 2 == 0


def test_nav_lists_only_pages_that_exist(tmp_path):
    gen = _gen()
    (tmp_path / "index.md").write_text("# x\n")
    config = gen.on_config({"docs_dir": str(tmp_path)})
    listed = [f for section in config["nav"] for pages in section.values() for page in pages
              for f in page.values()]
    assert set(listed) == {"index.md", *gen.GENERATED}


def test_readme_fits_two_screens_and_records_no_suite_figures():
    assert len(README.splitlines()) <= 150
    for text in [README, *(p.read_text() for p in (ROOT / "docs").glob("*.md"))]:
        assert not re.search(r"\d[\d,]* (tests )?passed|tests\) takes|suite .{0,40}\d+ ?(s|min)", text)


@pytest.mark.parametrize("target", sorted(set(re.findall(r"\]\(((?!https?:)[^)#]+)\)", README))))
def test_readme_links_exist(target):
    assert (ROOT / target).exists(), target


def test_readme_dependency_table_is_pyproject():
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=\[ ]", d)[0].lower().replace("_", "-") for d in deps}
    table = README.split("## Install", 1)[1].split("##", 1)[0]
    listed = set()
    for row in re.findall(r"^\| ([^|]+) \|", table, re.M):
        listed |= {n.strip().lower().replace("_", "-") for n in row.split(",")}
    listed -= {"dependency", "---"}
    assert listed == names


def _readme_examples():
    block = README.split("## Commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].split() for line in block.strip().splitlines()]


@pytest.mark.parametrize("argv", _readme_examples(), ids=lambda a: a[1])
def test_readme_examples_are_commands_as_written(argv):
    """Each example line parses as the CLI would parse it (its files are the reader's own)."""
    import shlex
    assert argv[0] == "tensorscope"
    args = [a for a in argv[1:] if not (a.startswith("[") and a.endswith("]"))]  # [optional]
    if args[0] not in cli.COMMANDS:
        pytest.skip(f"`tensorscope {args[0]}` is not registered on this branch")
    parsed, extra = cli.build_parser().parse_known_args(shlex.split(" ".join(args)))
    assert parsed.command == args[0] and extra == []


def test_readme_shows_every_command_once_in_its_examples():
    names = [argv[1] for argv in _readme_examples()]
    assert set(cli.COMMANDS) <= set(names) and len(names) == len(set(names))
