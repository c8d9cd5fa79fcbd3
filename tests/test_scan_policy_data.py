"""The policy's data: the stdlib-derived code-running list (tools/derive_stdlib_gadgets.py), the
reviewed third-party list, torch's weights-only allowlist and skops' trusted types, each checked
against the library it was taken from."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tensorscope import policy
from tensorscope.scanning.report import Severity
from tensorscope.scanning.rules import RULES, SEVERITY_MEANING

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tensorscope" / "policy_data"


def _derive_module():
    spec = importlib.util.spec_from_file_location("derive_stdlib_gadgets",
                                                  ROOT / "tools" / "derive_stdlib_gadgets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)   # the project's own tool, not a file under scan
    return mod


def test_stdlib_list_is_what_the_derivation_produces():
    data = json.loads((DATA / "stdlib_code_running.json").read_text())
    prov = data["provenance"]
    assert prov["generator"] == "tools/derive_stdlib_gadgets.py" and prov["count"] == len(data["entries"])
    assert all(v["path"].startswith(k + " -> ") and v["does"] for k, v in data["entries"].items())
    if prov["python"] != sys.version.split()[0]:
        pytest.skip(f"derived on Python {prov['python']}, running {sys.version.split()[0]}")
    fresh = _derive_module().build()
    assert fresh["entries"] == data["entries"]
    assert fresh["compile_only"] == data["compile_only"]


@pytest.mark.parametrize("dotted", [
    "typing.get_type_hints", "typing._eval_type", "pstats.Stats", "timeit.Timer",
    "collections.namedtuple", "gettext.c2py", "warnings._getcategory", "dataclasses.dataclass",
    "shutil.rmtree", "tempfile.TemporaryFile", "pathlib.Path.write_text", "logging.config.listen",
    "subprocess.Popen", "multiprocessing.popen_fork.Popen", "os.popen", "code.InteractiveInterpreter.runsource"])
def test_derivation_finds_the_known_gadgets(dotted):
    assert policy.matches(dotted, policy.STDLIB_CODE_RUNNING), dotted
    mod, _, name = dotted.rpartition(".")
    # judged code-running whichever way the module/name split is written
    assert policy.classify(mod, name).category == policy.DENIED


@pytest.mark.parametrize("dotted", [
    "collections.OrderedDict", "argparse.Namespace", "pathlib.PosixPath", "pathlib.Path",
    "re._compile", "datetime.datetime", "decimal.Decimal", "fractions.Fraction", "uuid.UUID",
    "types.SimpleNamespace", "copyreg._reconstructor", "codecs.encode", "enum.Enum",
    "functools.partial",   # denied by the hand list, not by the derivation: it calls nothing itself
    "typing.Optional"])    # reaches only compile() (a ForwardRef): compiles, runs nothing
def test_derivation_leaves_inert_stdlib_alone(dotted):
    assert not policy.matches(dotted, policy.STDLIB_CODE_RUNNING), policy.STDLIB_CODE_RUNNING.get(dotted)


def test_no_code_running_entry_shadows_the_allowlist():
    for table in (policy.STDLIB_CODE_RUNNING, policy.THIRD_PARTY_CODE_RUNNING, policy.DENYLIST):
        assert not (set(table) & policy.SAFE_GLOBALS)
    for dotted in policy.SAFE_GLOBALS:
        mod, _, name = dotted.rpartition(".")
        assert policy.classify(mod, name).category == policy.ALLOWED, dotted


def test_third_party_list_is_reviewed_data():
    data = json.loads((DATA / "third_party_code_running.json").read_text())
    assert data["provenance"]["reviewed"]
    for dotted, entry in data["entries"].items():
        assert entry["reason"] and entry["source"], dotted
        mod, _, name = dotted.rpartition(".")
        assert policy.classify(mod, name).category == policy.DENIED, dotted


def test_weights_only_table_is_torchs_exactly():
    torch_wo = pytest.importorskip("torch._weights_only_unpickler")
    assert set(torch_wo._get_allowed_globals()) == set(policy.WEIGHTS_ONLY_GLOBALS)


def test_skops_trusted_types_are_skops_own():
    pytest.importorskip("skops")
    from skops.io import _trusted_types as t
    data = json.loads((DATA / "skops_trusted.json").read_text())
    theirs = {n for lst in data["provenance"]["lists"] for n in getattr(t, lst)}
    assert set(data["trusted"]) == theirs


def test_every_severity_has_one_meaning_and_new_rules_are_declared():
    assert set(SEVERITY_MEANING) == set(Severity)
    for rid, sev in (("pickle.library-class", Severity.MEDIUM), ("pickle.unknown-import", Severity.MEDIUM),
                     ("pickle.resource-bomb", Severity.HIGH), ("file.empty", Severity.MEDIUM),
                     ("archive.torchserve-handler", Severity.MEDIUM), ("onnx.local-functions", Severity.INFO),
                     ("skops.untrusted-type", Severity.MEDIUM), ("pickle.framework-class", Severity.INFO)):
        assert RULES[rid].severity == sev, rid


def test_docs_and_list_rules_show_the_one_severity_table(capsys):
    import json as _json

    from tensorscope import cli
    doc = (ROOT / "docs" / "scan.md").read_text()
    for sev, text in SEVERITY_MEANING.items():
        assert f"| {sev} | {text} |" in doc, sev
    assert cli.main(["scan", "--list-rules", "--json"]) == 0
    out = _json.loads(capsys.readouterr().out)
    assert out["severities"] == {str(k): v for k, v in SEVERITY_MEANING.items()}
    assert cli.main(["scan", "--list-rules"]) == 0
    assert "loading the file" in capsys.readouterr().out
