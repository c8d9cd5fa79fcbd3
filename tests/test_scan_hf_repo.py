"""Hugging Face repositories: the code (auto_map, custom_generate, diffusers components) and the
chat templates their loaders run. The repositories are what transformers 4.57 wrote
(`fixtures/gen_hf_repo.py`) and their hostile edits; nothing in them is imported or rendered."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tensorscope.cli import main
from tensorscope.scanning import Severity, scan_paths
from tensorscope.scanning import torchscript

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf_repo")


def _hits(report, rule=None):
    return sorted((f.rule, os.path.relpath(f.file, FIX) if os.path.isabs(f.file) or
                   f.file.startswith(FIX) else f.file, f.severity.name.lower(), f.trigger or "")
                  for f in report.findings if rule is None or f.rule == rule)


def _scan(name):
    return scan_paths(os.path.join(FIX, name))


def test_plain_repository_with_a_real_chat_template_is_clean():
    report = _scan("plain")
    assert report.findings == [] and report.exit_code() == 0


def test_remote_code_is_medium_for_the_config_and_each_named_file():
    report = _scan("remote_code")
    assert _hits(report) == [
        ("hf.remote-code", "remote_code/config.json", "medium", "configuration_tiny"),
        ("hf.remote-code", "remote_code/configuration_tiny.py", "medium", ""),
        ("hf.remote-code", "remote_code/modeling_tiny.py", "medium", ""),
    ]
    config = json.load(open(os.path.join(FIX, "remote_code", "config.json")))
    # the files named are those transformers wrote into the auto_map
    assert {v.split(".")[0] for v in config["auto_map"].values()} == \
        {"configuration_tiny", "modeling_tiny"}


def test_a_named_file_that_runs_a_command_is_critical():
    report = _scan("hostile_modeling")
    crit = [h for h in _hits(report) if h[2] == "critical"]
    assert crit == [("hf.remote-code", "hostile_modeling/modeling_tiny.py", "critical",
                     "os.system")]
    assert report.unsafe


def test_a_relative_import_nobody_names_is_followed():
    report = _scan("hostile_relative")
    crit = [h for h in _hits(report) if h[2] == "critical"]
    assert ("hf.remote-code", "hostile_relative/helpers_tiny.py", "critical", "subprocess") in crit
    assert ("hf.remote-code", "hostile_relative/helpers_tiny.py", "critical",
            "subprocess.Popen") in crit
    why = [f.message for f in report.findings if f.file.endswith("helpers_tiny.py")
           and f.severity == Severity.MEDIUM]
    assert why and "relative import" in why[0]


def test_code_of_another_repository_is_high_and_unnamed_files_are_not_judged():
    report = _scan("other_repo")
    assert ("hf.remote-code", "other_repo/config.json", "high", "attacker/tiny-code") in \
        _hits(report)
    # modeling_tiny.py is no longer named by the auto_map: a file nothing loads
    assert not [f for f in report.findings if f.file.endswith("modeling_tiny.py")]


def test_chat_template_escapes_are_high_in_both_places():
    report = _scan("hostile_template")
    assert _hits(report) == [
        ("hf.chat-template-code", "hostile_template/chat_template.jinja", "high", "__init__"),
        ("hf.chat-template-code", "hostile_template/tokenizer_config.json", "high", "__init__"),
    ]


def test_custom_generate_and_diffusers_components():
    report = _scan("custom_generate")
    assert {h[3] for h in _hits(report) if h[2] == "critical"} == \
        {"exec", "urllib.request.urlopen"}
    report = _scan("diffusers_custom")
    assert _hits(report) == [
        ("hf.remote-code", "diffusers_custom/model_index.json", "medium", "unet/my_unet.py"),
        ("hf.remote-code", "diffusers_custom/unet/my_unet.py", "critical", "os.system"),
        ("hf.remote-code", "diffusers_custom/unet/my_unet.py", "medium", ""),
    ]


def test_nothing_is_imported():
    before = set(sys.modules)
    for name in os.listdir(FIX):
        _scan(name)
    assert not {m for m in set(sys.modules) - before
                if "tiny" in m or "unet" in m or "generate" in m}


def test_explicit_python_file_is_judged_even_when_unnamed(tmp_path):
    shutil.copytree(os.path.join(FIX, "other_repo"), tmp_path / "r")
    path = tmp_path / "r" / "modeling_tiny.py"
    path.write_text(path.read_text() + "\nimport os as o\no.popen('id')\n")
    report = scan_paths(path)
    assert [(f.rule, f.severity, f.trigger) for f in report.findings] == \
        [("hf.remote-code", Severity.CRITICAL, "os.popen")]
    assert "nothing in the repository names this file" in report.findings[0].message
    benign = tmp_path / "tool.py"
    benign.write_text("import json\nprint(json.dumps({}))\n")
    assert [f.rule for f in scan_paths(benign).findings] == ["file.not-a-model"]


@pytest.mark.parametrize("source, trigger", [
    ("import subprocess\nclass XConfig:\n    pass\n", "subprocess"),     # no NEWLINE token
    ("import os, subprocess as sp\n", "subprocess"),
    ("import os as o\no.system('id')\n", "os.system"),
    ("from os import popen\npopen('id')\n", "os.popen"),
    ("from importlib import import_module as im\nim('x')\n", "importlib.import_module"),
    ("from builtins import exec\nexec('1')\n", "builtins.exec"),
    ("from shutil import rmtree\nrmtree('/')\n", "shutil.rmtree"),
])
def test_source_dangers_follow_imports_and_aliases(source, trigger):
    assert trigger in [t for t, _ in torchscript.source_dangers(source)]


@pytest.mark.parametrize("source", [
    "import torch\nfrom torch import nn\n\nclass M(nn.Module):\n    def forward(self, x):\n"
    "        self.eval()\n        return torch.compile(x)\n",
    "import os\nfrom os.path import join\njoin(os.path.dirname(__file__), 'x')\n",
    "from .configuration_x import XConfig\nimport re\nre.compile('a')\n",
])
def test_ordinary_model_code_has_no_dangers(source):
    assert torchscript.source_dangers(source) == []


def test_cli_exit_codes_and_jobs(capsys, tmp_path):
    assert main(["scan", os.path.join(FIX, "plain")]) == 0
    assert main(["scan", os.path.join(FIX, "hostile_modeling")]) == 1
    capsys.readouterr()
    main(["scan", "--json", os.path.join(FIX, "hostile_relative")])
    sequential = json.loads(capsys.readouterr().out)
    main(["scan", "--json", "--jobs", "2", os.path.join(FIX, "hostile_relative")])
    assert json.loads(capsys.readouterr().out)["findings"] == sequential["findings"]


@pytest.fixture()
def hub(monkeypatch):
    pytest.importorskip("huggingface_hub")
    import fsspec
    from huggingface_hub import HfFileSystem

    from http_server import HubServer
    with HubServer() as server:
        server.commit("org/tiny", os.path.join(FIX, "hostile_relative"))
        monkeypatch.setitem(fsspec.config.conf, "hf", {"endpoint": server.endpoint})
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        HfFileSystem.clear_instance_cache()
        try:
            yield server
        finally:
            HfFileSystem.clear_instance_cache()


def test_a_repository_on_the_hub_reads_as_the_local_one(hub):
    remote = scan_paths("hf://org/tiny")
    local = _scan("hostile_relative")
    assert sorted((f.rule, f.severity, f.trigger or "", os.path.basename(f.file))
                  for f in remote.findings) == \
        sorted((f.rule, f.severity, f.trigger or "", os.path.basename(f.file))
               for f in local.findings)


def test_hostile_names_in_an_auto_map_stay_inside_and_print_clean(tmp_path, capsys):
    from tensorscope import safetext
    (tmp_path / "secret.py").write_text("import subprocess\n")
    sub = tmp_path / "repo"
    sub.mkdir()
    (sub / "config.json").write_text(json.dumps({"auto_map": {
        "AutoModel": "../secret.X", "AutoConfig": "mod\x1b]0;pwned\x07\u202e.Y",
        "AutoTokenizer": ["x\x1b[2J--tok.Z", None], "Bad": {"nested": 1}}}))
    report = scan_paths(sub)
    # the path out of the folder is named, never read: no finding for secret.py's subprocess
    assert not [f for f in report.findings if f.severity == Severity.CRITICAL]
    assert {f.severity for f in report.findings} == {Severity.MEDIUM, Severity.HIGH}
    assert main(["scan", str(sub)]) == 1
    out = capsys.readouterr().out
    assert safetext.is_clean(out) and "\x1b" not in out
    main(["scan", "--json", str(sub)])
    json.loads(capsys.readouterr().out)


def _grows_linearly(fn, unit: str, n: int = 4000) -> bool:
    """fn on 4x the input costs under 10x (quadratic is 16x): best of three, one process."""
    import time

    def cost(k):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            fn(unit * k)
            best = min(best, time.perf_counter() - t0)
        return best
    small, large = cost(n), cost(4 * n)
    return large < 10 * small + 0.05


@pytest.mark.perf  # machine-dependent bound: its own step of .ci/run
@pytest.mark.parametrize("what, unit", [
    ("from_os_lines", "\n"),           # `^\s*` under re.M rescanned every following blank line
    ("relative_lines", "\n"),
    ("unclosed_tags", "{{ "),          # a lazy `.*?` rescanned to the end from every opener
    ("tags_far_opener", "{{a}}"),      # the other opener searched again from every tag
    ("from_from", "from "),            # an import walk ran to the end of the line from each
    ("blanks_then_bang", " "),         # tokenize: an ERRORTOKEN per blank of a run before `!`
    ("import_as_blanks", " "),         # two quantifiers that could both take the blanks
    ("from_os_blanks", "\t "),
])
def test_hostile_text_is_read_in_linear_time(what, unit):
    from tensorscope.scanning import chat_template, hf_repo
    fn = {"from_os_lines": lambda t: list(torchscript._FROM_OS_IMPORT.finditer(t)),
          "relative_lines": hf_repo._relative_imports,
          "unclosed_tags": chat_template.template_finding,
          "tags_far_opener": lambda t: chat_template.template_finding(t + "{%"),
          "from_from": torchscript.source_dangers,
          "blanks_then_bang": lambda t: torchscript.source_dangers("from os import" + t + "!\n"),
          "import_as_blanks": lambda t: list(torchscript._IMPORT_AS.finditer("import a" + t + "!")),
          "from_os_blanks": lambda t: list(torchscript._FROM_OS_IMPORT.finditer(
              "from os import" + t + "!")),
          }[what]
    assert _grows_linearly(fn, unit)


def test_templates_are_parsed_as_jinja2_parses_them():
    """The tags were once found with a regex; now the tree is jinja2's own: a template parses
    for the scan exactly when it parses for jinja2 (the renderer's Environment shape)."""
    import random

    import jinja2

    from tensorscope.scanning import jinja_tree
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    rng = random.Random(7)
    for _ in range(3000):
        t = "".join(rng.choice(["{{", "}}", "{%", "%}", "a", "{", "}", "%", " ", "'", "x.y",
                                "for ", "endfor", " in ", "if ", "endif"])
                    for _ in range(rng.randint(0, 24)))
        try:
            env.parse(t)
            ok = True
        except (jinja2.TemplateSyntaxError, RecursionError):
            ok = False
        unparsed = [h for h in jinja_tree.findings(t) if h.level == jinja_tree.UNPARSED]
        assert ok == (not unparsed), t


def test_large_sources_are_cut_and_text_is_not_zlib(tmp_path):
    import zlib

    from tensorscope.parsers.compression import compression
    repo = tmp_path / "r"
    repo.mkdir()
    (repo / "config.json").write_text('{"auto_map": {"AutoModel": "modeling_x.X"}}')
    # "x = ..." passes zlib's header checksum (0x7820 % 31 == 0) with FDICT set: text, not zlib
    (repo / "modeling_x.py").write_text("x = foo(1)\n" * 120_000 + "import os\nos.system('id')\n")
    report = scan_paths(repo)
    assert {(f.rule, f.severity) for f in report.findings} == {
        ("hf.remote-code", Severity.MEDIUM), ("hf.remote-code", Severity.HIGH)}
    assert any("only the first" in f.message for f in report.findings)
    assert compression(b"x = 1") is None and compression(zlib.compress(b"abc")) == "zlib"
    assert compression(zlib.compress(b"abc", 9)[:2]) == "zlib"


def test_inspect_points_at_the_code_a_repository_names(capsys):
    from tensorscope import safetext
    assert main(["inspect", os.path.join(FIX, "remote_code")]) == 0
    out = capsys.readouterr().out
    assert "configuration_tiny.py, modeling_tiny.py" in out and "tensorscope scan" in out
    assert main(["inspect", os.path.join(FIX, "other_repo", "model.safetensors")]) == 0
    assert "attacker/tiny-code--modeling_evil.py" in capsys.readouterr().out
    assert main(["inspect", os.path.join(FIX, "plain")]) == 0
    out = capsys.readouterr().out
    assert "trust_remote_code" not in out and safetext.is_clean(out)


def test_a_hugging_face_cache_snapshot(tmp_path, capsys):
    """huggingface_hub's cache: snapshot links into content-addressed blobs (no extension)."""
    import hashlib
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    src = os.path.join(FIX, "hostile_modeling")
    for name in os.listdir(src):
        data = open(os.path.join(src, name), "rb").read()
        blob = repo / "blobs" / hashlib.sha1(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob.name),
                   repo / "snapshots" / "abc123" / name)
    report = scan_paths(tmp_path)
    assert [(os.path.basename(f.file), f.trigger) for f in report.findings
            if f.severity == Severity.CRITICAL] == [("modeling_tiny.py", "os.system")]
    assert main(["inspect", str(repo)]) == 0
    assert "modeling_tiny.py" in capsys.readouterr().out


