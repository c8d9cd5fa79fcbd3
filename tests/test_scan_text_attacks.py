"""Text that loaders parse, attacked by spelling (tests/make_text_attacks.py): every case is
caught at its severity whatever spelling its parser resolves; evidence-only text stays low."""
from __future__ import annotations

import pytest

import make_text_attacks as corpus
from tensorscope.scanning import Severity, scan_paths


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("text_attacks")
    return {c.name: c for c in corpus.build(out)}


def test_every_case_cites_its_source_and_is_at_least_medium(cases):
    assert len(cases) >= 60
    for case in cases.values():
        assert case.source, case.name
        assert Severity[case.severity.upper()] >= Severity.MEDIUM, case.name


def test_every_attack_is_caught_at_its_severity(cases):
    missed = []
    for case in cases.values():
        report = scan_paths(case.path)
        hits = [f for f in report.findings if f.rule == case.rule]
        worst = max((f.severity for f in hits), default=None)
        if worst is None or worst < Severity[case.severity.upper()]:
            missed.append((case.name, case.rule, case.severity,
                           [(f.rule, str(f.severity)) for f in report.findings]))
        elif report.exit_code() != 1:
            missed.append((case.name, "exit code", report.exit_code()))
    assert not missed


@pytest.mark.parametrize("name", ["gguf_closer_in_string", "gguf_unicode_escape",
                                  "gguf_first_last_filters", "yaml_verbatim_tag",
                                  "yaml_tag_directive", "yaml_escaped_key", "pt2_expr_str"])
def test_the_resolved_form_is_what_is_named(cases, name):
    """The finding names what the parser resolved, not the spelling in the bytes."""
    case = cases[name]
    triggers = {f.trigger for f in scan_paths(case.path).findings if f.rule == case.rule}
    resolved = {"gguf_closer_in_string": "__init__", "gguf_unicode_escape": "__class__",
                "gguf_first_last_filters": "__class__", "yaml_verbatim_tag": "os.system",
                "yaml_tag_directive": "os.system", "yaml_escaped_key": "os.system"}.get(name)
    if resolved:
        assert resolved in triggers, triggers
    else:
        assert triggers


def test_evidence_only_text_is_low(tmp_path):
    for case in corpus.build_evidence(tmp_path):
        report = scan_paths(case.path)
        hits = [f for f in report.findings if f.rule == case.rule]
        assert hits and max(f.severity for f in hits) == Severity.LOW, case.name
        assert report.severity <= Severity.LOW
