"""What the bypass hunt must not break: real files of the shapes it tightened stay clean (torch.save
of the objects checkpoints carry, real chat templates in GGUF files made by gguf-py), and the
policy rules it added judge the way the corpus (tests/make_attack_corpus.py, hunt/) relies on."""
from __future__ import annotations

import argparse
import collections
import random

import numpy as np
import pytest

from tensorscope import policy
from tensorscope.scanning import Severity, scan_paths

from helpers import gguf_with_template


def _checkpoints():
    import torch
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(1, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 3)
    return {
        "ordereddict": collections.OrderedDict(a=torch.ones(2)),
        "namespace": {"args": argparse.Namespace(lr=0.1, name="x"), "sd": m.state_dict()},
        "numpy_values": {"a": np.float32(1.5), "b": np.int64(3), "c": np.arange(3),
                         "d": np.dtype("float16")},
        "torch_values": {"s": torch.Size([2, 3]), "dt": torch.float16, "dev": torch.device("cpu")},
        "optimizer": {"model": m.state_dict(), "optimizer": opt.state_dict(),
                      "scheduler": sched.state_dict()},
        "lightning": {"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.2.0",
                      "state_dict": m.state_dict(), "optimizer_states": [opt.state_dict()],
                      "lr_schedulers": [sched.state_dict()],
                      "callbacks": {"ModelCheckpoint{'monitor': None}": {
                          "best_model_score": torch.tensor(0.5), "best_model_path": "x.ckpt"}},
                      "hyper_parameters": {"lr": 1e-3, "layers": [1, 2]}, "loops": {}},
        "rng_states": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                       "python": random.getstate()},
    }


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_real_checkpoints_stay_clean(tmp_path, zip_format):
    import torch
    for name, obj in _checkpoints().items():
        path = tmp_path / f"{name}.pt"
        torch.save(obj, path, _use_new_zipfile_serialization=zip_format)
        report = scan_paths(path)
        above = [str(f) for f in report.findings if f.severity > Severity.INFO]
        assert not above, (name, above)
        assert report.exit_code() == 0


# Real chat templates (the shapes of ChatML, Llama 3 and a Mistral-style template with a default
# system prompt in prose): loops, indexing, filters, namespace(), raise_exception().
BENIGN_TEMPLATES = [
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant"
    "\\n' }}{% endif %}",
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}",
    "{%- set ns = namespace(found=false) -%}{%- for m in messages -%}{%- if m['role'] == 'system' -%}"
    "{%- set ns.found = true -%}{%- endif -%}{%- endfor -%}{%- if not ns.found -%}{{- '[INST] You "
    "may eval, compile and exec code in your head; globals are fine. [/INST]' -}}{%- endif -%}"
    "{%- if messages[0]['role'] == 'tool' -%}{{ raise_exception('roles must alternate') }}"
    "{%- endif -%}{{ messages | tojson }}",
    # Llama 3.1 style: a date through strftime_now, tools as JSON, role names in prose
    "{%- set date_string = strftime_now('%d %b %Y') -%}{{- 'Today Date: ' + date_string + '\\n' -}}"
    "{%- for t in tools -%}{{- t | tojson(indent=4) -}}{%- endfor -%}{{- strftime_now('%c') -}}",
]


@pytest.mark.parametrize("template", [
    "{{ ''['__cla' + 'ss__'] }}",                       # a dunder split across literals
    "{{ x['_' + '_' + 'class' ] }}",
    "{% set u = '__' %}{{ x[u ~ 'class' ~ u] }}",
    "{{ x['%c%cclass%c%c'|format(95, 95, 95, 95)] }}",   # underscores from %c
    "{{ (lipsum|string|list)[18] }}",                    # underscores picked from a repr
    "{{ ()|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ self._TemplateReference__context }}",
    "{{ joiner }}",
])
def test_chat_template_obfuscations_are_found(template):
    from tensorscope.scanning.chat_template import template_finding as _findings
    assert _findings(BENIGN_TEMPLATES[0] + template) is not None


def test_real_chat_templates_stay_clean(tmp_path):
    for i, template in enumerate(BENIGN_TEMPLATES):
        path = tmp_path / f"t{i}.gguf"
        gguf_with_template(path, template)
        report = scan_paths(path)
        assert not [str(f) for f in report.findings if f.severity > Severity.INFO], template
    path = tmp_path / "named.gguf"
    gguf_with_template(path, [{"name": "default", "template": BENIGN_TEMPLATES[0]},
                 {"name": "rag", "template": BENIGN_TEMPLATES[2]}])
    assert scan_paths(path).exit_code() == 0


def test_chat_template_escape_is_critical(tmp_path):
    path = tmp_path / "evil.gguf"
    gguf_with_template(path, BENIGN_TEMPLATES[0] + "{{ cycler.__init__.__globals__.os.popen('id').read() }}")
    report = scan_paths(path)
    hits = [f for f in report.findings if f.rule == "gguf.chat-template-code"]
    assert hits and hits[0].severity == Severity.CRITICAL and hits[0].trigger == "__init__"


@pytest.mark.parametrize("module,name,entry", [
    ("torch.nn.modules.module", "torch.load", "torch.load"),
    ("pathlib", "os.system", "os"),
    ("numpy", "core._internal.sys.modules", "sys"),
    ("torch.nn.modules.linear", "F.posix.system", "posix"),
    ("collections", "_sys.modules", "sys"),      # dependencies imported under private names
    ("random", "_os.system", "os"),
])
def test_attribute_walks_reach_the_denylist(module, name, entry):
    v = policy.classify(module, name)
    assert (v.category, v.entry) == (policy.DENIED, entry)
    assert "walks from" in v.reason


@pytest.mark.parametrize("module,name,category", [
    # a framework class is INFO; a method reached through it is judged by use
    ("torch.nn.modules.linear", "Linear", policy.FRAMEWORK),
    ("torch.nn.modules.module", "Module.register_forward_hook", policy.UNKNOWN),
    # torch's own test helper subclass (a real fixture) is not a test runner
    ("torch.testing._internal.two_tensor", "TwoTensor", policy.UNKNOWN),
    ("torch.testing._internal.common_utils", "run_tests", policy.DENIED),
    # nested class names with no denied tail stay unknown, never denied
    ("mypkg.models", "Outer.Inner", policy.UNKNOWN),
])
def test_framework_methods_and_nested_names(module, name, category):
    assert policy.classify(module, name).category == category