def test_mlflow_models_that_load_through_their_own_module(tmp_path):
    """MLflow's own save_model output (fixtures/gen_mlflow.py): the MLmodel names loader_module
    my_loader, copied into code/; load_model imports it from there."""
    fix = os.path.join(FIX, "..", "mlflow")
    got = sorted((os.path.relpath(f.file, fix), f.severity.name.lower(), f.trigger or "")
                 for f in scan_paths(fix).findings)
    assert got == [
        ("hostile_loader/MLmodel", "medium", "my_loader"),
        ("hostile_loader/code/my_loader.py", "critical", "subprocess"),
        ("hostile_loader/code/my_loader.py", "critical", "subprocess.Popen"),
        ("hostile_loader/code/my_loader.py", "medium", ""),
        ("loader_module/MLmodel", "medium", "my_loader"),
        ("loader_module/code/my_loader.py", "medium", ""),
    ]
    # MLflow's own flavors load through mlflow.*: nothing to say
    model = tmp_path / "m"
    shutil.copytree(os.path.join(fix, "loader_module"), model)
    text = (model / "MLmodel").read_text().replace("loader_module: my_loader",
                                                   "loader_module: mlflow.sklearn")
    (model / "MLmodel").write_text(text)
    assert not [f for f in scan_paths(model).findings if f.severity > Severity.INFO]


def test_sentence_transformers_module_types():
    """SentenceTransformer.save's own output (fixtures/gen_sentence_transformers.py): module types
    outside sentence_transformers.* are repository code since v6 (trust_remote_code=True)."""
    fix = os.path.join(FIX, "..", "sentence_transformers")
    assert not [f for f in scan_paths(os.path.join(fix, "plain")).findings
                if f.severity > Severity.INFO]
    got = sorted((os.path.basename(f.file), f.severity.name.lower(), f.trigger or "")
                 for f in scan_paths(os.path.join(fix, "custom_module")).findings)
    assert got == [("custom_layer.py", "critical", "os.system"),
                   ("custom_layer.py", "medium", ""),
                   ("modules.json", "medium", "custom_layer")]
