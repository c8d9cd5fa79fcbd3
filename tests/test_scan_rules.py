"""The rule registry: every anomaly kind a parser can emit is declared once with its severity,
severities live only in the registry, and the registry reaches --list-rules and SARIF."""
from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest

import tensorscope
from tensorscope.cli import main
from tensorscope.scanning import RULES, FileReport, Severity, scan_file, scan_model
from tensorscope.scanning.rules import ANOMALIES, anomaly_rule

ROOT = Path(__file__).resolve().parent.parent
KIND = re.compile(r"[a-z0-9]+\.[a-z0-9_]+")
_EMITTERS = {"add", "report", "Anomaly", "append", "_add", "anomaly"}


def _kinds_in_source() -> set[str]:
    """String literals passed as the kind of an anomaly anywhere in parsers/ (and the model):
    ``evidence.add("k", ...)``, ``Anomaly("k", ...)``, ``self.report("k", ...)``,
    ``anomalies.append(("k", ...))``."""
    kinds = set()
    files = sorted((ROOT / "parsers").glob("*.py")) + [ROOT / "tensorscope/model.py"]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name not in _EMITTERS:
                continue
            first = node.args[0]
            if isinstance(first, ast.Tuple) and first.elts:
                first = first.elts[0]
            if isinstance(first, ast.Call) and getattr(first.func, "id", None) == "Anomaly" and first.args:
                first = first.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and \
                    KIND.fullmatch(first.value) and "_" in first.value.split(".", 1)[1] + "_":
                kinds.add(first.value)
    return kinds


def test_source_enumeration_finds_the_known_emitters():
    kinds = _kinds_in_source()
    # one per emitter style, so that the enumeration itself cannot silently find nothing
    assert {"zip.bad_crc", "onnx.external_path_escape", "gguf.nested_array", "onnx.unknown_field",
            "legacy.storage_missing", "torch.tensor_out_of_storage"} <= kinds, sorted(kinds)
    assert len(kinds) >= 57


def test_every_anomaly_kind_in_the_parsers_is_declared():
    undeclared = sorted(k for k in _kinds_in_source() if k not in ANOMALIES)
    # module names passed to the same helpers (Global("torch._utils", ...)) are not anomalies:
    undeclared = [k for k in undeclared if not k.startswith(("torch._", "numpy."))]
    assert not undeclared, f"declare these in tensorscope/scanning/rules.py: {undeclared}"


def test_every_anomaly_kind_seen_on_fixtures_and_corpus_is_declared(attack_corpus):
    paths = [p for p in (ROOT / "fixtures").rglob("*") if p.is_file() and p.suffix != ".py"]
    paths += [c.path for c in attack_corpus.cases]
    seen = set()
    for p in paths:
        try:
            with tensorscope.open(p) as m:
                seen |= {a.kind for a in m.evidence.anomalies}
        except Exception:  # noqa: BLE001 — only the anomalies of files that open are collected
            continue
    assert len(seen) >= 5
    assert not sorted(seen - set(ANOMALIES))


def test_registry_entries_are_complete():
    for r in RULES.values():
        assert r.id and r.title and r.rationale.endswith("."), r.id
        assert isinstance(r.severity, Severity)
    assert anomaly_rule("zip.bad_crc") == "zip.bad-crc" and "zip.bad-crc" in RULES


def test_no_severity_is_written_in_a_judge_function():
    scan_dir = ROOT / "tensorscope/scanning"
    for name in ("loader.py", "pickles.py", "torchscript.py", "walk.py"):
        text = (scan_dir / name).read_text()
        # comparisons (``>= Severity.HIGH``) are thresholds; a severity given to a finding is not
        assert not re.search(r"(?<![<>]= )Severity\.(CRITICAL|HIGH|MEDIUM|LOW)\b", text), name
        assert "in str(e)" not in text and "in str(err)" not in text, name  # no error classified by text


def test_list_rules_prints_the_registry(capsys):
    assert main(["scan", "--list-rules"]) == 0
    out = capsys.readouterr().out
    for rid in ("pickle.dangerous-global", "data.embedded-pickle", "pickle.reference-bomb", "zip.bad-crc"):
        assert rid in out
    assert main(["scan", "--list-rules", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in d["rules"]} == set(RULES)
    assert all(r["rationale"] for r in d["rules"])


def test_sarif_carries_rule_docs(tmp_path):
    p = tmp_path / "x.pkl"
    p.write_bytes(b"\x80\x02cos\nsystem\n(X\x02\x00\x00\x00lstR.")
    s = tensorscope.scan(p).to_sarif()
    rules = s["runs"][0]["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} >= set(RULES)
    r = next(r for r in rules if r["id"] == "pickle.dangerous-global")
    assert r["fullDescription"]["text"] == RULES["pickle.dangerous-global"].rationale
    assert r["help"]["text"].startswith(RULES["pickle.dangerous-global"].rationale)


def test_scan_file_is_pure_and_picklable(tmp_path):
    p = tmp_path / "x.pkl"
    p.write_bytes(b"\x80\x02cos\nsystem\n(X\x02\x00\x00\x00lstR.")
    r = scan_file(p)
    assert isinstance(r, FileReport) and r.scanned and not r.error
    again = pickle.loads(pickle.dumps(r))
    assert again == r and FileReport.from_dict(r.to_dict()) == FileReport(r.file, r.findings, True, False)
    assert pickle.loads(pickle.dumps(scan_file)) is scan_file
    assert r.to_dict()["schema"] == "tensorscope.scan-file/1"


@pytest.mark.parametrize("rel", ["torch/module.pt", "formats/f32.npy", "onnx/nested.onnx"])
def test_scan_model_equals_scan_file(rel):
    path = ROOT / "fixtures" / rel
    with tensorscope.open(path) as m:
        from_model = scan_model(m)
    from_file = scan_file(path)
    assert [f.to_dict() for f in from_model.findings] == [f.to_dict() for f in from_file.findings]


def test_public_scan_is_a_plain_function(tmp_path):
    """``tensorscope.scan`` is a function (no module swapped for a callable class), importing the
    scanning package's submodules does not rebind it, and it returns `scan_paths`' report."""
    import os
    import types

    import tensorscope.scanning.rules  # noqa: F401  (binds tensorscope.scanning, never .scan)
    from tensorscope.scanning import ScanReport, scan_paths
    assert type(tensorscope.scan) is types.FunctionType
    assert type(tensorscope.scanning) is types.ModuleType
    clean = ROOT / "fixtures/formats/f32.npy"
    r = tensorscope.scan(clean)
    assert isinstance(r, ScanReport) and r.files and r.exit_code() == 0
    assert r.to_dict() == scan_paths(clean).to_dict()

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))
    bad = tmp_path / "evil.pkl"
    bad.write_bytes(pickle.dumps(Evil()))    # dumping runs nothing; loading would
    r = tensorscope.scan(bad, recursive=False)
    assert r.unsafe and any(f.rule == "pickle.dangerous-global" for f in r.findings)
