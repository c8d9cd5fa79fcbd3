"""Chat templates judged from jinja2's own tree: real templates (tests/chat_templates.py, which
transformers' own renderer renders) stay clean in GGUF files and HF repositories; spellings of
an escape are folded to the name they reach; parse failures, budgets and hostile sizes."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

import chat_templates
from tensorscope.scanning import Severity, jinja_tree, scan_paths

from helpers import gguf_with_template

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>greet</think>Hello"},
            {"role": "user", "content": "Bye"}]


@pytest.mark.parametrize("name", sorted(chat_templates.ALL))
def test_real_templates_render_in_transformers_and_scan_clean(tmp_path, name):
    template = chat_templates.ALL[name]
    # the oracle: transformers' own renderer (its sandbox, loopcontrols, {% generation %})
    from transformers.utils.chat_template_utils import render_jinja_template
    messages = MESSAGES[1:] if name in ("gemma2", "mistral") else MESSAGES
    if name == "gemma2" or name == "mistral":
        messages = [m for m in messages if m["role"] != "system"][:3]
    rendered, _ = render_jinja_template(conversations=[messages], chat_template=template,
                                        bos_token="<s>", eos_token="</s>",
                                        add_generation_prompt=True)
    assert rendered and "Hi" in rendered[0]
    assert jinja_tree.findings(template) == []
    gguf_with_template(tmp_path / "m.gguf", template)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"}))
    (tmp_path / "repo" / "chat_template.jinja").write_text(template)
    report = scan_paths(tmp_path)
    assert [str(f) for f in report.findings if f.severity > Severity.INFO] == []
    assert report.exit_code() == 0


def test_named_templates_in_one_gguf_are_each_judged(tmp_path):
    path = tmp_path / "named.gguf"
    gguf_with_template(path, [{"name": "default", "template": chat_templates.CHATML},
                 {"name": "tool_use", "template": chat_templates.QWEN25 +
                  "{{ ()|attr('\\x5f\\x5fclass\\x5f\\x5f') }}"}])
    [f] = [f for f in scan_paths(path).findings if f.rule == "gguf.chat-template-code"]
    assert (f.severity, f.trigger) == (Severity.CRITICAL, "__class__")


@pytest.mark.parametrize("template, level, evidence", [
    ("{{ x['__cla' ~ 'ss__'] }}", "escape", "__class__"),
    ("{{ x[('a__'|replace('a', '')) ~ 'class__'] }}", "escape", "__class__"),
    ("{{ x['_'|center(3)|trim * 2 ~ 'init' ~ '__'] }}", "escape", "__init__"),
    ("{{ x|selectattr('a.__class__') }}", "escape", "__class__"),
    ("{{ x|map('attr', '__class__')|list }}", "escape", "__class__"),
    ("{{ x['%s%sclass__'|format('_', '_')] }}", "escape", "__class__"),
    ("{{ '{0[__globals__]}'.format(x) }}", "escape", "__globals__"),
    ("{{ x.gi_frame }}", "escape", "gi_frame"),
    ("{% set a = ['_', 'x'] %}{% for c in a %}{{ y[c ~ c ~ 'class' ~ c ~ c] }}{% endfor %}",
     "escape", "__class__"),
    ("{% macro u() %}_{% endmacro %}{{ x|attr(u() ~ u() ~ 'class' ~ u() ~ u()) }}",
     "escape", "__class__"),
    ("{{ (cycler ~ '')[0] }}", "suspect", "cycler"),
    ("{{ joiner }}", "evidence", "joiner"),
    ("{% for %}", "unparsed", None),
])
def test_spellings_fold_to_what_they_reach(template, level, evidence):
    hits = jinja_tree.findings(template)
    assert hits and hits[0].level == level, hits
    if evidence:
        assert hits[0].evidence == evidence


@pytest.mark.parametrize("template", [
    "{{ message['content'] | trim }}{{ message.content.split('</think>')[-1] }}",
    "{% for k, v in tool.items() %}{{ k }}{{ v['type'] }}{% endfor %}",
    "{% set comma = joiner(', ') %}{% for t in tools %}{{ comma() }}{{ t.name }}{% endfor %}",
    "{{ '%-10s|'|format(x) }}{{ (x ~ '_' ~ y) }}{{ messages[loop_index]['role'] }}",
    "{{ 'a_b'.split('_')|join('-') }}{{ range(3)|list }}{{ namespace(a=1).a }}",
])
def test_ordinary_template_code_is_clean(template):
    assert jinja_tree.findings(template) == []


def test_an_unparsable_template_is_medium_in_a_repository(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{% if messages %}{{ messages[0] }}")
    [f] = scan_paths(tmp_path).findings
    assert (f.rule, f.severity) == ("hf.chat-template-code", Severity.MEDIUM)
    assert "does not parse" in f.message


def test_deep_and_large_templates_are_bounded():
    t0 = time.perf_counter()
    assert jinja_tree.findings("{{ " + "(" * 50_000 + "1" + ")" * 50_000 + " }}")[0].level == \
        "unparsed"
    big = "{% for m in messages %}{{ m['content'] }}{% endfor %}" * 2000
    assert jinja_tree.findings(big) == []
    # macro recursion with constant arguments is bounded by the memo and the step budget
    bomb = ("{% macro f(n) %}{{ f(n ~ 'a') }}{{ f(n ~ 'b') }}{% endmacro %}{{ f('') }}")
    jinja_tree.findings(bomb)
    assert jinja_tree.findings("x" * (jinja_tree.MAX_TEMPLATE + 1))[0].level == "unparsed"
    assert time.perf_counter() - t0 < 60


def test_nothing_is_compiled_or_rendered(monkeypatch):
    import jinja2
    calls = []
    monkeypatch.setattr(jinja2.Environment, "compile",
                        lambda *a, **k: calls.append("compile"))
    monkeypatch.setattr(jinja2.Environment, "from_string",
                        lambda *a, **k: calls.append("from_string"))
    jinja_tree.findings("{{ ''.__class__ }}{% if x %}")
    jinja_tree.findings(chat_templates.LLAMA31)
    assert calls == []


def test_hostile_template_soup_never_raises():
    import random
    rng = random.Random(3)
    pieces = ["{{ ", " }}", "{% ", " %}", "set ", "for ", " in ", "endfor", "if ", "endif",
              "macro ", "endmacro", "x", "y", "(", ")", "[", "]", "'_'", "'__'", "~", "+", "*",
              "|attr(", "|format(", "|first", "|join", "|string", "|list", "lipsum", "cycler",
              "namespace(", "dict(", "a_=1", ".__class__", ".format(", "'{0.a}'", ",", "=",
              "range(", "9", "-", "caller()", "call ", "endcall", "do ", "filter upper",
              "endfilter", "break", "self", "loop.index", "'%c'", "95"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        for hit in jinja_tree.findings(text):
            assert hit.level in ("escape", "suspect", "unparsed", "evidence")
