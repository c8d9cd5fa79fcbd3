"""`render.StyledOut`: the human output of `diff`, laid out as Rich lays it out, byte for byte.

Where stdout is not a terminal, a line or a table that fits the width is written as plain text
without Rich; anything else goes through Rich. Rich itself is the oracle: every case below is
rendered both ways and compared.
"""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tensorscope.render import StyledOut

safetensors_numpy = pytest.importorskip("safetensors.numpy")

# ASCII, markup and emoji codes (text, never interpreted), wide CJK, a combining accent, block
# and math characters (diff's bars and verdicts), an emoji
_TEXT = st.lists(st.sampled_from(list("ab xyz.0_-[]/\\:") + ["[bold]", ":smile:", "日本", "e\u0301",
                                                              "█", "‖", "−", "😀", "×", "  "]),
                max_size=20).map("".join)
_STYLE = st.sampled_from(["", "bold", "red", "green", "dim", "yellow"])
_CELL = st.one_of(_TEXT, st.tuples(_TEXT, _STYLE))
_ENV = {"COLUMNS": None, "FORCE_COLOR": None, "TTY_COMPATIBLE": None}


def _text(cell):
    return cell if isinstance(cell, str) else cell[0]


def _rich_text(*cells):
    return Text.assemble(*((c, "") if isinstance(c, str) else c for c in cells))


def _rich(width, render, terminal=False):
    buf = io.StringIO()
    console = Console(file=buf, width=width, highlight=False, soft_wrap=False, emoji=False,
                      force_terminal=terminal, color_system="standard" if terminal else None)
    render(console)
    return buf.getvalue()


def _ours(width, render, **env):
    buf = io.StringIO()
    env = {"COLUMNS": str(width), **env}
    with mock.patch.dict(os.environ, env), redirect_stdout(buf):
        for k in [k for k in _ENV if k not in env]:
            os.environ.pop(k, None)
        render(StyledOut())
    return buf.getvalue()


def _rich_table(headers, justify, rows, title, fold):
    table = Table(box=None, header_style="bold", pad_edge=False,
                  title=None if title is None else Text(title), title_justify="left")
    for i, h in enumerate(headers):
        kw = {"overflow": "fold"} if fold[i] == "f" else {}
        table.add_column(Text(h), justify="right" if justify[i] == "r" else "left", **kw)
    for r in rows:
        table.add_row(*map(_rich_text, r))
    return table


@st.composite
def _tables(draw):
    n = draw(st.integers(1, 6))
    headers = draw(st.lists(_TEXT, min_size=n, max_size=n))
    justify = "".join(draw(st.lists(st.sampled_from("lr"), min_size=n, max_size=n)))
    fold = "".join(draw(st.lists(st.sampled_from("fe"), min_size=n, max_size=n)))
    rows = draw(st.lists(st.lists(_CELL, min_size=n, max_size=n), max_size=6))
    title = draw(st.one_of(st.none(), _TEXT.filter(bool)))
    return headers, justify, rows, title, fold


@settings(max_examples=120, deadline=None)
@given(table=_tables(), width=st.integers(8, 220))
def test_a_table_is_written_as_rich_writes_it(table, width):
    headers, justify, rows, title, fold = table
    want = _rich(width, lambda c: c.print(_rich_table(*table)))
    got = _ours(width, lambda o: o.table(headers, justify, rows, title=title, fold=fold))
    assert got == want


@settings(max_examples=120, deadline=None)
@given(spans=st.lists(_CELL, max_size=12), width=st.integers(8, 220))
def test_a_line_is_written_as_rich_writes_it(spans, width):
    want = _rich(width, lambda c: c.print(_rich_text(*spans)))
    assert _ours(width, lambda o: o.line(*spans)) == want


_SGR = re.compile("\x1b\\[[0-9;]*m")


@settings(max_examples=60, deadline=None)
@given(table=_tables(), width=st.integers(8, 220))
def test_on_a_terminal_the_text_is_rich_s_and_styled(table, width):
    """FORCE_COLOR: Rich's rules call stdout a terminal; StyledOut then writes through Rich (the
    table laid out here when it fits: the same text, the same cell styles)."""
    headers, justify, rows, title, fold = table
    want = _rich(width, lambda c: c.print(_rich_table(*table)), terminal=True)
    got = _ours(width, lambda o: o.table(headers, justify, rows, title=title, fold=fold),
                FORCE_COLOR="1")
    assert _SGR.sub("", got) == _SGR.sub("", want)
    for cell in (c for r in rows for c in r):
        if not isinstance(cell, str) and cell[0].strip() and cell[1] == "red" and width > 150:
            assert "\x1b[31m" in got


def test_markup_and_emoji_codes_from_a_file_are_printed_as_they_are(tmp_path, capsys):
    from tensorscope.cli import main
    name = "[bold]x[/bold]:thumbs_up:.weight"
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors_numpy.save_file({name: np.ones(3, np.float32)}, str(a),
                                metadata={":smile:": "[red]v:fire:"})
    safetensors_numpy.save_file({name: np.zeros(3, np.float32)}, str(b),
                                metadata={":smile:": "w"})
    assert main(["diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert f"changed  {name}" in out and ":smile:" in out and "[red]v:fire:" in out
    with mock.patch.dict(os.environ, {"FORCE_COLOR": "1"}):   # through Rich: the same text
        assert main(["diff", str(a), str(b)]) == 1
    styled = capsys.readouterr().out
    assert "\x1b[" in styled and _SGR.sub("", styled) == out
    assert main(["inspect", str(a)]) == 0   # inspect's summary (Rich) shows metadata keys
    out = capsys.readouterr().out
    assert ":smile:" in out and "[red]v:fire:" in out and "\U0001f604" not in out


_PROBE = """
import sys
from tensorscope import cli
code = cli.main(sys.argv[1:])
print(sorted(m for m in ("rich.console", "rich.table") if m in sys.modules), code, file=sys.stderr)
"""


def _rich_loaded(*argv, **env):
    env = {k: v for k, v in os.environ.items() if k not in _ENV} | env
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                         check=False, env=env)
    return out.stderr.strip().splitlines()[-1], out.stdout


def test_piped_diff_output_needs_no_rich(tmp_path):
    """A diff written to a pipe is plain text: Rich is not imported (~20 ms of a small diff's
    ~130 ms), and the bytes are those Rich writes (FORCE_COLOR makes Rich lay them out; its
    styles removed, the same text)."""
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors_numpy.save_file({"w": np.arange(64, dtype=np.float32).reshape(8, 8)}, str(a))
    safetensors_numpy.save_file({"w": np.ones((8, 8), dtype=np.float32)}, str(b))
    loaded, plain = _rich_loaded("diff", str(a), str(b))
    assert loaded == "[] 1"
    loaded, styled = _rich_loaded("diff", str(a), str(b), FORCE_COLOR="1")
    assert loaded == "['rich.console'] 1" and _SGR.sub("", styled) == plain
    loaded, narrow = _rich_loaded("diff", str(a), str(b), COLUMNS="40")   # Rich folds the table
    assert loaded == "['rich.console', 'rich.table'] 1"
    assert max(map(len, narrow.splitlines())) <= 40 < max(map(len, plain.splitlines()))
