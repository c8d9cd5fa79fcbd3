"""``.pt2`` text fields that torch evaluates: real torch.export archives with dynamic shapes scan
clean; the accepted function set is the installed torch's; an expr_str that runs code does run
on torch.export.load (checked in a subprocess, with a marker file) and scans critical, as does a
guards_code entry that runs when the exported module is called."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from tensorscope.scanning import Severity, pt2_exprs, scan_paths


def test_the_function_set_is_the_installed_torchs():
    import torch.utils._sympy.functions as F
    assert pt2_exprs.TORCH_SYMPY_FUNCTIONS == frozenset(F.__all__)
    import inspect

    from torch._export.serde import serialize
    src = inspect.getsource(serialize.GraphModuleDeserializer.deserialize)
    named = {line.split('"')[1] for line in src.splitlines()
             if "torch.utils._sympy.functions." in line and line.strip().startswith('"')}
    assert named and named <= pt2_exprs.TORCH_SYMPY_FUNCTIONS


def _export(tmp_path, name, module, args, dynamic):
    import torch
    ep = torch.export.export(module, args, dynamic_shapes=dynamic)
    path = tmp_path / f"{name}.pt2"
    torch.export.save(ep, path)
    return path


def _models(tmp_path):
    import torch

    class Slice(torch.nn.Module):
        def forward(self, x, y):
            return (x[: x.shape[0] // 2] * 2).sum(0) + y.repeat(2, 1)[: x.shape[0]].sum(0)

    class Reshape(torch.nn.Module):
        def forward(self, x):
            n = x.shape[0]
            return x.reshape(n // 2, 2, -1).mean(1)[: max(n // 4, 1)]

    class Cat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 5)

        def forward(self, a, b):
            return self.lin(torch.cat([a, b], 0)).view(-1)

    b = torch.export.Dim("batch", min=2, max=1024)
    d = torch.export.Dim("d", min=2, max=64)
    yield _export(tmp_path, "slice", Slice(), (torch.randn(8, 3), torch.randn(4, 3)),
                  {"x": {0: 2 * b}, "y": {0: b}})
    yield _export(tmp_path, "reshape", Reshape(), (torch.randn(8, 6),), {"x": {0: 4 * d}})
    yield _export(tmp_path, "cat", Cat(), (torch.randn(4, 3), torch.randn(6, 3)),
                  {"a": {0: b}, "b": {0: d}})


def test_real_exports_with_dynamic_shapes_scan_clean(tmp_path):
    seen = 0
    for path in _models(tmp_path):
        with zipfile.ZipFile(path) as z:
            [name] = [n for n in z.namelist() if n.endswith("models/model.json")]
            doc = json.loads(z.read(name))
        fields = list(pt2_exprs.fields(doc))
        assert any(k == "expr_str" for k, _, _ in fields)
        for kind, text, _ in fields:
            judge = pt2_exprs.judge_expr if kind == "expr_str" else pt2_exprs.judge_guard
            assert judge(text) is None, (kind, text)
        seen += len(fields)
        report = scan_paths(path)
        assert [str(f) for f in report.findings if f.severity > Severity.INFO] == []
    assert seen > 5


def _rewrite(src, dst, edit):
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as w:
        for info in z.infolist():
            data = z.read(info.filename)
            if info.filename.endswith("models/model.json"):
                data = json.dumps(edit(json.loads(data))).encode()
            w.writestr(info, data)


def _marker_payload(marker):
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


def test_an_expr_str_runs_on_load_and_scans_critical(tmp_path):
    real = next(_models(tmp_path))
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt2"

    def edit(doc):
        text = json.dumps(doc)
        import re
        sym = re.search(r"Symbol\('(s\d+)', positive=True, integer=True\)", text).group(0)
        name = sym.split("'")[1]
        text = text.replace(sym, f"Symbol(str({_marker_payload(marker)}) and '{name}', "
                            "positive=True, integer=True)", 1)
        return json.loads(text)

    _rewrite(real, evil, edit)
    # the oracle, isolated: torch.export.load itself runs the expression
    subprocess.run([sys.executable, "-c", "import torch, sys\ntry: torch.export.load(sys.argv[1])"
                    "\nexcept Exception: pass", str(evil)], timeout=300, capture_output=True)
    assert marker.exists()
    hits = [f for f in scan_paths(evil).findings if f.rule == "pt2.evaluated-text"]
    assert hits and hits[0].severity == Severity.CRITICAL


def test_a_guard_runs_when_the_module_is_called_and_scans_critical(tmp_path):
    real = next(_models(tmp_path))
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt2"

    def edit(doc):
        doc["guards_code"].append(f"{_marker_payload(marker)} is None")
        return doc

    _rewrite(real, evil, edit)
    subprocess.run([sys.executable, "-c", "import torch, sys\nep = torch.export.load(sys.argv[1])"
                    "\nep.module()(torch.randn(8, 3), torch.randn(4, 3))", str(evil)],
                   timeout=300, capture_output=True)
    assert marker.exists()
    hits = [f for f in scan_paths(evil).findings if f.rule == "pt2.evaluated-text"]
    assert hits and hits[0].severity == Severity.CRITICAL


@pytest.mark.parametrize("text", [
    "eval('1')", "Symbol('s0').__class__", "lambda: 0", "Symbol(chr(95))", "[x for x in ()]",
    "Integer(2)(1)", "exec", "Symbol('s0', integer=__import__('os'))", "s0 if 1 else 2",
    "Symbol('__class__')", "Symbol(f'{1}')", "Symbol('s0') # c", "(Symbol)('s0')",
    "Symbol('s0')[0]", "Symbol('s0') 'x'", "Integer(1) in Integer(2)", "Integer(",
    "Symbol(b's0')", "Symbol('a' 'b')", "s0.is_integer", "Add(*[s0])", "Add(**{})",
])
def test_anything_else_is_code(text):
    assert pt2_exprs.judge_expr(text) is not None


@pytest.mark.parametrize("text", [
    "L['x'].size()[0] #\n, __import__('os')", "L['x'].__class__", "open('f')",
    "L['x'].size()[0] == len('a')", "L['a\"'].size()[0] > 1", "torch.load('m')",
    "L['x'].size()[0] == math.system(1)", "L.x", "(L)['x']", "max(L['x'].size()[0], key=1)",
])
def test_guards_outside_the_grammar_are_code(text):
    assert pt2_exprs.judge_guard(text) is not None


def test_hostile_expressions_never_raise():
    import random
    rng = random.Random(5)
    pieces = ["Symbol(", "'s0'", ")", ",", "integer=True", "Integer(", "1", "+", "*", "**", "//",
              "(", "L['x']", ".size()", "[0]", "math.floor(", "max(", "__import__", "'", '"',
              "\\", "#", "\n", "lambda", ":", "f'", "{", "}", "not", "and", "-", "[", "]"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        for judge in (pt2_exprs.judge_expr, pt2_exprs.judge_guard):
            verdict = judge(text)
            assert verdict is None or isinstance(verdict, str)
