"""Scan configuration through the CLI: tensorscope.toml, [tool.tensorscope.scan] in pyproject.toml,
--config, --ignore RULE[:GLOB], --severity RULE=LEVEL, --output; unknown keys and rule ids are
errors; suppressed findings stay visible (JSON, SARIF, the table); a critical finding is hidden
only by an ignore naming its rule and its file."""
from __future__ import annotations

import json
import os
import pickle
import zipfile

import pytest
import torch

from tensorscope.cli import main
from tensorscope.scanning.rules import RULES

CRIT = "pickle.dangerous-global"
MED = "pickle.user-class"
LOW = "zip.comment"


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo tensorscope-pwned",))   # never run: the file is only scanned


@pytest.fixture()
def repo(tmp_path, monkeypatch):
    """A repository with a critical, a medium and a low finding, each in its own file, made by
    the real writers (pickle.dumps, torch.save, zipfile)."""
    models = tmp_path / "models"
    (models / "sk").mkdir(parents=True)
    (models / "evil.pkl").write_bytes(pickle.dumps(_Evil(), protocol=4))
    # a pickle of a user class (as a scikit-learn pipeline's): GLOBAL, NEWOBJ, BUILD
    (models / "sk" / "pipe.pkl").write_bytes(b"\x80\x02cmylib.models\nPipeline\n)\x81}b.")
    torch.save({"w": torch.zeros(2)}, models / "c.pt")
    with zipfile.ZipFile(models / "c.pt", "a") as z:
        z.comment = b"exported by ci"
    monkeypatch.chdir(tmp_path)
    return tmp_path


