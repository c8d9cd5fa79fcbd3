"""Evidence that nothing executes: every fixture is opened, listed and read under an audit hook
that fails on exec, compile, the import of any module not loaded before, processes, sockets, and
opening any path outside the fixture's folder."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import tensorscope
from tensorscope import TensorscopeError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ALL_FIXTURES = sorted(p for p in FIXTURES.rglob("*")
                      if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts)
# Folders that open as one model (DCP checkpoints, sharded checkpoints) are exercised as folders too.
ALL_FIXTURES += sorted(p for p in FIXTURES.rglob("*")
                       if p.is_dir() and p.parent != FIXTURES and "__pycache__" not in p.parts
                       and tensorscope.identify(p))

_FORBIDDEN = {"exec", "compile", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
              "subprocess.Popen", "socket.connect", "socket.bind", "pty.spawn", "ctypes.dlopen",
              "os.fork", "os.forkpty", "webbrowser.open"}
_armed: dict = {"on": False, "allowed_dir": None, "events": []}


def _hook(event, args):
    if not _armed["on"]:
        return
    if event in _FORBIDDEN:
        _armed["events"].append((event, repr(args)[:200]))
    elif event == "import":
        name = args[0]
        if name not in sys.modules:
            _armed["events"].append((event, name))
    elif event == "open":
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)) and not isinstance(path, int):
            real = os.path.realpath(os.fsdecode(path))
            if not real.startswith(_armed["allowed_dir"]):
                _armed["events"].append((event, real))


sys.addaudithook(_hook)


def _exercise(path: Path):
    try:
        with tensorscope.open(path) as model:
            for t in model.tensors:
                try:
                    model.read(t.name)
                except TensorscopeError:
                    pass
    except TensorscopeError:
        pass  # refusing a file is fine; running it is not
    tensorscope.scan(path)


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_fixture_parses_without_executing(path):
    _exercise(path)  # warm: lazy imports of our own modules happen here, unarmed
    _armed.update(on=True, allowed_dir=os.path.realpath(path.parent.parent), events=[])
    try:
        _exercise(path)
    finally:
        _armed["on"] = False
    assert _armed["events"] == []