def scan(capsys, *args):
    code = main(["scan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def scan_json(capsys, *args):
    code, out, err = scan(capsys, *args, "--json")
    return code, json.loads(out), err


def rules_of(items):
    return sorted(f["rule"] for f in items)


def test_rules_the_tests_use_exist():
    assert {CRIT, MED, LOW} <= set(RULES)


def test_plain_scan_sees_all_three(repo, capsys):
    code, doc, _ = scan_json(capsys, "models")
    assert code == 1
    assert rules_of(doc["findings"]) == sorted([CRIT, MED, LOW])
    assert doc["suppressed"] == [] and doc["config"] is None


def test_tensorscope_toml_found_from_the_scanned_path_upwards(repo, capsys):
    (repo / "tensorscope.toml").write_text(
        '[scan]\nignore = [{rule = "zip.comment", reason = "our exporter writes one"}]\n'
        'per-path-ignores = {"models/sk/*.pkl" = ["pickle.user-class"]}\n'
        'reasons = {"pickle.user-class" = "reviewed pipeline, PR 412"}\n')
    code, doc, _ = scan_json(capsys, "models/sk", "models/c.pt")
    assert code == 0
    assert doc["findings"] == []
    got = {f["rule"]: f["suppression"] for f in doc["suppressed"]}
    assert got[LOW]["reason"] == "our exporter writes one"
    assert got[MED]["reason"] == "reviewed pipeline, PR 412"
    assert got[MED]["path"] == "models/sk/*.pkl" and got[MED]["kind"] == "config"
    assert os.path.samefile(doc["config"], repo / "tensorscope.toml")
    # the glob is the config folder's: from elsewhere the same scan is judged the same
    os.chdir(repo / "models")
    code, doc, _ = scan_json(capsys, "sk")
    assert code == 0 and rules_of(doc["suppressed"]) == [MED]


def test_pyproject_table_and_one_without_it_is_passed_over(repo, capsys):
    (repo / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.tensorscope.scan]\nfail-on = "high"\n'
        'severity = {"pickle.user-class" = "high"}\n')
    (repo / "models" / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    code, doc, _ = scan_json(capsys, "models/sk")
    assert code == 1   # raised to high, and fail-on high
    assert [f["severity"] for f in doc["findings"]] == ["high"]
    assert os.path.samefile(doc["config"], repo / "pyproject.toml")
    # fail-on from the file: a low finding passes; the flag wins over the file
    assert scan(capsys, "models/c.pt")[0] == 0
    assert scan(capsys, "models/c.pt", "--fail-on", "low")[0] == 1


def test_config_flag_and_no_config(repo, capsys):
    cfg = repo / "elsewhere.toml"
    cfg.write_text('[tool.tensorscope.scan]\nignore = ["zip.comment"]\n')
    (repo / "tensorscope.toml").write_text('[scan]\nfail-on = "critical"\n')
    code, doc, _ = scan_json(capsys, "models/c.pt", "--config", str(cfg), "--fail-on", "info")
    assert code == 0 and rules_of(doc["suppressed"]) == [LOW]
    assert scan(capsys, "models/c.pt", "--no-config", "--fail-on", "low")[0] == 1
    assert scan(capsys, "models/c.pt", "--fail-on", "low")[0] == 1   # the found one has no ignore


@pytest.mark.parametrize("text, named", [
    ('[scan]\nfail_on = "high"\n', "'fail_on'"),
    ('[scan]\nignores = ["zip.comment"]\n', "'ignores'"),
    ('[scan]\nignore = ["zip.coment"]\n', "'zip.coment'"),
    ('[scan]\nper-path-ignores = {"*.pt" = ["no.such-rule"]}\n', "'no.such-rule'"),
    ('[scan]\nseverity = {"zip.comment" = "severe"}\n', "'severe'"),
    ('[scan]\nseverity = {"zip.nope" = "low"}\n', "'zip.nope'"),
    ('[scan]\nreasons = {"zip.nope" = "x"}\n', "'zip.nope'"),
    ('[scan]\nignore = [{rule = "zip.comment", why = "x"}]\n', "'why'"),
    ('[scanner]\n', "'scanner'"),
    ('[scan\n', "not valid TOML"),
])
def test_unknown_key_or_rule_is_one_error_line(repo, capsys, text, named):
    (repo / "tensorscope.toml").write_text(text)
    code, out, err = scan(capsys, "models/c.pt")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "tensorscope.toml" in lines[0], err


@pytest.mark.parametrize("args, named", [
    (["--ignore", "zip.coment"], "'zip.coment'"),
    (["--ignore", "zip.comment:"], "empty path"),
    (["--severity", "zip.comment"], "RULE=LEVEL"),
    (["--severity", "zip.comment=loud"], "'loud'"),
    (["--severity", "nope=low"], "'nope'"),
])
def test_bad_flags_are_one_error_line(repo, capsys, args, named):
    code, out, err = scan(capsys, "models", "--no-config", *args)
    assert code == 2 and named in err and len(err.strip().splitlines()) == 1


def test_ignore_flag_with_and_without_glob(repo, capsys):
    code, doc, _ = scan_json(capsys, "models", "--ignore", LOW, "--ignore", f"{MED}:models/**/*.pkl")
    assert rules_of(doc["findings"]) == [CRIT] and rules_of(doc["suppressed"]) == sorted([LOW, MED])
    assert {f["suppression"]["kind"] for f in doc["suppressed"]} == {"command-line"}
    # the file's reasons table gives a flag's ignore its reason
    (repo / "tensorscope.toml").write_text('[scan]\nreasons = {"zip.comment" = "exporter"}\n')
    code, doc, _ = scan_json(capsys, "models", "--ignore", LOW)
    assert [f["suppression"]["reason"] for f in doc["suppressed"]] == ["exporter"]
    # a glob that matches nothing hides nothing
    code, doc, _ = scan_json(capsys, "models", "--ignore", f"{MED}:other/*.pkl")
    assert MED in rules_of(doc["findings"])


def test_critical_needs_its_rule_and_its_path_named(repo, capsys):
    for ignore in (CRIT, f"{CRIT}:models/*.pkl", f"{CRIT}:**/evil.pkl", f"{CRIT}:evil.pkl"):
        code, doc, err = scan_json(capsys, "models/evil.pkl", "--ignore", ignore)
        assert code == 1, ignore
        assert rules_of(doc["findings"]) == [CRIT] and doc["suppressed"] == []
        assert "does not hide a critical finding" in err
        assert doc["suppressions_refused"]
    code, doc, err = scan_json(capsys, "models/evil.pkl", "--ignore", f"{CRIT}:models/evil.pkl")
    assert code == 0 and rules_of(doc["suppressed"]) == [CRIT] and err == ""
    # the same from a config file, the path relative to it
    (repo / "tensorscope.toml").write_text(
        '[scan]\nper-path-ignores = {"models/evil.pkl" = [{rule = "pickle.dangerous-global", '
        'reason = "our fixture"}]}\n')
    code, doc, _ = scan_json(capsys, "models")
    assert rules_of(doc["findings"]) == sorted([MED, LOW])
    assert [f["suppression"]["reason"] for f in doc["suppressed"]] == ["our fixture"]


def test_severity_override_cannot_lower_a_critical(repo, capsys):
    code, doc, err = scan_json(capsys, "models", "--severity", f"{CRIT}=low",
                               "--severity", f"{LOW}=info", "--fail-on", "low")
    sev = {f["rule"]: f["severity"] for f in doc["findings"]}
    assert sev[CRIT] == "critical" and sev[LOW] == "info" and sev[MED] == "medium"
    assert "does not lower a critical finding" in err
    assert code == 1


def test_suppressed_findings_in_sarif_and_the_table(repo, capsys):
    code, out, _ = scan(capsys, "models", "--ignore", LOW, "--ignore", MED, "--sarif")
    results = json.loads(out)["runs"][0]["results"]
    by_rule = {r["ruleId"]: r for r in results}
    assert set(by_rule) == {CRIT, MED, LOW}
    assert "suppressions" not in by_rule[CRIT]
    for rid in (MED, LOW):
        (s,) = by_rule[rid]["suppressions"]
        assert s["kind"] == "external" and s["status"] == "accepted" and s["justification"]
    code, out, _ = scan(capsys, "models", "--ignore", LOW, "--ignore", MED)
    assert code == 1 and "2 suppressed" in out and "1 critical" in out
    assert "zip.comment" not in out   # listed in JSON/SARIF, counted in the table


def test_output_file_for_every_format(repo, capsys):
    for fmt in ("--json", "--sarif", None):
        dest = repo / f"report{fmt or ''}.out"
        code, out, _ = scan(capsys, "models", *([fmt] if fmt else []), "--output", str(dest))
        assert code == 1 and out == ""
        text = dest.read_text()
        if fmt == "--json":
            assert json.loads(text)["counts"]["critical"] == 1
        elif fmt == "--sarif":
            assert json.loads(text)["version"] == "2.1.0"
        else:
            assert "pickle.dangerous-global" in text and "\x1b[" not in text


def test_differing_configs_for_two_paths_are_an_error(repo, capsys):
    (repo / "models" / "sk" / "tensorscope.toml").write_text("[scan]\n")
    (repo / "tensorscope.toml").write_text("[scan]\n")
    code, _, err = scan(capsys, "models/sk", "models/c.pt")
    assert code == 2 and "--config" in err


def test_refusal_warning_shows_hostile_names_escaped(repo, capsys):
    hostile = repo / "models" / "x\x1b]0;owned\x07\u202e.pkl"
    hostile.write_bytes(pickle.dumps(_Evil(), protocol=4))
    code, doc, err = scan_json(capsys, "models", "--ignore", CRIT)
    assert code == 1 and "does not hide a critical finding" in err
    assert "\x1b" not in err and "\u202e" not in err and "\\x1b" in err and "\\u202e" in err
